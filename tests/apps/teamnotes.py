"""TeamNotes: a small multi-user SaaS app that saasbench can score.

It exists so the evaluation engine has a real, running HTTP target for its tests and for
``saasbench demo``: several auth schemes, role-based access, validation, pagination and a
few hostile "debug" endpoints. It uses the standard library only, keeps all state in memory
(per server instance, guarded by a lock), starts in milliseconds and behaves the same on
every run. ``bugs`` switches on deliberate defects so tests can make DAG nodes fail.

Run it with ``python -m apps.teamnotes (from tests/) --port 8000 [--bug no_rbac ...]``.
"""

from __future__ import annotations

import argparse
import base64
import hmac
import html
import json
import os
import re
import secrets
import socket
import sys
import threading
import time
from datetime import UTC, datetime
from http.cookies import CookieError, SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

VERSION = "1.0.0"
KNOWN_BUGS: frozenset[str] = frozenset({"no_rbac", "page_size", "no_validation"})

# Seeded accounts, keyed by role. Passwords are plain text on purpose: this is a test target.
USERS: dict[str, dict[str, str]] = {
    "admin": {
        "username": "admin",
        "email": "admin@teamnotes.test",
        "password": "admin-pass-1",
        "api_key": "key-admin-0001",
    },
    "member": {
        "username": "alice",
        "email": "alice@teamnotes.test",
        "password": "alice-pass-1",
        "api_key": "key-alice-0001",
    },
    "viewer": {
        "username": "victor",
        "email": "victor@teamnotes.test",
        "password": "victor-pass-1",
        "api_key": "key-victor-0001",
    },
}

SESSION_COOKIE = "tn_session"
MAX_BODY = 1 << 20  # request bodies above 1 MiB get 413
MIB = 1 << 20
DEFAULT_PAGE_SIZE, BUGGY_PAGE_SIZE, MAX_PAGE_SIZE = 20, 50, 100
MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})

Json = dict[str, Any]


class HttpError(Exception):
    """Raised by handlers to end a request with a JSON error response."""

    def __init__(self, status: int, payload: Json, headers: list[tuple[str, str]] | None = None):
        super().__init__(status, payload)
        self.status, self.payload, self.headers = status, payload, headers or []


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _public_user(user: Json) -> Json:
    """The user as the API shows it: never the password or the API key."""
    return {k: user[k] for k in ("id", "username", "email", "role")}


def _same(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())


