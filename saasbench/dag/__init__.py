"""Canonical validation-DAG model and the one loader that normalises every legacy variant.

The public SaaSBench DAGs come in several dialects (``primitive_chain`` vs ``steps``, step key
``primitive`` vs ``type``, ``llm_judge`` vs ``llm-judge``, node-level ``max_score``, ...). The
loader turns each of them into one canonical :class:`Dag`, records every normalisation it applied
and every defect it found, and refuses files it cannot trust with errors that name the file, the
node id and the field. See docs/dag-semantics.md.
"""

from __future__ import annotations

import contextvars
import graphlib
import json
import math
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from saasbench.dag.placeholders import MUSTACHE, SHELL
from saasbench.inputs import InputError, read_text

Method = Literal["binary", "weighted", "llm-judge"]
IssueKind = Literal["error", "warning", "normalisation"]

METHOD_ALIASES: dict[str, Method] = {
    "binary": "binary",
    "weighted": "weighted",
    "llm-judge": "llm-judge",
    "llm_judge": "llm-judge",
    "llm-as-judge": "llm-judge",
    "llm_as_judge": "llm-judge",
}

# Node keys the loader understands; anything else is kept in ``extras`` and reported.
_NODE_KEYS = {
    "id",
    "description",
    "prereqs",
    "primitive_chain",
    "steps",
    "scoring",
    "complexity_tier",
    "kb_refs",
    "source_evidence",
    "run_last",
    "_run_last",
    "max_score",
    "evidence",
}
# Free-text authoring notes seen in real DAGs: kept verbatim, never warned about.
_ANNOTATION_KEYS = {"_eval_fix", "_honesty_note", "_normaliser", "_round19_note", "_baseline_known_gap"}


# Descriptive node metadata of newer DAGs (egsszeqg): kept verbatim in extras, never warned about.
_METADATA_KEYS = {"coverage_refs", "trajectory_tags", "merged_from", "kb_ref"}


def is_annotation(key: Any, value: Any) -> bool:
    """An authoring note: a known one, or any ``_name`` key holding text (``_round26_test_bug_fix``,
    ``_inclusivity_2026_04_30`` in ygamciur/ychlukjm), at node, scoring, step or input level."""
    return key in _ANNOTATION_KEYS or (
        isinstance(key, str) and len(key) > 1 and key[0] == "_" and key[1].isalpha() and isinstance(value, str)
    )


_SCORING_KEYS = {"category", "subcategory", "method", "maxScore", "max_score"}


class Step(BaseModel):
    """One primitive invocation in a node's chain.

    ``defect``: why the step cannot mean anything (an input its primitive rejects with
    :class:`StepDefect`, e.g. a workflow with nothing to run). The file still loads (a warning names the node
    and the field); the node is ERROR at run time with this message and runs no step.
    """

    model_config = ConfigDict(frozen=True)

    type: str
    inputs: dict[str, Any] = Field(default_factory=dict)
    defect: str | None = None


class Scoring(BaseModel):
    category: str = "Uncategorized"
    subcategory: str = ""
    method: Method
    maxScore: float = Field(ge=0)
    extras: dict[str, Any] = Field(default_factory=dict)


class Node(BaseModel):
    id: str
    description: str = ""
    prereqs: list[str] = Field(default_factory=list)
    steps: list[Step]
    scoring: Scoring
    complexity_tier: str | None = None
    kb_refs: list[str] = Field(default_factory=list)
    source_evidence: dict[str, Any] | None = None
    run_last: bool = False
    extras: dict[str, Any] = Field(default_factory=dict)

    @property
    def max_score(self) -> float:
        return self.scoring.maxScore

    @property
    def defects(self) -> list[str]:
        """``steps[i] (CODE): why`` for every defective step (see :attr:`Step.defect`)."""
        return [f"steps[{i}] ({s.type}): {s.defect}" for i, s in enumerate(self.steps) if s.defect]

    @property
    def method(self) -> Method:
        return self.scoring.method


class Dag(BaseModel):
    """A loaded, normalised DAG. ``nodes`` keep file order; use :func:`execution_order` to run."""

    source: str = "<memory>"
    meta: dict[str, Any] = Field(default_factory=dict)
    scoring_config: dict[str, Any] = Field(default_factory=dict)
    nodes: list[Node]

    def node(self, node_id: str) -> Node:
        for n in self.nodes:
            if n.id == node_id:
                return n
        raise KeyError(node_id)

    @property
    def total_max_score(self) -> float:
        return sum(n.max_score for n in self.nodes)

    @property
    def env_defaults(self) -> dict[str, str]:
        raw = self.meta.get("env_defaults") or {}
        return {str(k): str(v) for k, v in raw.items()} if isinstance(raw, dict) else {}


