"""Session logins that read a CSRF token from HTML (auth profile ``login.prelogin``), login
failure detection (``success_redirect_not``, ``failure_body_regex``, ``follow_redirects``) and
the profile's ``browser_scheme``.

The app is a tiny stdlib server on 127.0.0.1 that behaves like Apache Superset's login:
``GET /login/`` sets a session cookie and hides a per-session token in the form; ``POST /login/``
checks the cookie, the token and the credentials, then answers 302 to ``/`` (new session cookie)
or 302 back to ``/login/``; ``/superset/welcome/`` only shows a logged-in session. Its API has
``POST /api/v1/security/login`` (JWT) and ``GET /api/v1/security/csrf_token/``; a mutating call
needs the bearer token, the ``X-CSRFToken`` header and the cookie the token came with. Every
decision the app takes is logged, so a test can tell why a login was refused.
"""

from __future__ import annotations

import json
import secrets
import threading
from collections.abc import Iterator
from http.cookies import SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import yaml

from saasbench.dag import load_dag
from saasbench.evaluation.context import RunContext, RunOptions, Target
from saasbench.evaluation.engine import Engine
from saasbench.evaluation.results import Status
from saasbench.services.auth import AuthProfileError, load_auth_profile

SUPERSET_EXAMPLE = Path(__file__).resolve().parents[1] / "docs" / "examples" / "superset-auth.yaml"
USERS = {"admin": "admin", "gamma_eval": "GammaPass123", "alpha_eval": "AlphaPass123"}
FILLER = "<p>" + "Superset keeps your charts and dashboards in one place. " * 6 + "</p>"

REGEX = 'name="csrf_token"[^>]*value="([^"]+)"'


# --- the app ---------------------------------------------------------------------------------------
class App:
    def __init__(self) -> None:
        self.sessions: dict[str, dict[str, Any]] = {}  # session id -> {"csrf": token, "user": name | None}
        self.tokens: dict[str, str] = {}  # bearer token -> user name
        self.log: list[tuple[str, str]] = []  # (path, decision)
        self.lock = threading.Lock()

    def new_session(self) -> tuple[str, dict[str, Any]]:
        sid = secrets.token_hex(12)
        state = {"csrf": secrets.token_urlsafe(24), "user": None}
        self.sessions[sid] = state
        return sid, state


