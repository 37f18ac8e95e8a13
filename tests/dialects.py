"""Helpers the loader-dialect tests share: one-node DAGs, their issues, and running one step as the engine does."""

from __future__ import annotations

from typing import Any

from saasbench.dag import DagLoadError, LoadResult, load_dag_data
from saasbench.evaluation.context import RunContext
from saasbench.evaluation.results import StepResult
from saasbench.primitives.registry import REGISTRY


def load(*steps: dict[str, Any], **node: Any) -> LoadResult:
    """One node with these steps (and node fields); raises DagLoadError on errors."""
    return load_dag_data(
        {"nodes": [{"id": "N", "steps": list(steps), "scoring": {"method": "binary", "maxScore": 1}, **node}]}
    )


def issues(code: str, inputs: dict[str, Any]) -> list[tuple[str, str | None, str]]:
    """(kind, field, message) of every issue loading one step of ``code`` with ``inputs``."""
    try:
        found = load({"type": code, "inputs": inputs}).issues
    except DagLoadError as exc:
        found = exc.issues
    return [(i.kind, i.field, i.message) for i in found]


def kinds(code: str, inputs: dict[str, Any], kind: str) -> list[str]:
    return [f"{field}: {message}" for k, field, message in issues(code, inputs) if k == kind]


def clean(code: str, inputs: dict[str, Any], *fragments: str) -> str:
    """Loads with no error and no warning; every fragment is among the normalisations, which are returned."""
    assert not kinds(code, inputs, "error"), kinds(code, inputs, "error")
    assert not kinds(code, inputs, "warning"), kinds(code, inputs, "warning")
    notes = "\n".join(kinds(code, inputs, "normalisation"))
    for fragment in fragments:
        assert fragment in notes, (fragment, notes)
    return notes


def run(ctx: RunContext, code: str, raw: dict[str, Any]) -> StepResult:
    """Run one step the way the engine does: resolve (except raw fields), validate, call."""
    spec = REGISTRY.spec(code)
    assert spec is not None and spec.fn is not None and spec.inputs is not None
    resolved = {k: (v if k in spec.raw_fields else ctx.resolve(v)) for k, v in raw.items()}
    return spec.fn(spec.inputs.model_validate(resolved), ctx)
