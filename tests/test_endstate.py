"""The frozen end state (saasbench.runs.endstate): freeze after the rollout, restore into a fresh
environment, evaluate again with the same node statuses; content addressing, integrity, secrets,
symlinks, the end_states table and what `lake vacuum` does with objects."""

from __future__ import annotations

import io
import json
import shutil
import sqlite3
import tarfile
import time
from pathlib import Path

import pytest

from saasbench import lake as L
from saasbench.agents.oracle import OracleAgent
from saasbench.catalog.tasks import load_task, load_task_dir
from saasbench.dag import load_dag
from saasbench.environments.local import LocalEnvironment
from saasbench.redaction import MARKER
from saasbench.runs import endstate as E
from saasbench.runs.trial import evaluate_in, make_environment, resolve_agent, rollout_in, task_budget

REPO = Path(__file__).resolve().parents[1]
IMAGE_MAP = REPO / "infra" / "image-maps" / "debian-substitutes.yaml"


def statuses(report) -> dict[str, str]:
    return {n.id: n.status.value for n in report.nodes}


@pytest.fixture(scope="module")
def timetrack():
    return load_task("timetrack")


@pytest.fixture
def store(tmp_path):
    return L.lake_from_uri(str(tmp_path / "lake"))


@pytest.fixture(params=["local", "s3"])
def lake(request, tmp_path) -> L.Store:
    """A folder or an S3 bucket (moto): the object store under the lake."""
    if request.param == "local":
        return L.lake_from_uri(str(tmp_path / "lake"))
    server = request.getfixturevalue("s3_server")
    name = request.node.name.replace("[", "_").replace("]", "")
    return L.lake_from_uri(server.uri(f"endstate/{name}"), endpoint_url=server.endpoint_url)


def oracle_rollout(env, task, agent=None):
    agent = agent or resolve_agent("oracle")
    ro = rollout_in(env, task, agent, task_budget(task))
    assert ro.outcome == "completed", ro.outcome_detail
    return agent


# --- round trips ---------------------------------------------------------------------------------------
@pytest.mark.slow
def test_local_round_trip_scores_node_for_node_like_the_live_system(timetrack, store):
    dag = load_dag(timetrack.dag_path).dag
    with make_environment(timetrack, "local") as env:
        agent = oracle_rollout(env, timetrack)
        (env.workspace_dir / "notes").mkdir()
        (env.workspace_dir / "notes" / "tool.sh").write_text("#!/bin/sh\necho hi\n")
        (env.workspace_dir / "notes" / "tool.sh").chmod(0o750)
        frozen = E.freeze(env, timetrack, store, agent=agent)
        live, app, _ = evaluate_in(env, timetrack, agent, dag)
        assert app.ok, app.error
    m = frozen.manifest
    assert (m.task_id, m.backend, m.format_version, m.agent) == ("timetrack", "local", 1, "oracle")
    assert [c.kind for c in m.components] == ["workspace"]  # the app creates its SQLite file at start
    assert m.restart.source == "contract" and m.restart.command == "bash run.sh"
    assert frozen.manifest_key == E.object_key(frozen.manifest_key.rsplit("/", 1)[1])

    with make_environment(timetrack, "local") as env2:
        recipe = E.restore(store, frozen.manifest_key, env2)
        assert recipe == m.restart
        assert (env2.workspace_dir / "app.py").read_bytes() == (timetrack.reference_dir / "app.py").read_bytes()
        assert (env2.workspace_dir / "notes" / "tool.sh").stat().st_mode & 0o777 == 0o750
        assert (env2.workspace_dir / "run.sh").stat().st_mode & 0o777 == 0o755
        again, app2, _ = evaluate_in(env2, timetrack, agent, dag)
        assert app2.ok, app2.error
    assert statuses(again) == statuses(live)
    assert again.summary.deterministic_score == live.summary.deterministic_score == 100.0


class LeavesAppRunning(OracleAgent):
    """The oracle, but it starts the app itself and names no deployment contract (like an agent of
    a task whose start_command is null), with secrets in the app's environment."""

    name = "leaves-app-running"
    secret_env = {
        "API_TOKEN": "tok-very-secret-123",
        "UPSTREAM_URL": "postgres://bob:hunter2hunter@db.example/x",
        "NOTE": "inline tok-very-secret-123 here",
        "PLAIN": "kept as is",
    }

    def app_start_command(self, task):
        return None

    def run(self, prompt, env, budget):
        traj = super().run(prompt, env, budget)
        env.start_service("my-app", "bash run.sh", env=self.secret_env)
        env.wait_healthy(env.base_url + "/api/health", 60, service="my-app")
        return traj