class Handler(BaseHTTPRequestHandler):
    app: App  # set per server

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    # -- helpers
    def _session(self) -> tuple[str | None, dict[str, Any] | None]:
        cookie = SimpleCookie(self.headers.get("Cookie", ""))
        sid = cookie["session"].value if "session" in cookie else None
        return sid, self.app.sessions.get(sid) if sid else None

    def _bearer_user(self) -> str | None:
        auth = self.headers.get("Authorization", "")
        return self.app.tokens.get(auth.removeprefix("Bearer ")) if auth.startswith("Bearer ") else None

    def _send(
        self,
        status: int,
        body: str | bytes | dict,
        *,
        ctype: str = "text/html; charset=utf-8",
        location: str | None = None,
        cookie: str | None = None,
    ) -> None:
        if isinstance(body, dict):
            body, ctype = json.dumps(body), "application/json"
        raw = body.encode() if isinstance(body, str) else body
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(raw)))
        if location:
            self.send_header("Location", location)
        if cookie:
            self.send_header("Set-Cookie", f"session={cookie}; Path=/; HttpOnly")
        self.end_headers()
        self.wfile.write(raw)

    def _redirect(self, where: str, cookie: str | None = None) -> None:
        self._send(302, f'<a href="{where}">Redirecting...</a>', location=where, cookie=cookie)

    def _login_page(self, *, status: int = 200, flash: str = "") -> None:
        sid, state = self._session()
        cookie = None
        if state is None:
            sid, state = self.app.new_session()
            cookie = sid
        page = (
            f"<!DOCTYPE html><html><head><title>Superset</title></head><body><h1>Sign In</h1>"
            f"{f'<div class=alert>{flash}</div>' if flash else ''}"
            f'<form method="post"><input id="csrf_token" name="csrf_token" type="hidden" value="{state["csrf"]}">'
            f'<input id="username" name="username"><input id="password" name="password" type="password">'
            f'<input type="submit" value="Sign In"></form>{FILLER}</body></html>'
        )
        self._send(status, page, cookie=cookie)

    # -- routes
    def do_GET(self) -> None:
        path = urlsplit(self.path).path
        with self.app.lock:
            if path in ("/login/", "/login200/"):
                return self._login_page()
            if path == "/":
                _, state = self._session()
                return self._redirect("/superset/welcome/" if state and state["user"] else "/login/")
            if path == "/superset/welcome/":
                _, state = self._session()
                if not state or not state["user"]:
                    self.app.log.append((path, "anonymous -> /login/"))
                    return self._redirect("/login/?next=/superset/welcome/")
                self.app.log.append((path, f"shown to {state['user']}"))
                return self._send(
                    200,
                    f"<!DOCTYPE html><html><body><h1>Home</h1><p id='who'>Welcome, {state['user']}</p>"
                    f"<h2>Recent dashboards</h2>{FILLER}</body></html>",
                )
            if path == "/api/v1/me/":
                user = self._bearer_user()
                return (
                    self._send(200, {"result": {"username": user}})
                    if user
                    else self._send(401, {"msg": "Not authorized"})
                )
            if path == "/api/v1/security/csrf_token/":
                if not self._bearer_user():
                    return self._send(401, {"msg": "Missing Authorization Header"})
                sid, state = self._session()
                cookie = None
                if state is None:
                    sid, state = self.app.new_session()
                    cookie = sid
                return self._send(200, json.dumps({"result": state["csrf"]}), ctype="application/json", cookie=cookie)
            return self._send(404, "<h1>Not found</h1>")

    def do_POST(self) -> None:
        path = urlsplit(self.path).path
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length).decode()
        with self.app.lock:
            if path in ("/login/", "/login200/"):
                form = {k: v[0] for k, v in parse_qs(raw).items()}
                sid, state = self._session()
                reason = None
                if state is None:
                    reason = "no session cookie"
                elif form.get("csrf_token") != state["csrf"]:
                    reason = "bad csrf token"
                elif USERS.get(form.get("username", "")) != form.get("password"):
                    reason = "bad credentials"
                if reason:
                    self.app.log.append((path, reason))
                    if path == "/login200/":  # re-renders the form with 200, as some apps do
                        return self._login_page(flash="Invalid login. Please try again.")
                    return self._redirect("/login/")
                assert sid is not None and state is not None
                del self.app.sessions[sid]  # a fresh session on login (no fixation)
                new_sid, new_state = self.app.new_session()
                new_state["user"] = form["username"]
                self.app.log.append((path, f"logged in {form['username']}"))
                return self._redirect("/", cookie=new_sid)
            if path == "/api/v1/security/login":
                body = json.loads(raw or "{}")
                if body.get("provider") != "db" or USERS.get(body.get("username", "")) != body.get("password"):
                    return self._send(401, {"message": "Not authorized"})
                token = "jwt-" + secrets.token_hex(8)
                self.app.tokens[token] = body["username"]
                return self._send(200, {"access_token": token, "refresh_token": "r-" + token})
            if path == "/api/v1/dashboard/":
                user = self._bearer_user()
                _, state = self._session()
                if not user:
                    return self._send(401, {"msg": "Not authorized"})
                if state is None or self.headers.get("X-CSRFToken") != state["csrf"]:
                    self.app.log.append((path, "csrf missing"))
                    return self._send(400, {"errors": "400 Bad Request: The CSRF token is missing."})
                self.app.log.append((path, f"created by {user}"))
                return self._send(201, {"id": 1, "result": json.loads(raw or "{}")})
            return self._send(404, {"msg": "Not found"})


@pytest.fixture
def app() -> Iterator[tuple[str, App]]:
    state = App()
    handler = type("BoundHandler", (Handler,), {"app": state})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


# --- profiles and runs -----------------------------------------------------------------------------
def session_scheme(**login_overrides: Any) -> dict[str, Any]:
    login: dict[str, Any] = {
        "prelogin": {"method": "GET", "path": "/login/", "extract": {"csrf_token": {"regex": REGEX}}},
        "method": "POST",
        "path": "/login/",
        "body_format": "form",
        "body": {"username": "{{username}}", "password": "{{password}}", "csrf_token": "{{csrf_token}}"},
        "ok_statuses": [302],
        "success_redirect_not": "/login",
    }
    login.update(login_overrides)
    return {"kind": "form", "login": {k: v for k, v in login.items() if v is not None}}


