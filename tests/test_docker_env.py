"""The Docker backend: conformance, multi-service stacks, health failures, isolation, prune, image cache.

Needs ``dockerd`` (Debian ``docker.io``) and ``busybox`` (``busybox-static``); the session starts a
private engine (see ``tests/dockerd.py``) unless ``/var/run/docker.sock`` answers.
"""

from __future__ import annotations

import datetime as dt
import multiprocessing
import os
import signal
import socket
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest
from shared_data import sigint_default

from saasbench.catalog.envspec import EnvSpec, ServiceSpec, SpecError, import_compose
from saasbench.environments.base import ServiceError, self_check, self_check_backend
from saasbench.environments.docker import (
    L_CREATED,
    L_HOST,
    L_PID,
    L_TASK,
    L_TRIAL,
    DockerEnvironment,
    list_trials,
    prune,
)
from saasbench.environments.imagecache import BuildError, ImageCache


def leftovers(client, trial: str) -> list[str]:
    flt = {"label": f"{L_TRIAL}={trial}"}
    return (
        [f"container {c.name}" for c in client.containers.list(all=True, filters=flt)]
        + [f"network {n.name}" for n in client.networks.list(filters=flt)]
        + [f"volume {v.name}" for v in client.volumes.list(filters=flt)]
    )


# --- conformance --------------------------------------------------------------------------------------
def test_self_check(docker_client, python_image):
    env = DockerEnvironment(
        spec=EnvSpec(services={"app": ServiceSpec(image=python_image)}), client=docker_client, health_deadline_s=30
    )
    with env:
        assert env.workspace_path == "/app"
        assert self_check(env) == []
        # the interface's answers for a container backend (the gateway, the receivers, the prompt, the CLI)
        assert not env.runs_on_host and env.trial_id and env.state_dir is None
        assert env.gateway_ip and env.receiver_bind_host == env.receiver_advertise_host == env.gateway_ip
        assert "PATH" in env.base_env() and env.workspace_dir == env._ws
        # a command's background children die with it (the local backend's rule)
        r = env.exec("sleep 300 & echo started", timeout_s=10)
        assert r.ok and r.stdout == "started\n"
        ps = env.exec("for d in /proc/[0-9]*; do cat $d/cmdline 2>/dev/null | tr '\\0' ' '; echo; done", timeout_s=10)
        assert "sleep 300" not in ps.stdout
        # files written on the host side are visible in the container and the other way round
        env.write_file("/app/abs.txt", "abs")
        assert env.exec("cat abs.txt", timeout_s=10).stdout == "abs"
        trial = env.trial_id
        assert {c.labels[L_TASK] for c in docker_client.containers.list(filters={"label": f"{L_TRIAL}={trial}"})} == {
            "adhoc"
        }
    assert leftovers(docker_client, trial) == []
    assert not env._ws.exists()


def test_backend_conformance_from_creation_to_teardown(docker_client, python_image):
    """self_check_backend: lifecycle (start, stop, use after stop) around self_check, on two fresh environments."""
    made: list[DockerEnvironment] = []

    def make() -> DockerEnvironment:
        env = DockerEnvironment(
            spec=EnvSpec(services={"app": ServiceSpec(image=python_image)}), client=docker_client, health_deadline_s=30
        )
        made.append(env)
        return env

    assert self_check_backend(make) == []
    assert len(made) == 2 and all(leftovers(docker_client, e.trial_id) == [] for e in made)


# --- compose import ------------------------------------------------------------------------------------
STACK = """
version: "3.8"
name: demo
services:
  web:
    image: ${BUSYBOX}
    container_name: demo-web
    restart: unless-stopped
    command: ["sh", "-c", "mkdir -p /www && cat /data/seed.txt > /www/index.html && echo web-up && exec httpd -f -p 80 -h /www"]
    ports: ["${WEB_PORT:-8080}:80"]
    volumes:
      - webdata:/data
      - ./seed.txt:/data/seed.txt:ro
    healthcheck:
      test: ["CMD-SHELL", "wget -qO- http://127.0.0.1/index.html"]
      interval: 1s
      timeout: 5s
      retries: 30
    networks: [default]
  app:
    image: ${BUSYBOX}
    env_file: .env
    environment:
      - WEB_URL=http://web/index.html
    volumes: ["./workspace:/app"]
    depends_on:
      web:
        condition: service_healthy
volumes:
  webdata:
networks:
  default: {}
"""


