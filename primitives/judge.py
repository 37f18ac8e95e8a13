"""Judge primitive: P17 llm_judge (rubric-based LLM scoring of gathered evidence).

The step asks the run's judge (``ctx.judge``, a :class:`saasbench.services.judge.Judge`) to score
evidence against the node's rubric and hands the engine ``judge_score`` on ``judge_range``;
the engine turns it into points (``clip(judge * M / hi, 0, M)``, docs/dag-semantics.md).

Outcomes:

- judge disabled (no judge on the context, or ``RunOptions.judge_enabled`` False), judge API
  unavailable after retries, or no parseable score: ``judge_skipped=True`` -> SKIPPED_LLM;
- no evidence (no workspace file, no response, no page): the step fails -> the node is FAILED,
  with ``unreachable=True`` when the app did not answer (a missing page is the app's failure,
  not the judge's outage);
- otherwise ``passed = score > 0`` with the call's model, prompt hash, evidence digest, reply
  excerpt, latency and cache flag as evidence;
- deferred judging (the run's judge a :class:`saasbench.evaluation.judging.DeferredJudge` that defers
  this node): the gathered evidence is stored as a :class:`~saasbench.evaluation.judging.JudgeRequest`
  and the step is a pending judgement (SKIPPED_LLM with ``judge_pending``) until the judge stage.

The verdict -> StepResult part is :func:`saasbench.evaluation.judging.verdict_step_result`, shared
with the judge stage.

Evidence types: ``code_files`` (workspace sample, see :func:`saasbench.services.judge.code_evidence`),
``http_response_body``/``http_response_html`` (the last response), ``rendered_dom`` (set by
RENDER_DOM), ``screenshot`` (PNG paths in ``screenshots``, sent as images, with the DOM as text),
``http_exchanges`` (the run's recorded HTTP exchanges, ``ctx.response_log``; only the last response
when the context keeps no log), ``http_response_headers`` (the last response's headers, then the
``files_to_sample``), ``db_query_result`` (the last P08 rows) and ``directory_listing`` (a workspace
folder, ``base_dir``/``depth``). Public-DAG names map onto these (``_EVIDENCE_ALIASES``).
The rubric text is taken verbatim (no placeholder resolution: rubrics quote templates).
"""

from __future__ import annotations

import re
from typing import Any, Literal, get_args

from pydantic import Field, field_validator, model_validator

from saasbench.dag import note, warn
from saasbench.evaluation.context import RunContext
from saasbench.evaluation.judging import DeferredJudge, JudgeRequest
from saasbench.evaluation.results import StepResult
from saasbench.primitives.registry import PrimitiveInputs, primitive
from saasbench.services.judge import (
    MAX_FILES,
    MAX_IMAGES,
    PER_FILE_CHARS,
    TOTAL_CHARS,
    Evidence,
    NoEvidence,
    code_evidence,
    dom_evidence,
    exchanges_evidence,
    headers_evidence,
    listing_evidence,
    response_evidence,
    rows_evidence,
    screenshot_evidence,
)

EvidenceType = Literal[
    "code_files",
    "http_response_body",
    "http_response_html",
    "rendered_dom",
    "screenshot",
    "logs",
    "http_exchanges",
    "http_response_headers",
    "db_query_result",
    "directory_listing",
]
# Evidence types DAGs name that this engine does not collect: the step loads (with a warning) and
# is reported judge-skipped at run time (SKIPPED_LLM, excluded from totals) instead of guessing.
UNCOLLECTED_EVIDENCE = {"logs"}
_EVIDENCE_TYPES = set(get_args(EvidenceType))


def _combined_evidence(kind: str, has_files: bool) -> str | None:
    """The one evidence type used for a combined kind such as ``frontend_code_and_dom``: the code
    files when the step names files to sample, else the first part that is a known type."""
    parts = [_EVIDENCE_ALIASES.get(p, p) for p in kind.split("_and_")]
    if has_files and any(p == "code_files" or "code" in p or "file" in p for p in parts):
        return "code_files"
    return next((p for p in parts if p in _EVIDENCE_TYPES and p not in UNCOLLECTED_EVIDENCE), None)


