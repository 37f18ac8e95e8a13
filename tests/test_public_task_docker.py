"""Real public SaaSBench tasks come up on the test engine with substitute images.

No registry is reachable here, so the images the tasks name (``postgres:16-alpine``,
``shadetocloak/task_<id>-app:model``, ``redis:7-alpine``) are swapped for Debian-built ones by
``infra/image-maps/debian-substitutes.yaml``, through the code a user runs: ``import_compose`` ->
``apply_image_map`` -> ``image_needs`` -> ``DockerEnvironment``. The compose files are the tasks'
own, unchanged (tests/data/public-tasks).

Needs ``dockerd`` (``docker.io``), ``busybox-static``, root and ``debootstrap`` with the Debian
mirror: the ``postgres_image`` fixture debootstraps its image the first time (a few minutes).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from saasbench.catalog.envspec import import_compose
from saasbench.catalog.imagemap import apply_image_map, image_needs, read_image_map
from saasbench.environments.docker import L_TRIAL, DockerEnvironment

REPO = Path(__file__).resolve().parents[1]
PUBLIC = REPO / "tests" / "data" / "public-tasks"
IMAGE_MAP = REPO / "infra" / "image-maps" / "debian-substitutes.yaml"
# what the reference harness's prepare_workspace.sh sets in model mode
MODEL_MODE = {"IMAGE_TAG": "model", "APP_CMD": "sleep infinity"}

# init-db.sql is not shipped with the public task data (the compose files bind ./init-db.sql into
# /docker-entrypoint-initdb.d), so the tests copy the compose folder and write this small stand-in:
# an extension from contrib, used by a default, and a marker row the test looks for afterwards.
STAND_IN_INIT_SQL = """\
-- saasbench test stand-in for the task's unpublished init-db.sql
CREATE EXTENSION IF NOT EXISTS pgcrypto;
CREATE TABLE saasbench_init_marker (
    id serial PRIMARY KEY,
    note text NOT NULL,
    token text NOT NULL DEFAULT encode(gen_random_bytes(8), 'hex')
);
INSERT INTO saasbench_init_marker (note) VALUES ('stand-in init-db.sql ran');
"""

# run in the app container: a PostgreSQL startup message to db:5432; the server's first answer
# names the authentication it demands (R, 10 = SASL, mechanism SCRAM-SHA-256)
PG_PROBE = r"""
import socket, struct, sys
user, db = sys.argv[1], sys.argv[2]
s = socket.create_connection(("db", 5432), timeout=10)
params = b"user\0" + user.encode() + b"\0database\0" + db.encode() + b"\0\0"
s.sendall(struct.pack("!ii", 8 + len(params), 196608) + params)
def read(n):
    out = b""
    while len(out) < n:
        chunk = s.recv(n - len(out))
        if not chunk:
            raise SystemExit("connection closed")
        out += chunk
    return out
kind = read(1).decode()
(length,) = struct.unpack("!i", read(4))
body = read(length - 4)
(code,) = struct.unpack("!i", body[:4])
print(kind, code, body[4:].split(b"\0")[0].decode())
"""

REDIS_PROBE = r"""
import socket
s = socket.create_connection(("cache", 6379), timeout=10)
s.sendall(b"PING\r\nSET saasbench-key from-the-app\r\nGET saasbench-key\r\n")
data = b""
while data.count(b"\r\n") < 4:
    data += s.recv(4096)
print(data.decode().replace("\r\n", "|"))
"""


def leftovers(client, trial: str) -> list[str]:
    flt = {"label": f"{L_TRIAL}={trial}"}
    return (
        [f"container {c.name}" for c in client.containers.list(all=True, filters=flt)]
        + [f"network {n.name}" for n in client.networks.list(filters=flt)]
        + [f"volume {v.name}" for v in client.volumes.list(filters=flt)]
    )


def task_compose(tmp_path: Path, task: str) -> Path:
    """The task's compose folder, copied, with the stand-in init-db.sql next to the compose file."""
    folder = tmp_path / "docker"
    shutil.copytree(PUBLIC / task / "tasks" / task / "docker", folder)
    (folder / "init-db.sql").write_text(STAND_IN_INIT_SQL)
    return folder / "docker-compose.yml"


def exec_in(container, argv: list[str], environment: dict[str, str] | None = None) -> tuple[int, str, str]:
    r = container.exec_run(argv, environment=environment, demux=True)
    out, err = r.output
    return r.exit_code, (out or b"").decode(), (err or b"").decode()


