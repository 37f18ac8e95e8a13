"""Docker environment: cold vs warm ``env up`` of an unchanged task (issue: "the second ``env up``
of an unchanged task spends no time building; report cold and warm times").

What one run does, on a private ``dockerd`` (the approach of ``tests/dockerd.py``: temporary data
root, overlay2 else vfs, no iptables, stopped by its PID at the end) or on the host engine when
``/var/run/docker.sock`` answers:

1. **Base image.** ``infra/base-image/build.sh --tar-only`` finds the cached debootstrap tarball
   (``~/.cache/saasbench/base-image``), then ``saasbench/debian-python:bookworm`` is imported from
   it (cold: the engine does not have it) and looked up again (warm: already present, what the test
   fixture and ``build.sh`` do before importing). On the host engine with the image already
   present the cold import is skipped, never forced.
2. **A small task service image.** A build context in a temporary folder: ``FROM
   saasbench/debian-python:bookworm``, ``COPY`` the timetrack reference app, ``RUN`` a small step
   (``python3 -m compileall``). The service spec is ``build: <context>`` with a **fresh**
   image-cache dir, so ``DockerEnvironment.start`` goes through ``ImageCache.ensure``.
3. **Trials.** One cold and ``--warm`` (default 3) warm ``env up`` of the ``timetrack`` task with
   that spec, each a new :class:`~saasbench.environments.docker.DockerEnvironment`: ``start()`` (ensure,
   network, container create/start, shell probe, host proxy), the ``oracle`` agent (copies the
   reference into the workspace, runs ``reference.install``), :func:`~saasbench.environments.base.start_app`
   (``bash run.sh`` as a service, then the health wait on ``/api/health``), one ``GET`` of the
   health URL, and ``stop()`` (teardown). ``ImageCache.ensure`` is wrapped to time it, and
   ``builds.jsonl`` is counted before and after each trial: every warm trial must add **0** builds
   (the script exits 1 otherwise).

Usage::

    .venv/bin/python bench/env_bench.py [--warm 3] [--json /tmp/env_bench.json]

Needs root (dockerd, the loopback proxy) and ``docker.io`` installed. Takes about a minute.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
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

from saasbench.catalog.envspec import BuildSpec, EnvSpec, ServiceSpec
from saasbench.environments.imagecache import ImageCache

BASE_IMAGE = dk.PYTHON_IMAGE
DOCKERFILE = f"""\
FROM {BASE_IMAGE}
COPY app/ /opt/timetrack/
RUN python3 -m compileall -q /opt/timetrack && python3 -c "import sqlite3, http.server" && echo built > /opt/timetrack/.built
"""
PHASES = [  # (key, label)
    ("ensure_s", "ensure (image cache)"),
    ("build_s", "  of which docker build"),
    ("create_start_s", "container create/start"),
    ("oracle_s", "oracle install"),
    ("health_s", "app start + health wait"),
    ("teardown_s", "teardown"),
    ("total_s", "total"),
]


# --- engine --------------------------------------------------------------------------------------
class Engine:
    """The host engine when it answers, else a private dockerd (stopped by PID in close())."""

    def __init__(self) -> None:
        self.proc = None
        self.root: Path | None = None
        self.kind = "host"
        self.start_s = 0.0
        client = None
        if os.path.exists(dk.HOST_SOCKET):
            try:
                client = dk._ping(f"unix://{dk.HOST_SOCKET}")
            except Exception:  # noqa: BLE001 - a stale socket: start our own
                client = None
        if client is None:
            self.kind = "private dockerd"
            self.root = Path(tempfile.mkdtemp(prefix="sbenv-", dir="/tmp"))  # short: unix socket path limit
            t0 = time.perf_counter()
            self.proc, base_url = dk._start_dockerd(self.root)
            self.start_s = time.perf_counter() - t0
            client = dk._ping(base_url)
        self.client = client
        info = client.info()
        self.driver = info.get("Driver", "?")
        self.version = client.version().get("Version", "?")

    def close(self) -> None:
        self.client.close()
        if self.proc is not None:
            dk._stop(self.proc)  # SIGTERM to its PID, then SIGKILL
            assert self.root is not None
            dk._unmount_under(self.root)
            subprocess.run(["rm", "-rf", "--one-file-system", str(self.root)], check=False)


# --- base image ----------------------------------------------------------------------------------
def base_image(client: Any) -> dict[str, Any]:
    import docker.errors

    out: dict[str, Any] = {}
    t0 = time.perf_counter()
    r = subprocess.run(
        ["bash", str(REPO / "infra" / "base-image" / "build.sh"), "--tar-only"],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    out["tarball_lookup_s"] = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"build.sh --tar-only failed ({r.returncode}):\n{r.stderr[-3000:]}")
    tar = r.stdout.strip().splitlines()[-1]
    out["tarball"] = tar
    out["tarball_mb"] = os.path.getsize(tar) / 1e6
    try:
        client.images.get(BASE_IMAGE)
        present = True
    except docker.errors.ImageNotFound:
        present = False
    if present:
        out["cold_import_s"] = None  # host engine already has it: never removed here
    else:
        repo, tag = BASE_IMAGE.split(":")
        t0 = time.perf_counter()
        client.api.import_image_from_file(
            tar,
            repository=repo,
            tag=tag,
            changes=["ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", 'CMD ["bash"]'],
        )
        client.images.get(BASE_IMAGE)
        out["cold_import_s"] = time.perf_counter() - t0
    warm = []
    for _ in range(3):  # the "already present" path: one lookup, no import
        t0 = time.perf_counter()
        client.images.get(BASE_IMAGE)
        warm.append(time.perf_counter() - t0)
    out["present_check_s"] = statistics.median(warm)
    out["image_mb"] = (client.images.get(BASE_IMAGE).attrs.get("Size") or 0) / 1e6
    return out


# --- trials --------------------------------------------------------------------------------------
class EnsureTimer:
    """Wraps ImageCache.ensure (the class attribute, which DockerEnvironment._image_for calls)."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, bool]] = []
        self._orig = ImageCache.ensure
        timer = self

        def ensure(cache_self, *a, **kw):  # type: ignore[no-untyped-def]
            t0 = time.perf_counter()
            ref = timer._orig(cache_self, *a, **kw)
            timer.calls.append((time.perf_counter() - t0, ref.built))
            return ref

        ImageCache.ensure = ensure  # type: ignore[method-assign]

    def restore(self) -> None:
        ImageCache.ensure = self._orig  # type: ignore[method-assign]