_EVIDENCE_ALIASES = {
    "codebase": "code_files",
    "code": "code_files",
    "files": "code_files",
    "source_code": "code_files",
    "last_body": "http_response_body",
    "response_body": "http_response_body",
    "api_response": "http_response_body",
    "http_response": "http_response_body",
    "last_response": "http_response_body",
    "html": "http_response_html",
    "dom": "rendered_dom",
    "screenshots": "screenshot",
    # what each public family's reference collects under its own name (docs/dag-semantics.md "P17 evidence types")
    "http_response_json": "http_response_body",  # lgzivily, rjhcjrst, jzssnoqp: the last response's JSON body
    "multi_endpoint_responses": "http_response_body",  # lgzivily: only the last response's body preview
    "page_html": "rendered_dom",  # xayqujrv: the HTML of the page P18 opened
    "code_files_and_config": "code_files",  # lgzivily: the same files_to_sample walk as code_files
    "api_responses": "http_exchanges",  # cvyocaao: every P04 exchange of the run, filtered by api_path_filters
    "http_responses": "http_exchanges",  # ghmkznee: the run's response log
    "http_response_payload": "http_exchanges",  # xayqujrv: the last body plus the run's last P04 payloads
    "container_logs": "logs",  # xayqujrv: the log text its P21 step kept (this engine's P21 keeps none)
}
DEFAULT_SCORE_RANGE = (0.0, 5.0)  # the reference harness's default, used only when nothing else tells
_RUBRIC_RANGE_RE = re.compile(
    r"(?i)\b(?:score|scores|scoring|range|rate|points?)\b[^0-9\n]{0,24}?(0)\s*(?:-|–|—|\.\.|to)\s*(\d+(?:\.\d+)?)\b"
)
RAW_FIELDS = frozenset(
    {"rubric_prompt", "prompt", "rubric"}
)  # rubric text is sent verbatim, never placeholder-resolved