@pytest.fixture
def contractless_task(tmp_path):
    """timetrack with no deployment contract: the agent must leave the app running."""
    folder = tmp_path / "task"
    shutil.copytree(REPO / "tasks" / "timetrack", folder)
    text = (folder / "task.yaml").read_text()
    assert text.count('start_command: "bash run.sh"') == 2
    (folder / "task.yaml").write_text(text.replace('start_command: "bash run.sh"', "start_command: null"))
    task = load_task_dir(folder)
    assert task.spec.app.start_command is None
    return task


@pytest.mark.slow
def test_local_round_trip_from_the_processes_left_running(contractless_task, store):
    task = contractless_task
    dag = load_dag(task.dag_path).dag
    agent = LeavesAppRunning()
    with make_environment(task, "local") as env:
        oracle_rollout(env, task, agent)
        frozen = E.freeze(env, task, store, agent=agent)
        live, app, _ = evaluate_in(env, task, agent, dag)
        assert app.ok, app.error
        old_ws, old_port = env.workspace_path, env.app_port
    m = frozen.manifest
    assert {c.kind for c in m.components} == {"workspace", "sqlite"}  # the running app made its database
    sqlite = next(c for c in m.components if c.kind == "sqlite")
    assert (sqlite.location, sqlite.path) == ("workspace", "data/timetrack.db")
    ws_comp = next(c for c in m.components if c.kind == "workspace")
    assert "data/timetrack.db" in ws_comp.excluded

    recipe = m.restart
    assert recipe.source == "processes" and recipe.command is None
    (proc,) = recipe.processes
    assert proc.service == "my-app" and proc.argv[1:] == ["app.py"] and proc.cwd_rel == "."
    assert Path(proc.argv[0]).name.startswith("python3")  # run.sh execs python3 (a pyenv shim execs again)
    assert proc.user is not None and proc.cwd == old_ws
    # secrets: by name, by value elsewhere, and passwords in URLs
    assert proc.env["API_TOKEN"] == MARKER
    assert proc.env["NOTE"] == f"inline {MARKER} here"
    assert proc.env["UPSTREAM_URL"] == f"postgres://bob:{MARKER}@db.example/x"
    assert proc.env["PLAIN"] == "kept as is" and proc.env["PORT"] == str(old_port)
    stored = store.get(frozen.manifest_key)
    assert b"tok-very-secret-123" not in stored and b"hunter2hunter" not in stored
    command = recipe.shell_command()
    assert "PLAIN='kept as is'" in command and "API_TOKEN" not in command and "UPSTREAM_URL" not in command
    assert str(old_port) not in command and old_ws not in command

    with make_environment(task, "local") as env2:
        assert env2.app_port != old_port or env2.workspace_path != old_ws
        recipe2 = E.restore(store, frozen.manifest_key, env2)
        started = E.start_restored_app(recipe2, task, env2)
        assert started.ok, (started.error, started.log_tail)
        again, app2, _ = evaluate_in(env2, task, agent, dag)
        assert app2.ok
    assert statuses(again) == statuses(live)
    assert again.summary.deterministic_score == live.summary.deterministic_score == 100.0


