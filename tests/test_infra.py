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


def test_deployments_carry_no_environment_specific_values():
    """Configuration belongs to the worker: a `{{ $VAR }}` in a deployment is resolved by `prefect
    deploy` on the deploying machine and pinned into every run; only the pull step (resolved by the
    worker at run time) may use one."""
    data = load(PREFECT_YAML)
    for d in data["deployments"]:
        assert "env" not in (d["work_pool"].get("job_variables") or {}), d["name"]
        assert "{{" not in yaml.safe_dump({k: v for k, v in d.items() if k != "pull"}), d["name"]
        spec = (d.get("parameters") or {}).get("spec")
        assert not isinstance(spec, dict) or "lake" not in spec, d["name"]


def test_prefect_yaml_example_files_exist():
    """Every spec file the comments of prefect.yaml run exists in the checkout and is a valid sweep spec."""
    from saasbench.runs.sweep import SweepSpec

    named = set(re.findall(r"spec=([\w./-]+\.ya?ml)", PREFECT_YAML.read_text(encoding="utf-8")))
    assert named, "prefect.yaml names no example spec file"
    for rel in named:
        path = REPO / rel
        assert path.is_file(), rel
        assert SweepSpec.load(path).lake is None  # the example leaves the lake to the worker


LOOPBACK = re.compile(r"\b(127\.\d+\.\d+\.\d+|localhost|0\.0\.0\.0)\b|\[::1\]")


def test_compose_workers_get_service_names_not_host_paths_or_loopback():
    """A container worker's configuration names compose services and container paths: no loopback
    endpoint (inside the container that is the container itself), no host path except as the source
    of a volume; the worker is exec'ed so one `docker stop` SIGTERM reaches it."""
    compose = load(COMPOSE)
    svcs = compose["services"]
    worker = svcs["worker"]
    env = worker["environment"]
    mounts = [v.split(":") for v in worker.get("volumes", [])]
    targets = {m[1] for m in mounts}
    for name, value in env.items():
        value = str(value)
        assert not LOOPBACK.search(value), f"worker {name}={value} is a loopback address"
        path = value.removeprefix("unix://").removeprefix("file://")
        if path.startswith("/"):  # a path must be inside the container: a mount target (or below one)
            assert any(path == t or path.startswith(t.rstrip("/") + "/") for t in targets), f"{name}={value}"
    assert env["SAASBENCH_LAKE"].startswith("s3://")
    for var in ("SAASBENCH_S3_ENDPOINT", "PREFECT_API_URL"):
        host = re.match(r"https?://([^:/]+)", env[var]).group(1)
        assert host in svcs, f"worker {var} names {host}, not a compose service"
    assert worker["working_dir"] in targets
    assert all(v.strip() for v in map(str, env.values())), "an empty worker setting is an error at run time"
    assert re.search(r"&&\s*exec prefect worker start\b", command_text(worker))


def test_infra_readme_links_stay_in_the_repository():
    text = (REPO / "infra" / "README.md").read_text(encoding="utf-8")
    assert "/work/" not in text
    for target in re.findall(r"\]\(([^)#]+)", text):
        if "://" in target:
            continue
        path = (REPO / "infra" / target).resolve()
        assert path.is_relative_to(REPO) and path.exists(), target
