"""Assertion primitives: P06 (required fields and types) and P07 (path-based value assertions).

Both read the run's *last document* (the last response body, a P05 result, P08 rows) unless a
``response``/``source`` input names another value. Paths use :mod:`saasbench.dag.jsonpath`.
Every P07 dialect found in real DAGs is normalised by the input models into one canonical
assertion ``{path, op, expected, expected_type, tolerance, save_as}``; each normalisation is
recorded with :func:`saasbench.dag.note`. The app's data never raises: a missing field, a wrong
type or a non-JSON body is a failed assertion with the actual value in the message.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import time
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from saasbench.dag import PLACEHOLDER_RE, StepDefect, is_annotation, note, warn
from saasbench.dag.equality import exact_decimal as _decimal
from saasbench.dag.equality import number as _number
from saasbench.dag.equality import strict_equal as values_equal
from saasbench.dag.jsonpath import ABSENT, PathError, parse
from saasbench.dag.jsonpath import evaluate as path_value
from saasbench.dag.placeholders import MISSING, UnresolvedPlaceholder, to_text
from saasbench.evaluation.context import RunContext
from saasbench.evaluation.results import StepResult
from saasbench.primitives.registry import PrimitiveInputs, primitive
from saasbench.services import saferegex

MAX_REGEX_SUBJECT = 100_000  # chars searched by matches_regex (the match itself is bounded by the node deadline)
JWT_CLOCK_SLACK_S = 300  # app container and harness clocks may disagree a little
_FROM_MAGIC = re.compile(r"^\s*\{\{\s*from_P\d+\s*\}\}\s*$")
_NAME = re.compile(r"^[A-Za-z_][\w-]*(?:\.[\w-]+|\[\d+\])*$")

# --- vocabulary ----------------------------------------------------------------------------------
OPERATORS: dict[str, str] = {
    "equals": "equals",
    "equal": "equals",
    "eq": "equals",
    "==": "equals",
    "=": "equals",
    "not_equals": "not_equals",
    "not_equal": "not_equals",
    "ne": "not_equals",
    "neq": "not_equals",
    "!=": "not_equals",
    "contains": "contains",
    "not_contains": "not_contains",
    "contains_text": "contains_text",
    "not_contains_id": "not_contains_id",
    "exists": "exists",
    "json_path_exists": "exists",
    "present": "exists",
    "not_exists": "not_exists",
    "absent": "not_exists",
    "undefined": "not_exists",
    "not_null": "not_null",
    "is_not_null": "not_null",
    "is_null": "is_null",
    "null": "is_null",
    "not_empty": "not_empty",
    "non_empty": "not_empty",
    "is_empty": "is_empty",
    "empty": "is_empty",
    "is_array": "is_array",
    "gte": "gte",
    ">=": "gte",
    "greater_than_or_equal": "gte",
    "ge": "gte",
    "lte": "lte",
    "<=": "lte",
    "less_than_or_equal": "lte",
    "le": "lte",
    "gt": "gt",
    ">": "gt",
    "greater_than": "gt",
    "lt": "lt",
    "<": "lt",
    "less_than": "lt",
    "in": "in",
    "one_of": "in",
    "not_in": "not_in",
    "all_equal": "all_equal",
    "matches_regex": "matches_regex",
    "regex": "matches_regex",
    "regex_match": "matches_regex",
    "matches": "matches_regex",
    "jwt_decode": "jwt_decode",
    # public-DAG dialects (ygamciur, gmdnohlg, ychlukjm, yobgvieg, orghjavi; docs/dag-semantics.md "P07")
    "is_json": "is_json",
    "is_valid_json": "is_json",
    "valid_json": "is_json",
    "has_type": "has_type",
    "type": "has_type",
    "is_type": "has_type",
    "type_is": "has_type",
    "of_type": "has_type",
    "length_eq": "length_eq",
    "length": "length_eq",
    "length_equals": "length_eq",
    "array_length": "length_eq",
    "length_gte": "length_gte",
    "array_length_gte": "length_gte",
    "min_length": "length_gte",
    "length_ge": "length_gte",
    "length_gt": "length_gt",
    "array_length_gt": "length_gt",
    "length_lte": "length_lte",
    "array_length_lte": "length_lte",
    "max_length": "length_lte",
    "length_le": "length_lte",
    "length_lt": "length_lt",
    "array_length_lt": "length_lt",
    "starts_with": "starts_with",
    "startswith": "starts_with",
    "ends_with": "ends_with",
    "endswith": "ends_with",
    "equals_path": "equals_path",
    "eq_path": "equals_path",
    "exists_or": "exists_or",
    "array_find": "array_find",
    "array_contains": "array_find",
    "all_gt": "all_gt",
    "all_gte": "all_gte",
    "all_lt": "all_lt",
    "all_lte": "all_lte",
    # public-DAG dialects, round 2 (cvyocaao, lgzivily, rjhcjrst, ghmkznee, gmdnohlg; docs/dag-semantics.md "P07")
    "store_as": "store",
    "store": "store",
    "min_value": "gte",
    "max_value": "lte",
    "numeric_string": "numeric_string",
    "array_min_length": "length_gte",
    "array_max_length": "length_lte",
    "any_match": "any_match",
    "is_object": "has_type",
    "is_string": "has_type",
    "contains_all": "contains",
    "eq_or_empty": "eq_or_empty",
}
# Operators that name the JSON type they check (ghmkznee is_object, cvyocaao is_string).
TYPE_CHECK_OPS: dict[str, str] = {"is_object": "object", "is_string": "string"}
# Operators that also require an array (cvyocaao array_min_length: isinstance(actual, list) and len >= n).
ARRAY_LENGTH_OPS = {"array_min_length", "array_max_length"}
UNARY = {
    "exists",
    "not_exists",
    "not_null",
    "is_null",
    "not_empty",
    "is_empty",
    "is_array",
    "jwt_decode",
    "is_json",
    "has_type",
    "store",
}
LENGTH_OPS = {"length_eq": "equals", "length_gte": "gte", "length_gt": "gt", "length_lte": "lte", "length_lt": "lt"}
# "expected_<op>: value" keys (uybznoms, orghjavi): the key names the operator. Several in one
# assertion ({"expected_min": 18, "expected_max": 28}) become one assertion each.
EXPECTED_KEY_OPS: dict[str, str] = {
    "expected_gte": "gte",
    "expected_min": "gte",
    "expected_gt": "gt",
    "expected_lte": "lte",
    "expected_max": "lte",
    "expected_lt": "lt",
    "expected_ne": "not_equals",
    "expected_not_equals": "not_equals",
    "expected_contains": "contains",
    "expected_contains_all": "contains",
    "expected_not_contains": "not_contains",
    "expected_regex": "matches_regex",
    "expected_pattern": "matches_regex",
    "match_regex": "matches_regex",
    "expected_length": "length_eq",
    "expected_min_length": "length_gte",
    "expected_max_length": "length_lte",
    "expected_all_gt": "all_gt",
    "expected_all_gte": "all_gte",
    "expected_all_lt": "all_lt",
    "expected_all_lte": "all_lte",
    # bare bound keys (sgdoserd, rjhcjrst, hhrdixum, gavmyneb, dfhjkeb): {"path": p, "min_value": 1}
    "min_value": "gte",
    "max_value": "lte",
    "min_length": "length_gte",
    "max_length": "length_lte",
    "expected_length_gte": "length_gte",
    "array_min_length": "length_gte",
    "expected_eq": "equals",
}
# "expected_<state>: true|false" flags: (op when true, op when false).
EXPECTED_FLAG_OPS: dict[str, tuple[str, str]] = {
    "expected_absent": ("not_exists", "exists"),
    "expected_absent_or_null": ("not_exists", "exists"),
    "expected_present": ("exists", "not_exists"),
    "expected_exists": ("exists", "not_exists"),
    "expected_null": ("is_null", "not_null"),
    "expected_not_null": ("not_null", "is_null"),
    "not_exists": ("not_exists", "exists"),
    "expected_not_empty": ("not_empty", "is_empty"),
    "empty_or_absent": ("is_empty", "not_empty"),
}
TYPE_NAMES: dict[str, str] = {
    "string": "string",
    "str": "string",
    "text": "string",
    "number": "number",
    "float": "number",
    "double": "number",
    "decimal": "number",
    "numeric": "number",
    "integer": "integer",
    "int": "integer",
    "boolean": "boolean",
    "bool": "boolean",
    "object": "object",
    "dict": "object",
    "map": "object",
    "array": "array",
    "list": "array",
    "null": "null",
    "none": "null",
    "object_or_array": "object_or_array",
    "array_or_object": "object_or_array",  # sgdoserd: isinstance(v, (dict, list))
}
_ASSERTION_KEYS = {
    "path",
    "op",
    "operator",
    "match_type",
    "assertion",
    "expected",
    "exists",
    "type",
    "expected_type",
    "expected_in",
    "contains",
    "tolerance",
    "save_as",
    "capture_as",
    "description",
    "pattern",
    "claims",
    "algorithm",
    "comment",
    "note",
    "name",
    "label",
    "match",
    "capture_field",
    "alt_check",
    "path_any_of",
    *EXPECTED_KEY_OPS,
    *EXPECTED_FLAG_OPS,
}
# Pseudo-paths that mean "the raw body (text) of the last response": the path names the operator.
# {"path": "body_contains", "expected": "x"} -> {"path": "$._body", "op": "contains", "expected": "x"}
BODY_PATHS: dict[str, str] = {
    "body_contains": "contains",
    "response_contains": "contains",
    "text_contains": "contains",
    "body_not_contains": "not_contains",
    "response_not_contains": "not_contains",
    "body_matches": "matches_regex",
    "body_regex": "matches_regex",
    "body_contains_text": "contains_text",
    "body_icontains": "contains_text",
}
# Top-level keys of a P07 step that make it a single assertion (the step has no 'assertions' list).
SINGLE_KEYS = (
    "assertion",
    "path",
    "expected",
    "op",
    "operator",
    "match_type",
    "pattern",
    "regex",
    "contains",
    "expected_in",
    "exists",
    "expected_type",
) + tuple(BODY_PATHS)


def _has_placeholder(value: Any) -> bool:
    return isinstance(value, str) and bool(PLACEHOLDER_RE.search(value))


def compile_regex(pattern: str) -> Any:
    """The pattern in the engine matches run with (saasbench.services.saferegex); raises re.error."""
    return saferegex.compile(pattern)


def type_name(value: Any) -> str:
    """The JSON type of a value; booleans are never numbers."""
    if value is ABSENT:
        return "absent"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, (float, Decimal)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, (list, tuple)):
        return "array"
    if isinstance(value, Mapping):
        return "object"
    return type(value).__name__


def has_type(value: Any, wanted: str) -> bool:
    """JSON Schema rules: an integer is a number; 5.0 is an integer; a boolean is neither."""
    actual = type_name(value)
    if wanted == "object_or_array":
        return actual in ("object", "array")
    if wanted == "number":
        return actual in ("integer", "number")
    if wanted == "integer" and actual == "number":
        try:
            return float(value).is_integer()
        except (ValueError, OverflowError):
            return False
    return actual == wanted


def normalise_type(value: Any) -> str:
    name = TYPE_NAMES.get(str(value).strip().lower())
    if name is None:
        raise ValueError(
            f"unknown type name {value!r} (use one of string, number, integer, boolean, object, array, null, object_or_array)"
        )
    return name


# --- P07 canonical assertion ---------------------------------------------------------------------
def _valid_path(value: str) -> str:
    if not _has_placeholder(value):
        try:
            parse(value)
        except PathError as exc:
            raise ValueError(str(exc)) from exc
    return value


class Assertion(BaseModel):
    """One canonical assertion. ``expected`` is ignored by unary operators."""

    model_config = ConfigDict(extra="allow")

    path: str = Field(default="$", description="Path into the document (see saasbench.dag.jsonpath)")
    op: str = Field(default="equals", description="Canonical operator (aliases and legacy keys are normalised)")
    expected: Any = Field(default=None, description="Expected value; a list for 'in'; a regex for matches_regex")
    expected_type: str | None = Field(
        default=None, description="Also require this JSON type (string|number|integer|boolean|object|array|null)"
    )
    tolerance: float | None = Field(default=None, ge=0, description="Numeric equality tolerance")
    save_as: str | None = Field(
        default=None, description="Capture the value at path under this name (legacy: capture_as)"
    )
    description: str | None = None
    claims: dict[str, Any] = Field(default_factory=dict, description="jwt_decode: claim -> rule or literal value")
    algorithm: str | None = Field(
        default=None, description="jwt_decode: expected 'alg' of the token header (not verified)"
    )
    capture_field: str | None = Field(
        default=None, description="array_find: capture this field of the found element (save_as)"
    )
    path_any_of: list[str] = Field(
        default_factory=list,
        description="Alternative paths: the assertion holds when it holds at "
        "'path' or at any of these (checked in order; the first that holds is reported)",
    )

    @model_validator(mode="before")
    @classmethod
    def _normalise(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            raise ValueError("an assertion must be an object")
        return normalise_assertion(data)

    @field_validator("path")
    @classmethod
    def _path(cls, value: str) -> str:
        return _valid_path(value)

    @field_validator("path_any_of")
    @classmethod
    def _paths(cls, value: list[str]) -> list[str]:
        return [_valid_path(v) for v in value]

    @property
    def paths(self) -> list[str]:
        """'path' then the alternatives of path_any_of (without repeats)."""
        return list(dict.fromkeys([self.path, *self.path_any_of]))


def normalise_assertion(raw: dict[str, Any]) -> dict[str, Any]:
    """Turn any dialect seen in real DAGs into the canonical keys, noting every legacy form."""
    a = dict(raw)
    if isinstance(a.get("path"), list):  # iyjruvfz: {"path": ["$.data.uid", "$.data[0].uid"]}: the first that resolves
        listed = [p for p in a["path"] if isinstance(p, str)]
        if not listed:
            raise StepDefect("assertion 'path' is a list holding no path string")
        extra = a.get("path_any_of") or []
        a["path"], a["path_any_of"] = listed[0], [*listed[1:], *(extra if isinstance(extra, list) else [extra])]
        note("'path' given as a list -> path_any_of (the assertion holds at any of the paths)")
    if "store_as" in a:  # dfhjkeb/iyjruvfz/rjhcjrst: capture the value at path; iyjruvfz spells it "${NAME}"
        name = a.pop("store_as")
        if not isinstance(name, str) or not name.strip("${} "):
            raise StepDefect(f"assertion store_as must name a capture, got {name!r}")
        if name.strip().startswith("${") and name.strip().endswith("}"):
            name = name.strip()[2:-1]
        if a.get("save_as") not in (None, name) or a.get("capture_as") not in (None, name):
            raise ValueError(f"store_as {name!r} conflicts with save_as/capture_as")
        a["save_as"] = name.strip()
        note("assertion 'store_as' -> save_as (capture the value at path)")
    if "path_any_of" in a:  # hhrdixum: {"path_any_of": ["$.detail", "$"], "exists": true}
        alternatives = a["path_any_of"]
        if isinstance(alternatives, str):
            alternatives = [alternatives]
        if not isinstance(alternatives, list) or not alternatives or not all(isinstance(p, str) for p in alternatives):
            raise ValueError("path_any_of must be a non-empty list of paths")
        if "path" not in a:
            a["path"], a["path_any_of"] = alternatives[0], alternatives[1:]
        note("'path_any_of' -> the assertion holds at any of the paths")
    body_op = BODY_PATHS.get(str(a.get("path", "")).strip().lower()) if isinstance(a.get("path"), str) else None
    if body_op is not None:
        legacy_path = a["path"]
        a["path"] = "$._body"
        if not any(k in a for k in ("op", "operator", "match_type", "assertion")):
            a["op"] = body_op
        note(f"pseudo-path {legacy_path!r} -> path '$._body' (the raw response text), op {a.get('op', body_op)}")
    if "regex" in a and "pattern" not in a and not isinstance(a.get("regex"), bool):
        a["pattern"] = a.pop("regex")
        note("assertion 'regex' -> pattern (op matches_regex)")
    _expected_key_op(a)
    op_keys: list[str] = [k for k in ("op", "operator", "match_type", "assertion") if k in a]
    op_raw: Any = None
    if op_keys:
        values = {OPERATORS.get(str(a[k]).strip().lower(), str(a[k])) for k in op_keys}
        if len(values) > 1:
            raise ValueError(f"conflicting operators {', '.join(f'{k}={a[k]!r}' for k in op_keys)}")
        key = op_keys[0]
        op_raw = a[key]
        for k in op_keys:
            a.pop(k)
        if key not in ("op", "operator"):  # both are canonical spellings
            note(f"operator key {key!r} -> op")
    op: str | None = None
    if op_raw is not None:
        op = OPERATORS.get(str(op_raw).strip().lower())
        if op is None:
            raise ValueError(f"unknown operator {op_raw!r}")
    _dialect_operator(a, op, str(op_raw).strip().lower() if op_raw is not None else None)
    if "capture_as" in a:
        a.setdefault("save_as", a.pop("capture_as"))
        note("assertion 'capture_as' -> save_as")
    if "type" in a:
        a.setdefault("expected_type", a.pop("type"))
        note("assertion 'type' -> expected_type")
    if str(a.get("expected_type")).strip().lower() in (
        "exists",
        "present",
    ):  # kmasmnil: {"expected": "{{org_id}}", "type": "exists"}
        a.pop("expected_type")
        if op is None and not any(k in a for k in ("expected", "pattern", "expected_in", "contains", "exists")):
            op = "exists"
            note("type 'exists' -> op exists")
        else:
            note(
                "type 'exists' beside another check -> dropped (that check already needs the value; the kmasmnil "
                "reference ignores 'type')"
            )
    if str(op_raw).strip().lower() in TYPE_CHECK_OPS:  # {"operator": "is_object"}: the operator names the type
        wanted_type = TYPE_CHECK_OPS[str(op_raw).strip().lower()]
        if a.get("expected_type") is not None and normalise_type(a["expected_type"]) != wanted_type:
            raise ValueError(f"operator {op_raw!r} conflicts with expected_type {a['expected_type']!r}")
        a["expected_type"] = wanted_type
        note(f"operator {op_raw!r} -> has_type {wanted_type}")
    elif op == "has_type":  # {"operator": "type"|"is_type", "expected": "array"}
        wanted = a.pop("expected", None)
        if wanted is None or (
            a.get("expected_type") is not None and normalise_type(a["expected_type"]) != normalise_type(wanted)
        ):
            raise ValueError(f"operator {op_raw!r} needs one type name in 'expected'")
        a["expected_type"] = wanted
        note(f"operator {op_raw!r} with expected {wanted!r} -> expected_type")
    if a.get("expected_type") is not None:
        a["expected_type"] = normalise_type(a["expected_type"])
    if "expected_numeric" in a:  # rjhcjrst: {"match_type": "numeric_string", "expected_numeric": 1.085}
        if "expected" in a:
            raise ValueError("give expected or expected_numeric, not both")
        a["expected"] = a.pop("expected_numeric")
        note("'expected_numeric' -> expected")
    if "expected" in a and "pattern" in a:
        if (
            op == "matches_regex"
        ):  # gmdnohlg: {"operator": "regex_match", "expected": "2030-12-31", "pattern": "^\\d{4}-..."}
            dropped = a.pop("expected")
            warn(
                f"'expected' {short(dropped, 60)} beside 'pattern' with operator {op_raw!r}: the pattern is matched and the "
                "expected value is ignored (as in the gmdnohlg reference; a DAG defect)"
            )
        elif (
            op is None
            and isinstance(a["expected"], str)
            and OPERATORS.get(a["expected"].strip().lower()) == "matches_regex"
        ):
            a.pop("expected")  # kmasmnil: {"expected": "matches_regex", "pattern": "^[a-z0-9]{25}$"}
            op = "matches_regex"
            warn(
                "'expected' names the operator matches_regex and 'pattern' holds the regex: the pattern is matched (the "
                "kmasmnil reference compared the value with the literal text 'matches_regex', which never passes; a DAG defect)"
            )
    given = [k for k in ("expected", "pattern", "expected_in", "contains") if k in a]
    if len(given) > 1:
        raise ValueError(f"give one of expected/pattern/expected_in/contains, not {' and '.join(given)}")
    if "exists" in a:
        flag = a.pop("exists")
        if op is None:
            op = "exists" if flag not in (False, "false", 0) else "not_exists"
        note("form '\"exists\": bool' -> op exists/not_exists")
    if "pattern" in a:
        a["expected"] = a.pop("pattern")
        if op is None:
            op = "matches_regex"
    if "expected_in" in a:
        a["expected"] = a.pop("expected_in")
        op = op or "in"
        note("'expected_in' -> op in")
    if "contains" in a:
        a["expected"] = a.pop("contains")
        op = op or "contains"
        note("'contains' without expected -> op contains")
    if op is None and isinstance(a.get("expected"), str):
        magic = a["expected"]
        if magic == "not_empty":
            op = "not_empty"
        elif magic == "array":
            op = "is_array"
        elif magic == "undefined":
            op = "not_exists"
        elif magic.startswith("contains:"):
            op, a["expected"] = "contains", magic[len("contains:") :]
        if op is not None:
            note(
                f"magic expected string {magic if not magic.startswith('contains:') else 'contains:<text>'!r} -> op {op}"
            )
    if op is None:
        if "expected" in a:
            op = "equals"
        else:
            op = "exists"  # only a path, or a path and a type
    a["op"] = op
    if op == "matches_regex":
        pattern = a.get("expected")
        if not isinstance(pattern, str):
            raise ValueError("matches_regex needs a pattern string")
        if not _has_placeholder(pattern):
            try:
                compile_regex(pattern)
            except re.error as exc:
                raise ValueError(f"invalid regex {pattern!r}: {exc}") from exc
    if (
        op in ("in", "not_in")
        and not isinstance(a.get("expected"), (list, tuple))
        and not _has_placeholder(a.get("expected"))
    ):
        raise ValueError(f"operator {op!r} needs a list of values")
    _check_dialect_op(a, op)
    for key in a:
        if key not in _ASSERTION_KEYS and not is_annotation(key, a[key]):
            warn(f"assertion key {key!r} not understood (ignored; a DAG defect)")
    return a


def _dialect_operator(a: dict[str, Any], op: str | None, raw: str | None) -> None:
    """Companion keys of the round-2 dialect operators (store_as + key, array_min_length, contains_all)."""
    if op == "store":  # cvyocaao: {"path": "$.access_token", "operator": "store_as", "key": "sa_access_token"}
        name = a.pop("key", None)
        if name is None:
            name = a.get("save_as") or a.get("capture_as")
        if not isinstance(name, str) or not name.strip():
            raise StepDefect(f"operator {raw!r} names no 'key' to store the value under")
        if a.get("save_as") not in (None, name) or a.get("capture_as") not in (None, name):
            raise ValueError(f"operator {raw!r}: key {name!r} conflicts with save_as/capture_as")
        a.pop("capture_as", None)
        a["save_as"] = name.strip()
        note(
            f"operator {raw!r} with key -> op store, save_as {name.strip()!r} (a list stores its first element, an "
            "object with an id its id)"
        )
    if raw in ARRAY_LENGTH_OPS and a.get("type") is None and a.get("expected_type") is None:
        a["expected_type"] = "array"  # the value must be an array, then its length is compared
        note(f"operator {raw!r} -> {OPERATORS[raw]} with expected_type array")
    if raw == "contains_all":
        if "expected" in a and not isinstance(a["expected"], list) and not _has_placeholder(a["expected"]):
            a["expected"] = [a["expected"]]
        note("operator 'contains_all' -> contains (every listed element)")


def _expected_key_op(a: dict[str, Any]) -> None:
    """``{"expected_gte": 1}`` -> ``op gte, expected 1``; ``{"expected_absent": true}`` -> ``op not_exists``.

    Only when the assertion names no operator and no ``expected`` of its own; otherwise the key
    is left alone and reported as not understood.
    """
    keys = [k for k in a if k in EXPECTED_KEY_OPS or k in EXPECTED_FLAG_OPS]
    if len(keys) != 1 or any(
        k in a
        for k in (
            "op",
            "operator",
            "match_type",
            "assertion",
            "expected",
            "pattern",
            "regex",
            "expected_in",
            "contains",
            "exists",
        )
    ):
        for key in keys:
            warn(f"assertion key {key!r} next to another operator or expected value (ignored; a DAG defect)")
            a.pop(key)
        return
    key = keys[0]
    value = a.pop(key)
    if key in EXPECTED_FLAG_OPS:
        if not isinstance(value, bool):
            raise ValueError(f"{key!r} must be true or false")
        a["op"] = EXPECTED_FLAG_OPS[key][0 if value else 1]
    else:
        a["op"], a["expected"] = EXPECTED_KEY_OPS[key], value
        if key == "expected_eq" and isinstance(value, str) and re.match(r"^\s*\$(?:$|[.\[])", value):
            a["op"] = "equals_path"  # sgdoserd: {"path": "$.first.id", "expected_eq": "$.second.id"}
        if key == "array_min_length" and a.get("type") is None and a.get("expected_type") is None:
            a["expected_type"] = "array"  # gavmyneb: isinstance(actual, list) and len(actual) >= n
    note(f"assertion '{key}' -> op {a['op']}")


def expand_assertion(raw: Any) -> list[Any]:
    """One assertion per ``expected_<op>`` key: ``{"path": p, "expected_min": 18, "expected_max": 28}``
    -> ``[{"path": p, "expected_min": 18}, {"path": p, "expected_max": 28}]``."""
    if not isinstance(raw, dict):
        return [raw]
    keys = [k for k in raw if k in EXPECTED_KEY_OPS or k in EXPECTED_FLAG_OPS]
    if len(keys) < 2:
        return [raw]
    note(f"assertion with {', '.join(keys)} -> one assertion each")
    return [{k: v for k, v in raw.items() if k not in keys or k == key} for key in keys]


# Keys that carry an operator's operand under another name: key -> (the operator it belongs to, how
# messages name it, the normalisation note). Beside another operator such a key is a DAG defect.
_COMPANION_KEYS: dict[str, tuple[str, str, str]] = {
    "alt_check": ("exists_or", "exists_or", "exists_or with alt_check -> expected (the alternative path)"),
    "match": ("array_find", "array_find/array_contains", "array_find/array_contains 'match' -> expected"),
}


def _check_dialect_op(a: dict[str, Any], op: str) -> None:
    """Load-time checks of the public-DAG operators and their companion keys."""
    if op in LENGTH_OPS or op in ("all_gt", "all_gte", "all_lt", "all_lte"):
        value = a.get("expected")
        if _number(value) is None and not _has_placeholder(value):
            raise ValueError(f"operator {op!r} needs a number in 'expected', got {value!r}")
    if op in ("starts_with", "ends_with") and not isinstance(a.get("expected"), (str, int, float)):
        raise ValueError(f"operator {op!r} needs a string in 'expected'")
    if op == "equals_path":
        _check_other_path(a.get("expected"), "eq_path", "the other path in 'expected'")
    for key, (owner, owner_text, moved) in _COMPANION_KEYS.items():
        if key not in a:
            continue
        if op != owner:
            warn(f"assertion key {key!r} without operator {owner_text} (ignored; a DAG defect)")
            a.pop(key)
        else:
            a["expected"] = a.pop(key)
            note(moved)
    if op == "exists_or":
        _check_other_path(a.get("expected"), "exists_or", "the alternative path in 'alt_check'")
    if op == "array_find" and not isinstance(a.get("expected"), dict):
        raise ValueError("operator 'array_find'/'array_contains' needs a 'match' object {field: value}")
    if "capture_field" in a and op != "array_find":
        warn("assertion key 'capture_field' without operator array_find (ignored; a DAG defect)")
        a.pop("capture_field")


class P07Inputs(PrimitiveInputs):
    assertions: list[Assertion] = Field(
        default_factory=list,
        description="All must pass (the single-assertion forms are "
        "normalised into this list). Empty: the step checks nothing and passes (a DAG "
        "defect, reported as a loader warning)",
    )
    response: Any = Field(
        default=None,
        description="Assert on this value instead of the last document: a captured name, a placeholder or inline JSON",
    )
    source: Any = Field(default=None, description="Same as response (family-B name)")

    @model_validator(mode="before")
    @classmethod
    def _single(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        if data.get("assertions") in (None, []):  # absent or empty: a checkable top-level field becomes the assertion
            bodies = {k: data.pop(k) for k in list(data) if k in BODY_PATHS}
            extra: list[dict[str, Any]] = []
            for key, wanted in bodies.items():  # {"body_contains": "x"} or {"body_contains": ["x", "y"]}
                for item in wanted if isinstance(wanted, list) else [wanted]:
                    extra.append({"path": key, "expected": item})
                note(f"top-level {key!r} -> assertions on the raw response text")
            if any(k in data for k in SINGLE_KEYS):
                single = {k: data.pop(k) for k in list(data) if k in _ASSERTION_KEYS or k == "regex"}
                if "path" not in single and ("pattern" in single or "regex" in single):
                    single["path"] = "$._body"  # a bare pattern is matched against the response text
                    note("top-level pattern without a path -> matched against the raw response text ($._body)")
                extra.insert(0, single)
                note("single-assertion form (top-level assertion/path/expected/pattern/...) -> assertions: [...]")
            if extra:
                if "assertions" in data:
                    note("empty 'assertions' with a checkable top-level field: that field is the assertion")
                data["assertions"] = extra
        if isinstance(data.get("assertions"), dict):
            data["assertions"] = [data["assertions"]]
            note("assertions given as one object -> list")
        if isinstance(data.get("assertions"), list):
            data["assertions"] = [x for item in data["assertions"] for x in expand_assertion(item)]
        if not data.get("assertions"):
            warn("no assertions: this step checks nothing and passes (a DAG defect)", "assertions")
            data["assertions"] = []
        for key in ("response", "source"):
            if isinstance(data.get(key), str) and _FROM_MAGIC.match(data[key]):
                data[key] = None
                note(f"{key} '{{{{from_Pnn}}}}' -> the last document")
        return data


# --- documents -----------------------------------------------------------------------------------
class Doc:
    """What assertions look at: a value plus, when it is a response body, its headers and text."""

    def __init__(
        self,
        value: Any,
        headers: Mapping[str, str] | None = None,
        text: str | None = None,
        label: str = "last document",
    ):
        self.value, self.headers, self.text, self.label = value, headers, text, label

    def get(self, path: str) -> Any:
        return path_value(path, self.value, headers=self.headers, text=self.text)


def load_document(ctx: RunContext, ref: Any) -> Doc | str:
    """The document named by ``ref`` (None = the last document); a str is an error message."""
    if ref is None:
        if ctx.last_document is MISSING:
            return "no document to check: no earlier step in this run produced a response or result"
        response = ctx.last_response
        if response is not None and ctx.last_document is response.body:
            return Doc(response.body, response.headers, response.text, f"body of {response.method} {response.url}")
        return Doc(ctx.last_document)
    try:
        if isinstance(ref, str) and not _has_placeholder(ref):
            if not _NAME.match(ref.strip()):
                return f"response/source {ref!r} is neither a captured name nor a placeholder"
            value, label = ctx.resolve("{{" + ref.strip() + "}}"), f"captured {ref.strip()!r}"
        else:
            value, label = ctx.resolve(ref), "the given response"
    except UnresolvedPlaceholder as exc:
        return str(exc)
    if isinstance(value, Mapping) and {"status", "headers", "body"} <= set(value):
        headers = value["headers"] if isinstance(value["headers"], Mapping) else None
        return Doc(value["body"], headers, None, label)
    return Doc(value, label=label)


def short(value: Any, limit: int = 200) -> str:
    if value is ABSENT:
        return "<absent>"
    try:
        text = json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= limit else text[:limit] + f"...(+{len(text) - limit} chars)"


# --- comparisons ---------------------------------------------------------------------------------
def _check_other_path(other: Any, op: str, what: str) -> None:
    """Operators whose ``expected`` is a second path (eq_path, exists_or): it must parse at load time."""
    if not isinstance(other, str):
        raise ValueError(f"operator {op!r} needs {what}")
    if not _has_placeholder(other):
        try:
            parse(other)
        except PathError as exc:
            raise ValueError(f"{op}: {exc}") from exc


def _order(actual: Any, expected: Any) -> tuple[Any, Any] | str:
    a, e = _number(actual), _number(expected)
    da = _decimal(a) if a is not None else None
    de = _decimal(e) if e is not None else None
    if da is None or de is None:
        return f"not comparable as numbers: actual {short(actual)}, expected {short(expected)}"
    return da, de


def _present(value: Any) -> bool:
    return value is not ABSENT and value is not None


def _empty(value: Any) -> bool:
    if not _present(value):
        return True
    if isinstance(value, str):
        return not value.strip()
    if isinstance(value, (list, tuple, Mapping)):
        return len(value) == 0
    return False


def _contains(actual: Any, expected: Any) -> bool:
    if isinstance(actual, str):
        if isinstance(expected, str):
            return expected in actual
        return _present(expected) and not isinstance(expected, (dict, list)) and _scalar_text(expected) in actual
    if isinstance(actual, (list, tuple)):
        if isinstance(expected, (list, tuple)):
            return all(any(values_equal(a, e) for a in actual) for e in expected)
        return any(values_equal(a, expected) for a in actual)
    if isinstance(actual, Mapping):
        return str(expected) in actual
    return False


def _scalar_text(value: Any) -> str:
    return json.dumps(value) if isinstance(value, bool) else str(value)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


def _contains_id(actual: Any, wanted: Any) -> bool:
    items = actual if isinstance(actual, (list, tuple)) else [actual]
    for item in items:
        candidate = item.get("id", ABSENT) if isinstance(item, Mapping) else item
        if candidate is not ABSENT and str(candidate) == str(wanted):
            return True
    return False


def check(a: Assertion, value: Any, doc: Doc) -> tuple[bool, str]:
    """Evaluate one canonical assertion on the value found at its path; (passed, why-not)."""
    op, expected = a.op, a.expected
    if op == "any_match":  # expected_type applies to each candidate, not to the list of matches
        return _any_match(a, value)
    if a.expected_type is not None and not has_type(value, a.expected_type):
        return False, f"type {type_name(value)}, expected {a.expected_type}"
    if op == "store":
        stored = stored_value(value)
        return _present(
            stored
        ), f"nothing to store under {a.save_as!r} ({'absent' if value is ABSENT else short(value)})"
    if op == "eq_or_empty":  # gmdnohlg: equal, or absent/null/""/[]/{}
        if value is ABSENT or value is None or value in ("", [], {}):
            return True, ""
        return values_equal(value, expected, a.tolerance), "neither equal nor empty"
    if op == "exists" or op == "not_null":
        return _present(value), "absent" if value is ABSENT else "null"
    if op in ("not_exists", "is_null"):
        return not _present(value), f"present: {short(value)}"
    if op == "not_empty":
        return not _empty(value), "empty" if _present(value) else ("absent" if value is ABSENT else "null")
    if op == "is_empty":
        return _empty(value), f"not empty: {short(value)}"
    if op == "is_array":
        return isinstance(value, list), f"{type_name(value)}, not an array"
    if op == "jwt_decode":
        return _check_jwt(a, value, doc)
    if op == "has_type":  # the type itself was checked above
        return True, ""
    if op == "is_json":
        return _is_json(a, value, doc), "not JSON" if _present(value) else (
            "absent" if value is ABSENT else "null or empty"
        )
    if op == "exists_or":
        if _present(value):
            return True, ""
        try:
            other = doc.get(str(expected))
        except PathError as exc:
            return False, f"absent, and alternative {expected}: {exc}"
        return _present(other), f"absent, and alternative {expected} is {short(other)}"
    if op == "equals_path":
        try:
            other = doc.get(str(expected))
        except PathError as exc:
            return False, f"{expected}: {exc}"
        return value is not ABSENT and values_equal(
            value, other, a.tolerance
        ), f"not equal to {expected} = {short(other)}"
    if value is ABSENT and not (op == "equals" and expected is None):  # expected null: absent counts
        return False, "absent"
    if op == "equals":
        return values_equal(value, expected, a.tolerance), "not equal"
    if op == "not_equals":
        return not values_equal(value, expected, a.tolerance), "equal"
    if op == "contains":
        return _contains(value, expected), "does not contain it"
    if op == "not_contains":
        return not _contains(value, expected), "contains it"
    if op == "contains_text":
        return str(expected).casefold() in _text(value).casefold(), "text does not contain it (case-insensitive)"
    if op == "not_contains_id":
        return not _contains_id(value, expected), "an element has that id"
    if (
        op == "numeric_string"
    ):  # rjhcjrst: a string holding a number (a JSON number fails), numerically equal to expected
        if not isinstance(value, str) or _number(value) is None:
            return False, f"{type_name(value)}, not a string holding a number"
        if expected is None:
            return True, ""
        return _numeric_equal(value, expected, a.tolerance), "numerically different"
    if op in ("gte", "lte", "gt", "lt"):
        pair = _order(value, expected)
        if isinstance(pair, str):
            return False, pair
        x, y = pair
        return {"gte": x >= y, "lte": x <= y, "gt": x > y, "lt": x < y}[op], "comparison false"
    if op in ("in", "not_in"):
        if not isinstance(expected, (list, tuple)):
            return False, f"expected a list of values, got {short(expected)}"
        found = any(values_equal(value, e, a.tolerance) for e in expected)
        return found if op == "in" else not found, "not among them" if op == "in" else "among them"
    if op in LENGTH_OPS:
        if not isinstance(value, (str, list, tuple, Mapping)):
            return False, f"{type_name(value)} has no length"
        pair = _order(len(value), expected)
        if isinstance(pair, str):
            return False, pair
        x, y = pair
        ok = {"equals": x == y, "gte": x >= y, "gt": x > y, "lte": x <= y, "lt": x < y}[LENGTH_OPS[op]]
        return ok, f"length {len(value)}"
    if op in ("starts_with", "ends_with"):
        if not isinstance(value, str):
            return False, f"{type_name(value)} is not text"
        wanted = _scalar_text(expected)
        return (value.startswith(wanted) if op == "starts_with" else value.endswith(wanted)), "no match"
    if op == "array_find":
        if not isinstance(value, (list, tuple)):
            return False, f"{type_name(value)}, not an array"
        return find_element(a, value) is not ABSENT, f"no element matches {short(expected, 120)}"
    if op in ("all_gt", "all_gte", "all_lt", "all_lte"):
        items = value if isinstance(value, list) else [value]
        if not items:
            return False, "no values to compare (empty list)"
        cmp = op[4:]
        bad = []
        for item in items:
            pair = _order(item, expected)
            if (
                isinstance(pair, str)
                or not {
                    "gte": pair[0] >= pair[1],
                    "lte": pair[0] <= pair[1],
                    "gt": pair[0] > pair[1],
                    "lt": pair[0] < pair[1],
                }[cmp]
            ):
                bad.append(item)
        return not bad, f"{len(bad)}/{len(items)} fail, e.g. {short(bad[0]) if bad else ''}"
    if op == "all_equal":
        items = value if isinstance(value, list) else [value]
        if not items:
            return False, "no values to compare (empty list)"
        bad = [v for v in items if not values_equal(v, expected, a.tolerance)]
        return not bad, f"{len(bad)}/{len(items)} differ, e.g. {short(bad[0]) if bad else ''}"
    if op == "matches_regex":
        if isinstance(value, (dict, list)) or value is None:
            return False, f"{type_name(value)} is not text"
        subject = _text(value) if not isinstance(value, str) else value
        if len(subject) > MAX_REGEX_SUBJECT:
            subject = subject[:MAX_REGEX_SUBJECT]
        try:
            # app text, a DAG pattern: bounded by the node deadline (RegexTimeout fails the node, never a pass)
            hit = saferegex.search(compile_regex(str(expected)), subject, what=f"the value at {a.path or '$'}")
            return hit is not None, "no match"
        except re.error as exc:
            return False, f"invalid regex: {exc}"
    return False, f"operator {op!r} not implemented"  # unreachable: the model rejects unknown operators


def stored_value(value: Any) -> Any:
    """What op store (cvyocaao ``store_as``) keeps: a list's first element, then an object's ``id``."""
    if isinstance(value, (list, tuple)):
        value = value[0] if value else ABSENT
    if isinstance(value, Mapping) and "id" in value:
        value = value["id"]
    return value


def _numeric_equal(actual: Any, expected: Any, tolerance: float | None) -> bool:
    pair = _order(actual, expected)
    if isinstance(pair, str):
        return False
    return abs(pair[0] - pair[1]) <= _decimal(float(tolerance or 0))


def _any_match(a: Assertion, value: Any) -> tuple[bool, str]:
    """rjhcjrst ``any_match``: some value the path matched (a wildcard's list, or the one value) has the
    expected type (if given) and equals ``expected`` (numbers numerically; a string may contain it);
    with neither, some matched value is not null."""
    if value is ABSENT:
        return False, "absent"
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    if not items:
        return False, "no values matched"
    for item in items:
        if a.expected_type is not None and not has_type(item, a.expected_type):
            continue
        if a.expected is not None:
            if (
                values_equal(item, a.expected, a.tolerance)
                or _numeric_equal(item, a.expected, a.tolerance)
                or (isinstance(item, str) and _scalar_text(a.expected) in item)
            ):
                return True, ""
        elif a.expected_type is not None or item is not None:
            return True, ""
    wanted = " and ".join(
        x
        for x in (
            (f"of type {a.expected_type}" if a.expected_type else ""),
            (f"equal to / containing {short(a.expected, 80)}" if a.expected is not None else ""),
        )
        if x
    )
    return False, f"none of {len(items)} value(s) is {wanted or 'not null'}"


def _is_json(a: Assertion, value: Any, doc: Doc) -> bool:
    """The response body parsed as JSON (path ``$`` of a response), or a value that is JSON data
    (a string holding JSON text counts: a JSON column, an embedded document)."""
    if not _present(value):
        return False
    if isinstance(value, str):
        if doc.text is not None and value is doc.value and a.path.strip() in ("", "$"):
            return False  # the body did not parse as JSON (parse_body kept the text)
        try:
            json.loads(value)
        except (ValueError, RecursionError):
            return False
    return True


def _element_matches(item: Any, match: Mapping[str, Any]) -> bool:
    """Every key equals (P07 equality); a key ``<field>_contains`` absent from the element means
    ``<field>`` contains the value (ygamciur ``{"name_contains": "Developer"}``)."""
    if not isinstance(item, Mapping):
        return False
    for key, wanted in match.items():
        if key in item:
            if not values_equal(item[key], wanted):
                return False
        elif key.endswith("_contains") and key[: -len("_contains")] in item:
            if not _contains(item[key[: -len("_contains")]], wanted):
                return False
        else:
            return False
    return True


def find_element(a: Assertion, value: Any) -> Any:
    """array_find: the first element matching ``expected`` (the 'match' object), else ABSENT."""
    if not isinstance(value, (list, tuple)) or not isinstance(a.expected, Mapping):
        return ABSENT
    return next((item for item in value if _element_matches(item, a.expected)), ABSENT)


# --- JWT -----------------------------------------------------------------------------------------
_JWT_RE = re.compile(r"^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*$")
_UUID_RE = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
_FUTURE_RE = re.compile(r"^future_timestamp(?:_(\d+)([smhd]))?$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _find_jwt(value: Any, depth: int = 0) -> str | None:
    if isinstance(value, str):
        return value if _JWT_RE.match(value) and value.startswith("eyJ") else None
    if depth > 8:
        return None
    children = value.values() if isinstance(value, Mapping) else value if isinstance(value, list) else []
    for child in children:
        found = _find_jwt(child, depth + 1)
        if found:
            return found
    return None


def _b64json(part: str) -> Any:
    raw = base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))
    return json.loads(raw)


def _check_jwt(a: Assertion, value: Any, doc: Doc) -> tuple[bool, str]:
    """Decode a JWT WITHOUT verifying its signature (the harness has no key) and check claims.

    Claim rules: ``uuid_format``; ``future_timestamp`` (after now); ``future_timestamp_<N><s|m|h|d>``
    (after now and at most N units + 5 min ahead); ``exists``/``not_empty``; anything else is
    a literal value compared with P07 equality. ``algorithm`` is compared with the header's
    ``alg`` (a claim of the token, not a verification).
    """
    token = (
        value
        if isinstance(value, str) and _JWT_RE.match(value)
        else (_find_jwt(value) if a.path.strip() in ("", "$") else None)
    )
    if token is None:
        return False, f"no JWT at {a.path}: {short(value)}"
    header_part, payload_part, _ = token.split(".")
    try:
        header, payload = _b64json(header_part), _b64json(payload_part)
    except (binascii.Error, ValueError, UnicodeDecodeError):
        return False, "token is not a decodable JWT"
    if not isinstance(header, dict) or not isinstance(payload, dict):
        return False, "JWT header/payload are not JSON objects"
    problems: list[str] = []
    if a.algorithm and str(header.get("alg", "")).upper() != a.algorithm.upper():
        problems.append(f"alg {header.get('alg')!r}, expected {a.algorithm!r}")
    now = time.time()
    for claim, rule in a.claims.items():
        actual = payload.get(claim, ABSENT)
        ok, why = _claim_ok(actual, rule, now)
        if not ok:
            problems.append(f"claim {claim} {short(actual)}: {why}")
    return not problems, "; ".join(problems)


def _claim_ok(actual: Any, rule: Any, now: float) -> tuple[bool, str]:
    if isinstance(rule, str):
        if rule == "uuid_format":
            return isinstance(actual, str) and bool(_UUID_RE.match(actual)), "not a UUID"
        if rule in ("exists", "not_empty"):
            return not _empty(actual), "absent or empty"
        m = _FUTURE_RE.match(rule)
        if m:
            if isinstance(actual, bool) or not isinstance(actual, (int, float)):
                return False, "not a numeric timestamp"
            if actual <= now:
                return False, f"not in the future ({actual - now:+.0f}s)"
            if m.group(1):
                horizon = int(m.group(1)) * _UNITS[m.group(2)] + JWT_CLOCK_SLACK_S
                if actual - now > horizon:
                    return False, f"{actual - now:.0f}s ahead, more than {horizon}s"
            return True, ""
    return values_equal(actual, rule), f"expected {short(rule)}"


# --- P07 -----------------------------------------------------------------------------------------
# Assertion fields whose placeholders P07 resolves itself: 'assertions' is a raw field so that a
# capture name (save_as/store_as: iyjruvfz "${TEST_BOOKING_UID}") is a name, not a placeholder.
_RESOLVED_FIELDS = ("path", "path_any_of", "expected", "claims", "algorithm", "capture_field")


def resolve_assertion(ctx: RunContext, a: Assertion) -> Assertion:
    """The assertion with the placeholders of its values resolved (never its capture name)."""
    update: dict[str, Any] = {}
    for name in _RESOLVED_FIELDS:
        value = getattr(a, name)
        resolved = ctx.resolve(value)
        if resolved != value or type(resolved) is not type(value):
            if name == "path" and not isinstance(resolved, str):
                resolved = to_text(resolved)
            if name == "path_any_of":
                resolved = [p if isinstance(p, str) else to_text(p) for p in resolved]
            update[name] = resolved
    return a.model_copy(update=update) if update else a


@primitive("P07", P07Inputs, raw_fields={"response", "source", "assertions", "regex", *_ASSERTION_KEYS, *BODY_PATHS})
def json_value_assert(inputs: P07Inputs, ctx: RunContext) -> StepResult:
    """Every assertion holds on the last document (or the named one)."""
    if not inputs.assertions:
        return StepResult(
            passed=True,
            message="no assertions: nothing checked (a DAG defect reported by 'dag check')",
            evidence={"assertions": [], "nothing_checked": True},
        )
    try:
        assertions = [resolve_assertion(ctx, a) for a in inputs.assertions]
    except UnresolvedPlaceholder as exc:
        return StepResult(passed=False, message=str(exc), evidence={"placeholder": exc.placeholder})
    ref = inputs.response if inputs.response is not None else inputs.source
    doc = load_document(ctx, ref)
    if isinstance(doc, str):
        return StepResult(passed=False, message=doc)
    rows: list[dict[str, Any]] = []
    failures: list[str] = []
    for a in assertions:
        first: tuple[bool, str, Any, str] | None = None
        for path in a.paths:  # path, then path_any_of: the first path where the assertion holds
            try:
                value = doc.get(path)
            except PathError as exc:
                ok, why, value = False, str(exc), ABSENT
            else:
                ok, why = check(a, value, doc)
            if ok:
                break
            first = first or (ok, why, value, path)
        else:
            ok, why, value, path = first if first is not None else (False, "no path", ABSENT, a.path)
        if a.save_as and a.op == "array_find":  # capture the found element (or its capture_field)
            found = find_element(a, value)
            if isinstance(found, Mapping) and a.capture_field:
                found = found.get(a.capture_field, ABSENT)
            if found is not ABSENT:
                ctx.capture(a.save_as, found)
            elif ok:
                ok, why = False, f"found element has no field {a.capture_field!r} to capture as {a.save_as}"
        elif a.save_as and a.op == "store":  # cvyocaao store_as: first element, then its id
            stored = stored_value(value)
            if _present(stored):
                ctx.capture(a.save_as, stored)
        elif a.save_as and value is not ABSENT:
            ctx.capture(a.save_as, value)
        what = (
            f"{path} {a.op}"
            + ("" if a.op in UNARY else f" {short(a.expected, 80)}")
            + (f" ({a.expected_type})" if a.expected_type else "")
        )
        if a.path_any_of and not ok:
            what = f"{' | '.join(a.paths)} (none) {a.op}"
        rows.append({"path": path, "op": a.op, "expected": a.expected, "actual": short(value), "passed": ok})
        if not ok:
            failures.append(f"{what}: actual {short(value)} [{why}]")
    passed = not failures
    message = f"{len(rows) - len(failures)}/{len(rows)} assertions passed on {doc.label}"
    if failures:
        message += "; failed: " + "; ".join(failures)
    return StepResult(passed=passed, message=message, evidence={"assertions": rows, "document": doc.label})


# --- P06 -----------------------------------------------------------------------------------------
class P06Inputs(PrimitiveInputs):
    required_fields: list[str] = Field(
        default_factory=list, description="Dotted paths that must be present (and not null)"
    )
    field_types: dict[str, str] = Field(
        default_factory=dict, description="path -> JSON type name (string|number|integer|boolean|object|array|null)"
    )
    response: Any = Field(
        default=None,
        description="Check this value instead of the last document: a captured name, a placeholder or inline JSON",
    )

    @model_validator(mode="before")
    @classmethod
    def _legacy(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        if isinstance(data.get("response"), str) and _FROM_MAGIC.match(data["response"]):
            data["response"] = None
            note("response '{{from_Pnn}}' -> the last document")
        if isinstance(data.get("required_fields"), str):
            data["required_fields"] = [data["required_fields"]]
            note("required_fields given as a string -> list")
        if not data.get("required_fields") and not data.get("field_types"):  # ychlukjm: required_fields: []
            warn(
                "no required_fields or field_types: this step checks nothing and passes (a DAG defect)",
                "required_fields",
            )
        return data

    @field_validator("field_types")
    @classmethod
    def _types(cls, value: dict[str, str]) -> dict[str, str]:
        return {path: normalise_type(name) for path, name in value.items()}


@primitive("P06", P06Inputs, raw_fields={"response"})
def json_schema_match(inputs: P06Inputs, ctx: RunContext) -> StepResult:
    """Required fields are present (not null) and typed as declared; a list body checks its first element."""
    if not inputs.required_fields and not inputs.field_types:
        return StepResult(
            passed=True,
            message="no required_fields or field_types: nothing checked (a DAG defect reported by 'dag check')",
            evidence={"nothing_checked": True},
        )
    doc = load_document(ctx, inputs.response)
    if isinstance(doc, str):
        return StepResult(passed=False, message=doc)
    body = doc.value
    if isinstance(body, list):
        if not body:
            return StepResult(passed=False, message=f"{doc.label} is an empty list: no element to check")
        body = body[0]
    if not isinstance(body, Mapping):
        response = ctx.last_response
        detail = (
            f" ({response.json_error})"
            if inputs.response is None and response is not None and response.json_error
            else ""
        )
        return StepResult(passed=False, message=f"{doc.label} is not a JSON object{detail}: {short(body)}")
    missing: list[str] = []
    wrong: list[str] = []
    for field in inputs.required_fields:
        try:
            value = path_value(field, body)
        except PathError as exc:
            missing.append(f"{field} ({exc})")
            continue
        if not _present(value):
            missing.append(field if value is ABSENT else f"{field} (null)")
    for field, wanted in inputs.field_types.items():
        try:
            value = path_value(field, body)
        except PathError as exc:
            wrong.append(f"{field} ({exc})")
            continue
        if not has_type(value, wanted):
            wrong.append(f"{field}: {type_name(value)}, expected {wanted}")
    checked = len(inputs.required_fields) + len(inputs.field_types)
    problems = ([f"missing: {', '.join(missing)}"] if missing else []) + (
        [f"wrong types: {'; '.join(wrong)}"] if wrong else []
    )
    message = f"{checked - len(missing) - len(wrong)}/{checked} field checks passed on {doc.label}"
    if problems:
        message += "; " + "; ".join(problems) + f"; keys present: {short(sorted(body)[:30])}"
    return StepResult(passed=not problems, message=message, evidence={"missing": missing, "wrong_types": wrong})