def _score_range(value: Any) -> Any:
    """[lo, hi] from a list, 'lo-hi' text, {min, max} or a single top value n (-> [0, n])."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return [0, value]
    if isinstance(value, str):
        m = re.fullmatch(r"\s*(-?\d+(?:\.\d+)?)\s*(?:-|–|\.\.|to|,)\s*(-?\d+(?:\.\d+)?)\s*", value)
        if m:
            return [float(m.group(1)), float(m.group(2))]
        try:
            return [0, float(value)]
        except ValueError:
            return value
    if isinstance(value, dict):
        lo = value.get("min", value.get("lo", 0))
        hi = value.get("max", value.get("hi"))
        return [lo, hi] if hi is not None else value
    return value


class P17Inputs(PrimitiveInputs):
    rubric_prompt: str = Field(
        min_length=1,
        description="The rubric (aliases: prompt, rubric); sent verbatim as the user message's Rubric section",
    )
    score_range: tuple[float, float] | None = Field(
        default=None,
        description="[lo, hi] of the judge's score (aliases: max_score/maxScore n -> [0, n]); "
        "default [0, node maxScore]",
    )
    evidence_type: EvidenceType = Field(
        default="code_files",
        description="What the judge sees (alias evidence_source; codebase -> code_files, last_body -> http_response_body)",
    )
    files_to_sample: list[str] = Field(
        default_factory=list,
        description="code_files entries: files, dirs, globs (src/**/*.ts) or keyword:<word>; "
        "none = whole workspace (alias evidence_files)",
    )
    sample_strategy: str = Field(
        default="head", description="head (also first, structure_and_key_files) or tail: which part of each file"
    )
    max_files: int = Field(default=MAX_FILES, ge=1, description="Files sampled at most (alias sample_limit)")
    per_file_chars: int = Field(default=PER_FILE_CHARS, ge=100, description="Characters per file at most")
    total_chars: int = Field(
        default=TOTAL_CHARS,
        ge=500,
        description="Characters of evidence at most (aliases evidence_prompt_budget, max_evidence_chars)",
    )
    extensions: list[str] | None = Field(
        default=None, description="Only files with these extensions from dirs/globs/keywords"
    )
    max_images: int = Field(default=MAX_IMAGES, ge=1, description="screenshot: the latest N screenshots are sent")
    rubric_id: str | None = Field(default=None, description="Rubric identifier (R01...), recorded with the call")
    api_path_filters: list[str] = Field(
        default_factory=list,
        description="http_exchanges: only exchanges whose path contains one of these (all when none does)",
    )
    max_exchanges: int = Field(default=20, ge=1, description="http_exchanges: the newest N exchanges")
    base_dir: str = Field(
        default=".",
        description="directory_listing: the folder listed ('/app' and '/app/x' are the workspace root and x)",
    )
    depth: int = Field(default=2, ge=1, le=6, description="directory_listing: levels listed")

    @model_validator(mode="before")
    @classmethod
    def _legacy(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        for key in ("prompt", "rubric"):
            if key in data and "rubric_prompt" not in data:
                data["rubric_prompt"] = data.pop(key)
                note(f"'{key}' -> 'rubric_prompt'")
        rubric = data.get("rubric_prompt")
        if isinstance(rubric, list):
            data["rubric_prompt"] = "\n".join(str(x) for x in rubric)
            note("rubric given as a list -> lines")
        if "evidence_source" in data and "evidence_type" not in data:
            data["evidence_type"] = data.pop("evidence_source")
            note("'evidence_source' -> 'evidence_type'")
        kind = data.get("evidence_type")
        if isinstance(kind, str):
            canon = kind.strip().lower()
            canon = _EVIDENCE_ALIASES.get(canon, canon)
            if canon != kind:
                data["evidence_type"] = canon
                note(f"evidence_type {kind!r} -> {canon!r}")
            if canon not in _EVIDENCE_TYPES and "_and_" in canon:  # egsszeqg: "frontend_code_and_dom"
                chosen = _combined_evidence(canon, bool(data.get("files_to_sample")))
                if chosen is not None:
                    data["evidence_type"] = canon = chosen
                    warn(
                        f"evidence_type {kind!r} asks for several kinds of evidence; the judge gets one: {chosen} "
                        f"({'the files_to_sample' if chosen == 'code_files' else 'the first kind this engine collects'})",
                        "evidence_type",
                    )
            if canon in UNCOLLECTED_EVIDENCE and str(kind).strip().lower() == "container_logs":
                warn(
                    "evidence_type 'container_logs' judges the log text the xayqujrv reference's P21 step kept; this "
                    "engine's P21 keeps no log text: the step is reported judge-skipped at run time",
                    "evidence_type",
                )
            elif canon in UNCOLLECTED_EVIDENCE:  # ychlukjm DOC_LLM_LOGGING_QUALITY: P12 prints logs, then P17 'logs'
                warn(
                    f"evidence_type {canon!r} is collected by no reference harness family (code_files, http_response_body, "
                    "http_response_html, rendered_dom, screenshot): the step is reported judge-skipped at run time",
                    "evidence_type",
                )
        for key in ("max_score", "maxScore"):
            if key in data:
                value = data.pop(key)
                if "score_range" not in data:
                    data["score_range"] = [0, value]
                    note(f"'{key}' -> 'score_range' [0, n]")
        if "score_range" in data:
            data["score_range"] = _score_range(data["score_range"])
        for key, target, what in (
            ("evidence_files", "files_to_sample", "'evidence_files' -> 'files_to_sample'"),
            ("sample_limit", "max_files", "'sample_limit' -> 'max_files'"),
            ("evidence_prompt_budget", "total_chars", "'evidence_prompt_budget' -> 'total_chars'"),
            ("max_evidence_chars", "total_chars", "'max_evidence_chars' -> 'total_chars'"),
        ):
            if key in data:
                value = data.pop(key)
                if target not in data:
                    data[target] = value
                    note(f"{what}")
        if isinstance(data.get("files_to_sample"), str):
            data["files_to_sample"] = [data["files_to_sample"]]
            note("'files_to_sample' given as a string -> list")
        if isinstance(data.get("api_path_filters"), str):
            data["api_path_filters"] = [data["api_path_filters"]]
        base = data.get("base_dir")
        if isinstance(base, str) and (base.strip() == "/app" or base.strip().startswith("/app/")):
            data["base_dir"] = base.strip()[len("/app") :].lstrip("/") or "."  # iyjruvfz: /app is the workspace
            note(f"base_dir {base!r} -> {data['base_dir']!r} (the app's /app is the workspace)")
        return data

    @field_validator("score_range")
    @classmethod
    def _range(cls, value: tuple[float, float] | None) -> tuple[float, float] | None:
        if value is not None and not value[1] > value[0]:
            raise ValueError("score_range must be [lo, hi] with hi > lo")
        return value


def _node_max_score(ctx: RunContext) -> float | None:
    """The running node's maxScore, when the engine exposes it on the context."""
    for holder, attr in ((ctx, "node_max_score"), (getattr(ctx, "current_node", None), "max_score")):
        value = getattr(holder, attr, None) if holder is not None else None
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
            return float(value)
    return None


