"""DB primitives P08-P11 against real databases: PostgreSQL (a cluster started for the session),
SQLite (files), MariaDB (mariadbd started for the session) and the nx-27017 MongoDB emulator.

Steps run through the engine's step runner, so the raw-field rule (the engine does not resolve
placeholders in P08's SQL and expectations) is exercised as in a real run.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import saasbench.primitives.db  # noqa: F401  (registers P08-P11)
from saasbench.dag import Dag, DagLoadError, load_dag_data
from saasbench.evaluation.context import RunContext, RunOptions, Target
from saasbench.evaluation.engine import Engine
from saasbench.evaluation.results import Status, StepResult
from saasbench.primitives.registry import REGISTRY
from saasbench.services.db import (
    NO_DSN_MESSAGE,
    DatabaseError,
    PostgresDatabase,
    bind_placeholders,
    get_database,
    open_database,
    split_name,
)

EVIL = "x'); DROP TABLE users; --"
VARS = {
    "admin_email": "admin@example.com",
    "admin_username": "admin",
    "evil": EVIL,
    "list_id": 7,
    "list_id_text": "7",
    "ids": [1, 2],
}

PG_SCHEMA = """
DROP SCHEMA IF EXISTS core CASCADE;
DROP TABLE IF EXISTS users, settings, lists, subscriber_lists, events, prices, jobs CASCADE;
DROP MATERIALIZED VIEW IF EXISTS mat_counts;
CREATE SCHEMA core;
CREATE TABLE users (
    id serial PRIMARY KEY, email text NOT NULL, username text, enabled boolean NOT NULL DEFAULT true,
    status text, security_stamp text, deleted_at timestamptz, created_at timestamptz NOT NULL DEFAULT now());
CREATE INDEX ix_users_email ON users (email);
CREATE UNIQUE INDEX uq_users_username ON users (username);
CREATE INDEX ix_users_lower_email ON users (lower(email));
INSERT INTO users (email, username, enabled, status, security_stamp) VALUES
    ('admin@example.com', 'admin', true, 'enabled', 'stamp-1'),
    ('b@example.com', 'bee', false, 'blocklisted', NULL);
