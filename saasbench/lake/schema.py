"""The results lake's one schema: table names, columns, types, partitions. Versioned.

Every stage writes rows through these schemas and every reader (DuckDB views, aggregation,
reports) reads columns by these names. **Column names are stable**: columns are only added,
nullable, and every addition bumps :data:`SCHEMA_VERSION`. Commit markers record the writer's
version; readers take the files of the current version as they are and, for each older version,
read the columns of one file's footer and give typed NULLs for the columns it lacks
(:mod:`saasbench.lake.query`). A column added without a bump would make views over older files of
the same version fail to bind. Renaming or retyping a column needs a migration, not just a bump.

Versions: 1 the first lake; 2 ``trials.budget_steps``/``budget_wall_s``/``budget_tool_call_s`` and
``model_calls.usage_source``/``usage_estimated``/``upstream_errors``.

Layout (keys relative to the lake root; ids are path-safe, see :func:`check_id`)::

    sweeps/sweep_id=<s>/part-<s>.<gen>.parquet
    trials|node_results|step_results|judge_calls|env_builds|trajectory_events|model_calls|end_states/
        sweep_id=<s>/task_id=<t>/part-<trial_id>.<gen>.parquet
    objects/sha256/<2 hex>/<sha256>                    content-addressed objects (frozen end states,
                                                       docs/endstate.md); not a table, never in a marker
    reference_validations/task_id=<t>/part-<run_id>.<gen>.parquet
    _commits/sweep_id=<s>/_sweep.json                  commit marker of the sweep row
    _commits/sweep_id=<s>/trial_id=<trial_id>.json     commit marker of one trial (all its tables)
    _commits/_validations/task_id=<t>/run_id=<r>.json  commit marker of one reference validation

Partitioning: the per-trial tables by ``sweep_id`` then ``task_id`` (one-sweep and one-task
queries prune files by path); ``reference_validations`` by ``task_id`` (they belong to a task,
not a sweep); ``sweeps`` by ``sweep_id``. ``<gen>`` is a content hash of the write: the same rows
give the same keys (a rewrite is idempotent), different rows give new keys, and the commit marker
(one atomic object) switches readers from the old file set to the new one. Readers only read
files listed by commit markers, so files of a write that crashed before its marker are invisible.

Partition columns are also stored inside each file (files are self-describing); DuckDB keeps the
in-file VARCHAR type, so ids like ``001`` stay strings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import pyarrow as pa

from saasbench.inputs import check_id as check_id  # the lake's id rule, shared with task loading (saasbench/inputs.py)

SCHEMA_VERSION = 2

# --- failure taxonomy (ARCHITECTURE.md) --------------------------------------------------------
Outcome = Literal[
    "completed",
    "agent_timeout",
    "agent_budget_exceeded",
    "agent_error",
    "voided_cheat",
    "env_error",
    "judge_error",
    "model_error",
    "task_defect",
]
OUTCOMES: tuple[str, ...] = (
    "completed",
    "agent_timeout",
    "agent_budget_exceeded",
    "agent_error",
    "voided_cheat",
    "env_error",
    "judge_error",
    "model_error",
    "task_defect",
)
#: Outcomes caused by the agent: never retried; they count in "valid trials".
AGENT_OUTCOMES: tuple[str, ...] = ("completed", "agent_timeout", "agent_budget_exceeded", "agent_error", "voided_cheat")
#: Outcomes caused by infrastructure or the task itself: retried (env/judge/model) and excluded from "valid
#: trials". ``model_error``: the agent's model upstream failed (an outage) and the agent stopped on it.
INFRA_OUTCOMES: tuple[str, ...] = ("env_error", "judge_error", "model_error", "task_defect")
#: ``trials.valid`` is ``outcome IN VALID_OUTCOMES``.
VALID_OUTCOMES: tuple[str, ...] = AGENT_OUTCOMES

NODE_STATUSES: tuple[str, ...] = (
    "PASSED",
    "FAILED",
    "ERROR",
    "SKIPPED_DEPENDENCY",
    "SKIPPED_LLM",
    "DRY_RUN",
    "QUARANTINED",
)
VERDICTS: tuple[str, ...] = ("pass", "flaky", "always_failing", "skipped_llm")

# --- caps (characters) -------------------------------------------------------------------------
MESSAGE_CAP = 4 * 1024 * 1024  # node/step messages, error texts: effectively whole
EVIDENCE_CAP = 1024 * 1024  # step_results.evidence_json
CONTENT_CAP = 64 * 1024  # trajectory_events.content
DATA_CAP = 64 * 1024  # trajectory_events.data_json
JUDGE_TEXT_CAP = 256 * 1024  # judge_calls.raw_reply / reasoning / rubric


def _ts() -> pa.DataType:
    return pa.timestamp("us", tz="UTC")


def _f(name: str, type_: pa.DataType, doc: str, nullable: bool = True) -> pa.Field:
    return pa.field(name, type_, nullable=nullable, metadata={"doc": doc})


S, I32, I64, F64, B = pa.string(), pa.int32(), pa.int64(), pa.float64(), pa.bool_()

# The columns that identify a trial; repeated in every per-trial table so joins are optional.
_TRIAL_KEY = [
    _f("sweep_id", S, "Sweep id", False),
    _f("trial_id", S, "Trial id, unique within the sweep", False),
    _f("task_id", S, "Task id", False),
    _f("agent", S, "Agent name"),
    _f("model", S, "Agent model (None for oracle/nop)"),
    _f("attempt", I32, "Attempt number of this (task, agent, model) cell, from 0"),
]

SWEEPS = pa.schema(
    [
        _f("sweep_id", S, "Sweep id", False),
        _f("name", S, "Human name of the sweep"),
        _f("created_at", _ts(), "When the sweep started (UTC)"),
        _f("config_json", S, "The sweep configuration as JSON (secrets removed)"),
        _f("tasks", pa.list_(S), "Task ids of the sweep"),
        _f("agents", pa.list_(S), "Agent names of the sweep"),
        _f("models", pa.list_(S), "Models of the sweep"),
        _f("attempts", I32, "Attempts per (task, agent, model) cell"),
        _f("harness_version", S, "saasbench version that ran the sweep"),
        _f("host", S, "Host name of the orchestrator"),
        _f("schema_version", I32, "SCHEMA_VERSION of the writer"),
        _f("parent_sweep_id", S, "The sweep this one rescored (saasbench rescore); None for a sweep that ran agents"),
        _f("dag_hash", S, "sha256 of the DAG file a rescore used instead of each task's (None: the tasks' own)"),
        _f("judge_model", S, "The judge model of the sweep's llm-judge nodes (None: no judge)"),
        _f("rescore_mode", S, "full (restore, evaluate, judge) | judge-only (stored evidence re-judged)"),
    ]
)

TRIALS = pa.schema(
    _TRIAL_KEY
    + [
        _f("agent_version", S, "Agent adapter version"),
        _f("category", S, "Task category (task.yaml)"),
        _f("domain", S, "Task domain: CG PC CF DCI SI DW"),
        _f("complexity_tier", S, "Task complexity tier"),
        _f("outcome", S, "One of OUTCOMES (failure taxonomy)", False),
        _f("outcome_detail", S, "Error text for non-completed outcomes"),
        _f("valid", B, "outcome IN VALID_OUTCOMES (agent-caused outcomes; infra/task failures are not)"),
        _f("started_at", _ts(), "Trial start (UTC)"),
        _f("ended_at", _ts(), "Trial end (UTC)"),
        _f("wall_s", F64, "Wall clock of the whole trial"),
        _f("agent_wall_s", F64, "Wall clock of the rollout"),
        _f("eval_s", F64, "Wall clock of the DAG evaluation"),
        _f("steps", I64, "Agent steps"),
        _f("budget_steps", I64, "The step budget the agent ran under (the sweep's budget, else the task's timeouts)"),
        _f("budget_wall_s", F64, "The wall-clock budget of the rollout in seconds"),
        _f("budget_tool_call_s", F64, "The budget of one tool call in seconds"),
        _f("tokens_in", I64, "Agent input tokens (metered by the model gateway when the trial used one)"),
        _f("tokens_out", I64, "Agent output tokens (metered by the model gateway when the trial used one)"),
        _f(
            "cost_usd",
            F64,
            "Agent cost in USD: the model gateway's metered cost when the trial used one, else the agent's own figure",
        ),
        _f("judge_tokens_in", I64, "Judge input tokens of this trial"),
        _f("judge_tokens_out", I64, "Judge output tokens of this trial"),
        _f("task_score", F64, "100 * sum(score)/sum(max_score) over nodes not SKIPPED_LLM (RunReport.summary)"),
        _f("deterministic_score", F64, "The same over nodes whose method is not llm-judge"),
        _f("node_coverage", F64, "PASSED nodes / all nodes"),
        _f("score", F64, "Sum of node scores"),
        _f("max_score", F64, "Sum of node max scores, SKIPPED_LLM nodes excluded"),
        _f("skipped_llm_max_score", F64, "Max score of SKIPPED_LLM nodes"),
        _f("total_nodes", I32, "Nodes in the DAG"),
        _f("passed_nodes", I32, "Nodes PASSED"),
        _f("failed_nodes", I32, "Nodes FAILED"),
        _f("error_nodes", I32, "Nodes ERROR"),
        _f("skipped_dependency_nodes", I32, "Nodes SKIPPED_DEPENDENCY"),
        _f("skipped_llm_nodes", I32, "Nodes SKIPPED_LLM"),
        _f("quarantined_nodes", I32, "Nodes QUARANTINED"),
        _f("compat", S, "Engine compatibility mode (strict|legacy)"),
        _f("dag", S, "DAG name"),
        _f("app_ok", B, "The app started healthy after the rollout"),
        _f("app_error", S, "Why the app did not start"),
        _f("exit_reason", S, "Trajectory exit reason as the agent reported it"),
        _f("report_uri", S, "Where report.json lives, if kept"),
        _f("harness_version", S, "saasbench version"),
        _f("schema_version", I32, "SCHEMA_VERSION of the writer"),
    ]
)

NODE_RESULTS = pa.schema(
    _TRIAL_KEY
    + [
        _f("node_id", S, "DAG node id", False),
        _f("node_index", I32, "Position in the report (evaluation order)"),
        _f("category", S, "Node category (backbone)"),
        _f("subcategory", S, "Node subcategory"),
        _f("method", S, "Scoring method (e.g. weighted, binary, llm-judge)"),
        _f("complexity_tier", S, "Node complexity tier"),
        _f("status", S, "One of NODE_STATUSES"),
        _f("score", F64, "Points earned"),
        _f("max_score", F64, "Points possible"),
        _f("duration_ms", F64, "Node wall clock"),
        _f("message", S, "Node message (app text: data only)"),
        _f("steps", I32, "Steps recorded"),
        _f("judge_score", F64, "Raw judge score (llm-judge nodes)"),
        _f("judge_skipped", B, "The judge was unavailable"),
    ]
)

STEP_RESULTS = pa.schema(
    _TRIAL_KEY
    + [
        _f("node_id", S, "DAG node id", False),
        _f("step_index", I32, "Step index within the node", False),
        _f("code", S, "Primitive code (P04, RENDER_DOM, ...)"),
        _f("passed", B, "Step verdict"),
        _f("error", B, "The primitive raised (an ERROR, not a FAILED)"),
        _f("duration_ms", F64, "Step wall clock"),
        _f("message", S, "Step message (app text: data only)"),
        _f("evidence_json", S, "Evidence pointers as JSON (capped at EVIDENCE_CAP)"),
    ]
)

JUDGE_CALLS = pa.schema(
    _TRIAL_KEY
    + [
        _f("call_index", I32, "Order of the call within the trial", False),
        _f("node_id", S, "DAG node id if known (tags.node_id)"),
        _f("rubric_id", S, "Rubric id if known (tags.rubric_id)"),
        _f("at", _ts(), "When the call was made (UTC)"),
        _f("judge_model", S, "The judge's litellm model string"),
        _f("prompt_hash", S, "sha256 of the rubric prompt"),
        _f("evidence_digest", S, "sha256 of the evidence"),
        _f("cache_key", S, "Judge cache key"),
        _f("vote", I32, "Vote index (k votes per verdict)"),
        _f("rubric", S, "Rubric text"),
        _f("score_min", F64, "Score range low"),
        _f("score_max", F64, "Score range high"),
        _f("evidence_chars", I64, "Evidence length"),
        _f("images", I32, "Images sent"),
        _f("raw_reply", S, "The judge's raw reply"),
        _f("score", F64, "Score clipped into the range"),
        _f("parsed_score", F64, "Score as parsed"),
        _f("reply_form", S, "How the reply was parsed"),
        _f("reasoning", S, "Judge reasoning"),
        _f("latency_ms", F64, "Latency"),
        _f("tokens_in", I64, "Judge input tokens"),
        _f("tokens_out", I64, "Judge output tokens"),
        _f("cached", B, "Served from the cache"),
        _f("attempts", I32, "API attempts"),
        _f("error", S, "Error text (no score)"),
        _f("tags_json", S, "Call tags as JSON"),
    ]
)

ENV_BUILDS = pa.schema(
    _TRIAL_KEY
    + [
        _f("build_index", I32, "Order within the trial", False),
        _f("service", S, "Service / image role (app, db, ...)"),
        _f("backend", S, "Environment backend (local, docker)"),
        _f("image_tag", S, "Image tag (hash of Dockerfile, context, base)"),
        _f("image_digest", S, "Image digest"),
        _f("content_hash", S, "Build-input hash"),
        _f("cache_hit", B, "The image existed; nothing was built"),
        _f("started_at", _ts(), "Build start (UTC)"),
        _f("duration_s", F64, "Build wall clock"),
        _f("ok", B, "Build succeeded"),
        _f("error", S, "Build error"),
        _f("log_tail", S, "Tail of the build log"),
    ]
)

TRAJECTORY_EVENTS = pa.schema(
    _TRIAL_KEY
    + [
        _f("seq", I32, "Event order within the trial", False),
        _f("t_s", F64, "Seconds since the rollout started"),
        _f("ts", _ts(), "Absolute time (trial start + t_s), if the start is known"),
        _f("kind", S, "message, tool_call, tool_result, file_write, error, note, ..."),
        _f("role", S, "Message role (assistant, user, tool, system) if any"),
        _f("content", S, "Event text, capped at CONTENT_CAP characters"),
        _f("content_chars", I64, "Length of the uncapped text"),
        _f("truncated", B, "content was capped"),
        _f("tool", S, "Tool name if any"),
        _f("tokens_in", I64, "Input tokens of this event if reported"),
        _f("tokens_out", I64, "Output tokens of this event if reported"),
        _f("data_json", S, "Other event data as JSON, capped at DATA_CAP"),
    ]
)

MODEL_CALLS = pa.schema(
    _TRIAL_KEY
    + [
        _f("call_index", I32, "Order of the request within the trial", False),
        _f("call_id", S, "litellm call id (x-litellm-call-id)"),
        _f("session", S, "Gateway session of the trial attempt (one virtual key each)"),
        _f("model_group", S, "Model name the agent asked the gateway for"),
        _f("provider_model", S, "litellm provider/model that served it"),
        _f("api_base", S, "Provider base URL"),
        _f("call_type", S, "litellm call type (acompletion, aresponses, anthropic_messages, ...)"),
        _f("stream", B, "Streamed answer"),
        _f("status", S, "success | failure (after the gateway's retries)", False),
        _f("error_class", S, "Exception class of the failure"),
        _f("error", S, "Error text of the failure"),
        _f("http_status", I32, "HTTP status of the failure"),
        _f("tokens_in", I64, "Prompt tokens"),
        _f("tokens_out", I64, "Completion tokens"),
        _f("cost_usd", F64, "Cost in USD (configured per-token prices, else litellm's cost map)"),
        _f("started_at", _ts(), "First attempt start (UTC)"),
        _f("ended_at", _ts(), "Last attempt end (UTC)"),
        _f("latency_ms", F64, "ended_at - started_at, retries and their waits included"),
        _f("attempts", I32, "Upstream attempts (1 + retries)"),
        _f("retry_wait_s", F64, "Total seconds waited between attempts"),
        _f("retried_errors", pa.list_(S), "Exception class of each retried attempt"),
        _f(
            "usage_source",
            S,
            "upstream: tokens as the provider reported them (the gateway's tap); estimate: the provider reported "
            "none, counted from the text; proxy: untapped provider, litellm's figure",
        ),
        _f("usage_estimated", B, "tokens_in/tokens_out are an estimate (the provider reported no usage)"),
        _f("upstream_errors", pa.list_(S), "What the gateway's tap saw fail per attempt (stalled, unreachable)"),
    ]
)

#: One row per trial whose end state was frozen (saasbench.runs.endstate, docs/endstate.md): the
#: manifest and every object it references live under ``objects/sha256/`` in the same store.
#: ``object_keys`` lists them all, so ``lake vacuum --objects`` keeps what a committed row references.
END_STATES = pa.schema(
    _TRIAL_KEY
    + [
        _f("manifest_key", S, "objects/sha256/<2 hex>/<sha256> of the end-state manifest (JSON)"),
        _f("backend", S, "Environment backend the state was frozen in (local, docker); restore needs the same"),
        _f("format_version", I32, "Manifest format version"),
        _f("total_bytes", I64, "Stored size: components (compressed) plus the manifest"),
        _f("raw_bytes", I64, "Size of the components before compression"),
        _f("new_bytes", I64, "Bytes actually written by this freeze (content already stored is not written again)"),
        _f("components_json", S, "Components as JSON: kind, name, service, method, key, bytes, raw_bytes"),
        _f("object_keys", pa.list_(S), "Every object the end state needs: the manifest and its components"),
        _f("restart_source", S, "contract (the deployment contract) | processes (recorded) | none"),
        _f("freeze_s", F64, "Wall clock of the freeze"),
        _f("created_at", _ts(), "When the state was frozen (UTC)"),
        _f("harness_version", S, "saasbench version that froze it"),
        _f("rollout_key", S, "Object key of the trial's rollout record (trajectory, findings, model calls; gzip JSON)"),
        _f(
            "evaluation_key",
            S,
            "Object key of the evaluation record before judging (report, deferred judge requests; gzip JSON)",
        ),
    ]
)

#: Derived from ``node_results`` by the writer (:mod:`saasbench.lake.rollups`), never written by
#: callers: per trial, the sums every report needs, so ``saasbench report`` reads about 20 rows
#: per trial instead of ~100 node rows. Sums add the node rows left to right in (node_index,
#: node_id) order, excluded statuses (SKIPPED_LLM, QUARANTINED, DRY_RUN) adding 0.
NODE_ROLLUPS = pa.schema(
    _TRIAL_KEY
    + [
        _f("kind", S, "trial (all nodes) | category | tier", False),
        _f("key", S, "'' for kind trial; the node category ('' if none) or complexity tier", False),
        _f("nodes", I64, "Node rows in the group"),
        _f("score", F64, "Sum of score over nodes not SKIPPED_LLM/QUARANTINED/DRY_RUN"),
        _f("max_score", F64, "Sum of max_score over the same nodes"),
        _f("det_score", F64, "The same as score, llm-judge nodes left out too"),
        _f("det_max_score", F64, "The same as max_score, llm-judge nodes left out too"),
        _f("skipped_llm_max_score", F64, "Sum of max_score of SKIPPED_LLM nodes"),
        _f("passed", I64, "Nodes PASSED"),
        _f("failed", I64, "Nodes FAILED"),
        _f("error", I64, "Nodes ERROR (an empty or missing status counts as ERROR)"),
        _f("skipped_dependency", I64, "Nodes SKIPPED_DEPENDENCY"),
        _f("skipped_llm", I64, "Nodes SKIPPED_LLM"),
        _f("dry_run", I64, "Nodes DRY_RUN"),
        _f("quarantined", I64, "Nodes QUARANTINED"),
        _f("other_status", I64, "Nodes with a status not in NODE_STATUSES"),
    ]
)

REFERENCE_VALIDATIONS = pa.schema(
    [
        _f("task_id", S, "Task id", False),
        _f("run_id", S, "Validation run id", False),
        _f("dag", S, "DAG name"),
        _f("started_at", _ts(), "Validation start (UTC)"),
        _f("node_id", S, "DAG node id", False),
        _f("category", S, "Node category"),
        _f("method", S, "Scoring method"),
        _f("max_score", F64, "Points possible"),
        _f("repeats", I32, "Oracle repeats"),
        _f("passed", I32, "Repeats PASSED"),
        _f("counted", I32, "Repeats not SKIPPED_LLM"),
        _f("pass_rate", F64, "passed / counted"),
        _f("verdict", S, "One of VERDICTS"),
        _f("flaky_cause", S, "own | prerequisite"),
        _f("statuses", pa.list_(S), "Status per repeat"),
        _f("last_message", S, "Last node message"),
        _f("harness_version", S, "saasbench version"),
        _f("schema_version", I32, "SCHEMA_VERSION of the writer"),
    ]
)

Unit = Literal["sweep", "trial", "validation"]


@dataclass(frozen=True)
class TableDef:
    name: str
    schema: pa.Schema
    unit: Unit  # which commit unit writes it
    partition_by: tuple[str, ...]
    doc: str

    @property
    def columns(self) -> list[str]:
        return self.schema.names

    def empty(self) -> pa.Table:
        return self.schema.empty_table()


TABLES: dict[str, TableDef] = {
    t.name: t
    for t in [
        TableDef("sweeps", SWEEPS, "sweep", ("sweep_id",), "One row per sweep"),
        TableDef("trials", TRIALS, "trial", ("sweep_id", "task_id"), "One row per trial"),
        TableDef("node_results", NODE_RESULTS, "trial", ("sweep_id", "task_id"), "One row per DAG node per trial"),
        TableDef(
            "step_results", STEP_RESULTS, "trial", ("sweep_id", "task_id"), "One row per primitive step per trial"
        ),
        TableDef("judge_calls", JUDGE_CALLS, "trial", ("sweep_id", "task_id"), "One row per LLM-judge call (vote)"),
        TableDef(
            "env_builds",
            ENV_BUILDS,
            "trial",
            ("sweep_id", "task_id"),
            "Image builds / cache hits of a trial's environment",
        ),
        TableDef("trajectory_events", TRAJECTORY_EVENTS, "trial", ("sweep_id", "task_id"), "Agent trajectory events"),
        TableDef(
            "model_calls",
            MODEL_CALLS,
            "trial",
            ("sweep_id", "task_id"),
            "One row per agent request through the model gateway",
        ),
        TableDef(
            "end_states",
            END_STATES,
            "trial",
            ("sweep_id", "task_id"),
            "The frozen end state of a trial: its manifest in the lake's object store",
        ),
        TableDef(
            "node_rollups",
            NODE_ROLLUPS,
            "trial",
            ("sweep_id", "task_id"),
            "Per trial, category and tier: node score sums and status counts (derived from node_results)",
        ),
        TableDef(
            "reference_validations",
            REFERENCE_VALIDATIONS,
            "validation",
            ("task_id",),
            "One row per node per validate-reference run",
        ),
    ]
}

TRIAL_TABLES: tuple[str, ...] = tuple(n for n, t in TABLES.items() if t.unit == "trial")
#: Tables the writer derives from other tables of the same unit; callers never pass them.
DERIVED_TABLES: tuple[str, ...] = ("node_rollups",)


def table(name: str) -> TableDef:
    try:
        return TABLES[name]
    except KeyError:
        raise KeyError(f"no lake table {name!r} (known: {', '.join(TABLES)})") from None


def duckdb_type(type_: pa.DataType) -> str:
    """The DuckDB type name of an Arrow type used in these schemas."""
    if pa.types.is_string(type_) or pa.types.is_large_string(type_):
        return "VARCHAR"
    if pa.types.is_int32(type_):
        return "INTEGER"
    if pa.types.is_int64(type_):
        return "BIGINT"
    if pa.types.is_float64(type_):
        return "DOUBLE"
    if pa.types.is_boolean(type_):
        return "BOOLEAN"
    if pa.types.is_timestamp(type_):
        return "TIMESTAMP WITH TIME ZONE" if type_.tz else "TIMESTAMP"
    if pa.types.is_list(type_):
        return duckdb_type(type_.value_type) + "[]"
    raise TypeError(f"no DuckDB mapping for {type_}")