class Issue(BaseModel):
    """One finding of the loader. ``kind`` is error, warning or normalisation."""

    kind: IssueKind
    file: str
    node: str | None = None
    field: str | None = None
    message: str

    def __str__(self) -> str:
        where = self.file
        if self.node:
            where += f" node {self.node}"
        if self.field:
            where += f" field {self.field}"
        return f"{where}: {self.message}"


class DagLoadError(Exception):
    """Raised when a DAG cannot be trusted; carries every error found, not just the first."""

    def __init__(self, issues: list[Issue]):
        self.issues = [i for i in issues if i.kind == "error"]
        super().__init__("\n".join(str(i) for i in self.issues))


class LoadResult(BaseModel):
    dag: Dag
    issues: list[Issue] = Field(default_factory=list)

    @property
    def warnings(self) -> list[Issue]:
        return [i for i in self.issues if i.kind == "warning"]

    @property
    def normalisations(self) -> list[Issue]:
        return [i for i in self.issues if i.kind == "normalisation"]


# --- normalisation notes raised from inside primitive input models -------------------------------
_notes: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("saasbench_dag_notes", default=None)


def note(message: str) -> None:
    """Record a legacy-construct normalisation; primitive input models call this while validating."""
    bucket = _notes.get()
    if bucket is not None and message not in bucket:
        bucket.append(message)


class StepDefect(ValueError):
    """Raised by a primitive's input validator for a DAG defect: a step that cannot mean anything
    (e.g. a workflow with nothing to run). Unlike other validation errors it does not fail the
    file: the loader reports a warning naming the node and the field, and the node is ERROR at
    run time with this message, running no step (:attr:`Step.defect`)."""


_warnings: contextvars.ContextVar[list[tuple[str, str | None]] | None] = contextvars.ContextVar(
    "saasbench_dag_warnings", default=None
)


def warn(message: str, where: str | None = None) -> None:
    """Record a DAG defect found while validating a step's inputs (the step still loads and runs).

    ``where`` is the path inside the inputs (e.g. ``steps[4].action``); the loader reports a
    warning naming the file, the node and the field ``steps[i].inputs.<where>``. At run time
    (inputs validated again after placeholder resolution) there is no bucket and nothing is kept.
    """
    bucket = _warnings.get()
    if bucket is not None and (message, where) not in bucket:
        bucket.append((message, where))


# The same placeholder grammar as the resolver (saasbench.dag.placeholders), so the loader and the
# run time agree on what is a placeholder.
PLACEHOLDER_RE = re.compile(f"{MUSTACHE.pattern}|{SHELL.pattern}")


def _has_placeholder(value: Any) -> bool:
    return isinstance(value, str) and bool(PLACEHOLDER_RE.search(value))


# --- the loader ------------------------------------------------------------------------------------
class _Collector:
    def __init__(self, file: str):
        self.file = file
        self.issues: list[Issue] = []

    def add(self, kind: IssueKind, message: str, node: str | None = None, field: str | None = None) -> None:
        self.issues.append(Issue(kind=kind, file=self.file, node=node, field=field, message=message))


MAX_DAG_BYTES = 64 * 1024 * 1024  # the largest public DAG is under 1 MB