def test_docker_round_trip_scores_node_for_node_like_the_live_system(docker_client, python_image, timetrack, store):
    dag = load_dag(timetrack.dag_path).dag
    with make_environment(timetrack, "docker", docker_client=docker_client) as env:
        agent = oracle_rollout(env, timetrack)
        # the agent also changed the container itself, and left a worker running
        r = env.exec(
            "mkdir -p /opt/agent && echo tool > /opt/agent/tool.txt && chmod 640 /opt/agent/tool.txt"
            " && chown 1000:1000 /opt/agent/tool.txt && ln -s /etc/passwd /opt/agent/link && rm /etc/issue",
            timeout_s=30,
        )
        assert r.ok, r.stderr
        env.start_service("worker", "sleep 1000", env={"WORKER_SECRET": "worker-secret-987"})
        frozen = E.freeze(env, timetrack, store, agent=agent)
        live, app, _ = evaluate_in(env, timetrack, agent, dag)
        assert app.ok, app.error
    m = frozen.manifest
    assert m.backend == "docker" and m.workspace_path == "/app"
    assert [c.kind for c in m.components] == ["workspace", "container_fs"]
    fs = m.components[1]
    assert fs.roots == ["/opt/agent"] and fs.deleted == ["/etc/issue"]
    assert "/app" in fs.excluded and "/tmp/saasbench-logs" in fs.excluded
    assert m.restart.source == "contract" and m.restart.command == "bash run.sh"
    worker = [p for p in m.restart.processes if p.service == "worker"]
    assert [p.argv for p in worker] == [["sleep", "1000"]]
    assert worker[0].env["WORKER_SECRET"] == MARKER and b"worker-secret-987" not in store.get(frozen.manifest_key)

    with make_environment(timetrack, "docker", docker_client=docker_client) as env2:
        E.restore(store, frozen.manifest_key, env2)
        r = env2.exec("stat -c '%a %u %n' /opt/agent/tool.txt; readlink /opt/agent/link; test -e /etc/issue", 30)
        assert r.stdout.splitlines() == ["640 1000 /opt/agent/tool.txt", "/etc/passwd"] and r.exit_code == 1
        assert (env2.workspace_dir / "run.sh").stat().st_mode & 0o777 == 0o755
        again, app2, _ = evaluate_in(env2, timetrack, agent, dag)
        assert app2.ok, app2.error
    assert statuses(again) == statuses(live)
    assert again.summary.deterministic_score == live.summary.deterministic_score == 100.0


COMPOSE = """
services:
  app:
    image: {python}
    volumes: ["./workspace:/app", "appcache:/var/cache/app"]
    depends_on: {{db: {{condition: service_healthy}}, cache: {{condition: service_healthy}}}}
  db:
    image: postgres:16
    environment: {{POSTGRES_USER: appu, POSTGRES_PASSWORD: apppw, POSTGRES_DB: appdb}}
    volumes: ["pgdata:/var/lib/postgresql/data"]
    healthcheck: {{test: ["CMD-SHELL", "pg_isready -U appu -d appdb"], interval: 1s}}
  cache:
    image: redis:7
    command: ["redis-server", "--appendonly", "yes"]
    volumes: ["rdata:/data"]
    healthcheck: {{test: ["CMD", "redis-cli", "ping"], interval: 1s}}
volumes: {{pgdata: {{}}, rdata: {{}}, appcache: {{}}}}
"""


def test_docker_services_round_trip(docker_client, python_image, postgres_image, timetrack, store, tmp_path):
    """PostgreSQL by pg_dumpall, Redis and the app's own volume by a paused volume tar."""
    from saasbench.catalog.envspec import import_compose
    from saasbench.catalog.imagemap import apply_image_map, read_image_map
    from saasbench.environments.docker import L_TRIAL, DockerEnvironment

    (tmp_path / "docker-compose.yml").write_text(COMPOSE.format(python=python_image))
    spec = apply_image_map(import_compose(tmp_path / "docker-compose.yml"), read_image_map(IMAGE_MAP))

    def psql(env, sql: str) -> str:
        r = env.container("db").exec_run(["psql", "-X", "-tA", "-U", "appu", "-d", "appdb", "-c", sql], user="postgres")
        assert r.exit_code == 0, r.output
        return r.output.decode().strip()

    def redis(env, *args: str) -> str:
        return env.container("cache").exec_run(["redis-cli", *args]).output.decode().strip()

    with DockerEnvironment(timetrack, spec=spec, client=docker_client, health_deadline_s=180) as env:
        psql(env, "CREATE TABLE t (x int, note text); INSERT INTO t VALUES (1, 'a'), (2, 'b'), (3, 'c')")
        assert redis(env, "SET", "k", "v1") == "OK" and redis(env, "RPUSH", "l", "x", "y") == "2"
        assert env.exec("echo cached > /var/cache/app/c.txt", 30).ok
        frozen = E.freeze(env, timetrack, store)
    assert [(c.kind, c.name, c.method, c.mounts) for c in frozen.manifest.components] == [
        ("workspace", "workspace", "tar", []),
        ("postgres", "db", "pg_dumpall --clean --if-exists", []),
        ("volumes", "cache", "paused-volume-tar", ["/data"]),
        ("volumes", "app", "paused-volume-tar", ["/var/cache/app"]),
        ("container_fs", "app", "diff+get_archive", []),
    ]
    cache = frozen.manifest.components[2]
    assert cache.notes == ["redis-cli SAVE: OK"]

    with DockerEnvironment(timetrack, spec=spec, client=docker_client, health_deadline_s=180) as env2:
        trial = env2.trial_id
        assert psql(env2, "SELECT count(*) FROM pg_tables WHERE tablename = 't'") == "0"
        E.restore(store, frozen.manifest_key, env2)
        assert psql(env2, "SELECT string_agg(x || note, ',' ORDER BY x) FROM t") == "1a,2b,3c"
        assert redis(env2, "GET", "k") == "v1" and redis(env2, "LRANGE", "l", "0", "-1").split() == ["x", "y"]
        assert env2.exec("cat /var/cache/app/c.txt", 30).stdout == "cached\n"
        # the configured password still works over TCP, and the app container reaches both
        r = env2.container("db").exec_run(
            ["psql", "-X", "-tA", "-h", "db", "-U", "appu", "-d", "appdb", "-c", "SELECT 1"],
            environment={"PGPASSWORD": "apppw"},
        )
        assert r.exit_code == 0 and r.output.strip() == b"1", r.output
    # the helper container that emptied the volumes is gone with the trial
    assert docker_client.containers.list(all=True, filters={"label": f"{L_TRIAL}={trial}"}) == []


