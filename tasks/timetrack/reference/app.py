"""TimeTrack reference implementation (standard library only).

A small multi-user time-tracking service: customers, projects, activities, timesheets with a
running timer, hourly rates, reports and CSV export. It implements the contract in
../task.md and is the oracle the task's validation DAG is checked against.

Layout of this file:
  1. configuration and time/money helpers
  2. database schema and seed data
  3. HTTP plumbing (request object, errors, routing, pagination)
  4. authentication (login, tokens)
  5. permissions
  6. handlers per resource: users, teams, customers, projects, activities, timesheets
  7. reports and CSV export
  8. server start
"""

from __future__ import annotations

import csv
import datetime as dt
import hashlib
import hmac
import io
import json
import os
import re
import secrets
import sqlite3
import sys
import threading
from decimal import ROUND_HALF_UP, Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

# --- 1. configuration and helpers ------------------------------------------------------------
VERSION = "1.0.0"
DEFAULT_PAGE_SIZE = 25
MAX_PAGE_SIZE = 100
CLOCK_SKEW_S = 60          # an entry may start/end at most this far in the future
MAX_ENTRY_S = 24 * 3600    # a single entry lasts at most 24 hours
ROLES = ("admin", "teamlead", "user")
PBKDF2_ROUNDS = 60_000

SEED_TEAM = "Team Alpha"
SEED_USERS = [  # username, password, role, hourly_rate, in the seed team
    ("admin", "admin-pass-1", "admin", 100.0, False),
    ("lead", "lead-pass-1", "teamlead", 80.0, True),
    ("user", "user-pass-1", "user", 50.0, True),
]


def now_utc() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc).replace(microsecond=0)


def fmt_time(value: dt.datetime) -> str:
    return value.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value, field: str) -> dt.datetime:
    """ISO 8601 with an offset or Z; a naive value is taken as UTC. Seconds precision."""
    if not isinstance(value, str) or not value.strip():
        raise ApiError(422, "validation_error", f"{field} must be an ISO 8601 date-time", field)
    text = value.strip()
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    try:
        parsed = dt.datetime.fromisoformat(text)
    except ValueError:
        raise ApiError(422, "validation_error", f"{field} must be an ISO 8601 date-time", field) from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.timezone.utc)
    return parsed.astimezone(dt.timezone.utc).replace(microsecond=0)


def money(duration_seconds: int, rate: float) -> float:
    """duration_hours x rate, rounded half-up to cents."""
    value = Decimal(duration_seconds) / Decimal(3600) * Decimal(str(rate))
    return float(value.quantize(Decimal("0.01"), rounding=ROUND_HALF_UP))


def hash_password(password: str, salt: str | None = None) -> str:
    salt = salt or secrets.token_hex(8)
    digest = hashlib.pbkdf2_hmac("sha256", password.encode(), salt.encode(), PBKDF2_ROUNDS).hex()
    return f"pbkdf2_sha256${PBKDF2_ROUNDS}${salt}${digest}"


def check_password(password: str, stored: str) -> bool:
    try:
        _, rounds, salt, digest = stored.split("$")
    except ValueError:
        return False
    candidate = hashlib.pbkdf2_hmac("sha256", password.encode(), salt.encode(), int(rounds)).hex()
    return hmac.compare_digest(candidate, digest)


# --- 2. database ---------------------------------------------------------------------------------
SCHEMA = """
CREATE TABLE IF NOT EXISTS teams (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    name        TEXT NOT NULL UNIQUE COLLATE NOCASE,
    lead_id     INTEGER,
    created_at  TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS users (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    username      TEXT NOT NULL UNIQUE COLLATE NOCASE,
    password_hash TEXT NOT NULL,
    role          TEXT NOT NULL CHECK (role IN ('admin', 'teamlead', 'user')),
    team_id       INTEGER REFERENCES teams(id),
    hourly_rate   REAL NOT NULL DEFAULT 0,
    active        INTEGER NOT NULL DEFAULT 1,
    created_at    TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS sessions (
    token_hash  TEXT PRIMARY KEY,
    user_id     INTEGER NOT NULL REFERENCES users(id),
    created_at  TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS customers (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    name          TEXT NOT NULL UNIQUE COLLATE NOCASE,
    team_id       INTEGER REFERENCES teams(id),
    contact_email TEXT,
    currency      TEXT NOT NULL DEFAULT 'EUR',
    hourly_rate   REAL,
    visible       INTEGER NOT NULL DEFAULT 1,
    created_at    TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS projects (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    customer_id  INTEGER NOT NULL REFERENCES customers(id),
    name         TEXT NOT NULL,
    description  TEXT NOT NULL DEFAULT '',
    hourly_rate  REAL,
    visible      INTEGER NOT NULL DEFAULT 1,
    created_at   TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS activities (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    project_id   INTEGER REFERENCES projects(id),
    name         TEXT NOT NULL,
    hourly_rate  REAL,
    visible      INTEGER NOT NULL DEFAULT 1,
    created_at   TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS timesheets (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    user_id          INTEGER NOT NULL REFERENCES users(id),
    project_id       INTEGER NOT NULL REFERENCES projects(id),
    activity_id      INTEGER NOT NULL REFERENCES activities(id),
    description      TEXT NOT NULL DEFAULT '',
    begin_at         TEXT NOT NULL,
    end_at           TEXT,
    duration_seconds INTEGER,
    hourly_rate      REAL NOT NULL DEFAULT 0,
    amount           REAL,
    billable         INTEGER NOT NULL DEFAULT 1,
    created_at       TEXT NOT NULL,
    updated_at       TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS ix_timesheets_user_begin ON timesheets(user_id, begin_at);
CREATE INDEX IF NOT EXISTS ix_timesheets_project ON timesheets(project_id);
CREATE UNIQUE INDEX IF NOT EXISTS ux_timesheets_running ON timesheets(user_id) WHERE end_at IS NULL;
"""


def open_db(path: str) -> sqlite3.Connection:
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
    conn.row_factory = sqlite3.Row
    conn.execute("PRAGMA foreign_keys = ON")
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA busy_timeout = 5000")
    conn.executescript(SCHEMA)
    seed(conn)
    return conn


