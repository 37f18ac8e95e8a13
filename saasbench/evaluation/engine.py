"""The evaluation engine: order, gating, chain execution, scoring, report.

One node at a time against the shared app state, in a stable topological order with
``run_last`` nodes at the end. A node runs only if every prerequisite PASSED; otherwise it is
SKIPPED_DEPENDENCY (score 0, maxScore kept). A node with a DAG defect the loader found
(:attr:`saasbench.dag.Node.defects`: a step its primitive rejects as meaningless with
:class:`saasbench.dag.StepDefect`) is ERROR without running any step. Binary chains stop at the first failing step,
weighted chains run every step, llm-judge chains turn the judge's reply into points. Any
exception inside a primitive makes the node ERROR with its message; nothing a primitive or the
app does can crash the run. See docs/dag-semantics.md.
"""

from __future__ import annotations

import datetime as _dt
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from saasbench.dag import Dag, Node, execution_order
from saasbench.dag.placeholders import UnresolvedPlaceholder
from saasbench.evaluation import scoring
from saasbench.evaluation.context import RunContext
from saasbench.evaluation.results import NodeResult, RunReport, Status, StepRecord, StepResult
from saasbench.services import deadline


@dataclass
class EngineOptions:
    only: list[str] = field(default_factory=list)  # node ids; their prerequisites run too
    categories: list[str] = field(default_factory=list)
    dry_run: bool = False
    quarantine: set[str] = field(default_factory=set)


def select_nodes(dag: Dag, only: Iterable[str] = (), categories: Iterable[str] = ()) -> list[Node]:
    """The nodes to run: the selection plus every transitive prerequisite (so gating stays meaningful)."""
    only, categories = list(only), list(categories)
    if not only and not categories:
        return list(dag.nodes)
    ids = {n.id for n in dag.nodes}
    unknown = [o for o in only if o not in ids]
    if unknown:
        raise KeyError(f"no such node: {', '.join(unknown)}")
    by_id = {n.id: n for n in dag.nodes}
    wanted = {n.id for n in dag.nodes if n.id in only or n.scoring.category in categories}
    stack = list(wanted)
    while stack:
        for p in by_id[stack.pop()].prereqs:
            if p in by_id and p not in wanted:
                wanted.add(p)
                stack.append(p)
    return [n for n in dag.nodes if n.id in wanted]