def write_profile(tmp_path: Path, schemes: dict[str, Any], **top: Any) -> Path:
    profile = {
        "default_role": "admin",
        "schemes": schemes,
        "users": {
            "admin": {"username": "admin", "password": "admin", "email": "admin@test.com"},
            "gamma": {"username": "gamma_eval", "password": "GammaPass123", "email": "gamma_eval@test.com"},
        },
        **top,
    }
    path = tmp_path / f"auth-{len(list(tmp_path.glob('auth-*.yaml')))}.yaml"
    path.write_text(yaml.safe_dump(profile, sort_keys=False))
    return path


def node(node_id: str, *steps: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    return {
        "id": node_id,
        "steps": [{"type": code, "inputs": inputs} for code, inputs in steps],
        "scoring": {"category": "Authentication", "method": "binary", "maxScore": 1},
    }


def evaluate(tmp_path: Path, base_url: str, auth: Path, *nodes: dict[str, Any]) -> tuple[dict[str, Any], RunContext]:
    """Write the DAG as a file, load it and run the engine the way `saasbench evaluate` does."""
    dag_file = tmp_path / f"dag-{len(list(tmp_path.glob('dag-*.json')))}.json"
    dag_file.write_text(json.dumps({"nodes": list(nodes)}))
    loaded = load_dag(dag_file)
    ctx = RunContext(
        Target(base_url=base_url),
        options=RunOptions(node_timeout_s=60),
        auth_profile=load_auth_profile(auth),
        variables={"evidence_dir": str(tmp_path / "evidence")},
    )
    try:
        report = Engine(loaded.dag, ctx).run()
    finally:
        ctx.close()
    return {n.id: n for n in report.nodes}, ctx


def step_messages(result: Any) -> list[str]:
    return [s.message for s in result.steps]


# --- (a) the session login and a protected page ----------------------------------------------------
def test_session_login_with_html_csrf_then_protected_page(app: tuple[str, App], tmp_path: Path) -> None:
    base, state = app
    auth = write_profile(tmp_path, {"session": session_scheme()})
    nodes, ctx = evaluate(
        tmp_path,
        base,
        auth,
        node("ANON_IS_REDIRECTED", ("P04", {"path": "/superset/welcome/"}), ("P15", {"expected_status": 302})),
        node(
            "SESSION_LOGIN",
            ("P13", {"role": "admin", "method": "session"}),
            ("P04", {"path": "/superset/welcome/"}),
            ("P15", {"expected_status": 200}),
        ),
    )
    assert nodes["ANON_IS_REDIRECTED"].status is Status.PASSED, nodes["ANON_IS_REDIRECTED"].message
    assert nodes["SESSION_LOGIN"].status is Status.PASSED, step_messages(nodes["SESSION_LOGIN"])
    assert ctx.last_response is not None and "Welcome, admin" in ctx.last_response.text
    assert ("/login/", "logged in admin") in state.log
    # the identity kept the session cookie the login answered with (the app rotates it on login)
    identity = ctx.auth.active
    assert identity.role == "admin" and [c.name for c in identity.cookies.jar] == ["session"]
    assert state.sessions[next(iter(identity.cookies.jar)).value]["user"] == "admin"


def test_css_selector_and_follow_redirects(app: tuple[str, App], tmp_path: Path) -> None:
    base, state = app
    css = {"prelogin": {"extract": {"csrf_token": {"css": "input#csrf_token"}}}}  # path: the login path
    followed = {"follow_redirects": True, "ok_statuses": [200]}  # POST -> / -> /superset/welcome/ (200)
    auth = write_profile(tmp_path, {"css": session_scheme(**css), "followed": session_scheme(**followed)})
    nodes, _ = evaluate(
        tmp_path,
        base,
        auth,
        node(
            "CSS",
            ("P13", {"role": "gamma", "method": "css"}),
            ("P04", {"path": "/superset/welcome/"}),
            ("P15", {"expected_status": 200}),
        ),
        node("FOLLOWED", ("P13", {"role": "admin", "method": "followed"})),
        node("FOLLOWED_WRONG", ("P13", {"role": "admin", "method": "followed", "credentials": {"password": "nope"}})),
    )
    assert nodes["CSS"].status is Status.PASSED, step_messages(nodes["CSS"])
    assert nodes["FOLLOWED"].status is Status.PASSED, step_messages(nodes["FOLLOWED"])
    assert ("/superset/welcome/", "shown to admin") in state.log  # the redirects were followed with the new cookie
    wrong = nodes["FOLLOWED_WRONG"]
    assert wrong.status is Status.FAILED
    assert "credentials rejected" in wrong.steps[0].message and "/login/" in wrong.steps[0].message


# --- (b) wrong password ----------------------------------------------------------------------------
def test_wrong_password_is_credentials_rejected(app: tuple[str, App], tmp_path: Path) -> None:
    base, state = app
    auth = write_profile(tmp_path, {"session": session_scheme()})
    nodes, ctx = evaluate(
        tmp_path,
        base,
        auth,
        node(
            "WRONG",
            ("P13", {"role": "admin", "credentials": {"password": "wrong"}}),
            ("P04", {"path": "/superset/welcome/"}),
        ),
    )
    result = nodes["WRONG"]
    assert result.status is Status.FAILED
    assert [s.type for s in result.steps] == ["P13"]  # the binary chain stopped at the login
    message = result.steps[0].message
    assert "credentials rejected" in message and "redirect to /login/" in message and "login page" in message
    assert state.log[-1] == ("/login/", "bad credentials")  # the token was right: only the password was refused
    assert ctx.auth.active.role == "anonymous"


def test_form_rerendered_with_200_is_rejected_by_failure_body_regex(app: tuple[str, App], tmp_path: Path) -> None:
    base, state = app
    rerender = session_scheme(
        path="/login200/", ok_statuses=[200, 302], success_redirect_not=None, failure_body_regex=r"Invalid login\."
    )
    auth = write_profile(tmp_path, {"session": rerender})
    nodes, _ = evaluate(
        tmp_path,
        base,
        auth,
        node("RIGHT", ("P13", {"role": "admin"})),
        node("WRONG", ("P13", {"role": "gamma", "credentials": {"password": "GammaPass12"}})),
    )
    assert nodes["RIGHT"].status is Status.PASSED, step_messages(nodes["RIGHT"])
    message = nodes["WRONG"].steps[0].message
    assert nodes["WRONG"].status is Status.FAILED
    assert "credentials rejected" in message and "failure_body_regex" in message and "'Invalid login.'" in message
    assert state.log[-1] == ("/login200/", "bad credentials")


# --- (c) extraction that finds nothing ---------------------------------------------------------------
def test_pattern_that_matches_nothing_says_which_pattern_on_which_page(app: tuple[str, App], tmp_path: Path) -> None:
    base, state = app
    bad_regex = {
        "prelogin": {
            "path": "/login/",
            "extract": {"csrf_token": {"regex": 'name="authenticity_token" value="([^"]+)"'}},
        }
    }
    bad_css = {
        "prelogin": {"path": "/login/", "extract": {"csrf_token": {"css": "meta[name=csrf-token]", "attr": "content"}}}
    }
    no_attr = {
        "prelogin": {"path": "/login/", "extract": {"csrf_token": {"css": "input#csrf_token", "attr": "data-token"}}}
    }
    auth = write_profile(
        tmp_path,
        {"regex": session_scheme(**bad_regex), "css": session_scheme(**bad_css), "attr": session_scheme(**no_attr)},
    )
    nodes, _ = evaluate(
        tmp_path,
        base,
        auth,
        node("REGEX", ("P13", {"role": "admin", "method": "regex"})),
        node("CSS", ("P13", {"role": "admin", "method": "css"})),
        node("ATTR", ("P13", {"role": "admin", "method": "attr"})),
    )
    regex_msg = nodes["REGEX"].steps[0].message
    assert nodes["REGEX"].status is Status.FAILED
    assert "pre-login GET /login/" in regex_msg and "authenticity_token" in regex_msg and "matched nothing" in regex_msg
    assert "'csrf_token'" in regex_msg
    css_msg = nodes["CSS"].steps[0].message
    assert nodes["CSS"].status is Status.FAILED
    assert (
        "pre-login GET /login/" in css_msg
        and "css 'meta[name=csrf-token]'" in css_msg
        and "matched no element" in css_msg
    )
    attr_msg = nodes["ATTR"].steps[0].message
    assert "matched <input>, which has no 'data-token' attribute" in attr_msg
    assert not any(path == "/login/" and "logged in" in what for path, what in state.log)
    assert not [entry for entry in state.log if entry[0] == "/login/"]  # no login POST was sent at all


def test_unsupported_selectors_and_bad_regexes_are_profile_errors(tmp_path: Path) -> None:
    combinator = write_profile(
        tmp_path, {"s": session_scheme(prelogin={"extract": {"t": {"css": "form input[name=csrf_token]"}}})}
    )
    with pytest.raises(AuthProfileError, match="unsupported CSS selector 'form input"):
        load_auth_profile(combinator)
    regex = write_profile(tmp_path, {"s": session_scheme(failure_location_regex="(/login")})
    with pytest.raises(AuthProfileError, match="invalid regex"):
        load_auth_profile(regex)
    two = write_profile(tmp_path, {"s": session_scheme(prelogin={"extract": {"t": {"css": "#a", "regex": "b"}}})})
    with pytest.raises(AuthProfileError, match="exactly one of regex, css, json_path, cookie"):
        load_auth_profile(two)
    browser = write_profile(tmp_path, {"s": session_scheme()}, browser_scheme="nope")
    with pytest.raises(AuthProfileError, match="browser_scheme 'nope' is not among schemes"):
        load_auth_profile(browser)


# --- (d) the token really is sent ------------------------------------------------------------------
def test_without_the_prelogin_token_the_app_refuses(app: tuple[str, App], tmp_path: Path) -> None:
    base, state = app
    no_prelogin = session_scheme(prelogin=None, body={"username": "{{username}}", "password": "{{password}}"})
    forged = session_scheme(body={"username": "{{username}}", "password": "{{password}}", "csrf_token": "forged-token"})
    unknown = session_scheme(prelogin=None)  # the body still names {{csrf_token}}, which nothing provides
    auth = write_profile(
        tmp_path, {"plain": no_prelogin, "forged": forged, "unknown": unknown, "good": session_scheme()}
    )
    nodes, _ = evaluate(
        tmp_path,
        base,
        auth,
        node("PLAIN", ("P13", {"role": "admin", "method": "plain"})),
        node("FORGED", ("P13", {"role": "admin", "method": "forged"})),
        node("UNKNOWN", ("P13", {"role": "admin", "method": "unknown"})),
        node("GOOD", ("P13", {"role": "admin", "method": "good"})),
    )
    assert nodes["PLAIN"].status is Status.FAILED and "credentials rejected" in nodes["PLAIN"].steps[0].message
    assert nodes["FORGED"].status is Status.FAILED and "credentials rejected" in nodes["FORGED"].steps[0].message
    unknown_msg = nodes["UNKNOWN"].steps[0].message
    assert (
        nodes["UNKNOWN"].status is Status.FAILED
        and "{{csrf_token}}" in unknown_msg
        and "pre-login value (none)" in unknown_msg
    )
    assert nodes["GOOD"].status is Status.PASSED, step_messages(nodes["GOOD"])
    assert [what for path, what in state.log if path == "/login/"] == [
        "no session cookie",
        "bad csrf token",
        "logged in admin",
    ]


# --- the Superset example profile: JWT API with CSRF ------------------------------------------------
def test_superset_example_profile_api_and_session(app: tuple[str, App], tmp_path: Path) -> None:
    base, state = app
    profile = load_auth_profile(SUPERSET_EXAMPLE)
    assert profile.default_scheme == "jwt" and profile.browser_scheme == "session"
    assert {r: u["username"] for r, u in profile.users.items()} == {
        "admin": "admin",
        "gamma": "gamma_eval",
        "alpha": "alpha_eval",
    }
    assert all(u["email"] == f"{u['username']}@test.com" for u in profile.users.values())
    nodes, _ = evaluate(
        tmp_path,
        base,
        SUPERSET_EXAMPLE,
        node(
            "API",
            ("P13", {"role": "gamma"}),
            ("P04", {"method": "POST", "path": "/api/v1/dashboard/", "body": {"title": "x"}}),
            ("P15", {"expected_status": 201}),
        ),
        node(
            "API_NO_CSRF",
            (
                "P04",
                {
                    "method": "POST",
                    "path": "/api/v1/dashboard/",
                    "body": {"title": "y"},
                    "headers": {"Authorization": "Bearer {{gamma_token}}"},
                },
            ),
            ("P15", {"expected_status": 400}),
        ),
        node(
            "BROWSER_LOGIN",
            ("P13", {"role": "alpha", "method": "session"}),
            ("P04", {"path": "/superset/welcome/"}),
            ("P15", {"expected_status": 200}),
        ),
    )
    for name in ("API", "API_NO_CSRF", "BROWSER_LOGIN"):
        assert nodes[name].status is Status.PASSED, (name, step_messages(nodes[name]))
    assert ("/api/v1/dashboard/", "created by gamma_eval") in state.log
    assert ("/api/v1/dashboard/", "csrf missing") in state.log
    assert ("/superset/welcome/", "shown to alpha_eval") in state.log


# --- (e) browser_scheme: the browser logs in with the session while the API keeps the bearer ---------
def test_browser_scheme_renders_the_logged_in_page(app: tuple[str, App], tmp_path: Path) -> None:
    from saasbench.services.browser import find_chromium

    try:
        import playwright  # noqa: F401
    except ImportError:  # pragma: no cover
        pytest.fail("needs playwright (pip install -e '.[browser]') and chromium (apt-get install chromium)")
    assert find_chromium(), (
        "needs chromium (apt-get install chromium)"
    )  # as tests/test_primitives_browser.py: fail, not skip

    base, state = app
    example = yaml.safe_load(SUPERSET_EXAMPLE.read_text())
    with_browser = tmp_path / "with-browser.yaml"
    with_browser.write_text(yaml.safe_dump(example))
    without = dict(example)
    without.pop("browser_scheme")
    without_browser = tmp_path / "without-browser.yaml"
    without_browser.write_text(yaml.safe_dump(without))

    steps = [
        ("P13", {"role": "admin"}),
        ("RENDER_DOM", {"url": "/superset/welcome/", "settle_ms": 0, "wait_until": "load"}),
        ("P04", {"path": "/api/v1/me/"}),
        ("P15", {"expected_status": 200}),
    ]
    nodes, ctx = evaluate(tmp_path, base, with_browser, node("UI", *steps))
    ui = nodes["UI"]
    assert ui.status is Status.PASSED, step_messages(ui)
    dom = ctx.vars["rendered_dom"]
    assert "Welcome, admin" in dom and "Sign In" not in dom
    assert ui.steps[1].evidence["identity"] == "admin"
    # the API kept the bearer identity: the active identity after the render is still the JWT one
    assert ctx.auth.active.headers.get("Authorization", "").startswith("Bearer jwt-")
    assert ctx.last_response is not None and ctx.last_response.body == {"result": {"username": "admin"}}
    assert ("/login/", "logged in admin") in state.log and ("/superset/welcome/", "shown to admin") in state.log

    # control: the same profile without browser_scheme renders the login page (the bearer header alone
    # does not open the server-rendered page)
    nodes, ctx = evaluate(tmp_path, base, without_browser, node("UI", *steps))
    dom = ctx.vars["rendered_dom"]
    assert "Sign In" in dom and "Welcome, admin" not in dom
    assert [what for path, what in state.log if path == "/login/"] == ["logged in admin"]  # no second session login


def test_browser_identity_reuses_the_active_credentials_and_keeps_the_active_identity(
    app: tuple[str, App], tmp_path: Path
) -> None:
    base, state = app
    ctx = RunContext(Target(base_url=base), auth_profile=load_auth_profile(SUPERSET_EXAMPLE))
    try:
        # role "admin" with overridden credentials (as a P13 `credentials` input gives them)
        api = ctx.auth.login(ctx, "admin", credentials={"username": "gamma_eval", "password": "GammaPass123"})
        assert api.headers["Authorization"].startswith("Bearer ")
        browser = ctx.auth.browser_identity(ctx)
        assert browser is not None and browser is not api and ctx.auth.active is api
        assert "Authorization" not in browser.headers
        sid = next(c.value for c in browser.cookies.jar if c.name == "session")
        assert state.sessions[sid]["user"] == "gamma_eval"  # logged in with the active credentials, not admin's
        assert ctx.auth.browser_identity(ctx) is browser  # once per run
        assert [what for path, what in state.log if path == "/login/"] == ["logged in gamma_eval"]
        ctx.auth.activate_anonymous()
        assert ctx.auth.browser_identity(ctx) is None
        as_role = ctx.auth.browser_identity(ctx, "alpha")  # as_role: logged in with browser_scheme too
        assert as_role is not None and "Authorization" not in as_role.headers and ctx.auth.active.role == "anonymous"
    finally:
        ctx.close()


def test_the_superset_example_in_the_docs_loads() -> None:
    from saasbench.services.auth import AuthProfile

    text = (Path(__file__).resolve().parents[1] / "docs" / "dag-semantics.md").read_text()
    block = text.split("## Auth profiles", 1)[1].split("```yaml", 1)[1].split("```", 1)[0]
    profile = AuthProfile.model_validate(yaml.safe_load(block))
    example = load_auth_profile(SUPERSET_EXAMPLE)
    assert profile.browser_scheme == example.browser_scheme == "session"
    assert profile.users == example.users
    assert profile.schemes["session"].login == example.schemes["session"].login
    assert profile.schemes["jwt"].csrf == example.schemes["jwt"].csrf