def psql_tcp(container, user: str, password: str, db: str, sql: str) -> tuple[int, str, str]:
    """psql in the db container over TCP to the service name (not the socket, not 127.0.0.1: the
    pg_hba line for other hosts, i.e. password authentication, applies)."""
    return exec_in(
        container,
        [
            "psql",
            "-X",
            "-w",
            "-h",
            "db",
            "-p",
            "5432",
            "-U",
            user,
            "-d",
            db,
            "-v",
            "ON_ERROR_STOP=1",
            "-tA",
            "-F",
            "|",
            "-c",
            sql,
        ],
        environment={"PGPASSWORD": password},
    )


# --- task_cvyocaao: app + postgres:16-alpine ----------------------------------------------------------
def test_cvyocaao_without_image_map_images_absent(docker_client, tmp_path):
    import docker.errors

    spec = import_compose(task_compose(tmp_path, "task_cvyocaao"), variables=MODEL_MODE)
    for svc in spec.services.values():
        try:
            docker_client.images.get(svc.image)
            pytest.skip(f"this engine has the real {svc.image} (a host engine that could pull)")
        except docker.errors.ImageNotFound:
            pass
    needs = {n.service: n for n in image_needs(spec, docker_client)}
    assert {k: (n.declared, n.image, n.substitute, n.available) for k, n in needs.items()} == {
        "app": ("shadetocloak/task_cvyocaao-app:model", "shadetocloak/task_cvyocaao-app:model", None, False),
        "db": ("postgres:16-alpine", "postgres:16-alpine", None, False),
    }


def test_cvyocaao_comes_up_with_debian_substitutes(docker_client, python_image, postgres_image, tmp_path):
    compose = task_compose(tmp_path, "task_cvyocaao")
    declared = import_compose(compose, variables=MODEL_MODE)
    assert declared.missing_variables == {} and declared.warnings == []
    spec = apply_image_map(declared, read_image_map(IMAGE_MAP))

    needs = {n.service: n for n in image_needs(spec, docker_client)}
    assert needs["app"].declared == "shadetocloak/task_cvyocaao-app:model" and needs["app"].image == python_image
    assert needs["db"].declared == "postgres:16-alpine" and needs["db"].image == postgres_image
    assert needs["app"].available is True and needs["db"].available is True
    assert needs["app"].substitute.startswith(f"shadetocloak/task_cvyocaao-app:model -> {python_image} (")
    assert needs["db"].substitute.startswith(f"postgres:16-alpine -> {postgres_image} (")
    # the task's own command, healthchecks and mounts stay; only the db gets an entrypoint
    app, db = spec.services["app"], spec.services["db"]
    assert app.command == ["bash", "-c", "sleep infinity"] and app.entrypoint is None
    assert app.healthcheck.test == ["CMD-SHELL", "test -d /app"]
    assert db.command is None and db.entrypoint[:2] == ["bash", "-c"]
    assert db.healthcheck.test == ["CMD-SHELL", "pg_isready -U appcvyocaao -d app_cvyocaao"]
    assert db.init_sql == "./init-db.sql" and db.environment == {
        "POSTGRES_DB": "app_cvyocaao",
        "POSTGRES_USER": "appcvyocaao",
        "POSTGRES_PASSWORD": "app123cvyocaao",
    }

    env = DockerEnvironment(spec=spec, client=docker_client, health_deadline_s=180)
    with env:
        trial = env.trial_id
        dbc, appc = env.container("db"), env.container("app")
        # start() returned, so db passed its own pg_isready healthcheck before app (service_healthy) started
        assert exec_in(dbc, db.healthcheck.argv())[0] == 0
        assert appc.attrs["Config"]["Image"] == python_image and dbc.attrs["Config"]["Image"] == postgres_image
        logs = dbc.logs().decode()
        assert "running /docker-entrypoint-initdb.d/init-db.sql" in logs and "ready for start up" in logs
        # the named volume holds the data directory, per trial
        vols = [v.name for v in docker_client.volumes.list(filters={"label": f"{L_TRIAL}={trial}"})]
        assert vols == [f"saasbench-{trial}-pgdata_cvyocaao"]

        # from the app container: db resolves by service name, 5432 answers, and asks for SCRAM
        env.write_file("/app/pg_probe.py", PG_PROBE)
        r = env.exec("python3 pg_probe.py appcvyocaao app_cvyocaao", timeout_s=30)
        assert r.ok, r.stderr
        assert r.stdout.strip() == "R 10 SCRAM-SHA-256"

        # the compose credentials over TCP with a password; the stand-in init-db.sql ran in app_cvyocaao
        code, out, err = psql_tcp(
            dbc,
            "appcvyocaao",
            "app123cvyocaao",
            "app_cvyocaao",
            (
                "SELECT current_user, current_database(), inet_server_addr() IS NOT NULL, "
                "(SELECT extname FROM pg_extension WHERE extname = 'pgcrypto'), "
                "(SELECT note || ':' || length(token) FROM saasbench_init_marker), "
                "(SELECT rolpassword LIKE 'SCRAM-SHA-256$%' FROM pg_authid WHERE rolname = current_user), "
                "current_setting('data_directory'), current_setting('listen_addresses')"
            ),
        )
        assert code == 0, err
        assert out.strip() == (
            "appcvyocaao|app_cvyocaao|t|pgcrypto|stand-in init-db.sql ran:16|t|/var/lib/postgresql/data|*"
        )
        # ... and a wrong password is refused (TCP is not trust)
        code, out, err = psql_tcp(dbc, "appcvyocaao", "wrong", "app_cvyocaao", "SELECT 1")
        assert code != 0 and "password authentication failed" in err

        # postgres itself runs as postgres, directly under the container's init (no su-like parent)
        code, out, _ = exec_in(
            dbc,
            [
                "bash",
                "-c",
                "pid=$(head -n 1 /var/lib/postgresql/data/postmaster.pid); "
                "stat -c %U /proc/$pid; awk '/^PPid:/ {print $2}' /proc/$pid/status",
            ],
        )
        assert code == 0 and out.split() == ["postgres", "1"]

        # a restart keeps the data and does not run init-db.sql again (the data directory is initialised)
        dbc.restart(timeout=30)
        end = time.monotonic() + 60
        while exec_in(dbc, db.healthcheck.argv())[0] != 0:
            assert time.monotonic() < end, dbc.logs().decode()[-2000:]
            time.sleep(0.5)
        code, out, err = psql_tcp(
            dbc, "appcvyocaao", "app123cvyocaao", "app_cvyocaao", "SELECT count(*) FROM saasbench_init_marker"
        )
        assert code == 0 and out.strip() == "1", err
        assert dbc.logs().decode().count("running /docker-entrypoint-initdb.d/init-db.sql") == 1

        # the workspace is /app in the app container, both ways
        env.write_file("/app/from-host.txt", "written by the harness\n")
        assert env.exec("cat /app/from-host.txt", timeout_s=10).stdout == "written by the harness\n"
        assert env.exec("pwd && echo from-container > made-inside.txt", timeout_s=10).stdout == "/app\n"
        assert env.read_file("/app/made-inside.txt") == b"from-container\n"
        assert (env.workspace_dir / "made-inside.txt").read_text() == "from-container\n"
    assert leftovers(docker_client, trial) == []


