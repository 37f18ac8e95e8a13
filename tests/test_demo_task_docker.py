"""The demo task end to end in the Docker backend: the oracle scores like on the local backend."""

from __future__ import annotations

from saasbench.catalog.tasks import load_task
from saasbench.runs.trial import run_local_trial


def test_timetrack_oracle_in_docker_scores_like_local(docker_client, python_image):  # noqa: F811
    task = load_task("timetrack")
    docker = run_local_trial(task, "oracle", backend="docker", docker_client=docker_client)
    local = run_local_trial(task, "oracle", backend="local")
    assert docker.app_ok, docker.app_error
    statuses = lambda r: {n.id: n.status.value for n in r.report.nodes}  # noqa: E731
    assert statuses(docker) == statuses(local)
    assert docker.report.summary.deterministic_score == local.report.summary.deterministic_score == 100.0
    # P12 ran inside the container, not on the host
    exec_node = next(n for n in docker.report.nodes if n.id == "DEPLOY_EXEC_SQLITE")
    assert exec_node.status.value == "PASSED"