class Store:
    """All application state. Every access takes the lock, and reads return copies, so
    concurrent handler threads never see half-written records."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.users: dict[int, Json] = {
            i: {"id": i, "role": role, **fields} for i, (role, fields) in enumerate(USERS.items(), start=1)
        }
        self.projects: dict[int, Json] = {}
        self.notes: dict[int, Json] = {}
        self.tokens: dict[str, int] = {}  # bearer token -> user id
        self.sessions: dict[str, Json] = {}  # session id -> {"user_id", "csrf"}
        self._next = {"project": 1, "note": 1}

    def _new_id(self, kind: str) -> int:
        value = self._next[kind]
        self._next[kind] = value + 1
        return value

    # --- identity -------------------------------------------------------------------------
    def check_credentials(self, login: str, password: str) -> Json | None:
        """Match a username or an email plus password; compare in constant time."""
        with self.lock:
            for user in self.users.values():
                if login in (user["username"], user["email"]):
                    return dict(user) if _same(password, user["password"]) else None
        return None

    def user_for_api_key(self, key: str) -> Json | None:
        with self.lock:
            for user in self.users.values():
                if _same(key, user["api_key"]):
                    return dict(user)
        return None

    def issue_token(self, user_id: int) -> str:
        token = secrets.token_urlsafe(32)
        with self.lock:
            self.tokens[token] = user_id
        return token

    def user_for_token(self, token: str) -> Json | None:
        with self.lock:
            uid = self.tokens.get(token)
            return dict(self.users[uid]) if uid is not None else None

    def revoke_token(self, token: str) -> None:
        with self.lock:
            self.tokens.pop(token, None)

    def open_session(self, user_id: int) -> tuple[str, str]:
        sid, csrf = secrets.token_urlsafe(32), secrets.token_urlsafe(24)
        with self.lock:
            self.sessions[sid] = {"user_id": user_id, "csrf": csrf}
        return sid, csrf

    def session(self, sid: str) -> tuple[Json, str] | None:
        """Return (user, csrf token) for a live session id."""
        with self.lock:
            sess = self.sessions.get(sid)
            return (dict(self.users[sess["user_id"]]), sess["csrf"]) if sess else None

    def close_session(self, sid: str) -> None:
        with self.lock:
            self.sessions.pop(sid, None)

    def list_users(self) -> list[Json]:
        with self.lock:
            return [_public_user(u) for u in self.users.values()]

    # --- projects and notes ---------------------------------------------------------------
    def _name_taken(self, name: str, exclude: int | None = None) -> bool:
        key = name.casefold()
        return bool(name) and any(p["name"].casefold() == key and p["id"] != exclude for p in self.projects.values())

    def create_project(self, fields: Json, owner_id: int) -> Json:
        with self.lock:
            if self._name_taken(fields["name"]):
                raise HttpError(409, {"error": "Project with this name already exists"})
            pid = self._new_id("project")
            self.projects[pid] = {
                "id": pid,
                "name": fields["name"],
                "description": fields.get("description", ""),
                "owner_id": owner_id,
                "archived": fields.get("archived", False),
                "tags": list(fields.get("tags", [])),
                "created_at": _now(),
            }
            return self._copy(self.projects[pid])

    def update_project(self, pid: int, changes: Json) -> Json:
        with self.lock:
            if "name" in changes and self._name_taken(changes["name"], exclude=pid):
                raise HttpError(409, {"error": "Project with this name already exists"})
            self.projects[pid].update(changes)
            return self._copy(self.projects[pid])

    def delete_project(self, pid: int) -> None:
        with self.lock:
            self.projects.pop(pid, None)
            for nid in [n["id"] for n in self.notes.values() if n["project_id"] == pid]:
                del self.notes[nid]

    def get_project(self, pid: int) -> Json | None:
        with self.lock:
            project = self.projects.get(pid)
            return self._copy(project) if project else None

    def list_projects(self, query: str = "") -> list[Json]:
        needle = query.casefold()
        with self.lock:
            return [
                self._copy(p)
                for p in sorted(self.projects.values(), key=lambda p: p["id"])
                if needle in p["name"].casefold()
            ]

    def add_note(self, pid: int, title: str, body: str, author_id: int) -> Json:
        with self.lock:
            nid = self._new_id("note")
            self.notes[nid] = {"id": nid, "project_id": pid, "title": title, "body": body, "author_id": author_id}
            return dict(self.notes[nid])

    def list_notes(self, pid: int) -> list[Json]:
        with self.lock:
            return [dict(n) for n in sorted(self.notes.values(), key=lambda n: n["id"]) if n["project_id"] == pid]

    def stats(self) -> Json:
        with self.lock:
            return {"projects": len(self.projects), "notes": len(self.notes), "users": len(self.users)}

    @staticmethod
    def _copy(project: Json) -> Json:
        return {**project, "tags": list(project["tags"])}


# --- validation ---------------------------------------------------------------------------
def _invalid(field: str) -> HttpError:
    return HttpError(422, {"error": "validation", "field": field})


def _clean_project(body: Json, *, partial: bool, require_name: bool = True) -> Json:
    """Validate project fields. ``partial`` (PATCH) keeps only the fields that were sent."""
    out: Json = {}
    if "name" in body or not partial:
        name = body.get("name")
        if require_name:
            if not isinstance(name, str) or not name.strip() or len(name.strip()) > 100:
                raise _invalid("name")
            out["name"] = name.strip()
        else:  # the "no_validation" bug: anything goes, including nothing
            out["name"] = "" if name is None else str(name)
    if "description" in body or not partial:
        desc = body.get("description", "")
        if not isinstance(desc, str) or len(desc) > 5000:
            raise _invalid("description")
        out["description"] = desc
    if "tags" in body or not partial:
        tags = body.get("tags", [])
        if not isinstance(tags, list) or not all(isinstance(t, str) and t for t in tags):
            raise _invalid("tags")
        out["tags"] = tags
    if "archived" in body or not partial:
        archived = body.get("archived", False)
        if not isinstance(archived, bool):
            raise _invalid("archived")
        out["archived"] = archived
    return out


# --- HTML ---------------------------------------------------------------------------------
_NAV = (
    '<nav><a href="/">Home</a> | <a href="/admin">Admin</a> | '
    '<a href="/admin/login">Log in</a> | <a href="/api/health">API health</a></nav>'
)


def _page(title: str, body: str) -> bytes:
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title></head>\n<body>\n{_NAV}\n{body}\n</body></html>\n"
    ).encode()


def _login_form(error: str = "") -> bytes:
    err = f'<p class="error">{html.escape(error)}</p>' if error else ""
    return _page(
        "TeamNotes - Admin login",
        f"""<h1>Admin login</h1>{err}
