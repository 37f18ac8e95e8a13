"""Tests of the TeamNotes example app that saasbench scores.

They use http.client only, so they run without httpx, and never follow redirects, so the
form-login 303 and the /admin 302 are visible.
"""

from __future__ import annotations

import base64
import concurrent.futures
import http.client
import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlencode, urlsplit

import pytest
from apps.teamnotes import USERS, make_server, serve_in_thread

ADMIN, MEMBER, VIEWER = USERS["admin"], USERS["member"], USERS["viewer"]


class Resp:
    def __init__(self, status: int, headers: http.client.HTTPMessage, body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body

    def json(self) -> Any:
        return json.loads(self.body)


class Client:
    """A tiny HTTP client bound to one base URL; remembers the tn_session cookie if asked."""

    def __init__(self, base: str, keep_cookie: bool = False) -> None:
        parts = urlsplit(base)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.keep_cookie, self.cookie = keep_cookie, ""

    def request(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        form: dict | None = None,
        raw: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> Resp:
        hdrs = dict(headers or {})
        body = raw
        if json_body is not None:
            body, hdrs["Content-Type"] = json.dumps(json_body).encode(), "application/json"
        if form is not None:
            body = urlencode(form).encode()
            hdrs["Content-Type"] = "application/x-www-form-urlencoded"
        if self.cookie:
            hdrs.setdefault("Cookie", self.cookie)
        conn = http.client.HTTPConnection(self.host, self.port, timeout=10)
        try:
            conn.request(method, path, body=body, headers=hdrs)
            resp = conn.getresponse()
            result = Resp(resp.status, resp.headers, resp.read())
        finally:
            conn.close()
        set_cookie = result.headers.get("Set-Cookie", "")
        if self.keep_cookie and set_cookie.startswith("tn_session="):
            self.cookie = set_cookie.split(";")[0]
        return result

    def get(self, path: str, **kw: Any) -> Resp:
        return self.request("GET", path, **kw)

    def post(self, path: str, **kw: Any) -> Resp:
        return self.request("POST", path, **kw)


def key(user: dict[str, str]) -> dict[str, str]:
    return {"X-API-Key": user["api_key"]}


def start(bugs: frozenset[str] = frozenset()) -> tuple[Any, str]:
    server, _thread, base = serve_in_thread(bugs=bugs)
    return server, base


def stop(server: Any) -> None:
    server.shutdown()
    server.server_close()


@pytest.fixture
def base() -> Iterator[str]:
    server, url = start()
    yield url
    stop(server)


@pytest.fixture
def client(base: str) -> Client:
    return Client(base)


# --- basics -------------------------------------------------------------------------------
def test_health_ping_home_and_errors(client: Client) -> None:
    r = client.get("/api/health")
    assert (r.status, r.json()) == (200, {"status": "ok", "version": "1.0.0"})
    assert r.headers["Content-Type"] == "application/json"
    r = client.get("/api/public/ping")
    assert (r.status, r.body) == (200, b"pong") and r.headers["Content-Type"].startswith("text/plain")
    r = client.get("/")
    assert r.status == 200 and b"<title>TeamNotes</title>" in r.body and b"<nav>" in r.body
    assert client.get("/nope").json() == {"error": "not_found"}
    assert client.request("DELETE", "/api/health").status == 405
    assert client.get("/api/me").status == 401
    assert client.get("/api/me").json() == {"error": "unauthorized"}


def test_keep_alive_reuses_one_connection(base: str) -> None:
    parts = urlsplit(base)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=5)
    for _ in range(3):
        conn.request("GET", "/api/projects", headers=key(ADMIN))
        resp = conn.getresponse()
        assert resp.status == 200 and resp.getheader("Content-Length")
        resp.read()
    conn.request("DELETE", "/api/projects/999", headers=key(MEMBER))  # error replies keep framing
    assert conn.getresponse().read() and conn.sock is not None
    conn.close()


# --- authentication -----------------------------------------------------------------------
def test_bearer_login_by_username_and_email_and_logout(client: Client) -> None:
    r = client.post("/api/auth/login", json_body={"username": "alice", "password": "alice-pass-1"})
    assert r.status == 200 and r.json()["token_type"] == "bearer"
    assert r.json()["user"] == {"id": 2, "username": "alice", "email": MEMBER["email"], "role": "member"}
    auth = {"Authorization": f"Bearer {r.json()['access_token']}"}
    assert client.get("/api/me", headers=auth).json()["username"] == "alice"
    r = client.post("/api/auth/login", json_body={"email": ADMIN["email"], "password": ADMIN["password"]})
    assert r.status == 200 and r.json()["user"]["role"] == "admin"
    r = client.post("/api/auth/login", json_body={"username": "alice", "password": "wrong"})
    assert (r.status, r.json()) == (401, {"error": "invalid_credentials"})
    assert client.post("/api/auth/logout", headers=auth).status == 204
    assert client.get("/api/me", headers=auth).status == 401


def test_api_key_and_basic_auth(client: Client) -> None:
    assert client.get("/api/me", headers=key(VIEWER)).json()["role"] == "viewer"
    assert client.get("/api/me", headers={"X-API-Key": "nope"}).status == 401
    basic = base64.b64encode(b"victor:victor-pass-1").decode()
    assert client.get("/api/me", headers={"Authorization": f"Basic {basic}"}).json()["id"] == 3
    bad = base64.b64encode(b"victor:wrong").decode()
    assert client.get("/api/me", headers={"Authorization": f"Basic {bad}"}).status == 401


def test_session_cookie_and_csrf(base: str) -> None:
    browser = Client(base, keep_cookie=True)
    r = browser.post("/session/login", json_body={"username": "admin", "password": "admin-pass-1"})
    assert r.status == 200
    cookie = r.headers["Set-Cookie"]
    assert cookie.startswith("tn_session=") and "HttpOnly" in cookie and "Path=/" in cookie
    csrf = r.json()["csrf_token"]
    assert browser.get("/api/me").json()["username"] == "admin"  # GET needs no CSRF
    assert browser.get("/session/csrf").json() == {"csrf_token": csrf}
    for headers in ({}, {"X-CSRF-Token": "forged"}):
        r = browser.post("/api/projects", json_body={"name": "x"}, headers=headers)
        assert (r.status, r.json()) == (403, {"error": "csrf"})
    r = browser.post("/api/projects", json_body={"name": "x"}, headers={"X-CSRF-Token": csrf})
    assert r.status == 201
    assert Client(base).get("/session/csrf").status == 401


def test_form_login_and_admin_dashboard(base: str) -> None:
    browser = Client(base, keep_cookie=True)
    assert browser.get("/admin").status == 302
    assert b"<form" in browser.get("/admin/login").body
    r = browser.post("/admin/login", form={"username": "admin", "password": "admin-pass-1"})
    assert r.status == 303 and r.headers["Location"] == "/admin"
    assert r.headers["Set-Cookie"].startswith("tn_session=")
    r = browser.get("/admin")
    assert r.status == 200 and b"Admin dashboard" in r.body
    assert browser.request("DELETE", "/api/projects/1").json() == {"error": "csrf"}
    assert browser.post("/admin/login", form={"username": "admin", "password": "x"}).status == 401
    member = Client(base, keep_cookie=True)
    assert member.post("/admin/login", form={"username": "alice", "password": "alice-pass-1"}).status == 303
    r = member.get("/admin")
    assert r.status == 302 and r.headers["Location"] == "/admin/login"


# --- resources, RBAC, validation ----------------------------------------------------------
def test_project_crud_and_notes(client: Client) -> None:
    r = client.post("/api/projects", json_body={"name": "Alpha", "tags": ["a"]}, headers=key(MEMBER))
    assert r.status == 201
    project = r.json()
    assert set(project) == {"id", "name", "description", "owner_id", "archived", "tags", "created_at"}
    assert (project["owner_id"], project["archived"], project["tags"]) == (2, False, ["a"])
    pid = project["id"]
    r = client.request("PATCH", f"/api/projects/{pid}", json_body={"archived": True}, headers=key(MEMBER))
    assert r.json()["archived"] is True and r.json()["name"] == "Alpha"
    r = client.request("PUT", f"/api/projects/{pid}", json_body={"name": "Beta"}, headers=key(ADMIN))
    assert (r.status, r.json()["name"], r.json()["archived"]) == (200, "Beta", False)
    r = client.post(f"/api/projects/{pid}/notes", json_body={"title": "T", "body": "B"}, headers=key(MEMBER))
    assert r.status == 201 and r.json() == {"id": 1, "project_id": pid, "title": "T", "body": "B", "author_id": 2}
    assert client.get(f"/api/projects/{pid}/notes", headers=key(VIEWER)).json() == [r.json()]
    assert client.get("/api/stats", headers=key(VIEWER)).json() == {"projects": 1, "notes": 1, "users": 3}
    assert client.request("DELETE", f"/api/projects/{pid}", headers=key(ADMIN)).status == 204
    r = client.get(f"/api/projects/{pid}", headers=key(ADMIN))
    assert (r.status, r.json()) == (404, {"error": "not_found"})


def test_rbac_forbidden(client: Client) -> None:
    pid = client.post("/api/projects", json_body={"name": "Owned by admin"}, headers=key(ADMIN)).json()["id"]
    forbidden = [
        client.post("/api/projects", json_body={"name": "v"}, headers=key(VIEWER)),
        client.request("DELETE", f"/api/projects/{pid}", headers=key(MEMBER)),
        client.request("DELETE", f"/api/projects/{pid}", headers=key(VIEWER)),
        client.request("PATCH", f"/api/projects/{pid}", json_body={"name": "m"}, headers=key(MEMBER)),
        client.get("/api/admin/users", headers=key(MEMBER)),
        client.get("/api/admin/users", headers=key(VIEWER)),
    ]
    assert [r.status for r in forbidden] == [403] * len(forbidden)
    assert client.get("/api/admin/users", headers=key(MEMBER)).json() == {"error": "forbidden"}
    users = client.get("/api/admin/users", headers=key(ADMIN)).json()
    assert [u["username"] for u in users] == ["admin", "alice", "victor"]
    assert all("password" not in u and "api_key" not in u for u in users)


def test_validation_conflict_and_bad_json(client: Client) -> None:
    for body in ({}, {"name": ""}, {"name": "   "}, {"name": "x" * 101}, {"name": 5}):
        r = client.post("/api/projects", json_body=body, headers=key(MEMBER))
        assert (r.status, r.json()) == (422, {"error": "validation", "field": "name"}), body
    assert client.post("/api/projects", json_body={"name": "Dup"}, headers=key(MEMBER)).status == 201
    r = client.post("/api/projects", json_body={"name": "Dup"}, headers=key(ADMIN))
    assert (r.status, r.json()) == (409, {"error": "Project with this name already exists"})
    r = client.post("/api/projects", raw=b"{nope", headers={**key(ADMIN), "Content-Type": "application/json"})
    assert (r.status, r.json()) == (400, {"error": "bad_json"})


def test_pagination_default_clamp_and_search(client: Client) -> None:
    for i in range(25):
        assert client.post("/api/projects", json_body={"name": f"P{i:02d}"}, headers=key(ADMIN)).status == 201
    page = client.get("/api/projects", headers=key(VIEWER)).json()
    assert (len(page["items"]), page["total"], page["page"], page["page_size"]) == (20, 25, 1, 20)
    page = client.get("/api/projects?page=2", headers=key(VIEWER)).json()
    assert [p["name"] for p in page["items"]] == [f"P{i}" for i in range(20, 25)]
    page = client.get("/api/projects?page_size=1000", headers=key(VIEWER)).json()
    assert (page["page_size"], len(page["items"])) == (100, 25)
    page = client.get("/api/projects?q=p1", headers=key(VIEWER)).json()
    assert page["total"] == 10
    assert client.get("/api/projects?page_size=abc", headers=key(VIEWER)).status == 422


# --- deliberate bugs ----------------------------------------------------------------------
def behaviour(base: str) -> dict[str, Any]:
    """A fingerprint of every behaviour a bug flag may change, plus some it must not."""
    c = Client(base)
    pid = c.post("/api/projects", json_body={"name": "Seed"}, headers=key(ADMIN)).json()["id"]
    other = c.post("/api/projects", json_body={"name": "Other"}, headers=key(ADMIN)).json()["id"]
    return {
        "member_delete": c.request("DELETE", f"/api/projects/{pid}", headers=key(MEMBER)).status,
        "viewer_delete": c.request("DELETE", f"/api/projects/{other}", headers=key(VIEWER)).status,
        "member_admin_users": c.get("/api/admin/users", headers=key(MEMBER)).status,
        "viewer_admin_users": c.get("/api/admin/users", headers=key(VIEWER)).status,
        "viewer_create": c.post("/api/projects", json_body={"name": "v"}, headers=key(VIEWER)).status,
        "default_page_size": c.get("/api/projects", headers=key(ADMIN)).json()["page_size"],
        "clamped_page_size": c.get("/api/projects?page_size=999", headers=key(ADMIN)).json()["page_size"],
        "missing_name": c.post("/api/projects", json_body={"description": "d"}, headers=key(MEMBER)).status,
        "bad_tags": c.post("/api/projects", json_body={"name": "t", "tags": "x"}, headers=key(MEMBER)).status,
        "unauthenticated": c.get("/api/projects").status,
    }


BASELINE = {
    "member_delete": 403,
    "viewer_delete": 403,
    "member_admin_users": 403,
    "viewer_admin_users": 403,
    "viewer_create": 403,
    "default_page_size": 20,
    "clamped_page_size": 100,
    "missing_name": 422,
    "bad_tags": 422,
    "unauthenticated": 401,
}


@pytest.mark.parametrize(
    ("bug", "changed"),
    [
        (None, {}),
        ("no_rbac", {"member_delete": 204, "member_admin_users": 200}),
        ("page_size", {"default_page_size": 50}),
        ("no_validation", {"missing_name": 201}),
    ],
)
def test_each_bug_changes_exactly_its_behaviour(bug: str | None, changed: dict[str, Any]) -> None:
    server, url = start(frozenset({bug}) if bug else frozenset())
    try:
        assert behaviour(url) == {**BASELINE, **changed}
    finally:
        stop(server)


def test_unknown_bug_is_rejected() -> None:
    with pytest.raises(ValueError):
        make_server(bugs=frozenset({"typo"}))


# --- harness helpers, workspace, concurrency ----------------------------------------------
def test_debug_endpoints(client: Client) -> None:
    assert client.get("/api/debug/slow?ms=20").json() == {"slept_ms": 20}
    r = client.get("/api/debug/big?mb=2")
    assert len(r.body) == 2 * 1024 * 1024 == int(r.headers["Content-Length"])
    assert json.loads(r.body)["data"].startswith("xxx")
    r = client.get("/api/debug/badjson")
    assert r.headers["Content-Type"] == "application/json" and r.body == b'{"broken": '
    with pytest.raises(json.JSONDecodeError):
        r.json()
    echoed = client.get("/api/debug/headers", headers={"X-Trace-Id": "abc"}).json()
    assert echoed["x-trace-id"] == "abc"


def test_workspace_is_written_once(tmp_path: Any) -> None:
    (tmp_path / "README.md").write_text("mine\n")
    server = make_server(workspace=str(tmp_path))
    server.server_close()
    assert (tmp_path / "README.md").read_text() == "mine\n"  # existing files are kept
    assert "def create_project" in (tmp_path / "app" / "server.py").read_text()
    assert "class Project" in (tmp_path / "app" / "models.py").read_text()
    assert "httpx" in (tmp_path / "requirements.txt").read_text()


def test_fifty_concurrent_requests(client: Client) -> None:
    def create(i: int) -> int:
        return client.post("/api/projects", json_body={"name": f"C{i}"}, headers=key(MEMBER)).status

    def slow(_: int) -> int:
        return client.get("/api/debug/slow?ms=100").status

    with concurrent.futures.ThreadPoolExecutor(max_workers=50) as pool:
        assert list(pool.map(create, range(50))) == [201] * 50
        assert list(pool.map(slow, range(50))) == [200] * 50
    page = client.get("/api/projects?page_size=100", headers=key(ADMIN)).json()
    assert page["total"] == 50 and sorted(p["id"] for p in page["items"]) == list(range(1, 51))
