"""infra/compose.yaml and infra/prefect.yaml: structure, cross-file consistency, `docker-compose config`.

The compose stack's images come from Docker Hub, which is unreachable here, so the stack itself is
not started by any test; what is checked is that the file is valid for Docker Compose (Debian's
docker-compose 1.29, installed by scripts/test.sh) and consistent with prefect.yaml and the code.
The Prefect deployments of prefect.yaml are exercised for real by tests/test_prefect_server.py.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
COMPOSE = REPO / "infra" / "compose.yaml"
PREFECT_YAML = REPO / "infra" / "prefect.yaml"


def load(path: Path) -> dict:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def command_text(svc: dict) -> str:
    cmd = svc.get("command", "")
    return " ".join(cmd) if isinstance(cmd, list) else str(cmd)


def test_prefect_yaml_deployments():
    import prefect

    data = load(PREFECT_YAML)
    assert data["prefect-version"] == prefect.__version__
    deps = {d["name"]: d for d in data["deployments"]}
    assert set(deps) == {"sweep", "trial", "aggregate"}
    pools = {d["work_pool"]["name"] for d in deps.values()}
    assert pools == {"saasbench"}
    for d in deps.values():  # every entrypoint names a flow function of the file
        path, func = d["entrypoint"].split(":")
        assert re.search(rf"^def {func}\(", (REPO / path).read_text(), re.MULTILINE), d["entrypoint"]
    nightly = deps["sweep"]["schedules"][0]
    assert nightly["cron"] and nightly["active"] is False and nightly["parameters"] == {"dispatch": "deployment"}
    from saasbench.runs.sweep import SweepSpec

    SweepSpec.model_validate(deps["sweep"]["parameters"]["spec"])  # the default spec is a valid SweepSpec
    assert data["pull"] == [{"prefect.deployments.steps.set_working_directory": {"directory": "{{ $SAASBENCH_REPO }}"}}]


def test_compose_stack_structure_and_consistency():
    compose = load(COMPOSE)
    prefect_yaml = load(PREFECT_YAML)
    svcs = compose["services"]
    assert {"postgres", "prefect-server", "s3", "s3-init", "worker"} <= set(svcs)

    # the Prefect server runs on the postgres service, with its credentials and database
    pg_env = svcs["postgres"]["environment"]
    assert svcs["postgres"]["image"].startswith("postgres:")
    server = svcs["prefect-server"]
    url = server["environment"]["PREFECT_SERVER_DATABASE_CONNECTION_URL"]
    assert url == (
        f"postgresql+asyncpg://{pg_env['POSTGRES_USER']}:{pg_env['POSTGRES_PASSWORD']}@postgres:5432/"
        f"{pg_env['POSTGRES_DB']}"
    )
    assert server["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert server["image"].endswith(f":{prefect_yaml['prefect-version']}-python3.11")
    port = re.search(r"--port (\d+)", command_text(server)).group(1)
    assert server["environment"]["PREFECT_SERVER_ANALYTICS_ENABLED"] == "false"

    # the S3-compatible store: the bucket s3-init creates is the worker's lake, on the store's port
    s3_port = command_text(svcs["s3"]).split("-p")[-1].split()[0]
    bucket = re.search(
        r"s3 mb s3://([a-z0-9.-]+)", command_text(svcs["s3-init"]) + " ".join(svcs["s3-init"]["entrypoint"])
    ).group(1)
    worker = svcs["worker"]
    wenv = worker["environment"]
    assert wenv["SAASBENCH_S3_ENDPOINT"] == f"http://s3:{s3_port}"
    assert wenv["SAASBENCH_LAKE"].startswith(f"s3://{bucket}/")
    assert wenv["AWS_ACCESS_KEY_ID"] == svcs["s3-init"]["environment"]["AWS_ACCESS_KEY_ID"]

    # the worker talks to the server and polls the pool every deployment of prefect.yaml uses
    assert wenv["PREFECT_API_URL"] == f"http://prefect-server:{port}/api"
    pools = {d["work_pool"]["name"] for d in prefect_yaml["deployments"]}
    assert len(pools) == 1
    pool = pools.pop()
    cmd = command_text(worker)
    assert f"prefect work-pool create {pool} --type process" in cmd
    assert re.search(rf"prefect worker start --pool {pool} --type process\b", cmd)
    assert worker["image"] == server["image"]
    assert worker["depends_on"]["prefect-server"]["condition"] == "service_healthy"
    # the checkout the pull step (set_working_directory $SAASBENCH_REPO) expects is mounted there
    assert wenv["SAASBENCH_REPO"] == worker["working_dir"] == "/repo"
    assert "..:/repo" in worker["volumes"] and "pip install -q -e /repo" in cmd
    # every scaled worker shares one Docker host, so they share one environment limit
    assert wenv["SAASBENCH_HOST_NAME"] and "SAASBENCH_ENVS_PER_HOST" in wenv


def test_docker_compose_config_validates():
    exe = shutil.which("docker-compose")
    assert exe, "docker-compose is missing: scripts/test.sh installs Debian's docker-compose"
    res = subprocess.run(
        [exe, "-p", "saasbench", "-f", str(COMPOSE), "config"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "HOME": "/tmp"},
    )
    assert res.returncode == 0, res.stderr
    resolved = yaml.safe_load(res.stdout)
    assert set(resolved["services"]) == set(load(COMPOSE)["services"])
    # the ${SAASBENCH_ENVS_PER_HOST:-4} default is interpolated by Compose
    assert resolved["services"]["worker"]["environment"]["SAASBENCH_ENVS_PER_HOST"] == "4"


def test_docker_compose_config_rejects_a_broken_file(tmp_path):
    """The validation above can fail: a dangling depends_on is reported."""
    broken = load(COMPOSE)
    broken["services"]["worker"]["depends_on"] = {"no-such-service": {"condition": "service_started"}}
    path = tmp_path / "compose.yaml"
    path.write_text(yaml.safe_dump(broken))
    res = subprocess.run(
        [shutil.which("docker-compose") or "docker-compose", "-p", "saasbench", "-f", str(path), "config"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "HOME": "/tmp"},
    )
    assert res.returncode != 0 and "no-such-service" in res.stderr