def resolve_range(inputs: P17Inputs, ctx: RunContext) -> tuple[tuple[float, float], tuple[float, float] | None, str]:
    """(range told to the judge, range handed to the engine, where it came from).

    Precedence: ``score_range``; the rubric's "Score 0-6" text (passed on so the engine rescales
    consistently with what the judge was told); the node's maxScore (the engine's default
    [0, M], so None is passed); else the reference default [0, 5].
    """
    if inputs.score_range is not None:
        return inputs.score_range, inputs.score_range, "score_range"
    # The rubric's own "Score 0-6" wins over maxScore: it is the scale the judge reads.
    m = _RUBRIC_RANGE_RE.search(inputs.rubric_prompt)
    if m and float(m.group(2)) > 0:
        rng = (0.0, float(m.group(2)))
        return rng, rng, "rubric text"
    top = _node_max_score(ctx)
    if top is not None:
        return (0.0, top), None, "node maxScore"
    return DEFAULT_SCORE_RANGE, DEFAULT_SCORE_RANGE, "default [0, 5]"


def gather_evidence(inputs: P17Inputs, ctx: RunContext) -> Evidence | NoEvidence:
    kind = inputs.evidence_type
    if kind == "code_files":
        return _code(inputs, ctx, inputs.total_chars)
    if kind in ("http_response_body", "http_response_html"):
        return response_evidence(ctx.last_response, total_chars=inputs.total_chars)
    if kind == "http_exchanges":
        log = getattr(ctx, "response_log", None)
        responses = list(log) if log is not None else [ctx.last_response]
        return exchanges_evidence(
            responses,
            path_filters=inputs.api_path_filters,
            max_exchanges=inputs.max_exchanges,
            total_chars=inputs.total_chars,
            whole_log=log is not None,
        )
    if kind == "http_response_headers":  # gavmyneb: the headers, then the files_to_sample (CSP/CSRF config) when given
        got = headers_evidence(ctx.last_response, total_chars=inputs.total_chars)
        if isinstance(got, NoEvidence) or not inputs.files_to_sample:
            return got
        code = _code(inputs, ctx, max(500, inputs.total_chars - len(got.text) - 40))
        if isinstance(code, NoEvidence):
            return got
        return Evidence(
            text=got.text + "\n\n## Source files\n" + code.text,
            kind=kind,
            summary={**got.summary, "code": code.summary},
        )
    if kind == "db_query_result":
        return rows_evidence(ctx.last_document, total_chars=inputs.total_chars)
    if kind == "directory_listing":
        from saasbench.primitives.files import workspace_for

        ws = workspace_for(ctx)
        if isinstance(ws, str):
            return NoEvidence(f"no evidence: {ws}")
        return listing_evidence(ws, inputs.base_dir, depth=inputs.depth, total_chars=inputs.total_chars)
    dom = _latest(ctx, "rendered_dom")
    if kind == "rendered_dom":
        return dom_evidence(
            dom if isinstance(dom, str) else None, fallback=ctx.last_response, total_chars=inputs.total_chars
        )
    shots = _latest(ctx, "screenshots")
    if isinstance(shots, str):
        shots = [shots]
    paths = [str(p) for p in shots] if isinstance(shots, (list, tuple)) else []
    return screenshot_evidence(
        paths, dom=dom if isinstance(dom, str) else None, max_images=inputs.max_images, total_chars=inputs.total_chars
    )


