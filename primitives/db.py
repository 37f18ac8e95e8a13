"""Database primitives: P08 db_query, P09 db_table_exists, P10 db_column_check, P11 db_index_check.

They talk to the app's database through :mod:`saasbench.services.db` (one connection per run, from
``--db-dsn``). Without a DSN every step fails with "no database: pass --db-dsn"; a database
error (syntax error, timeout, lost connection) fails the step with the driver's message.

P08 and SQL safety: the engine does NOT resolve placeholders in ``sql``, ``expected_result``,
``expected`` or ``assertions`` (raw fields). P08 binds every ``{{name}}`` / ``${VAR}`` of the
SQL as a parameter itself (a quoted literal around a placeholder becomes the parameter), so a
captured value never becomes SQL text; in expectations, ``{{not_null}}``, ``{{is_null}}``,
``{{not_empty}}`` and ``{{gte_N}}``/``{{gt_N}}``/``{{lte_N}}``/``{{lt_N}}``/``{{eq_N}}``/``{{ne_N}}``
are comparators, every other placeholder is resolved from the run context.

P08 expectation forms (``expected_result``, legacy ``expected``; see docs/dag-semantics.md):

* absent / ``null``: the statement ran; a statement returning rows (SELECT) must return >= 1 row.
* ``{}``: just run it (any row count; fixture statements).
* ``{column: spec, ...}``: checks on the FIRST row (no row fails). ``spec`` is a value (equality,
  see below), ``{"op": ">=", "value": 5}`` (also ``operator``/``expected``), ``{"$gte": 5, ...}``,
  a string ``">=N"``/``"<=N"``/``">N"``/``"<N"``/``"==N"``/``"!=N"``, ``"NOT NULL"``/``"IS NULL"``
  or a magic ``{{not_null}}``/``{{gte_N}}``. Keys with a suffix ``_gte``/``_gt``/``_lte``/``_lt``/
  ``_ne``/``_eq``/``_min``/``_max`` (``cnt_gte``, ``cnt_min``) compare the column without the
  suffix when the result has no column of the full name. ``row_count`` (when not a column) is
  the number of rows. For statements without a result set the row is ``{"affected": n}``.
* ``[row, ...]``: every expected row (dict of specs, or a scalar = first column) matches a
  distinct result row, in any order; extra result rows are allowed; ``[]`` means no rows.
* ``true`` / ``false``: rows exist / no rows.
* a number, ``"N"``, ``">=N"``-style string, or a top-level ``{"$gte": N}`` / ``{"op", "value"}``:
  compared with the single value when the result is one row of one column holding a number
  (``SELECT COUNT(*)``), else with the row count (the affected-row count for statements
  without a result set).
* any other string (``"enabled"``, ``"NOT NULL"``): the single value of a one-row, one-column result.

Equality is loose in the documented ways: booleans match ``true``/``false``/``"True"``/``"t"``/``1``/
``0``; numbers and numeric strings compare numerically (``"7"`` == 7 == 7.0 == Decimal 7.00);
JSON columns compare structurally; other values compare as text with surrounding whitespace
ignored; ``null`` matches only NULL. Column names match exactly, else case-insensitively.

``assertions: [{field, operator, expected}]`` are checked on the first row as well.
``retry_ms`` re-runs a statement that returns rows until the expectations hold or the time
(bounded by the node deadline) is up. ``store_as: name`` captures the first row (``{{name.col}}``),
``store_as: {var: column}`` captures single columns, ``save_id: var`` the first column of the
first row; asking for a capture from a result without rows fails the step. The result becomes
the last document ``{"rows": [...], "count": n, "rowcount": n}`` for a following P07. An INSERT
whose first returned row has an ``id`` (or ``uuid``) sets ``{{_last_created_id}}``.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from typing import Any

from pydantic import Field, PrivateAttr, field_validator, model_validator

from saasbench.dag import note, warn
from saasbench.dag.equality import _NUMBER
from saasbench.dag.equality import cmp_num as _cmp_num
from saasbench.dag.equality import loose_equal as values_equal
from saasbench.dag.equality import numeric as _num
from saasbench.dag.equality import parse_json as _json
from saasbench.dag.placeholders import MISSING, UnresolvedPlaceholder, split_path, to_text, walk
from saasbench.evaluation.context import RunContext
from saasbench.evaluation.results import StepResult
from saasbench.primitives.registry import PrimitiveInputs, primitive, rename_aliases
from saasbench.services import saferegex
from saasbench.services.db import (
    Column,
    Database,
    DatabaseError,
    Index,
    NoDatabase,
    QueryResult,
    TableNotFound,
    get_database,
    unquote_name,
)

EVIDENCE_ROWS = 20

# --- operators ------------------------------------------------------------------------------------
_OP_ALIASES: dict[str, str] = {}
for _canon, _names in {
    "eq": ["==", "=", "eq", "equals", "equal", "is", "$eq"],
    "ne": ["!=", "<>", "ne", "neq", "not_equals", "not_equal", "$ne"],
    "gt": [">", "gt", "greater_than", "$gt"],
    "gte": [">=", "gte", "ge", "greater_than_or_equal", "greater_or_equal", "at_least", "min", "$gte"],
    "lt": ["<", "lt", "less_than", "$lt"],
    "lte": ["<=", "lte", "le", "less_than_or_equal", "less_or_equal", "at_most", "max", "$lte"],
    "not_null": ["not_null", "is_not_null", "notnull", "not null", "is not null", "exists"],
    "is_null": ["is_null", "null", "isnull", "is null", "not_exists"],
    "not_empty": ["not_empty", "nonempty"],
    "empty": ["empty", "is_empty"],
    "contains": ["contains", "includes", "contains_text", "$contains"],
    "not_contains": ["not_contains", "excludes"],
    "in": ["in", "one_of", "$in"],
    "not_in": ["not_in", "$nin"],
    "regex": ["regex", "matches", "matches_regex", "match", "$regex"],
}.items():
    for _n in _names:
        _OP_ALIASES[_n] = _canon

UNARY_OPS = {"not_null", "is_null", "not_empty", "empty"}
NUMERIC_OPS = {"eq", "ne", "gt", "gte", "lt", "lte"}
_SUFFIX_OPS = {"gte": "gte", "gt": "gt", "lte": "lte", "lt": "lt", "ne": "ne", "eq": "eq", "min": "gte", "max": "lte"}
_SUFFIX_RE = re.compile(r"^(.+)_(gte|gt|lte|lt|ne|eq|min|max)$")
_CMP_STRING = re.compile(r"^\s*(==|!=|<>|>=|<=|>|<|=)\s*([+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)\s*$")
_MAGIC = re.compile(r"^\{\{\s*(?:(not_null|is_null|not_empty)|(gte|gt|lte|lt|eq|ne)_(-?\d+(?:\.\d+)?))\s*\}\}$")
_NULL_WORDS = {"not null": "not_null", "is not null": "not_null", "is null": "is_null"}
_CONDITION = re.compile(r"^\s*([A-Za-z_][\w.]*)\s*(==|!=|<>|>=|<=|>|<|=)\s*([+-]?(?:\d+(?:\.\d*)?|\.\d+))\s*$")
_MONGO_SHELL = re.compile(r"^\s*db\.[\w$]+\.\w+\s*\(")


def canon_op(name: Any) -> str:
    key = str(name).strip()
    op = _OP_ALIASES.get(key) or _OP_ALIASES.get(key.lower())
    if op is None:
        raise ValueError(f"unknown operator {name!r} (known: {', '.join(sorted(set(_OP_ALIASES.values())))})")
    return op


@dataclass
class Check:
    """One predicate on a value. ``value`` may still hold placeholders (resolved at run time)."""

    op: str
    value: Any = None
    source: str = ""

    def describe(self) -> str:
        if self.source:
            return self.source
        return self.op if self.op in UNARY_OPS else f"{self.op} {self.value!r}"


def parse_spec(spec: Any) -> list[Check]:
    """The checks of one column's expected value (any dialect). Raises ValueError on unknown ops."""
    if isinstance(spec, str):
        m = _MAGIC.match(spec)
        if m:
            if m.group(1):
                return [Check(m.group(1), None, spec)]
            return [Check(m.group(2), _number(m.group(3)), spec)]
        m = _CMP_STRING.match(spec)
        if m:
            return [Check(canon_op(m.group(1)), _number(m.group(2)), spec)]
        word = " ".join(spec.strip().lower().split())
        if word in _NULL_WORDS:
            return [Check(_NULL_WORDS[word], None, spec)]
        return [Check("eq", spec, repr(spec))]
    if isinstance(spec, dict) and spec:
        keys = list(spec)
        if all(isinstance(k, str) and k.startswith("$") for k in keys):
            checks = []
            for k, v in spec.items():
                if k == "$exists":
                    checks.append(Check("not_null" if v else "is_null", None, f"{k}: {json.dumps(v)}"))
                else:
                    checks.append(Check(canon_op(k), v, f"{k}: {json.dumps(v, default=str)}"))
            return checks
        if _is_op_dict(spec):
            op = canon_op(spec.get("op", spec.get("operator")))
            value = spec.get("value", spec.get("expected"))
            return [Check(op, value, json.dumps(spec, default=str))]
    return [Check("eq", spec, json.dumps(spec, default=str) if isinstance(spec, (dict, list)) else repr(spec))]


