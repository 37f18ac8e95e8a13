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
from dialects import issues, kinds, run

from saasbench.dag import load_dag_data
from saasbench.evaluation.context import RunContext, Target
from saasbench.primitives.registry import REGISTRY

# --- P18 browser_interaction -------------------------------------------------------------------------
MJOBBZSI_P18 = {
    "steps": [
        {"action": "navigate", "url": "http://localhost:8026/autohideroom"},
        {"action": "wait", "timeout": 12000},
        {"action": "click", "selector": "[data-testid='prejoin.joinMeeting'], button:has-text('Join')"},
        {"action": "type", "selector": "#chat-input", "text": "Hello eval test"},
        {"action": "press", "key": "Enter"},
        {"action": "mouse_move", "x": 100, "y": 100},
        {"action": "wait", "timeout": 6000},
    ]
}


def test_p18_mjobbzsi_steps_load_with_every_rewrite_listed() -> None:
    assert not kinds("P18", MJOBBZSI_P18, "error") and not kinds("P18", MJOBBZSI_P18, "warning")
    notes = "\n".join(kinds("P18", MJOBBZSI_P18, "normalisation"))
    for fragment in (
        "steps[0]: browser action 'navigate' -> 'goto'",
        "steps[1]: browser step 'timeout' -> 'wait_ms' (12000 ms)",
        "steps[3]: 'text' -> 'value'",
        "steps[4]: 'key' -> 'value'",
        "steps[6]: browser step 'timeout' -> 'wait_ms'",
    ):
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
    inputs = {
        "url": "/",
        "steps": [
            {"action": "evaluate", "script": "document.title = 'x'"},
            {"action": "frobnicate", "selector": "#a"},
            {"action": "click", "selector": "#b", "colour": "red"},
        ],
    }
    warnings = kinds("P18", inputs, "warning")
    assert not kinds("P18", inputs, "error")
    assert any(
        w.startswith("steps[0].inputs.steps[0].action: P18: browser action 'evaluate' (page JavaScript")
        for w in warnings
    )
    assert any(
        w.startswith("steps[0].inputs.steps[1].action: P18: browser action 'frobnicate' is not supported")
        for w in warnings
    )
    assert any(
        w.startswith("steps[0].inputs.steps[2].colour: P18: browser step key 'colour' not understood") for w in warnings
    )
    assert len(warnings) == 3  # the no-op steps' own keys ('script', 'selector') are not warned twice
    steps = REGISTRY.spec("P18").inputs.model_validate(inputs).steps
    assert [(s.action, s.skipped_action) for s in steps] == [
        ("noop", "evaluate"),
        ("noop", "frobnicate"),
        ("click", None),
    ]


def test_p18_action_aliases_and_timing_keys() -> None:
    model = REGISTRY.spec("P18").inputs.model_validate(
        {
            "url": "/",
            "steps": [
                {"action": "wait", "ms": 1500, "comment": "hydration"},  # generated SaaSBench tests: wait {ms}
                {"action": "wait", "seconds": 2},
                {"action": "click", "selector": "#a", "timeout": 300},  # timeout of a click: the click's own
                {"action": "mousemove"},
                {"action": "scroll", "direction": "bottom"},
                {"action": "refresh"},
                {"action": "assert_text", "text": "Saved"},
                {"action": "wait", "text": "Done"},
                {"action": "wait_for_load_state"},
                {"action": "take_screenshot", "filename": "after.png"},
                {"action": "waitForSelector", "selector": "#x"},  # camelCase spellings
                {"action": "goBack"},
            ],
        }
    )
    got = [(s.action, s.wait_ms, s.timeout_ms, s.value) for s in model.steps]
    assert got == [
        ("wait", 1500, None, None),
        ("wait", 2000, None, None),
        ("click", None, 300, None),
        ("mouse_move", None, None, None),
        ("scroll", None, None, "bottom"),
        ("reload", None, None, None),
        ("expect_text", None, None, "Saved"),
        ("expect_text", None, None, "Done"),
        ("wait", None, None, None),
        ("screenshot", None, None, None),
        ("wait", None, None, None),
        ("back", None, None, None),
    ]
    assert model.steps[9].name == "after.png"
    assert any(
        "error" in k for k, *_ in issues("P18", {"url": "/", "steps": [{"action": "click"}]})
    )  # still needs a selector


def test_screenshot_actions_are_browser_steps() -> None:
    inputs = {
        "url": "{{base_url}}/SaasBenchChatRoom",
        "name": "UI_CHAT_EXPERIENCE",
        "settle_ms": 9000,
        "actions": [{"action": "wait", "timeout": 3000}, {"action": "press", "key": "c"}, {"action": "mousemove"}],
    }
    assert not kinds("SCREENSHOT", inputs, "error") and not kinds("SCREENSHOT", inputs, "warning")
    notes = "\n".join(kinds("SCREENSHOT", inputs, "normalisation"))
    assert (
        "actions[0]: browser step 'timeout' -> 'wait_ms' (3000 ms)" in notes
        and "actions[2]: browser action 'mousemove'" in notes
    )
    model = REGISTRY.spec("SCREENSHOT").inputs.model_validate({**inputs, "url": "/x"})
    assert [a.action for a in model.actions] == ["wait", "press", "mouse_move"]