CREATE TABLE settings (key text PRIMARY KEY, value jsonb NOT NULL);
INSERT INTO settings VALUES ('app.concurrency', '10'), ('app.site_name', '"Site"'), ('app.smtp', '{"host": "mx", "port": 25}');
CREATE TABLE lists (id integer PRIMARY KEY, name text);
INSERT INTO lists VALUES (7, 'seven'), (8, 'eight');
CREATE TABLE subscriber_lists (list_id integer, subscriber_id integer, status text);
CREATE TABLE events (id serial PRIMARY KEY, properties jsonb);
INSERT INTO events (properties) VALUES ('{"region": "us-east", "n": 3}');
CREATE TABLE prices (code text, rate numeric(5,2), ratio double precision);
INSERT INTO prices VALUES ('vat', 20.00, 0.1);
CREATE TABLE jobs (id serial PRIMARY KEY, name text, state text);
CREATE MATERIALIZED VIEW mat_counts AS SELECT count(*) AS n FROM users;
CREATE TABLE core."user" (id uuid PRIMARY KEY, email text NOT NULL, "firstName" varchar(100), "lastName" text, "createdAt" timestamptz);
CREATE TABLE core."apiKey" (id uuid PRIMARY KEY, "workspaceId" uuid NOT NULL, name text NOT NULL, "expiresAt" timestamptz);
CREATE UNIQUE INDEX "IDX_apiKey_ws_name" ON core."apiKey" ("workspaceId", name);
CREATE TABLE core.workspace (id uuid PRIMARY KEY, "displayName" text);
CREATE TYPE subscriber_status AS ENUM ('enabled', 'disabled', 'blocklisted');
"""


# --- helpers --------------------------------------------------------------------------------------
def step(ctx: RunContext, code: str, inputs: dict[str, Any]) -> StepResult:
    """Run one step as the engine does (raw fields untouched, other inputs resolved, validated)."""
    return Engine(Dag(nodes=[]), ctx)._run_step(code, inputs)


def make_ctx(dsn: str | None, **options: Any) -> RunContext:
    return RunContext(Target(db_dsn=dsn), options=RunOptions(**options), variables=dict(VARS))


def admin(sql: str, dsn: str) -> None:
    db = open_database(dsn)
    try:
        db.query(sql)
    finally:
        db.close()


@pytest.fixture(scope="module")
def pg(postgres_server: str) -> str:
    db = open_database(postgres_server)
    try:
        db.query("DROP TYPE IF EXISTS subscriber_status CASCADE")
        db.query(PG_SCHEMA)
    finally:
        db.close()
    return postgres_server


@pytest.fixture
def pg_ctx(pg: str) -> Iterator[RunContext]:
    ctx = make_ctx(pg)
    yield ctx
    ctx.close()


@pytest.fixture
def sqlite_dsn(tmp_path) -> str:
    path = tmp_path / "app.db"
    conn = sqlite3.connect(path)
    conn.executescript("""
        CREATE TABLE users (id INTEGER PRIMARY KEY, email TEXT NOT NULL, username VARCHAR(50), enabled BOOLEAN NOT NULL DEFAULT 1,
                            security_stamp TEXT, created_at TIMESTAMP);
        CREATE UNIQUE INDEX uq_users_email ON users (email);
        CREATE INDEX ix_users_username_enabled ON users (username, enabled);
        INSERT INTO users (email, username, enabled, security_stamp) VALUES ('admin@example.com', 'admin', 1, 's1'), ('b@example.com', 'bee', 0, NULL);
        CREATE TABLE orders (id INTEGER PRIMARY KEY, user_id INTEGER REFERENCES users(id), total NUMERIC(10,2));
        INSERT INTO orders (user_id, total) VALUES (1, 12.5), (1, 7.5);
    """)
    conn.close()
    return f"sqlite:///{path}"  # absolute: sqlite:////tmp/...


@pytest.fixture
def sqlite_ctx(sqlite_dsn: str) -> Iterator[RunContext]:
    ctx = make_ctx(sqlite_dsn)
    yield ctx
    ctx.close()


# --- registration ---------------------------------------------------------------------------------
def test_p08_to_p11_are_registered_with_raw_fields() -> None:
    for code in ("P08", "P09", "P10", "P11"):
        spec = REGISTRY.spec(code)
        assert spec is not None and spec.fn is not None, code
    assert {"sql", "expected_result", "expected", "assertions"} <= REGISTRY.spec("P08").raw_fields


# --- placeholder binding (no database) ------------------------------------------------------------
def resolver(values: dict[str, Any]):
    def resolve(text: str) -> Any:
        return values[text.strip("{}$").split(":-")[0]]

    return resolve


def test_bind_quoted_literal_becomes_one_parameter() -> None:
    b = bind_placeholders(
        "SELECT * FROM users WHERE email='{{admin_email}}' AND 1=1", resolver({"admin_email": EVIL}), "postgresql"
    )
    assert b.text == "SELECT * FROM users WHERE email=%s AND 1=1"
    assert b.params == [EVIL]
    b = bind_placeholders(
        "SELECT * FROM users WHERE email='{{admin_email}}'", resolver({"admin_email": EVIL}), "sqlite"
    )
    assert b.text == "SELECT * FROM users WHERE email=?" and b.params == [EVIL]


def test_bind_like_pattern_percent_and_concatenation() -> None:
    b = bind_placeholders(
        "SELECT 1 FROM t WHERE a LIKE '%{{q}}%' AND b LIKE 'ab_%' AND c = 'x''y-{{q}}'",
        resolver({"q": "o'k"}),
        "postgresql",
    )
    assert b.text == "SELECT 1 FROM t WHERE a LIKE %s AND b LIKE 'ab_%%' AND c = %s"
    assert b.params == ["%o'k%", "x'y-o'k"]


def test_bind_without_placeholders_leaves_text_alone() -> None:
    sql = "SELECT COUNT(*) FROM information_schema.tables WHERE table_name LIKE 'ab_%'"
    b = bind_placeholders(sql, resolver({}), "postgresql")
    assert b.text == sql and b.params is None


def test_bind_bare_values_lists_comments_jinja_identifiers() -> None:
    values = {"list_id": 7, "ids": [1, 2, 3], "none": [], "col": 'we"ird', "v": "z"}
    sql = (
        "SELECT {{list_id}} -- {{not_a_var}}\n /* {{nor_this}} */ , '{{ current_username() }}' "
        "FROM t WHERE id IN ({{ids}}) AND x IN ({{none}}) AND \"{{col}}\" = 1 AND $tag$a{{v}}$tag$ = E'\\n{{v}}' AND ${v:-d} = 2"
    )
    b = bind_placeholders(sql, resolver(values), "postgresql")
    assert b.text == (
        "SELECT %s -- {{not_a_var}}\n /* {{nor_this}} */ , '{{ current_username() }}' "
        'FROM t WHERE id IN (%s, %s, %s) AND x IN (NULL) AND "we""ird" = 1 AND %s = %s AND %s = 2'
    )
    assert b.params == [7, 1, 2, 3, "az", "\nz", "z"]
    assert "{{not_a_var}}" not in b.placeholders


def test_bind_mysql_backslash_and_double_quoted_strings() -> None:
    b = bind_placeholders(
        "SELECT 'it\\'s {{v}}', \"{{v}}\", `{{c}}` FROM t # {{x}}", resolver({"v": "a", "c": "co`l"}), "mysql"
    )
    assert b.text == "SELECT %s, %s, `co``l` FROM t # {{x}}"
    assert b.params == ["it's a", "a"]


def test_split_name_quotes() -> None:
    assert [(p.text, p.quoted) for p in split_name('core."apiKey"')] == [("core", False), ("apiKey", True)]
    assert [(p.text, p.quoted) for p in split_name('"a.b"."c""d"')] == [("a.b", True), ('c"d', True)]
    assert [(p.text, p.quoted) for p in split_name("users")] == [("users", False)]


# --- P08 expectation forms on PostgreSQL ----------------------------------------------------------
FORMS: list[tuple[str, str, Any, bool]] = [
    # (id, sql, expected_result, passes)
    (
        "column-equal",
        "SELECT email, enabled FROM users WHERE username = 'admin'",
        {"email": "admin@example.com", "enabled": True},
        True,
    ),
    ("column-equal-wrong", "SELECT email FROM users WHERE username = 'admin'", {"email": "nobody@example.com"}, False),
    (
        "column-placeholder",
        "SELECT username FROM users WHERE email = '{{admin_email}}'",
        {"username": "{{admin_username}}"},
        True,
    ),
    ("op-object", "SELECT COUNT(*) AS cnt FROM users", {"cnt": {"op": ">=", "value": 2}}, True),
    (
        "operator-object-fails",
        "SELECT COUNT(*) AS cnt FROM users",
        {"cnt": {"operator": "greater_than", "value": 5}},
        False,
    ),
    (
        "op-not-null",
        "SELECT security_stamp FROM users WHERE username = 'admin'",
        {"security_stamp": {"op": "not_null"}},
        True,
    ),
    ("str-gte", "SELECT COUNT(*) AS cnt FROM users", {"cnt": ">=2"}, True),
    ("str-lte", "SELECT COUNT(*) AS cnt FROM users", {"cnt": "<=2"}, True),
    ("str-gt", "SELECT COUNT(*) AS cnt FROM users", {"cnt": ">1"}, True),
    ("str-lt-fails", "SELECT COUNT(*) AS cnt FROM users", {"cnt": "<2"}, False),
    ("str-eq", "SELECT COUNT(*) AS cnt FROM users", {"cnt": "==2"}, True),
    ("str-ne", "SELECT COUNT(*) AS cnt FROM users", {"cnt": "!=3"}, True),
    ("not-null", "SELECT security_stamp FROM users WHERE username = 'admin'", {"security_stamp": "NOT NULL"}, True),
    (
        "not-null-fails",
        "SELECT security_stamp FROM users WHERE username = 'bee'",
        {"security_stamp": "NOT NULL"},
        False,
    ),
    ("is-null", "SELECT deleted_at FROM users WHERE username = 'bee'", {"deleted_at": "IS NULL"}, True),
    ("null-literal", "SELECT deleted_at FROM users WHERE username = 'bee'", {"deleted_at": None}, True),
    ("dollar-gte", "SELECT COUNT(*) AS cnt FROM users", {"cnt": {"$gte": 2}}, True),
    ("dollar-range", "SELECT COUNT(*) AS cnt FROM users", {"cnt": {"$gt": 1, "$lt": 3}}, True),
    ("dollar-range-fails", "SELECT COUNT(*) AS cnt FROM users", {"cnt": {"$gt": 2, "$lt": 3}}, False),
    (
        "dollar-in",
        "SELECT status FROM users WHERE username = 'bee'",
        {"status": {"$in": ["blocklisted", "disabled"]}},
        True,
    ),
    ("dollar-ne", "SELECT status FROM users WHERE username = 'bee'", {"status": {"$ne": "enabled"}}, True),
    (
        "dollar-exists",
        "SELECT security_stamp FROM users WHERE username = 'admin'",
        {"security_stamp": {"$exists": True}},
        True,
    ),
    ("dollar-regex", "SELECT email FROM users WHERE username = 'admin'", {"email": {"$regex": "^admin@"}}, True),
    ("cnt-min", "SELECT COUNT(*) AS cnt FROM users", {"cnt_min": 0}, True),
    ("cnt-gte", "SELECT COUNT(*) AS cnt FROM users", {"cnt_gte": 1}, True),
    ("cnt-gte-fails", "SELECT COUNT(*) AS cnt FROM users", {"cnt_gte": 3}, False),
    ("cnt-max", "SELECT COUNT(*) AS cnt FROM users", {"cnt_max": 2}, True),
    ("cnt-lt-fails", "SELECT COUNT(*) AS cnt FROM users", {"cnt_lt": 2}, False),
    ("bool-string-true", "SELECT enabled FROM users WHERE username = 'admin'", {"enabled": "True"}, True),
    ("bool-string-false", "SELECT enabled FROM users WHERE username = 'bee'", {"enabled": "False"}, True),
    ("bool-string-wrong", "SELECT enabled FROM users WHERE username = 'bee'", {"enabled": "True"}, False),
    ("bool-false", "SELECT enabled FROM users WHERE username = 'bee'", {"enabled": False}, True),
    ("number-as-string", "SELECT COUNT(*) AS cnt FROM users", {"cnt": "2"}, True),
    ("number-as-string-zero", "SELECT COUNT(*) AS cnt FROM users WHERE email = 'none'", {"cnt": "0"}, True),
    ("numeric-vs-float", "SELECT rate FROM prices WHERE code = 'vat'", {"rate": 20.0}, True),
    ("numeric-vs-int", "SELECT rate FROM prices WHERE code = 'vat'", {"rate": 20}, True),
    ("double", "SELECT ratio FROM prices", {"ratio": 0.1}, True),
    ("text-number", "SELECT value::text AS v FROM settings WHERE key = 'app.concurrency'", {"v": "10"}, True),
    ("text-json-string", "SELECT value::text AS v FROM settings WHERE key = 'app.site_name'", {"v": '"Site"'}, True),
    (
        "jsonb-structural",
        "SELECT value FROM settings WHERE key = 'app.smtp'",
        {"value": {"port": 25, "host": "mx"}},
        True,
    ),
    ("jsonb-path", "SELECT properties FROM events", {"properties.region": "us-east"}, True),
    ("json-arrow", "SELECT properties->>'region' AS region FROM events", {"region": "us-east"}, True),
    (
        "magic-not-null",
        "SELECT security_stamp FROM users WHERE email = '{{admin_email}}'",
        {"security_stamp": "{{not_null}}"},
        True,
    ),
    (
        "magic-not-null-fails",
        "SELECT security_stamp FROM users WHERE username = 'bee'",
        {"security_stamp": "{{not_null}}"},
        False,
    ),
    ("magic-gte-1", "SELECT COUNT(*) AS cnt FROM users", {"cnt": "{{gte_1}}"}, True),
    ("magic-gte-2", "SELECT COUNT(*) AS cnt FROM users", {"cnt": "{{gte_2}}"}, True),
    ("magic-gte-3-fails", "SELECT COUNT(*) AS cnt FROM users", {"cnt": "{{gte_3}}"}, False),
    ("question-column", "SELECT 1", {"?column?": 1}, True),
    ("column-case", "SELECT COUNT(*) AS cnt FROM users", {"CNT": 2}, True),
    ("missing-column-fails", "SELECT COUNT(*) AS cnt FROM users", {"total": 2}, False),
    (
        "enum-agg",
        "SELECT string_agg(enumlabel, ',' ORDER BY enumsortorder) AS vals FROM pg_enum JOIN pg_type ON pg_enum.enumtypid = pg_type.oid "
        "WHERE pg_type.typname = 'subscriber_status'",
        {"vals": "enabled,disabled,blocklisted"},
        True,
    ),
    ("dict-no-rows-fails", "SELECT email FROM users WHERE false", {"email": "x"}, False),
    ("rows-any-order", "SELECT username FROM users", [{"username": "bee"}, {"username": "admin"}], True),
    ("rows-missing-fails", "SELECT username FROM users", [{"username": "admin"}, {"username": "carol"}], False),
    ("rows-scalars", "SELECT username FROM users ORDER BY id", ["admin", "bee"], True),
    ("rows-empty", "SELECT username FROM users WHERE false", [], True),
    ("rows-empty-fails", "SELECT username FROM users", [], False),
    ("bool-true", "SELECT 1 FROM users WHERE username = 'admin'", True, True),
    ("bool-true-fails", "SELECT 1 FROM users WHERE username = 'carol'", True, False),
    ("bool-false-no-rows", "SELECT 1 FROM users WHERE username = 'carol'", False, True),
    ("int-single-count", "SELECT COUNT(*) FROM users", 2, True),
    ("int-single-count-fails", "SELECT COUNT(*) FROM users", 1, False),
    ("int-row-count", "SELECT username FROM users", 2, True),
    ("int-row-count-uuid-like", "SELECT username FROM users WHERE username = 'admin'", 1, True),
    ("str-count-eq", "SELECT COUNT(*) FROM users", "==2", True),
    ("str-count-gte", "SELECT id FROM users", ">=2", True),
    ("str-count-plain", "SELECT COUNT(*) FROM users", "2", True),
    ("top-dollar", "SELECT COUNT(*) FROM users", {"$gte": 1}, True),
    ("top-op", "SELECT COUNT(*) FROM users", {"op": "<", "value": 2}, False),
    ("single-value-string", "SELECT status FROM users WHERE username = 'admin'", "enabled", True),
    ("single-value-not-null", "SELECT security_stamp FROM users WHERE username = 'admin'", "NOT NULL", True),
    ("empty-dict-no-rows", "SELECT 1 FROM users WHERE false", {}, True),
    ("empty-dict-rows", "SELECT id FROM users", {}, True),
    (
        "exists-expr",
        "SELECT EXISTS(SELECT 1 FROM users WHERE deleted_at IS NOT NULL) AS is_deleted",
        {"is_deleted": False},
        True,
    ),
]


@pytest.mark.parametrize("sql, expected, passes", [f[1:] for f in FORMS], ids=[f[0] for f in FORMS])
def test_p08_expected_result_forms(pg_ctx: RunContext, sql: str, expected: Any, passes: bool) -> None:
    result = step(pg_ctx, "P08", {"sql": sql, "expected_result": expected})
    assert result.passed is passes, result.message
    if not passes:
        assert result.message


def test_p08_legacy_expected_key(pg_ctx: RunContext) -> None:
    assert step(pg_ctx, "P08", {"sql": "SELECT COUNT(*) AS cnt FROM users", "expected": {"cnt": 2}}).passed
    assert not step(pg_ctx, "P08", {"sql": "SELECT COUNT(*) AS cnt FROM users", "expected": {"cnt": 3}}).passed


def test_p08_without_expectation(pg_ctx: RunContext) -> None:
    ok = step(pg_ctx, "P08", {"sql": "SELECT number FROM (VALUES ('INV-1')) v(number)"})
    assert ok.passed, ok.message
    none = step(pg_ctx, "P08", {"sql": "SELECT 1 FROM users WHERE false"})
    assert not none.passed and "no rows" in none.message  # a SELECT without expectation must return a row
    null = step(pg_ctx, "P08", {"sql": "SELECT 1 FROM users WHERE false", "expected_result": None})
    assert not null.passed  # null is the same as absent


def test_p08_assertions_mnmtxiwb_shape(pg_ctx: RunContext) -> None:
    sql = (
        "SELECT COUNT(*) FILTER (WHERE deleted_at IS NULL) AS live, COUNT(*) FILTER (WHERE status NOT IN ('enabled','blocklisted')) AS invalid, "
        "COUNT(*) AS total FROM users"
    )
    good = step(
        pg_ctx,
        "P08",
        {
            "sql": sql,
            "expected_result": {},
            "assertions": [
                {"field": "live", "operator": "gte", "expected": 1},
                {"field": "invalid", "operator": "equals", "expected": 0},
                {"field": "total", "operator": "equals", "expected": 2},
            ],
        },
    )
    assert good.passed, good.message
    bad = step(
        pg_ctx,
        "P08",
        {"sql": sql, "expected_result": {}, "assertions": [{"field": "total", "operator": "gte", "expected": 3}]},
    )
    assert not bad.passed and "total" in bad.message


def test_p08_result_is_last_document_for_p07(pg_ctx: RunContext) -> None:
    r = step(pg_ctx, "P08", {"sql": "SELECT username, enabled FROM users ORDER BY id"})
    assert r.passed
    assert pg_ctx.last_document["count"] == 2
    assert pg_ctx.last_document["rows"][0] == {"username": "admin", "enabled": True}
    assert r.evidence["rows"][1]["username"] == "bee"


# --- fixtures, captures ---------------------------------------------------------------------------
def test_p08_fixture_statements_report_rowcount(pg_ctx: RunContext) -> None:
    ins = step(
        pg_ctx,
        "P08",
        {"sql": "INSERT INTO jobs (name, state) VALUES ('a', 'new'), ('b', 'new')", "expected_result": {}},
    )
    assert ins.passed and "2 row(s) affected" in ins.message and ins.value["rowcount"] == 2
    upd = step(pg_ctx, "P08", {"sql": "UPDATE jobs SET state = 'done' WHERE name IN ('a', 'b')", "expected_result": 2})
    assert upd.passed, upd.message
    upd_dict = step(
        pg_ctx, "P08", {"sql": "UPDATE jobs SET state = 'done' WHERE name = 'a'", "expected_result": {"affected": 1}}
    )
    assert upd_dict.passed, upd_dict.message
    delete = step(pg_ctx, "P08", {"sql": "DELETE FROM jobs WHERE name IN ('a', 'b')", "expected_result": {}})
    assert delete.passed and delete.value["rowcount"] == 2
    refresh = step(pg_ctx, "P08", {"sql": "REFRESH MATERIALIZED VIEW mat_counts", "expected_result": {}})
    assert refresh.passed, refresh.message
    returning = step(
        pg_ctx, "P08", {"sql": "INSERT INTO jobs (name) VALUES ('ret') RETURNING id", "expected_result": {}}
    )
    assert returning.passed and pg_ctx.last_created_id == returning.value["rows"][0]["id"]
    # a fixture statement without any expectation passes when it ran
    assert step(pg_ctx, "P08", {"sql": "DELETE FROM jobs WHERE name = 'ret'"}).passed


def test_p08_save_id_and_store_as(pg_ctx: RunContext) -> None:
    r = step(
        pg_ctx,
        "P08",
        {
            "sql": "SELECT id::text AS id, email FROM users WHERE username = 'admin'",
            "save_id": "admin_id",
            "expected_result": {},
        },
    )
    assert r.passed and pg_ctx.vars["admin_id"] == "1"
    r = step(pg_ctx, "P08", {"sql": "SELECT id, email FROM users WHERE username = 'bee'", "store_as": "bee"})
    assert r.passed and pg_ctx.vars["bee"]["email"] == "b@example.com"
    # a later step uses the captured row: bound as a parameter
    r = step(
        pg_ctx,
        "P08",
        {
            "sql": "SELECT username FROM users WHERE email = '{{bee.email}}' AND id = {{bee.id}}",
            "expected_result": {"username": "bee"},
        },
    )
    assert r.passed, r.message
    r = step(
        pg_ctx,
        "P08",
        {"sql": "SELECT id, email FROM users WHERE username = 'admin'", "store_as": {"uid": "id", "mail": "email"}},
    )
    assert r.passed and pg_ctx.vars["uid"] == 1 and pg_ctx.vars["mail"] == "admin@example.com"
    none = step(pg_ctx, "P08", {"sql": "SELECT id FROM users WHERE false", "save_id": "nothing", "expected_result": {}})
    assert not none.passed and "nothing to capture" in none.message and "nothing" not in pg_ctx.vars


def test_p08_bare_placeholders_and_lists(pg_ctx: RunContext) -> None:
    assert step(
        pg_ctx,
        "P08",
        {
            "sql": "SELECT COUNT(*) AS cnt FROM subscriber_lists WHERE list_id = {{list_id}}",
            "expected_result": {"cnt": 0},
        },
    ).passed
    assert step(
        pg_ctx,
        "P08",
        {"sql": "SELECT name FROM lists WHERE id = {{list_id_text}}", "expected_result": {"name": "seven"}},
    ).passed
    assert step(pg_ctx, "P08", {"sql": "SELECT COUNT(*) FROM users WHERE id IN ({{ids}})", "expected_result": 2}).passed


def test_p08_unresolved_placeholder_is_named(pg_ctx: RunContext) -> None:
    r = step(pg_ctx, "P08", {"sql": "SELECT 1 FROM users WHERE email = '{{no_such_var}}'"})
    assert not r.passed and "{{no_such_var}}" in r.message
    r = step(pg_ctx, "P08", {"sql": "SELECT 1 AS one", "expected_result": {"one": "{{missing_too}}"}})
    assert not r.passed and "{{missing_too}}" in r.message


# --- SQL injection ---------------------------------------------------------------------------------
def test_sql_injection_value_is_bound_verbatim(pg_ctx: RunContext) -> None:
    ins = step(
        pg_ctx, "P08", {"sql": "INSERT INTO jobs (name, state) VALUES ('{{evil}}', 'inj')", "expected_result": {}}
    )
    assert ins.passed, ins.message
    assert ins.evidence["bound_parameters"] == 1 and EVIL not in ins.evidence["statement"]
    found = step(
        pg_ctx, "P08", {"sql": "SELECT name FROM jobs WHERE name = '{{evil}}'", "expected_result": {"name": "{{evil}}"}}
    )
    assert found.passed, found.message
    bare = step(
        pg_ctx, "P08", {"sql": "SELECT COUNT(*) AS cnt FROM jobs WHERE name = {{evil}}", "expected_result": {"cnt": 1}}
    )
    assert bare.passed, bare.message
    like = step(
        pg_ctx,
        "P08",
        {"sql": "SELECT COUNT(*) AS cnt FROM jobs WHERE name LIKE '%{{evil}}%'", "expected_result": {"cnt": 1}},
    )
    assert like.passed, like.message
    # the users table survived, with its rows
    assert step(pg_ctx, "P08", {"sql": "SELECT COUNT(*) AS cnt FROM users", "expected_result": {"cnt": 2}}).passed


def test_sql_injection_through_a_captured_app_value(pg: str) -> None:
    """The app stored a hostile name; a DAG captures it and uses it in later SQL: still just data."""
    dag = load_dag_data(
        {
            "nodes": [
                {
                    "id": "SEED",
                    "steps": [
                        {
                            "type": "P08",
                            "inputs": {
                                "sql": "INSERT INTO jobs (name, state) VALUES ('a''); DROP TABLE users; --', 'seeded')",
                                "expected_result": {},
                            },
                        }
                    ],
                    "scoring": {"category": "DataModel", "method": "binary", "maxScore": 1},
                },
                {
                    "id": "CAPTURE",
                    "prereqs": ["SEED"],
                    "steps": [
                        {
                            "type": "P08",
                            "inputs": {
                                "sql": "SELECT name FROM jobs WHERE state = 'seeded'",
                                "save_id": "job_name",
                                "expected_result": {},
                            },
                        },
                        {
                            "type": "P08",
                            "inputs": {
                                "sql": "UPDATE jobs SET state = 'seen' WHERE name = '{{job_name}}'",
                                "expected_result": 1,
                            },
                        },
                        {
                            "type": "P08",
                            "inputs": {
                                "sql": "SELECT COUNT(*) AS cnt FROM users",
                                "expected_result": {"cnt": {"$gte": 2}},
                            },
                        },
                        {"type": "P09", "inputs": {"tables": ["users"]}},
                    ],
                    "scoring": {"category": "DataModel", "method": "binary", "maxScore": 2},
                },
            ]
        }
    ).dag
    ctx = make_ctx(pg)
    report = Engine(dag, ctx).run()
    assert [n.status for n in report.nodes] == [Status.PASSED, Status.PASSED], [n.message for n in report.nodes]
    assert ctx.resources == {}  # closed at the end of the run


# --- retry_ms ----------------------------------------------------------------------------------------
def test_p08_retry_ms_polls_until_the_row_appears(pg: str, pg_ctx: RunContext) -> None:
    def later() -> None:
        time.sleep(0.5)
        admin("INSERT INTO jobs (name, state) VALUES ('async-job', 'done')", pg)

    thread = threading.Thread(target=later)
    thread.start()
    try:
        r = step(
            pg_ctx,
            "P08",
            {
                "sql": "SELECT state FROM jobs WHERE name = 'async-job'",
                "expected_result": {"state": "done"},
                "retry_ms": 10000,
                "retry_interval_ms": 100,
            },
        )
    finally:
        thread.join()
    assert r.passed, r.message
    assert r.evidence["attempts"] > 1


def test_p08_retry_ms_gives_up(pg_ctx: RunContext) -> None:
    r = step(
        pg_ctx,
        "P08",
        {
            "sql": "SELECT COUNT(*) AS cnt FROM users",
            "expected_result": {"cnt": 99},
            "retry_ms": 600,
            "retry_interval_ms": 100,
        },
    )
    assert not r.passed and r.evidence["attempts"] > 1 and "attempts" in r.message


def test_p08_retry_never_repeats_a_fixture_statement(pg_ctx: RunContext) -> None:
    r = step(pg_ctx, "P08", {"sql": "INSERT INTO jobs (name) VALUES ('once')", "expected_result": 5, "retry_ms": 2000})
    assert not r.passed and r.evidence["attempts"] == 1
    assert step(pg_ctx, "P08", {"sql": "SELECT COUNT(*) FROM jobs WHERE name = 'once'", "expected_result": 1}).passed


def test_p08_retry_is_bounded_by_the_node_deadline(pg_ctx: RunContext) -> None:
    pg_ctx.start_node_clock(0.5)
    t0 = time.monotonic()
    r = step(
        pg_ctx,
        "P08",
        {
            "sql": "SELECT COUNT(*) AS cnt FROM users",
            "expected_result": {"cnt": 99},
            "retry_ms": 60000,
            "retry_interval_ms": 100,
        },
    )
    assert not r.passed and time.monotonic() - t0 < 10


# --- errors, timeouts, no DSN --------------------------------------------------------------------
def test_statement_timeout_fails_with_a_message(pg: str) -> None:
    ctx = make_ctx(pg + "?statement_timeout=0.5")
    try:
        r = step(ctx, "P08", {"sql": "SELECT pg_sleep(5)", "expected_result": {}})
        assert not r.passed
        assert "statement timeout" in r.message
        # the connection is still usable afterwards
        assert step(ctx, "P08", {"sql": "SELECT 1 AS one", "expected_result": {"one": 1}}).passed
    finally:
        ctx.close()


def test_step_timeout_ms(pg_ctx: RunContext) -> None:
    r = step(pg_ctx, "P08", {"sql": "SELECT pg_sleep(5)", "timeout_ms": 300})
    assert not r.passed and "statement timeout" in r.message


def test_syntax_error_fails_with_driver_message(pg_ctx: RunContext) -> None:
    r = step(pg_ctx, "P08", {"sql": "SELEC 1"})
    assert not r.passed and "syntax error" in r.message
    r = step(pg_ctx, "P08", {"sql": "SELECT * FROM no_such_table"})
    assert not r.passed and "no_such_table" in r.message
    assert step(pg_ctx, "P08", {"sql": "SELECT 1 AS one"}).passed  # autocommit: no aborted transaction left


def test_unreachable_database_fails_cleanly() -> None:
    try:
        from pgserver import free_port
    except ImportError:  # pragma: no cover
        from tests.pgserver import free_port

    ctx = make_ctx(f"postgresql://postgres:secret@127.0.0.1:{free_port()}/postgres?connect_timeout=2")
    try:
        r = step(ctx, "P08", {"sql": "SELECT 1"})
        assert not r.passed and "cannot connect" in r.message and "secret" not in r.message
    finally:
        ctx.close()


@pytest.mark.parametrize(
    "code, inputs",
    [
        ("P08", {"sql": "SELECT 1"}),
        ("P09", {"tables": ["users"]}),
        ("P10", {"table": "users", "expected_columns": ["id"]}),
        ("P11", {"table": "users", "expected_indexes": [{"columns": ["id"]}]}),
    ],
)
def test_no_dsn_message(code: str, inputs: dict) -> None:
    ctx = make_ctx(None)
    r = step(ctx, code, inputs)
    assert not r.passed and r.message == NO_DSN_MESSAGE == "no database: pass --db-dsn"


def test_unknown_scheme_fails_cleanly() -> None:
    r = step(make_ctx("oracle://x@y/z"), "P08", {"sql": "SELECT 1"})
    assert not r.passed and "unsupported database DSN scheme" in r.message


# --- P09 / P10 / P11 on PostgreSQL -----------------------------------------------------------------
def test_p09_schema_qualified_and_quoted(pg_ctx: RunContext) -> None:
    r = step(
        pg_ctx,
        "P09",
        {
            "tables": [
                "core.user",
                "core.workspace",
                'core."apiKey"',
                '"core"."apiKey"',
                "users",
                "settings",
                "mat_counts",
            ]
        },
    )
    assert r.passed, r.message
    loose = step(pg_ctx, "P09", {"tables": ["core.apikey", "Users"]})  # unquoted: case-insensitive
    assert loose.passed, loose.message
    exact = step(pg_ctx, "P09", {"tables": ['core."apikey"']})  # quoted: exact
    assert not exact.passed and exact.value["missing"] == ['core."apikey"']
    off_path = step(pg_ctx, "P09", {"tables": ["apiKey", "users"]})
    assert not off_path.passed and "search path" in off_path.message
    assert off_path.value == {"found": ["users"], "missing": ["apiKey"], "ratio": 0.5}


def test_p09_legacy_table_key(pg_ctx: RunContext) -> None:
    assert step(pg_ctx, "P09", {"table": "users"}).passed
    assert not step(pg_ctx, "P09", {"table": "nope"}).passed


def test_p10_columns_quoted_and_types(pg_ctx: RunContext) -> None:
    r = step(
        pg_ctx,
        "P10",
        {"table": "core.user", "expected_columns": ["id", "email", '"firstName"', '"lastName"', '"createdAt"']},
    )
    assert r.passed, r.message
    assert step(
        pg_ctx, "P10", {"table": "core.user", "expected_columns": ["firstname"]}
    ).passed  # unquoted: case-insensitive
    missing = step(pg_ctx, "P10", {"table": "core.user", "expected_columns": ['"firstname"', "email", "phone"]})
    assert not missing.passed and set(missing.value["missing"]) == {'"firstname"', "phone"}
    typed = step(
        pg_ctx,
        "P10",
        {
            "table": "users",
            "columns": [
                {"name": "id", "type": "int"},
                {"name": "email", "type": "text"},
                {"name": "enabled", "type": "bool"},
                {"name": "created_at", "type": "timestamp"},
                {"name": "deleted_at", "type": "timestamptz", "nullable": True},
                {"name": "email", "type": "TEXT", "nullable": False},
            ],
        },
    )
    assert typed.passed, typed.message
    assert step(
        pg_ctx,
        "P10",
        {
            "table": "core.user",
            "columns": [{"name": "firstName", "type": "varchar"}, {"name": "firstName", "type": "character varying"}],
        },
    ).passed
    wrong = step(pg_ctx, "P10", {"table": "users", "columns": [{"name": "email", "type": "integer"}]})
    assert not wrong.passed and "type" in wrong.message
    gone = step(pg_ctx, "P10", {"table": "core.nothing", "expected_columns": ["id"]})
    assert not gone.passed and "not found" in gone.message


def test_p11_index_forms(pg_ctx: RunContext) -> None:
    assert step(
        pg_ctx,
        "P11",
        {
            "table": "users",
            "expected_indexes": [
                {"columns": ["email"]},
                {"columns": ["username"], "unique": True},
                {"columns": ["id"]},
            ],
        },
    ).passed
    assert step(
        pg_ctx, "P11", {"table": 'core."apiKey"', "expected_indexes": [{"columns": ['"workspaceId"', "name"]}]}
    ).passed
    assert step(
        pg_ctx, "P11", {"table": "users", "indexes": ["^ix_users_email$", "lower\\(email\\)", "UNIQUE INDEX uq_users"]}
    ).passed
    expr = step(
        pg_ctx, "P11", {"table": "users", "expected_indexes": [{"name": "ix_users_lower_email", "columns": ["email"]}]}
    )
    assert expr.passed, expr.message
    missing = step(
        pg_ctx,
        "P11",
        {"table": "users", "expected_indexes": [{"columns": ["status"]}, {"columns": ["email"], "unique": True}]},
    )
    assert not missing.passed and len(missing.value["missing"]) == 2
    anywhere = step(pg_ctx, "P11", {"indexes": ["uq_users_username"]})
    assert anywhere.passed, anywhere.message


def test_database_interface_direct(pg: str) -> None:
    db = open_database(pg)
    try:
        assert isinstance(db, PostgresDatabase)
        names = {str(t) for t in db.tables()}
        assert {"public.users", "core.apiKey", "core.user", "public.mat_counts"} <= names
        cols = {c.name: c for c in db.columns('core."user"')}
        assert cols["firstName"].data_type == "character varying(100)" and cols["firstName"].nullable
        assert not cols["email"].nullable
        idx = {i.name: i for i in db.indexes('core."apiKey"')}
        assert idx["IDX_apiKey_ws_name"].columns == ["workspaceId", "name"] and idx["IDX_apiKey_ws_name"].unique
        res = db.query("SELECT %s::text AS a, 1 AS b; ", ["x"])
        assert res.columns == ["a", "b"] and res.rows == [{"a": "x", "b": 1}] and res.is_select
        multi = db.query("SELECT 1 AS one; SELECT 2 AS two")
        assert multi.rows == [{"two": 2}]  # several statements: the last result set
        with pytest.raises(DatabaseError):
            db.query("SELECT * FROM nowhere")
    finally:
        db.close()


def test_client_side_fallback_for_statements_without_parameters(pg_ctx: RunContext) -> None:
    """Utility statements cannot take server parameters; values then go in as quoted literals."""
    pg_ctx.vars["app_name"] = "it's; DROP TABLE users; --"
    r = step(pg_ctx, "P08", {"sql": "SET application_name = '{{app_name}}'", "expected_result": {}})
    assert r.passed, r.message
    assert step(
        pg_ctx, "P08", {"sql": "SHOW application_name", "expected_result": {"application_name": "{{app_name}}"}}
    ).passed
    assert step(pg_ctx, "P08", {"sql": "SELECT '{{app_name}}' IS NULL AS n", "expected_result": {"n": False}}).passed
    assert step(pg_ctx, "P09", {"tables": ["users"]}).passed


def test_several_statements_with_placeholders(pg_ctx: RunContext) -> None:
    pg_ctx.vars["evil_multi"] = "y'); DELETE FROM users; --"
    r = step(
        pg_ctx,
        "P08",
        {
            "sql": "INSERT INTO jobs (name, state) VALUES ('{{evil_multi}}', 'multi'); "
            "SELECT COUNT(*) AS cnt FROM jobs WHERE name = '{{evil_multi}}' AND state = 'multi'",
            "expected_result": {"cnt": 1},
        },
    )
    assert r.passed, r.message
    assert step(pg_ctx, "P08", {"sql": "SELECT COUNT(*) AS cnt FROM users", "expected_result": {"cnt": 2}}).passed


def test_captured_values_are_never_comparators(pg_ctx: RunContext) -> None:
    pg_ctx.vars["cmp"] = ">=0"
    pg_ctx.vars["nn"] = "NOT NULL"
    assert not step(pg_ctx, "P08", {"sql": "SELECT 'x' AS v", "expected_result": {"v": "{{cmp}}"}}).passed
    assert step(pg_ctx, "P08", {"sql": "SELECT '>=0' AS v", "expected_result": {"v": "{{cmp}}"}}).passed
    assert not step(pg_ctx, "P08", {"sql": "SELECT 'x' AS v", "expected_result": {"v": "{{nn}}"}}).passed


def test_db_check_helper_for_other_primitives(pg_ctx: RunContext) -> None:
    from saasbench.primitives.db import db_check

    assert db_check(pg_ctx, "SELECT COUNT(*) AS cnt FROM users WHERE email = '{{admin_email}}'", {"cnt": 1}).passed
    assert not db_check(pg_ctx, "SELECT COUNT(*) AS cnt FROM users WHERE email = '{{admin_email}}'", {"cnt": 2}).passed
    assert not db_check(pg_ctx, "SELECT 1", {"a": {"op": "nope", "value": 1}}).passed


def test_get_database_caches_and_closes(pg: str) -> None:
    ctx = make_ctx(pg)
    db = get_database(ctx)
    assert get_database(ctx) is db and ctx.resources["db"] is db
    assert step(ctx, "P08", {"sql": "SELECT 1 AS one"}).passed
    conn = db._conn
    assert conn is not None and not conn.closed
    ctx.close()
    assert conn.closed and "db" not in ctx.resources


def test_get_database_on_a_context_without_resources(pg: str) -> None:
    class OldContext:
        def __init__(self) -> None:
            self.target = Target(db_dsn=pg)
            self.closed = False

        def close(self) -> None:
            self.closed = True

    ctx = OldContext()
    db = get_database(ctx)  # type: ignore[arg-type]
    db.query("SELECT 1")
    ctx.close()
    assert ctx.closed and db._conn is None


# --- loader: real DAG shapes validate, bad ones are refused -----------------------------------
REAL_SHAPES = [
    (
        "P08",
        {
            "sql": 'SELECT "canImpersonate", "canAccessFullAdminPanel" FROM core.user WHERE email=\'{{admin_email}}\'',
            "expected_result": {"canImpersonate": True, "canAccessFullAdminPanel": True},
        },
    ),
    (
        "P08",
        {
            "sql": "SELECT COUNT(*) as cnt FROM information_schema.columns WHERE table_schema='core'",
            "expected_result": {"cnt_gte": 1},
        },
    ),
    ("P08", {"sql": "SELECT COUNT(*) AS cnt FROM settings", "expected_result": {"cnt": {"$gte": 60}}}),
    (
        "P08",
        {
            "sql": "SELECT security_stamp FROM users WHERE email='{{admin_email}}'",
            "expected_result": {"security_stamp": "{{not_null}}"},
        },
    ),
    (
        "P08",
        {
            "sql": "SELECT COUNT(*) as cnt FROM collections WHERE org_uuid='{{org_id}}'",
            "expected_result": {"cnt": "{{gte_1}}"},
        },
    ),
    (
        "P08",
        {
            "sql": "SELECT atype, wait_time_days FROM emergency_access",
            "expected_result": {"atype": "0", "wait_time_days": "7"},
        },
    ),
    (
        "P08",
        {"sql": "SELECT enabled FROM users WHERE email='{{user_b_email}}'", "expected_result": {"enabled": "False"}},
    ),
    (
        "P08",
        {
            "sql": "SELECT COUNT(*) as cnt FROM charges",
            "expected_result": {},
            "assertions": [{"field": "cnt", "operator": "gte", "expected": 1}],
        },
    ),
    ("P08", {"sql": "SELECT id::text AS id FROM roles LIMIT 1", "save_id": "role_uuid", "expected_result": {}}),
    ("P08", {"sql": "SELECT number FROM invoices LIMIT 1"}),
    ("P08", {"sql": "SELECT 1 FROM pg_extension WHERE extname = 'pgcrypto'", "expected_result": {"?column?": 1}}),
    ("P08", {"sql": "REFRESH MATERIALIZED VIEW mat_dashboard_charts", "expected_result": {}}),
    ("P09", {"tables": ["core.user", 'core."apiKey"']}),
    ("P10", {"table": "core.user", "expected_columns": ["id", '"firstName"']}),
    ("P10", {"table": "t", "columns": [{"name": "id", "type": "uuid"}]}),
    ("P11", {"table": "t", "expected_indexes": [{"columns": ["a", "b"]}]}),
    ("P11", {"table": "t", "indexes": ["ix_.*"]}),
]


def test_real_dag_shapes_load_without_errors_or_warnings() -> None:
    nodes = [
        {
            "id": f"N{i}",
            "steps": [{"type": code, "inputs": inputs}],
            "scoring": {"category": "DataModel", "method": "binary", "maxScore": 1},
        }
        for i, (code, inputs) in enumerate(REAL_SHAPES)
    ]
    result = load_dag_data({"nodes": nodes})
    assert [i for i in result.issues if i.kind != "normalisation"] == []
    notes = " ".join(i.message for i in result.normalisations)
    assert "cnt_gte" in notes and "{{not_null}}" in notes and "columns [{name, type}]" in notes


@pytest.mark.parametrize(
    "code, inputs, fragment",
    [
        (
            "P08",
            {"sql": "SELECT 1", "assertions": [{"field": "a", "operator": "sorta", "expected": 1}]},
            "unknown operator",
        ),
        ("P08", {"sql": "SELECT 1", "expected_result": {"a": {"op": "bogus", "value": 1}}}, "unknown operator"),
        ("P08", {"sql": "  "}, "sql is empty"),
        ("P09", {"tables": []}, "at least one table"),
        ("P10", {"table": "t"}, "at least one column"),
        ("P11", {"table": "t", "expected_indexes": [{"unique": True}]}, "columns"),
    ],
)
def test_bad_inputs_are_load_errors(code: str, inputs: dict, fragment: str) -> None:
    with pytest.raises(DagLoadError) as err:
        load_dag_data(
            {
                "nodes": [
                    {
                        "id": "N",
                        "steps": [{"type": code, "inputs": inputs}],
                        "scoring": {"category": "X", "method": "binary", "maxScore": 1},
                    }
                ]
            }
        )
    assert fragment in str(err.value)


# --- SQLite ---------------------------------------------------------------------------------------
def test_sqlite_p08_forms(sqlite_ctx: RunContext) -> None:
    ctx = sqlite_ctx
    assert step(
        ctx,
        "P08",
        {"sql": "SELECT enabled FROM users WHERE email='{{admin_email}}'", "expected_result": {"enabled": True}},
    ).passed
    assert step(
        ctx, "P08", {"sql": "SELECT enabled FROM users WHERE username='bee'", "expected_result": {"enabled": "False"}}
    ).passed
    assert step(
        ctx, "P08", {"sql": "SELECT COUNT(*) AS cnt FROM orders", "expected_result": {"cnt": "{{gte_2}}"}}
    ).passed
    assert step(ctx, "P08", {"sql": "SELECT SUM(total) AS s FROM orders", "expected_result": {"s": 20}}).passed
    assert step(ctx, "P08", {"sql": "SELECT COUNT(*) FROM users", "expected_result": 2}).passed
    assert step(
        ctx,
        "P08",
        {
            "sql": "SELECT email FROM users",
            "expected_result": [{"email": "b@example.com"}, {"email": "admin@example.com"}],
        },
    ).passed
    assert not step(
        ctx,
        "P08",
        {
            "sql": "SELECT security_stamp FROM users WHERE username = 'bee'",
            "expected_result": {"security_stamp": "NOT NULL"},
        },
    ).passed
    ins = step(
        ctx,
        "P08",
        {
            "sql": "INSERT INTO users (email, username) VALUES ('c@example.com', 'cee') RETURNING id",
            "expected_result": {},
        },
    )
    assert ins.passed and ctx.last_created_id == 3
    assert step(ctx, "P08", {"sql": "UPDATE users SET enabled = 0 WHERE username = 'cee'", "expected_result": 1}).passed
    assert step(
        ctx, "P08", {"sql": "SELECT id FROM users WHERE username = 'cee'", "save_id": "cee_id", "expected_result": {}}
    ).passed
    assert ctx.vars["cee_id"] == 3


def test_sqlite_injection(sqlite_ctx: RunContext, sqlite_dsn: str) -> None:
    ins = step(
        sqlite_ctx,
        "P08",
        {"sql": "INSERT INTO users (email, username) VALUES ('{{evil}}', {{evil}})", "expected_result": 1},
    )
    assert ins.passed, ins.message
    assert step(
        sqlite_ctx,
        "P08",
        {
            "sql": "SELECT COUNT(*) AS cnt FROM users WHERE email = '{{evil}}' AND username = {{evil}}",
            "expected_result": {"cnt": 1},
        },
    ).passed
    conn = sqlite3.connect(sqlite_dsn[len("sqlite:///") :])
    assert conn.execute("SELECT COUNT(*) FROM users").fetchone()[0] == 3
    conn.close()


def test_sqlite_introspection(sqlite_ctx: RunContext) -> None:
    assert step(sqlite_ctx, "P09", {"tables": ["users", "main.orders", "USERS"]}).passed
    assert not step(sqlite_ctx, "P09", {"tables": ["users", "payments"]}).passed
    assert step(
        sqlite_ctx,
        "P10",
        {
            "table": "users",
            "columns": [
                {"name": "id", "type": "integer"},
                {"name": "username", "type": "varchar"},
                {"name": "email", "nullable": False},
            ],
        },
    ).passed
    assert not step(sqlite_ctx, "P10", {"table": "users", "expected_columns": ["password_hash"]}).passed
    assert step(
        sqlite_ctx,
        "P11",
        {
            "table": "users",
            "expected_indexes": [
                {"columns": ["email"], "unique": True},
                {"columns": ["username", "enabled"]},
                {"columns": ["id"]},
            ],
        },
    ).passed
    assert step(sqlite_ctx, "P11", {"table": "users", "indexes": ["ix_users_username"]}).passed
    assert not step(sqlite_ctx, "P11", {"table": "orders", "expected_indexes": [{"columns": ["user_id"]}]}).passed


def test_sqlite_statement_timeout(sqlite_dsn: str) -> None:
    ctx = make_ctx(sqlite_dsn + "?statement_timeout=300ms")
    try:
        r = step(
            ctx, "P08", {"sql": "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT MAX(x) FROM c"}
        )
        assert not r.passed and "interrupted" in r.message and "statement timeout" in r.message
    finally:
        ctx.close()


def test_sqlite_missing_file_is_not_created(tmp_path) -> None:
    path = tmp_path / "absent.db"
    r = step(make_ctx(f"sqlite:///{path}"), "P08", {"sql": "SELECT 1"})
    assert not r.passed and "cannot open" in r.message and not path.exists()


# --- MariaDB --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def maria(mariadb_server: str) -> str:
    db = open_database(mariadb_server)
    try:
        for sql in [
            "DROP TABLE IF EXISTS orders, users",
            "CREATE TABLE users (id INT AUTO_INCREMENT PRIMARY KEY, email VARCHAR(190) NOT NULL, username VARCHAR(50), "
            "enabled BOOLEAN NOT NULL DEFAULT 1, amount DECIMAL(10,2) NOT NULL DEFAULT 0, doc JSON, UNIQUE KEY uq_email (email), KEY ix_user_enabled (username, enabled))",
            "INSERT INTO users (email, username, enabled, amount, doc) VALUES ('admin@example.com', 'admin', 1, 20.00, '{\"a\": 1}'), ('b@example.com', 'bee', 0, 7.5, NULL)",
            "CREATE TABLE orders (id INT AUTO_INCREMENT PRIMARY KEY, user_id INT, KEY ix_orders_user (user_id))",
        ]:
            db.query(sql)
    finally:
        db.close()
    return mariadb_server


@pytest.fixture
def maria_ctx(maria: str) -> Iterator[RunContext]:
    ctx = make_ctx(maria)
    yield ctx
    ctx.close()


def test_mariadb_p08(maria_ctx: RunContext) -> None:
    ctx = maria_ctx
    assert step(
        ctx,
        "P08",
        {
            "sql": "SELECT enabled, amount FROM users WHERE email='{{admin_email}}'",
            "expected_result": {"enabled": True, "amount": 20.0},
        },
    ).passed
    assert step(
        ctx, "P08", {"sql": "SELECT enabled FROM users WHERE username='bee'", "expected_result": {"enabled": "False"}}
    ).passed
    assert step(
        ctx, "P08", {"sql": "SELECT COUNT(*) AS cnt FROM users", "expected_result": {"cnt": {"$gte": 2}}}
    ).passed
    assert step(
        ctx, "P08", {"sql": "SELECT COUNT(*) FROM users WHERE email LIKE '%example%'", "expected_result": 2}
    ).passed
    assert step(
        ctx, "P08", {"sql": "SELECT doc FROM users WHERE username = 'admin'", "expected_result": {"doc": {"a": 1}}}
    ).passed
    upd = step(
        ctx, "P08", {"sql": "UPDATE users SET amount = amount + 1 WHERE username = 'bee'", "expected_result": {}}
    )
    assert upd.passed and upd.value["rowcount"] == 1


def test_mariadb_injection_with_backslashes(maria_ctx: RunContext) -> None:
    maria_ctx.vars["evil2"] = "a\\'); DROP TABLE users; -- \\"
    for name in ("evil", "evil2"):
        ins = step(
            maria_ctx,
            "P08",
            {
                "sql": "INSERT INTO users (email, username) VALUES ('{{" + name + "}}', \"{{" + name + '}}")',
                "expected_result": 1,
            },
        )
        assert ins.passed, ins.message
        assert step(
            maria_ctx,
            "P08",
            {
                "sql": "SELECT username FROM users WHERE email = '{{" + name + "}}'",
                "expected_result": {"username": "{{" + name + "}}"},
            },
        ).passed
    assert step(maria_ctx, "P09", {"tables": ["users"]}).passed


def test_mariadb_introspection(maria_ctx: RunContext, maria: str) -> None:
    assert step(maria_ctx, "P09", {"tables": ["users", "orders", "saas.users", "`users`"]}).passed
    assert not step(maria_ctx, "P09", {"tables": ["payments"]}).passed
    assert step(
        maria_ctx,
        "P10",
        {
            "table": "users",
            "columns": [
                {"name": "id", "type": "int"},
                {"name": "email", "type": "varchar", "nullable": False},
                {"name": "enabled", "type": "boolean"},
                {"name": "amount", "type": "decimal"},
            ],
        },
    ).passed
    assert step(
        maria_ctx,
        "P11",
        {
            "table": "users",
            "expected_indexes": [
                {"columns": ["email"], "unique": True},
                {"columns": ["username", "enabled"]},
                {"columns": ["id"]},
            ],
        },
    ).passed
    assert step(maria_ctx, "P11", {"table": "orders", "indexes": ["ix_orders_user"]}).passed
    assert not step(
        maria_ctx, "P11", {"table": "orders", "expected_indexes": [{"columns": ["user_id"], "unique": True}]}
    ).passed


def test_mariadb_statement_timeout(maria: str) -> None:
    ctx = make_ctx(maria + "?statement_timeout=0.5")
    try:
        r = step(
            ctx,
            "P08",
            {
                "sql": "SELECT COUNT(*) FROM information_schema.COLUMNS a, information_schema.COLUMNS b, information_schema.COLUMNS c",
                "expected_result": {},
            },
        )
        assert not r.passed and "statement timeout" in r.message
        assert step(ctx, "P08", {"sql": "SELECT 1 AS one", "expected_result": {"one": 1}}).passed
    finally:
        ctx.close()


# --- MongoDB (nx-27017 emulator) -------------------------------------------------------------------
def test_mongodb_queries_and_introspection(mongo_server: str) -> None:
    ctx = make_ctx(mongo_server)
    try:
        ins = step(
            ctx,
            "P08",
            {
                "sql": '{"collection": "users", "insert": [{"email": "admin@example.com", "n": 1, "enabled": true}, {"email": "{{evil}}", "n": 2}]}',
                "expected_result": 2,
            },
        )
        assert ins.passed, ins.message
        found = step(
            ctx,
            "P08",
            {
                "sql": {"collection": "users", "find": {"email": "{{admin_email}}"}},
                "expected_result": {"n": 1, "enabled": "True"},
            },
        )
        assert found.passed, found.message
        evil = step(
            ctx, "P08", {"sql": '{"collection": "users", "filter": {"email": "{{evil}}"}}', "expected_result": {"n": 2}}
        )
        assert evil.passed, evil.message
        bare = step(
            ctx, "P08", {"sql": '{"collection": "users", "count": {"n": {{list_id}}}}', "expected_result": {"count": 0}}
        )
        assert bare.passed, bare.message
        counted = step(
            ctx, "P08", {"sql": '{"collection": "users", "count": {}}', "expected_result": {"count": {"$gte": 2}}}
        )
        assert counted.passed, counted.message
        assert step(ctx, "P09", {"tables": ["users"]}).passed
        assert not step(ctx, "P09", {"tables": ["orders"]}).passed
        assert step(
            ctx,
            "P10",
            {"table": "users", "columns": [{"name": "email", "type": "string"}, {"name": "n", "type": "int"}]},
        ).passed
        assert step(ctx, "P11", {"table": "users", "expected_indexes": [{"columns": ["_id"]}]}).passed
        bad = step(ctx, "P08", {"sql": "SELECT 1"})
        assert not bad.passed and "JSON" in bad.message
        ctx.vars["obj"] = {"$ne": None}  # a captured object must not become an operator
        op = step(ctx, "P08", {"sql": '{"collection": "users", "find": {"email": "{{obj}}"}}', "expected_result": 2})
        assert not op.passed and "MongoDB operators" in op.message
    finally:
        ctx.close()
