"""Database connection layer of the DB primitives (P08-P11, and P29's final DB check).

One :class:`Database` per run, chosen from the DSN scheme and cached on the run context by
:func:`get_database` (opened lazily on first use, closed by ``ctx.close()`` at the end of the run):

=========================================  =================================================
DSN                                        engine
=========================================  =================================================
``postgresql://user:pw@host:port/db``       PostgreSQL through psycopg 3 (also ``postgres://``,
                                           ``postgresql+psycopg://``); one autocommit connection
``mysql://user:pw@host:port/db``            MySQL / MariaDB through PyMySQL (also ``mariadb://``,
                                           ``mysql+pymysql://``); one autocommit connection
``sqlite:///relative.db``,                  SQLite through the standard library, read-write; the
``sqlite:////absolute/path.db``             file must exist (it is never created)
``mongodb://host:port/db``                  MongoDB through pymongo; queries are JSON documents
                                           (see :class:`MongoDatabase`)
=========================================  =================================================

DSN options understood by saasbench itself (removed before the DSN reaches the driver):
``statement_timeout`` (seconds, or with a unit: ``500ms``, ``2s``), ``connect_timeout``
(seconds), ``busy_timeout`` (SQLite, seconds). Every query is further bounded by the node
deadline (``ctx.timeout()``), so a runaway statement cannot outlive its node.

Values from the app never become SQL text: :func:`bind_placeholders` turns every ``{{name}}``
/ ``${VAR}`` of a SQL template into a bound parameter (the whole quoted literal around it
becomes the parameter), and :func:`quote_ident` quotes the rare placeholder inside a quoted
identifier.

Name rules (tables and columns in P09-P11): a part written in double quotes (``core."apiKey"``,
``"firstName"``; backticks for MySQL) matches exactly; an unquoted part matches exactly or,
failing that, case-insensitively (PostgreSQL folds unquoted names to lower case, but DAG authors
often write the real mixed-case name unquoted). An unqualified table name is looked up on the
search path (PostgreSQL ``current_schemas(false)``, MySQL the DSN's database, SQLite every
attached database); a table found only in another schema is reported as a hint, never a pass.
"""

from __future__ import annotations

import datetime as _dt
import decimal
import ipaddress
import json
import math
import re
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

from saasbench.dag.placeholders import MUSTACHE, SHELL, to_text

if TYPE_CHECKING:
    from saasbench.evaluation.context import RunContext

MAX_ROWS = 10_000  # rows kept from one result; more are counted but dropped (``truncated``)

NO_DSN_MESSAGE = "no database: pass --db-dsn"


# --- errors and records ---------------------------------------------------------------------------
class DatabaseError(Exception):
    """Anything that went wrong talking to the database; the message is the driver's."""


class NoDatabase(DatabaseError):
    """The run has no DSN."""


class TableNotFound(DatabaseError):
    def __init__(self, name: str, hint: str = ""):
        self.name = name
        self.hint = hint
        super().__init__(f"table {name} not found" + (f" ({hint})" if hint else ""))


@dataclass
class QueryResult:
    """One statement's outcome. ``rows`` are dicts of JSON-friendly values (see :func:`jsonable`)."""

    columns: list[str]
    rows: list[dict[str, Any]]
    rowcount: int  # rows affected (INSERT/UPDATE/DELETE) or returned; -1 when the driver does not know
    is_select: bool  # the statement returned a result set (SELECT, VALUES, ... RETURNING, SHOW)
    truncated: bool = False

    def as_document(self) -> dict[str, Any]:
        """What a following P07 sees: ``{"rows": [...], "count": n, "rowcount": n}``."""
        return {"rows": self.rows, "count": len(self.rows), "rowcount": self.rowcount}


@dataclass(frozen=True)
class TableRef:
    schema: str | None
    name: str
    kind: str = "table"  # table, view, materialized view, partitioned table, foreign table, collection
    visible: bool = True  # reachable without a schema (on the search path)

    def __str__(self) -> str:
        return f"{self.schema}.{self.name}" if self.schema else self.name


@dataclass
class Column:
    name: str
    data_type: str  # the engine's full type text, e.g. "character varying(255)", "varchar(100)"
    nullable: bool
    type_names: tuple[str, ...] = ()  # every spelling of the type (udt name, base name, ...)

    def type_matches(self, expected: str) -> bool:
        """Case-insensitive substring match of ``expected`` (or a synonym) in any type spelling."""
        names = [n.lower() for n in (self.data_type, *self.type_names) if n]
        wanted = expected.strip().lower()
        options = [wanted, *TYPE_SYNONYMS.get(wanted, ())]
        return any(o in n for o in options for n in names)


# Substring synonyms for P10 type checks ("string" matches varchar and text, ...).
TYPE_SYNONYMS: dict[str, tuple[str, ...]] = {
    "string": ("char", "text", "string"),
    "str": ("char", "text"),
    "varchar": ("character varying", "varchar"),
    "character varying": ("varchar",),
    "int": ("int", "serial"),
    "integer": ("int4", "int"),
    "bigint": ("int8",),
    "smallint": ("int2",),
    "number": ("int", "numeric", "decimal", "real", "double", "float"),
    "float": ("float", "double", "real"),
    "double": ("double", "float8"),
    "decimal": ("numeric", "decimal"),
    "numeric": ("numeric", "decimal"),
    "bool": ("bool", "tinyint(1)"),
    "boolean": ("bool", "tinyint(1)"),
    "datetime": ("timestamp", "datetime"),
    "timestamp": ("timestamp", "datetime"),
    "timestamptz": ("timestamp with time zone", "timestamptz"),
    "json": ("json",),
    "jsonb": ("jsonb",),
    "uuid": ("uuid", "char(36)"),
    "enum": ("enum", "user-defined"),
}


@dataclass
class Index:
    name: str
    columns: list[str]  # key columns in order; expression parts are left out
    definition: str
    unique: bool = False
    primary: bool = False
    table: str = ""


@dataclass
class DbOptions:
    statement_timeout_s: float = 30.0
    connect_timeout_s: float = 10.0
    busy_timeout_s: float = 5.0