# --- P19 dom_assertion -------------------------------------------------------------------------------
def test_p19_check_expected_dialect() -> None:
    inputs = {
        "assertions": [
            {
                "selector": "[class*='toolbox'][class*='visible']",
                "check": "visibility_or_opacity",
                "expected": "hidden_or_reduced",
            }
        ]
    }  # EDGE_TOOLBAR_AUTOHIDE_RUNTIME
    assert not kinds("P19", inputs, "error") and not kinds("P19", inputs, "warning")
    assert any(
        "assertions[0]: DOM assertion 'check: visibility_or_opacity'" in n
        for n in kinds("P19", inputs, "normalisation")
    )
    a = REGISTRY.spec("P19").inputs.model_validate(inputs).assertions[0]
    assert a.visible is False and a.faded_counts_as_hidden and a.should_exist is None
    shown = (
        REGISTRY.spec("P19")
        .inputs.model_validate({"assertions": [{"selector": "h1", "check": "visible"}]})
        .assertions[0]
    )
    assert shown.visible is True and shown.should_exist is True
    text = (
        REGISTRY.spec("P19")
        .inputs.model_validate(
            {
                "assertions": [
                    {
                        "selector": "h1",
                        "textContains": "Dashboard",
                        "caseInsensitive": True,
                        "i18nFallback": ["Tableau de bord"],
                        "comment": "accept either",
                    }
                ]
            }
        )
        .assertions[0]
    )
    assert text.case_insensitive and text.text_any_of == ["Tableau de bord"] and text.text_contains == "Dashboard"
    warnings = kinds(
        "P19",
        {"assertions": [{"selector": "a", "check": "glow", "expected": 1}, {"selector": "b", "colour": 1}]},
        "warning",
    )
    assert any(w.startswith("steps[0].inputs.assertions[0].check: P19: DOM assertion check 'glow'") for w in warnings)
    assert any(w.startswith("steps[0].inputs.assertions[1].colour: P19: DOM assertion key 'colour'") for w in warnings)


# --- P07 json_value_assert ---------------------------------------------------------------------------
def test_p07_empty_assertions_load_with_a_warning_and_pass() -> None:
    inputs = {"assertions": []}  # LOBBY_DISPLAY_NAME_REQUIRED
    assert not kinds("P07", inputs, "error")
    assert kinds("P07", inputs, "warning") == [
        "steps[0].inputs.assertions: P07: no assertions: this step checks nothing and passes (a DAG defect)"
    ]
    assert kinds("P07", {}, "warning") == kinds("P07", inputs, "warning")
    result = run(RunContext(Target()), "P07", inputs)  # no document needed: nothing is checked
    assert result.passed and "nothing checked" in result.message


def test_p07_checkable_top_level_field_becomes_the_assertion() -> None:
    for inputs in ({"assertions": [], "pattern": "sid='\\w+'"}, {"pattern": "sid='\\w+'"}, {"regex": "sid='\\w+'"}):
        assert not kinds("P07", inputs, "warning") and not kinds("P07", inputs, "error")
        model = REGISTRY.spec("P07").inputs.model_validate(inputs)
        assert [(a.path, a.op) for a in model.assertions] == [("$._body", "matches_regex")]
    assert any(
        "that field is the assertion" in n for n in kinds("P07", {"assertions": [], "pattern": "x"}, "normalisation")
    )
    ctx = RunContext(Target())
    ctx.last_document = "<body sid='abc123'/>"
    assert run(ctx, "P07", {"assertions": [], "pattern": "sid='\\w+'"}).passed
    ctx.last_document = "<body/>"
    assert not run(ctx, "P07", {"pattern": "sid='\\w+'"}).passed


def test_p07_body_contains_pseudo_path() -> None:
    inputs = {
        "assertions": [
            {"path": "body_contains", "expected": "resolution"},
            {"path": "body_contains", "expected": "p2p"},
        ]
    }
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
    inputs = {
        "role": "moderator",
        "action": "kickParticipant",
        "expected_result": "allowed",
        "context": "conference_muc",
    }
    assert not kinds("P14", inputs, "error")
    warnings = kinds("P14", inputs, "warning")
    assert any(
        w.startswith("steps[0].inputs.action: P14: action 'kickParticipant' is not 'METHOD /path'") for w in warnings
    )
    assert any(w.startswith("steps[0].inputs.context:") for w in warnings)
    assert not [w for w in kinds("P14", {"action": "DELETE /api/x/1"}, "warning")]


# --- P21 WebSocket dialect ---------------------------------------------------------------------------
OPEN = "<open xmlns='urn:ietf:params:xml:ns:xmpp-framing' to='conference.local' version='1.0'/>"
WS_SINGLE = {
    "url": "ws://localhost:8026/xmpp-websocket",
    "subprotocol": "xmpp",
    "send": OPEN,
    "expect_message": {"timeout_ms": 5000, "match": {"content_contains": "<open"}},
}  # XMPP_WS_CONNECT
WS_STEPS = {
    "url": "ws://localhost:8026/xmpp-websocket",
    "subprotocol": "xmpp",
    "timeout_ms": 15000,
    "steps": [
        {"send": OPEN, "expect": "<open"},
        {"expect": "ANONYMOUS"},
        {"send": "<auth xmlns='urn:ietf:params:xml:ns:xmpp-sasl' mechanism='ANONYMOUS'/>", "expect": "<success"},
        {"send": OPEN, "expect": "bind"},
        {
            "send": "<iq type='set' id='bind_2'><bind xmlns='urn:ietf:params:xml:ns:xmpp-bind'/></iq>",
            "expect_any": ["jid", "<bind", "not-authorized"],
        },
    ],
}  # LOBBY_DISPLAY_NAME_REQUIRED


