"""A webhook sent from inside the app container reaches the run's receiver (P27 on Docker)."""

from __future__ import annotations

from saasbench.catalog.envspec import EnvSpec, ServiceSpec
from saasbench.dag import load_dag_data
from saasbench.environments.docker import DockerEnvironment
from saasbench.evaluation.context import RunContext, Target
from saasbench.evaluation.engine import Engine


def _dag(body: str) -> object:
    step = {
        "type": "P27",
        "inputs": {
            "trigger": {
                "type": "exec",
                "command": f"wget -q -O- --header 'Content-Type: application/json' "
                f"--post-data '{body}' {{{{webhook_url}}}} || true",
            },
            "expect_delivery": {"body_contains": {"event": "invoice.created"}, "timeout_ms": 10000},
        },
    }
    node = {"id": "HOOK", "steps": [step], "scoring": {"category": "Webhook", "method": "binary", "maxScore": 2}}
    return load_dag_data({"nodes": [node]}).dag


def test_webhook_from_the_app_container_reaches_the_receiver(docker_client, busybox_image, tmp_path):  # noqa: F811
    spec = EnvSpec(services={"app": ServiceSpec(image=busybox_image, command="sleep 600")})
    with DockerEnvironment(spec=spec, client=docker_client, workspace_root=tmp_path / "ws") as env:
        assert env.gateway_ip
        ok = Engine(_dag('{"event": "invoice.created"}'), RunContext(Target(environment=env))).run()
        wrong = Engine(_dag('{"event": "other"}'), RunContext(Target(environment=env))).run()
    assert ok.nodes[0].status.value == "PASSED", ok.nodes[0].message
    assert wrong.nodes[0].status.value == "FAILED"