# --- JSON-friendly values -------------------------------------------------------------------------
def jsonable(value: Any) -> Any:
    """Driver values -> JSON-friendly ones: Decimal -> int/float, datetimes -> ISO text, UUID -> text,
    bytes -> UTF-8 text (or ``\\x``-hex), ObjectId -> text; dicts and lists recursively."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, decimal.Decimal):
        if not value.is_finite():
            return str(value)
        exp = value.as_tuple().exponent  # an int for a finite Decimal (the letters stand for NaN/Infinity)
        if value == value.to_integral_value() and isinstance(exp, int) and exp >= 0:
            return int(value)
        return float(value)
    if isinstance(value, (_dt.datetime, _dt.date, _dt.time)):
        return value.isoformat()
    if isinstance(value, _dt.timedelta):
        return value.total_seconds()
    if isinstance(
        value,
        (
            uuid.UUID,
            ipaddress.IPv4Address,
            ipaddress.IPv6Address,
            ipaddress.IPv4Network,
            ipaddress.IPv6Network,
            ipaddress.IPv4Interface,
            ipaddress.IPv6Interface,
        ),
    ):
        return str(value)
    if isinstance(value, memoryview):
        value = value.tobytes()
    if isinstance(value, (bytes, bytearray)):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            return "\\x" + bytes(value).hex()
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in value]
    return str(value)


def _dedupe(names: Iterable[str]) -> list[str]:
    """Duplicate column names (two ``?column?``) get ``_2``, ``_3`` suffixes so no value is lost."""
    out: list[str] = []
    seen: dict[str, int] = {}
    for n in names:
        if n in seen:
            seen[n] += 1
            out.append(f"{n}_{seen[n]}")
        else:
            seen[n] = 1
            out.append(n)
    return out


# --- placeholder binding --------------------------------------------------------------------------
@dataclass
class BoundStatement:
    """A SQL template with its placeholders turned into driver parameters."""

    text: str
    params: list[Any] | None  # None when the statement has no parameter (``%`` left untouched)
    placeholders: list[str] = field(default_factory=list)


class PlaceholderError(DatabaseError):
    """A placeholder sits where a value cannot be bound (e.g. inside a hex literal)."""


_DOLLAR_TAG = re.compile(r"\$([A-Za-z_\x80-\uffff][A-Za-z0-9_\x80-\uffff]*)?\$")
_WORD = re.compile(r"[A-Za-z_\x80-\uffff][A-Za-z0-9_$\x80-\uffff]*")
_BACKSLASH_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "0": "\0", "b": "\b", "Z": "\x1a", "f": "\f"}


def bind_placeholders(sql: str, resolve: Callable[[str], Any], dialect: str) -> BoundStatement:
    """Turn ``{{name}}`` / ``${VAR:-d}`` in ``sql`` into bound parameters.

    ``resolve`` receives the placeholder text (``"{{admin_email}}"``) and returns its raw value
    (it raises for unknown names). ``dialect`` is ``postgresql``, ``mysql`` or ``sqlite``.

    * A placeholder outside any literal becomes one parameter with the raw value (a list
      expands to ``p1, p2, ...`` for ``IN (...)``; an empty list to ``NULL``).
    * A quoted string literal that contains placeholders becomes ONE parameter: its decoded text
      with each placeholder replaced by the value's text, e.g. ``'%{{q}}%'`` -> ``'%' + q + '%'``.
      Prefixes ``E''`` (PostgreSQL) and ``N''`` go with the literal; dollar-quoted strings too.
    * A quoted identifier (``"..."``; backticks for MySQL/SQLite) with a placeholder is rebuilt as
      a properly quoted identifier (quote characters doubled).
    * Comments are copied verbatim; Jinja such as ``{{ current_username() }}`` is not a
      placeholder and is copied verbatim.
    """
    marker = "?" if dialect == "sqlite" else "%s"
    parts: list[tuple[str, bool]] = []  # (text, is_marker)
    params: list[Any] = []
    names: list[str] = []
    i, n = 0, len(sql)
    buf: list[str] = []

    def emit(text: str) -> None:
        buf.append(text)

    def emit_param(value: Any) -> None:
        if buf:
            parts.append(("".join(buf), False))
            buf.clear()
        parts.append((marker, True))
        params.append(value)

    def substitute(text: str) -> tuple[str, bool]:
        found = False

        def one(m: re.Match) -> str:
            nonlocal found
            found = True
            names.append(m.group(0))
            return to_text(resolve(m.group(0)))

        out = MUSTACHE.sub(one, text)
        out = SHELL.sub(one, out)
        return out, found

    def has_placeholder(text: str) -> bool:
        return bool(MUSTACHE.search(text) or SHELL.search(text))

    while i < n:
        ch = sql[i]
        # comments
        if sql.startswith("--", i) or (dialect == "mysql" and ch == "#"):
            j = sql.find("\n", i)
            j = n if j < 0 else j
            emit(sql[i:j])
            i = j
            continue
        if sql.startswith("/*", i):
            j = sql.find("*/", i + 2)
            j = n if j < 0 else j + 2
            emit(sql[i:j])
            i = j
            continue
        # placeholders outside literals
        if ch == "{" or ch == "$":
            m = MUSTACHE.match(sql, i) or SHELL.match(sql, i)
            if m:
                names.append(m.group(0))
                value = resolve(m.group(0))
                if isinstance(value, (list, tuple)):
                    if not value:
                        emit("NULL")
                    for k, item in enumerate(value):
                        if k:
                            emit(", ")
                        emit_param(_param_value(item))
                else:
                    emit_param(_param_value(value))
                i = m.end()
                continue
        if ch == "$" and dialect == "postgresql":
            m = _DOLLAR_TAG.match(sql, i)
            if m and not (i > 0 and (sql[i - 1].isalnum() or sql[i - 1] in "_$")):
                tag = m.group(0)
                end = sql.find(tag, m.end())
                if end < 0:
                    emit(sql[i:])
                    break
                body = sql[m.end() : end]
                if has_placeholder(body):
                    value, _ = substitute(body)
                    emit_param(value)
                else:
                    emit(sql[i : end + len(tag)])
                i = end + len(tag)
                continue
        # words: keywords/identifiers, and literal prefixes E'..' N'..' X'..' B'..'
        wm = _WORD.match(sql, i)
        if wm:
            word = wm.group(0)
            j = wm.end()
            if j < n and sql[j] == "'" and word.upper() in ("E", "N", "X", "B"):
                end, decoded = _scan_quoted(sql, j, "'", backslash=(word.upper() == "E" or dialect == "mysql"))
                raw = sql[i:end]
                if has_placeholder(decoded):
                    if word.upper() in ("X", "B"):
                        raise PlaceholderError(
                            f"placeholder inside a {word.upper()}'' literal cannot be bound: {raw[:60]}"
                        )
                    value, _ = substitute(decoded)
                    emit_param(value)
                else:
                    emit(raw)
                i = end
                continue
            if word.upper() == "U" and sql.startswith("&'", j):
                end, decoded = _scan_quoted(sql, j + 1, "'", backslash=False)
                if has_placeholder(decoded):
                    raise PlaceholderError(f"placeholder inside a U&'' literal cannot be bound: {sql[i:end][:60]}")
                emit(sql[i:end])
                i = end
                continue
            emit(word)
            i = j
            continue
        if ch == "'" or (ch == '"' and dialect == "mysql"):
            end, decoded = _scan_quoted(sql, i, ch, backslash=(dialect == "mysql"))
            if has_placeholder(decoded):
                value, _ = substitute(decoded)
                emit_param(value)
            else:
                emit(sql[i:end])
            i = end
            continue
        if ch == '"' or (ch == "`" and dialect in ("mysql", "sqlite")):
            end, decoded = _scan_quoted(sql, i, ch, backslash=False)
            if has_placeholder(decoded):
                value, _ = substitute(decoded)
                emit(quote_ident(value, dialect if ch == '"' else "mysql"))
            else:
                emit(sql[i:end])
            i = end
            continue
        emit(ch)
        i += 1
    if buf:
        parts.append(("".join(buf), False))
    if not params:
        return BoundStatement("".join(t for t, _ in parts), None, names)
    if marker == "%s":
        text = "".join(t if is_marker else t.replace("%", "%%") for t, is_marker in parts)
    else:
        text = "".join(t for t, _ in parts)
    return BoundStatement(text, params, names)


def _param_value(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str, decimal.Decimal)):
        return value
    return to_text(value)  # dicts and lists as JSON text


def _scan_quoted(sql: str, start: int, quote: str, *, backslash: bool) -> tuple[int, str]:
    """Scan a quoted token starting at ``start`` (the quote). Returns (index after it, decoded text).

    A doubled quote stands for one quote; with ``backslash`` (MySQL strings, PostgreSQL E'')
    backslash escapes are decoded too. An unterminated token runs to the end of the text.
    """
    i = start + 1
    n = len(sql)
    out: list[str] = []
    while i < n:
        c = sql[i]
        if backslash and c == "\\" and i + 1 < n:
            nxt = sql[i + 1]
            out.append(_BACKSLASH_ESCAPES.get(nxt, nxt))
            i += 2
            continue
        if c == quote:
            if i + 1 < n and sql[i + 1] == quote:
                out.append(quote)
                i += 2
                continue
            return i + 1, "".join(out)
        out.append(c)
        i += 1
    return n, "".join(out)


def quote_ident(name: str, dialect: str = "postgresql") -> str:
    """A properly quoted identifier: ``"a""b"`` (PostgreSQL, SQLite) or ```a``b``` (MySQL)."""
    if "\x00" in name:
        raise PlaceholderError("identifier contains a NUL character")
    if dialect == "mysql":
        return "`" + name.replace("`", "``") + "`"
    return '"' + name.replace('"', '""') + '"'


# --- names ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class NamePart:
    text: str
    quoted: bool

    def matches(self, actual: str) -> bool:
        return self.text == actual

    def matches_loosely(self, actual: str) -> bool:
        return self.text == actual or (not self.quoted and self.text.casefold() == actual.casefold())


def split_name(name: str) -> list[NamePart]:
    """``core."apiKey"`` -> [core, apiKey(quoted)]. Quotes: ``"``, backticks, ``[...]``."""
    parts: list[NamePart] = []
    i, n = 0, len(name.strip())
    name = name.strip()
    cur: list[str] = []
    quoted = False
    while i < n:
        c = name[i]
        if c in '"`[':
            close = "]" if c == "[" else c
            j = i + 1
            text: list[str] = []
            while j < n:
                if name[j] == close:
                    if close != "]" and j + 1 < n and name[j + 1] == close:
                        text.append(close)
                        j += 2
                        continue
                    break
                text.append(name[j])
                j += 1
            cur.append("".join(text))
            quoted = True
            i = j + 1
            continue
        if c == ".":
            parts.append(NamePart("".join(cur).strip() if not quoted else "".join(cur), quoted))
            cur, quoted = [], False
            i += 1
            continue
        cur.append(c)
        i += 1
    parts.append(NamePart("".join(cur).strip() if not quoted else "".join(cur), quoted))
    return [p for p in parts if p.text or p.quoted]