def write_stack(tmp_path: Path, busybox: str, seed: str = "hello from web") -> Path:
    (tmp_path / ".env").write_text(f"BUSYBOX={busybox}\nGREETING='hi there'\n")
    (tmp_path / "seed.txt").write_text(seed + "\n")
    (tmp_path / "docker-compose.yml").write_text(STACK)
    return tmp_path / "docker-compose.yml"


def test_import_compose_keys(tmp_path):
    spec = import_compose(write_stack(tmp_path, "local/busybox:ci"))
    assert spec.start_order() == ["web", "app"] and spec.app() == "app"
    web, app = spec.services["web"], spec.services["app"]
    assert web.image == "local/busybox:ci" and web.ports == [80] and web.container_name == "demo-web"
    assert web.healthcheck.interval == 1 and web.healthcheck.retries == 30
    assert [v.kind for v in web.volumes] == ["volume", "bind"]
    assert app.depends_on["web"].condition == "service_healthy" and app.workspace_target() == "/app"
    assert app.environment == {"WEB_URL": "http://web/index.html"} and app.env_file == [".env"]
    assert any("container_name" in i for i in spec.ignored) and any("restart" in i for i in spec.ignored)

    (tmp_path / "docker-compose.yml").write_text(
        STACK.replace("    restart: unless-stopped\n", "    privileged: true\n")
    )
    with pytest.raises(SpecError, match="'privileged'"):
        import_compose(tmp_path / "docker-compose.yml")
    (tmp_path / "docker-compose.yml").write_text(STACK.replace("${BUSYBOX}", "${NOPE}"))
    with pytest.raises(SpecError, match="NOPE"):
        import_compose(tmp_path / "docker-compose.yml")
    (tmp_path / "docker-compose.yml").write_text(
        "services:\n  db:\n    image: postgres:16\n    volumes: ['./init-db.sql:/docker-entrypoint-initdb.d/init.sql']\n"
        "    healthcheck: {test: 'pg_isready', interval: 1m30s}\n"
    )
    (tmp_path / "init-db.sql").write_text("select 1;")
    db = import_compose(tmp_path / "docker-compose.yml").services["db"]
    assert (
        db.init_sql == "./init-db.sql"
        and db.healthcheck.interval == 90
        and db.healthcheck.test == ["CMD-SHELL", "pg_isready"]
    )


# --- stacks ---------------------------------------------------------------------------------------------
def test_two_service_stack_and_teardown(docker_client, busybox_image, tmp_path):
    spec = import_compose(write_stack(tmp_path, busybox_image))
    env = DockerEnvironment(spec=spec, client=docker_client, health_deadline_s=30)
    with env:
        trial = env.trial_id
        r = env.exec('wget -qO- "$WEB_URL"; echo "$GREETING"', timeout_s=15)
        assert r.ok, r
        assert r.stdout == "hello from web\nhi there\n"
        ip = env.service_ip("web")
        assert env.exec(f"wget -qO- http://{ip}/index.html", timeout_s=15).stdout == "hello from web\n"
        labels = env.container("web").labels
        assert labels[L_TRIAL] == trial and labels[L_PID] == str(os.getpid()) and labels[L_CREATED]
        assert len(leftovers(docker_client, trial)) == 4  # 2 containers, the network, the named volume
        assert "web-up" in env.logs("web")
    assert leftovers(docker_client, trial) == []