def test_p21_websocket_forms_load() -> None:
    for inputs in (WS_SINGLE, WS_STEPS):
        assert not kinds("P21", inputs, "error") and not kinds("P21", inputs, "warning")
    notes = "\n".join(kinds("P21", WS_SINGLE, "normalisation"))
    assert (
        "top-level 'send'/'expect_message' -> steps[0]" in notes
        and "steps[0]: 'expect_message {timeout_ms, match}'" in notes
    )
    model = REGISTRY.spec("P21").inputs.model_validate(WS_SINGLE)
    assert model.subprotocol == ["xmpp"] and model.steps[0].send == OPEN and model.steps[0].expect == "<open"
    assert model.steps[0].timeout_ms == 5000
    # the log check is unchanged; a step with neither 'pattern' nor 'url' is still an error
    assert not kinds("P21", {"log_path": "app", "pattern": "listening"}, "error")
    assert any("needs 'pattern' (log check) or 'url'" in e for e in kinds("P21", {"log_path": "app"}, "error"))
    assert any(
        "match key 'zzz'" in w for w in kinds("P21", {**WS_SINGLE, "expect_message": {"match": {"zzz": 1}}}, "warning")
    )


def _xmpp(ws: Any) -> None:
    """A tiny XMPP-over-WebSocket responder (the shape of Prosody's answers)."""
    authed = False
    for message in ws:
        if "<open" in message:
            ws.send("<open xmlns='urn:ietf:params:xml:ns:xmpp-framing' id='s1' version='1.0'/>")
            ws.send(
                "<stream:features><bind xmlns='urn:ietf:params:xml:ns:xmpp-bind'/></stream:features>"
                if authed
                else "<stream:features><mechanisms><mechanism>ANONYMOUS</mechanism></mechanisms></stream:features>"
            )
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
    assert [s["passed"] for s in full.evidence["steps"]] == [True] * 5 and full.evidence["steps"][4][
        "matched"
    ] == "<bind"  # the earliest of expect_any
    # the exchange is the last document: a following P07 asserts on it
    assert run(ctx, "P07", {"body_contains": "a@conference.local"}).passed
    assert run(ctx, "P07", {"assertions": [{"path": "$.received.length", "op": "gte", "expected": 6}]}).passed


def test_p21_websocket_failures(xmpp_ws: str) -> None:
    ctx = _ctx(xmpp_ws)
    missing = run(
        ctx,
        "P21",
        {"url": "/x", "subprotocol": "xmpp", "timeout_ms": 600, "steps": [{"send": OPEN, "expect": "<never>"}]},
    )
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


# --- dialects of the ShadeCloak/SaaSbench smoke DAGs (second batch) ----------------------------------
# Snippets from task_yobgvieg, orghjavi, ygamciur, gmdnohlg, ychlukjm and uybznoms dag_smoke.json.
def normalised(code: str, inputs: dict[str, Any]) -> list[str]:
    return kinds(code, inputs, "normalisation")


def p07(inputs: dict[str, Any]) -> list[tuple[Any, ...]]:
    model = REGISTRY.spec("P07").inputs.model_validate(inputs)
    return [(a.path, a.op, a.expected, a.expected_type) for a in model.assertions]