def seed(conn: sqlite3.Connection) -> None:
    """Create the seed team and the three evaluation users once (idempotent)."""
    stamp = fmt_time(now_utc())
    team = conn.execute("SELECT id FROM teams WHERE name = ?", (SEED_TEAM,)).fetchone()
    team_id = team["id"] if team else conn.execute(
        "INSERT INTO teams (name, created_at) VALUES (?, ?)", (SEED_TEAM, stamp)).lastrowid
    for username, password, role, rate, in_team in SEED_USERS:
        row = conn.execute("SELECT id FROM users WHERE username = ?", (username,)).fetchone()
        if row is None:
            uid = conn.execute(
                "INSERT INTO users (username, password_hash, role, team_id, hourly_rate, created_at) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (username, hash_password(password), role, team_id if in_team else None, rate, stamp)).lastrowid
            if role == "teamlead":
                conn.execute("UPDATE teams SET lead_id = ? WHERE id = ? AND lead_id IS NULL", (uid, team_id))


# --- 3. HTTP plumbing ----------------------------------------------------------------------------
class ApiError(Exception):
    def __init__(self, status: int, error: str, message: str, field: str | None = None, **extra):
        super().__init__(message)
        self.status, self.error, self.message, self.field, self.extra = status, error, message, field, extra

    def body(self) -> dict:
        out = {"error": self.error, "message": self.message}
        if self.field:
            out["field"] = self.field
        out.update(self.extra)
        return out


def not_found(what: str) -> ApiError:
    return ApiError(404, "not_found", f"{what} not found")


def forbidden(message: str = "you are not allowed to do this") -> ApiError:
    return ApiError(403, "forbidden", message)


def invalid(field: str, message: str) -> ApiError:
    return ApiError(422, "validation_error", message, field)


class Request:
    def __init__(self, method: str, path: str, query: dict, body, headers, db: sqlite3.Connection):
        self.method, self.path, self.query, self.body, self.headers, self.db = method, path, query, body, headers, db
        self.user: sqlite3.Row | None = None

    def q(self, name: str, default=None):
        values = self.query.get(name)
        return values[0] if values else default

    def q_int(self, name: str):
        raw = self.q(name)
        if raw is None or raw == "":
            return None
        try:
            return int(raw)
        except ValueError:
            raise invalid(name, f"{name} must be an integer") from None

    def json_object(self) -> dict:
        if not isinstance(self.body, dict):
            raise ApiError(400, "bad_request", "the request body must be a JSON object")
        return self.body


ROUTES: list[tuple[str, re.Pattern, object, bool]] = []


def route(method: str, pattern: str, *, public: bool = False):
    regex = re.compile("^" + re.sub(r"{(\w+)}", r"(?P<\1>\\d+)", pattern) + "$")

    def register(fn):
        ROUTES.append((method, regex, fn, public))
        return fn
    return register


def paginate(req: Request, sql: str, params: list, to_json) -> dict:
    page, size = req.q("page", "1"), req.q("page_size", str(DEFAULT_PAGE_SIZE))
    try:
        page = int(page)
    except ValueError:
        raise invalid("page", "page must be a positive integer") from None
    try:
        size = int(size)
    except ValueError:
        raise invalid("page_size", "page_size must be a positive integer") from None
    if page < 1:
        raise invalid("page", "page must be a positive integer")
    if size < 1:
        raise invalid("page_size", "page_size must be a positive integer")
    size = min(size, MAX_PAGE_SIZE)
    total = req.db.execute(f"SELECT COUNT(*) FROM ({sql})", params).fetchone()[0]
    rows = req.db.execute(f"{sql} LIMIT ? OFFSET ?", [*params, size, (page - 1) * size]).fetchall()
    return {"items": [to_json(req, r) for r in rows], "page": page, "page_size": size, "total": total}


def visible_filter(req: Request, column: str = "visible") -> tuple[str, list]:
    value = req.q("visible", "1")
    if value == "all":
        return "", []
    if value in ("1", "true"):
        return f" AND {column} = 1", []
    if value in ("0", "false"):
        return f" AND {column} = 0", []
    raise invalid("visible", "visible must be 1, 0 or all")


# --- field validation helpers
def req_name(body: dict, field: str = "name", required: bool = True):
    if field not in body and not required:
        return None
    value = body.get(field)
    if not isinstance(value, str) or not value.strip():
        raise invalid(field, f"{field} is required")
    if len(value.strip()) > 150:
        raise invalid(field, f"{field} is longer than 150 characters")
    return value.strip()


def opt_rate(body: dict, field: str = "hourly_rate"):
    value = body.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise invalid(field, f"{field} must be a number >= 0 or null")
    return float(value)


def opt_bool(body: dict, field: str, default: bool) -> bool:
    value = body.get(field, default)
    if not isinstance(value, bool):
        raise invalid(field, f"{field} must be true or false")
    return value


def ref_id(req: Request, body: dict, field: str, table: str, required: bool = True):
    value = body.get(field)
    if value is None:
        if required:
            raise invalid(field, f"{field} is required")
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(field, f"{field} must be an integer id")
    row = req.db.execute(f"SELECT * FROM {table} WHERE id = ?", (value,)).fetchone()
    if row is None:
        raise invalid(field, f"{field} {value} does not exist")
    return row


def get_row(req: Request, table: str, row_id: int, what: str) -> sqlite3.Row:
    row = req.db.execute(f"SELECT * FROM {table} WHERE id = ?", (row_id,)).fetchone()
    if row is None:
        raise not_found(what)
    return row


def update_sql(req: Request, table: str, row_id: int, changes: dict) -> None:
    if changes:
        cols = ", ".join(f"{k} = ?" for k in changes)
        req.db.execute(f"UPDATE {table} SET {cols} WHERE id = ?", [*changes.values(), row_id])


# --- 4. authentication ---------------------------------------------------------------------------
def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def authenticate(req: Request) -> None:
    header = req.headers.get("Authorization", "")
    if not header.startswith("Bearer "):
        raise ApiError(401, "unauthorized", "a Bearer token is required")
    row = req.db.execute(
        "SELECT u.* FROM sessions s JOIN users u ON u.id = s.user_id WHERE s.token_hash = ? AND u.active = 1",
        (token_hash(header[7:].strip()),)).fetchone()
    if row is None:
        raise ApiError(401, "unauthorized", "the token is invalid or expired")
    req.user = row


def user_json(_req, row: sqlite3.Row) -> dict:
    return {"id": row["id"], "username": row["username"], "role": row["role"], "team_id": row["team_id"],
            "hourly_rate": row["hourly_rate"], "active": bool(row["active"]), "created_at": row["created_at"]}


@route("GET", "/api/health", public=True)
def health(req: Request):
    req.db.execute("SELECT 1").fetchone()
    return 200, {"status": "ok", "version": VERSION, "database": "ok"}


@route("POST", "/api/auth/login", public=True)
def login(req: Request):
    body = req.json_object()
    username, password = body.get("username"), body.get("password")
    if not isinstance(username, str) or not username:
        raise invalid("username", "username is required")
    if not isinstance(password, str) or not password:
        raise invalid("password", "password is required")
    row = req.db.execute("SELECT * FROM users WHERE username = ? AND active = 1", (username,)).fetchone()
    if row is None or not check_password(password, row["password_hash"]):
        raise ApiError(401, "invalid_credentials", "wrong username or password")
    token = secrets.token_urlsafe(32)
    req.db.execute("INSERT INTO sessions (token_hash, user_id, created_at) VALUES (?, ?, ?)",
                   (token_hash(token), row["id"], fmt_time(now_utc())))
    return 200, {"token": token, "token_type": "Bearer", "user": user_json(req, row)}


@route("POST", "/api/auth/logout")
def logout(req: Request):
    token = req.headers.get("Authorization", "")[7:].strip()
    req.db.execute("DELETE FROM sessions WHERE token_hash = ?", (token_hash(token),))
    return 204, None


@route("GET", "/api/me")
def me(req: Request):
    return 200, user_json(req, req.user)


# --- 5. permissions ------------------------------------------------------------------------------
def is_admin(user) -> bool:
    return user["role"] == "admin"


def require_admin(req: Request) -> None:
    if not is_admin(req.user):
        raise forbidden("only admins may do this")


def lead_of(user, team_id) -> bool:
    return user["role"] == "teamlead" and team_id is not None and user["team_id"] == team_id


def can_manage_customer(user, customer) -> bool:
    return is_admin(user) or lead_of(user, customer["team_id"])


def project_team(req: Request, project) -> int | None:
    return req.db.execute("SELECT team_id FROM customers WHERE id = ?", (project["customer_id"],)).fetchone()[0]


def can_manage_project(req: Request, project) -> bool:
    return is_admin(req.user) or lead_of(req.user, project_team(req, project))


def can_see_user_entries(req: Request, owner_id: int) -> bool:
    """admin: everyone; teamlead: self and members of their team; user: self."""
    user = req.user
    if is_admin(user) or owner_id == user["id"]:
        return True
    if user["role"] == "teamlead" and user["team_id"] is not None:
        owner = req.db.execute("SELECT team_id FROM users WHERE id = ?", (owner_id,)).fetchone()
        return owner is not None and owner["team_id"] == user["team_id"]
    return False


def timesheet_scope(req: Request) -> tuple[str, list]:
    """SQL condition (on alias t) limiting timesheets to those the caller may see."""
    user = req.user
    if is_admin(user):
        return "1 = 1", []
    if user["role"] == "teamlead" and user["team_id"] is not None:
        return "(t.user_id = ? OR t.user_id IN (SELECT id FROM users WHERE team_id = ?))", [user["id"], user["team_id"]]
    return "t.user_id = ?", [user["id"]]


# --- 6. handlers: users and teams ----------------------------------------------------------------
@route("GET", "/api/users")
def list_users(req: Request):
    if is_admin(req.user):
        return 200, paginate(req, "SELECT * FROM users ORDER BY id", [], user_json)
    if req.user["role"] == "teamlead" and req.user["team_id"] is not None:
        return 200, paginate(req, "SELECT * FROM users WHERE team_id = ? ORDER BY id", [req.user["team_id"]], user_json)
    raise forbidden("only admins and team leads may list users")


@route("POST", "/api/users")
def create_user(req: Request):
    require_admin(req)
    body = req.json_object()
    username = req_name(body, "username")
    password = body.get("password")
    if not isinstance(password, str) or len(password) < 8:
        raise invalid("password", "password must have at least 8 characters")
    role = body.get("role", "user")
    if role not in ROLES:
        raise invalid("role", "role must be admin, teamlead or user")
    team = ref_id(req, body, "team_id", "teams", required=False)
    rate = opt_rate(body) or 0.0
    if req.db.execute("SELECT 1 FROM users WHERE username = ?", (username,)).fetchone():
        raise ApiError(409, "duplicate", f"user {username!r} already exists")
    uid = req.db.execute(
        "INSERT INTO users (username, password_hash, role, team_id, hourly_rate, created_at) VALUES (?, ?, ?, ?, ?, ?)",
        (username, hash_password(password), role, team["id"] if team else None, rate, fmt_time(now_utc()))).lastrowid
    return 201, user_json(req, get_row(req, "users", uid, "user"))


@route("GET", "/api/users/{id}")
def get_user(req: Request, id: int):
    row = get_row(req, "users", id, "user")
    if not (is_admin(req.user) or row["id"] == req.user["id"] or lead_of(req.user, row["team_id"])):
        raise forbidden()
    return 200, user_json(req, row)


@route("PATCH", "/api/users/{id}")
def update_user(req: Request, id: int):
    require_admin(req)
    get_row(req, "users", id, "user")
    body, changes = req.json_object(), {}
    if "role" in body:
        if body["role"] not in ROLES:
            raise invalid("role", "role must be admin, teamlead or user")
        changes["role"] = body["role"]
    if "team_id" in body:
        team = ref_id(req, body, "team_id", "teams", required=False)
        changes["team_id"] = team["id"] if team else None
    if "hourly_rate" in body:
        changes["hourly_rate"] = opt_rate(body) or 0.0
    if "active" in body:
        changes["active"] = int(opt_bool(body, "active", True))
    if "password" in body:
        if not isinstance(body["password"], str) or len(body["password"]) < 8:
            raise invalid("password", "password must have at least 8 characters")
        changes["password_hash"] = hash_password(body["password"])
    update_sql(req, "users", id, changes)
    return 200, user_json(req, get_row(req, "users", id, "user"))


def team_json(req: Request, row) -> dict:
    members = [r[0] for r in req.db.execute("SELECT id FROM users WHERE team_id = ? ORDER BY id", (row["id"],))]
    return {"id": row["id"], "name": row["name"], "lead_id": row["lead_id"], "member_ids": members,
            "created_at": row["created_at"]}


@route("GET", "/api/teams")
def list_teams(req: Request):
    if is_admin(req.user):
        return 200, paginate(req, "SELECT * FROM teams ORDER BY id", [], team_json)
    return 200, paginate(req, "SELECT * FROM teams WHERE id = ? ORDER BY id", [req.user["team_id"]], team_json)


@route("POST", "/api/teams")
def create_team(req: Request):
    require_admin(req)
    body = req.json_object()
    name = req_name(body)
    lead = ref_id(req, body, "lead_id", "users", required=False)
    if req.db.execute("SELECT 1 FROM teams WHERE name = ?", (name,)).fetchone():
        raise ApiError(409, "duplicate", f"team {name!r} already exists")
    tid = req.db.execute("INSERT INTO teams (name, lead_id, created_at) VALUES (?, ?, ?)",
                         (name, lead["id"] if lead else None, fmt_time(now_utc()))).lastrowid
    if lead:
        req.db.execute("UPDATE users SET team_id = ? WHERE id = ?", (tid, lead["id"]))
    return 201, team_json(req, get_row(req, "teams", tid, "team"))


@route("GET", "/api/teams/{id}")
def get_team(req: Request, id: int):
    row = get_row(req, "teams", id, "team")
    if not (is_admin(req.user) or req.user["team_id"] == id):
        raise forbidden()
    return 200, team_json(req, row)


# --- 6. handlers: customers ----------------------------------------------------------------------
def customer_json(_req, row) -> dict:
    return {"id": row["id"], "name": row["name"], "team_id": row["team_id"], "contact_email": row["contact_email"],
            "currency": row["currency"], "hourly_rate": row["hourly_rate"], "visible": bool(row["visible"]),
            "created_at": row["created_at"]}


@route("GET", "/api/customers")
def list_customers(req: Request):
    cond, params = visible_filter(req)
    q = req.q("q")
    if q:
        cond += " AND name LIKE ?"
        params.append(f"%{q}%")
    team_id = req.q_int("team_id")
    if team_id is not None:
        cond += " AND team_id = ?"
        params.append(team_id)
    return 200, paginate(req, f"SELECT * FROM customers WHERE 1 = 1{cond} ORDER BY id", params, customer_json)


def customer_fields(req: Request, body: dict, creating: bool) -> dict:
    out = {}
    if creating or "name" in body:
        out["name"] = req_name(body)
    if "team_id" in body:
        team = ref_id(req, body, "team_id", "teams", required=False)
        out["team_id"] = team["id"] if team else None
    if "contact_email" in body:
        email = body["contact_email"]
        if email is not None and (not isinstance(email, str) or "@" not in email):
            raise invalid("contact_email", "contact_email must be an e-mail address")
        out["contact_email"] = email
    if "currency" in body:
        if not isinstance(body["currency"], str) or not re.fullmatch(r"[A-Z]{3}", body["currency"]):
            raise invalid("currency", "currency must be a 3-letter ISO code")
        out["currency"] = body["currency"]
    if "hourly_rate" in body:
        out["hourly_rate"] = opt_rate(body)
    if "visible" in body:
        out["visible"] = int(opt_bool(body, "visible", True))
    return out


def check_customer_name(req: Request, name: str, exclude_id: int = 0) -> None:
    if req.db.execute("SELECT 1 FROM customers WHERE name = ? AND id != ?", (name, exclude_id)).fetchone():
        raise ApiError(409, "duplicate", f"customer {name!r} already exists")


@route("POST", "/api/customers")
def create_customer(req: Request):
    body = req.json_object()
    fields = customer_fields(req, body, creating=True)
    if req.user["role"] == "teamlead":
        fields.setdefault("team_id", req.user["team_id"])
    if not can_manage_customer(req.user, {"team_id": fields.get("team_id")}):
        raise forbidden("only admins and the team's lead may create customers")
    check_customer_name(req, fields["name"])
    fields["created_at"] = fmt_time(now_utc())
    cols = ", ".join(fields)
    cid = req.db.execute(f"INSERT INTO customers ({cols}) VALUES ({', '.join('?' * len(fields))})",
                         list(fields.values())).lastrowid
    return 201, customer_json(req, get_row(req, "customers", cid, "customer"))


@route("GET", "/api/customers/{id}")
def get_customer(req: Request, id: int):
    return 200, customer_json(req, get_row(req, "customers", id, "customer"))


@route("PATCH", "/api/customers/{id}")
def update_customer(req: Request, id: int):
    row = get_row(req, "customers", id, "customer")
    if not can_manage_customer(req.user, row):
        raise forbidden("only admins and the team's lead may change this customer")
    fields = customer_fields(req, req.json_object(), creating=False)
    if "team_id" in fields and not can_manage_customer(req.user, {"team_id": fields["team_id"]}):
        raise forbidden("a team lead cannot move a customer to another team")
    if "name" in fields:
        check_customer_name(req, fields["name"], id)
    update_sql(req, "customers", id, fields)
    return 200, customer_json(req, get_row(req, "customers", id, "customer"))


@route("DELETE", "/api/customers/{id}")
def delete_customer(req: Request, id: int):
    row = get_row(req, "customers", id, "customer")
    if not can_manage_customer(req.user, row):
        raise forbidden("only admins and the team's lead may delete this customer")
    if req.db.execute("SELECT 1 FROM projects WHERE customer_id = ?", (id,)).fetchone():
        raise ApiError(409, "has_dependents", "the customer has projects; hide it (visible=false) instead")
    req.db.execute("DELETE FROM customers WHERE id = ?", (id,))
    return 204, None


# --- 6. handlers: projects -----------------------------------------------------------------------
def project_json(_req, row) -> dict:
    return {"id": row["id"], "customer_id": row["customer_id"], "name": row["name"], "description": row["description"],
            "hourly_rate": row["hourly_rate"], "visible": bool(row["visible"]), "created_at": row["created_at"]}


@route("GET", "/api/projects")
def list_projects(req: Request):
    cond, params = visible_filter(req)
    customer_id = req.q_int("customer_id")
    if customer_id is not None:
        cond += " AND customer_id = ?"
        params.append(customer_id)
    q = req.q("q")
    if q:
        cond += " AND name LIKE ?"
        params.append(f"%{q}%")
    return 200, paginate(req, f"SELECT * FROM projects WHERE 1 = 1{cond} ORDER BY id", params, project_json)


def project_fields(req: Request, body: dict, creating: bool) -> dict:
    out = {}
    if creating or "name" in body:
        out["name"] = req_name(body)
    if creating or "customer_id" in body:
        out["customer_id"] = ref_id(req, body, "customer_id", "customers")["id"]
    if "description" in body:
        if not isinstance(body["description"], str):
            raise invalid("description", "description must be a string")
        out["description"] = body["description"]
    if "hourly_rate" in body:
        out["hourly_rate"] = opt_rate(body)
    if "visible" in body:
        out["visible"] = int(opt_bool(body, "visible", True))
    return out


def check_project_name(req: Request, customer_id: int, name: str, exclude_id: int = 0) -> None:
    if req.db.execute("SELECT 1 FROM projects WHERE customer_id = ? AND name = ? COLLATE NOCASE AND id != ?",
                      (customer_id, name, exclude_id)).fetchone():
        raise ApiError(409, "duplicate", f"project {name!r} already exists for this customer")


@route("POST", "/api/projects")
def create_project(req: Request):
    fields = project_fields(req, req.json_object(), creating=True)
    if not can_manage_project(req, fields):
        raise forbidden("only admins and the customer's team lead may create projects")
    check_project_name(req, fields["customer_id"], fields["name"])
    fields["created_at"] = fmt_time(now_utc())
    pid = req.db.execute(f"INSERT INTO projects ({', '.join(fields)}) VALUES ({', '.join('?' * len(fields))})",
                         list(fields.values())).lastrowid
    return 201, project_json(req, get_row(req, "projects", pid, "project"))


@route("GET", "/api/projects/{id}")
def get_project(req: Request, id: int):
    return 200, project_json(req, get_row(req, "projects", id, "project"))


@route("PATCH", "/api/projects/{id}")
def update_project(req: Request, id: int):
    row = get_row(req, "projects", id, "project")
    if not can_manage_project(req, row):
        raise forbidden("only admins and the customer's team lead may change this project")
    fields = project_fields(req, req.json_object(), creating=False)
    if "customer_id" in fields and not can_manage_project(req, fields):
        raise forbidden("a team lead cannot move a project to another team's customer")
    if "name" in fields or "customer_id" in fields:
        check_project_name(req, fields.get("customer_id", row["customer_id"]), fields.get("name", row["name"]), id)
    update_sql(req, "projects", id, fields)
    return 200, project_json(req, get_row(req, "projects", id, "project"))


@route("DELETE", "/api/projects/{id}")
def delete_project(req: Request, id: int):
    row = get_row(req, "projects", id, "project")
    if not can_manage_project(req, row):
        raise forbidden("only admins and the customer's team lead may delete this project")
    if req.db.execute("SELECT 1 FROM timesheets WHERE project_id = ?", (id,)).fetchone():
        raise ApiError(409, "has_dependents", "the project has timesheets; hide it (visible=false) instead")
    req.db.execute("DELETE FROM activities WHERE project_id = ?", (id,))
    req.db.execute("DELETE FROM projects WHERE id = ?", (id,))
    return 204, None


# --- 6. handlers: activities ---------------------------------------------------------------------
def activity_json(_req, row) -> dict:
    return {"id": row["id"], "project_id": row["project_id"], "name": row["name"], "hourly_rate": row["hourly_rate"],
            "visible": bool(row["visible"]), "created_at": row["created_at"]}


def can_manage_activity(req: Request, project_id) -> bool:
    if project_id is None:
        return is_admin(req.user)  # global activities are admin-only
    return can_manage_project(req, get_row(req, "projects", project_id, "project"))


@route("GET", "/api/activities")
def list_activities(req: Request):
    cond, params = visible_filter(req)
    project_id = req.q_int("project_id")
    if project_id is not None:
        cond += " AND (project_id = ? OR project_id IS NULL)"
        params.append(project_id)
    return 200, paginate(req, f"SELECT * FROM activities WHERE 1 = 1{cond} ORDER BY id", params, activity_json)


@route("POST", "/api/activities")
def create_activity(req: Request):
    body = req.json_object()
    name = req_name(body)
    project = ref_id(req, body, "project_id", "projects", required=False)
    rate = opt_rate(body)
    if not can_manage_activity(req, project["id"] if project else None):
        raise forbidden("only admins create global activities; team leads create activities of their projects")
    dup = req.db.execute("SELECT 1 FROM activities WHERE name = ? COLLATE NOCASE AND project_id IS ?",
                         (name, project["id"] if project else None)).fetchone()
    if dup:
        raise ApiError(409, "duplicate", f"activity {name!r} already exists")
    aid = req.db.execute("INSERT INTO activities (project_id, name, hourly_rate, created_at) VALUES (?, ?, ?, ?)",
                         (project["id"] if project else None, name, rate, fmt_time(now_utc()))).lastrowid
    return 201, activity_json(req, get_row(req, "activities", aid, "activity"))


@route("GET", "/api/activities/{id}")
def get_activity(req: Request, id: int):
    return 200, activity_json(req, get_row(req, "activities", id, "activity"))


@route("PATCH", "/api/activities/{id}")
def update_activity(req: Request, id: int):
    row = get_row(req, "activities", id, "activity")
    if not can_manage_activity(req, row["project_id"]):
        raise forbidden()
    body, changes = req.json_object(), {}
    if "name" in body:
        changes["name"] = req_name(body)
    if "hourly_rate" in body:
        changes["hourly_rate"] = opt_rate(body)
    if "visible" in body:
        changes["visible"] = int(opt_bool(body, "visible", True))
    update_sql(req, "activities", id, changes)
    return 200, activity_json(req, get_row(req, "activities", id, "activity"))


@route("DELETE", "/api/activities/{id}")
def delete_activity(req: Request, id: int):
    row = get_row(req, "activities", id, "activity")
    if not can_manage_activity(req, row["project_id"]):
        raise forbidden()
    if req.db.execute("SELECT 1 FROM timesheets WHERE activity_id = ?", (id,)).fetchone():
        raise ApiError(409, "has_dependents", "the activity has timesheets; hide it (visible=false) instead")
    req.db.execute("DELETE FROM activities WHERE id = ?", (id,))
    return 204, None


# --- 6. handlers: timesheets ---------------------------------------------------------------------
TIMESHEET_FROM = """FROM timesheets t JOIN users u ON u.id = t.user_id JOIN projects p ON p.id = t.project_id
JOIN customers c ON c.id = p.customer_id JOIN activities a ON a.id = t.activity_id"""
TIMESHEET_SELECT = ("SELECT t.*, u.username, p.name AS project_name, p.customer_id, c.name AS customer_name, "
                    "a.name AS activity_name " + TIMESHEET_FROM)


def timesheet_json(_req, row) -> dict:
    return {"id": row["id"], "user_id": row["user_id"], "username": row["username"], "customer_id": row["customer_id"],
            "project_id": row["project_id"], "activity_id": row["activity_id"], "description": row["description"],
            "begin": row["begin_at"], "end": row["end_at"], "duration_seconds": row["duration_seconds"],
            "hourly_rate": row["hourly_rate"], "amount": row["amount"], "billable": bool(row["billable"]),
            "running": row["end_at"] is None, "created_at": row["created_at"], "updated_at": row["updated_at"]}


def load_timesheet(req: Request, id: int) -> sqlite3.Row:
    row = req.db.execute(TIMESHEET_SELECT + " WHERE t.id = ?", (id,)).fetchone()
    if row is None:
        raise not_found("timesheet")
    if not can_see_user_entries(req, row["user_id"]):
        raise forbidden("this timesheet belongs to someone else")
    return row


def resolve_rate(req: Request, user_id: int, project, activity) -> float:
    """Rate precedence: activity > project > customer > the user's default rate."""
    if activity["hourly_rate"] is not None:
        return activity["hourly_rate"]
    if project["hourly_rate"] is not None:
        return project["hourly_rate"]
    customer = req.db.execute("SELECT hourly_rate FROM customers WHERE id = ?", (project["customer_id"],)).fetchone()
    if customer["hourly_rate"] is not None:
        return customer["hourly_rate"]
    return req.db.execute("SELECT hourly_rate FROM users WHERE id = ?", (user_id,)).fetchone()[0]


def booking_target(req: Request, body: dict, current=None):
    """The project and activity of a new or changed entry, checked for existence and visibility."""
    project = ref_id(req, body, "project_id", "projects") if current is None or "project_id" in body else \
        get_row(req, "projects", current["project_id"], "project")
    activity = ref_id(req, body, "activity_id", "activities") if current is None or "activity_id" in body else \
        get_row(req, "activities", current["activity_id"], "activity")
    customer = get_row(req, "customers", project["customer_id"], "customer")
    if not project["visible"] or not customer["visible"]:
        raise invalid("project_id", "the project or its customer is hidden; no time can be booked on it")
    if not activity["visible"]:
        raise invalid("activity_id", "the activity is hidden; no time can be booked on it")
    if activity["project_id"] is not None and activity["project_id"] != project["id"]:
        raise invalid("activity_id", "the activity belongs to another project")
    return project, activity


def entry_owner(req: Request, body: dict) -> int:
    owner_id = body.get("user_id", req.user["id"])
    if owner_id is None:
        owner_id = req.user["id"]
    if isinstance(owner_id, bool) or not isinstance(owner_id, int):
        raise invalid("user_id", "user_id must be an integer id")
    if owner_id != req.user["id"]:
        if req.db.execute("SELECT 1 FROM users WHERE id = ?", (owner_id,)).fetchone() is None:
            raise invalid("user_id", f"user_id {owner_id} does not exist")
        if not can_see_user_entries(req, owner_id):
            raise forbidden("you may only book time for yourself" if req.user["role"] == "user"
                            else "you may only book time for members of your team")
    return owner_id


def check_interval(begin: dt.datetime, end: dt.datetime | None) -> int | None:
    limit = now_utc() + dt.timedelta(seconds=CLOCK_SKEW_S)
    if begin > limit:
        raise invalid("begin", "begin lies in the future")
    if end is None:
        return None
    if end <= begin:
        raise invalid("end", "end must be after begin")
    if end > limit:
        raise invalid("end", "end lies in the future")
    duration = int((end - begin).total_seconds())
    if duration > MAX_ENTRY_S:
        raise invalid("end", "an entry may last at most 24 hours")
    return duration


@route("GET", "/api/timesheets")
def list_timesheets(req: Request):
    cond, params = timesheet_filters(req)
    return 200, paginate(req, f"{TIMESHEET_SELECT} WHERE {cond} ORDER BY t.begin_at DESC, t.id DESC", params,
                         timesheet_json)


def timesheet_filters(req: Request) -> tuple[str, list]:
    cond, params = timesheet_scope(req)
    for name, column in (("user_id", "t.user_id"), ("project_id", "t.project_id"),
                         ("activity_id", "t.activity_id"), ("customer_id", "p.customer_id")):
        value = req.q_int(name)
        if value is not None:
            cond += f" AND {column} = ?"
            params.append(value)
    for name, op in (("begin", ">="), ("end", "<")):
        value = req.q(name)
        if value:
            cond += f" AND t.begin_at {op} ?"
            params.append(fmt_time(parse_time(value, name)))
    running = req.q("running")
    if running in ("true", "1"):
        cond += " AND t.end_at IS NULL"
    elif running in ("false", "0"):
        cond += " AND t.end_at IS NOT NULL"
    return cond, params


@route("POST", "/api/timesheets")
def create_timesheet(req: Request):
    body = req.json_object()
    owner_id = entry_owner(req, body)
    project, activity = booking_target(req, body)
    begin = parse_time(body.get("begin"), "begin")
    if body.get("end") is None:
        raise invalid("end", "end is required; use POST /api/timesheets/start for a running timer")
    end = parse_time(body.get("end"), "end")
    duration = check_interval(begin, end)
    description = body.get("description", "")
    if not isinstance(description, str):
        raise invalid("description", "description must be a string")
    billable = opt_bool(body, "billable", True)
    rate = resolve_rate(req, owner_id, project, activity)
    amount = money(duration, rate) if billable else 0.0
    stamp = fmt_time(now_utc())
    tid = req.db.execute(
        "INSERT INTO timesheets (user_id, project_id, activity_id, description, begin_at, end_at, duration_seconds, "
        "hourly_rate, amount, billable, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (owner_id, project["id"], activity["id"], description, fmt_time(begin), fmt_time(end), duration, rate,
         amount, int(billable), stamp, stamp)).lastrowid
    return 201, timesheet_json(req, load_timesheet(req, tid))