def test_task_environment_and_start_app(docker_client, busybox_image, tmp_path):
    from saasbench.catalog.tasks import Task, TaskSpec
    from saasbench.environments.base import start_app

    (tmp_path / "environment").mkdir()
    (tmp_path / "environment" / "docker-compose.yml").write_text(
        f"services:\n  app:\n    image: {busybox_image}\n    volumes: ['./workspace:/app']\n"
    )
    spec = TaskSpec(
        id="demo-docker",
        app={"port": 8123, "health_path": "/index.html", "start_command": "exec httpd -f -p $PORT -h /app/www"},
        database={"engine": "sqlite", "path": "data/app.db"},
        environment={"compose": "environment/docker-compose.yml", "env": {"GREETING": "hi"}},
    )
    task = Task(root=tmp_path, spec=spec)
    with DockerEnvironment(task=task, client=docker_client) as env:
        assert env.container().labels[L_TASK] == "demo-docker"
        r = env.exec('echo "$GREETING $PORT $DATABASE_PATH"', timeout_s=10)
        assert r.stdout == "hi 8123 /app/data/app.db\n"
        assert env.db_dsn == f"sqlite:///{env.workspace_dir / 'data/app.db'}"
        env.write_file("www/index.html", "up\n")
        started = start_app(task, env, deadline_s=15)
        assert started.ok, started
        env.stop_service("app")
        failed = start_app(task, env, command="echo cannot-start-marker; exit 7", deadline_s=5)
        assert not failed.ok and "exited with code 7" in failed.error and "cannot-start-marker" in failed.log_tail


def test_unhealthy_service_fails_with_its_logs(docker_client, busybox_image):
    spec = EnvSpec(
        services={
            "db": ServiceSpec(
                image=busybox_image,
                command=["sh", "-c", "echo boom-marker-42 >&2; exec sleep 300"],
                healthcheck={"test": ["CMD", "false"], "interval": 0.2},
            ),
            "app": ServiceSpec(image=busybox_image, depends_on={"db": {"condition": "service_healthy"}}),
        }
    )
    env = DockerEnvironment(spec=spec, client=docker_client, health_deadline_s=1.5)
    t0 = time.monotonic()
    with pytest.raises(ServiceError) as err:
        env.start()
    assert time.monotonic() - t0 < 20
    assert "'db' not healthy" in str(err.value) and "boom-marker-42" in err.value.log_tail
    assert leftovers(docker_client, env.trial_id) == []

    crash = EnvSpec(
        services={
            "db": ServiceSpec(
                image=busybox_image,
                command=["sh", "-c", "echo dying-words; exit 3"],
                healthcheck={"test": ["CMD", "true"]},
            ),
            "app": ServiceSpec(image=busybox_image, depends_on=["db"]),
        }
    )
    env = DockerEnvironment(spec=crash, client=docker_client, health_deadline_s=10)
    with pytest.raises(ServiceError, match="exited with code 3") as err:
        env.start()
    assert "dying-words" in err.value.log_tail
    assert leftovers(docker_client, env.trial_id) == []


class _StaleStateEnv(DockerEnvironment):
    """Reports the first look at ``db`` as running although it has already exited: the window
    between the health loop's state check and its probe, where Docker answers the exec with 409."""

    stale_looks = 1

    def _state(self, name):
        state = super()._state(name)
        if name == "db" and self.stale_looks:
            deadline = time.monotonic() + 10
            while state.get("Status") not in ("exited", "dead") and time.monotonic() < deadline:
                time.sleep(0.05)
                state = super()._state(name)
            assert state.get("Status") in ("exited", "dead"), state
            self.stale_looks -= 1
            return {"Status": "running"}
        return state


def test_service_exiting_between_state_check_and_probe_is_a_service_error(docker_client, busybox_image):
    spec = EnvSpec(
        services={
            "db": ServiceSpec(
                image=busybox_image,
                command=["sh", "-c", "echo last-words-7; exit 4"],
                healthcheck={"test": ["CMD", "true"]},
            ),
            "app": ServiceSpec(image=busybox_image, depends_on={"db": {"condition": "service_healthy"}}),
        }
    )
    env = _StaleStateEnv(spec=spec, client=docker_client, health_deadline_s=10)
    with pytest.raises(ServiceError, match="'db' exited with code 4 before it was healthy") as err:
        env.start()
    assert env.stale_looks == 0
    assert "last-words-7" in err.value.log_tail
    assert leftovers(docker_client, env.trial_id) == []