def test_p07_public_dag_operators_load() -> None:
    cases = [
        (
            {"path": "$.ocs.data", "operator": "type", "expected": "array"},
            ("$.ocs.data", "has_type", None, "array"),
        ),  # gmdnohlg
        (
            {"path": "$.data", "expected": "array", "operator": "is_type"},
            ("$.data", "has_type", None, "array"),
        ),  # ygamciur
        ({"path": "$", "operator": "is_json"}, ("$", "is_json", None, None)),  # yobgvieg
        (
            {"path": "$.systemmetadata", "operator": "is_valid_json", "expected": True},
            ("$.systemmetadata", "is_json", True, None),
        ),
        ({"path": "$", "operator": "length_gte", "expected": 5}, ("$", "length_gte", 5, None)),  # yobgvieg
        ({"path": "$.a", "operator": "array_length_gte", "expected": 2}, ("$.a", "length_gte", 2, None)),  # ychlukjm
        ({"path": "$.tags", "operator": "length", "expected": 0}, ("$.tags", "length_eq", 0, None)),
        (
            {"path": "$.lower.total", "operator": "eq_path", "expected": "$.upper.total"},
            ("$.lower.total", "equals_path", "$.upper.total", None),
        ),
        (
            {"path": "$.ocs.data.url", "operator": "exists_or", "alt_check": "$.ocs.meta.status"},
            ("$.ocs.data.url", "exists_or", "$.ocs.meta.status", None),
        ),
        (
            {"path": "$.secret_key", "operator": "starts_with", "expected": "plane_wh_"},
            ("$.secret_key", "starts_with", "plane_wh_", None),
        ),
        ({"path": "$.row_count", "expected_gte": 1}, ("$.row_count", "gte", 1, None)),  # uybznoms
        ({"path": "$", "match_regex": "_csrf_token"}, ("$", "matches_regex", "_csrf_token", None)),  # orghjavi
        ({"path": "$.doc.key2", "expected_absent": True}, ("$.doc.key2", "not_exists", None, None)),
    ]
    for raw, canonical in cases:
        assert not kinds("P07", {"assertions": [raw]}, "error"), raw
        assert not kinds("P07", {"assertions": [raw]}, "warning"), raw
        assert p07({"assertions": [raw]}) == [canonical], raw
    # several expected_<op> keys: one assertion each
    assert p07({"assertions": [{"path": "$.cnt", "expected_min": 18, "expected_max": 28}]}) == [
        ("$.cnt", "gte", 18, None),
        ("$.cnt", "lte", 28, None),
    ]
    assert any(
        "one assertion each" in n
        for n in normalised("P07", {"assertions": [{"path": "$.c", "expected_min": 1, "expected_max": 2}]})
    )
    # array_find / array_contains (ygamciur): match object, capture of one field of the found element
    raw = {
        "path": "$.data",
        "operator": "array_find",
        "match": {"name_contains": "Developer"},
        "capture_field": "id",
        "capture_as": "roleId",
    }
    model = REGISTRY.spec("P07").inputs.model_validate({"assertions": [raw]})
    a = model.assertions[0]
    assert (a.op, a.expected, a.capture_field, a.save_as) == (
        "array_find",
        {"name_contains": "Developer"},
        "id",
        "roleId",
    )
    # operators whose companion is missing or wrong are errors
    assert kinds("P07", {"assertions": [{"path": "$.a", "operator": "length_gte", "expected": "many"}]}, "error")
    assert kinds("P07", {"assertions": [{"path": "$.a", "operator": "exists_or"}]}, "error")
    assert kinds("P07", {"assertions": [{"path": "$.a", "operator": "array_find"}]}, "error")
    # an expected_<op> key next to an explicit operator is not guessed at
    assert kinds(
        "P07", {"assertions": [{"path": "$.a", "operator": "eq", "expected": 1, "expected_gte": 0}]}, "warning"
    )


def test_p07_public_dag_operators_run() -> None:
    ctx = RunContext(Target())
    ctx.last_document = {
        "ocs": {"data": [1, 2], "meta": {"status": "ok"}},
        "lower": {"total": 3},
        "upper": {"total": 3},
        "mixed": {"total": 4},
        "secret": "plane_wh_abc",
        "meta": '{"runId": "x"}',
        "text": "plain",
        "data": [{"id": "r1", "name": "Administrator"}, {"id": "r2", "name": "Developer - ws"}],
        "pages": [{"id": "p1", "isDefault": True}],
        "views": [20, 30],
    }
    passing = [
        {"path": "$.ocs.data", "operator": "type", "expected": "array"},
        {"path": "$", "operator": "is_json"},
        {"path": "$.meta", "operator": "is_valid_json", "expected": True},
        {"path": "$.ocs.data", "operator": "length_gte", "expected": 2},
        {"path": "$.ocs.data", "operator": "length", "expected": 2},
        {"path": "$.lower.total", "operator": "eq_path", "expected": "$.upper.total"},
        {"path": "$.ocs.data.url", "operator": "exists_or", "alt_check": "$.ocs.meta.status"},
        {"path": "$.secret", "operator": "starts_with", "expected": "plane_wh_"},
        {"path": "$.pages", "operator": "array_contains", "match": {"id": "p1", "isDefault": True}},
        {"path": "$.views", "expected_all_gt": 15},
        {"path": "$.missing", "expected_absent": True},
        {
            "path": "$.data",
            "operator": "array_find",
            "match": {"name_contains": "Developer"},
            "capture_field": "id",
            "capture_as": "developerRoleId",
        },
    ]
    result = run(ctx, "P07", {"assertions": passing})
    assert result.passed, result.message
    assert ctx.resolve("{{developerRoleId}}") == "r2"
    failing = [
        {"path": "$.ocs.data", "operator": "type", "expected": "object"},
        {"path": "$.text", "operator": "is_json"},
        {"path": "$.ocs.data", "operator": "length_gte", "expected": 3},
        {"path": "$.lower.total", "operator": "eq_path", "expected": "$.mixed.total"},
        {"path": "$.nope", "operator": "exists_or", "alt_check": "$.nope2"},
        {"path": "$.data", "operator": "array_find", "match": {"name": "Viewer"}},
    ]
    for raw in failing:
        assert not run(ctx, "P07", {"assertions": [raw]}).passed, raw
    ctx.last_document = "<html>not json</html>"  # a non-JSON body is not JSON
    assert not run(ctx, "P07", {"assertions": [{"path": "$", "operator": "is_json"}]}).passed


def test_p06_that_checks_nothing_loads_with_a_warning_and_passes() -> None:
    inputs = {"required_fields": []}  # ychlukjm CLI_DOC_PROPAGATION_DEPTH_CONFIG
    assert not kinds("P06", inputs, "error")
    assert kinds("P06", inputs, "warning") == [
        "steps[0].inputs.required_fields: P06: no required_fields or field_types: this step checks nothing and passes (a DAG defect)"
    ]
    result = run(RunContext(Target()), "P06", inputs)
    assert result.passed and "nothing checked" in result.message


