"""Run-time meaning of the browser dialects generalised for the public DAGs (task_mjobbzsi).

P18 without a url (the app's root), the new step actions (mouse_move, scroll, reload,
expect_text), no-op steps for actions that are not run, step-level screenshot names,
SCREENSHOT ``actions`` and P19 visibility checks (``check: visibility_or_opacity``). Drives a
real headless Chromium (Debian ``chromium`` + ``playwright``) against pages served on 127.0.0.1;
the loader side of the same dialects is in tests/test_loader_dialects.py.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from saasbench.evaluation.context import RunContext, RunOptions, Target
from saasbench.evaluation.results import StepResult
from saasbench.primitives.registry import REGISTRY
from saasbench.services.browser import find_chromium

try:
    import playwright  # noqa: F401

    HAVE_PLAYWRIGHT = True
except ImportError:  # pragma: no cover
    HAVE_PLAYWRIGHT = False

# Not a skip: CI installs both (scripts/test.sh); a machine without them fails loudly.
assert HAVE_PLAYWRIGHT and find_chromium(), "needs playwright (pip) and chromium (apt-get install chromium)"

FILLER = "<p>" + "Lorem ipsum dolor sit amet. " * 20 + "</p>"
PAGES = {
    "/": "<!DOCTYPE html><html><body><h1>App root</h1>" + FILLER + "</body></html>",
    "/interact.html": """<!DOCTYPE html><html><body style="margin:0">
<p id="pos">no move</p><p id="chat">chat closed</p><p id="scroll">top</p><p id="loads"></p>
<div style="height:4000px">tall</div><p id="end">the end</p>
<script>
  document.addEventListener('mousemove', e => { document.getElementById('pos').textContent = 'pos ' + e.clientX + ',' + e.clientY; });
  document.addEventListener('keydown', e => { if (e.key === 'c') document.getElementById('chat').textContent = 'chat open'; });
  window.addEventListener('scroll', () => { if (window.scrollY > 1000) document.getElementById('scroll').textContent = 'scrolled'; });
  const n = Number(sessionStorage.getItem('loads') || 0) + 1; sessionStorage.setItem('loads', String(n));
  document.getElementById('loads').textContent = 'loads ' + n;
</script></body></html>""",
    "/visibility.html": """<!DOCTYPE html><html><body>