def _is_op_dict(spec: dict) -> bool:
    keys = set(spec)
    if not ({"op", "operator"} & keys) or not keys <= {"op", "operator", "value", "expected"}:
        return False
    op = spec.get("op", spec.get("operator"))
    return isinstance(op, str)


def _number(text: str) -> int | float:
    f = float(text)
    return int(f) if f.is_integer() and "." not in text and "e" not in text.lower() else f


def _order(actual: Any, expected: Any) -> int | None:
    c = _cmp_num(actual, expected)
    if c is not None:
        return c
    if isinstance(actual, str) and isinstance(expected, str):  # ISO dates and times
        return (actual > expected) - (actual < expected)
    return None


def apply_check(op: str, actual: Any, expected: Any) -> bool:
    if op == "not_null":
        return actual is not None and actual is not MISSING
    if op == "is_null":
        return actual is None or actual is MISSING
    if op == "not_empty":
        return actual not in (None, MISSING, "", [], {})
    if op == "empty":
        return actual in (None, MISSING, "", [], {})
    if actual is MISSING:
        return False
    if op == "eq":
        return values_equal(actual, expected)
    if op == "ne":
        return not values_equal(actual, expected)
    if op in ("gt", "gte", "lt", "lte"):
        if actual is None:
            return False
        c = _order(actual, expected)
        if c is None:
            return False
        return {"gt": c > 0, "gte": c >= 0, "lt": c < 0, "lte": c <= 0}[op]
    if op in ("contains", "not_contains"):
        if isinstance(actual, list):
            found = any(values_equal(item, expected) for item in actual)
        elif isinstance(actual, dict):
            found = to_text(expected) in actual
        elif actual is None:
            found = False
        else:
            found = to_text(expected) in to_text(actual)
        return found if op == "contains" else not found
    if op in ("in", "not_in"):
        options = expected if isinstance(expected, (list, tuple)) else [expected]
        found = any(values_equal(actual, o) for o in options)
        return found if op == "in" else not found
    if op == "regex":
        if actual is None:
            return False
        try:  # stored (app) data, a DAG pattern: bounded by the node deadline (RegexTimeout)
            return saferegex.search(str(expected), to_text(actual), what="a database value") is not None
        except re.error:
            return str(expected) in to_text(actual)
    raise ValueError(f"unknown operator {op!r}")


# --- expectations ---------------------------------------------------------------------------------
@dataclass
class ColumnExpectation:
    key: str
    checks: list[Check]
    suffix: tuple[str, list[Check]] | None = None  # "cnt_gte": ("cnt", [gte checks])


def parse_columns(spec: dict) -> list[ColumnExpectation]:
    out = []
    for key, value in spec.items():
        key = str(key)
        suffix = None
        m = _SUFFIX_RE.match(key)
        if m:
            op = _SUFFIX_OPS[m.group(2)]
            base_checks = parse_spec(value)
            if len(base_checks) == 1 and base_checks[0].op == "eq":  # plain value: the suffix is the operator
                base_checks = [Check(op, base_checks[0].value, f"{key}: {value!r}")]
            suffix = (m.group(1), base_checks)
        out.append(ColumnExpectation(key, parse_spec(value), suffix))
    return out


@dataclass
class Expectation:
    """A parsed ``expected_result``. ``kind``: default, run, columns, rows, exists, scalar."""

    kind: str
    columns: list[ColumnExpectation] = field(default_factory=list)
    rows: list[list[ColumnExpectation] | Check] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    exists: bool = True

    @classmethod
    def parse(cls, raw: Any, present: bool) -> "Expectation":
        if not present or raw is None:
            return cls("default")
        if isinstance(raw, bool):
            return cls("exists", exists=raw)
        if isinstance(raw, dict):
            if not raw:
                return cls("run")
            if all(isinstance(k, str) and k.startswith("$") for k in raw) or _is_op_dict(raw):
                return cls("scalar", checks=parse_spec(raw))
            return cls("columns", columns=parse_columns(raw))
        if isinstance(raw, list):
            rows: list[list[ColumnExpectation] | Check] = []
            for item in raw:
                if isinstance(item, dict):
                    rows.append(parse_columns(item))
                else:
                    rows.append(parse_spec(item)[0])
            return cls("rows", rows=rows)
        if isinstance(raw, (int, float)):
            return cls("scalar", checks=[Check("eq", raw, repr(raw))])
        if isinstance(raw, str):
            if _NUMBER.match(raw):
                return cls("scalar", checks=[Check("eq", _number(raw.strip()), repr(raw))])
            return cls("scalar", checks=parse_spec(raw))
        raise ValueError(f"unsupported expected_result of type {type(raw).__name__}")