def test_p08_path_assertions_are_p07_assertions_on_the_result() -> None:
    from saasbench.primitives.db import Evaluator, PathAssertion
    from saasbench.services.db import QueryResult

    spec = REGISTRY.spec("P08").inputs
    forms = {  # yobgvieg, orghjavi, ygamciur
        "columns": {
            "sql": "SELECT column_name FROM information_schema.columns WHERE table_name='t'",
            "assertions": [{"path": "$", "operator": "length_gte", "expected": 2}],
        },
        "count": {
            "sql": "SELECT COUNT(*) as cnt FROM issues",
            "assertions": [{"path": "cnt", "operator": "gte", "expected": 2}],
        },
        "exists": {"sql": "SELECT name FROM intakes LIMIT 1", "assertions": [{"path": "$", "operator": "exists"}]},
        "prefix": {
            "sql": "SELECT secret_key FROM webhooks",
            "assertions": [{"path": "secret_key", "operator": "starts_with", "expected": "plane_wh_"}],
        },
        "range": {
            "sql": "SELECT count(*) AS cnt FROM system.tables",
            "assertions": [{"path": "$.rows[0].cnt", "expected_min": 18, "expected_max": 28}],
        },
        "all": {
            "sql": "SELECT extname FROM pg_extension",
            "assertions": [{"path": "$.rows[*].extname", "expected_contains_all": ["citext", "plpgsql"]}],
        },
        "regex": {
            "sql": "SELECT key_prefix FROM api_keys",
            "assertions": [{"path": "$.rows[0].key_prefix", "match_regex": "^[A-Za-z0-9_-]{6}$"}],
        },
        "row": {
            "sql": "SELECT * FROM apps",
            "assertions": [{"path": "$.deletedAt", "operator": "ne", "expected": None}],
        },
    }
    for name, inputs in forms.items():
        assert not kinds("P08", inputs, "error") and not kinds("P08", inputs, "warning"), name
        assert any("P08 assertion with 'path'" in n for n in normalised("P08", inputs)), name
    parsed = {name: spec.model_validate(inputs).parsed_assertions for name, inputs in forms.items()}
    assert [(p.where, p.assertion.op) for p in parsed["range"]] == [("result", "gte"), ("result", "lte")]
    assert [(p.where, p.assertion.op) for p in parsed["exists"]] == [
        ("rows", "not_empty")
    ]  # '$' exists: at least one row
    assert [p.where for p in parsed["count"] + parsed["columns"] + parsed["row"]] == ["column", "rows", "row"]
    assert all(isinstance(p, PathAssertion) for ps in parsed.values() for p in ps)

    def failures(name: str, columns: list[str], rows: list[dict[str, Any]]) -> list[str]:
        model = spec.model_validate(forms[name])
        return Evaluator(RunContext(Target())).evaluate(
            model.expectation, model.parsed_assertions, QueryResult(columns, rows, len(rows), True)
        )

    assert not failures("columns", ["column_name"], [{"column_name": "a"}, {"column_name": "b"}])
    assert failures("columns", ["column_name"], [{"column_name": "a"}])
    assert not failures("count", ["cnt"], [{"cnt": 2}]) and failures("count", ["cnt"], [{"cnt": 1}])
    assert not failures("exists", ["name"], [{"name": "x"}]) and failures("exists", ["name"], [])
    assert not failures("prefix", ["secret_key"], [{"secret_key": "plane_wh_1"}])
    assert not failures("range", ["cnt"], [{"cnt": 20}]) and len(failures("range", ["cnt"], [{"cnt": 30}])) == 1
    assert not failures("all", ["extname"], [{"extname": "plpgsql"}, {"extname": "citext"}])
    assert failures("all", ["extname"], [{"extname": "plpgsql"}])
    assert not failures("regex", ["key_prefix"], [{"key_prefix": "Ab_9-x"}])
    assert not failures("row", ["deletedAt"], [{"deletedAt": "2026-01-01"}]) and failures(
        "row", ["deletedAt"], [{"deletedAt": None}]
    )


def test_p08_mongodb_and_condition_dialects() -> None:
    spec = REGISTRY.spec("P08").inputs
    # ygamciur: {collection, query, count_only} -> a MongoDB JSON query
    inputs = {
        "collection": "workspace",
        "query": {"name": "RoleVerifyWorkspace"},
        "expected_result": {},
        "count_only": False,
    }
    assert not kinds("P08", inputs, "error") and not kinds("P08", inputs, "warning")
    assert spec.model_validate(inputs).sql == {"collection": "workspace", "find": {"name": "RoleVerifyWorkspace"}}
    counted = {
        "command": "db.user.findOne({email: 'a@b.c'})",
        "collection": "user",
        "query": {"email": "a@b.c"},
        "count_only": True,
        "expected_result": {},
    }
    assert spec.model_validate(counted).sql == {"collection": "user", "count": {"email": "a@b.c"}}
    assert any("command ignored" in n for n in normalised("P08", counted))
    # a MongoDB shell expression loads, with a warning: the engine cannot run it
    shell = {
        "command": "db.newPage.find({applicationId: '{{appId}}', deletedAt: null}).count()",
        "assertions": [{"path": "$", "operator": "eq", "expected": 0}],
    }
    assert not kinds("P08", shell, "error")
    assert [w.split(":")[0] for w in kinds("P08", shell, "warning")] == ["steps[0].inputs.command"]
    # gmdnohlg: expected_result_condition "<column> <op> <number>"
    cond = {"sql": "SELECT COUNT(*) AS cnt FROM oc_jobs", "expected_result_condition": "cnt >= 1"}
    assert not kinds("P08", cond, "warning") and not kinds("P08", cond, "error")
    assert spec.model_validate(cond).expected_result == {"cnt": ">=1"}
    assert kinds("P08", {"sql": "SELECT 1", "expected_result_condition": "looks fine"}, "warning")