@route("POST", "/api/timesheets/start")
def start_timer(req: Request):
    body = req.json_object()
    project, activity = booking_target(req, body)
    running = req.db.execute("SELECT id FROM timesheets WHERE user_id = ? AND end_at IS NULL",
                             (req.user["id"],)).fetchone()
    if running is not None:
        raise ApiError(409, "timer_running", "you already have a running timer; stop it first",
                       running_id=running["id"])
    description = body.get("description", "")
    if not isinstance(description, str):
        raise invalid("description", "description must be a string")
    billable = opt_bool(body, "billable", True)
    rate = resolve_rate(req, req.user["id"], project, activity)
    stamp = fmt_time(now_utc())
    tid = req.db.execute(
        "INSERT INTO timesheets (user_id, project_id, activity_id, description, begin_at, hourly_rate, billable, "
        "created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (req.user["id"], project["id"], activity["id"], description, stamp, rate, int(billable), stamp, stamp),
    ).lastrowid
    return 201, timesheet_json(req, load_timesheet(req, tid))


@route("GET", "/api/timesheets/active")
def active_timers(req: Request):
    rows = req.db.execute(TIMESHEET_SELECT + " WHERE t.user_id = ? AND t.end_at IS NULL ORDER BY t.id",
                          (req.user["id"],)).fetchall()
    return 200, [timesheet_json(req, r) for r in rows]