@dataclass
class Assertion:
    field: str
    check: Check


@dataclass
class PathAssertion:
    """A P07-style assertion ``{path, operator, expected, ...}`` inside P08 (yobgvieg, orghjavi, ygamciur).

    ``where`` says what the path reads: ``column`` (a bare name: a column of the first row, as
    ``field``), ``rows`` (``$`` or ``$[i]...``: the list of rows), ``result`` (``$.rows...``,
    ``$.count``, ``$.rowcount``: the result document a following P07 would read) or ``row``
    (any other ``$.x...``: into the first row, e.g. a MongoDB document). The check is P07's.
    """

    where: str
    assertion: Any  # primitives.assertions.Assertion


def _path_assertion(i: int, item: dict[str, Any]) -> PathAssertion:
    from saasbench.primitives import assertions as p07

    try:
        a = p07.Assertion.model_validate(item)
    except ValueError as exc:
        errors = getattr(exc, "errors", None)
        detail = "; ".join(str(e.get("msg", e)) for e in errors()) if callable(errors) else str(exc)
        raise ValueError(f"assertions[{i}]: {detail}") from None
    path = a.path.strip()
    if not path.startswith("$"):
        where = "column"
    elif path == "$" or path.startswith("$["):
        where = "rows"
        if path == "$" and a.op in ("exists", "not_null", "not_exists", "is_null"):
            op = "not_empty" if a.op in ("exists", "not_null") else "is_empty"
            note(f"P08 assertion '$' {a.op} -> {op} (at least one row / no rows)")
            a = a.model_copy(update={"op": op})
    elif re.match(r"^\$\.(rows|count|rowcount)\b", path):
        where = "result"
    else:
        where = "row"
    note(
        f"P08 assertion with 'path' -> a P07 assertion on the {'first row' if where in ('column', 'row') else 'rows' if where == 'rows' else 'result document'}"
    )
    return PathAssertion(where, a)


_COMMENT_KEYS = frozenset({"comment", "note", "description", "label", "name"})


def parse_assertions(raw: list[Any] | None) -> list[Assertion | PathAssertion]:
    from saasbench.primitives.assertions import expand_assertion

    out: list[Assertion | PathAssertion] = []
    for i, item in enumerate(raw or []):
        if not isinstance(item, dict):
            raise ValueError(f"assertions[{i}] must be an object {{field, operator, expected}}")
        if item and set(item) <= _COMMENT_KEYS:
            # iyjruvfz: {"comment": "... here we additionally verify db reachability"}; the reference
            # P07 counts a comment-only assertion as passed ("placeholder"), so it checks nothing
            note(f"assertions[{i}] is only a comment: a placeholder that checks nothing (dropped)")
            continue
        if "field" not in item and "column" not in item and "path" in item:
            out += [_path_assertion(i, x) for x in expand_assertion(item)]
            continue
        name = item.get("field", item.get("column"))
        if not isinstance(name, str) or not name:
            raise ValueError(f"assertions[{i}] needs a 'field' (or a P07-style 'path')")
        op = canon_op(item.get("operator", item.get("op", "equals")))
        expected = item.get("expected", item.get("value"))
        checks = parse_spec(expected) if op == "eq" and isinstance(expected, str) else [Check(op, expected)]
        check = checks[0]
        check.source = check.source or (f"{op} {expected!r}" if op not in UNARY_OPS else op)
        out.append(Assertion(name, check))
    return out