<form method="post" action="/admin/login">
  <label>Username <input name="username" autocomplete="username"></label>
  <label>Password <input name="password" type="password"></label>
  <button type="submit">Log in</button>
</form>""",
    )


# --- routing ------------------------------------------------------------------------------
# (method, path pattern, handler method name, needs an authenticated user)
_ROUTE_TABLE: list[tuple[str, str, str, bool]] = [
    ("GET", r"/", "home", False),
    ("GET", r"/api/health", "health", False),
    ("GET", r"/api/public/ping", "ping", False),
    ("POST", r"/api/auth/login", "api_login", False),
    ("POST", r"/api/auth/logout", "api_logout", True),
    ("POST", r"/session/login", "session_login", False),
    ("GET", r"/session/csrf", "session_csrf", False),
    ("POST", r"/session/logout", "session_logout", True),
    ("GET", r"/admin/login", "admin_login_form", False),
    ("POST", r"/admin/login", "admin_login", False),
    ("GET", r"/admin", "admin_dashboard", False),
    ("GET", r"/api/me", "me", True),
    ("GET", r"/api/projects", "list_projects", True),
    ("POST", r"/api/projects", "create_project", True),
    ("GET", r"/api/projects/(?P<pid>\d+)", "get_project", True),
    ("PUT", r"/api/projects/(?P<pid>\d+)", "put_project", True),
    ("PATCH", r"/api/projects/(?P<pid>\d+)", "patch_project", True),
    ("DELETE", r"/api/projects/(?P<pid>\d+)", "delete_project", True),
    ("GET", r"/api/projects/(?P<pid>\d+)/notes", "list_notes", True),
    ("POST", r"/api/projects/(?P<pid>\d+)/notes", "create_note", True),
    ("GET", r"/api/admin/users", "admin_users", True),
    ("GET", r"/api/stats", "stats", True),
    ("GET", r"/api/debug/slow", "debug_slow", False),
    ("GET", r"/api/debug/big", "debug_big", False),
    ("GET", r"/api/debug/badjson", "debug_badjson", False),
    ("GET", r"/api/debug/headers", "debug_headers", False),
]
ROUTES = [(m, re.compile(p + r"\Z"), name, auth) for m, p, name, auth in _ROUTE_TABLE]


class Handler(BaseHTTPRequestHandler):
    """One instance per connection; ``handle_one_request`` runs once per keep-alive request."""

    protocol_version = "HTTP/1.1"  # keep-alive; every response carries Content-Length
    server_version = f"TeamNotes/{VERSION}"
    timeout = 30  # drop idle keep-alive connections instead of pinning a thread forever
    disable_nagle_algorithm = True  # headers and body are separate writes: avoid 40 ms stalls
    server: TeamNotesServer

    def log_message(self, format: str, *args: Any) -> None:
        """Silence per-request logging: tests and the demo would drown in it."""

    def do_GET(self) -> None:
        self._dispatch()

    do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = do_OPTIONS = do_GET

    # --- plumbing -------------------------------------------------------------------------
    def _dispatch(self) -> None:
        self._responded = False
        self.user: Json | None = None
        self.auth_scheme: str | None = None
        try:
            # Read the body first, always, so an early error reply cannot desync keep-alive.
            self.raw_body = self._read_body()
            parts = urlsplit(self.path)
            self.query = parse_qs(parts.query)
            path = parts.path.rstrip("/") or "/"
            name, params, needs_auth = self._route(path)
            if needs_auth:
                self._authenticate()
            getattr(self, "h_" + name)(**params)
        except HttpError as err:
            self._reply_json(err.status, err.payload, err.headers)
        except Exception:  # noqa: BLE001 - a handler bug must still get a reply
            if self._responded:
                self.close_connection = True
            else:
                self._reply_json(500, {"error": "internal"})

    def _route(self, path: str) -> tuple[str, dict[str, Any], bool]:
        method = "GET" if self.command == "HEAD" else self.command
        allowed = []
        for route_method, pattern, name, auth in ROUTES:
            match = pattern.match(path)
            if match:
                if route_method == method:
                    return name, {k: int(v) for k, v in match.groupdict().items()}, auth
                allowed.append(route_method)
        if allowed:
            raise HttpError(405, {"error": "method_not_allowed"}, [("Allow", ", ".join(allowed))])
        raise HttpError(404, {"error": "not_found"})

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            return self._read_chunked()
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            self.close_connection = True
            raise HttpError(400, {"error": "bad_request"}) from None
        if length > MAX_BODY:
            self.close_connection = True
            raise HttpError(413, {"error": "payload_too_large"})
        return self.rfile.read(length) if length > 0 else b""

    def _read_chunked(self) -> bytes:
        body = bytearray()
        try:
            while True:
                size = int(self.rfile.readline(1024).split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                        pass  # skip trailers
                    return bytes(body)
                body += self.rfile.read(size)
                self.rfile.readline(1024)
                if len(body) > MAX_BODY:
                    self.close_connection = True
                    raise HttpError(413, {"error": "payload_too_large"})
        except ValueError:
            self.close_connection = True
            raise HttpError(400, {"error": "bad_request"}) from None

    def _reply(
        self,
        status: int,
        body: bytes = b"",
        content_type: str | None = None,
        headers: list[tuple[str, str]] | None = None,
    ) -> None:
        self.send_response(status)
        if content_type:
            self.send_header("Content-Type", content_type)
        if status != 204:  # RFC 9110: no Content-Length on 204
            self.send_header("Content-Length", str(len(body)))
        for key, value in headers or []:
            self.send_header(key, value)
        if self.close_connection and not any(k.lower() == "connection" for k, _ in headers or []):
            self.send_header("Connection", "close")  # tell pooled clients not to reuse it
        self.end_headers()
        self._responded = True
        if body and self.command != "HEAD" and status != 204:
            self.wfile.write(body)

    def _reply_json(self, status: int, payload: Any, headers: list[tuple[str, str]] | None = None) -> None:
        self._reply(status, json.dumps(payload).encode(), "application/json", headers)

    def _reply_html(self, status: int, body: bytes, headers: list[tuple[str, str]] | None = None) -> None:
        self._reply(status, body, "text/html; charset=utf-8", headers)

    def _redirect(self, status: int, location: str, headers: list[tuple[str, str]] | None = None) -> None:
        self._reply(status, b"", None, [("Location", location), *(headers or [])])

    def _json_body(self) -> Json:
        if not self.raw_body.strip():
            return {}
        try:
            body = json.loads(self.raw_body)
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise HttpError(400, {"error": "bad_json"}) from None
        if not isinstance(body, dict):
            raise _invalid("body")
        return body

    def _form_or_json_body(self) -> Json:
        if "json" in self.headers.get("Content-Type", ""):
            return self._json_body()
        form = parse_qs(self.raw_body.decode("utf-8", "replace"), keep_blank_values=True)
        return {k: v[0] for k, v in form.items()}

    def _int_param(self, name: str, default: int, low: int, high: int | None = None) -> int:
        """Parse a query integer; values above ``high`` are clamped, junk is a 422."""
        raw = self.query.get(name, [None])[0]
        if raw is None or raw == "":
            return default
        try:
            value = int(raw)
        except ValueError:
            raise _invalid(name) from None
        if value < low:
            raise _invalid(name)
        return min(value, high) if high is not None else value

    def _cookie(self, name: str) -> str | None:
        try:
            jar = SimpleCookie(self.headers.get("Cookie", ""))
        except CookieError:
            return None
        return jar[name].value if name in jar else None

    def _session_cookie_header(self, sid: str) -> tuple[str, str]:
        return ("Set-Cookie", f"{SESSION_COOKIE}={sid}; HttpOnly; Path=/; SameSite=Lax")

    # --- auth -----------------------------------------------------------------------------
    def _authenticate(self) -> None:
        """Try bearer, API key, Basic, then the session cookie; the first valid one wins.
        Only cookie auth is subject to CSRF, because only it is sent by browsers implicitly."""
        store = self.server.store
        scheme, _, cred = self.headers.get("Authorization", "").partition(" ")
        scheme, cred = scheme.lower(), cred.strip()
        user: Json | None = None
        if scheme == "bearer" and cred:
            user, self.auth_scheme = store.user_for_token(cred), "bearer"
        if user is None and (key := self.headers.get("X-API-Key", "").strip()):
            user, self.auth_scheme = store.user_for_api_key(key), "api_key"
        if user is None and scheme == "basic" and cred:
            try:
                login, _, password = base64.b64decode(cred, validate=True).decode().partition(":")
                user, self.auth_scheme = store.check_credentials(login, password), "basic"
            except (ValueError, UnicodeDecodeError):
                pass
        if user is None and (sid := self._cookie(SESSION_COOKIE)):
            found = store.session(sid)
            if found:
                user, csrf = found
                self.auth_scheme = "session"
                if self.command in MUTATING and not _same(self.headers.get("X-CSRF-Token", ""), csrf):
                    raise HttpError(403, {"error": "csrf"})
        if user is None:
            raise HttpError(401, {"error": "unauthorized"}, [("WWW-Authenticate", 'Bearer realm="teamnotes"')])
        self.user = user

    def _require_role(self, *roles: str) -> Json:
        assert self.user is not None
        if self.user["role"] not in roles:
            raise HttpError(403, {"error": "forbidden"})
        return self.user

    def _admin_roles(self) -> tuple[str, ...]:
        return ("admin", "member") if "no_rbac" in self.server.bugs else ("admin",)

    def _project_or_404(self, pid: int) -> Json:
        project = self.server.store.get_project(pid)
        if project is None:
            raise HttpError(404, {"error": "not_found"})
        return project

    # --- handlers: pages and auth ---------------------------------------------------------
    def h_home(self) -> None:
        projects = self.server.store.list_projects()
        items = "\n".join(f"  <li>{html.escape(p['name'])}</li>" for p in projects)
        body = "<h1>TeamNotes</h1>\n<p>Shared notes for small teams.</p>\n<h2>Projects</h2>\n" + (
            f'<ul id="projects">\n{items}\n</ul>' if projects else "<p>No projects yet.</p>"
        )
        self._reply_html(200, _page("TeamNotes", body))

    def h_health(self) -> None:
        self._reply_json(200, {"status": "ok", "version": VERSION})

    def h_ping(self) -> None:
        self._reply(200, b"pong", "text/plain; charset=utf-8")

    def _login_from_json(self) -> Json:
        body = self._json_body()
        login = body.get("username") or body.get("email")
        password = body.get("password")
        if not isinstance(login, str) or not isinstance(password, str):
            raise HttpError(401, {"error": "invalid_credentials"})
        user = self.server.store.check_credentials(login, password)
        if user is None:
            raise HttpError(401, {"error": "invalid_credentials"})
        return user

    def h_api_login(self) -> None:
        user = self._login_from_json()
        token = self.server.store.issue_token(user["id"])
        self._reply_json(200, {"access_token": token, "token_type": "bearer", "user": _public_user(user)})

    def h_api_logout(self) -> None:
        store = self.server.store
        if self.auth_scheme == "bearer":
            store.revoke_token(self.headers["Authorization"].partition(" ")[2].strip())
        elif self.auth_scheme == "session":
            store.close_session(self._cookie(SESSION_COOKIE) or "")
        self._reply(204)

    def h_session_login(self) -> None:
        user = self._login_from_json()
        sid, csrf = self.server.store.open_session(user["id"])
        self._reply_json(200, {"csrf_token": csrf}, [self._session_cookie_header(sid)])

    def h_session_csrf(self) -> None:
        found = self.server.store.session(self._cookie(SESSION_COOKIE) or "")
        if not found:
            raise HttpError(401, {"error": "unauthorized"})
        self._reply_json(200, {"csrf_token": found[1]})

    def h_session_logout(self) -> None:
        self.server.store.close_session(self._cookie(SESSION_COOKIE) or "")
        self._reply(204, headers=[("Set-Cookie", f"{SESSION_COOKIE}=; Max-Age=0; Path=/")])

    def h_admin_login_form(self) -> None:
        self._reply_html(200, _login_form())

    def h_admin_login(self) -> None:
        form = self._form_or_json_body()
        user = self.server.store.check_credentials(str(form.get("username", "")), str(form.get("password", "")))
        if user is None:
            self._reply_html(401, _login_form("Invalid username or password."))
            return
        sid, _ = self.server.store.open_session(user["id"])
        self._redirect(303, "/admin", [self._session_cookie_header(sid)])

    def h_admin_dashboard(self) -> None:
        found = self.server.store.session(self._cookie(SESSION_COOKIE) or "")
        if not found or found[0]["role"] != "admin":
            self._redirect(302, "/admin/login")
            return
        user, csrf = found
        store = self.server.store
        rows = "\n".join(
            f"<tr><td>{u['id']}</td><td>{html.escape(u['username'])}</td>"
            f"<td>{html.escape(u['email'])}</td><td>{u['role']}</td></tr>"
            for u in store.list_users()
        )
        counts = store.stats()
        body = (
            f'<meta name="csrf-token" content="{csrf}">\n<h1>Admin dashboard</h1>\n'
            f"<p>Signed in as {html.escape(user['username'])}.</p>\n"
            f'<p id="stats">{counts["projects"]} projects, {counts["notes"]} notes</p>\n'
            f'<table id="users"><tr><th>ID</th><th>Username</th><th>Email</th>'
            f"<th>Role</th></tr>\n{rows}\n</table>"
        )
        self._reply_html(200, _page("TeamNotes - Admin", body))

    # --- handlers: API --------------------------------------------------------------------
    def h_me(self) -> None:
        assert self.user is not None
        self._reply_json(200, _public_user(self.user))

    def h_list_projects(self) -> None:
        default = BUGGY_PAGE_SIZE if "page_size" in self.server.bugs else DEFAULT_PAGE_SIZE
        page = self._int_param("page", 1, 1)
        size = self._int_param("page_size", default, 1, MAX_PAGE_SIZE)
        projects = self.server.store.list_projects(self.query.get("q", [""])[0])
        start = (page - 1) * size
        self._reply_json(
            200, {"items": projects[start : start + size], "total": len(projects), "page": page, "page_size": size}
        )

    def h_create_project(self) -> None:
        user = self._require_role("admin", "member")
        fields = _clean_project(self._json_body(), partial=False, require_name="no_validation" not in self.server.bugs)
        self._reply_json(201, self.server.store.create_project(fields, user["id"]))

    def h_get_project(self, pid: int) -> None:
        self._reply_json(200, self._project_or_404(pid))

    def _update_project(self, pid: int, *, partial: bool) -> None:
        project = self._project_or_404(pid)
        assert self.user is not None
        if self.user["role"] != "admin" and project["owner_id"] != self.user["id"]:
            raise HttpError(403, {"error": "forbidden"})
        changes = _clean_project(self._json_body(), partial=partial)
        self._reply_json(200, self.server.store.update_project(pid, changes))

    def h_put_project(self, pid: int) -> None:
        self._update_project(pid, partial=False)

    def h_patch_project(self, pid: int) -> None:
        self._update_project(pid, partial=True)

    def h_delete_project(self, pid: int) -> None:
        self._require_role(*self._admin_roles())
        self._project_or_404(pid)
        self.server.store.delete_project(pid)
        self._reply(204)

    def h_list_notes(self, pid: int) -> None:
        self._project_or_404(pid)
        self._reply_json(200, self.server.store.list_notes(pid))

    def h_create_note(self, pid: int) -> None:
        user = self._require_role("admin", "member")
        self._project_or_404(pid)
        body = self._json_body()
        title, text = body.get("title"), body.get("body", "")
        if not isinstance(title, str) or not title.strip() or len(title) > 200:
            raise _invalid("title")
        if not isinstance(text, str):
            raise _invalid("body")
        self._reply_json(201, self.server.store.add_note(pid, title.strip(), text, user["id"]))

    def h_admin_users(self) -> None:
        self._require_role(*self._admin_roles())
        self._reply_json(200, self.server.store.list_users())

    def h_stats(self) -> None:
        self._reply_json(200, self.server.store.stats())

    # --- handlers: debug helpers for harness robustness tests -----------------------------
    def h_debug_slow(self) -> None:
        ms = self._int_param("ms", 100, 0, 60_000)
        time.sleep(ms / 1000)
        self._reply_json(200, {"slept_ms": ms})

    def h_debug_big(self) -> None:
        """Stream exactly ``mb`` MiB (``{"data":"xxx…"}``) without building it in memory."""
        mb = self._int_param("mb", 1, 0, 1024)
        prefix, suffix = b'{"data":"', b'"}'
        fill = max(mb * MIB - len(prefix) - len(suffix), 0)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(prefix) + fill + len(suffix)))
        self.end_headers()
        self._responded = True
        if self.command == "HEAD":
            return
        self.wfile.write(prefix)
        chunk = memoryview(b"x" * 65536)
        while fill > 0:
            n = min(fill, len(chunk))
            self.wfile.write(chunk[:n])
            fill -= n
        self.wfile.write(suffix)

    def h_debug_badjson(self) -> None:
        self._reply(200, b'{"broken": ', "application/json")

    def h_debug_headers(self) -> None:
        echoed: dict[str, str] = {}
        for key, value in self.headers.items():
            name = key.lower()
            echoed[name] = f"{echoed[name]}, {value}" if name in echoed else value
        self._reply_json(200, echoed)


class TeamNotesServer(ThreadingHTTPServer):
    """A threading server that owns its Store and can drop open keep-alive connections on
    close, so a stopped test server really is stopped."""

    daemon_threads = True
    request_queue_size = 128  # the default backlog of 5 stalls bursts of concurrent clients
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], *, bugs: frozenset[str]) -> None:
        self.bugs = bugs
        self.store = Store()
        self._conns: set[socket.socket] = set()
        self._conns_lock = threading.Lock()
        super().__init__(address, Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._conns_lock:
            self._conns.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._conns_lock:
            self._conns.discard(request)
        super().shutdown_request(request)

    def server_close(self) -> None:
        super().server_close()
        with self._conns_lock:
            conns = list(self._conns)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Clients hanging up mid-response are normal here; anything else is still printed."""
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            return
        super().handle_error(request, client_address)