# --- task_hhrdixum: app + postgres:16-bookworm (POSTGRES_INITDB_ARGS) + redis:7-alpine with a command -
def test_hhrdixum_service_commands_and_initdb_args_apply(docker_client, python_image, postgres_image, tmp_path):
    spec = apply_image_map(
        import_compose(task_compose(tmp_path, "task_hhrdixum"), variables={"IMAGE_TAG": "model"}),
        read_image_map(IMAGE_MAP),
    )
    assert {n.service: (n.declared, n.image, n.available) for n in image_needs(spec, docker_client)} == {
        "app": ("shadetocloak/task_hhrdixum-app:model", python_image, True),
        "db": ("postgres:16-bookworm", postgres_image, True),
        "cache": ("redis:7-alpine", postgres_image, True),
    }
    cache = spec.services["cache"]
    assert cache.command == [
        "redis-server",
        "--appendonly",
        "yes",
        "--maxmemory",
        "512mb",
        "--maxmemory-policy",
        "allkeys-lru",
    ]  # the task's own, kept under the entrypoint

    env = DockerEnvironment(spec=spec, client=docker_client, health_deadline_s=180)
    with env:
        trial = env.trial_id
        dbc, cachec = env.container("db"), env.container("cache")
        # POSTGRES_INITDB_ARGS "--encoding=UTF8 --locale=C" reached initdb
        code, out, err = psql_tcp(
            dbc,
            "apphhrdixum",
            "app123hhrdixum",
            "app_hhrdixum",
            "SELECT current_setting('lc_collate'), current_setting('server_encoding'), "
            "(SELECT count(*) FROM saasbench_init_marker)",
        )
        assert code == 0, err
        assert out.strip() == "C|UTF8|1"

        # redis: healthy via the task's redis-cli ping, reachable from the app, the task's flags applied
        env.write_file("/app/redis_probe.py", REDIS_PROBE)
        r = env.exec("python3 redis_probe.py", timeout_s=30)
        assert r.ok, r.stderr
        assert r.stdout.strip() == "+PONG|+OK|$12|from-the-app|"
        code, out, _ = exec_in(cachec, ["redis-cli", "CONFIG", "GET", "appendonly"])
        assert code == 0 and out.split() == ["appendonly", "yes"]
        code, out, _ = exec_in(cachec, ["redis-cli", "CONFIG", "GET", "maxmemory"])
        assert code == 0 and out.split() == ["maxmemory", str(512 * 1024 * 1024)]
        code, out, _ = exec_in(cachec, ["redis-cli", "CONFIG", "GET", "dir"])
        assert code == 0 and out.split() == ["dir", "/data"]
        code, out, _ = exec_in(
            cachec,
            ["bash", "-c", "stat -c %U /proc/$(redis-cli INFO server | sed -n 's/^process_id:\\([0-9]*\\).*/\\1/p')"],
        )
        assert code == 0 and out.strip() == "redis"
        # the compose file's network aliases resolve on the trial network (hhrdixum's app uses postgres / redis)
        r = env.exec(
            "python3 -c \"import socket; print(socket.gethostbyname('postgres') == socket.gethostbyname('db'), "
            "socket.gethostbyname('redis') == socket.gethostbyname('cache'))\"",
            timeout_s=20,
        )
        assert r.ok and r.stdout.strip() == "True True", r.stderr
        # the app's own command ran (model mode: no /app/bin/start.sh, so it sleeps)
        assert "no /app/bin/start.sh" in env.logs("app")
    assert leftovers(docker_client, trial) == []