def test_status_url_store_as_and_auth_aliases() -> None:
    # gmdnohlg P15: a harness sentinel next to real codes is dropped with a warning
    inputs = {"acceptable_statuses": [401, 403, 404, 997]}
    assert not kinds("P15", inputs, "error")
    assert kinds("P15", inputs, "warning") == [
        "steps[0].inputs.acceptable_statuses: P15: 997 is not an HTTP status code and can never match (dropped; a DAG defect)"
    ]
    assert REGISTRY.spec("P15").inputs.model_validate(inputs).statuses == {401, 403, 404}
    assert kinds("P15", {"acceptable_statuses": [997]}, "error")  # nothing real left: refused, never a silent 2xx
    # ychlukjm P04 url, gmdnohlg no_auth
    p04 = REGISTRY.spec("P04").inputs.model_validate(
        {"method": "GET", "url": "http://localhost:9201/_cluster/health", "no_auth": True}
    )
    assert (p04.path, p04.skip_auth) == ("http://localhost:9201/_cluster/health", True)
    # ychlukjm P22 store_as: a name -> the whole body
    p22 = REGISTRY.spec("P22").inputs.model_validate({"query": "mutation { x }", "store_as": "revoke_token"})
    assert p22.store_as == {"revoke_token": "$"}
    # orghjavi P12, lzdugafl RENDER_DOM
    assert (
        REGISTRY.spec("P12")
        .inputs.model_validate({"command": "true", "expect_output_match_regex": "ok"})
        .expect_output_regex
        == "ok"
    )
    assert REGISTRY.spec("RENDER_DOM").inputs.model_validate({"url": "{{base_url}}/", "no_auth": True}).anonymous


def test_mongodb_schema_dialects_of_p09_to_p11() -> None:
    p09 = {"collections": ["user", "workspace"]}  # ygamciur
    p10 = {"collection": "user", "expected_fields": ["email", "name"]}
    p11 = {"collection": "user", "expected_indexes": [{"fields": ["email"], "unique": True}]}
    p11_top = {
        "table": "metadata_aspect_v2",
        "index_name": "PRIMARY",
        "columns": ["urn", "aspect", "version"],
    }  # ychlukjm
    for code, inputs in (("P09", p09), ("P10", p10), ("P11", p11), ("P11", p11_top)):
        assert not kinds(code, inputs, "error") and not kinds(code, inputs, "warning"), inputs
    assert REGISTRY.spec("P09").inputs.model_validate(p09).tables == ["user", "workspace"]
    m10 = REGISTRY.spec("P10").inputs.model_validate(p10)
    assert (m10.table, m10.expected_columns) == ("user", ["email", "name"])
    m11 = REGISTRY.spec("P11").inputs.model_validate(p11)
    assert (m11.table, m11.expected_indexes[0].columns, m11.expected_indexes[0].unique) == ("user", ["email"], True)
    top = REGISTRY.spec("P11").inputs.model_validate(p11_top).expected_indexes[0]
    assert (top.name, top.columns) == ("PRIMARY", ["urn", "aspect", "version"])


def test_p17_logs_evidence_and_p_ingest_proposal_load_with_warnings() -> None:
    from saasbench.evaluation.context import RunOptions

    p17 = {"evidence_type": "logs", "rubric_prompt": "Judge the logs.", "score_range": [0, 6]}  # ychlukjm
    assert not kinds("P17", p17, "error")
    assert [w.split(":")[0] for w in kinds("P17", p17, "warning")] == ["steps[0].inputs.evidence_type"]
    ctx = RunContext(Target(), options=RunOptions(judge_enabled=True))
    ctx.judge = object()
    result = run(ctx, "P17", p17)
    assert result.judge_skipped and not result.passed
    mcp = {
        "entityType": "dataset",
        "entityUrn": "urn:li:dataset:(urn:li:dataPlatform:kafka,t,PROD)",
        "aspectName": "datasetProperties",
        "changeType": "UPSERT",
        "aspectValue": '{"name": "t"}',
    }
    assert not kinds("P_INGEST", mcp, "error")
    assert [w.split(":")[0] for w in kinds("P_INGEST", mcp, "warning")] == ["steps[0].inputs.endpoint"]
    model = REGISTRY.spec("P_INGEST").inputs.model_validate(mcp)
    assert model.endpoint is None and model.events == [mcp]
    result = run(RunContext(Target()), "P_INGEST", mcp)
    assert not result.passed and "no ingestion endpoint" in result.message
    assert kinds("P_INGEST", {"events": [{"a": 1}]}, "error")  # an analytics ingest still needs its endpoint


