"""Every input key the real (conformance) DAGs use is understood by the primitive's input model.

The saved DAGs are the ground truth of what the public SaaSBench data contains. For each of
them: the loader accepts the file with zero errors; every (primitive code, input key) pair is
a declared field or normalised by a validator (never left in ``model_extra``, never a loader
warning "not understood"); and no HTTP/assertion step fails its input model.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from shared_data import CONFORMANCE_DIR as CONFORMANCE  # noqa: E402

from saasbench.dag import _notes, _warnings, load_dag
from saasbench.primitives.registry import REGISTRY

DAG_FILES = sorted(CONFORMANCE.glob("*/dag.json"))
CHECKED_CODES = (
    "P01",
    "P02",
    "P03",
    "P04",
    "P05",
    "P06",
    "P07",
    "P13",
    "P14",
    "P15",
    "P16",
    "P22",
    "P23",
    "P26",
    "P29",
)
MUST_VALIDATE = ("P04", "P05", "P06", "P07", "P14", "P15", "P22", "P23", "P29")


def test_conformance_dags_are_present() -> None:
    assert len(DAG_FILES) == 5, f"expected the five conformance DAGs under {CONFORMANCE} (set SAASBENCH_CONFORMANCE)"


def _steps(path: Path) -> list[tuple[str, str, dict[str, Any]]]:
    """(node id, code, raw inputs) for every step, read straight from the JSON (no loader)."""
    raw = json.loads(path.read_text(encoding="utf-8-sig"))
    nodes = raw["nodes"] if isinstance(raw, dict) else raw
    out = []
    for node in nodes:
        for step in node.get("steps") or node.get("primitive_chain") or []:
            out.append((node["id"], step.get("type") or step.get("primitive"), step.get("inputs") or {}))
    return out


def _usage() -> dict[tuple[str, str], list[tuple[str, str, dict[str, Any]]]]:
    """(code, key) -> every (task, node, inputs) that uses it."""
    usage: dict[tuple[str, str], list[tuple[str, str, dict[str, Any]]]] = defaultdict(list)
    for path in DAG_FILES:
        for node_id, code, inputs in _steps(path):
            for key in inputs:
                usage[(code, key)].append((path.parent.name, node_id, inputs))
    return usage


USAGE = _usage() if DAG_FILES else {}
PAIRS = sorted(pair for pair in USAGE if pair[0] in CHECKED_CODES)


def _validate(code: str, inputs: dict[str, Any]) -> tuple[Any, list[str]]:
    """Validate raw inputs as the loader does; returns (model, normalisation notes + defect warnings)."""
    spec = REGISTRY.spec(code)
    assert spec is not None
    bucket: list[str] = []
    defects: list[tuple[str, str | None]] = []
    token = _notes.set(bucket)
    warn_token = _warnings.set(defects)
    try:
        model = spec.inputs.model_validate(inputs)
        return model, bucket + [f"warning: {message}" for message, _ in defects]
    finally:
        _notes.reset(token)
        _warnings.reset(warn_token)


@pytest.mark.parametrize("path", DAG_FILES, ids=lambda p: p.parent.name)
def test_dag_loads_without_errors_or_unknown_input_keys(path: Path) -> None:
    result = load_dag(path)  # raises DagLoadError listing every error
    assert result.dag.nodes
    bad = [
        str(i)
        for i in result.issues
        if i.kind == "warning" and " input " in i.message and any(i.message.startswith(c + " ") for c in CHECKED_CODES)
    ]
    assert not bad, "\n".join(bad)
    not_understood = [str(i) for i in result.issues if "not understood" in i.message and i.kind == "normalisation"]
    assert not not_understood, "\n".join(not_understood)


def test_every_pair_is_enumerated() -> None:
    codes = {code for code, _ in PAIRS}
    assert {"P04", "P05", "P06", "P07", "P13", "P14", "P15"} <= codes
    assert ("P07", "assertion") in PAIRS and ("P05", "update_to_base") in PAIRS and ("P14", "action") in PAIRS


@pytest.mark.parametrize("code, key", PAIRS, ids=[f"{c}.{k}" for c, k in PAIRS])
def test_input_key_is_understood(code: str, key: str) -> None:
    spec = REGISTRY.spec(code)
    assert spec is not None
    assert spec.inputs is not None, f"{code} has no input model"
    for task, node_id, inputs in USAGE[(code, key)]:
        try:
            model, notes = _validate(code, inputs)
        except Exception as exc:  # placeholder-only failures are re-checked at run time
            if code in MUST_VALIDATE:
                raise AssertionError(f"{task} {node_id}: {code} inputs rejected: {exc}") from exc
            continue
        extra = set(model.model_extra or {})
        assert key not in extra, f"{task} {node_id}: {code} input {key!r} left in model_extra"
        assert not [n for n in notes if "not understood" in n], f"{task} {node_id}: {notes}"


@pytest.mark.parametrize("code", MUST_VALIDATE)
def test_no_http_or_assertion_step_fails_validation(code: str) -> None:
    failures = []
    count = 0
    for path in DAG_FILES:
        for node_id, step_code, inputs in _steps(path):
            if step_code != code:
                continue
            count += 1
            try:
                _validate(code, inputs)
            except Exception as exc:  # noqa: BLE001 - the test records every failure and asserts on the list
                failures.append(f"{path.parent.name} {node_id}: {exc}")
    assert count, f"no {code} step in the conformance DAGs"
    assert not failures, "\n".join(failures)


def test_every_p07_assertion_is_canonical() -> None:
    """Each P07 assertion in the data normalises to a known operator (no key silently ignored)."""
    ops: set[str] = set()
    for path in DAG_FILES:
        for node_id, code, inputs in _steps(path):
            if code != "P07":
                continue
            model, notes = _validate(code, inputs)
            assert not [n for n in notes if "not understood" in n], f"{path.parent.name} {node_id}: {notes}"
            for a in model.assertions:
                assert not (a.model_extra or {}), f"{path.parent.name} {node_id}: {a.model_extra}"
                ops.add(a.op)
    assert {
        "equals",
        "exists",
        "not_empty",
        "contains",
        "gt",
        "in",
        "matches_regex",
        "jwt_decode",
        "is_array",
        "is_null",
        "not_null",
        "contains_text",
        "not_contains_id",
        "not_exists",
    } <= ops
