"""Judging an llm-judge step: the request, the verdict's step result, and deferred judging.

One implementation serves both ways a P17 step is judged (docs/dag-semantics.md, "Deferred judging"):

- **inline** (the default): the primitive gathers evidence into a :class:`JudgeRequest`, asks the
  run's judge (:meth:`JudgeRequest.judge`) and returns :func:`verdict_step_result`; the engine turns
  the node's step results into its outcome with :func:`saasbench.evaluation.scoring.llm_judge_outcome`;
- **deferred** (``evaluate(..., defer_judge=True)``): the run's judge is a :class:`DeferredJudge`.
  For an llm-judge node nothing gates on (:func:`deferrable_judge_nodes`) the primitive hands it the
  request instead (:meth:`DeferredJudge.defer`): the step is a pending judgement and the node is
  SKIPPED_LLM with ``judge_pending`` (outside the totals). Nodes that another node gates on are judged
  inline, since their verdict decides what runs next. Later, :func:`judge_pending` judges the stored
  requests (with the Judge's own retries) and gives each node exactly the status, score, message,
  step record and ``judge`` info the inline path gives for the same verdict, then recomputes the
  report's totals. A judge that still fails leaves the node pending, with the error as its message,
  so the stage can be run again (a judge outage delays a trial instead of voiding it).

Requests are plain data (pydantic, JSON round trip): rubric, evidence text, images as base64
``data:`` URLs, ranges and tags, so a judge stage can run in another process or later.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from pydantic import BaseModel, ConfigDict, Field

from saasbench.dag.placeholders import placeholders_in, split_path
from saasbench.evaluation import scoring
from saasbench.evaluation.results import NodeResult, RunReport, StepRecord, StepResult
from saasbench.services.judge import evidence_digest, image_data_url, prompt_hash

if TYPE_CHECKING:
    from saasbench.dag import Dag
    from saasbench.services.judge import Evidence, Judge, JudgeCall, JudgeVerdict

RAW_REPLY_EXCERPT = 500  # characters of the judge's reply kept in the step record
PENDING_MESSAGE = "judge pending: evidence stored for the judge stage (deferred judging)"


class JudgeRequest(BaseModel):
    """What one P17 step asks of the judge: enough to judge it later, in any process."""

    model_config = ConfigDict(extra="forbid")

    version: int = 1
    node_id: str = Field(default="", description="The node the step belongs to ('' outside the engine)")
    step_index: int = Field(default=0, ge=0, description="The step's index in the node's chain")
    rubric_prompt: str
    evidence: str = Field(description="The evidence text, as sent")
    evidence_type: str
    evidence_summary: dict[str, Any] = Field(default_factory=dict, description="What the evidence holds (files, ...)")
    score_range: tuple[float, float] = Field(description="The range told to the judge")
    engine_range: tuple[float, float] | None = Field(
        default=None, description="The range handed to the engine (None: the node's [0, maxScore])"
    )
    range_source: str = Field(description="Where score_range came from (score_range, rubric text, ...)")
    images: list[str] = Field(default_factory=list, description="Screenshots as base64 data: URLs")
    tags: dict[str, Any] = Field(default_factory=dict, description="Recorded with the judge call (rubric_id, ...)")
    rubric_id: str | None = None

    @classmethod
    def from_evidence(cls, evidence: Evidence, **fields: Any) -> JudgeRequest:
        """A request for gathered ``evidence`` (its text, images and summary) and the other fields."""
        return cls(
            evidence=evidence.text,
            evidence_summary=evidence.summary,
            images=[image_data_url(img) for img in evidence.images],
            **fields,
        )

    @property
    def evidence_digest(self) -> str:
        return evidence_digest(self.evidence, self.images)

    def judge(self, judge: Any, *, deadline_s: float | None = None) -> StepResult:
        """Ask ``judge`` (a :class:`saasbench.services.judge.Judge`) and return the step's result."""
        verdict = judge.score(
            self.rubric_prompt,
            self.evidence,
            self.score_range,
            images=self.images,
            tags=dict(self.tags),
            deadline_s=deadline_s,
        )
        return verdict_step_result(self, verdict)