# --- fake source tree ---------------------------------------------------------------------
_WORKSPACE_FILES = {
    "README.md": "# TeamNotes\n\nShared notes for small teams. Run `python -m app.server`.\n",
    "app/server.py": (
        '"""HTTP layer of TeamNotes."""\n\nfrom app.models import Project\n\n\n'
        "def create_project(name: str, owner_id: int) -> Project:\n"
        "    return Project(name=name, owner_id=owner_id)\n"
    ),
    "app/models.py": (
        '"""Data model of TeamNotes."""\n\nfrom dataclasses import dataclass, field\n'
        "\n\n@dataclass\nclass Project:\n    name: str\n    owner_id: int\n"
        "    tags: list[str] = field(default_factory=list)\n"
    ),
    "requirements.txt": "httpx>=0.27\n",
}


def _write_workspace(root: str) -> None:
    """Give file-check primitives something to inspect; never overwrite existing files."""
    for rel, text in _WORKSPACE_FILES.items():
        path = os.path.join(root, *rel.split("/"))
        if not os.path.exists(path):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(text)


# --- entry points -------------------------------------------------------------------------
def make_server(
    host: str = "127.0.0.1", port: int = 0, *, bugs: frozenset[str] = frozenset(), workspace: str | None = None
) -> ThreadingHTTPServer:
    """Bind (port 0 = ephemeral) but do not serve yet; read the port from server_address."""
    unknown = set(bugs) - KNOWN_BUGS
    if unknown:
        raise ValueError(f"unknown bugs: {sorted(unknown)}; known: {sorted(KNOWN_BUGS)}")
    if workspace is not None:
        _write_workspace(workspace)
    return TeamNotesServer((host, port), bugs=frozenset(bugs))


def serve_in_thread(**kw: Any) -> tuple[ThreadingHTTPServer, threading.Thread, str]:
    """Start a server on a daemon thread; stop it with shutdown() then server_close()."""
    server = make_server(**kw)
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="teamnotes", daemon=True
    )
    thread.start()
    host = kw.get("host", "127.0.0.1")
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    return server, thread, f"http://{host}:{server.server_address[1]}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m apps.teamnotes (from tests/)", description="Run the TeamNotes example SaaS app."
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument(
        "--bug",
        action="append",
        default=[],
        choices=sorted(KNOWN_BUGS),
        help="switch on a deliberate defect (repeatable)",
    )
    parser.add_argument("--workspace", help="write a fake source tree into this folder")
    args = parser.parse_args(argv)
    server = make_server(args.host, args.port, bugs=frozenset(args.bug), workspace=args.workspace)
    port = server.server_address[1]
    print(f"TeamNotes {VERSION} on http://{args.host}:{port} bugs={sorted(args.bug)}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