@route("POST", "/api/timesheets/{id}/stop")
def stop_timer(req: Request, id: int):
    row = load_timesheet(req, id)
    if row["end_at"] is not None:
        raise ApiError(409, "not_running", "this timesheet is not running")
    begin = parse_time(row["begin_at"], "begin")
    end = max(now_utc(), begin)
    duration = int((end - begin).total_seconds())
    amount = money(duration, row["hourly_rate"]) if row["billable"] else 0.0
    req.db.execute("UPDATE timesheets SET end_at = ?, duration_seconds = ?, amount = ?, updated_at = ? WHERE id = ?",
                   (fmt_time(end), duration, amount, fmt_time(now_utc()), id))
    return 200, timesheet_json(req, load_timesheet(req, id))


@route("GET", "/api/timesheets/{id}")
def get_timesheet(req: Request, id: int):
    return 200, timesheet_json(req, load_timesheet(req, id))


@route("PATCH", "/api/timesheets/{id}")
def update_timesheet(req: Request, id: int):
    row = load_timesheet(req, id)
    body = req.json_object()
    if "user_id" in body and body["user_id"] != row["user_id"]:
        raise invalid("user_id", "the owner of a timesheet cannot change")
    project, activity = booking_target(req, body, current=row)
    begin = parse_time(body["begin"], "begin") if "begin" in body else parse_time(row["begin_at"], "begin")
    running = row["end_at"] is None
    if "end" in body and body["end"] is not None:
        end = parse_time(body["end"], "end")
    elif running:
        end = None
    else:
        end = parse_time(row["end_at"], "end")
    duration = check_interval(begin, end)
    description = body.get("description", row["description"])
    if not isinstance(description, str):
        raise invalid("description", "description must be a string")
    billable = opt_bool(body, "billable", bool(row["billable"]))
    rate = row["hourly_rate"]
    if project["id"] != row["project_id"] or activity["id"] != row["activity_id"]:
        rate = resolve_rate(req, row["user_id"], project, activity)
    amount = None if duration is None else (money(duration, rate) if billable else 0.0)
    req.db.execute(
        "UPDATE timesheets SET project_id = ?, activity_id = ?, description = ?, begin_at = ?, end_at = ?, "
        "duration_seconds = ?, hourly_rate = ?, amount = ?, billable = ?, updated_at = ? WHERE id = ?",
        (project["id"], activity["id"], description, fmt_time(begin), fmt_time(end) if end else None, duration, rate,
         amount, int(billable), fmt_time(now_utc()), id))
    return 200, timesheet_json(req, load_timesheet(req, id))