def load_dag(path: str | Path, *, validate_inputs: bool = True) -> LoadResult:
    """Load and normalise a DAG file (UTF-8 JSON, at most :data:`MAX_DAG_BYTES`). Raises :class:`DagLoadError`
    listing every error."""
    path = Path(path)
    file = str(path)
    try:
        text = read_text(path, max_bytes=MAX_DAG_BYTES, what="DAG file")
    except InputError as exc:
        raise DagLoadError([Issue(kind="error", file=file, message=str(exc).removeprefix(f"{file}: "))]) from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DagLoadError(
            [Issue(kind="error", file=file, message=f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}")]
        ) from exc
    except RecursionError:
        raise DagLoadError([Issue(kind="error", file=file, message="JSON nested too deeply")]) from None
    return load_dag_data(raw, source=file, validate_inputs=validate_inputs)


def load_dag_data(raw: Any, *, source: str = "<memory>", validate_inputs: bool = True) -> LoadResult:
    """Normalise already-parsed DAG JSON (a dict with ``nodes``, or a bare list of nodes)."""
    c = _Collector(source)
    if isinstance(raw, list):
        raw = {"nodes": raw}
        c.add("normalisation", "top level is a bare list of nodes; wrapped as {nodes: [...]}")
    if not isinstance(raw, dict):
        c.add("error", f"top level must be an object with 'nodes', got {type(raw).__name__}")
        raise DagLoadError(c.issues)
    meta: dict[str, Any] = raw["meta"] if isinstance(raw.get("meta"), dict) else {}
    scoring_config: dict[str, Any] = raw["scoring_config"] if isinstance(raw.get("scoring_config"), dict) else {}
    for key in raw:
        if key not in {"meta", "scoring_config", "nodes"}:
            c.add("warning", f"top-level key {key!r} not understood (kept out of the model)", field=key)
    raw_nodes = raw.get("nodes")
    if isinstance(raw_nodes, dict):  # {id: node} form
        raw_nodes = [{"id": k, **v} if isinstance(v, dict) else v for k, v in raw_nodes.items()]
        c.add("normalisation", "nodes given as an object keyed by id; converted to a list")
    if not isinstance(raw_nodes, list):
        c.add("error", "missing 'nodes' list", field="nodes")
        raise DagLoadError(c.issues)

    nodes: list[Node] = []
    seen: set[str] = set()
    for index, rn in enumerate(raw_nodes):
        node = _load_node(rn, index, c, validate_inputs)
        if node is None:
            continue
        if node.id in seen:
            c.add("error", "duplicate node id", node=node.id, field="id")
            continue
        seen.add(node.id)
        nodes.append(node)

    for n in nodes:
        for p in n.prereqs:
            if p not in seen:
                c.add(
                    "warning",
                    f"prerequisite {p!r} names no node (ignored for gating; a DAG defect)",
                    node=n.id,
                    field="prereqs",
                )
            elif p == n.id:
                c.add("error", "node lists itself as a prerequisite", node=n.id, field="prereqs")

    if not any(i.kind == "error" for i in c.issues):
        cycle = find_cycle(nodes)
        if cycle:
            c.add("error", "prerequisite cycle: " + " -> ".join(cycle), node=cycle[0], field="prereqs")
    if any(i.kind == "error" for i in c.issues):
        raise DagLoadError(c.issues)

    _check_totals(meta, scoring_config, nodes, c)
    _check_shared_state(nodes, c)
    if meta.get("execution_mode") == "custom_test_functions":
        c.add(
            "normalisation",
            "meta.execution_mode 'custom_test_functions': the primitive chains are executed as the specification",
        )
    dag = Dag(source=source, meta=meta, scoring_config=scoring_config, nodes=nodes)
    return LoadResult(dag=dag, issues=c.issues)


def _load_node(rn: Any, index: int, c: _Collector, validate_inputs: bool) -> Node | None:
    if not isinstance(rn, dict):
        c.add("error", f"node #{index} is not an object", field=f"nodes[{index}]")
        return None
    node_id = rn.get("id")
    if not isinstance(node_id, str) or not node_id.strip():
        c.add("error", f"node #{index} has no string 'id'", node=f"#{index}", field="id")
        return None
    errors_before = sum(1 for i in c.issues if i.kind == "error")

    # chain
    if "steps" in rn and "primitive_chain" in rn:
        c.add("warning", "both 'steps' and 'primitive_chain' given; 'steps' wins", node=node_id, field="steps")
    raw_steps = rn.get("steps", rn.get("primitive_chain"))
    if "steps" not in rn and "primitive_chain" in rn:
        c.add("normalisation", "legacy key 'primitive_chain' -> 'steps'", node=node_id, field="primitive_chain")
    steps: list[Step] = []
    if not isinstance(raw_steps, list) or not raw_steps:
        c.add("error", "missing or empty 'steps'/'primitive_chain'", node=node_id, field="steps")
    else:
        for si, rs in enumerate(raw_steps):
            step = _load_step(rs, node_id, si, c, validate_inputs)
            if step is not None:
                steps.append(step)

    # scoring
    scoring = _load_scoring(rn, node_id, c)

    prereqs = rn.get("prereqs", [])
    if prereqs is None:
        prereqs = []
    if isinstance(prereqs, str):
        prereqs = [prereqs]
        c.add("normalisation", "prereqs given as a string; wrapped in a list", node=node_id, field="prereqs")
    if not isinstance(prereqs, list) or not all(isinstance(p, str) for p in prereqs):
        c.add("error", "prereqs must be a list of node ids", node=node_id, field="prereqs")
        prereqs = []

    run_last = bool(rn.get("run_last", False))
    if "_run_last" in rn:
        run_last = run_last or bool(rn["_run_last"])
        c.add("normalisation", "legacy key '_run_last' -> 'run_last'", node=node_id, field="_run_last")

    extras: dict[str, Any] = {}
    for key, value in rn.items():
        if key in _NODE_KEYS:
            continue
        extras[key] = value
        if not is_annotation(key, value) and key not in _METADATA_KEYS:
            c.add("warning", f"node key {key!r} not understood (kept verbatim in extras)", node=node_id, field=key)
    if "evidence" in rn:
        extras["evidence"] = rn["evidence"]

    complexity_tier = rn.get("complexity_tier")
    if isinstance(complexity_tier, (int, float)) and not isinstance(complexity_tier, bool):
        complexity_tier = f"{complexity_tier:g}"
        c.add(
            "normalisation",
            f"complexity_tier {rn['complexity_tier']!r} (a number) -> {complexity_tier!r}",
            node=node_id,
            field="complexity_tier",
        )
    elif complexity_tier is not None and not isinstance(complexity_tier, str):
        c.add(
            "warning",
            f"complexity_tier {complexity_tier!r} is not a string or number (ignored)",
            node=node_id,
            field="complexity_tier",
        )
        complexity_tier = None

    kb_refs = rn.get("kb_refs") or []
    if isinstance(kb_refs, str):
        kb_refs = [kb_refs]
    if sum(1 for i in c.issues if i.kind == "error") > errors_before or scoring is None:
        return None
    try:
        return Node(
            id=node_id,
            description=str(rn.get("description") or ""),
            prereqs=list(dict.fromkeys(prereqs)),
            steps=steps,
            scoring=scoring,
            complexity_tier=complexity_tier,
            kb_refs=[str(k) for k in kb_refs],
            source_evidence=rn.get("source_evidence") if isinstance(rn.get("source_evidence"), dict) else None,
            run_last=run_last,
            extras=extras,
        )
    except ValidationError as exc:
        for err in exc.errors():
            c.add("error", err["msg"], node=node_id, field=".".join(str(p) for p in err["loc"]))
        return None


def _load_scoring(rn: dict[str, Any], node_id: str, c: _Collector) -> Scoring | None:
    raw = rn.get("scoring")
    if not isinstance(raw, dict):
        c.add("error", "missing 'scoring' object", node=node_id, field="scoring")
        return None
    method_raw = raw.get("method")
    method = METHOD_ALIASES.get(str(method_raw).strip().lower()) if method_raw is not None else None
    if method is None:
        c.add(
            "error",
            f"unknown scoring method {method_raw!r} (expected binary, weighted or llm-judge)",
            node=node_id,
            field="scoring.method",
        )
        return None
    if method_raw != method:
        c.add("normalisation", f"scoring method {method_raw!r} -> {method!r}", node=node_id, field="scoring.method")
    max_score = raw.get("maxScore", raw.get("max_score"))
    if "maxScore" not in raw and "max_score" in raw:
        c.add("normalisation", "scoring.max_score -> scoring.maxScore", node=node_id, field="scoring.max_score")
    if "max_score" in rn:
        if max_score is None:
            max_score = rn["max_score"]
            c.add("normalisation", "node-level max_score -> scoring.maxScore", node=node_id, field="max_score")
        elif as_number(rn["max_score"]) != as_number(max_score):
            c.add(
                "warning",
                f"node-level max_score {rn['max_score']!r} disagrees with scoring.maxScore {max_score!r}; scoring.maxScore wins",
                node=node_id,
                field="max_score",
            )
    value = as_number(max_score)
    if value is None:
        c.add("error", f"maxScore must be a number (finite), got {max_score!r}", node=node_id, field="scoring.maxScore")
        return None
    if value < 0:
        c.add("error", f"maxScore must be >= 0, got {value:g}", node=node_id, field="scoring.maxScore")
        return None
    extras = {k: v for k, v in raw.items() if k not in _SCORING_KEYS}
    for key in extras:
        if not is_annotation(key, extras[key]):
            c.add("warning", f"scoring key {key!r} not understood (kept)", node=node_id, field=f"scoring.{key}")
    return Scoring(
        category=str(raw.get("category") or "Uncategorized"),
        subcategory=str(raw.get("subcategory") or ""),
        method=method,
        maxScore=value,
        extras=extras,
    )


def as_number(value: Any) -> float | None:
    """A JSON number or numeric string as a finite float (booleans, NaN and infinities are not numbers here);
    None otherwise."""
    if isinstance(value, bool):
        return None
    try:
        number = float(value) if isinstance(value, (int, float, str)) else None
    except (ValueError, OverflowError):
        return None
    return number if number is not None and math.isfinite(number) else None


def _load_step(rs: Any, node_id: str, index: int, c: _Collector, validate_inputs: bool) -> Step | None:
    field = f"steps[{index}]"
    if not isinstance(rs, dict):
        c.add("error", "step is not an object", node=node_id, field=field)
        return None
    code = rs.get("type")
    if code is None and "primitive" in rs:
        code = rs["primitive"]
        c.add("normalisation", "legacy step key 'primitive' -> 'type'", node=node_id, field=f"{field}.primitive")
    if not isinstance(code, str) or not code:
        c.add("error", "step has no primitive code ('type')", node=node_id, field=f"{field}.type")
        return None
    code = code.strip()
    inputs = rs.get("inputs", {})
    if inputs is None:
        inputs = {}
    if not isinstance(inputs, dict):
        c.add("error", "step inputs must be an object", node=node_id, field=f"{field}.inputs")
        return None
    for key in rs:
        if key not in {"type", "primitive", "inputs"} and not is_annotation(key, rs[key]):
            c.add("warning", f"step key {key!r} not understood (ignored)", node=node_id, field=f"{field}.{key}")

    from saasbench.primitives.registry import REGISTRY  # the one registry of primitive codes

    spec = REGISTRY.spec(code)
    if spec is None:  # an error, as tests/test_loader.py pins (a plugin not loaded, or a typo)
        c.add("error", f"unknown primitive code {code!r}", node=node_id, field=f"{field}.type")
        return None
    if validate_inputs and spec.inputs is not None:
        bucket: list[str] = []
        defects: list[tuple[str, str | None]] = []
        token = _notes.set(bucket)
        warn_token = _warnings.set(defects)
        defect: str | None = None
        try:
            model = spec.inputs.model_validate(inputs)
        except ValidationError as exc:
            errors = [
                e for e in exc.errors() if not _has_placeholder(e.get("input"))
            ]  # placeholders: checked at run time
            defect_errors = [e for e in errors if isinstance((e.get("ctx") or {}).get("error"), StepDefect)]
            for err in errors:
                loc = ".".join(str(p) for p in err["loc"])
                where = f"{field}.inputs.{loc}" if loc else f"{field}.inputs"
                if err in defect_errors:
                    message = str(err["ctx"]["error"])
                    defect = f"{defect}; {message}" if defect else message
                    c.add(
                        "warning",
                        f"{code}: {message} (a DAG defect; the node is ERROR at run time and runs no step)",
                        node=node_id,
                        field=where,
                    )
                else:
                    c.add("error", f"{code}: {err['msg']}", node=node_id, field=where)
            model = None
        finally:
            _notes.reset(token)
            _warnings.reset(warn_token)
        for message in bucket:
            c.add("normalisation", f"{code}: {message}", node=node_id, field=f"{field}.inputs")
        for message, at in defects:
            c.add(
                "warning", f"{code}: {message}", node=node_id, field=f"{field}.inputs.{at}" if at else f"{field}.inputs"
            )
        if model is not None:
            for key in model.model_extra or {}:
                if is_annotation(key, inputs.get(key)):
                    continue
                c.add(
                    "warning",
                    f"{code} input {key!r} not understood (ignored)",
                    node=node_id,
                    field=f"{field}.inputs.{key}",
                )
        if defect is not None:
            return Step(type=code, inputs=inputs, defect=defect)
    return Step(type=code, inputs=inputs)


def find_cycle(nodes: list[Node]) -> list[str] | None:
    """Return one prerequisite cycle as ``[a, b, ..., a]``, or None."""
    ids = {n.id for n in nodes}
    graph = {n.id: [p for p in n.prereqs if p in ids] for n in nodes}
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as exc:
        cyc = list(exc.args[1])
        return list(reversed(cyc))
    return None


def execution_order(nodes: list[Node], *, ties: str = "file") -> list[Node]:
    """Stable topological order: Kahn's algorithm, ``run_last`` nodes at the end.

    ``ties="file"`` (default): among ready nodes the one earliest in the file runs first (a heap
    on file position), so adding a node never reorders unrelated ones. ``ties="fifo"``: the
    reference harness's Kahn with a FIFO queue seeded in file order (a node made ready later
    runs after every node already waiting); ``--compat reference`` uses it, because real DAGs
    share state between nodes without declaring a dependency and the outcome then depends on
    this order. Prereqs that name no node are ignored here (the loader reported them).
    ``run_last`` nodes keep their relative order among themselves and still respect
    prerequisites between them.
    """
    if ties not in ("file", "fifo"):
        raise ValueError(f"ties must be 'file' or 'fifo', not {ties!r}")
    position = {n.id: i for i, n in enumerate(nodes)}
    by_id = {n.id: n for n in nodes}

    def kahn(group: list[Node], done: set[str]) -> list[Node]:
        import heapq
        from collections import deque

        members = {n.id for n in group}
        live = {n.id: [p for p in dict.fromkeys(n.prereqs) if p in members and p not in done] for n in group}
        pending = {nid: len(ps) for nid, ps in live.items()}
        dependents: dict[str, list[str]] = {n.id: [] for n in group}
        for n in group:  # in file order, so a FIFO queue receives dependents in file order
            for p in live[n.id]:
                dependents[p].append(n.id)
        out: list[Node] = []
        if ties == "fifo":
            queue = deque(n.id for n in group if pending[n.id] == 0)
            while queue:
                nid = queue.popleft()
                out.append(by_id[nid])
                for d in dependents[nid]:
                    pending[d] -= 1
                    if pending[d] == 0:
                        queue.append(d)
        else:
            ready = [position[i] for i, k in pending.items() if k == 0]
            heapq.heapify(ready)
            while ready:
                nid = nodes[heapq.heappop(ready)].id
                out.append(by_id[nid])
                for d in dependents[nid]:
                    pending[d] -= 1
                    if pending[d] == 0:
                        heapq.heappush(ready, position[d])
        if len(out) != len(group):  # the loader rejects cycles; be explicit if called directly
            raise ValueError("prerequisite cycle among: " + ", ".join(sorted(set(members) - {n.id for n in out})))
        return out

    first = kahn([n for n in nodes if not n.run_last], set())
    # A normal node that depends on a run_last node must wait for it: move such nodes too.
    deferred_ids = {n.id for n in nodes if n.run_last}
    changed = True
    while changed:
        changed = False
        for n in nodes:
            if n.id not in deferred_ids and any(p in deferred_ids for p in n.prereqs):
                deferred_ids.add(n.id)
                changed = True
    if len(deferred_ids) > sum(1 for n in nodes if n.run_last):
        first = kahn([n for n in nodes if n.id not in deferred_ids], set())
    done = {n.id for n in first}
    last = kahn([n for n in nodes if n.id in deferred_ids], done)
    return first + last


# Input keys whose string value names a capture a later step reads as {{name}} (save_as on P04
# and on P07 assertions, capture_as, store_as, capture_stdout_as, save_id); a dict store_as maps names.
_CAPTURE_KEYS = ("save_as", "capture_response_as", "capture_as", "store_as", "capture_stdout_as", "save_id")


def _captures(value: Any) -> set[str]:
    out: set[str] = set()
    if isinstance(value, dict):
        for key, item in value.items():
            if key in _CAPTURE_KEYS and isinstance(item, str):
                out.add(item)
            elif key in _CAPTURE_KEYS and isinstance(item, dict):
                out.update(k for k in item if isinstance(k, str))
            else:
                out |= _captures(item)
    elif isinstance(value, list):
        for item in value:
            out |= _captures(item)
    return out


def _check_shared_state(nodes: list[Node], c: _Collector) -> None:
    """Warn where a node reads another node's state without depending on it (a DAG defect).

    ``{{OTHER.created_id}}`` or a capture only other nodes make (``save_as: tag_create`` ->
    ``{{tag_create.id}}``) resolves only if the writer happened to run first, so the score then
    depends on the execution order (real DAGs do this; ``--compat reference`` reproduces the
    reference harness's order). One warning per (node, name).
    """
    by_id = {n.id: n for n in nodes}
    made_by: dict[str, set[str]] = {}
    for n in nodes:
        for name in _captures([step.inputs for step in n.steps]):
            made_by.setdefault(name, set()).add(n.id)
    ancestors: dict[str, set[str]] = {}

    def up(node_id: str) -> set[str]:
        if node_id not in ancestors:
            ancestors[node_id] = set()  # the loader refused cycles; this only guards recursion
            found: set[str] = set()
            for p in by_id[node_id].prereqs:
                if p in by_id:
                    found |= {p} | up(p)
            ancestors[node_id] = found
        return ancestors[node_id]

    for n in nodes:
        warned: set[str] = set()
        for index, step in enumerate(n.steps):
            for match in MUSTACHE.finditer(json.dumps(step.inputs)):
                name = re.split(r"[.\[]", match.group(1), maxsplit=1)[0]
                if name in warned or name == n.id:
                    continue
                if name in by_id and name not in up(n.id):
                    warned.add(name)
                    c.add(
                        "warning",
                        f"reads {{{{{match.group(1)}}}}} from node {name!r}, which is not among its "
                        "prerequisites: the value exists only if that node ran first (order-dependent)",
                        node=n.id,
                        field=f"steps[{index}].inputs",
                    )
                elif name in made_by and n.id not in made_by[name] and not (made_by[name] & up(n.id)):
                    warned.add(name)
                    writers = ", ".join(sorted(made_by[name]))
                    c.add(
                        "warning",
                        f"reads capture {{{{{name}}}}} made only by {writers}, none of them a prerequisite: "
                        "the value exists only if that node ran first (order-dependent)",
                        node=n.id,
                        field=f"steps[{index}].inputs",
                    )


def _check_totals(meta: dict[str, Any], scoring_config: dict[str, Any], nodes: list[Node], c: _Collector) -> None:
    """Compare advisory totals with node sums; node sums win, disagreements are warnings."""
    total = sum(n.max_score for n in nodes)
    declared_nodes = meta.get("total_nodes")
    if isinstance(declared_nodes, int) and declared_nodes != len(nodes):
        c.add(
            "warning",
            f"meta.total_nodes says {declared_nodes}, the file has {len(nodes)} nodes (node count wins)",
            field="meta.total_nodes",
        )
    for where, container in (("meta", meta), ("scoring_config", scoring_config)):
        for key in ("total_maxScore", "total_max_score"):
            if key in container:
                declared = as_number(container[key])
                if declared is None or abs(declared - total) > 1e-9:
                    c.add(
                        "warning",
                        f"{where}.{key} says {container[key]!r}, nodes sum to {total:g} (node sum wins)",
                        field=f"{where}.{key}",
                    )
    cats = scoring_config.get("categories")
    if isinstance(cats, dict):
        sums: dict[str, float] = {}
        counts: dict[str, int] = {}
        for n in nodes:
            sums[n.scoring.category] = sums.get(n.scoring.category, 0.0) + n.max_score
            counts[n.scoring.category] = counts.get(n.scoring.category, 0) + 1
        for cat, value in cats.items():
            declared = (
                value
                if isinstance(value, (int, float)) and not isinstance(value, bool)
                else (value.get("maxScore") if isinstance(value, dict) else None)
            )
            if isinstance(value, dict) and "maxScore" not in value:
                continue  # weight/description shapes carry no totals to check
            if cat not in sums:
                c.add(
                    "warning", f"scoring_config category {cat!r} has no nodes", field=f"scoring_config.categories.{cat}"
                )
                continue
            if as_number(declared) is not None and abs(as_number(declared) - sums[cat]) > 1e-9:  # type: ignore[operator]
                c.add(
                    "warning",
                    f"scoring_config category {cat!r} maxScore {declared!r} disagrees with node sum {sums[cat]:g}",
                    field=f"scoring_config.categories.{cat}",
                )
            if (
                isinstance(value, dict)
                and isinstance(value.get("node_count"), int)
                and value["node_count"] != counts[cat]
            ):
                c.add(
                    "warning",
                    f"scoring_config category {cat!r} node_count {value['node_count']} disagrees with {counts[cat]} nodes",
                    field=f"scoring_config.categories.{cat}",
                )
        for cat in sums:
            if cat not in cats:
                c.add(
                    "warning",
                    f"category {cat!r} used by nodes is missing from scoring_config.categories",
                    field="scoring_config.categories",
                )
