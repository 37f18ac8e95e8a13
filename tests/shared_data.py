"""Where the project's shared folder (benchmark data, not ours) is: beside the checkout.

CI clones the repository into another folder with a copy of shared/ beside it, so the path is
found relative to this file; SAASBENCH_CONFORMANCE overrides it.
"""

from __future__ import annotations

import os
from pathlib import Path

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