@route("DELETE", "/api/timesheets/{id}")
def delete_timesheet(req: Request, id: int):
    load_timesheet(req, id)
    req.db.execute("DELETE FROM timesheets WHERE id = ?", (id,))
    return 204, None


# --- 7. reports and export -----------------------------------------------------------------------
GROUPS = {"project": ("t.project_id", "p.name"), "customer": ("p.customer_id", "c.name"),
          "activity": ("t.activity_id", "a.name"), "user": ("t.user_id", "u.username")}


@route("GET", "/api/reports/summary")
def report_summary(req: Request):
    group_by = req.q("group_by", "project")
    if group_by not in GROUPS:
        raise invalid("group_by", "group_by must be project, customer, activity or user")
    key, label = GROUPS[group_by]
    cond, params = timesheet_filters(req)
    rows = req.db.execute(
        f"SELECT {key} AS id, {label} AS name, SUM(t.duration_seconds) AS duration_seconds, "
        f"SUM(t.amount) AS amount, COUNT(*) AS count {TIMESHEET_FROM} "
        f"WHERE {cond} AND t.end_at IS NOT NULL GROUP BY {key} ORDER BY name COLLATE NOCASE, id", params).fetchall()
    items = [{"id": r["id"], "name": r["name"], "duration_seconds": r["duration_seconds"],
              "amount": round(r["amount"], 2), "count": r["count"]} for r in rows]
    totals = {"duration_seconds": sum(i["duration_seconds"] for i in items),
              "amount": round(sum(i["amount"] for i in items), 2), "count": sum(i["count"] for i in items)}
    return 200, {"group_by": group_by, "rows": items, "totals": totals}


