"""The TimeTrack task (tasks/timetrack): its DAG scores the reference implementation fully and
each broken variant loses exactly the nodes variants/README.md names.

The reference is copied into a temporary workspace, started with ``bash run.sh`` on a free port
with ``DATABASE_PATH`` inside that workspace, and scored with the engine. Nodes whose primitives
are not implemented yet in this build (``REGISTRY.spec(code).fn is None``) may end in ERROR; the
set is computed at run time, so the test tightens by itself when they land. P12 (exec) also needs
an environment backend on the target: the local backend (``saasbench.environments.local.LocalEnvironment``
over the same workspace) when this build has it; without one, P12 nodes are exempt too.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from saasbench.dag import load_dag
from saasbench.evaluation.context import RunContext, RunOptions, Target
from saasbench.evaluation.engine import Engine
from saasbench.primitives.registry import REGISTRY
from saasbench.services.auth import load_auth_profile

TASK = Path(__file__).resolve().parents[1] / "tasks" / "timetrack"
DAG_PATH = TASK / "dag.json"
VARIANTS = ("no_role_checks", "wrong_page_size", "no_timer_conflict")
HEALTH_DEADLINE_S = 30.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(base_url: str, proc: subprocess.Popen, deadline_s: float = HEALTH_DEADLINE_S) -> None:
    deadline = time.monotonic() + deadline_s
    last = "no answer"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"run.sh exited with {proc.returncode} before the service was healthy")
        try:
            with urllib.request.urlopen(base_url + "/api/health", timeout=2) as resp:
                if resp.status == 200:
                    return
                last = f"status {resp.status}"
        except (urllib.error.URLError, OSError) as exc:
            last = str(exc)
        time.sleep(0.05)  # polling interval, not an assertion
    raise RuntimeError(f"the service was not healthy within {deadline_s}s: {last}")


def make_workspace(tmp: Path, variant: str | None) -> Path:
    workspace = tmp / "workspace"
    shutil.copytree(TASK / "reference", workspace, ignore=shutil.ignore_patterns("data", "__pycache__"))
    if variant is not None:
        patch = TASK / "variants" / f"{variant}.patch"
        subprocess.run(
            ["patch", "-p1", "--batch", "--forward", "-i", str(patch)],
            cwd=workspace,
            check=True,
            capture_output=True,
            timeout=30,
        )
    return workspace


def exec_backend(workspace: Path):
    """A started local environment over ``workspace`` for P12, or None when this build has none."""
    try:
        from saasbench.environments.local import LocalEnvironment
    except ImportError:
        return None
    env = LocalEnvironment(workspace_root=workspace)
    env.start()
    return env


def verdict(result) -> str:
    """The node's status; a PASSED node below its maxScore (a partial weighted chain) is PARTIAL."""
    status = result.status.value if hasattr(result.status, "value") else str(result.status)
    if status == "PASSED" and result.score < result.max_score:
        return "PARTIAL"
    return status


def evaluate(tmp: Path, variant: str | None = None) -> dict[str, str]:
    """Start the (patched) reference, score it with the DAG; node id -> status (or PARTIAL)."""
    workspace = make_workspace(tmp, variant)
    port = free_port()
    db_path = workspace / "data" / "timetrack.db"
    env = {**os.environ, "PORT": str(port), "DATABASE_PATH": str(db_path)}
    with open(tmp / "service.log", "wb") as log:
        proc = subprocess.Popen(["bash", "run.sh"], cwd=workspace, env=env, stdout=log, stderr=subprocess.STDOUT)
        backend = None
        try:
            backend = exec_backend(workspace)
            base_url = f"http://127.0.0.1:{port}"
            wait_healthy(base_url, proc)
            dag = load_dag(DAG_PATH).dag
            target = Target(
                base_url=base_url,
                workspace=workspace,
                db_dsn=f"sqlite:///{db_path}",
                environment=backend,
                task_id="timetrack",
            )
            profile = load_auth_profile(TASK / "task.yaml")
            ctx = RunContext(
                target, options=RunOptions(node_timeout_s=60), auth_profile=profile, env_defaults=dag.env_defaults
            )
            try:
                report = Engine(dag, ctx).run()
            finally:
                ctx.close()
            return {r.id: verdict(r) for r in report.nodes}
        finally:
            if backend is not None:
                backend.stop()  # a given workspace_root is kept; only its own exec processes end
            proc.kill()  # run.sh execs python3, so this PID is the service itself
            proc.wait(timeout=10)