def test_underscore_text_keys_are_authoring_notes() -> None:
    note = "Appsmith CE uses the newPage collection (not page)"  # ygamciur/ychlukjm _round26_*, _inclusivity_*
    dag = {
        "nodes": [
            {
                "id": "N",
                "_round26_test_bug_fix": note,
                "scoring": {"method": "binary", "maxScore": 1, "_inclusivity_2026_04_30": note},
                "steps": [
                    {
                        "type": "P07",
                        "_round28_chain_fix": note,
                        "inputs": {
                            "_round24_test_bug_fix": note,
                            "assertions": [{"path": "$.a", "expected": 1, "_round26_schema_fix": note}],
                        },
                    }
                ],
            }
        ]
    }
    assert [i for i in load_dag_data(dag).issues if i.kind == "warning"] == []
    assert kinds(
        "P07", {"assertions": [{"path": "$.a", "_round26_x": {"not": "text"}}]}, "warning"
    )  # not text: not a note


def test_egsszeqg_dialects_websocket_path_combined_evidence_query_and_metadata() -> None:
    # P21 {"path", "expect_connected": false}: a WebSocket route the app must refuse
    ws = {"path": "/runners/_ws", "expect_connected": False}
    assert not kinds("P21", ws, "error") and not kinds("P21", ws, "warning")
    model = REGISTRY.spec("P21").inputs.model_validate(ws)
    assert (model.url, model.expect_connected) == ("/runners/_ws", False)
    assert (
        REGISTRY.spec("P21").inputs.model_validate({"path": "app", "pattern": "ready"}).url is None
    )  # still a log check
    # P17 "frontend_code_and_dom" with files_to_sample: the judge gets the code files (warning)
    p17 = {
        "evidence_type": "frontend_code_and_dom",
        "files_to_sample": ["packages/frontend/src"],
        "rubric_prompt": "Judge the UI.",
    }
    assert not kinds("P17", p17, "error")
    assert [w.split(":")[0] for w in kinds("P17", p17, "warning")] == ["steps[0].inputs.evidence_type"]
    assert REGISTRY.spec("P17").inputs.model_validate(p17).evidence_type == "code_files"
    # P04 "query" / "params": the query string
    p04 = REGISTRY.spec("P04").inputs.model_validate(
        {"method": "GET", "path": "/rest/credentials", "query": {"includeScopes": "true", "take": 100}}
    )
    assert p04.path == "/rest/credentials?includeScopes=true&take=100"
    p04 = REGISTRY.spec("P04").inputs.model_validate(
        {"path": "/api/x?a=1", "params": {"flag": True, "tags": ["a", "b"]}}
    )
    assert p04.path == "/api/x?a=1&flag=true&tags=a&tags=b"
    # node metadata of newer DAGs is kept without warnings
    dag = {
        "nodes": [
            {
                "id": "N",
                "steps": [{"type": "P07", "inputs": {"path": "$.a"}}],
                "scoring": {"method": "binary", "maxScore": 1},
                "coverage_refs": {"endpoints": ["GET /a|main"]},
                "trajectory_tags": ["happy_path"],
                "merged_from": ["A", "B"],
            }
        ]
    }
    loaded = load_dag_data(dag)
    assert [i for i in loaded.issues if i.kind == "warning"] == []
    assert loaded.dag.nodes[0].extras["merged_from"] == ["A", "B"]