EXPORT_COLUMNS = ["id", "date", "begin", "end", "duration_seconds", "user", "customer", "project", "activity",
                  "description", "billable", "hourly_rate", "amount"]


@route("GET", "/api/timesheets/export")
def export_timesheets(req: Request):
    fmt = req.q("format", "csv")
    if fmt != "csv":
        raise invalid("format", "format must be csv")
    cond, params = timesheet_filters(req)
    rows = req.db.execute(f"{TIMESHEET_SELECT} WHERE {cond} ORDER BY t.begin_at, t.id", params).fetchall()
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")
    writer.writerow(EXPORT_COLUMNS)
    for r in rows:
        writer.writerow([r["id"], r["begin_at"][:10], r["begin_at"], r["end_at"] or "",
                         "" if r["duration_seconds"] is None else r["duration_seconds"], r["username"],
                         r["customer_name"], r["project_name"], r["activity_name"], r["description"],
                         "true" if r["billable"] else "false", f"{r['hourly_rate']:.2f}",
                         "" if r["amount"] is None else f"{r['amount']:.2f}"])
    return 200, ("text/csv; charset=utf-8", out.getvalue().encode("utf-8"),
                 {"Content-Disposition": 'attachment; filename="timesheets.csv"'})


# --- 8. server ------------------------------------------------------------------------------------
class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server_version = "TimeTrack/" + VERSION
    db: sqlite3.Connection = None  # set by main()
    lock = threading.Lock()        # one request at a time touches the database

    def log_message(self, fmt, *args):  # quiet by default; TIMETRACK_LOG=1 logs requests
        if os.environ.get("TIMETRACK_LOG"):
            sys.stderr.write(f"{self.address_string()} - {fmt % args}\n")

    def _dispatch(self) -> None:
        parts = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw.strip() else None
        except (ValueError, UnicodeDecodeError):
            return self._send(400, {"error": "bad_request", "message": "the request body is not valid JSON"})
        req = Request(self.command, parts.path.rstrip("/") or "/", parse_qs(parts.query), body, self.headers, self.db)
        allowed_methods = []
        for method, regex, fn, public in ROUTES:
            match = regex.match(req.path)
            if not match:
                continue
            if method != req.method:
                allowed_methods.append(method)
                continue
            with self.lock:
                try:
                    if not public:
                        authenticate(req)
                    req.db.execute("BEGIN IMMEDIATE")
                    try:
                        status, payload = fn(req, **{k: int(v) for k, v in match.groupdict().items()})
                        req.db.execute("COMMIT")
                    except BaseException:
                        req.db.execute("ROLLBACK")
                        raise
                except ApiError as exc:
                    return self._send(exc.status, exc.body())
                except sqlite3.IntegrityError as exc:
                    if "ux_timesheets_running" in str(exc) or "timesheets.user_id" in str(exc):
                        return self._send(409, {"error": "timer_running", "message": "a timer is already running"})
                    return self._send(409, {"error": "conflict", "message": str(exc)})
                except Exception as exc:  # noqa: BLE001 - a JSON 500 instead of a dropped connection
                    return self._send(500, {"error": "internal_error", "message": type(exc).__name__})
            return self._send(status, payload)
        if allowed_methods:
            return self._send(405, {"error": "method_not_allowed", "message": f"use {', '.join(allowed_methods)}"})
        return self._send(404, {"error": "not_found", "message": f"no route for {req.path}"})

    def _send(self, status: int, payload) -> None:
        headers = {}
        if isinstance(payload, tuple):
            content_type, data, headers = payload
        elif payload is None:
            content_type, data = None, b""
        else:
            content_type, data = "application/json", json.dumps(payload).encode("utf-8")
        self.send_response(status)
        if content_type:
            self.send_header("Content-Type", content_type)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if data and self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _dispatch