class Evaluator:
    """Evaluates an expectation on a result, resolving placeholders in expected values via ctx."""

    def __init__(self, ctx: RunContext):
        self.ctx = ctx

    def value(self, raw: Any) -> Any:
        if isinstance(raw, str) and ("{{" in raw or "${" in raw):
            return self.ctx.resolve(raw)
        if isinstance(raw, (list, dict)):
            return self.ctx.resolve(raw)
        return raw

    def check(self, check: Check, actual: Any) -> bool:
        expected = None if check.op in UNARY_OPS else self.value(check.value)
        return apply_check(check.op, actual, expected)

    @staticmethod
    def lookup(row: dict[str, Any], key: str, row_count: int) -> Any:
        if key in row:
            return row[key]
        folded = [k for k in row if k.casefold() == key.casefold()]
        if folded:
            return row[folded[0]]
        if key == "row_count":
            return row_count
        parts = split_path(key)
        if len(parts) > 1 and str(parts[0]) in row:  # a JSON column: "properties.region"
            found = walk(_json(row[str(parts[0])]), parts[1:])
            return MISSING if found is MISSING else found
        return MISSING

    def columns(self, cols: list[ColumnExpectation], row: dict[str, Any], row_count: int) -> list[str]:
        failures = []
        for col in cols:
            actual = self.lookup(row, col.key, row_count)
            checks = col.checks
            name = col.key
            if actual is MISSING and col.suffix is not None:
                base = self.lookup(row, col.suffix[0], row_count)
                if base is not MISSING:
                    actual, checks, name = base, col.suffix[1], col.suffix[0]
            if actual is MISSING and not all(c.op == "is_null" for c in checks):
                failures.append(f"column {col.key!r} not in the result (columns: {', '.join(row) or 'none'})")
                continue
            for c in checks:
                if not self.check(c, actual):
                    failures.append(f"{name}: expected {c.describe()}, got {_show(actual)}")
        return failures

    def evaluate(self, exp: Expectation, assertions: list[Assertion | PathAssertion], result: QueryResult) -> list[str]:
        rows = result.rows
        first = rows[0] if rows else None
        if not result.is_select:
            first = {"affected": result.rowcount, "rowcount": result.rowcount}
        failures: list[str] = []
        if exp.kind == "default":
            if result.is_select and not rows:
                failures.append(
                    "query returned no rows (a SELECT without expected_result must return at least one row)"
                )
        elif exp.kind == "run":
            pass
        elif exp.kind == "exists":
            has = bool(rows) if result.is_select else result.rowcount > 0
            if has != exp.exists:
                failures.append(
                    f"expected {'rows' if exp.exists else 'no rows'}, got {len(rows) if result.is_select else result.rowcount}"
                )
        elif exp.kind == "columns":
            if first is None:
                failures.append("query returned no rows")
            else:
                failures += self.columns(exp.columns, first, len(rows))
        elif exp.kind == "rows":
            failures += self._rows(exp.rows, result)
        elif exp.kind == "scalar":
            failures += self._scalar(exp.checks, result)
        for pa in assertions:
            if isinstance(pa, PathAssertion):
                failures += self.path_assertion(pa, result, first)
        field_assertions = [a for a in assertions if isinstance(a, Assertion)]
        if field_assertions:
            if first is None:
                failures.append("query returned no rows for the assertions")
            else:
                for a in field_assertions:
                    actual = self.lookup(first, a.field, len(rows))
                    if actual is MISSING and a.check.op != "is_null":
                        failures.append(
                            f"assertion field {a.field!r} not in the result (columns: {', '.join(first) or 'none'})"
                        )
                    elif not self.check(a.check, actual):
                        failures.append(f"assertion {a.field}: expected {a.check.describe()}, got {_show(actual)}")
        return failures

    def path_assertion(self, pa: PathAssertion, result: QueryResult, first: dict[str, Any] | None) -> list[str]:
        from saasbench.dag.jsonpath import ABSENT, PathError
        from saasbench.primitives import assertions as p07

        a = pa.assertion
        if a.expected is not None:
            a = a.model_copy(update={"expected": self.value(a.expected)})
        rows = result.rows
        doc: Any = (
            {"rows": rows, "count": len(rows), "rowcount": result.rowcount}
            if pa.where == "result"
            else rows
            if pa.where == "rows"
            else (first if first is not None else {})
        )
        if pa.where == "column":
            found = self.lookup(first, a.path.strip(), len(rows)) if first is not None else MISSING
            value = ABSENT if found is MISSING else found
        else:
            try:
                value = p07.path_value(a.path, doc)
            except PathError as exc:
                return [f"assertion {a.path}: {exc}"]
        ok, why = p07.check(a, value, p07.Doc(doc, label="P08 result"))
        if ok:
            return []
        detail = "" if a.op in p07.UNARY else f" {p07.short(a.expected, 80)}"
        rows_note = " (the query returned no rows)" if first is None and pa.where in ("column", "row") else ""
        return [f"assertion {a.path} {a.op}{detail}: got {p07.short(value)} [{why}]{rows_note}"]

    def _rows(self, expected_rows: list, result: QueryResult) -> list[str]:
        rows = result.rows
        if not expected_rows:
            return [] if not rows else [f"expected no rows, got {len(rows)}"]
        free = list(range(len(rows)))
        failures = []
        for i, exp in enumerate(expected_rows):
            hit = None
            for j in free:
                row = rows[j]
                if isinstance(exp, Check):
                    value = next(iter(row.values()), MISSING) if row else MISSING
                    ok = self.check(exp, value)
                else:
                    ok = not self.columns(exp, row, len(rows))
                if ok:
                    hit = j
                    break
            if hit is None:
                failures.append(f"expected row {i} not found among {len(rows)} result row(s)")
            else:
                free.remove(hit)
        return failures

    def _scalar(self, checks: list[Check], result: QueryResult) -> list[str]:
        numeric = all(c.op in NUMERIC_OPS and _num(self.value(c.value)) is not None for c in checks)
        if not result.is_select:
            subject, what = result.rowcount, "affected rows"
        elif len(result.rows) == 1 and len(result.columns) == 1:
            value = result.rows[0][result.columns[0]]
            if numeric and _num(value) is None:
                subject, what = 1, "row count"
            else:
                subject, what = value, f"value of {result.columns[0]}"
        elif numeric:
            subject, what = len(result.rows), "row count"
        else:
            return [f"expected a single value, got {len(result.rows)} row(s) of {len(result.columns)} column(s)"]
        return [f"{what}: expected {c.describe()}, got {_show(subject)}" for c in checks if not self.check(c, subject)]


def _show(value: Any) -> str:
    if value is MISSING:
        return "nothing"
    text = json.dumps(value, default=str)
    return text if len(text) <= 200 else text[:200] + "..."


# --- P08 ------------------------------------------------------------------------------------------
RAW_P08 = {"sql", "query", "db_query", "expected_result", "expected", "assertions"}


