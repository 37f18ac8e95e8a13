"""Build-env stage: the task's environment image, built once per content key (Docker backend).

A build failure is an :class:`saasbench.failures.EnvError`, retried with backoff. ``build_env_flow``
builds one task's image on its own (e.g. to warm a worker's cache).
"""

from __future__ import annotations

from prefect import flow

from saasbench.flows.stage import stage_task
from saasbench.runs import stages

build_env_stage = stage_task("build_env", stages.build_env)


@flow(name="build-env", flow_run_name="build-env {task_id}")
def build_env_flow(task_id: str, backend: str = "docker") -> dict:
    import tempfile

    from saasbench.lake.store import LocalStore
    from saasbench.runs.sweep import SweepSpec, TrialSpec

    spec = SweepSpec(sweep_id="build-env", tasks=[task_id], agents=["nop"], backend=backend)
    with tempfile.TemporaryDirectory() as scratch:  # no checkpoint worth keeping: the image cache is the result
        run = stages.TrialRun(
            trial=TrialSpec(task=task_id, agent="nop", model=None, attempt=0), spec=spec, store=LocalStore(scratch)
        )
        return build_env_stage.with_options(retries=2, retry_delay_seconds=[10, 60])(run)