def verdict_step_result(request: JudgeRequest, verdict: JudgeVerdict) -> StepResult:
    """The P17 step's result for the judge's verdict on ``request`` (inline and judge stage alike).

    A verdict without a score (outage after retries, unparseable reply) is ``judge_skipped`` ->
    SKIPPED_LLM; otherwise ``passed = score > 0`` with ``judge_score`` on the engine's range.
    """
    record: dict[str, Any] = {
        "model": verdict.model,
        "prompt_hash": verdict.prompt_hash,
        "evidence_digest": verdict.evidence_digest,
        "evidence_type": request.evidence_type,
        "evidence": request.evidence_summary,
        "score_range": list(request.score_range),
        "score_range_source": request.range_source,
        "raw_reply": (verdict.raw_reply or "")[:RAW_REPLY_EXCERPT],
        "latency_ms": verdict.latency_ms,
        "cached": verdict.cached,
        "attempts": verdict.attempts,
        "tokens_in": verdict.tokens_in,
        "tokens_out": verdict.tokens_out,
    }
    if request.rubric_id:
        record["rubric_id"] = request.rubric_id
    if len(verdict.votes) > 1 or verdict.spread is not None:
        record.update(votes=verdict.votes, spread=verdict.spread)
    if not verdict.ok:
        record["error"] = verdict.error
        return StepResult(
            passed=False, judge_skipped=True, message=f"judge unavailable: {verdict.error}", evidence=record
        )

    score = float(verdict.score)  # type: ignore[arg-type]
    lo, hi = request.score_range
    reason = f": {verdict.reasoning[:200]}" if verdict.reasoning else ""
    message = f"judge score {score:g} on [{lo:g}, {hi:g}]{' (cached)' if verdict.cached else ''}{reason}"
    return StepResult(
        passed=score > 0,
        judge_score=score,
        judge_range=request.engine_range,
        message=message,
        evidence=record,
        value={"score": score, "score_range": [lo, hi], "reasoning": verdict.reasoning},
    )


def pending_step_result(request: JudgeRequest, message: str = PENDING_MESSAGE) -> StepResult:
    """A P17 step whose judgement waits for the judge stage (SKIPPED_LLM, ``judge_pending``)."""
    record: dict[str, Any] = {
        "judge_pending": True,
        "prompt_hash": prompt_hash(request.rubric_prompt, request.score_range),
        "evidence_digest": request.evidence_digest,
        "evidence_type": request.evidence_type,
        "evidence": request.evidence_summary,
        "score_range": list(request.score_range),
        "score_range_source": request.range_source,
        "evidence_chars": len(request.evidence),
        "images": len(request.images),
    }
    if request.rubric_id:
        record["rubric_id"] = request.rubric_id
    return StepResult(passed=False, judge_skipped=True, judge_pending=True, message=message, evidence=record)


# --- which nodes may wait -------------------------------------------------------------------------------
def judge_dependents(dag: Dag) -> dict[str, list[str]]:
    """For every llm-judge node, the other nodes gated on it: those listing it as a prerequisite
    or naming it in a placeholder (``{{NODE_ID...}}``) of a step's inputs. Decided from the DAG alone."""
    judged = {n.id for n in dag.nodes if n.method == "llm-judge"}
    out: dict[str, list[str]] = {node_id: [] for node_id in judged}
    for node in dag.nodes:
        named = {p for p in node.prereqs if p in judged}
        for step in node.steps:
            for expr in placeholders_in(step.inputs):
                if expr.startswith("{{"):
                    parts = split_path(expr[2:-2])
                    if parts and parts[0] in judged:
                        named.add(str(parts[0]))
        for node_id in named - {node.id}:
            out[node_id].append(node.id)
    return out


def deferrable_judge_nodes(dag: Dag) -> set[str]:
    """llm-judge nodes nothing gates on: deferred judging stores their evidence; the rest are judged inline."""
    return {node_id for node_id, dependents in judge_dependents(dag).items() if not dependents}


class DeferredJudge:
    """The run's judge during a deferred evaluation: requests of ``defer_nodes`` are recorded in
    :attr:`requests` (:meth:`defer`); any other node's P17 is judged inline by ``judge`` (:meth:`score`)."""

    deferred = True

    def __init__(self, judge: Judge, defer_nodes: Iterable[str]):
        self.judge = judge
        self.defer_nodes = frozenset(defer_nodes)
        self.requests: list[JudgeRequest] = []
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"DeferredJudge({self.judge!r}, defer_nodes={sorted(self.defer_nodes)!r})"

    @property
    def config(self) -> Any:
        return self.judge.config

    @property
    def calls(self) -> list[JudgeCall]:
        """The inline calls (nodes judged during the evaluation)."""
        return self.judge.calls

    def score(self, *args: Any, **kwargs: Any) -> JudgeVerdict:
        return self.judge.score(*args, **kwargs)

    def defers(self, node_id: str | None) -> bool:
        return bool(node_id) and node_id in self.defer_nodes

    def defer(self, request: JudgeRequest) -> StepResult:
        with self._lock:
            self.requests.append(request)
        return pending_step_result(request)


# --- the judge stage ------------------------------------------------------------------------------------
class JudgeStage(NamedTuple):
    """What :func:`judge_pending` returns: the updated report and the judge calls it made."""

    report: RunReport
    calls: list[JudgeCall]

    @property
    def pending(self) -> list[str]:
        """Nodes still waiting for a judgement (the judge failed, or no request was given)."""
        return pending_nodes(self.report)

    @property
    def errors(self) -> list[str]:
        """``NODE: message`` for every node still pending (the judge's error after its retries)."""
        return [f"{n.id}: {n.message}" for n in self.report.nodes if n.judge_pending]