# --- content addressing and integrity --------------------------------------------------------------------
def frozen_local(task, store, tmp_path):
    env = LocalEnvironment(task)
    env.start()
    oracle_rollout(env, task)
    db = env.db_path
    with sqlite3.connect(db) as con:
        con.execute("CREATE TABLE t (x)")
        con.executemany("INSERT INTO t VALUES (?)", [(i,) for i in range(100)])
    return env, E.freeze(env, task, store)


def test_freezing_twice_stores_nothing_new_but_the_manifest(timetrack, lake, tmp_path):
    store = lake
    env, first = frozen_local(timetrack, store, tmp_path)
    try:
        second = E.freeze(env, timetrack, store)
    finally:
        env.stop()
    assert first.new_objects == 3  # workspace, sqlite, manifest
    assert first.manifest.object_keys() == second.manifest.object_keys()
    assert second.new_objects == 1 and second.new_bytes == len(store.get(second.manifest_key))
    objects = store.list("objects/")
    assert len(objects) == 4 and set(first.object_keys) | set(second.object_keys) == set(objects)
    for key in objects:  # content-addressed: the key is the hash of the bytes
        import hashlib

        assert key == E.object_key(hashlib.sha256(store.get(key)).hexdigest())


def test_a_corrupt_or_missing_object_is_detected_before_anything_is_restored(timetrack, lake, tmp_path):
    store = lake
    env, frozen = frozen_local(timetrack, store, tmp_path)
    env.stop()
    ws_key = frozen.manifest.components[0].blob.key
    good = store.get(ws_key)
    store.put(ws_key, good[:-1] + bytes([good[-1] ^ 1]))
    with LocalEnvironment(timetrack) as env2:
        with pytest.raises(E.BlobCorrupt, match="corrupt"):
            E.restore(store, frozen.manifest_key, env2)
        assert list(env2.workspace_dir.iterdir()) in ([], [env2.workspace_dir / "data"])
        store.delete([ws_key])
        with pytest.raises(E.BlobMissing, match="missing"):
            E.restore(store, frozen.manifest_key, env2)
        store.put(ws_key, good)
        manifest = store.get(frozen.manifest_key)
        store.put(frozen.manifest_key, manifest.replace(b'"local"', b'"docker"'))
        with pytest.raises(E.BlobCorrupt):
            E.restore(store, frozen.manifest_key, env2)
        store.put(frozen.manifest_key, manifest)
        E.restore(store, frozen.manifest_key, env2)
        with sqlite3.connect(env2.db_path) as con:
            assert con.execute("SELECT count(*), sum(x) FROM t").fetchone() == (100, 4950)
    assert issubclass(E.BlobCorrupt, E.EndStateError) and E.EndStateError("x").retryable