def unavailable_codes() -> set[str]:
    codes = {s.code for s in REGISTRY.all() if s.fn is None}
    try:
        import saasbench.environments.local  # noqa: F401  (the local backend P12 runs on)
    except ImportError:
        codes.add("P12")
    return codes


def deterministic_nodes() -> dict[str, object]:
    """Node id -> node, for the nodes this build can run to a verdict (not llm-judge, all primitives present)."""
    missing = unavailable_codes()
    dag = load_dag(DAG_PATH).dag
    return {n.id: n for n in dag.nodes if n.method != "llm-judge" and not {s.type for s in n.steps} & missing}


def expected_losses(variant: str) -> set[str]:
    """The node ids variants/README.md lists under '## <variant>' (lines '- NODE_ID ...')."""
    text = (TASK / "variants" / "README.md").read_text(encoding="utf-8")
    section = re.search(rf"^## {re.escape(variant)}\s*$(.*?)(?=^## |\Z)", text, re.MULTILINE | re.DOTALL)
    assert section, f"variants/README.md has no section for {variant}"
    return set(re.findall(r"^- `?([A-Z][A-Z0-9_]+)`?", section.group(1), re.MULTILINE))


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory) -> dict[str, str]:
    return evaluate(tmp_path_factory.mktemp("timetrack-reference"))


def test_task_files_exist() -> None:
    for name in (
        "task.md",
        "task.yaml",
        "knowledge_base.json",
        "dag.json",
        "reference/run.sh",
        "reference/app.py",
        "reference/README.md",
        "variants/README.md",
        *(f"variants/{v}.patch" for v in VARIANTS),
    ):
        assert (TASK / name).is_file(), name


def test_knowledge_base_shape() -> None:
    kb = json.loads((TASK / "knowledge_base.json").read_text(encoding="utf-8"))
    entries = kb["entries"] if isinstance(kb, dict) else kb
    assert len(entries) >= 20
    ids = [e["id"] for e in entries]
    assert len(set(ids)) == len(ids)
    for e in entries:
        assert set(e) >= {"id", "question", "answer", "source_reference", "confidence"}
        assert re.fullmatch(r"KB-\d{3}", e["id"]) and 0 <= e["confidence"] <= 1
    dag = load_dag(DAG_PATH).dag
    for node in dag.nodes:
        for ref in node.kb_refs or []:
            assert ref in ids, f"{node.id} cites unknown {ref}"


def test_dag_loads_clean_and_covers_backbones() -> None:
    result = load_dag(DAG_PATH)
    assert not result.warnings, [str(w) for w in result.warnings]
    nodes = result.dag.nodes
    assert len(nodes) >= 60
    assert {n.method for n in nodes} == {"binary", "weighted", "llm-judge"}
    categories = {n.scoring.category for n in nodes}
    assert {
        "Deployment",
        "DataModel",
        "API_CRUD",
        "Validation",
        "BusinessLogic",
        "Workflow",
        "Authentication",
        "RBAC",
        "EdgeCases",
        "ArchitectureQuality",
    } <= categories


def test_reference_passes_every_runnable_node(reference_run: dict[str, str]) -> None:
    runnable = deterministic_nodes()
    bad = {nid: st for nid, st in reference_run.items() if nid in runnable and st != "PASSED"}
    assert not bad, bad
    for nid, st in reference_run.items():
        if nid not in runnable:
            assert st in ("ERROR", "SKIPPED_LLM", "PASSED"), (nid, st)


@pytest.mark.parametrize("variant", VARIANTS)
def test_variant_loses_exactly_the_named_nodes(variant: str, reference_run: dict[str, str], tmp_path: Path) -> None:
    runnable = deterministic_nodes()
    named = expected_losses(variant)
    assert named, f"variants/README.md names no node for {variant}"
    unknown = named - set(reference_run)
    assert not unknown, f"README names unknown nodes {sorted(unknown)}"
    result = evaluate(tmp_path, variant)
    lost = {nid for nid in runnable if result.get(nid) != "PASSED"}
    expected = named & set(runnable)
    assert expected, f"none of the nodes {variant} must lose can run in this build"
    assert lost == expected, {
        "unexpectedly lost": sorted(lost - expected),
        "unexpectedly kept": sorted(expected - lost),
    }