def unquote_name(name: str) -> NamePart:
    """A single (column) name: ``"firstName"`` -> NamePart("firstName", quoted=True)."""
    parts = split_name(name)
    if len(parts) == 1:
        return parts[0]
    if not parts:
        return NamePart("", False)
    return parts[-1]  # "t.col" -> col


def _pick(candidates: list[Any], part: NamePart, key: Callable[[Any], str]) -> list[Any]:
    exact = [c for c in candidates if part.matches(key(c))]
    if exact:
        return exact
    return [c for c in candidates if part.matches_loosely(key(c))]


# --- the interface --------------------------------------------------------------------------------
class Database(ABC):
    """One connection to the app's database for the whole run."""

    engine: str = ""
    dialect: str = ""  # placeholder/quoting dialect: postgresql, mysql, sqlite, mongodb

    def __init__(self, dsn: str, options: DbOptions):
        self.dsn = dsn
        self.options = options

    # --- statements
    @abstractmethod
    def query(self, sql: Any, params: list[Any] | None = None, *, timeout_s: float | None = None) -> QueryResult:
        """Run one statement (autocommit). Raises :class:`DatabaseError` with the driver's message."""

    def run_template(
        self, template: Any, resolve: Callable[[str], Any], *, timeout_s: float | None = None
    ) -> tuple[QueryResult, BoundStatement]:
        """Bind the placeholders of a DAG's SQL template, then run it."""
        bound = self.bind(template, resolve)
        return self.query(bound.text, bound.params, timeout_s=timeout_s), bound

    def bind(self, template: Any, resolve: Callable[[str], Any]) -> BoundStatement:
        if not isinstance(template, str):
            raise DatabaseError(f"{self.engine} expects SQL text, got {type(template).__name__}")
        return bind_placeholders(template, resolve, self.dialect)

    def _timeout(self, timeout_s: float | None) -> float:
        """The statement timeout of one query: ``timeout_s`` when given (callers bound it by the
        node deadline), else the connection's ``statement_timeout``."""
        t = timeout_s if timeout_s is not None and timeout_s > 0 else self.options.statement_timeout_s
        return max(0.05, t)

    # --- introspection
    @abstractmethod
    def tables(self) -> list[TableRef]:
        """Every user table, view and materialized view (system schemas left out)."""

    @abstractmethod
    def _columns(self, table: TableRef) -> list[Column]: ...

    @abstractmethod
    def _indexes(self, table: TableRef) -> list[Index]: ...

    def find_table(self, name: str, catalog: list[TableRef] | None = None) -> tuple[TableRef | None, str]:
        """Resolve a (possibly schema-qualified, quoted) table name. Returns (table or None, hint).

        ``catalog`` is a :meth:`tables` list to reuse when resolving many names.
        """
        parts = split_name(name)
        if not parts:
            return None, "empty table name"
        all_tables = self.tables() if catalog is None else catalog
        table_part = parts[-1]
        if len(parts) >= 2:
            schema_part = parts[-2]
            in_schema = _pick(all_tables, schema_part, lambda t: t.schema or "")
            found = _pick(in_schema, table_part, lambda t: t.name)
            if found:
                return found[0], (
                    ""
                    if table_part.matches(found[0].name) and schema_part.matches(found[0].schema or "")
                    else f"matched {found[0]} case-insensitively"
                )
            elsewhere = _pick(all_tables, table_part, lambda t: t.name)
            return None, (f"a table of that name exists as {', '.join(map(str, elsewhere[:3]))}" if elsewhere else "")
        visible = [t for t in all_tables if t.visible]
        found = _pick(visible, table_part, lambda t: t.name)
        if found:
            return found[0], ("" if table_part.matches(found[0].name) else f"matched {found[0]} case-insensitively")
        elsewhere = _pick(all_tables, table_part, lambda t: t.name)
        if elsewhere:
            return (
                None,
                f"exists as {', '.join(map(str, elsewhere[:3]))}, which is not on the search path; qualify the name",
            )
        return None, ""

    def table_exists(self, name: str) -> bool:
        return self.find_table(name)[0] is not None

    def resolve_table(self, name: str) -> TableRef:
        found, hint = self.find_table(name)
        if found is None:
            raise TableNotFound(name, hint)
        return found

    def columns(self, table: str) -> list[Column]:
        """Columns of a table (name, type, nullable). Raises :class:`TableNotFound`."""
        return self._columns(self.resolve_table(table))

    def indexes(self, table: str | None = None) -> list[Index]:
        """Indexes of a table, or of every visible table when ``table`` is None."""
        if table is not None:
            return self._indexes(self.resolve_table(table))
        out: list[Index] = []
        for t in self.tables():
            if t.visible and t.kind in ("table", "partitioned table", "materialized view", "collection"):
                out.extend(self._indexes(t))
        return out

    @abstractmethod
    def close(self) -> None: ...

    def describe(self) -> str:
        return f"{self.engine} {redact_dsn(self.dsn)}"