def pending_nodes(report: RunReport) -> list[str]:
    return [n.id for n in report.nodes if n.judge_pending]


def judge_pending(
    report: RunReport, requests: Sequence[JudgeRequest], judge: Judge, *, deadline_s: float | None = None
) -> JudgeStage:
    """Judge the stored ``requests`` of the report's pending nodes with ``judge`` (its own retries;
    ``deadline_s`` bounds each call). Nodes not pending (judged inline, already judged, failed) are
    left alone, so the stage can be run again after a judge failure. Returns a new report (the
    argument is not changed) with recomputed totals, and the calls ``judge`` made meanwhile."""
    by_step: dict[tuple[str, int], JudgeRequest] = {}
    for request in requests:  # one per step (a request given twice is judged once)
        by_step[(request.node_id, request.step_index)] = request
    by_node: dict[str, list[JudgeRequest]] = {}
    for request in by_step.values():
        by_node.setdefault(request.node_id, []).append(request)
    todo = {node.id: by_node[node.id] for node in report.nodes if node.judge_pending and node.id in by_node}
    for node in report.nodes:  # every request checked before the first call
        if node.id in todo:
            _check(node, todo[node.id])
    quarantined = set(report.quarantined)
    before = len(judge.calls)
    nodes: list[NodeResult] = []
    for node in report.nodes:
        if node.id in todo:
            nodes.append(_judge_node(node, todo[node.id], judge, deadline_s, node.id in quarantined))
        else:
            nodes.append(node.model_copy(deep=True))
    calls = list(judge.calls[before:])
    updated = report.model_copy(
        deep=True, update={"nodes": nodes, **scoring.report_totals(nodes, report.summary.elapsed_s)}
    )
    return JudgeStage(updated, calls)


def _check(node: NodeResult, requests: list[JudgeRequest]) -> None:
    """Each request belongs to a pending step of ``node`` with the same evidence (not another run's)."""
    steps = {s.index: s for s in node.steps}
    for request in requests:
        record = steps.get(request.step_index)
        where = f"judge request for {node.id} step {request.step_index}"
        if record is None or not record.evidence.get("judge_pending"):
            raise ValueError(f"{where}: the report has no pending judgement there")
        if record.evidence.get("evidence_digest") != request.evidence_digest:
            raise ValueError(f"{where}: its evidence differs from the evidence the run stored")


def _judge_node(
    node: NodeResult, requests: list[JudgeRequest], judge: Judge, deadline_s: float | None, quarantined: bool
) -> NodeResult:
    steps = [s.model_copy(deep=True) for s in node.steps]
    position = {s.index: i for i, s in enumerate(steps)}
    judged: dict[int, StepResult] = {}
    spent_ms = 0.0
    for request in sorted(requests, key=lambda r: r.step_index):
        i = position[request.step_index]
        record = steps[i]
        t0 = time.perf_counter()
        result = request.judge(judge, deadline_s=deadline_s)
        if result.judge_skipped:  # no verdict after the judge's own retries: still pending, with the cause
            result = result.model_copy(
                update={"judge_pending": True, "evidence": {**result.evidence, "judge_pending": True}}
            )
        ms = round((time.perf_counter() - t0) * 1000, 3)
        spent_ms += ms
        judged[record.index] = result
        steps[i] = record.model_copy(
            update={
                "passed": result.passed,
                "message": result.message,
                "evidence": result.evidence,
                "duration_ms": round(record.duration_ms + ms, 3),
            }
        )
    results = [judged[s.index] if s.index in judged else _as_result(s) for s in steps]
    outcome = scoring.llm_judge_outcome(results, node.max_score, scoring.first_failure_message(steps))
    if quarantined:
        outcome = scoring.quarantined(outcome)
    return node.model_copy(
        update={
            "status": outcome.status,
            "score": outcome.score,
            "message": outcome.message,
            "judge_pending": outcome.judge_pending,
            "steps": steps,
            "judge": scoring.judge_info(steps, results),
            "duration_ms": round(node.duration_ms + spent_ms, 3),
        }
    )


def _as_result(record: StepRecord) -> StepResult:
    """A step the stage did not judge, as the outcome reads it: a stored judgement still pending, a
    P17 that did not pass (in a pending node only a judge skip), or an evidence step."""
    if record.evidence.get("judge_pending"):
        return StepResult(passed=False, judge_skipped=True, judge_pending=True, message=record.message)
    if record.type == "P17" and not record.passed:
        return StepResult(passed=False, judge_skipped=True, message=record.message)
    return StepResult(passed=record.passed, message=record.message)