def test_symlinks_are_stored_as_links_and_never_followed(timetrack, store, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("host secret, never stored")
    (outside / "dir").mkdir()
    (outside / "dir" / "inner.txt").write_text("inner, never stored")
    with LocalEnvironment(timetrack) as env:
        ws = env.workspace_dir
        (ws / "real.txt").write_text("in the workspace")
        (ws / "to_file").symlink_to(outside / "secret.txt")
        (ws / "to_dir").symlink_to(outside / "dir")
        (ws / "to_root").symlink_to("/")
        (ws / "relative").symlink_to("real.txt")
        (ws / "dangling").symlink_to("../nowhere")
        (ws / "hard.txt").hardlink_to(ws / "real.txt")
        frozen = E.freeze(env, timetrack, store)
    blob = store.get(frozen.manifest.components[0].blob.key)
    import gzip

    raw = gzip.decompress(blob)
    assert b"never stored" not in raw
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert all(not n.startswith(("to_dir/", "to_root/")) for n in members)
    assert members["to_file"].issym() and members["to_file"].linkname == str(outside / "secret.txt")
    assert members["to_root"].issym() and members["to_root"].linkname == "/"
    assert members["real.txt"].islnk() and members["real.txt"].linkname == "hard.txt"  # hard links stay links

    with LocalEnvironment(timetrack) as env2:
        E.restore(store, frozen.manifest_key, env2)
        ws2 = env2.workspace_dir
        assert (ws2 / "to_file").is_symlink() and (ws2 / "to_file").readlink() == outside / "secret.txt"
        assert (ws2 / "to_dir").is_symlink() and (ws2 / "to_root").readlink() == Path("/")
        assert (ws2 / "dangling").is_symlink() and (ws2 / "relative").read_text() == "in the workspace"
        assert (ws2 / "hard.txt").stat().st_ino == (ws2 / "real.txt").stat().st_ino


@pytest.mark.parametrize(
    "second",
    [
        ("file", "esc/pwned", "below the symlink"),
        ("hardlink", "esc/passwd", "leaves the destination"),
        ("file", "../pwned", "leaves the destination"),
        ("file", "/pwned", "leaves the destination"),
    ],
)
def test_a_tar_that_writes_through_a_symlink_or_outside_is_refused(tmp_path, second):
    kind, name, error = second
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        link = tarfile.TarInfo("esc")
        link.type, link.linkname = tarfile.SYMTYPE, str(tmp_path / "victim")
        tar.addfile(link)
        entry = tarfile.TarInfo("x" if kind == "hardlink" else name)
        if kind == "hardlink":
            entry.type, entry.linkname = tarfile.LNKTYPE, name
            tar.addfile(entry)
        else:
            entry.size = 1
            tar.addfile(entry, io.BytesIO(b"x"))
    (tmp_path / "victim").mkdir()
    (tmp_path / "victim" / "passwd").write_text("victim")
    (tmp_path / "dest").mkdir()
    with pytest.raises(E.BlobCorrupt, match=error):
        E.untar_tree(buf.getvalue(), tmp_path / "dest")
    assert sorted(p.name for p in (tmp_path / "victim").iterdir()) == ["passwd"]
    assert list((tmp_path / "dest").iterdir()) == []  # checked before anything is written


class StateDirDatabase(LocalEnvironment):
    """A local environment that keeps its SQLite file outside the workspace, in its state folder."""

    @property
    def db_dsn(self):
        return f"sqlite:///{self.state_dir / 'app.db'}"


def test_a_sqlite_file_outside_the_workspace_is_its_own_component(timetrack, store):
    with StateDirDatabase(timetrack) as env:
        oracle_rollout(env, timetrack)
        path = env.state_dir / "app.db"
        con = sqlite3.connect(path)
        con.execute("PRAGMA journal_mode=WAL")
        con.execute("CREATE TABLE t (x)")
        con.execute("INSERT INTO t VALUES (42)")
        con.commit()  # committed to the WAL, not checkpointed; the connection stays open
        frozen = E.freeze(env, timetrack, store)
        con.close()
    sqlite = next(c for c in frozen.manifest.components if c.kind == "sqlite")
    assert sqlite.location == "outside" and sqlite.path == str(path)
    with StateDirDatabase(timetrack) as env2:
        E.restore(store, frozen, env2)
        with sqlite3.connect(env2.state_dir / "app.db") as con:
            assert con.execute("SELECT x FROM t").fetchall() == [(42,)]
        assert not (env2.workspace_dir / "app.db").exists()


def test_restore_refuses_another_backend(timetrack, store, tmp_path):
    env, frozen = frozen_local(timetrack, store, tmp_path)
    env.stop()
    manifest = frozen.manifest.model_copy(update={"backend": "docker"})
    with LocalEnvironment(timetrack) as env2, pytest.raises(E.EndStateError, match="backend 'docker'"):
        E.restore(store, manifest, env2)


# --- the lake ------------------------------------------------------------------------------------------------
def test_end_states_rows_and_vacuum_keep_referenced_objects(timetrack, store, tmp_path):
    env, frozen = frozen_local(timetrack, store, tmp_path)
    env.stop()
    row = E.end_state_row(frozen, sweep_id="sw", trial_id="t1", agent="oracle", attempt=0)
    info = L.TrialInfo(sweep_id="sw", trial_id="t1", task_id="timetrack", agent="oracle", attempt=0)
    rows = L.trial_rows(info, None, end_states=[row])
    L.write_trial(store, rows)
    (r,) = L.query(store, "SELECT * FROM end_states").to_pylist()
    assert r["manifest_key"] == frozen.manifest_key and r["backend"] == "local" and r["total_bytes"] > 0
    assert r["restart_source"] == "contract" and r["freeze_s"] == frozen.seconds
    assert sorted(r["object_keys"]) == sorted(frozen.object_keys)
    assert [c["kind"] for c in json.loads(r["components_json"])] == ["workspace", "sqlite"]

    # an object nobody references (an aborted trial's freeze), old enough
    stray, _ = E._Writer(store).put(b"stray bytes")
    referenced = set(frozen.object_keys)
    assert L.vacuum(store, older_than_s=0) == []  # the default never touches objects
    assert set(store.list("objects/")) == referenced | {stray}
    assert L.vacuum(store, older_than_s=0, objects=True) == []  # too young (a week by default)
    assert L.vacuum(store, objects=True, objects_older_than_s=0, dry_run=True) == [stray]
    assert L.vacuum(store, objects=True, objects_older_than_s=0) == [stray]
    assert set(store.list("objects/")) == referenced
    # a deleted trial no longer protects its objects
    assert L.delete_trial(store, "sw", "t1")
    assert sorted(L.vacuum(store, objects=True, objects_older_than_s=0)) == sorted(referenced)


def test_vacuum_cli_objects_option(timetrack, store, tmp_path):
    from typer.testing import CliRunner

    from saasbench.cli.main import app

    E._Writer(store).put(b"stray")
    time.sleep(0.01)
    runner = CliRunner()
    r = runner.invoke(app, ["lake", "vacuum", "--lake", store.uri, "--older-than", "0"])
    assert r.exit_code == 0 and "0 orphan file(s) deleted" in r.output
    r = runner.invoke(app, ["lake", "vacuum", "--lake", store.uri, "--objects", "--objects-older-than", "0"])
    assert r.exit_code == 0 and "1 orphan file(s) deleted" in r.output, r.output
    assert store.list("objects/") == []


def test_shell_command_of_recorded_processes_quotes_and_rewrites():
    recipe = E.RestartRecipe(
        source="processes",
        workspace_path="/tmp/ws-old",
        port=41234,
        processes=[
            E.ProcessInfo(
                pid=10,
                argv=["node", "/tmp/ws-old/server.js", "--port=41234", "it's"],
                cwd="/tmp/ws-old/srv",
                cwd_rel="srv",
                env={"NODE_ENV": "production", "PORT": "41234", "API_KEY": MARKER, "HOME": "/root"},
            ),
            E.ProcessInfo(pid=11, argv=["worker"], cwd="/elsewhere", env={}),
        ],
    )
    assert recipe.shell_command() == (
        '( cd "$SAASBENCH_WORKSPACE"/srv && exec env NODE_ENV=production node "$SAASBENCH_WORKSPACE"/server.js '
        "--port=\"$PORT\" 'it'\"'\"'s' ) &\n( cd /elsewhere && exec worker ) &\nwait"
    )
    assert E.RestartRecipe(source="none", workspace_path="/x").shell_command() is None