def make_context(dest: Path, task: Any) -> Path:
    ctx = dest / "service"
    shutil.copytree(task.reference_dir, ctx / "app", ignore=shutil.ignore_patterns("__pycache__", "data"))
    (ctx / "Dockerfile").write_text(DOCKERFILE, encoding="utf-8")
    (ctx / ".dockerignore").write_text("**/__pycache__\n", encoding="utf-8")
    return ctx


def trial(client: Any, task: Any, spec: EnvSpec, cache_dir: Path, timer: EnsureTimer, label: str) -> dict[str, Any]:
    import httpx

    from saasbench.agents import build_prompt, get_agent
    from saasbench.agents.base import Budget
    from saasbench.environments.base import start_app
    from saasbench.environments.docker import DockerEnvironment

    cache = ImageCache(client, cache_dir=cache_dir)
    builds_before = len(cache.builds())
    timer.calls.clear()
    env = DockerEnvironment(task, spec=spec.model_copy(deep=True), client=client, image_cache_dir=cache_dir)
    row: dict[str, Any] = {"trial": label}
    t_all = time.perf_counter()
    try:
        t0 = time.perf_counter()
        env.start()
        start_s = time.perf_counter() - t0
        row["ensure_s"] = sum(s for s, _ in timer.calls)
        row["create_start_s"] = start_s - row["ensure_s"]
        row["image"] = env.container().image.tags[0] if env.container().image.tags else env.container().image.id
        row["reach"] = env.reach
        agent = get_agent("oracle")
        t0 = time.perf_counter()
        agent.install(env)
        traj = agent.run(build_prompt(task, env), env, Budget(wall_s=task.spec.timeouts.agent_s))
        row["oracle_s"] = time.perf_counter() - t0
        if traj.exit_reason != "completed":
            raise SystemExit(f"{label}: oracle failed: {traj.exit_reason} {traj.error}")
        t0 = time.perf_counter()
        app = start_app(task, env, command=agent.app_start_command(task))
        row["health_s"] = time.perf_counter() - t0
        if not app.ok:
            raise SystemExit(f"{label}: app not healthy: {app.error}\n{app.log_tail}")
        url = env.base_url.rstrip("/") + task.spec.app.health_path
        r = httpx.get(url, timeout=5, trust_env=False)
        row["health_status"] = r.status_code
    finally:
        t0 = time.perf_counter()
        env.stop()
        row["teardown_s"] = time.perf_counter() - t0
    row["total_s"] = time.perf_counter() - t_all
    new = cache.builds()[builds_before:]
    row["new_builds"] = len(new)
    row["build_s"] = sum(float(b["seconds"]) for b in new)
    row["ensure_calls"] = len(timer.calls)
    row["ensure_built"] = [b for _, b in timer.calls]
    return row


# --- report --------------------------------------------------------------------------------------
def machine() -> dict[str, Any]:
    mem = 0
    with open("/proc/meminfo", encoding="utf-8") as fh:
        for line in fh:
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1]) // 1024
    cpu = "?"
    with open("/proc/cpuinfo", encoding="utf-8") as fh:
        for line in fh:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "mem_mib": mem,
        "kernel": platform.release(),
        "python": platform.python_version(),
    }


def fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def print_report(res: dict[str, Any]) -> None:
    m, e, b = res["machine"], res["engine"], res["base_image"]
    print(f"\nmachine: {m['nproc']} vCPU ({m['cpu']}), {m['mem_mib']} MiB, Linux {m['kernel']}, Python {m['python']}")
    print(f"engine:  {e['kind']} (docker {e['version']}, storage {e['driver']}), dockerd start {fmt(e['start_s'])} s")
    print(f"\nbase image {BASE_IMAGE} ({b['image_mb']:.0f} MB; tarball {b['tarball_mb']:.0f} MB)")
    print(f"  tarball lookup (build.sh --tar-only, cached)  {fmt(b['tarball_lookup_s'])} s")
    print(f"  cold import from the tarball                  {fmt(b['cold_import_s'])} s")
    print(f"  already present (lookup, no import)           {fmt(b['present_check_s'])} s")
    cold, warms = res["cold"], res["warm"]
    heads = ["phase (s)", "cold"] + [f"warm {i + 1}" for i in range(len(warms))] + ["warm median"]
    rows = []
    for key, label in PHASES:
        vals = [cold[key]] + [w[key] for w in warms]
        rows.append([label] + [fmt(v) for v in vals] + [fmt(statistics.median(w[key] for w in warms))])
    rows.append(
        ["new builds (builds.jsonl)"]
        + [str(cold["new_builds"])]
        + [str(w["new_builds"]) for w in warms]
        + [str(sum(w["new_builds"] for w in warms))]
    )
    widths = [max(len(str(r[i])) for r in [heads] + rows) for i in range(len(heads))]
    print("\n" + "  ".join(h.ljust(widths[i]) if i == 0 else h.rjust(widths[i]) for i, h in enumerate(heads)))
    for r in rows:
        print("  ".join(c.ljust(widths[i]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(r)))
    print(
        f"\nverdict: warm builds = {res['warm_builds']} -> {'PASS' if res['warm_builds'] == 0 else 'FAIL'}; "
        f"warm ensure median {fmt(res['warm_ensure_median_s'])} s vs cold {fmt(cold['ensure_s'])} s"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--warm", type=int, default=3, help="warm repeats (default 3)")
    ap.add_argument("--json", type=Path, help="write every number to this file")
    args = ap.parse_args(argv)

    from saasbench.catalog.tasks import load_task

    task = load_task("timetrack")
    work = Path(tempfile.mkdtemp(prefix="sbenv-bench-"))
    engine = Engine()
    timer = EnsureTimer()
    pid = engine.proc.pid if engine.proc is not None else None
    print(f"engine: {engine.kind}" + (f" (dockerd pid {pid}, root {engine.root})" if pid else ""), flush=True)
    try:
        res: dict[str, Any] = {
            "machine": machine(),
            "engine": {
                "kind": engine.kind,
                "driver": engine.driver,
                "version": engine.version,
                "start_s": engine.start_s,
            },
            "dockerfile": DOCKERFILE,
        }
        print("base image ...", flush=True)
        res["base_image"] = base_image(engine.client)
        ctx = make_context(work, task)
        cache_dir = work / "imagecache"  # fresh: nothing cached yet
        spec = EnvSpec(services={"app": ServiceSpec(build=BuildSpec(context=str(ctx)))}, base_dir=str(ctx))
        print("cold trial ...", flush=True)
        res["cold"] = trial(engine.client, task, spec, cache_dir, timer, "cold")
        if res["cold"]["new_builds"] != 1:
            print(f"error: the cold trial made {res['cold']['new_builds']} builds (expected 1)", file=sys.stderr)
            return 1
        res["warm"] = []
        for i in range(args.warm):
            print(f"warm trial {i + 1} ...", flush=True)
            res["warm"].append(trial(engine.client, task, spec, cache_dir, timer, f"warm{i + 1}"))
        res["warm_builds"] = sum(w["new_builds"] for w in res["warm"])
        res["warm_ensure_median_s"] = statistics.median(w["ensure_s"] for w in res["warm"])
        res["warm_total_median_s"] = statistics.median(w["total_s"] for w in res["warm"])
        # the built image is removed with the private engine; on the host engine leave the cache tidy
        if engine.kind == "host":
            ImageCache(engine.client, cache_dir=cache_dir).prune(max_age_s=0)
    finally:
        timer.restore()
        engine.close()
        shutil.rmtree(work, ignore_errors=True)
    print_report(res)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(res, indent=2, default=str) + "\n", encoding="utf-8")
        print(f"wrote {args.json}")
    return 0 if res["warm_builds"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
