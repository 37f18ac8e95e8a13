"""Frozen end state: freeze + restore time and end-state size for the demo task, per backend,
against the evaluation's own time (target: freeze + restore under 10 % of the evaluation).

What one repeat does, per backend (``local``, ``docker``), with the ``oracle`` agent on the bundled
demo task ``timetrack``:

1. a fresh environment, the rollout (the oracle copies the reference implementation);
2. **freeze** (``saasbench.runs.endstate.freeze``) into a lake folder: what a trial would do right
   after its rollout;
3. the **evaluation** (``saasbench.runs.trial.evaluate_in``: start the app with the deployment
   contract, run the DAG) in that environment, timed: the reference time;
4. a second freeze, now of a used system (the app's SQLite database holds what the evaluation
   wrote): the size and time of a larger state;
5. a fresh environment, **restore** of the first freeze, the evaluation again: its node statuses
   must equal the live ones (the script exits 1 otherwise);
6. a fresh environment, restore of the second freeze (timed, not evaluated).

``docker+services`` is the docker backend with a PostgreSQL and a Redis service next to the app
(Debian substitutes, ``saasbench/debian-postgres:bookworm``), seeded with 10,000 rows and 1,000
keys before the freeze: the freeze then takes a ``pg_dumpall`` and a paused volume tar, the restore
loads the dump and restarts Redis on its restored volume.

The Docker backends run on a private ``dockerd`` (tests/dockerd.py: temporary data root, overlay2
else vfs, no iptables; stopped by its PID at the end) unless ``/var/run/docker.sock`` answers.

Usage::

    .venv/bin/python bench/endstate.py [--repeats 3] [--backends local,docker] [--json bench/results/endstate.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # tests/dockerd.py: start / stop a private dockerd

import dockerd as dk

from saasbench.catalog.tasks import load_task
from saasbench.dag import load_dag
from saasbench.lake.store import lake_from_uri
from saasbench.runs import endstate as E
from saasbench.runs.trial import evaluate_in, make_environment, resolve_agent, rollout_in, task_budget


class Engine:
    """The host engine when it answers, else a private dockerd (stopped by PID in close())."""

    def __init__(self, services: bool = False) -> None:
        self.proc = None
        self.root: Path | None = None
        self.kind = "host"
        client = None
        if os.path.exists(dk.HOST_SOCKET):
            try:
                client = dk._ping(f"unix://{dk.HOST_SOCKET}")
            except Exception:  # noqa: BLE001 - a stale socket: start our own
                client = None
        if client is None:
            self.kind = "private dockerd"
            self.root = Path(tempfile.mkdtemp(prefix="sbes-", dir="/tmp"))  # short: unix socket path limit
            self.proc, base_url = dk._start_dockerd(self.root)
            client = dk._ping(base_url)
        self.client = client
        dk._debian_image(client, dk.PYTHON_IMAGE)
        if services:
            dk._debian_image(client, dk.POSTGRES_IMAGE, extra_packages="postgresql,redis-server", timeout_s=1800)
        self.driver = client.info().get("Driver", "?")

    def close(self) -> None:
        self.client.close()
        if self.proc is not None:
            dk._stop(self.proc)
            assert self.root is not None
            dk._unmount_under(self.root)
            subprocess.run(["rm", "-rf", "--one-file-system", str(self.root)], check=False)


def statuses(report: Any) -> dict[str, str]:
    return {n.id: n.status.value for n in report.nodes}


# ``docker+services``: the demo task's app next to a PostgreSQL and a Redis service (Debian substitutes of
# infra/image-maps/debian-substitutes.yaml) holding a little data each, so the freeze takes a pg_dumpall
# and a paused volume tar, and the restore loads the dump and restarts Redis on its restored volume.
SERVICES_COMPOSE = """
services:
  app:
    image: {python}
    volumes: ["./workspace:/app"]
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
volumes: {{pgdata: {{}}, rdata: {{}}}}
"""
SEED_SQL = "CREATE TABLE items AS SELECT g AS id, md5(g::text) AS note FROM generate_series(1, 10000) g"


def services_spec(folder: Path) -> Any:
    from saasbench.catalog.envspec import import_compose
    from saasbench.catalog.imagemap import apply_image_map, read_image_map

    (folder / "docker-compose.yml").write_text(SERVICES_COMPOSE.format(python=dk.PYTHON_IMAGE))
    image_map = read_image_map(REPO / "infra" / "image-maps" / "debian-substitutes.yaml")
    return apply_image_map(import_compose(folder / "docker-compose.yml"), image_map)


def environment(task: Any, backend: str, client: Any, spec: Any) -> Any:
    if backend == "docker+services":
        from saasbench.environments.docker import DockerEnvironment

        return DockerEnvironment(task, spec=spec, client=client, health_deadline_s=180)
    return make_environment(task, backend, **({"docker_client": client} if backend == "docker" else {}))


def seed_services(env: Any) -> None:
    r = env.container("db").exec_run(["psql", "-X", "-q", "-U", "appu", "-d", "appdb", "-c", SEED_SQL], user="postgres")
    assert r.exit_code == 0, r.output
    r = env.container("cache").exec_run(
        ["sh", "-c", "for i in $(seq 1 1000); do echo SET key$i value$i; done | redis-cli"]
    )
    assert r.exit_code == 0, r.output


def one_repeat(task: Any, dag: Any, backend: str, store: Any, client: Any, spec: Any = None) -> dict[str, Any]:
    agent = resolve_agent("oracle")
    out: dict[str, Any] = {}
    with environment(task, backend, client, spec) as env:
        if backend == "docker+services":
            seed_services(env)
        ro = rollout_in(env, task, agent, task_budget(task))
        assert ro.outcome == "completed", ro.outcome_detail
        first = E.freeze(env, task, store, agent=agent)
        t0 = time.perf_counter()
        live, app, _ = evaluate_in(env, task, agent, dag)
        out["eval_s"] = time.perf_counter() - t0
        assert app.ok, app.error
        used = E.freeze(env, task, store, agent=agent)
    out["freeze_s"] = first.seconds
    out["bytes"] = first.total_bytes
    out["raw_bytes"] = first.manifest.raw_bytes
    out["components"] = {c.kind: c.blob.bytes if c.blob else 0 for c in first.manifest.components}
    out["used_freeze_s"] = used.seconds
    out["used_bytes"] = used.total_bytes
    out["used_raw_bytes"] = used.manifest.raw_bytes
    out["used_new_bytes"] = used.new_bytes
    with environment(task, backend, client, spec) as env2:
        t0 = time.perf_counter()
        E.restore(store, first.manifest_key, env2)
        out["restore_s"] = time.perf_counter() - t0
        again, app2, _ = evaluate_in(env2, task, agent, dag)
        assert app2.ok, app2.error
    out["statuses_equal"] = statuses(again) == statuses(live)
    out["score"] = (live.summary.deterministic_score, again.summary.deterministic_score)
    with environment(task, backend, client, spec) as env3:
        t0 = time.perf_counter()
        E.restore(store, used.manifest_key, env3)
        out["used_restore_s"] = time.perf_counter() - t0
    out["ratio"] = (out["freeze_s"] + out["restore_s"]) / out["eval_s"]
    out["used_ratio"] = (out["used_freeze_s"] + out["used_restore_s"]) / out["eval_s"]
    return out


def machine() -> dict[str, Any]:
    cpu = "?"
    with open("/proc/cpuinfo", encoding="utf-8") as fh:
        for line in fh:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {"nproc": os.cpu_count(), "cpu": cpu, "kernel": platform.release(), "python": platform.python_version()}


def med(rows: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--backends", default="local,docker,docker+services")
    ap.add_argument("--lake", help="lake URI for the objects (default: a temporary folder)")
    ap.add_argument("--json", type=Path, help="write every number to this file")
    args = ap.parse_args(argv)
    task = load_task("timetrack")
    dag = load_dag(task.dag_path).dag
    res: dict[str, Any] = {"machine": machine(), "task": task.id, "repeats": args.repeats, "backends": {}}
    ok = True
    with tempfile.TemporaryDirectory(prefix="sbes-lake-") as tmp:
        store = lake_from_uri(args.lake or str(Path(tmp) / "lake"))
        for backend in args.backends.split(","):
            engine = Engine(services=backend == "docker+services") if backend.startswith("docker") else None
            spec = services_spec(Path(tmp)) if backend == "docker+services" else None
            try:
                rows = [
                    one_repeat(task, dag, backend, store, engine.client if engine else None, spec)
                    for _ in range(args.repeats)
                ]
            finally:
                if engine is not None:
                    res.setdefault("docker", {"engine": engine.kind, "driver": engine.driver})
                    engine.close()
            ok = ok and all(r["statuses_equal"] for r in rows)
            res["backends"][backend] = {
                "runs": rows,
                "components": rows[0]["components"],
                **{k: med(rows, k) for k in rows[0] if _numeric(rows[0][k])},
            }
    print(f"task {task.id}, {args.repeats} repeat(s), medians; machine {res['machine']}")
    head = (
        "backend | eval s | freeze s | restore s | (freeze+restore)/eval | state bytes (raw) | "
        "used: freeze s | used: restore s | used: ratio | used: bytes (raw) | statuses equal"
    )
    print(head)
    for backend, b in res["backends"].items():
        print(
            f"{backend} | {b['eval_s']:.2f} | {b['freeze_s']:.3f} | {b['restore_s']:.3f} | {100 * b['ratio']:.1f} % | "
            f"{b['bytes']:.0f} ({b['raw_bytes']:.0f}) | {b['used_freeze_s']:.3f} | {b['used_restore_s']:.3f} | "
            f"{100 * b['used_ratio']:.1f} % | {b['used_bytes']:.0f} ({b['used_raw_bytes']:.0f}) | "
            f"{all(r['statuses_equal'] for r in b['runs'])}"
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(res, indent=2, default=str) + "\n", encoding="utf-8")
        print(f"wrote {args.json}")
    return 0 if ok else 1


def _numeric(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


if __name__ == "__main__":
    raise SystemExit(main())
