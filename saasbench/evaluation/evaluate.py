"""The one wiring of an evaluation: context, judge, engine. ``saasbench evaluate``, a trial and the
evaluate flow all call :func:`evaluate`, so none of them can drop the judge, the workspace or the
database (each used to build its own context)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, overload

from saasbench.evaluation.context import RunContext, RunOptions, Target
from saasbench.evaluation.engine import Engine, EngineOptions
from saasbench.evaluation.judging import DeferredJudge, JudgeRequest, deferrable_judge_nodes
from saasbench.evaluation.results import RunReport

if TYPE_CHECKING:
    from saasbench.dag import Dag
    from saasbench.evaluation.results import NodeResult
    from saasbench.services.auth import AuthProfile


class DeferredEvaluation(NamedTuple):
    """``evaluate(..., defer_judge=True)``: the report (deferred llm-judge nodes SKIPPED_LLM with
    ``judge_pending``) and their stored requests, for :func:`saasbench.evaluation.judging.judge_pending`."""

    report: RunReport
    requests: list[JudgeRequest]


@overload
def evaluate(
    dag: Dag,
    target: Target,
    *,
    options: RunOptions | None = ...,
    auth_profile: AuthProfile | None = ...,
    variables: Mapping[str, Any] | None = ...,
    judge: Any = ...,
    engine_options: EngineOptions | None = ...,
    on_node: Callable[[NodeResult], None] | None = ...,
    defer_judge: Literal[False] = ...,
) -> RunReport: ...


@overload
def evaluate(
    dag: Dag,
    target: Target,
    *,
    options: RunOptions | None = ...,
    auth_profile: AuthProfile | None = ...,
    variables: Mapping[str, Any] | None = ...,
    judge: Any = ...,
    engine_options: EngineOptions | None = ...,
    on_node: Callable[[NodeResult], None] | None = ...,
    defer_judge: Literal[True],
) -> DeferredEvaluation: ...


def evaluate(
    dag: Dag,
    target: Target,
    *,
    options: RunOptions | None = None,
    auth_profile: AuthProfile | None = None,
    variables: Mapping[str, Any] | None = None,
    judge: Any = None,
    engine_options: EngineOptions | None = None,
    on_node: Callable[[NodeResult], None] | None = None,
    defer_judge: bool = False,
) -> RunReport | DeferredEvaluation:
    """Score the app ``target`` points at with ``dag``. ``judge`` (a :class:`saasbench.services.judge.Judge`)
    scores llm-judge nodes; without one they are SKIPPED_LLM and gather no evidence.

    ``defer_judge``: store the evidence of llm-judge nodes nothing gates on instead of judging it
    (:func:`saasbench.evaluation.judging.deferrable_judge_nodes`, decided from the DAG before running;
    the others are judged inline by ``judge``) and return :class:`DeferredEvaluation` (report,
    requests); :func:`saasbench.evaluation.judging.judge_pending` judges them later. Without a judge
    nothing is deferred (no evidence is gathered) and the requests are empty."""
    options = dataclasses.replace(options or RunOptions(), judge_enabled=judge is not None)
    ctx = RunContext(
        target, options=options, auth_profile=auth_profile, variables=variables or {}, env_defaults=dag.env_defaults
    )
    deferred = DeferredJudge(judge, deferrable_judge_nodes(dag)) if defer_judge and judge is not None else None
    ctx.judge = deferred or judge
    report = Engine(dag, ctx, engine_options).run(on_node=on_node)
    if not defer_judge:
        return report
    return DeferredEvaluation(report, list(deferred.requests) if deferred is not None else [])
