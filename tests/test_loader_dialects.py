"""Primitive-input dialects of the public DAGs that the loader generalises (and their run-time meaning).

Each synthetic snippet reproduces a construct seen in a public SaaSBench DAG (task_mjobbzsi's
dag_smoke.json unless said otherwise), so CI covers it without the public files: the snippet must
load with zero errors, every rewrite must be listed as a normalisation, and every DAG defect must
be a warning naming the node and the field. Browser run-time behaviour is in
tests/test_browser_dialects.py; the whole mjobbzsi smoke DAG runs in tests/test_conformance_run.py.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from saasbench.context import RunContext, Target
from saasbench.dag import DagLoadError, LoadResult, load_dag_data
from saasbench.primitives.registry import REGISTRY
from saasbench.results import StepResult


def load(*steps: dict[str, Any]) -> LoadResult:
    """One node with these steps; raises DagLoadError on errors."""
    return load_dag_data({"nodes": [{"id": "N", "steps": list(steps), "scoring": {"method": "binary", "maxScore": 1}}]})


def issues(code: str, inputs: dict[str, Any]) -> list[tuple[str, str | None, str]]:
    try:
        found = load({"type": code, "inputs": inputs}).issues
    except DagLoadError as exc:
        found = exc.issues
    return [(i.kind, i.field, i.message) for i in found]


def kinds(code: str, inputs: dict[str, Any], kind: str) -> list[str]:
    return [f"{field}: {message}" for k, field, message in issues(code, inputs) if k == kind]


def run(ctx: RunContext, code: str, raw: dict[str, Any]) -> StepResult:
    """Run one step the way the engine does: resolve (except raw fields), validate, call."""
    spec = REGISTRY.spec(code)
    assert spec is not None and spec.fn is not None and spec.inputs is not None
    resolved = {k: (v if k in spec.raw_fields else ctx.resolve(v)) for k, v in raw.items()}
    return spec.fn(spec.inputs.model_validate(resolved), ctx)


# --- P18 browser_interaction -------------------------------------------------------------------------
MJOBBZSI_P18 = {"steps": [
    {"action": "navigate", "url": "http://localhost:8026/autohideroom"},
    {"action": "wait", "timeout": 12000},
    {"action": "click", "selector": "[data-testid='prejoin.joinMeeting'], button:has-text('Join')"},
    {"action": "type", "selector": "#chat-input", "text": "Hello eval test"},
    {"action": "press", "key": "Enter"},
    {"action": "mouse_move", "x": 100, "y": 100},
    {"action": "wait", "timeout": 6000}]}


def test_p18_mjobbzsi_steps_load_with_every_rewrite_listed() -> None:
    assert not kinds("P18", MJOBBZSI_P18, "error") and not kinds("P18", MJOBBZSI_P18, "warning")
    notes = "\n".join(kinds("P18", MJOBBZSI_P18, "normalisation"))
    for fragment in ("steps[0]: browser action 'navigate' -> 'goto'", "steps[1]: browser step 'timeout' -> 'wait_ms' (12000 ms)",
                     "steps[3]: 'text' -> 'value'", "steps[4]: 'key' -> 'value'", "steps[6]: browser step 'timeout' -> 'wait_ms'"):
        assert fragment in notes, fragment
    steps = REGISTRY.spec("P18").inputs.model_validate(MJOBBZSI_P18).steps
    assert [s.action for s in steps] == ["goto", "wait", "click", "type", "press", "mouse_move", "wait"]
    assert steps[1].wait_ms == 12000 and steps[3].value == "Hello eval test" and (steps[5].x, steps[5].y) == (100, 100)


def test_p18_without_url_opens_the_app_root() -> None:
    inputs = {"steps": [{"action": "screenshot", "name": "conference_full"}]}  # UI_CONFERENCE_QUALITY
    assert not kinds("P18", inputs, "error") and not kinds("P18", inputs, "warning")
    assert any("the app's root ({{base_url}}/)" in n for n in kinds("P18", inputs, "normalisation"))
    model = REGISTRY.spec("P18").inputs.model_validate(inputs)
    assert model.url == "/" and model.steps[0].name == "conference_full"
    assert REGISTRY.spec("P18").inputs.model_validate({"steps": [{"action": "goto", "url": "/x"}]}).url is None


def test_p18_unknown_and_script_actions_are_no_op_steps_with_warnings() -> None:
    inputs = {"url": "/", "steps": [{"action": "evaluate", "script": "document.title = 'x'"},
                                    {"action": "frobnicate", "selector": "#a"},
                                    {"action": "click", "selector": "#b", "colour": "red"}]}
    warnings = kinds("P18", inputs, "warning")
    assert not kinds("P18", inputs, "error")
    assert any(w.startswith("steps[0].inputs.steps[0].action: P18: browser action 'evaluate' (page JavaScript") for w in warnings)
    assert any(w.startswith("steps[0].inputs.steps[1].action: P18: browser action 'frobnicate' is not supported") for w in warnings)
    assert any(w.startswith("steps[0].inputs.steps[2].colour: P18: browser step key 'colour' not understood") for w in warnings)
    assert len(warnings) == 3  # the no-op steps' own keys ('script', 'selector') are not warned twice
    steps = REGISTRY.spec("P18").inputs.model_validate(inputs).steps
    assert [(s.action, s.skipped_action) for s in steps] == [("noop", "evaluate"), ("noop", "frobnicate"), ("click", None)]


def test_p18_action_aliases_and_timing_keys() -> None:
    model = REGISTRY.spec("P18").inputs.model_validate({"url": "/", "steps": [
        {"action": "wait", "ms": 1500, "comment": "hydration"},   # generated SaaSBench tests: wait {ms}
        {"action": "wait", "seconds": 2},
        {"action": "click", "selector": "#a", "timeout": 300},    # timeout of a click: the click's own
        {"action": "mousemove"},
        {"action": "scroll", "direction": "bottom"},
        {"action": "refresh"},
        {"action": "assert_text", "text": "Saved"},
        {"action": "wait", "text": "Done"},
        {"action": "wait_for_load_state"},
        {"action": "take_screenshot", "filename": "after.png"},
        {"action": "waitForSelector", "selector": "#x"},          # camelCase spellings
        {"action": "goBack"}]})
    got = [(s.action, s.wait_ms, s.timeout_ms, s.value) for s in model.steps]
    assert got == [("wait", 1500, None, None), ("wait", 2000, None, None), ("click", None, 300, None),
                   ("mouse_move", None, None, None), ("scroll", None, None, "bottom"), ("reload", None, None, None),
                   ("expect_text", None, None, "Saved"), ("expect_text", None, None, "Done"), ("wait", None, None, None),
                   ("screenshot", None, None, None), ("wait", None, None, None), ("back", None, None, None)]
    assert model.steps[9].name == "after.png"
    assert any("error" in k for k, *_ in issues("P18", {"url": "/", "steps": [{"action": "click"}]}))  # still needs a selector


def test_screenshot_actions_are_browser_steps() -> None:
    inputs = {"url": "{{base_url}}/SaasBenchChatRoom", "name": "UI_CHAT_EXPERIENCE", "settle_ms": 9000,
              "actions": [{"action": "wait", "timeout": 3000}, {"action": "press", "key": "c"}, {"action": "mousemove"}]}
    assert not kinds("SCREENSHOT", inputs, "error") and not kinds("SCREENSHOT", inputs, "warning")
    notes = "\n".join(kinds("SCREENSHOT", inputs, "normalisation"))
    assert "actions[0]: browser step 'timeout' -> 'wait_ms' (3000 ms)" in notes and "actions[2]: browser action 'mousemove'" in notes
    model = REGISTRY.spec("SCREENSHOT").inputs.model_validate({**inputs, "url": "/x"})
    assert [a.action for a in model.actions] == ["wait", "press", "mouse_move"]


# --- P19 dom_assertion -------------------------------------------------------------------------------
def test_p19_check_expected_dialect() -> None:
    inputs = {"assertions": [{"selector": "[class*='toolbox'][class*='visible']", "check": "visibility_or_opacity",
                              "expected": "hidden_or_reduced"}]}  # EDGE_TOOLBAR_AUTOHIDE_RUNTIME
    assert not kinds("P19", inputs, "error") and not kinds("P19", inputs, "warning")
    assert any("assertions[0]: DOM assertion 'check: visibility_or_opacity'" in n for n in kinds("P19", inputs, "normalisation"))
    a = REGISTRY.spec("P19").inputs.model_validate(inputs).assertions[0]
    assert a.visible is False and a.faded_counts_as_hidden and a.should_exist is None
    shown = REGISTRY.spec("P19").inputs.model_validate({"assertions": [{"selector": "h1", "check": "visible"}]}).assertions[0]
    assert shown.visible is True and shown.should_exist is True
    text = REGISTRY.spec("P19").inputs.model_validate({"assertions": [
        {"selector": "h1", "textContains": "Dashboard", "caseInsensitive": True, "i18nFallback": ["Tableau de bord"],
         "comment": "accept either"}]}).assertions[0]
    assert text.case_insensitive and text.text_any_of == ["Tableau de bord"] and text.text_contains == "Dashboard"
    warnings = kinds("P19", {"assertions": [{"selector": "a", "check": "glow", "expected": 1}, {"selector": "b", "colour": 1}]}, "warning")
    assert any(w.startswith("steps[0].inputs.assertions[0].check: P19: DOM assertion check 'glow'") for w in warnings)
    assert any(w.startswith("steps[0].inputs.assertions[1].colour: P19: DOM assertion key 'colour'") for w in warnings)


# --- P07 json_value_assert ---------------------------------------------------------------------------
def test_p07_empty_assertions_load_with_a_warning_and_pass() -> None:
    inputs = {"assertions": []}  # LOBBY_DISPLAY_NAME_REQUIRED
    assert not kinds("P07", inputs, "error")
    assert kinds("P07", inputs, "warning") == [
        "steps[0].inputs.assertions: P07: no assertions: this step checks nothing and passes (a DAG defect)"]
    assert kinds("P07", {}, "warning") == kinds("P07", inputs, "warning")
    result = run(RunContext(Target()), "P07", inputs)  # no document needed: nothing is checked
    assert result.passed and "nothing checked" in result.message


def test_p07_checkable_top_level_field_becomes_the_assertion() -> None:
    for inputs in ({"assertions": [], "pattern": "sid='\\w+'"}, {"pattern": "sid='\\w+'"}, {"regex": "sid='\\w+'"}):
        assert not kinds("P07", inputs, "warning") and not kinds("P07", inputs, "error")
        model = REGISTRY.spec("P07").inputs.model_validate(inputs)
        assert [(a.path, a.op) for a in model.assertions] == [("$._body", "matches_regex")]
    assert any("that field is the assertion" in n for n in kinds("P07", {"assertions": [], "pattern": "x"}, "normalisation"))
    ctx = RunContext(Target())
    ctx.last_document = "<body sid='abc123'/>"
    assert run(ctx, "P07", {"assertions": [], "pattern": "sid='\\w+'"}).passed
    ctx.last_document = "<body/>"
    assert not run(ctx, "P07", {"pattern": "sid='\\w+'"}).passed


def test_p07_body_contains_pseudo_path() -> None:
    inputs = {"assertions": [{"path": "body_contains", "expected": "resolution"}, {"path": "body_contains", "expected": "p2p"}]}
    assert not kinds("P07", inputs, "warning") and not kinds("P07", inputs, "error")
    assert any("pseudo-path 'body_contains' -> path '$._body'" in n for n in kinds("P07", inputs, "normalisation"))
    ctx = RunContext(Target())
    ctx.last_document = "var config = { resolution: 720, p2p: { enabled: true } };"  # GET /config.js
    assert run(ctx, "P07", inputs).passed
    ctx.last_document = {"resolution": 720}  # a JSON body: its text
    result = run(ctx, "P07", inputs)
    assert not result.passed and "p2p" in result.message
    assert run(ctx, "P07", {"body_contains": ["resolution", "720"]}).passed
    assert not run(ctx, "P07", {"assertions": [{"path": "body_not_contains", "expected": "resolution"}]}).passed


def test_p07_unknown_assertion_keys_are_warnings() -> None:
    warnings = kinds("P07", {"assertions": [{"path": "$.a", "expected": 1, "check": "loose"}]}, "warning")
    assert warnings == ["steps[0].inputs: P07: assertion key 'check' not understood (ignored; a DAG defect)"]


# --- P14 permission_check ----------------------------------------------------------------------------
def test_p14_capability_action_is_a_warning() -> None:
    inputs = {"role": "moderator", "action": "kickParticipant", "expected_result": "allowed", "context": "conference_muc"}
    assert not kinds("P14", inputs, "error")
    warnings = kinds("P14", inputs, "warning")
    assert any(w.startswith("steps[0].inputs.action: P14: action 'kickParticipant' is not 'METHOD /path'") for w in warnings)
    assert any(w.startswith("steps[0].inputs.context:") for w in warnings)
    assert not [w for w in kinds("P14", {"action": "DELETE /api/x/1"}, "warning")]


# --- P21 WebSocket dialect ---------------------------------------------------------------------------
OPEN = "<open xmlns='urn:ietf:params:xml:ns:xmpp-framing' to='conference.local' version='1.0'/>"
WS_SINGLE = {"url": "ws://localhost:8026/xmpp-websocket", "subprotocol": "xmpp", "send": OPEN,
             "expect_message": {"timeout_ms": 5000, "match": {"content_contains": "<open"}}}  # XMPP_WS_CONNECT
WS_STEPS = {"url": "ws://localhost:8026/xmpp-websocket", "subprotocol": "xmpp", "timeout_ms": 15000, "steps": [
    {"send": OPEN, "expect": "<open"}, {"expect": "ANONYMOUS"},
    {"send": "<auth xmlns='urn:ietf:params:xml:ns:xmpp-sasl' mechanism='ANONYMOUS'/>", "expect": "<success"},
    {"send": OPEN, "expect": "bind"},
    {"send": "<iq type='set' id='bind_2'><bind xmlns='urn:ietf:params:xml:ns:xmpp-bind'/></iq>",
     "expect_any": ["jid", "<bind", "not-authorized"]}]}  # LOBBY_DISPLAY_NAME_REQUIRED


def test_p21_websocket_forms_load() -> None:
    for inputs in (WS_SINGLE, WS_STEPS):
        assert not kinds("P21", inputs, "error") and not kinds("P21", inputs, "warning")
    notes = "\n".join(kinds("P21", WS_SINGLE, "normalisation"))
    assert "top-level 'send'/'expect_message' -> steps[0]" in notes and "steps[0]: 'expect_message {timeout_ms, match}'" in notes
    model = REGISTRY.spec("P21").inputs.model_validate(WS_SINGLE)
    assert model.subprotocol == ["xmpp"] and model.steps[0].send == OPEN and model.steps[0].expect == "<open"
    assert model.steps[0].timeout_ms == 5000
    # the log check is unchanged; a step with neither 'pattern' nor 'url' is still an error
    assert not kinds("P21", {"log_path": "app", "pattern": "listening"}, "error")
    assert any("needs 'pattern' (log check) or 'url'" in e for e in kinds("P21", {"log_path": "app"}, "error"))
    assert any("match key 'zzz'" in w for w in kinds("P21", {**WS_SINGLE, "expect_message": {"match": {"zzz": 1}}}, "warning"))


def _xmpp(ws: Any) -> None:
    """A tiny XMPP-over-WebSocket responder (the shape of Prosody's answers)."""
    authed = False
    for message in ws:
        if "<open" in message:
            ws.send("<open xmlns='urn:ietf:params:xml:ns:xmpp-framing' id='s1' version='1.0'/>")
            ws.send("<stream:features><bind xmlns='urn:ietf:params:xml:ns:xmpp-bind'/></stream:features>" if authed else
                    "<stream:features><mechanisms><mechanism>ANONYMOUS</mechanism></mechanisms></stream:features>")
        elif "<auth" in message:
            authed = True
            ws.send("<success xmlns='urn:ietf:params:xml:ns:xmpp-sasl'/>")
        elif "<iq" in message:
            ws.send("<iq type='result' id='bind_2'><bind><jid>a@conference.local/x</jid></bind></iq>")
        elif message == "bye":
            ws.close()
            return


@pytest.fixture(scope="module")
def xmpp_ws() -> Iterator[str]:
    from websockets.sync.server import serve

    quiet = logging.getLogger("test_loader_dialects.ws")
    quiet.setLevel(logging.CRITICAL)  # refused handshakes are part of the test
    server = serve(_xmpp, "127.0.0.1", 0, subprotocols=["xmpp"], logger=quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.socket.getsockname()[1]}"
    server.shutdown()
    thread.join(5)


def _ctx(base: str) -> RunContext:
    ctx = RunContext(Target(base_url=base))
    ctx.start_node_clock(30)
    return ctx


def test_p21_websocket_exchange_runs(xmpp_ws: str) -> None:
    ws_url = xmpp_ws.replace("http://", "ws://") + "/xmpp-websocket"
    ctx = _ctx(xmpp_ws)
    single = run(ctx, "P21", {**WS_SINGLE, "url": ws_url})
    assert single.passed, single.message
    assert single.evidence["negotiated_subprotocol"] == "xmpp" and single.evidence["transcript"][0] == {"sent": OPEN}
    full = run(ctx, "P21", {**WS_STEPS, "url": "/xmpp-websocket"})  # relative: joined to the base URL, http -> ws
    assert full.passed, full.message
    assert [s["passed"] for s in full.evidence["steps"]] == [True] * 5 and full.evidence["steps"][4]["matched"] == "<bind"  # the earliest of expect_any
    # the exchange is the last document: a following P07 asserts on it
    assert run(ctx, "P07", {"body_contains": "a@conference.local"}).passed
    assert run(ctx, "P07", {"assertions": [{"path": "$.received.length", "op": "gte", "expected": 6}]}).passed


def test_p21_websocket_failures(xmpp_ws: str) -> None:
    ctx = _ctx(xmpp_ws)
    missing = run(ctx, "P21", {"url": "/x", "subprotocol": "xmpp", "timeout_ms": 600, "steps": [{"send": OPEN, "expect": "<never>"}]})
    assert not missing.passed and "'<never>' not received within 0.6s" in missing.message
    closed = run(ctx, "P21", {"url": "/x", "subprotocol": "xmpp", "steps": [{"send": "bye", "expect": "anything"}]})
    assert not closed.passed and "closed the WebSocket" in closed.message
    rejected = run(ctx, "P21", {"url": "/x", "send": OPEN})  # no subprotocol: the handshake is refused (HTTP 400)
    assert not rejected.passed and not rejected.unreachable and "HTTP 400" in rejected.message
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    refused = run(ctx, "P21", {"url": f"ws://localhost:{port}/xmpp-websocket", "send": OPEN})
    assert not refused.passed and refused.unreachable and "did not open" in refused.message
    offsite = run(ctx, "P21", {"url": "ws://example.com/socket", "send": OPEN})
    assert not offsite.passed and "not the app's host" in offsite.message
    not_ws = run(_ctx("http://127.0.0.1:9"), "P21", {"url": "/socket", "send": OPEN, "timeout_ms": 500})
    assert not not_ws.passed and not_ws.unreachable