def _code(inputs: P17Inputs, ctx: RunContext, total_chars: int) -> Evidence | NoEvidence:
    from saasbench.primitives.files import workspace_for

    ws = workspace_for(ctx)
    if isinstance(ws, str):
        return NoEvidence(f"no evidence: {ws}")
    return code_evidence(
        ws,
        inputs.files_to_sample,
        inputs.rubric_prompt,
        per_file_chars=inputs.per_file_chars,
        total_chars=total_chars,
        max_files=inputs.max_files,
        extensions=inputs.extensions,
        strategy=inputs.sample_strategy,
        remaining=ctx.remaining,
    )


def _latest(ctx: RunContext, name: str) -> Any:
    """What this node captured under ``name``, else the run-wide value."""
    if name in ctx.node_scope:
        return ctx.node_scope[name]
    return ctx.vars.get(name)


@primitive("P17", P17Inputs, raw_fields=RAW_FIELDS)
def llm_judge(inputs: P17Inputs, ctx: RunContext) -> StepResult:
    """Score gathered evidence against the rubric with the run's LLM judge."""
    judge = getattr(ctx, "judge", None)
    if judge is None or not ctx.options.judge_enabled:
        why = "no judge model configured" if judge is None else "judge turned off for this run"
        return StepResult(passed=False, judge_skipped=True, message=f"judge disabled ({why})")
    if inputs.evidence_type in UNCOLLECTED_EVIDENCE:
        return StepResult(
            passed=False,
            judge_skipped=True,
            message=f"evidence_type {inputs.evidence_type!r} is not collected by this engine (judge skipped)",
        )
    told, handed, range_source = resolve_range(inputs, ctx)

    evidence = gather_evidence(inputs, ctx)
    if isinstance(evidence, NoEvidence):
        return StepResult(
            passed=False,
            unreachable=evidence.unreachable,
            message=evidence.message,
            evidence={"evidence_type": inputs.evidence_type},
        )

    tags = {
        "rubric_id": inputs.rubric_id,
        "evidence_type": inputs.evidence_type,
        "task_id": ctx.target.task_id,
        "node_id": getattr(ctx, "node_id", None),
    }
    request = JudgeRequest.from_evidence(
        evidence,
        node_id=getattr(ctx, "node_id", None) or "",
        step_index=getattr(ctx, "step_index", None) or 0,
        rubric_prompt=inputs.rubric_prompt,
        evidence_type=inputs.evidence_type,
        score_range=told,
        engine_range=handed,
        range_source=range_source,
        tags={k: v for k, v in tags.items() if v is not None},
        rubric_id=inputs.rubric_id,
    )
    if isinstance(judge, DeferredJudge) and judge.defers(request.node_id):
        return judge.defer(request)  # judged later by the judge stage (saasbench.evaluation.judging)
    return request.judge(judge, deadline_s=ctx.remaining())
