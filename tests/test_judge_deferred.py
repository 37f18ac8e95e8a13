"""Deferred judging (issue #16 item 3): evaluate with ``defer_judge=True`` stores the evidence of llm-judge
nodes nothing gates on, ``judge_pending`` judges it later, and the result is node for node what inline
judging gives for the same verdicts. A judge outage in the judge stage leaves nodes pending; a second
stage completes them. The judge is a local OpenAI-compatible fake (tests/fake_llm.py) answering by rubric.
"""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
from fake_llm import FakeLLM, Reply, Request
from localhttp import serve_http

from saasbench.dag import load_dag_data
from saasbench.evaluation.context import Target
from saasbench.evaluation.engine import EngineOptions
from saasbench.evaluation.evaluate import evaluate
from saasbench.evaluation.judging import (
    JudgeRequest,
    deferrable_judge_nodes,
    judge_dependents,
    judge_pending,
    pending_nodes,
)
from saasbench.evaluation.results import RunReport, Status
from saasbench.services.judge import Evidence, Judge, JudgeConfig, evidence_digest

# rubric -> the fake judge's score
SCORES = {
    "Judge the layout. Score 0-4.": 3,
    "Are the items sensible?": 4,
    "Rate the tests. Score 0-10.": 7,
    "Rate the documentation.": 2,
    "Is the error page helpful?": 5,
    "Is anything here good?": 0,
    "Quarantined rubric. Score 0-5.": 5,
}
DEFERRED = {"ARCH", "API_JUDGE", "ZERO_JUDGE", "FAILED_EVIDENCE", "QUAR_JUDGE"}
PENDING = DEFERRED - {"FAILED_EVIDENCE"}  # its evidence step failed: FAILED whatever the judge says


@pytest.fixture(scope="module", autouse=True)
def _offline_litellm():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        yield