class P08Inputs(PrimitiveInputs):
    sql: str | dict[str, Any] = Field(
        description="SQL (or a MongoDB JSON query); {{placeholders}} are bound as parameters"
    )
    expected_result: Any = Field(
        default=None, description="Expectation in any dialect (see module doc); absent = ran and SELECT returned rows"
    )
    assertions: list[dict[str, Any]] | None = Field(
        default=None, description="[{field, operator, expected}] on the first row"
    )
    retry_ms: int | None = Field(
        default=None, ge=0, description="Poll a row-returning statement until the expectations hold"
    )
    retry_interval_ms: int | None = Field(
        default=None, ge=10, description="Pause between polls (default retry_ms/10, 100..1000 ms)"
    )
    timeout_ms: int | None = Field(
        default=None, gt=0, description="Statement timeout of this step (default: the DSN's statement_timeout)"
    )
    store_as: str | dict[str, str] | None = Field(
        default=None, description="Capture the first row as {{name}}, or {var: column}"
    )
    save_id: str | None = Field(default=None, description="Capture the first column of the first row as {{save_id}}")

    _expectation: Expectation = PrivateAttr()
    _assertions: list[Assertion | PathAssertion] = PrivateAttr(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _legacy(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        if "sql" not in data and isinstance(data.get("collection"), str) and isinstance(data.get("query", {}), dict):
            # ygamciur: {"collection": "user", "query": {...}, "count_only": bool} -> a MongoDB JSON query
            collection, flt = data.pop("collection"), data.pop("query", {}) or {}
            count_only = data.pop("count_only", False)
            data["sql"] = {"collection": collection, ("count" if count_only is True else "find"): flt}
            note(
                f"collection/query{'/count_only' if count_only is True else ''} -> sql "
                f"{{collection, {'count' if count_only is True else 'find'}}} (a MongoDB JSON query)"
            )
            if "command" in data:
                data.pop("command")
                note("command ignored: the collection/query form is the statement")
        if "command" in data and "sql" not in data and isinstance(data["command"], str):
            data["sql"] = data.pop("command")
            note("command -> sql")
            if _MONGO_SHELL.match(data["sql"]):
                warn(
                    "a MongoDB shell expression (db.<collection>.<method>(...)): this engine runs MongoDB queries "
                    "given as JSON documents ({collection, find|count|aggregate...}), so the step fails at run time",
                    "command",
                )
        for alias in ("query", "db_query"):
            if alias in data and "sql" not in data:
                data["sql"] = data.pop(alias)
                note(f"{alias} -> sql")
        if "store_field_as" in data and "save_id" not in data:
            # sgdoserd: capture the first column of the first row (its reference: rows[0][0], stripped)
            data["save_id"] = data.pop("store_field_as")
            note("'store_field_as' -> 'save_id' (the first column of the first row)")
        if "capture_only" in data:
            flag = data.pop("capture_only")
            if flag is True and data.get("save_id") is None and data.get("store_as") is None:
                warn(
                    "capture_only without save_id/store_field_as/store_as: nothing is captured (ignored)",
                    "capture_only",
                )
            elif flag is True:
                dropped = [k for k in ("expected_result", "expected", "assertions") if data.pop(k, None) is not None]
                note(
                    "'capture_only: true': the step only captures"
                    + (f" ({', '.join(dropped)} ignored, as in the reference)" if dropped else "")
                )
            elif flag is not False:
                warn(f"capture_only {flag!r} is not a boolean (ignored)", "capture_only")
        if "expected_result_condition" in data:  # gmdnohlg: "cnt >= 1", "row_count >= 1"
            condition = data.pop("expected_result_condition")
            m = _CONDITION.match(condition) if isinstance(condition, str) else None
            if m is None or "expected_result" in data:
                warn(
                    f"expected_result_condition {condition!r} is not '<column> <op> <number>' next to no "
                    "expected_result (ignored; a DAG defect)",
                    "expected_result_condition",
                )
            else:
                data["expected_result"] = {m.group(1): f"{m.group(2)}{m.group(3)}"}
                note(f"expected_result_condition {condition!r} -> expected_result {data['expected_result']}")
        if "expected" in data:
            if "expected_result" not in data:
                data["expected_result"] = data.pop("expected")
                note("expected -> expected_result")
            else:
                data.pop("expected")
                note("both expected and expected_result: expected ignored")
        _row_expectation_aliases(data)
        return data

    @field_validator("sql")
    @classmethod
    def _sql_not_empty(cls, v: Any) -> Any:
        if isinstance(v, str) and not v.strip():
            raise ValueError("sql is empty")
        return v

    @model_validator(mode="after")
    def _parse(self) -> "P08Inputs":
        present = "expected_result" in self.model_fields_set and self.expected_result is not None
        self._expectation = Expectation.parse(self.expected_result, present)
        self._assertions = parse_assertions(self.assertions)
        if self.expected_result is not None:
            _note_dialects(self.expected_result)
        return self

    @property
    def expectation(self) -> Expectation:
        return self._expectation

    @property
    def parsed_assertions(self) -> list[Assertion | PathAssertion]:
        return self._assertions


def _row_expectation_aliases(data: dict[str, Any]) -> None:
    """hhrdixum: ``first_row_assertions: {col: spec}`` and ``expect_rowcount_min: N`` -> expected_result.

    ``first_row_assertions`` is the dict form (checks on the first row). ``expect_rowcount_min: N``
    is the number of rows, literally: ``row_count: ">=N"`` (N <= 0: just run the statement). On a
    ``SELECT COUNT(...)`` (one row whatever the count) that holds for N <= 1 whatever the count:
    loaded as written, with a warning (the DAG probably meant the count; not guessed).
    """
    first = data.pop("first_row_assertions", None)
    minimum = data.pop("expect_rowcount_min", None)
    if first is None and minimum is None:
        return
    if minimum is not None and (isinstance(minimum, bool) or not isinstance(minimum, (int, float))):
        warn(f"expect_rowcount_min {minimum!r} is not a number (ignored; a DAG defect)", "expect_rowcount_min")
        minimum = None
    if first is not None and not isinstance(first, dict):
        warn(
            f"first_row_assertions {first!r} is not an object of column checks (ignored; a DAG defect)",
            "first_row_assertions",
        )
        first = None
    current = data.get("expected_result")
    if current is not None and not isinstance(current, dict):
        warn(
            "first_row_assertions/expect_rowcount_min next to an expected_result that is not a column dict (ignored; a DAG defect)",
            "expected_result",
        )
        return
    merged = dict(current or {})
    for key, spec in (first or {}).items():
        merged.setdefault(key, spec)
    if first is not None:
        note("first_row_assertions -> expected_result (checks on the first row)")
    if minimum is not None:
        if minimum > 0:
            merged.setdefault("row_count", f">={minimum:g}")
            note(f"expect_rowcount_min {minimum:g} -> expected_result row_count '>={minimum:g}' (the number of rows)")
            if minimum <= 1 and isinstance(data.get("sql"), str) and _COUNT_ONLY.match(data["sql"]):
                warn(
                    f"expect_rowcount_min {minimum:g} on a SELECT COUNT(...): the statement returns one row whatever "
                    "the count, so this always holds (a DAG defect; the count itself is not checked)",
                    "expect_rowcount_min",
                )
        else:
            note(f"expect_rowcount_min {minimum:g} -> any number of rows")
    data["expected_result"] = merged


_COUNT_ONLY = re.compile(r"^\s*SELECT\s+COUNT\s*\([^)]*\)(\s+AS\s+\w+)?\s+FROM\b(?!.*\bGROUP\s+BY\b)", re.I | re.S)


def _note_dialects(raw: Any) -> None:
    if isinstance(raw, dict):
        for k, v in raw.items():
            if isinstance(k, str) and _SUFFIX_RE.match(k):
                note(f"suffix-operator key {k!r}")
            if isinstance(v, str) and _MAGIC.match(v):
                note(f"magic comparator {v}")
            elif isinstance(v, str) and (
                _CMP_STRING.match(v) or v.strip().upper() in ("NOT NULL", "IS NOT NULL", "IS NULL")
            ):
                note(f"comparison string {v!r}")
            elif isinstance(v, dict) and v and all(str(x).startswith("$") for x in v):
                note("$-operator object")


def _first_keyword(sql: Any) -> str:
    if not isinstance(sql, str):
        return ""
    text = re.sub(r"^(\s+|--[^\n]*\n?|/\*.*?\*/)+", "", sql, flags=re.S)
    m = re.match(r"[A-Za-z]+", text)
    return m.group(0).upper() if m else ""


def _fail(message: str, **evidence: Any) -> StepResult:
    return StepResult(passed=False, message=message, evidence=evidence)


def _open(ctx: RunContext) -> Database | StepResult:
    try:
        return get_database(ctx)
    except NoDatabase as exc:
        return _fail(str(exc))
    except DatabaseError as exc:
        return _fail(str(exc))


@primitive("P08", P08Inputs, raw_fields=RAW_P08)
def db_query(inputs: P08Inputs, ctx: RunContext) -> StepResult:
    """Run a statement with bound placeholders and compare the result with the expectation."""
    db = _open(ctx)
    if isinstance(db, StepResult):
        return db
    evaluator = Evaluator(ctx)
    requested = inputs.timeout_ms / 1000 if inputs.timeout_ms else db.options.statement_timeout_s
    retry_s = (inputs.retry_ms or 0) / 1000
    deadline = time.monotonic() + min(retry_s, max(0.0, ctx.remaining()))
    interval = (inputs.retry_interval_ms / 1000) if inputs.retry_interval_ms else min(1.0, max(0.1, retry_s / 10))
    attempts = 0
    while True:
        attempts += 1
        try:
            result, bound = db.run_template(inputs.sql, ctx.resolve, timeout_s=ctx.timeout(requested))
        except UnresolvedPlaceholder as exc:
            return _fail(str(exc), placeholder=exc.placeholder)
        except DatabaseError as exc:
            return _fail(f"{db.engine} error: {exc}", engine=db.engine, attempts=attempts)
        try:
            failures = evaluator.evaluate(inputs.expectation, inputs.parsed_assertions, result)
        except UnresolvedPlaceholder as exc:
            return _fail(f"expected_result: {exc}", placeholder=exc.placeholder)
        if not failures or not retry_s or not result.is_select or time.monotonic() + interval > deadline:
            break
        time.sleep(interval)

    ctx.last_document = result.as_document()
    evidence: dict[str, Any] = {
        "engine": db.engine,
        "statement": bound.text if len(bound.text) <= 2000 else bound.text[:2000] + "...",
        "placeholders": bound.placeholders,
        "bound_parameters": len(bound.params or []),
        "columns": result.columns,
        "rows": result.rows[:EVIDENCE_ROWS],
        "count": len(result.rows),
        "rowcount": result.rowcount,
        "is_select": result.is_select,
        "attempts": attempts,
    }
    if result.truncated:
        evidence["truncated"] = True
    if failures:
        evidence["failures"] = failures
    capture_error = _captures(inputs, ctx, result)
    if capture_error:
        failures.append(capture_error)
    _note_created(inputs.sql, ctx, result)
    if result.is_select:
        summary = f"{len(result.rows)} row(s)"
    else:
        summary = f"statement ran, {result.rowcount} row(s) affected"
    if failures:
        retried = f" after {attempts} attempts" if attempts > 1 else ""
        return StepResult(
            passed=False,
            message=f"{summary}{retried}: " + "; ".join(failures[:3]),
            value=ctx.last_document,
            evidence=evidence,
        )
    return StepResult(
        passed=True,
        message=summary
        + (
            "; expectations met"
            if inputs.expectation.kind not in ("default", "run") or inputs.parsed_assertions
            else ""
        ),
        value=ctx.last_document,
        evidence=evidence,
    )


_ABSENT = object()


def db_check(
    ctx: RunContext,
    sql: Any,
    expected_result: Any = _ABSENT,
    *,
    assertions: list[dict] | None = None,
    retry_ms: int | None = None,
) -> StepResult:
    """P08's check for other primitives (P29's ``final_verify``): same binding and expectation rules.

    ``sql`` and ``expected_result`` are raw (placeholders unresolved), as in a P08 step.
    """
    data: dict[str, Any] = {"sql": sql}
    if expected_result is not _ABSENT:
        data["expected_result"] = expected_result
    if assertions is not None:
        data["assertions"] = assertions
    if retry_ms is not None:
        data["retry_ms"] = retry_ms
    try:
        inputs = P08Inputs.model_validate(data)
    except ValueError as exc:
        return _fail(f"invalid database check: {exc}")
    return db_query(inputs, ctx)


def _captures(inputs: P08Inputs, ctx: RunContext, result: QueryResult) -> str | None:
    wanted = inputs.store_as is not None or inputs.save_id is not None
    if not wanted:
        return None
    if not result.rows:
        return "nothing to capture: the statement returned no rows" + (
            f" (save_id {inputs.save_id})" if inputs.save_id else f" (store_as {inputs.store_as})"
        )
    first = result.rows[0]
    if inputs.save_id:
        ctx.capture(inputs.save_id, next(iter(first.values())) if first else None)
    if isinstance(inputs.store_as, str):
        ctx.capture(inputs.store_as, dict(first))
    elif isinstance(inputs.store_as, dict):
        for var, column in inputs.store_as.items():
            value = Evaluator.lookup(first, str(column), len(result.rows))
            if value is MISSING:
                return f"store_as {var}: column {column!r} not in the result"
            ctx.capture(var, value)
    return None


def _note_created(sql: Any, ctx: RunContext, result: QueryResult) -> None:
    if _first_keyword(sql) != "INSERT" or not result.rows:
        return
    first = result.rows[0]
    for key in ("id", "uuid"):
        value = first.get(key)
        if isinstance(value, (str, int)) and not isinstance(value, bool):
            ctx.last_created_id = value
            ctx.node_scope.setdefault("created_id", value)
            return


# --- P09 ------------------------------------------------------------------------------------------
class P09Inputs(PrimitiveInputs):
    tables: list[str] = Field(
        default_factory=list, description='Table names; schema-qualified and quoted names allowed (core."apiKey")'
    )

    @model_validator(mode="before")
    @classmethod
    def _legacy(cls, data: Any) -> Any:
        if isinstance(data, dict) and "tables" not in data:  # ygamciur (MongoDB): collections -> tables
            data = dict(data)
            rename_aliases(data, "tables", ("collections",))
        if isinstance(data, dict) and "table" not in data and "collection" in data:
            data = dict(data)
            rename_aliases(data, "table", ("collection",))
        if isinstance(data, dict) and "table" in data:
            data = dict(data)
            table = data.pop("table")
            tables = list(data.get("tables") or [])
            if isinstance(table, str) and table not in tables:
                tables.insert(0, table)
            data["tables"] = tables
            note("table -> tables")
        return data

    @model_validator(mode="after")
    def _non_empty(self) -> "P09Inputs":
        if not self.tables:
            raise ValueError("P09 needs at least one table in 'tables'")
        return self


@primitive("P09", P09Inputs)
def db_table_exists(inputs: P09Inputs, ctx: RunContext) -> StepResult:
    """Every listed table (or view) exists."""
    db = _open(ctx)
    if isinstance(db, StepResult):
        return db
    try:
        catalog = db.tables()
        found, missing, hints = [], [], {}
        for name in inputs.tables:
            ref, hint = db.find_table(name, catalog)
            if ref is None:
                missing.append(name)
            else:
                found.append(name)
            if hint:
                hints[name] = hint
    except DatabaseError as exc:
        return _fail(f"{db.engine} error: {exc}", engine=db.engine)
    value = {"found": found, "missing": missing, "ratio": round(len(found) / len(inputs.tables), 4)}
    evidence = {"engine": db.engine, **value}
    if hints:
        evidence["hints"] = hints
    if missing:
        detail = "; ".join(f"{m}: {hints[m]}" for m in missing if m in hints)
        return StepResult(
            passed=False,
            message=f"{len(missing)}/{len(inputs.tables)} table(s) missing: {', '.join(missing)}"
            + (f" ({detail})" if detail else ""),
            value=value,
            evidence=evidence,
        )
    return StepResult(passed=True, message=f"all {len(found)} table(s) exist", value=value, evidence=evidence)


# --- P10 ------------------------------------------------------------------------------------------
class ColumnSpec(PrimitiveInputs):
    name: str
    type: str | None = None
    nullable: bool | None = None


class P10Inputs(PrimitiveInputs):
    table: str = Field(description="Table name (schema-qualified and quoted names allowed)")
    expected_columns: list[str | ColumnSpec] = Field(
        default_factory=list, description="Column names (quoted = exact case) or {name, type, nullable}"
    )

    @model_validator(mode="before")
    @classmethod
    def _legacy(cls, data: Any) -> Any:
        if isinstance(data, dict):  # ygamciur (MongoDB): {collection, expected_fields}
            data = dict(data)
            rename_aliases(data, "table", ("collection",))
            if "expected_columns" not in data:
                rename_aliases(data, "expected_columns", ("expected_fields", "fields"))
        if isinstance(data, dict) and "columns" in data:
            data = dict(data)
            cols = data.pop("columns")
            data["expected_columns"] = list(data.get("expected_columns") or []) + list(cols or [])
            note("columns [{name, type}] -> expected_columns")
        if isinstance(data, dict) and isinstance(data.get("column_type_check"), dict):
            # lgzivily: {"expected_columns": [...], "column_type_check": {"log_from": "varchar(20)"}}; its
            # reference: each such column exists and the type text is a substring of its DATA_TYPE/COLUMN_TYPE
            data = dict(data)
            types = data.pop("column_type_check")
            columns = list(data.get("expected_columns") or [])
            for name, wanted in types.items():
                at = next(
                    (i for i, c in enumerate(columns) if c == name or (isinstance(c, dict) and c.get("name") == name)),
                    None,
                )
                spec = {
                    **(columns[at] if at is not None and isinstance(columns[at], dict) else {"name": name}),
                    "type": wanted,
                }
                if at is None:
                    columns.append(spec)
                else:
                    columns[at] = spec
            data["expected_columns"] = columns
            note("column_type_check {column: type} -> expected_columns [{name, type}]")
        return data

    @model_validator(mode="after")
    def _non_empty(self) -> "P10Inputs":
        if not self.expected_columns:
            raise ValueError("P10 needs at least one column in 'expected_columns' (or 'columns', 'column_type_check')")
        return self

    def specs(self) -> list[ColumnSpec]:
        return [c if isinstance(c, ColumnSpec) else ColumnSpec(name=c) for c in self.expected_columns]


def _match_column(columns: list[Column], name: str) -> Column | None:
    part = unquote_name(name)
    exact = [c for c in columns if part.matches(c.name)]
    if exact:
        return exact[0]
    loose = [c for c in columns if part.matches_loosely(c.name)]
    return loose[0] if loose else None


@primitive("P10", P10Inputs)
def db_column_check(inputs: P10Inputs, ctx: RunContext) -> StepResult:
    """Every expected column exists on the table (with the expected type / nullability when given)."""
    db = _open(ctx)
    if isinstance(db, StepResult):
        return db
    try:
        columns = db.columns(inputs.table)
    except TableNotFound as exc:
        return _fail(str(exc), engine=db.engine, table=inputs.table)
    except DatabaseError as exc:
        return _fail(f"{db.engine} error: {exc}", engine=db.engine)
    found, missing, mismatched = [], [], []
    for spec in inputs.specs():
        col = _match_column(columns, spec.name)
        if col is None:
            missing.append(spec.name)
            continue
        problems = []
        if spec.type and not col.type_matches(spec.type):
            problems.append(f"type {col.data_type!r} does not match {spec.type!r}")
        if spec.nullable is not None and col.nullable != spec.nullable:
            problems.append(f"nullable is {col.nullable}, expected {spec.nullable}")
        if problems:
            mismatched.append(f"{spec.name}: " + ", ".join(problems))
        else:
            found.append(spec.name)
    total = len(inputs.expected_columns)
    value = {"found": found, "missing": missing, "mismatched": mismatched, "ratio": round(len(found) / total, 4)}
    evidence = {
        "engine": db.engine,
        "table": inputs.table,
        **value,
        "actual_columns": [{"name": c.name, "type": c.data_type, "nullable": c.nullable} for c in columns],
    }
    if missing or mismatched:
        parts = []
        if missing:
            parts.append(f"missing {', '.join(missing)}")
        if mismatched:
            parts.append("; ".join(mismatched))
        return StepResult(
            passed=False,
            message=f"{inputs.table}: {len(found)}/{total} column(s) ok; " + "; ".join(parts),
            value=value,
            evidence=evidence,
        )
    return StepResult(
        passed=True, message=f"{inputs.table}: all {total} column(s) present", value=value, evidence=evidence
    )


# --- P11 ------------------------------------------------------------------------------------------
class IndexSpec(PrimitiveInputs):
    columns: list[str] | None = None
    name: str | None = None
    unique: bool | None = None
    pattern: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _legacy(cls, data: Any) -> Any:
        if (
            isinstance(data, dict) and "columns" not in data
        ):  # ygamciur (MongoDB): {"fields": ["email"], "unique": true}
            data = dict(data)
            rename_aliases(data, "columns", ("fields", "keys", "column"))
            if isinstance(data.get("columns"), str):
                data["columns"] = [data["columns"]]
        if isinstance(data, dict) and "name" not in data and "index_name" in data:
            data = dict(data)
            rename_aliases(data, "name", ("index_name",))
        return data


def _index_dialects(data: dict[str, Any]) -> None:
    """Single-index shorthands of the public DAGs -> ``expected_indexes: [{columns, unique}]``.

    - iyjruvfz: ``{"column": "uid", "is_unique": true}`` (its reference P11 reads only
      ``expected_indexes``, so these steps passed there with nothing checked: "0/0 indexes");
    - sgdoserd: ``{"expected_columns": ["name", "teamid"], "unique_required": true}`` (its
      reference: one index whose definition names every column, UNIQUE when required);
    - kmasmnil: ``expected_indexes: [["surveyId", "created_at"], ...]`` (a column list per index;
      its reference: an index whose definition names every column of the list).
    """
    if "expected_indexes" not in data and "indexes" not in data:
        if "column" in data and "columns" not in data:
            column = data.pop("column")
            data["columns"] = column if isinstance(column, list) else [column]
            note("'column' -> one expected index on that column")
        if "is_unique" in data and "unique" not in data and "columns" in data:
            data["unique"] = data.pop("is_unique")
            note("'is_unique' -> the expected index's 'unique'")
        if "expected_columns" in data and "columns" not in data:
            columns = data.pop("expected_columns")
            unique = data.pop("unique_required", None)
            spec: dict[str, Any] = {"columns": columns if isinstance(columns, list) else [columns]}
            if unique is True:
                spec["unique"] = True
            elif unique not in (None, False):
                spec["unique"] = unique  # validated (and rejected) as the index's 'unique'
            data["expected_indexes"] = [spec]
            note(
                "'expected_columns'"
                + (" + 'unique_required'" if unique is not None else "")
                + " -> one expected index covering every column"
                + (" (UNIQUE)" if unique is True else "")
            )
    items = data.get("expected_indexes")
    if isinstance(items, list) and any(isinstance(i, list) for i in items):
        data["expected_indexes"] = [{"columns": i} if isinstance(i, list) else i for i in items]
        note("expected_indexes entries given as column lists -> {columns: [...]}")


class P11Inputs(PrimitiveInputs):
    table: str | None = Field(
        default=None, description="Table whose indexes are checked (default: every visible table)"
    )
    expected_indexes: list[IndexSpec | str] = Field(
        default_factory=list, description="[{columns, unique?, name?}] or regexes on index name/definition"
    )

    @model_validator(mode="before")
    @classmethod
    def _legacy(cls, data: Any) -> Any:
        if isinstance(data, dict):
            data = dict(data)
            rename_aliases(data, "table", ("collection",))
            _index_dialects(data)
            single = {k: data.pop(k) for k in ("index_name", "columns", "fields", "unique", "pattern") if k in data}
            if single and "expected_indexes" not in data and "indexes" not in data:
                # ychlukjm: {"table", "index_name": "PRIMARY", "columns": [...]} -> expected_indexes: [{...}]
                data["expected_indexes"] = [single]
                note(f"one index given at the top level ({', '.join(single)}) -> expected_indexes: [{{...}}]")
            elif single:
                data.update(single)  # left for the unknown-key warning
        if isinstance(data, dict) and "indexes" in data:
            data = dict(data)
            items = data.pop("indexes")
            data["expected_indexes"] = list(data.get("expected_indexes") or []) + list(items or [])
            note("indexes [regex] -> expected_indexes")
        return data

    @model_validator(mode="after")
    def _non_empty(self) -> "P11Inputs":
        if not self.expected_indexes:
            raise ValueError("P11 needs at least one entry in 'expected_indexes' (or 'indexes')")
        for spec in self.expected_indexes:
            if isinstance(spec, IndexSpec) and not (spec.columns or spec.name or spec.pattern):
                raise ValueError("an expected index needs 'columns', 'name' or 'pattern'")
        return self


def _regex(pattern: str) -> Any:
    try:
        return saferegex.compile(pattern, re.I)
    except re.error:
        return saferegex.compile(re.escape(pattern), re.I)


def _index_search(rx: Any, idx: Index) -> bool:
    """The pattern finds the index's name or definition (the app's schema: bounded by the node deadline)."""
    return bool(
        saferegex.search(rx, idx.name, what="an index name")
        or saferegex.search(rx, idx.definition, what="an index definition")
    )


def _index_matches(spec: IndexSpec | str, idx: Index) -> bool:
    if isinstance(spec, str):
        return _index_search(_regex(spec), idx)
    if spec.name:
        part = unquote_name(spec.name)
        if not part.matches_loosely(idx.name):
            return False
    if spec.pattern:
        if not _index_search(_regex(spec.pattern), idx):
            return False
    if spec.unique is not None and idx.unique != spec.unique:
        return False
    if spec.columns:
        for name in spec.columns:
            part = unquote_name(name)
            if any(part.matches_loosely(c) for c in idx.columns):
                continue
            # expression indexes: the column is named in the definition
            if not re.search(
                r'(?<![\w$])"?' + re.escape(part.text) + r'"?(?![\w$])', idx.definition, 0 if part.quoted else re.I
            ):
                return False
    return True


def _describe_spec(spec: IndexSpec | str) -> str:
    if isinstance(spec, str):
        return f"/{spec}/"
    bits = []
    if spec.columns:
        bits.append("(" + ", ".join(spec.columns) + ")")
    if spec.name:
        bits.append(f"named {spec.name}")
    if spec.pattern:
        bits.append(f"/{spec.pattern}/")
    if spec.unique:
        bits.append("unique")
    return " ".join(bits)


@primitive("P11", P11Inputs)
def db_index_check(inputs: P11Inputs, ctx: RunContext) -> StepResult:
    """Every expected index exists: its columns are among an index's columns (or named in its
    definition), or a regex matches an index's name or definition."""
    db = _open(ctx)
    if isinstance(db, StepResult):
        return db
    try:
        indexes = db.indexes(inputs.table)
    except TableNotFound as exc:
        return _fail(str(exc), engine=db.engine, table=inputs.table)
    except DatabaseError as exc:
        return _fail(f"{db.engine} error: {exc}", engine=db.engine)
    found: list[dict[str, Any]] = []
    missing: list[dict[str, Any]] = []
    for spec in inputs.expected_indexes:
        hit = next((i for i in indexes if _index_matches(spec, i)), None)
        (found if hit else missing).append({"expected": _describe_spec(spec), "index": hit.name if hit else None})
    value: dict[str, Any] = {
        "found": found,
        "missing": [m["expected"] for m in missing],
        "ratio": round(len(found) / len(inputs.expected_indexes), 4),
    }
    evidence = {
        "engine": db.engine,
        "table": inputs.table,
        **value,
        "actual_indexes": [
            {"name": i.name, "columns": i.columns, "definition": i.definition, "unique": i.unique}
            for i in indexes[:100]
        ],
    }
    where = inputs.table or "the database"
    if missing:
        return StepResult(
            passed=False,
            message=f"{where}: missing index(es) {', '.join(value['missing'])}",
            value=value,
            evidence=evidence,
        )
    return StepResult(
        passed=True, message=f"{where}: all {len(found)} expected index(es) exist", value=value, evidence=evidence
    )