def test_two_trials_of_one_task_at_once(docker_client, busybox_image):
    spec = EnvSpec(services={"app": ServiceSpec(image=busybox_image)})
    # one reaches the app through the host proxy, the other at its address on the trial network
    envs = [
        DockerEnvironment(spec=spec, client=docker_client, port=8000, health_deadline_s=20, reach=reach)
        for reach in ("proxy", "ip")
    ]
    errors: list[BaseException] = []

    def start(e: DockerEnvironment) -> None:
        try:
            e.start()
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=start, args=(e,)) for e in envs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert not errors, errors
        for i, e in enumerate(envs):
            e.write_file("www/index.html", f"trial {i}\n")
            e.start_service("app", "exec httpd -f -p $PORT -h /app/www")
        import httpx

        for i, e in enumerate(envs):
            e.wait_healthy(e.base_url + "/index.html", 15, service="app")
            assert httpx.get(e.base_url + "/index.html", trust_env=False).text == f"trial {i}\n"
        assert envs[0].base_url != envs[1].base_url and envs[0].network != envs[1].network
        assert envs[0].app_port == envs[1].app_port == 8000
    finally:
        for e in envs:
            e.stop()
    for e in envs:
        assert leftovers(docker_client, e.trial_id) == []


def test_prune_removes_only_dead_owners(docker_client, busybox_image):
    dead = subprocess.Popen(["true"])
    dead.wait()

    def make(trial: str, pid: int, host: str = socket.gethostname(), created: str | None = None) -> None:
        labels = {
            L_TRIAL: trial,
            L_TASK: "t",
            L_HOST: host,
            L_PID: str(pid),
            L_CREATED: created or dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        net = docker_client.networks.create(f"saasbench-{trial}", labels=labels)
        docker_client.volumes.create(f"saasbench-{trial}-v", labels=labels)
        docker_client.containers.create(
            busybox_image, ["sleep", "300"], labels=labels, network=net.name, name=f"saasbench-{trial}-x"
        )

    tag = uuid.uuid4().hex[:6]
    gone, alive, foreign = f"gone-{tag}", f"alive-{tag}", f"foreign-{tag}"
    make(gone, dead.pid)
    make(alive, os.getpid())
    make(foreign, 1, host="another-host", created="2020-01-01T00:00:00Z")
    try:
        assert gone in prune(docker_client, dry_run=True) and leftovers(docker_client, gone)
        removed = prune(docker_client)
        assert gone in removed and alive not in removed and foreign not in removed
        assert leftovers(docker_client, gone) == [] and len(leftovers(docker_client, alive)) == 3
        removed = prune(docker_client, older_than=dt.timedelta(days=1))
        assert foreign in removed and alive not in removed
        assert leftovers(docker_client, foreign) == []
        assert alive in list_trials(docker_client)
    finally:
        from saasbench.environments.docker import _remove_trial

        for t in (gone, alive, foreign):
            _remove_trial(docker_client, t)


RUNNER = """
import sys, time, docker
from saasbench.environments.docker import DockerEnvironment
from saasbench.catalog.envspec import EnvSpec, ServiceSpec
client = docker.DockerClient(base_url=sys.argv[1])
with DockerEnvironment(spec=EnvSpec(services={"app": ServiceSpec(image=sys.argv[2])}), client=client, trial_id=sys.argv[3]):
    print("ready", flush=True)
    time.sleep(120)
"""


def test_ctrl_c_tears_down_and_prune_reaps_a_killed_run(docker_client, busybox_image):
    import sys

    tag = uuid.uuid4().hex[:6]
    runs = {}
    for name in ("interrupted", "killed"):
        trial = f"{name}-{tag}"
        proc = subprocess.Popen(
            [sys.executable, "-c", RUNNER, docker_client.saasbench_base_url, busybox_image, trial],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=sigint_default,
        )
        runs[name] = (trial, proc)
    try:
        for trial, proc in runs.values():
            assert proc.stdout.readline() == "ready\n", (
                proc.stderr.read() if proc.poll() is not None else "no ready line"
            )
            assert leftovers(docker_client, trial)
        trial, proc = runs["interrupted"]
        proc.send_signal(signal.SIGINT)  # what Ctrl-C does
        assert proc.wait(timeout=60) != 0 and "KeyboardInterrupt" in proc.stderr.read()
        assert leftovers(docker_client, trial) == []
        trial, proc = runs["killed"]
        proc.kill()
        proc.wait(timeout=30)
        assert len(leftovers(docker_client, trial)) == 2  # the container and the network survive SIGKILL
        assert trial in prune(docker_client)
        assert leftovers(docker_client, trial) == []
    finally:
        for trial, proc in runs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            from saasbench.environments.docker import _remove_trial

            _remove_trial(docker_client, trial)


# --- image cache -------------------------------------------------------------------------------------------
def make_context(root: Path, base: str, marker: str, slow: bool = False) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    sleep = "sleep 1 && " if slow else ""  # a build long enough for two processes to overlap
    (root / "Dockerfile").write_text(f"FROM {base}\nCOPY hello.txt /hello.txt\nRUN {sleep}echo {marker} > /marker\n")
    (root / "hello.txt").write_text("hello\n")
    return root


def test_cache_hit_and_rebuild(docker_client, busybox_image, tmp_path):
    cache = ImageCache(docker_client, cache_dir=tmp_path / "cache")
    ctx = make_context(tmp_path / "ctx", busybox_image, uuid.uuid4().hex)
    first = cache.ensure(ctx)
    assert first.built and first.log_path.read_text().count("Step") >= 3
    again = cache.ensure(ctx)
    assert not again.built and again.tag == first.tag and len(cache.builds()) == 1
    (ctx / "Dockerfile").write_text((ctx / "Dockerfile").read_text() + "ENV CHANGED=1\n")
    changed = cache.ensure(ctx)
    assert changed.built and changed.tag != first.tag and len(cache.builds()) == 2
    (ctx / "hello.txt").write_text("hello again\n")
    assert cache.ensure(ctx).built and len(cache.builds()) == 3
    out = docker_client.containers.run(changed.tag, ["cat", "/hello.txt"], remove=True, network_mode="none")
    assert out == b"hello\n"
    assert {first.tag, changed.tag} <= {i.tag for i in cache.list_images()}
    removed = cache.prune(max_bytes=0)
    assert {i.tag for i in removed} >= {first.tag, changed.tag} and cache.list_images() == []
    (ctx / "Dockerfile").write_text("FROM nowhere/missing:1\n")
    with pytest.raises(BuildError, match="nowhere/missing:1"):
        cache.ensure(ctx)


def _ensure_in_process(base_url: str, cache_dir: str, ctx: str, out: multiprocessing.Queue) -> None:
    import docker

    ref = ImageCache(docker.DockerClient(base_url=base_url), cache_dir=cache_dir).ensure(ctx)
    out.put((ref.tag, ref.built))


def test_concurrent_builds_of_one_hash_build_once(docker_client, busybox_image, tmp_path):
    ctx = make_context(tmp_path / "ctx", busybox_image, uuid.uuid4().hex, slow=True)
    mp = multiprocessing.get_context("spawn")
    out = mp.Queue()
    procs = [
        mp.Process(
            target=_ensure_in_process, args=(docker_client.saasbench_base_url, str(tmp_path / "cache"), str(ctx), out)
        )
        for _ in range(2)
    ]
    for p in procs:
        p.start()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    assert len({tag for tag, _ in results}) == 1
    assert sorted(built for _, built in results) == [False, True]
    assert len(ImageCache(docker_client, cache_dir=tmp_path / "cache").builds()) == 1
    ImageCache(docker_client, cache_dir=tmp_path / "cache").prune(max_bytes=0)


def test_service_built_from_dockerfile(docker_client, busybox_image, tmp_path):
    make_context(tmp_path / "ctx", busybox_image, "built-marker")
    spec = EnvSpec(services={"app": ServiceSpec(build={"context": "ctx"})}, base_dir=str(tmp_path))
    with DockerEnvironment(spec=spec, client=docker_client, image_cache_dir=tmp_path / "cache") as env:
        assert env.exec("cat /marker", timeout_s=10).stdout == "built-marker\n"
    ImageCache(docker_client, cache_dir=tmp_path / "cache").prune(max_bytes=0)