class _App(BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        path = self.path.split("?")[0]
        bodies = {"/api/health": {"ok": True}, "/api/items": [{"id": 1, "name": "first"}], "/api/echo": {"echo": 1}}
        status, body = (200, bodies[path]) if path in bodies else (404, {"error": "no such page"})
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class _Judge:
    """Answers by rubric; ``down`` makes every call a 503."""

    def __init__(self) -> None:
        self.down = False

    def __call__(self, request: Request) -> Reply:
        if self.down:
            return Reply.error(503, "judge overloaded")
        user = request.messages[1]["content"]
        rubric = user.split("## Rubric\n", 1)[1].split("\n\n## Evidence", 1)[0]
        return Reply.json({"score": SCORES[rubric], "reasoning": f"reason for {rubric}"})


@pytest.fixture
def llm():
    responder = _Judge()
    with FakeLLM(responder=responder) as server:
        server.judge_state = responder  # type: ignore[attr-defined]
        yield server


@pytest.fixture
def app_url():
    with serve_http(_App) as url:
        yield url


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    (ws / "app").mkdir(parents=True)
    (ws / "app" / "main.py").write_text("def main():\n    return 'items'\n")
    (ws / "tests").mkdir()
    (ws / "tests" / "test_main.py").write_text("def test_main():\n    assert True\n")
    (ws / "README.md").write_text("# Items\n")
    return ws


def make_judge(llm: FakeLLM, **kw: Any) -> Judge:
    cfg = dict(
        model="openai/fake", api_base=llm.base_url, retries=2, backoff_base_s=0.001, backoff_cap_s=0.01, timeout_s=5
    )
    cfg.update(kw)
    return Judge(JudgeConfig(**cfg), sleep=lambda s: None)


def _ensure_p17() -> None:
    """Register the real P17 (another test may have swapped it for a fake)."""
    from saasbench.primitives import judge as p17
    from saasbench.primitives.registry import REGISTRY

    if REGISTRY.spec("P17").fn is not p17.llm_judge:
        REGISTRY.register("P17", p17.llm_judge, p17.P17Inputs, raw_fields=p17.RAW_FIELDS)


def _get(path: str) -> list[dict[str, Any]]:
    return [
        {"type": "P04", "inputs": {"method": "GET", "path": path}},
        {"type": "P15", "inputs": {"expected_status": 200}},
    ]


def _p17(rubric: str, kind: str = "code_files", **extra: Any) -> dict[str, Any]:
    return {"type": "P17", "inputs": {"rubric_prompt": rubric, "evidence_type": kind, **extra}}


def _node(node_id: str, steps: list, method: str, max_score: float, *, prereqs=(), category="Quality", tier="1"):
    return {
        "id": node_id,
        "prereqs": list(prereqs),
        "steps": steps,
        "scoring": {"category": category, "method": method, "maxScore": max_score},
        "complexity_tier": tier,
    }


def _dag():
    _ensure_p17()
    nodes = [
        _node("HEALTH", _get("/api/health"), "binary", 2, category="Deployment"),
        _node(
            "ARCH", [_p17("Judge the layout. Score 0-4.", files_to_sample=["app/"])], "llm-judge", 8, prereqs=["HEALTH"]
        ),
        # no range given: the judge is told [0, maxScore] and the engine keeps its default
        _node(
            "API_JUDGE", [*_get("/api/items"), _p17("Are the items sensible?", "http_response_body")], "llm-judge", 6
        ),
        # gated by AFTER_GATE (a prerequisite): judged inline even when deferring
        _node(
            "GATE_JUDGE", [_p17("Rate the tests. Score 0-10.", files_to_sample=["tests/"])], "llm-judge", 5, tier="2"
        ),
        _node("AFTER_GATE", _get("/api/health"), "binary", 1, prereqs=["GATE_JUDGE"], tier="2"),
        # named by REF_USER's placeholder: judged inline too
        _node("REF_JUDGE", [_p17("Rate the documentation.", files_to_sample=["README.md"])], "llm-judge", 3, tier="2"),
        _node(
            "REF_USER",
            [
                {"type": "P04", "inputs": {"method": "GET", "path": "/api/echo?judged={{REF_JUDGE.score}}"}},
                {"type": "P15", "inputs": {"expected_status": 200}},
            ],
            "binary",
            1,
            tier="2",
        ),
        _node("ZERO_JUDGE", [_p17("Is anything here good?", score_range=[0, 5])], "llm-judge", 4),
        # the evidence step fails (404), the judge still gets the page: FAILED whatever it says
        _node(
            "FAILED_EVIDENCE",
            [*_get("/nope"), _p17("Is the error page helpful?", "http_response_body")],
            "llm-judge",
            2,
        ),
        _node("QUAR_JUDGE", [_p17("Quarantined rubric. Score 0-5.")], "llm-judge", 3, category="Other"),
    ]
    return load_dag_data({"meta": {"task_id": "deferred"}, "nodes": nodes}).dag


OPTIONS = EngineOptions(quarantine={"QUAR_JUDGE"})


def _inline(dag, url: str, ws: Path, llm: FakeLLM) -> RunReport:
    return evaluate(dag, Target(base_url=url, workspace=ws), judge=make_judge(llm), engine_options=OPTIONS)


def _step_view(step) -> dict[str, Any]:
    """A step as compared: a P17 step in full but for the judge's latency; other steps carry timings."""
    view: dict[str, Any] = {"index": step.index, "type": step.type, "passed": step.passed}
    if step.type == "P17":
        view.update(message=step.message, evidence={k: v for k, v in step.evidence.items() if k != "latency_ms"})
    return view


def _assert_same_as_inline(got: RunReport, inline: RunReport) -> None:
    assert [n.id for n in got.nodes] == [n.id for n in inline.nodes]
    for mine, theirs in zip(got.nodes, inline.nodes):
        assert (mine.status, mine.score, mine.message) == (theirs.status, theirs.score, theirs.message), mine.id
        assert mine.judge_pending is False, mine.id
        if mine.id == "FAILED_EVIDENCE":  # its request is not judged: the node failed whatever the verdict
            continue
        assert mine.judge == theirs.judge, mine.id
        assert [_step_view(s) for s in mine.steps] == [_step_view(s) for s in theirs.steps], mine.id
    strip = {"elapsed_s"}
    assert got.summary.model_dump(exclude=strip) == inline.summary.model_dump(exclude=strip)
    assert got.categories == inline.categories
    assert got.complexity_tiers == inline.complexity_tiers


def test_which_nodes_are_deferred_is_decided_from_the_dag():
    dag = _dag()
    dependents = judge_dependents(dag)
    assert dependents["GATE_JUDGE"] == ["AFTER_GATE"]
    assert dependents["REF_JUDGE"] == ["REF_USER"]
    assert deferrable_judge_nodes(dag) == DEFERRED


def test_deferred_then_judged_equals_inline(llm, app_url, workspace):
    dag = _dag()
    inline = _inline(dag, app_url, workspace, llm)
    by_id = {n.id: n for n in inline.nodes}
    assert by_id["ARCH"].status == Status.PASSED and by_id["ARCH"].score == 6  # 3 on [0, 4] of 8
    assert by_id["API_JUDGE"].score == 4 and by_id["ZERO_JUDGE"].status == Status.FAILED
    assert by_id["FAILED_EVIDENCE"].status == Status.FAILED and by_id["QUAR_JUDGE"].status == Status.QUARANTINED
    inline_calls = len(llm.chat_requests)

    deferred, requests = evaluate(
        dag,
        Target(base_url=app_url, workspace=workspace),
        judge=make_judge(llm),
        engine_options=OPTIONS,
        defer_judge=True,
    )
    # only the gated nodes (GATE_JUDGE, REF_JUDGE) were judged during the evaluation
    assert len(llm.chat_requests) - inline_calls == 2
    assert deferred.options["judge_deferred"] is True
    assert {(r.node_id, r.step_index) for r in requests} == {
        ("ARCH", 0),
        ("API_JUDGE", 2),
        ("ZERO_JUDGE", 0),
        ("FAILED_EVIDENCE", 2),
        ("QUAR_JUDGE", 0),
    }
    nodes = {n.id: n for n in deferred.nodes}
    assert set(pending_nodes(deferred)) == PENDING
    for node_id in PENDING - {"QUAR_JUDGE"}:
        node = nodes[node_id]
        assert node.status == Status.SKIPPED_LLM and node.score == 0 and "judge pending" in node.message
        assert node.judge is not None and node.judge["pending"] is True
    assert (
        nodes["QUAR_JUDGE"].status == Status.QUARANTINED
        and "ran as SKIPPED_LLM: judge pending" in nodes["QUAR_JUDGE"].message
    )
    for node_id in ("GATE_JUDGE", "REF_JUDGE", "AFTER_GATE", "REF_USER", "FAILED_EVIDENCE", "HEALTH"):
        assert (nodes[node_id].status, nodes[node_id].score) == (by_id[node_id].status, by_id[node_id].score)
    # pending nodes are outside the totals, like any SKIPPED_LLM
    assert deferred.summary.skipped_llm_max_score == 8 + 6 + 4
    assert deferred.summary.max_score == inline.summary.max_score - 18

    # the stage may run in another process: requests travel as JSON
    wire = json.dumps([r.model_dump(mode="json") for r in requests])
    again = [JudgeRequest.model_validate(r) for r in json.loads(wire)]
    assert again == requests

    before = len(llm.chat_requests)
    stage = judge_pending(deferred, again, make_judge(llm))
    assert len(llm.chat_requests) - before == len(PENDING) == len(stage.calls)
    assert stage.pending == [] and stage.errors == []
    assert {c.tags["node_id"] for c in stage.calls} == PENDING
    _assert_same_as_inline(stage.report, inline)
    assert set(pending_nodes(deferred)) == PENDING  # the argument is not changed

    # nothing is left to judge: a second stage calls nobody
    before = len(llm.chat_requests)
    assert judge_pending(stage.report, again, make_judge(llm)).calls == []
    assert len(llm.chat_requests) == before


def test_judge_down_in_the_stage_leaves_nodes_pending_then_a_second_stage_completes_them(llm, app_url, workspace):
    dag = _dag()
    inline = _inline(dag, app_url, workspace, llm)
    deferred, requests = evaluate(
        dag,
        Target(base_url=app_url, workspace=workspace),
        judge=make_judge(llm),
        engine_options=OPTIONS,
        defer_judge=True,
    )

    llm.judge_state.down = True  # type: ignore[attr-defined]
    judge = make_judge(llm, retries=2)
    before = len(llm.chat_requests)
    down = judge_pending(deferred, requests, judge)
    assert len(llm.chat_requests) - before == 3 * len(PENDING)  # first try + the judge's 2 retries each
    assert set(down.pending) == PENDING
    assert all(c.error and "503" in c.error for c in down.calls)
    nodes = {n.id: n for n in down.report.nodes}
    for node_id in PENDING:
        node = nodes[node_id]
        assert node.judge_pending and node.score == 0
        assert "judge unavailable" in node.message and "503" in node.message
        assert node.status == (Status.QUARANTINED if node_id == "QUAR_JUDGE" else Status.SKIPPED_LLM)
        step = node.steps[-1]
        assert step.evidence["judge_pending"] is True and "503" in step.evidence["error"]
    assert any("ARCH: judge unavailable" in e for e in down.errors)
    assert down.report.summary.model_dump(exclude={"elapsed_s"}) == deferred.summary.model_dump(exclude={"elapsed_s"})

    llm.judge_state.down = False  # type: ignore[attr-defined]
    up = judge_pending(down.report, requests, judge)
    assert up.pending == [] and len(up.calls) == len(PENDING)
    _assert_same_as_inline(up.report, inline)


def test_requests_round_trip_with_images_and_must_match_the_report(llm, app_url, workspace):
    png = b"\x89PNG\r\n\x1a\n" + b"\0" * 32
    request = JudgeRequest.from_evidence(
        Evidence(text="1 screenshot(s) attached", kind="screenshot", images=[png], summary={"screenshots": ["a.png"]}),
        node_id="UI",
        step_index=1,
        rubric_prompt="Is the page tidy?",
        evidence_type="screenshot",
        score_range=(0, 5),
        engine_range=(0, 5),
        range_source="score_range",
        tags={"evidence_type": "screenshot"},
    )
    assert request.images[0].startswith("data:image/png;base64,")
    again = JudgeRequest.model_validate_json(request.model_dump_json())
    assert again == request
    assert again.evidence_digest == evidence_digest("1 screenshot(s) attached", [png])  # what the inline call hashes

    deferred, requests = evaluate(
        _dag(), Target(base_url=app_url, workspace=workspace), judge=make_judge(llm), defer_judge=True
    )
    stale = requests[-1].model_copy(update={"evidence": "something else"})
    before = len(llm.chat_requests)
    with pytest.raises(ValueError, match="evidence differs"):
        judge_pending(deferred, [*requests[:-1], stale], make_judge(llm))
    assert len(llm.chat_requests) == before  # checked before any call
    with pytest.raises(ValueError, match="no pending judgement"):
        judge_pending(deferred, [requests[0].model_copy(update={"step_index": 5})], make_judge(llm))


def test_without_a_judge_nothing_is_deferred(app_url, workspace):
    report, requests = evaluate(_dag(), Target(base_url=app_url, workspace=workspace), defer_judge=True)
    assert requests == [] and pending_nodes(report) == []
    assert {n.status for n in report.nodes if n.method == "llm-judge"} == {Status.SKIPPED_LLM}