class Engine:
    def __init__(self, dag: Dag, ctx: RunContext, options: EngineOptions | None = None):
        self.dag = dag
        self.ctx = ctx
        self.options = options or EngineOptions()
        self._ids = {n.id for n in dag.nodes}

    def run(self, on_node: Callable[[NodeResult], None] | None = None) -> RunReport:
        started_at = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        t0 = time.perf_counter()
        nodes = execution_order(
            select_nodes(self.dag, self.options.only, self.options.categories), ties=tie_order(self.ctx.options.compat)
        )
        results: dict[str, NodeResult] = {}
        gate: dict[str, bool] = {}
        try:
            if not self.options.dry_run:
                from saasbench.services.receivers import prestart_receivers

                # {{webhook_url}}/{{smtp_port}} may be used before the P27/P28 that would start them
                prestart_receivers(self.ctx, [step.inputs for node in nodes for step in node.steps])
            for node in nodes:
                result = self._run_node(node, gate)
                results[node.id] = result
                # a quarantined node's verdict is not trusted either way, so it never blocks dependents
                gate[node.id] = result.status in (Status.PASSED, Status.QUARANTINED)
                if on_node is not None:
                    on_node(result)
        finally:
            self.ctx.close()
        ordered = [results[n.id] for n in nodes]
        return build_report(
            self.dag,
            ordered,
            started_at=started_at,
            elapsed_s=time.perf_counter() - t0,
            ctx=self.ctx,
            quarantined=sorted(self.options.quarantine & set(results)),
        )

    # --- one node -------------------------------------------------------------------------------
    def _run_node(self, node: Node, gate: dict[str, bool]) -> NodeResult:
        base: dict[str, Any] = dict(
            id=node.id,
            category=node.scoring.category,
            subcategory=node.scoring.subcategory,
            method=node.method,
            complexity_tier=node.complexity_tier,
            max_score=node.max_score,
        )
        if self.options.dry_run:
            return NodeResult(**base, status=Status.DRY_RUN, message="dry run: not executed")
        if node.defects:  # the loader warned; the node cannot mean anything, so nothing runs
            return NodeResult(
                **base, status=Status.ERROR, score=0.0, message="DAG defect, no step run: " + "; ".join(node.defects)
            )
        if node.method == "llm-judge" and not self.ctx.options.judge_enabled:
            # decided before gating and before any evidence step: no judge will read the evidence,
            # so rendering pages for it is wasted time (and its prerequisites do not matter)
            return NodeResult(
                **base,
                status=Status.SKIPPED_LLM,
                message="no judge configured: llm-judge node not run (pass --judge-model)",
            )
        failed_prereqs = [p for p in node.prereqs if p in gate and not gate[p]]
        if failed_prereqs:
            return NodeResult(
                **base,
                status=Status.SKIPPED_DEPENDENCY,
                message="prerequisite not passed: " + ", ".join(failed_prereqs),
            )
        missing = [p for p in node.prereqs if p not in gate and p in self._ids]
        if missing:  # cannot happen with select_nodes, kept for engine callers that bypass it
            return NodeResult(
                **base, status=Status.SKIPPED_DEPENDENCY, message="prerequisite not run: " + ", ".join(missing)
            )

        ctx = self.ctx
        ctx.node_scope = {}
        response_before = ctx.last_response
        ctx.node_max_score = node.max_score
        ctx.node_id = node.id
        budget = ctx.options.judge_node_timeout_s if node.method == "llm-judge" else ctx.options.node_timeout_s
        ctx.start_node_clock(budget)
        t0 = time.perf_counter()
        records: list[StepRecord] = []
        step_results: list[StepResult] = []
        status: Status | None = None
        message = ""
        for index, step in enumerate(node.steps):
            if ctx.remaining() <= 0:
                status, message = (
                    Status.FAILED,
                    f"node deadline of {budget:g}s exceeded before step {index} ({step.type})",
                )
                break
            s0 = time.perf_counter()
            ctx.step_index = index
            try:
                # code that cannot see ctx (assertion and row expectations, regexes) reads the deadline from here
                with deadline.within(ctx.deadline_at):
                    result = self._run_step(step.type, step.inputs)
            except deadline.DeadlineExceeded as exc:  # work on the app's or agent's data ran into the deadline
                why = f"node deadline of {budget:g}s reached in step {index} ({step.type}): {exc}"
                records.append(StepRecord(index=index, type=step.type, passed=False, message=why, duration_ms=_ms(s0)))
                status, message = Status.FAILED, why
                break
            except Exception as exc:  # noqa: BLE001 - a primitive crashed: ERROR, chain stops, run goes on
                records.append(
                    StepRecord(
                        index=index,
                        type=step.type,
                        passed=False,
                        error=True,
                        message=f"{type(exc).__name__}: {exc}",
                        duration_ms=_ms(s0),
                        evidence={"traceback": traceback.format_exc(limit=6)},
                    )
                )
                status, message = Status.ERROR, f"step {index} {step.type} raised {type(exc).__name__}: {exc}"
                break
            step_results.append(result)
            records.append(
                StepRecord(
                    index=index,
                    type=step.type,
                    passed=result.passed,
                    message=result.message,
                    duration_ms=_ms(s0),
                    evidence=result.evidence,
                )
            )
            if not result.passed and node.method == "binary":
                break  # binary chains short-circuit
            if node.method == "llm-judge" and not result.passed and result.unreachable:
                break  # evidence could not be gathered: the app's failure, not the judge's

        ctx.node_id = ctx.step_index = None
        outcome = self._score(node, status, message, step_results, records)
        ctx.nodes[node.id] = self._outputs(outcome.status, outcome.score, response_before)
        if node.id in self.options.quarantine:
            outcome = scoring.quarantined(outcome)
        return NodeResult(
            **base,
            status=outcome.status,
            score=outcome.score,
            message=outcome.message,
            duration_ms=_ms(t0),
            steps=records,
            judge=scoring.judge_info(records, step_results),
            judge_pending=outcome.judge_pending,
        )

    def _run_step(self, code: str, raw_inputs: dict) -> StepResult:
        from saasbench.primitives.registry import REGISTRY

        spec = REGISTRY.spec(code)
        if spec is None or spec.fn is None or spec.inputs is None:
            state = "reserved in the paper and not" if spec is not None and spec.reserved else "not"
            raise PrimitiveUnavailable(f"primitive {code} is {state} available in this build of saasbench")
        try:
            resolved = {k: (v if k in spec.raw_fields else self.ctx.resolve(v)) for k, v in raw_inputs.items()}
        except UnresolvedPlaceholder as exc:
            return StepResult(passed=False, message=str(exc), evidence={"placeholder": exc.placeholder})
        try:
            inputs = spec.inputs.model_validate(resolved)
        except ValidationError as exc:
            from saasbench.dag import StepDefect

            defects = [
                str(e["ctx"]["error"])
                for e in exc.errors()
                if isinstance((e.get("ctx") or {}).get("error"), StepDefect)
            ]
            if defects:  # a defect only visible once placeholders resolved: the node is ERROR, as at load time
                raise StepDefect("; ".join(defects)) from None
            detail = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'inputs'}: {e['msg']}" for e in exc.errors()[:3]
            )
            return StepResult(passed=False, message=f"{code} inputs invalid after placeholder resolution: {detail}")
        return spec.fn(inputs, self.ctx)

    def _score(
        self, node: Node, status: Status | None, message: str, results: list[StepResult], records: list[StepRecord]
    ) -> scoring.Outcome:
        if status is not None:  # ERROR, or FAILED by the node deadline
            return scoring.Outcome(0.0, status, message)
        k = len(node.steps)
        passed = sum(1 for r in results if r.passed)
        all_passed = passed == k and len(results) == k
        fail_msg = scoring.first_failure_message(records)
        if node.method == "binary":
            score = scoring.binary_score(all_passed, node.max_score)
            return scoring.Outcome(
                score, scoring.status_for(score, node.max_score, all_passed), fail_msg or f"{k}/{k} steps passed"
            )
        if node.method == "weighted":
            score = scoring.weighted_score(passed, k, node.max_score)
            return scoring.Outcome(
                score,
                scoring.status_for(score, node.max_score, all_passed),
                f"{passed}/{k} steps passed" + (f"; {fail_msg}" if fail_msg else ""),
            )
        return scoring.llm_judge_outcome(results, node.max_score, fail_msg)

    def _outputs(self, status: Status, score: float, response_before) -> dict:
        """What ``{{NODE.field}}`` can read: the node's captures, verdict and its own last response."""
        out = dict(self.ctx.node_scope)
        out.update(status=status.value, passed=status == Status.PASSED, score=score)
        response = self.ctx.last_response
        if response is not None and response is not response_before:
            out.setdefault("status_code", response.status)
            out.setdefault("response_body", response.body)
        if "created_id" in out:
            out.setdefault("id", out["created_id"])
        return out