<div id="shown" class="toolbox">shown</div>
<div id="hidden" style="display:none">hidden</div>
<div id="ghost" style="visibility:hidden">ghost</div>
<div id="faded" style="opacity:0.3">faded</div>
<div style="opacity:0.5"><span id="inner">inside a half-transparent parent</span></div>
<div id="gone" style="opacity:0">gone</div>"""
    + FILLER
    + "</body></html>",
}


class Handler(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        body = PAGES.get(self.path.split("?", 1)[0])
        status = 200 if body is not None else 404
        data = (body or "<html><body>not found</body></html>").encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture(scope="module")
def site() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def ctx(site: str, tmp_path: Path) -> Iterator[RunContext]:
    context = RunContext(Target(base_url=site), options=RunOptions(node_timeout_s=60))
    context.vars["evidence_dir"] = str(tmp_path / "evidence")
    context.start_node_clock(60)
    yield context
    context.close()


def run(ctx: RunContext, code: str, raw: dict[str, Any]) -> StepResult:
    spec = REGISTRY.spec(code)
    assert spec is not None and spec.fn is not None and spec.inputs is not None
    resolved = {k: (v if k in spec.raw_fields else ctx.resolve(v)) for k, v in raw.items()}
    return spec.fn(spec.inputs.model_validate(resolved), ctx)


def test_p18_without_url_opens_the_root_and_names_step_screenshots(ctx: RunContext, site: str) -> None:
    result = run(ctx, "P18", {"steps": [{"action": "screenshot", "name": "conference_full"}], "settle_ms": 0})
    assert result.passed, result.message
    assert result.evidence["final_url"] == f"{site}/" and "App root" in ctx.vars["rendered_dom"]
    shot = Path(result.evidence["screenshots"][0]["path"])
    assert shot.name.endswith("-conference_full.png") and shot.stat().st_size > 1024
    assert ctx.vars["last_screenshot_path"] == str(shot)


def test_p18_new_actions_and_no_op_steps(ctx: RunContext) -> None:
    result = run(
        ctx,
        "P18",
        {
            "settle_ms": 0,
            "action_timeout_ms": 3000,
            "steps": [
                {"action": "navigate", "url": "/interact.html"},
                {"action": "mouse_move", "x": 40, "y": 30},
                {"action": "assert_text", "selector": "#pos", "text": "pos 40,30"},
                {"action": "press", "key": "c"},
                {"action": "wait_for_text", "text": "chat open"},
                {"action": "scroll", "direction": "bottom"},
                {"action": "expect_text", "selector": "#scroll", "value": "scrolled"},
                {"action": "refresh"},
                {"action": "expect_text", "selector": "#loads", "value": "loads 2"},
                {"action": "goto", "url": "/"},
                {"action": "goBack"},
                {"action": "waitForSelector", "selector": "#loads"},
                {"action": "evaluate", "script": "document.body.innerHTML = 'faked'"},
                {"action": "wait", "timeout": 50},
            ],
        },
    )
    assert result.passed, result.message
    steps = result.evidence["steps"]
    assert [s["passed"] for s in steps] == [True] * 14
    assert steps[12]["action"] == "noop" and steps[12]["skipped"] == "evaluate"
    assert "1 no-op step(s) not run: 'evaluate'" in result.message
    assert result.evidence["final_url"].endswith("/interact.html")
    assert "faked" not in ctx.vars["rendered_dom"] and "loads" in ctx.vars["rendered_dom"]
    missing = run(
        ctx,
        "P18",
        {
            "url": "/interact.html",
            "settle_ms": 0,
            "steps": [{"action": "expect_text", "value": "never shown", "timeout": 400}],
        },
    )
    assert not missing.passed and "text 'never shown' not found within 0.4s" in missing.message


def test_screenshot_runs_its_actions_best_effort(ctx: RunContext) -> None:
    result = run(
        ctx,
        "SCREENSHOT",
        {
            "url": "{{base_url}}/interact.html",
            "name": "UI_CHAT",
            "settle_ms": 0,
            "actions": [{"action": "mousemove"}, {"action": "press", "key": "c"}, {"action": "wait", "timeout": 100}],
        },
    )
    assert result.passed, result.message
    assert [a["passed"] for a in result.evidence["actions"]] == [True, True, True]
    assert "chat open" in ctx.vars["rendered_dom"]  # the DOM after the actions, as the screenshot shows it
    assert Path(result.evidence["screenshot"]["path"]).name.endswith("-UI_CHAT.png")
    partial = run(
        ctx,
        "SCREENSHOT",
        {
            "url": "/interact.html",
            "settle_ms": 0,
            "actions": [{"action": "click", "selector": "#missing", "timeout": 300}],
        },
    )
    assert partial.passed and "1/1 action(s) failed (best effort)" in partial.message


def test_p19_visibility_checks(ctx: RunContext) -> None:
    def holds(assertion: dict[str, Any]) -> bool:
        result = run(
            ctx,
            "P19",
            {"url": "/visibility.html", "settle_ms": 0, "assertion_timeout_ms": 300, "assertions": [assertion]},
        )
        return result.passed

    assert holds({"selector": "#shown", "check": "visible"})
    assert not holds({"selector": "#shown", "check": "visibility", "expected": "hidden"})
    for hidden in ("#hidden", "#ghost", "#gone", "#no-such-element"):
        assert holds({"selector": hidden, "check": "visibility", "expected": "hidden"}), hidden
        assert not holds({"selector": hidden, "check": "visible"}), hidden
    # a faded element is visible, but "hidden_or_reduced" accepts it (EDGE_TOOLBAR_AUTOHIDE_RUNTIME)
    assert not holds({"selector": "#faded", "check": "visibility", "expected": "hidden"})
    assert holds({"selector": "#faded", "check": "visibility_or_opacity", "expected": "hidden_or_reduced"})
    assert holds({"selector": "#inner", "check": "visibility_or_opacity", "expected": "hidden_or_reduced"})
    assert not holds({"selector": "#shown", "check": "visibility_or_opacity", "expected": "hidden_or_reduced"})
    assert holds({"selector": "h1, #shown", "textContains": "SHOWN", "caseInsensitive": True})
    assert holds({"selector": "#shown", "textContains": "absent", "i18nFallback": ["show"]})