def test_hhrdixum_dialects_path_any_of_captures_and_row_expectations() -> None:
    from saasbench.primitives.db import Evaluator
    from saasbench.primitives.http import _capture_fields
    from saasbench.services.db import QueryResult

    # P07 {"path_any_of": [...], "exists": true}: the assertion holds at any of the paths
    p07 = {"assertions": [{"path_any_of": ["$.detail", "$.non_field_errors"], "exists": True}]}
    assert not kinds("P07", p07, "error") and not kinds("P07", p07, "warning")
    assert any("path_any_of" in n for n in normalised("P07", p07))
    (a,) = REGISTRY.spec("P07").inputs.model_validate(p07).assertions
    assert (a.path, a.path_any_of, a.paths) == ("$.detail", ["$.non_field_errors"], ["$.detail", "$.non_field_errors"])
    ctx = RunContext(Target())
    ctx.last_document = {"non_field_errors": ["bad"]}
    assert run(ctx, "P07", p07).passed
    ctx.last_document = {"other": 1}
    result = run(ctx, "P07", p07)
    assert not result.passed and "$.detail | $.non_field_errors (none)" in result.message
    typed = {"assertions": [{"path_any_of": ["$.results", "$"], "type": "array"}]}
    ctx.last_document = [1, 2]
    assert run(ctx, "P07", typed).passed
    assert kinds("P07", {"assertions": [{"path_any_of": [], "exists": True}]}, "error")
    # P04/P23 save_response_id_as and save_response_field_as ({field, var} or {var: field})
    p04 = {
        "method": "POST",
        "path": "/api/part/",
        "body": {"name": "x"},
        "save_response_id_as": "part_pk",
        "save_response_field_as": {"field": "token", "var": "tok"},
    }
    assert not kinds("P04", p04, "error") and not kinds("P04", p04, "warning")
    model = REGISTRY.spec("P04").inputs.model_validate(p04)
    assert (model.save_id_as, model.capture_fields) == ("part_pk", {"tok": "token"})
    both = REGISTRY.spec("P04").inputs.model_validate(
        {"path": "/a", "save_response_field_as": {"v_name": "name", "v_ipn": "IPN"}}
    )
    assert both.capture_fields == {"v_name": "name", "v_ipn": "IPN"}
    assert (
        REGISTRY.spec("P23")
        .inputs.model_validate({"upload": {"path": "/u", "file_content": "x"}, "save_response_id_as": "s"})
        .save_id_as
        == "s"
    )
    assert kinds("P04", {"path": "/a", "save_response_field_as": ["token"]}, "warning")
    ctx = RunContext(Target())
    assert (
        _capture_fields(ctx, {"pk": 7, "token": "abc", "name": "n"}, "part_pk", {"tok": "token", "nm": "$.name"}) == []
    )
    assert ctx.resolve("{{part_pk}}/{{tok}}/{{nm}}") == "7/abc/n"  # DRF's 'pk' is the id
    assert _capture_fields(ctx, {"detail": "bad"}, "x", {"y": "token"}) == [
        "save_id_as x: the response has no id",
        "capture y: field 'token' absent from the response",
    ]
    # P14 expected_statuses
    assert REGISTRY.spec("P14").inputs.model_validate(
        {"action": "POST /api/report/template/", "expected_result": "denied", "expected_statuses": [400, 401, 403]}
    ).statuses == {400, 401, 403}
    # P08 expect_rowcount_min: the number of rows (row_count); first_row_assertions: checks on the first row
    spec = REGISTRY.spec("P08").inputs
    forms = {
        "rows": {"sql": "SELECT id FROM t", "expect_rowcount_min": 2},
        "first": {"sql": "SELECT COUNT(*) AS cnt FROM t", "first_row_assertions": {"cnt_gte": 1}},
        "both": {
            "sql": "SELECT currency FROM r ORDER BY currency",
            "expect_rowcount_min": 4,
            "first_row_assertions": {"currency": "AUD"},
        },
        "any": {"sql": "SELECT currency FROM r WHERE currency='GBP'", "expect_rowcount_min": 0},
    }
    for name, inputs in forms.items():
        assert not kinds("P08", inputs, "error") and not kinds("P08", inputs, "warning"), name
    assert [spec.model_validate(forms[k]).expected_result for k in forms] == [
        {"row_count": ">=2"},
        {"cnt_gte": 1},
        {"currency": "AUD", "row_count": ">=4"},
        {},
    ]
    assert kinds("P08", {"sql": "SELECT 1", "expect_rowcount_min": "many"}, "warning")
    # on a SELECT COUNT(*) the row count is always 1: loaded as written, with a warning (not guessed to be the count)
    counted = {"sql": "SELECT COUNT(*) AS cnt FROM build_builditem WHERE build_id = {{b}}", "expect_rowcount_min": 1}
    assert not kinds("P08", counted, "error")
    assert [w.split(":")[0] for w in kinds("P08", counted, "warning")] == ["steps[0].inputs.expect_rowcount_min"]

    def failures(name: str, columns: list[str], rows: list[dict[str, Any]]) -> list[str]:
        model = spec.model_validate(forms[name])
        return Evaluator(RunContext(Target())).evaluate(
            model.expectation, model.parsed_assertions, QueryResult(columns, rows, len(rows), True)
        )

    assert not failures("any", ["currency"], [])
    assert not failures("rows", ["id"], [{"id": 5}, {"id": 6}]) and failures("rows", ["id"], [{"id": 5}])
    assert not failures("first", ["cnt"], [{"cnt": 1}]) and failures("first", ["cnt"], [{"cnt": 0}])
    four = [{"currency": c} for c in ("AUD", "CAD", "EUR", "GBP")]
    assert (
        not failures("both", ["currency"], four)
        and failures("both", ["currency"], four[:3])
        and failures("both", ["currency"], four[1:])
    )


def test_orghjavi_source_dialects_relaxed_p14_raw_body_and_kb_ref() -> None:
    # P14 expected_result "denied_or_allowed": no allow/deny class, the listed statuses decide
    p14 = {
        "action": "GET /settings/billing/subscription",
        "expected_result": "denied_or_allowed",
        "expected_status": 403,
        "acceptable_statuses": [200, 302, 401, 403, 404],
    }
    assert not kinds("P14", p14, "error") and not kinds("P14", p14, "warning")
    assert any("the listed statuses decide" in n for n in normalised("P14", p14))
    model = REGISTRY.spec("P14").inputs.model_validate(p14)
    assert model.expected_result is None and model.statuses == {200, 302, 401, 403, 404}
    bare = {"action": "GET /x", "expected_result": "denied_or_allowed"}
    assert not kinds("P14", bare, "error")
    assert [w.split(":")[0] for w in kinds("P14", bare, "warning")] == ["steps[0].inputs.expected_result"]
    # P04 raw_body: the body string, sent verbatim
    p04 = REGISTRY.spec("P04").inputs.model_validate(
        {"method": "POST", "path": "/api/event", "raw_body": "{not_valid_json"}
    )
    assert p04.body == "{not_valid_json"
    # node-level kb_ref (knowledge-base references) is descriptive metadata: kept, no warning
    loaded = load_dag_data(
        {
            "nodes": [
                {
                    "id": "N",
                    "steps": [{"type": "P07", "inputs": {"path": "$.a"}}],
                    "scoring": {"method": "binary", "maxScore": 1},
                    "kb_ref": ["KB-001"],
                }
            ]
        }
    )
    assert [i for i in loaded.issues if i.kind == "warning"] == [] and loaded.dag.nodes[0].extras["kb_ref"] == [
        "KB-001"
    ]
