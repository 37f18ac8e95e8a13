"""Build-env stage: the task's environment image, built once per content key (Docker backend).

A build failure is an :class:`saasbench.failures.EnvError`, retried with backoff.
"""

from __future__ import annotations

from prefect import flow, task

from saasbench.failures import EnvError, TaskDefect, is_retryable


def _retry(task_obj, task_run, state) -> bool:
    try:
        state.result()
    except Exception as exc:  # noqa: BLE001
        return is_retryable(exc)
    return False


@task(name="build-env", retries=2, retry_delay_seconds=[10, 60], retry_condition_fn=_retry)
def build_env_task(task_id: str) -> str:
    import docker

    from saasbench.catalog.tasks import load_task
    from saasbench.environments.imagecache import BuildError, ImageCache

    try:
        t = load_task(task_id)
    except Exception as exc:
        raise TaskDefect(f"cannot load task {task_id!r}: {exc}") from exc
    try:
        ref = ImageCache(docker.from_env()).ensure(t.environment_dir)
    except (BuildError, docker.errors.DockerException) as exc:
        raise EnvError(f"image build for {task_id} failed: {exc}") from exc
    return str(getattr(ref, "tag", ref))


@flow(name="build-env", flow_run_name="build-env {task_id}")
def build_env_flow(task_id: str) -> str:
    return build_env_task(task_id)