HOME_PAGE = """<!doctype html>
<html lang="en">
<head><meta charset="utf-8"><title>TimeTrack</title>
<style>body{font-family:sans-serif;margin:0}header{background:#234;color:#fff;padding:12px 24px}
nav a{color:#fff;margin-right:16px}main{padding:24px;max-width:720px}label{display:block;margin:8px 0}</style></head>
<body>
<header><h1>TimeTrack</h1>
<nav id="main-nav"><a href="/#customers">Customers</a><a href="/#projects">Projects</a>
<a href="/#timesheets">Timesheets</a><a href="/#reports">Reports</a></nav></header>
<main>
<p id="status">Checking service...</p>
<form id="login-form" method="post" action="/api/auth/login">
<label>Username <input name="username" id="username" autocomplete="username"></label>
<label>Password <input name="password" id="password" type="password" autocomplete="current-password"></label>
<button type="submit" id="login-button">Sign in</button>
</form>
</main>
<script>
fetch("/api/health").then(r => r.json()).then(h => {
  document.getElementById("status").textContent = "Service " + h.status + ", version " + h.version;
}).catch(() => { document.getElementById("status").textContent = "Service unreachable"; });
</script>
</body>
</html>
"""


@route("GET", "/", public=True)
def home_page(req: Request):
    """The web entry point (PRD section "Web UI"): a static shell that checks the API."""
    return 200, ("text/html; charset=utf-8", HOME_PAGE.encode("utf-8"), {})


def main() -> None:
    port = int(os.environ.get("PORT", "8080"))
    db_path = os.environ.get("DATABASE_PATH", "./data/timetrack.db")
    Handler.db = open_db(db_path)
    server = ThreadingHTTPServer((os.environ.get("HOST", "0.0.0.0"), port), Handler)
    server.daemon_threads = True
    print(f"TimeTrack {VERSION} listening on port {port}, database {db_path}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