@pytest.mark.parametrize("task", ["task_cvyocaao", "task_hhrdixum"])
def test_image_map_maps_every_image_of_the_task(task, tmp_path):
    spec = apply_image_map(
        import_compose(task_compose(tmp_path, task), variables=MODEL_MODE), read_image_map(IMAGE_MAP)
    )
    assert set(spec.substitutions) == set(spec.services)


# --- the imported task's readiness and `saasbench tasks images`, against the test engine ------------------
def test_imported_task_images_readiness_and_cli(docker_client, python_image, postgres_image, tmp_path, monkeypatch):
    import json

    from typer import Typer
    from typer.testing import CliRunner

    from saasbench.catalog.tasks import import_public_task, readiness
    from saasbench.cli.tasks import tasks_app

    task = import_public_task(PUBLIC / "task_cvyocaao", tmp_path / "cat").task
    (task.root / "environment" / "init-db.sql").write_text("SELECT 1;\n")  # stand-in: not in the public repository
    monkeypatch.setenv("DOCKER_HOST", docker_client.saasbench_base_url)
    monkeypatch.setenv("SAASBENCH_IMAGE_MAP", str(tmp_path / "no-map.yaml"))  # no user map yet
    state = readiness(task, docker_client=docker_client)
    assert "images" in state.needs and "files" not in state.needs
    app = Typer()
    app.add_typer(tasks_app, name="tasks")
    r = CliRunner().invoke(app, ["tasks", "images", "cvyocaao", "--root", str(tmp_path / "cat"), "--json"])
    assert r.exit_code == 1, r.output
    rows = {n["service"]: n for n in json.loads(r.output)["images"]}
    assert rows["app"]["declared"] == "shadetocloak/task_cvyocaao-app:model" and rows["app"]["available"] is False
    assert rows["db"]["declared"] == "postgres:16-alpine" and rows["db"]["available"] is False

    monkeypatch.setenv("SAASBENCH_IMAGE_MAP", str(IMAGE_MAP))  # the user's map: the Debian substitutes
    r = CliRunner().invoke(app, ["tasks", "images", "cvyocaao", "--root", str(tmp_path / "cat"), "--json"])
    assert r.exit_code == 0, r.output
    rows = {n["service"]: n for n in json.loads(r.output)["images"]}
    assert (rows["app"]["image"], rows["app"]["available"]) == (python_image, True)
    assert (rows["db"]["image"], rows["db"]["available"]) == (postgres_image, True)
    assert "images" not in readiness(task, docker_client=docker_client).needs
