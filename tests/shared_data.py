"""Where the project's shared folder (benchmark data, not ours) is: beside the checkout; and the
one-trial sweep spec the lifecycle tests share.

CI clones the repository into another folder with a copy of shared/ beside it, so the path is
found relative to this file; SAASBENCH_CONFORMANCE overrides it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

_CANDIDATES = [
    Path(os.environ["SAASBENCH_CONFORMANCE"]) if os.environ.get("SAASBENCH_CONFORMANCE") else None,
    Path(__file__).resolve().parents[2] / "shared" / "conformance" / "saasbench",
    Path("/work/shared/conformance/saasbench"),
]
CONFORMANCE_DIR = next((p for p in _CANDIDATES if p is not None and p.is_dir()), _CANDIDATES[1])
# The 15 public task folders (a copy of shared/conformance/public-tasks in tests/data, see its README.md):
# task_mjobbzsi ships the only public dag_smoke.json saved there.
PUBLIC_TASKS_DIR = Path(__file__).resolve().parent / "data" / "public-tasks"
PUBLIC_TASK_IDS = sorted(p.name for p in PUBLIC_TASKS_DIR.glob("task_*") if p.is_dir())
MJOBBZSI_SMOKE_DAG = PUBLIC_TASKS_DIR / "task_mjobbzsi" / "check" / "task_mjobbzsi_e" / "evaluate" / "dag_smoke.json"


def oracle_sweep_spec(tmp_path: Path, sweep_id: str, **kw: Any) -> Any:
    """A one-trial sweep of the oracle on the demo task (lake and reports under ``tmp_path``, no retry
    delay): the trial whose stages, end state and rescore the lifecycle tests exercise."""
    from saasbench.runs.sweep import SweepSpec

    data = {
        "sweep_id": sweep_id,
        "tasks": ["timetrack"],
        "agents": ["oracle"],
        "lake": str(tmp_path / "lake"),
        "report_dir": str(tmp_path / "reports"),
        "retry_delays": [0],
        **kw,
    }
    return SweepSpec.model_validate(data)


def sigint_default() -> None:
    """``preexec_fn`` of a child a test sends SIGINT (Ctrl-C): a shell running the suite in the background
    starts it with SIGINT ignored, and a Python started that way never raises KeyboardInterrupt."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)