def tie_order(compat: str) -> str:
    """How topological ties are broken: FIFO Kahn (the reference's) under --compat reference, else file order."""
    return "fifo" if compat == "reference" else "file"


class PrimitiveUnavailable(Exception):
    pass


def _exec_option(ctx: RunContext) -> dict:
    """``{"exec": {kind, dir|container, env_names}}`` when P12/P21 have an exec target or variables
    (names only: the values may be secrets)."""
    from saasbench.evaluation.context import describe_exec

    described = describe_exec(ctx.target)
    return {"exec": described} if described is not None else {}


def _ms(t0: float) -> float:
    return round((time.perf_counter() - t0) * 1000, 3)


def build_report(
    dag: Dag,
    results: list[NodeResult],
    *,
    started_at: str,
    elapsed_s: float,
    ctx: RunContext | None = None,
    quarantined: list[str] | None = None,
) -> RunReport:
    return RunReport(
        dag=dag.source,
        task_id=dag.meta.get("task_id"),
        base_url=ctx.target.base_url if ctx else None,
        compat=ctx.options.compat if ctx else "strict",
        started_at=started_at,
        options={
            "node_timeout_s": ctx.options.node_timeout_s,
            "http_timeout_s": ctx.options.http_timeout_s,
            "max_response_bytes": ctx.options.max_response_bytes,
            "judge_enabled": ctx.options.judge_enabled,
            "judge_model": getattr(getattr(ctx.judge, "config", None), "model", None),
            **({"judge_deferred": True} if getattr(ctx.judge, "deferred", False) is True else {}),
            **_exec_option(ctx),
        }
        if ctx
        else {},
        **scoring.report_totals(results, elapsed_s),
        nodes=results,
        quarantined=quarantined or [],
    )