# --- DSN handling ---------------------------------------------------------------------------------
def redact_dsn(dsn: str) -> str:
    """The DSN without its password (for messages and reports)."""
    try:
        parts = urlsplit(dsn)
    except ValueError:
        return "<unparseable DSN>"
    if parts.password is None:
        return dsn
    netloc = parts.netloc.replace(":" + parts.password + "@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def _seconds(text: str) -> float:
    t = text.strip().lower()
    for unit, factor in (("ms", 0.001), ("min", 60.0), ("s", 1.0)):
        if t.endswith(unit):
            return float(t[: -len(unit)]) * factor
    return float(t)


def _split_options(dsn: str, options: DbOptions) -> tuple[str, DbOptions]:
    """Remove saasbench's own query options from the DSN and apply them to ``options``."""
    opts = DbOptions(**vars(options))
    base, sep, query = dsn.partition("?")
    if not sep:
        return dsn, opts
    kept = []
    for key, value in parse_qsl(query, keep_blank_values=True):
        if key == "statement_timeout":
            opts.statement_timeout_s = _seconds(value)
        elif key == "connect_timeout":
            opts.connect_timeout_s = _seconds(value)
        elif key == "busy_timeout":
            opts.busy_timeout_s = _seconds(value)
        else:
            kept.append((key, value))
    return (base + "?" + urlencode(kept)) if kept else base, opts


def engine_of(dsn: str) -> str:
    scheme = dsn.split(":", 1)[0].lower().split("+", 1)[0]
    return {
        "postgresql": "postgresql",
        "postgres": "postgresql",
        "pgsql": "postgresql",
        "mysql": "mysql",
        "mariadb": "mysql",
        "sqlite": "sqlite",
        "sqlite3": "sqlite",
        "mongodb": "mongodb",
    }.get(scheme, scheme)


def open_database(dsn: str, options: DbOptions | None = None) -> Database:
    """A (not yet connected) :class:`Database` for ``dsn``. Unknown schemes raise DatabaseError."""
    options = options or DbOptions()
    engine = engine_of(dsn)
    try:
        clean, opts = _split_options(dsn, options)
    except ValueError as exc:
        raise DatabaseError(f"invalid database DSN option: {exc}") from None
    if engine == "postgresql":
        return PostgresDatabase(clean, opts)
    if engine == "mysql":
        return MySqlDatabase(clean, opts)
    if engine == "sqlite":
        return SqliteDatabase(clean, opts)
    if engine == "mongodb":
        return MongoDatabase(clean, opts)
    raise DatabaseError(
        f"unsupported database DSN scheme {dsn.split(':', 1)[0]!r}: use postgresql://, mysql://, mariadb://, sqlite:/// or mongodb://"
    )


def get_database(ctx: "RunContext") -> Database:
    """The run's Database, opened on first use and closed when the run ends.

    Cached in ``ctx.resources["db"]`` and closed through ``ctx.add_closer``; on an older context
    without those, the attribute is created and ``ctx.close`` is wrapped instead.
    Raises :class:`NoDatabase` when the run has no DSN.
    """
    resources = getattr(ctx, "resources", None)
    if resources is None:
        resources = {}
        ctx.resources = resources
    db = resources.get("db")
    if db is not None:
        return db
    dsn = getattr(ctx.target, "db_dsn", None)
    if not dsn:
        raise NoDatabase(NO_DSN_MESSAGE)
    options = DbOptions()
    run_opts = getattr(ctx, "options", None)
    for attr, name in (
        ("db_statement_timeout_s", "statement_timeout_s"),
        ("db_connect_timeout_s", "connect_timeout_s"),
    ):
        value = getattr(run_opts, attr, None)
        if isinstance(value, (int, float)) and value > 0:
            setattr(options, name, float(value))
    db = open_database(dsn, options)
    resources["db"] = db
    add_closer = getattr(ctx, "add_closer", None)
    if callable(add_closer):
        add_closer(db.close)
    else:  # backwards compatible: wrap close()
        original = ctx.close

        def close_with_db() -> None:
            try:
                db.close()
            finally:
                resources.pop("db", None)
                original()

        ctx.close = close_with_db  # type: ignore[method-assign]
    return db


# --- PostgreSQL -----------------------------------------------------------------------------------
class PostgresDatabase(Database):
    engine = "postgresql"
    dialect = "postgresql"

    def __init__(self, dsn: str, options: DbOptions):
        super().__init__(
            dsn.replace("postgresql+psycopg://", "postgresql://", 1).replace(
                "postgresql+psycopg2://", "postgresql://", 1
            ),
            options,
        )
        self._conn: Any = None
        self._timeout_ms: int | None = None

    def _connection(self) -> Any:
        try:
            import psycopg
        except ImportError as exc:  # pragma: no cover - dependency missing
            raise DatabaseError("PostgreSQL support needs psycopg: pip install 'psycopg[binary]'") from exc
        if self._conn is not None and (self._conn.closed or self._conn.broken):
            self._conn = None
        if self._conn is None:
            try:
                self._conn = psycopg.connect(
                    self.dsn,
                    autocommit=True,
                    connect_timeout=max(1, math.ceil(self.options.connect_timeout_s)),
                    application_name="saasbench",
                )
            except psycopg.Error as exc:
                raise DatabaseError(f"cannot connect to {redact_dsn(self.dsn)}: {_first_lines(exc)}") from None
            self._timeout_ms = None
        return self._conn

    def _set_timeout(self, conn: Any, seconds: float) -> None:
        ms = max(1, int(seconds * 1000))
        if ms != self._timeout_ms:
            conn.execute(f"SET statement_timeout = {ms:d}")
            self._timeout_ms = ms

    def query(self, sql: Any, params: list[Any] | None = None, *, timeout_s: float | None = None) -> QueryResult:
        import psycopg

        conn = self._connection()
        try:
            self._set_timeout(conn, self._timeout(timeout_s))
            with conn.cursor() as cur:
                try:
                    cur.execute(sql, params, prepare=False)
                except psycopg.Error as exc:
                    if not params or not _needs_client_binding(exc):
                        raise
                    # A statement PostgreSQL cannot parameterise (utility statements, several
                    # statements, untyped parameters): nothing ran; bind client-side instead, as
                    # literals quoted by libpq's escaping (still never raw text).
                    with psycopg.ClientCursor(conn) as ccur:
                        ccur.execute(sql, params)
                        return self._collect(ccur)
                return self._collect(cur)
        except psycopg.Error as exc:
            if isinstance(exc, psycopg.errors.QueryCanceled):
                raise DatabaseError(f"{_first_lines(exc)} (statement timeout {self._timeout(timeout_s):g}s)") from None
            raise DatabaseError(_first_lines(exc)) from None

    @staticmethod
    def _collect(cur: Any) -> QueryResult:
        # several statements in one text: keep the last result set (psql shows them all)
        results = []
        while True:
            if cur.description is not None:
                cols = _dedupe(d.name for d in cur.description)
                raw = cur.fetchmany(MAX_ROWS + 1)
                rows = [dict(zip(cols, map(jsonable, r))) for r in raw[:MAX_ROWS]]
                results.append(QueryResult(cols, rows, cur.rowcount, True, len(raw) > MAX_ROWS))
            else:
                results.append(QueryResult([], [], cur.rowcount, False))
            if not cur.nextset():
                break
        with_rows = [r for r in results if r.is_select]
        return with_rows[-1] if with_rows else results[-1]

    def tables(self) -> list[TableRef]:
        kinds = {"r": "table", "p": "partitioned table", "v": "view", "m": "materialized view", "f": "foreign table"}
        res = self.query(
            "SELECT n.nspname AS schema, c.relname AS name, c.relkind::text AS kind, "
            "n.nspname = ANY (current_schemas(false)) AS visible "
            "FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.relkind IN ('r', 'p', 'v', 'm', 'f') AND n.nspname NOT IN ('pg_catalog', 'information_schema') "
            "AND n.nspname NOT LIKE 'pg\\_toast%' AND n.nspname NOT LIKE 'pg\\_temp\\_%' ORDER BY 1, 2"
        )
        return [TableRef(r["schema"], r["name"], kinds.get(r["kind"], r["kind"]), bool(r["visible"])) for r in res.rows]

    def _columns(self, table: TableRef) -> list[Column]:
        res = self.query(
            "SELECT a.attname AS name, pg_catalog.format_type(a.atttypid, a.atttypmod) AS type, t.typname AS udt, "
            "t.typtype::text AS typtype, NOT a.attnotnull AS nullable "
            "FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_class c ON c.oid = a.attrelid "
            "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace JOIN pg_catalog.pg_type t ON t.oid = a.atttypid "
            "WHERE n.nspname = %s AND c.relname = %s AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
            [table.schema, table.name],
        )
        out = []
        for r in res.rows:
            base = re.sub(r"\(.*?\)", "", r["type"]).strip()
            names = [base, r["udt"]]
            if r["typtype"] == "e":
                names += ["enum", "USER-DEFINED"]
            out.append(Column(r["name"], r["type"], bool(r["nullable"]), tuple(names)))
        return out

    def _indexes(self, table: TableRef) -> list[Index]:
        res = self.query(
            "SELECT i.relname AS name, pg_catalog.pg_get_indexdef(ix.indexrelid) AS definition, "
            "ix.indisunique AS is_unique, ix.indisprimary AS is_primary, "
            "ARRAY(SELECT a.attname FROM unnest(ix.indkey::int2[]) WITH ORDINALITY AS k(attnum, ord) "
            "      JOIN pg_catalog.pg_attribute a ON a.attrelid = ix.indrelid AND a.attnum = k.attnum ORDER BY k.ord) AS columns "
            "FROM pg_catalog.pg_index ix JOIN pg_catalog.pg_class i ON i.oid = ix.indexrelid "
            "JOIN pg_catalog.pg_class c ON c.oid = ix.indrelid JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relname = %s ORDER BY i.relname",
            [table.schema, table.name],
        )
        return [
            Index(
                r["name"],
                list(r["columns"] or []),
                r["definition"],
                bool(r["is_unique"]),
                bool(r["is_primary"]),
                str(table),
            )
            for r in res.rows
        ]

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None


def _needs_client_binding(exc: BaseException) -> bool:
    import psycopg

    if isinstance(
        exc,
        (psycopg.errors.IndeterminateDatatype, psycopg.errors.AmbiguousParameter, psycopg.errors.UndefinedParameter),
    ):
        return True
    text = str(exc)
    return isinstance(exc, psycopg.errors.SyntaxError) and (
        "cannot insert multiple commands" in text or re.search(r'at or near "\$\d+"', text) is not None
    )


def _first_lines(exc: BaseException, limit: int = 3) -> str:
    text = str(exc).strip() or type(exc).__name__
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return " | ".join(lines[:limit])


# --- MySQL / MariaDB ------------------------------------------------------------------------------
class MySqlDatabase(Database):
    engine = "mysql"
    dialect = "mysql"

    def __init__(self, dsn: str, options: DbOptions):
        super().__init__(dsn, options)
        self._conn: Any = None
        self._mariadb = False
        self._current_timeout: float | None = None
        parts = urlsplit(dsn)
        if not parts.path.strip("/"):
            self.database = None
        else:
            self.database = unquote(parts.path.strip("/"))

    def _connection(self) -> Any:
        try:
            import pymysql
        except ImportError as exc:  # pragma: no cover
            raise DatabaseError("MySQL/MariaDB support needs PyMySQL: pip install PyMySQL") from exc
        if self._conn is not None and not self._conn.open:
            self._conn = None
        if self._conn is None:
            parts = urlsplit(self.dsn)
            query = dict(parse_qsl(parts.query))
            kwargs: dict[str, Any] = dict(
                host=parts.hostname or "127.0.0.1",
                port=parts.port or 3306,
                user=unquote(parts.username or "root"),
                password=unquote(parts.password or ""),
                charset=query.get("charset", "utf8mb4"),
                autocommit=True,
                connect_timeout=max(1, math.ceil(self.options.connect_timeout_s)),
                read_timeout=max(1, math.ceil(self.options.statement_timeout_s + 10)),
                write_timeout=max(1, math.ceil(self.options.statement_timeout_s + 10)),
            )
            if self.database:
                kwargs["database"] = self.database
            if "unix_socket" in query:
                kwargs["unix_socket"] = query["unix_socket"]
            try:
                self._conn = pymysql.connect(**kwargs)
            except pymysql.MySQLError as exc:
                raise DatabaseError(f"cannot connect to {redact_dsn(self.dsn)}: {_mysql_message(exc)}") from None
            self._current_timeout = None
            with self._conn.cursor() as cur:
                cur.execute("SELECT VERSION()")
                self._mariadb = "mariadb" in str(cur.fetchone()[0]).lower()
        return self._conn

    def _set_timeout(self, conn: Any, seconds: float) -> None:
        if seconds == self._current_timeout:
            return
        with conn.cursor() as cur:
            if self._mariadb:
                cur.execute(f"SET SESSION max_statement_time = {seconds:.3f}")
            else:  # MySQL: SELECT statements only
                cur.execute(f"SET SESSION max_execution_time = {max(1, int(seconds * 1000)):d}")
        self._current_timeout = seconds

    def query(self, sql: Any, params: list[Any] | None = None, *, timeout_s: float | None = None) -> QueryResult:
        import pymysql

        conn = self._connection()
        seconds = self._timeout(timeout_s)
        try:
            self._set_timeout(conn, seconds)
            with conn.cursor() as cur:
                cur.execute(sql, params)
                if cur.description is not None:
                    cols = _dedupe(d[0] for d in cur.description)
                    raw = cur.fetchmany(MAX_ROWS + 1)
                    rows = [dict(zip(cols, map(jsonable, r))) for r in raw[:MAX_ROWS]]
                    return QueryResult(cols, rows, cur.rowcount, True, len(raw) > MAX_ROWS)
                return QueryResult([], [], cur.rowcount, False)
        except pymysql.MySQLError as exc:
            message = _mysql_message(exc)
            if "max_statement_time" in message or "max_execution_time" in message:
                message += f" (statement timeout {seconds:g}s)"
            raise DatabaseError(message) from None
        except (ValueError, TypeError) as exc:  # PyMySQL formatting errors (placeholder count)
            raise DatabaseError(f"cannot run statement: {exc}") from None

    def tables(self) -> list[TableRef]:
        kinds = {"BASE TABLE": "table", "VIEW": "view", "SYSTEM VERSIONED": "table", "SEQUENCE": "sequence"}
        res = self.query(
            "SELECT TABLE_SCHEMA AS s, TABLE_NAME AS t, TABLE_TYPE AS k, (TABLE_SCHEMA = DATABASE()) AS visible "
            "FROM information_schema.TABLES WHERE TABLE_SCHEMA NOT IN ('mysql', 'information_schema', 'performance_schema', 'sys') "
            "ORDER BY 1, 2"
        )
        return [TableRef(r["s"], r["t"], kinds.get(r["k"], str(r["k"]).lower()), bool(r["visible"])) for r in res.rows]

    def _columns(self, table: TableRef) -> list[Column]:
        res = self.query(
            "SELECT COLUMN_NAME AS name, COLUMN_TYPE AS ctype, DATA_TYPE AS dtype, IS_NULLABLE AS nullable "
            "FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s ORDER BY ORDINAL_POSITION",
            [table.schema, table.name],
        )
        out = []
        for r in res.rows:
            names = [r["dtype"]]
            if str(r["ctype"]).lower().startswith("tinyint(1)"):
                names.append("boolean")
            out.append(Column(r["name"], r["ctype"], r["nullable"] == "YES", tuple(names)))
        return out

    def _indexes(self, table: TableRef) -> list[Index]:
        res = self.query(
            "SELECT INDEX_NAME AS name, NON_UNIQUE AS non_unique, SEQ_IN_INDEX AS seq, COLUMN_NAME AS col "
            "FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s ORDER BY INDEX_NAME, SEQ_IN_INDEX",
            [table.schema, table.name],
        )
        grouped: dict[str, Index] = {}
        for r in res.rows:
            idx = grouped.get(r["name"])
            if idx is None:
                unique = not int(r["non_unique"])
                idx = grouped[r["name"]] = Index(r["name"], [], "", unique, r["name"] == "PRIMARY", str(table))
            if r["col"]:
                idx.columns.append(r["col"])
        for idx in grouped.values():
            cols = ", ".join(quote_ident(c, "mysql") for c in idx.columns)
            if idx.primary:
                idx.definition = f"PRIMARY KEY ({cols})"
            else:
                idx.definition = f"CREATE {'UNIQUE ' if idx.unique else ''}INDEX {quote_ident(idx.name, 'mysql')} ON {quote_ident(table.name, 'mysql')} ({cols})"
        return list(grouped.values())

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:  # noqa: BLE001 - closing a broken connection must not hide the query's result
                pass
            finally:
                self._conn = None


def _mysql_message(exc: BaseException) -> str:
    args: tuple[Any, ...] = getattr(exc, "args", ())
    if len(args) >= 2 and isinstance(args[0], int):
        return f"({args[0]}) {args[1]}"
    return _first_lines(exc)


# --- SQLite ---------------------------------------------------------------------------------------
class SqliteDatabase(Database):
    """SQLite file database. ``sqlite:///rel/path.db`` is relative to the working directory,
    ``sqlite:////abs/path.db`` absolute (SQLAlchemy's convention); ``sqlite:///:memory:`` for tests."""

    engine = "sqlite"
    dialect = "sqlite"

    def __init__(self, dsn: str, options: DbOptions):
        super().__init__(dsn, options)
        rest = dsn.split(":", 1)[1]
        if rest.startswith("///"):
            path = rest[3:]
        elif rest.startswith("//"):
            path = rest[2:]
        else:
            path = rest
        path = unquote(path.split("?", 1)[0])
        if not path:
            raise DatabaseError("sqlite DSN needs a file path: sqlite:///relative.db or sqlite:////absolute/path.db")
        self.path = path
        self._conn: Any = None
        self._deadline: float | None = None

    def _connection(self) -> Any:
        import sqlite3

        if self._conn is None:
            try:
                if self.path == ":memory:":
                    conn = sqlite3.connect(
                        ":memory:", timeout=self.options.busy_timeout_s, isolation_level=None, check_same_thread=False
                    )
                else:
                    from urllib.parse import quote

                    conn = sqlite3.connect(
                        f"file:{quote(self.path)}?mode=rw",
                        uri=True,
                        timeout=self.options.busy_timeout_s,
                        isolation_level=None,
                        check_same_thread=False,
                    )
            except sqlite3.Error as exc:
                raise DatabaseError(f"cannot open sqlite database {self.path}: {exc}") from None
            conn.set_progress_handler(self._progress, 2000)
            self._conn = conn
        return self._conn

    def _progress(self) -> int:
        return 1 if self._deadline is not None and time.monotonic() > self._deadline else 0

    def query(self, sql: Any, params: list[Any] | None = None, *, timeout_s: float | None = None) -> QueryResult:
        import sqlite3

        conn = self._connection()
        seconds = self._timeout(timeout_s)
        self._deadline = time.monotonic() + seconds
        try:
            cur = conn.execute(sql, params or ())
            if cur.description is not None:
                cols = _dedupe(d[0] for d in cur.description)
                raw = cur.fetchmany(MAX_ROWS + 1)
                truncated = len(raw) > MAX_ROWS
                if truncated:
                    cur.fetchall()
                rows = [dict(zip(cols, map(jsonable, r))) for r in raw[:MAX_ROWS]]
                return QueryResult(cols, rows, len(raw) if cur.rowcount < 0 else cur.rowcount, True, truncated)
            return QueryResult([], [], cur.rowcount, False)
        except sqlite3.Error as exc:
            message = str(exc)
            if message == "interrupted":
                message += f" (statement timeout {seconds:g}s)"
            raise DatabaseError(message) from None
        finally:
            self._deadline = None

    def _schemas(self) -> list[str]:
        return [r["name"] for r in self.query("PRAGMA database_list").rows]

    def tables(self) -> list[TableRef]:
        out: list[TableRef] = []
        for schema in self._schemas():
            master = "sqlite_temp_master" if schema == "temp" else f"{quote_ident(schema, 'sqlite')}.sqlite_master"
            res = self.query(
                f"SELECT name, type FROM {master} WHERE type IN ('table', 'view') AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' ORDER BY name"
            )
            out += [TableRef(schema, r["name"], r["type"], True) for r in res.rows]
        return out

    def _columns(self, table: TableRef) -> list[Column]:
        res = self.query(
            'SELECT name, type, "notnull" AS nn, pk FROM pragma_table_info(?, ?)', [table.name, table.schema or "main"]
        )
        out = []
        for r in res.rows:
            declared = r["type"] or ""
            base = re.sub(r"\(.*?\)", "", declared).strip()
            out.append(Column(r["name"], declared, not r["nn"], (base,)))
        return out

    def _indexes(self, table: TableRef) -> list[Index]:
        schema = table.schema or "main"
        master = "sqlite_temp_master" if schema == "temp" else f"{quote_ident(schema, 'sqlite')}.sqlite_master"
        out = []
        for r in self.query(
            'SELECT name, "unique" AS u, origin FROM pragma_index_list(?, ?)', [table.name, schema]
        ).rows:
            cols = [
                c["name"]
                for c in self.query("SELECT name FROM pragma_index_info(?, ?) ORDER BY seqno", [r["name"], schema]).rows
            ]
            sql_rows = self.query(f"SELECT sql FROM {master} WHERE type = 'index' AND name = ?", [r["name"]]).rows
            definition = (sql_rows[0]["sql"] if sql_rows and sql_rows[0]["sql"] else None) or (
                f"{'PRIMARY KEY' if r['origin'] == 'pk' else 'UNIQUE'} ({', '.join(quote_ident(c, 'sqlite') for c in cols if c)})"
            )
            out.append(
                Index(r["name"], [c for c in cols if c], definition, bool(r["u"]), r["origin"] == "pk", str(table))
            )
        # an INTEGER PRIMARY KEY is the rowid: no index row, but it is indexed
        pk = [
            c
            for c in self.query(
                "SELECT name, type, pk FROM pragma_table_info(?, ?) WHERE pk > 0", [table.name, schema]
            ).rows
        ]
        if len(pk) == 1 and (pk[0]["type"] or "").upper() == "INTEGER" and not any(i.primary for i in out):
            out.append(
                Index(
                    f"{table.name}_rowid_pk",
                    [pk[0]["name"]],
                    f"INTEGER PRIMARY KEY ({quote_ident(pk[0]['name'], 'sqlite')})",
                    True,
                    True,
                    str(table),
                )
            )
        return out

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None


# --- MongoDB --------------------------------------------------------------------------------------
class MongoDatabase(Database):
    """MongoDB through pymongo. The DSN must name the database: ``mongodb://host:port/app``.

    A "statement" is a JSON document (text or dict) naming a collection and one operation::

        {"collection": "users", "find": {"email": "{{admin_email}}"},   # "filter" is an alias of "find"
         "projection": {"email": 1}, "sort": {"created_at": -1}, "limit": 1, "skip": 0}
        {"collection": "users", "count": {"status": "active"}}          # one row {"count": n}
        {"collection": "orders", "aggregate": [{"$match": {...}}, ...]}
        {"collection": "users", "distinct": "status", "filter": {...}}   # rows {"value": v}
        {"collection": "users", "insert": {...} | [{...}, ...]}          # rowcount = inserted
        {"collection": "users", "update": {"filter": {...}, "update": {"$set": {...}}, "many": true}}
        {"collection": "users", "delete": {"filter": {...}, "many": true}}

    Placeholders are resolved inside JSON string values (``"{{x}}"`` alone takes the raw value);
    a bare ``{{x}}`` outside a string is treated as ``"{{x}}"``. Values are data, never parsed as
    JSON, so a captured value cannot add operators. P10 "columns" are the fields of up to 100
    sampled documents; P11 indexes come from ``index_information()``.
    """

    engine = "mongodb"
    dialect = "mongodb"

    def __init__(self, dsn: str, options: DbOptions):
        super().__init__(dsn, options)
        self._client: Any = None
        self._db: Any = None

    def _database(self) -> Any:
        try:
            import pymongo
        except ImportError as exc:  # pragma: no cover
            raise DatabaseError("MongoDB support needs pymongo: pip install pymongo") from exc
        if self._db is None:
            ms = int(self.options.connect_timeout_s * 1000)
            try:
                client: Any = pymongo.MongoClient(
                    self.dsn,
                    serverSelectionTimeoutMS=ms,
                    connectTimeoutMS=ms,
                    socketTimeoutMS=int((self.options.statement_timeout_s + 10) * 1000),
                    appname="saasbench",
                )
                db = client.get_default_database()
            except pymongo.errors.ConfigurationError as exc:
                raise DatabaseError(f"mongodb DSN must name a database (mongodb://host:port/<db>): {exc}") from None
            except pymongo.errors.PyMongoError as exc:
                raise DatabaseError(f"cannot connect to {redact_dsn(self.dsn)}: {exc}") from None
            self._client, self._db = client, db
        return self._db

    def bind(self, template: Any, resolve: Callable[[str], Any]) -> BoundStatement:
        names: list[str] = []
        if isinstance(template, str):
            doc = _parse_mongo_json(template)
        elif isinstance(template, dict):
            doc = template
        else:
            raise DatabaseError('a MongoDB query is a JSON object: {"collection": ..., "find": {...}}')

        def walk(v: Any) -> Any:
            if isinstance(v, str):
                whole = MUSTACHE.fullmatch(v) or SHELL.fullmatch(v)
                if whole:
                    names.append(v)
                    value = resolve(v)
                    if _has_operator_keys(value):
                        raise PlaceholderError(
                            f"the value of {v} holds MongoDB operators ($-keys); refusing to use it in a query"
                        )
                    return value

                def one(m: re.Match) -> str:
                    names.append(m.group(0))
                    return to_text(resolve(m.group(0)))

                return SHELL.sub(one, MUSTACHE.sub(one, v))
            if isinstance(v, dict):
                return {k: walk(x) for k, x in v.items()}
            if isinstance(v, list):
                return [walk(x) for x in v]
            return v

        return BoundStatement(json.dumps(walk(doc), default=str), None, names)

    def query(self, sql: Any, params: list[Any] | None = None, *, timeout_s: float | None = None) -> QueryResult:
        import pymongo

        doc = _parse_mongo_json(sql) if isinstance(sql, str) else sql
        if not isinstance(doc, dict) or not isinstance(doc.get("collection"), str):
            raise DatabaseError('a MongoDB query is a JSON object with a "collection" name')
        db = self._database()
        coll = db[doc["collection"]]
        max_ms = int(self._timeout(timeout_s) * 1000)
        try:
            if "count" in doc:
                n = coll.count_documents(doc.get("count") or {}, maxTimeMS=max_ms)
                return QueryResult(["count"], [{"count": n}], 1, True)
            if "aggregate" in doc:
                docs = list(coll.aggregate(doc["aggregate"] or [], maxTimeMS=max_ms))
                return _mongo_rows(docs)
            if "distinct" in doc:
                values = coll.distinct(doc["distinct"], doc.get("filter") or {}, maxTimeMS=max_ms)
                return QueryResult(["value"], [{"value": jsonable(v)} for v in values[:MAX_ROWS]], len(values), True)
            if "insert" in doc:
                items = doc["insert"] if isinstance(doc["insert"], list) else [doc["insert"]]
                res = coll.insert_many(items)
                return QueryResult([], [], len(res.inserted_ids), False)
            if "update" in doc:
                spec = doc["update"] or {}
                fn = coll.update_many if spec.get("many", True) else coll.update_one
                res = fn(spec.get("filter") or {}, spec.get("update") or {})
                return QueryResult([], [], res.modified_count, False)
            if "delete" in doc:
                spec = doc["delete"] or {}
                fn = coll.delete_many if spec.get("many", True) else coll.delete_one
                res = fn(spec.get("filter") or {})
                return QueryResult([], [], res.deleted_count, False)
            flt = doc.get("find", doc.get("filter")) or {}
            cursor = coll.find(flt, doc.get("projection"), max_time_ms=max_ms)
            sort = doc.get("sort")
            if isinstance(sort, dict):
                cursor = cursor.sort(list(sort.items()))
            elif isinstance(sort, list) and sort:
                cursor = cursor.sort([tuple(s) for s in sort])
            if doc.get("skip"):
                cursor = cursor.skip(int(doc["skip"]))
            cursor = cursor.limit(min(int(doc.get("limit") or 0) or MAX_ROWS + 1, MAX_ROWS + 1))
            return _mongo_rows(list(cursor))
        except pymongo.errors.PyMongoError as exc:
            raise DatabaseError(_first_lines(exc)) from None
        except (TypeError, ValueError) as exc:
            raise DatabaseError(f"invalid MongoDB query: {exc}") from None

    def tables(self) -> list[TableRef]:
        import pymongo

        try:
            names = self._database().list_collection_names()
        except pymongo.errors.PyMongoError as exc:
            raise DatabaseError(_first_lines(exc)) from None
        return [TableRef(None, n, "collection", True) for n in sorted(names) if not n.startswith("system.")]

    def _columns(self, table: TableRef) -> list[Column]:
        import pymongo

        seen: dict[str, Column] = {}
        try:
            for d in self._database()[table.name].find({}, limit=100):
                for k, v in d.items():
                    if k not in seen:
                        seen[k] = Column(k, _bson_type(v), True, (type(v).__name__,))
        except pymongo.errors.PyMongoError as exc:
            raise DatabaseError(_first_lines(exc)) from None
        return list(seen.values())

    def _indexes(self, table: TableRef) -> list[Index]:
        import pymongo

        try:
            info = self._database()[table.name].index_information()
        except pymongo.errors.PyMongoError as exc:
            raise DatabaseError(_first_lines(exc)) from None
        return [
            Index(
                name,
                [k for k, _ in spec.get("key", [])],
                json.dumps(jsonable(spec), sort_keys=True),
                bool(spec.get("unique")) or name == "_id_",
                name == "_id_",
                table.name,
            )
            for name, spec in info.items()
        ]

    def close(self) -> None:
        if self._client is not None:
            try:
                self._client.close()
            finally:
                self._client, self._db = None, None


def _has_operator_keys(value: Any) -> bool:
    """A captured object such as ``{"$ne": null}`` would turn a filter value into an operator."""
    if isinstance(value, dict):
        return any(str(k).startswith("$") or _has_operator_keys(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_operator_keys(v) for v in value)
    return False


def _bson_type(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int" if -(2**31) <= value < 2**31 else "long"
    if isinstance(value, float):
        return "double"
    if isinstance(value, str):
        return "string"
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    if isinstance(value, _dt.datetime):
        return "date"
    if value is None:
        return "null"
    name = type(value).__name__
    return {"ObjectId": "objectId", "Decimal128": "decimal", "Binary": "binData", "bytes": "binData"}.get(name, name)


_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)


def _parse_mongo_json(text: str) -> Any:
    """Parse a JSON query, quoting bare ``{{x}}`` / ``${X}`` placeholders outside strings first."""
    out, pos = [], 0
    for m in _JSON_STRING.finditer(text):
        out.append(_quote_bare(text[pos : m.start()]))
        out.append(m.group(0))
        pos = m.end()
    out.append(_quote_bare(text[pos:]))
    try:
        return json.loads("".join(out))
    except json.JSONDecodeError as exc:
        raise DatabaseError(f"a MongoDB query must be a JSON object: {exc}") from None


def _quote_bare(chunk: str) -> str:
    chunk = MUSTACHE.sub(lambda m: json.dumps(m.group(0)), chunk)
    return SHELL.sub(lambda m: json.dumps(m.group(0)), chunk)


def _mongo_rows(docs: list[dict]) -> QueryResult:
    cols: list[str] = []
    for d in docs[:MAX_ROWS]:
        for k in d:
            if k not in cols:
                cols.append(k)
    rows = [{k: jsonable(v) for k, v in d.items()} for d in docs[:MAX_ROWS]]
    return QueryResult(cols, rows, len(docs), True, len(docs) > MAX_ROWS)
