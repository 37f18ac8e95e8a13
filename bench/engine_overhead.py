"""Engine overhead: harness time and memory per primitive beyond the app's own service time.

Runs a synthetic validation DAG (1,500 nodes by default, about the size of the paper's largest
task) through :class:`saasbench.evaluation.engine.Engine` against a fast local HTTP app and compares it with

1. the app's own service time, measured inside the app (``/__bench/stats``: nanoseconds from
   "a complete request is in the buffer" to "the response bytes are built", summed over
   requests; the socket write is left out because on a shared CPU the woken client can preempt
   the app inside ``send()`` and its work would be billed to the app), and
2. a baseline client that replays exactly the same request sequence (method, target, headers
   and body, recorded by the app while the engine ran) with a minimal keep-alive
   ``http.client`` loop; its wall time is the app's service time plus the cheapest possible
   client and the loopback.

Harness time per HTTP primitive = (engine wall - baseline wall) / number of P04 steps run; the
same with process CPU time instead of wall time is printed too (steadier on a noisy VM). The
app's ``--work-us`` delay (a busy loop by default) makes the service time non-trivial: the
1.2x target can only be judged against an app that does some work per request.

Every engine run and every baseline run is a fresh process (like a real ``saasbench run``), so
peak RSS is the run's own; tracemalloc is measured in one extra, untimed run (it slows Python
down several times). The app runs in its own process (unpinned: ``--pin`` gives each its own
CPU, which measured slower on a 2-vCPU VM because every request then crosses CPUs).

Other processes on the machine ruin such timings, so before each measured run the benchmark
waits for a quiet machine, measures the CPU time other processes burnt while it ran
(/proc/stat minus our processes), and repeats a disturbed run (``--retries``); the summary is
the median of the undisturbed runs.

Usage::

    .venv/bin/python bench/engine_overhead.py [--nodes 1500] [--repeats 3] [--work-us 0,1000,5000,10000] [--json out.json]
    .venv/bin/python bench/engine_overhead.py --profile engine.prof     # cProfile one engine run

Speed goals live here with numbers written down (docs/benchmarks.md), never in timed tests.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import http.client
import json
import os
import platform
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

HERE = Path(__file__).resolve()
REPO = HERE.parent.parent
# the project's shared folder sits beside the checkout (as CI lays it out); SAASBENCH_CONFORMANCE overrides it
CONFORMANCE_DIR = (
    Path(os.environ["SAASBENCH_CONFORMANCE"])
    if os.environ.get("SAASBENCH_CONFORMANCE")
    else Path(__file__).resolve().parents[2] / "shared" / "conformance" / "saasbench"
)

TARGETS = {"harness_ms_per_http_primitive": 1.0, "engine_over_service_ratio": 1.2}


# =================================================================================================
# The app: a small asyncio HTTP/1.1 keep-alive server answering fixed-shape JSON.
# =================================================================================================
_REASONS = {
    200: "OK",
    201: "Created",
    204: "No Content",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
}


class BenchApp:
    """Routes of a tiny SaaS-like API; ``work_us`` adds a busy-loop (or sleep) service delay per request."""

    FIRST_ID = 100_000  # created ids never collide with the fixed items (ids below 10,000) read by GET nodes

    def __init__(self) -> None:
        self.work_us = 0
        self.work_mode = "busy"
        self.reset()
        rows = [
            {
                "id": i,
                "name": f"row-{i}",
                "amount": i * 3.5,
                "region": ("eu", "us", "apac")[i % 3],
                "active": i % 2 == 0,
            }
            for i in range(60)
        ]
        self._report = json.dumps({"generated": "2026-01-01T00:00:00Z", "rows": rows, "total": len(rows)}).encode()

    def reset(self) -> None:
        """Forget created items and counters: every run starts from the same app state."""
        self.items: dict[int, dict[str, Any]] = {}
        self.next_id = self.FIRST_ID
        self.requests = 0
        self.service_ns = 0
        self.work_ns = 0  # the part of service_ns spent in the configured delay
        self.per_request_ns: list[int] = []
        self.log: list[list[Any]] = []

    # --- one request -------------------------------------------------------------------------
    def handle(self, method: str, target: str, body: bytes, content_type: str) -> tuple[int, bytes | None]:
        parts = urlsplit(target)
        path = parts.path.rstrip("/") or "/"
        query = parse_qs(parts.query) if parts.query else {}
        work = int(query["work_us"][0]) if "work_us" in query else self.work_us
        if work > 0:
            w0 = time.perf_counter_ns()
            if self.work_mode == "sleep":
                time.sleep(work / 1e6)
            else:
                end = w0 + work * 1000
                while time.perf_counter_ns() < end:
                    pass
            self.work_ns += time.perf_counter_ns() - w0
        segs = path.strip("/").split("/")
        if path in ("/", "/health"):
            return 200, b'{"status":"ok","version":"1.0.0"}'
        if segs[0] != "api" or len(segs) < 2:
            return 404, b'{"error":"not found"}'
        res = segs[1]
        if res == "auth" and method == "POST":
            return (
                200,
                b'{"access_token":"tok-bench-admin","token_type":"bearer","user":{"id":1,"email":"admin@bench.local","role":"admin"}}',
            )
        if res == "users" and len(segs) == 3 and segs[2] == "me":
            return (
                200,
                b'{"id":1,"email":"admin@bench.local","role":"admin","name":"Bench Admin","teams":[{"id":7,"name":"core"}]}',
            )
        if res == "reports":
            return 200, self._report
        if res == "items":
            if len(segs) == 2:
                if method == "GET":
                    page = int(query.get("page", ["1"])[0])
                    data = [self._item(i) for i in range(page * 10, page * 10 + 10)]
                    return 200, json.dumps({"data": data, "total": 250, "page": page, "per_page": 10}).encode()
                if method == "POST":
                    try:
                        doc = json.loads(body or b"{}")
                    except ValueError:
                        return 400, b'{"error":"invalid json"}'
                    self.next_id += 1
                    item = self._item(self.next_id)
                    if isinstance(doc, dict):
                        item.update(doc)
                    item["id"] = self.next_id
                    self.items[self.next_id] = item
                    return 201, json.dumps(item).encode()
                return 405, b'{"error":"method not allowed"}'
            try:
                item_id = int(segs[2])
            except ValueError:
                return 404, b'{"error":"not found"}'
            if method == "GET":
                return 200, json.dumps(self.items.get(item_id) or self._item(item_id)).encode()
            if method in ("PUT", "PATCH"):
                item = dict(self.items.get(item_id) or self._item(item_id))
                try:
                    doc = json.loads(body or b"{}")
                except ValueError:
                    return 400, b'{"error":"invalid json"}'
                if isinstance(doc, dict):
                    item.update(doc)
                item["id"] = item_id
                self.items[item_id] = item
                return 200, json.dumps(item).encode()
            if method == "DELETE":
                self.items.pop(item_id, None)
                return 204, None
        return 404, b'{"error":"not found"}'

    @staticmethod
    def _item(i: int) -> dict[str, Any]:
        return {
            "id": i,
            "name": f"item-{i}",
            "status": "active",
            "priority": i % 5,
            "tags": ["alpha", "beta"],
            "owner": {"id": 1, "email": "admin@bench.local"},
            "created_at": "2026-01-01T00:00:00Z",
        }

    def control(self, method: str, target: str) -> tuple[int, bytes]:
        parts = urlsplit(target)
        q = parse_qs(parts.query)
        if parts.path == "/__bench/reset":
            self.reset()
            return 200, b'{"ok":true}'
        if parts.path == "/__bench/config":
            if "work_us" in q:
                self.work_us = int(q["work_us"][0])
            if "mode" in q:
                self.work_mode = q["mode"][0]
            return 200, json.dumps({"work_us": self.work_us, "mode": self.work_mode}).encode()
        if parts.path == "/__bench/stats":
            out: dict[str, Any] = {"requests": self.requests, "service_ns": self.service_ns, "work_ns": self.work_ns}
            if self.per_request_ns:
                ordered = sorted(self.per_request_ns)
                out["service_us_p50"] = ordered[len(ordered) // 2] / 1000
                out["service_us_p99"] = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] / 1000
                out["service_us_max"] = ordered[-1] / 1000
            if q.get("log") == ["1"]:
                out["log"] = self.log
            return 200, json.dumps(out).encode()
        return 404, b'{"error":"no such control"}'


class _HttpProtocol(asyncio.Protocol):
    def __init__(self, app: BenchApp):
        self.app = app
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport):  # type: ignore[override]
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while self.transport is not None:
            t0 = time.perf_counter_ns()
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            lines = bytes(self.buf[:end]).decode("latin-1").split("\r\n")
            try:
                method, target, version = lines[0].split(" ", 2)
            except ValueError:
                self.transport.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                self.transport.close()
                return
            length, close, ctype = 0, version == "HTTP/1.0", ""
            for line in lines[1:]:
                name, _, value = line.partition(":")
                name = name.strip().lower()
                if name == "content-length":
                    length = int(value)
                elif name == "connection":
                    close = value.strip().lower() == "close"
                elif name == "content-type":
                    ctype = value.strip()
            total = end + 4 + length
            if len(self.buf) < total:
                return
            body = bytes(self.buf[end + 4 : total])
            del self.buf[:total]
            control = target.startswith("/__bench/")
            if control:
                status, payload = self.app.control(method, target)
            else:
                status, payload = self.app.handle(method, target, body, ctype)
            head = f"HTTP/1.1 {status} {_REASONS.get(status, 'OK')}\r\n"
            if payload is None:
                head += "Content-Length: 0\r\n"
            else:
                head += f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
            if close:
                head += "Connection: close\r\n"
            data_out = head.encode() + b"\r\n" + (payload or b"")
            # Service time stops before the write: on a shared CPU the woken client can preempt the
            # app inside send(), and its work would be billed to the app.
            spent = time.perf_counter_ns() - t0
            self.transport.write(data_out)
            if not control:
                self.app.service_ns += spent
                self.app.requests += 1
                self.app.per_request_ns.append(spent)
                # the request as sent (header lines minus Host/Content-Length, which http.client writes itself)
                headers = [
                    ln.split(":", 1)
                    for ln in lines[1:]
                    if ln[:5].lower() != "host:" and ln[:15].lower() != "content-length:"
                ]
                self.app.log.append(
                    [method, target, body.decode("latin-1") if body else None, [[k, v.strip()] for k, v in headers]]
                )
            if close:
                self.transport.close()
                self.transport = None
                return

    def connection_lost(self, exc):  # type: ignore[override]
        self.transport = None


def serve(port: int) -> None:
    async def main() -> None:
        app = BenchApp()
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: _HttpProtocol(app), "127.0.0.1", port, backlog=128)
        actual = server.sockets[0].getsockname()[1]
        print(f"PORT {actual}", flush=True)
        async with server:
            await server.serve_forever()

    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass


class AppProcess:
    """The app in its own process; stopped by its pid at the end."""

    def __init__(self, cpu: int | None = None) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE), "--serve", "--port", "0"], stdout=subprocess.PIPE, text=True
        )
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if not line.startswith("PORT "):
            self.stop()
            raise RuntimeError(f"bench app did not start: {line!r}")
        self.port = int(line.split()[1])
        if cpu is not None and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(self.proc.pid, {cpu})
        self.base_url = f"http://127.0.0.1:{self.port}"
        self._conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)

    def call(self, path: str) -> dict[str, Any]:
        self._conn.request("GET", path)
        resp = self._conn.getresponse()
        return json.loads(resp.read())

    def stop(self) -> None:
        try:
            self._conn.close()
        except Exception:  # noqa: BLE001 - a benchmark cleanup
            pass
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


# =================================================================================================
# The synthetic DAG (canonical format: steps/type, scoring.method/maxScore).
# =================================================================================================
CATEGORIES = {
    "get_assert": ("CRUD", "Read", "linear_crud"),
    "get_status": ("Deployment", "Reachability", "linear_crud"),
    "create": ("CRUD", "Create", "linear_crud"),
    "read_created": ("CRUD", "ReadBack", "multi_step"),
    "update_then_get": ("CRUD", "Update", "multi_step"),
    "report": ("Reports", "Summary", "multi_step"),
    "delete": ("CRUD", "Delete", "cross_entity"),
}
# share of nodes per kind (the real DAGs: ~40-60% are P04+P15+P07, many read back created ids)
MIX = [
    ("get_assert", 0.40),
    ("get_status", 0.14),
    ("create", 0.12),
    ("read_created", 0.10),
    ("update_then_get", 0.10),
    ("report", 0.08),
    ("delete", 0.06),
]


def _p04(method: str, path: str, body: Any = None) -> dict[str, Any]:
    inputs: dict[str, Any] = {"method": method, "path": path}
    if body is not None:
        inputs["body"] = body
        inputs["headers"] = {"Content-Type": "application/json"}
    return {"type": "P04", "inputs": inputs}


def _p15(status: int) -> dict[str, Any]:
    return {"type": "P15", "inputs": {"expected_status": status}}


def _p07(*assertions: tuple[str, Any, str]) -> dict[str, Any]:
    return {
        "type": "P07",
        "inputs": {"assertions": [{"path": p, "expected": e, "operator": o} for p, e, o in assertions]},
    }


def make_dag(n_nodes: int, seed: int = 7, fail_share: float = 0.02) -> dict[str, Any]:
    """A deterministic synthetic DAG of ``n_nodes`` nodes with a realistic primitive mix.

    ~50% of nodes start with P13 (the real DAGs log in first; the identity is cached, so only
    the first login costs a request). ~85% have prerequisites: the health/auth roots, the node
    that created the entity they read, update or delete, and sometimes a recent node (chains).
    ``fail_share`` of nodes (leaves only) carry a wrong expectation, so failure paths run too.
    """
    rng = random.Random(seed)
    kinds, weights = zip(*MIX)
    nodes: list[dict[str, Any]] = [
        {
            "id": "HEALTH",
            "description": "Health endpoint answers 200",
            "prereqs": [],
            "steps": [_p04("GET", "/health"), _p15(200), _p07(("$.status", "ok", "equals"))],
            "scoring": {"category": "Deployment", "subcategory": "Health", "method": "binary", "maxScore": 1},
            "complexity_tier": "linear_crud",
        },
        {
            "id": "AUTH_ADMIN",
            "description": "Admin logs in and reads its profile",
            "prereqs": ["HEALTH"],
            "steps": [
                {"type": "P13", "inputs": {"role": "admin"}},
                _p04("GET", "/api/users/me"),
                _p15(200),
                _p07(("$.role", "admin", "equals"), ("$.email", None, "exists")),
            ],
            "scoring": {"category": "Authentication", "subcategory": "Login", "method": "binary", "maxScore": 2},
            "complexity_tier": "linear_crud",
        },
    ]
    creates: list[tuple[str, int]] = []  # (node id, index) of create nodes, for read-back chains
    passing: list[str] = ["HEALTH", "AUTH_ADMIN"]
    for i in range(len(nodes), n_nodes):
        kind = rng.choices(kinds, weights)[0]
        if kind in ("read_created", "update_then_get", "delete") and not creates:
            kind = "create"
        fail = rng.random() < fail_share and kind not in ("create",)
        node_id = f"N{i:04d}_{kind.upper()}"
        prereqs = ["AUTH_ADMIN"] if rng.random() < 0.7 else ["HEALTH"] if rng.random() < 0.5 else []
        steps: list[dict[str, Any]] = []
        if rng.random() < 0.5:
            steps.append({"type": "P13", "inputs": {"role": "admin"}})
        k = rng.randrange(1, 5000)
        wrong = "not-the-value" if fail else None
        if kind == "get_assert":
            steps += [
                _p04("GET", f"/api/items/{k}"),
                _p15(200),
                _p07(
                    ("$.id", k, "equals"), ("$.name", wrong or f"item-{k}", "equals"), ("$.owner.email", None, "exists")
                ),
            ]
        elif kind == "get_status":
            path = rng.choice(["/health", "/api/items?page=2", "/api/users/me"])
            steps += [_p04("GET", path), _p15(404 if fail else 200)]
        elif kind == "create":
            steps += [
                _p04("POST", "/api/items", {"name": f"bench-{i}", "priority": i % 5, "tags": ["bench", f"n{i}"]}),
                _p15(201),
                _p07(("$.name", f"bench-{i}", "equals"), ("$.id", None, "exists")),
            ]
        elif kind == "read_created":
            src, si = rng.choice(creates[-40:])
            prereqs.append(src)
            steps += [
                _p04("GET", f"/api/items/{{{{{src}.created_id}}}}"),
                _p15(200),
                _p07(("$.name", wrong or f"bench-{si}", "equals"), ("$.tags[0]", "bench", "equals")),
            ]
        elif kind == "update_then_get":
            src, si = rng.choice(creates[-40:])
            prereqs.append(src)
            steps += [
                _p04("PUT", f"/api/items/{{{{{src}.id}}}}", {"status": "archived", "note": f"updated by {node_id}"}),
                _p15(200),
                _p04("GET", f"/api/items/{{{{{src}.id}}}}"),
                _p15(200),
                _p07(("$.status", wrong or "archived", "equals"), ("$.name", f"bench-{si}", "equals")),
            ]
        elif kind == "report":
            steps += [
                _p04("GET", "/api/reports/summary"),
                _p15(200),
                _p07(
                    ("$.total", 60, "equals"),
                    ("$.rows[3].region", wrong or "eu", "equals"),
                    ("$.generated", None, "exists"),
                ),
            ]
        elif kind == "delete":
            src, _ = creates.pop(rng.randrange(max(0, len(creates) - 40), len(creates)))
            prereqs.append(src)
            steps += [_p04("DELETE", f"/api/items/{{{{{src}.id}}}}"), _p15(400 if fail else 204)]
        if rng.random() < 0.25 and len(passing) > 2:  # a chain link to a recent node
            prereqs.append(rng.choice(passing[-30:]))
        method = "weighted" if kind in ("update_then_get", "report") or rng.random() < 0.1 else "binary"
        category, subcategory, tier = CATEGORIES[kind]
        nodes.append(
            {
                "id": node_id,
                "description": f"Synthetic {kind.replace('_', ' ')} check #{i} against the bench app",
                "prereqs": list(dict.fromkeys(prereqs)),
                "steps": steps,
                "scoring": {
                    "category": category,
                    "subcategory": subcategory,
                    "method": method,
                    "maxScore": rng.choice([1, 1, 2, 3, 5]),
                },
                "complexity_tier": tier,
            }
        )
        if not fail:
            passing.append(node_id)
            if kind == "create":
                creates.append((node_id, i))
    return {"meta": {"task_id": "bench_synthetic", "total_nodes": len(nodes)}, "nodes": nodes}


AUTH_PROFILE = {
    "scheme": "bearer",
    "login": {"path": "/api/auth/login", "body": {"email": "{{email}}", "password": "{{password}}"}},
    "users": {"admin": {"email": "admin@bench.local", "password": "bench-pass"}},
}


# =================================================================================================
# Workers (each in a fresh process).
# =================================================================================================
def _vm_rss_mb() -> float:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def _maxrss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def worker_engine(spec: dict[str, Any]) -> dict[str, Any]:
    t_import = time.perf_counter()
    from saasbench.dag import load_dag_data
    from saasbench.evaluation.context import RunContext, RunOptions, Target
    from saasbench.evaluation.engine import Engine, build_report
    from saasbench.primitives.registry import REGISTRY
    from saasbench.services.auth import AuthProfile

    REGISTRY.spec("P04")  # import the built-in primitives now, not inside the timed run
    import_s = time.perf_counter() - t_import

    t = time.perf_counter()
    raw = make_dag(spec["nodes"], seed=spec["seed"])
    gen_s = time.perf_counter() - t
    t = time.perf_counter()
    loaded = load_dag_data(raw, source="<synthetic>")
    load_s = time.perf_counter() - t
    issues = {k: sum(1 for i in loaded.issues if i.kind == k) for k in ("warning", "normalisation")}

    ctx = RunContext(
        Target(base_url=spec["base_url"]), options=RunOptions(), auth_profile=AuthProfile.model_validate(AUTH_PROFILE)
    )
    if spec.get("gc_threshold"):  # an experiment (bench/engine_hotspots.py): freeze the loaded DAG, collect less often
        gc.collect()
        gc.freeze()
        gc.set_threshold(*spec["gc_threshold"])
    engine = Engine(loaded.dag, ctx)
    profile_path = spec.get("profile")
    use_trace = bool(spec.get("tracemalloc"))
    if use_trace:
        import tracemalloc

        tracemalloc.start()
        trace_base = tracemalloc.get_traced_memory()[0]
    gc_pauses: list[float] = []
    gc_start = [0.0]

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            gc_start[0] = time.perf_counter()
        else:
            gc_pauses.append(time.perf_counter() - gc_start[0])

    gc.callbacks.append(on_gc)
    rss_before = _vm_rss_mb()
    maxrss_before = _maxrss_mb()
    cpu0 = time.process_time()
    if profile_path:
        import cProfile

        prof = cProfile.Profile()
        t0 = time.perf_counter()
        prof.enable()
        report = engine.run()
        prof.disable()
        wall = time.perf_counter() - t0
        prof.dump_stats(profile_path)
    else:
        t0 = time.perf_counter()
        report = engine.run()
        wall = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    gc.callbacks.remove(on_gc)
    out: dict[str, Any] = {
        "engine_wall_s": wall,
        "engine_cpu_s": cpu,
        "gc_pause_s": sum(gc_pauses),
        "gc_collections": len(gc_pauses),
        "import_s": import_s,
        "gen_s": gen_s,
        "load_s": load_s,
        "load_issues": issues,
        "rss_before_run_mb": rss_before,
        "maxrss_before_run_mb": maxrss_before,
        "peak_rss_mb": _maxrss_mb(),
        "rss_after_run_mb": _vm_rss_mb(),
    }
    if use_trace:
        current, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        out["tracemalloc_peak_mb"] = (peak - trace_base) / 2**20
        out["tracemalloc_retained_mb"] = (current - trace_base) / 2**20
    t = time.perf_counter()
    build_report(loaded.dag, report.nodes, started_at=report.started_at, elapsed_s=wall, ctx=ctx)
    out["build_report_s"] = time.perf_counter() - t
    t = time.perf_counter()
    report_json = report.model_dump_json()
    out["report_json_s"] = time.perf_counter() - t
    out["report_json_mb"] = len(report_json) / 2**20

    steps_by_type: dict[str, int] = {}
    step_ms_by_type: dict[str, float] = {}
    for node in report.nodes:
        for step in node.steps:
            steps_by_type[step.type] = steps_by_type.get(step.type, 0) + 1
            step_ms_by_type[step.type] = step_ms_by_type.get(step.type, 0.0) + step.duration_ms
    out["steps_by_type"] = steps_by_type
    out["step_ms_by_type"] = step_ms_by_type
    out["nodes_run"] = len(report.nodes)
    out["counts"] = report.summary.counts.model_dump()
    out["task_score"] = report.summary.task_score
    bad = [n for n in report.nodes if n.status.value in ("ERROR", "SKIPPED_DEPENDENCY")]
    failed = [n for n in report.nodes if n.status.value == "FAILED"]
    out["sample_problems"] = [f"{n.id}: {n.status.value}: {n.message[:200]}" for n in (bad[:5] + failed[:3])]
    return out


def worker_baseline(spec: dict[str, Any]) -> dict[str, Any]:
    """Replay the recorded request sequence (method, target, headers, body) on one keep-alive http.client connection."""
    log = json.loads(Path(spec["log_file"]).read_text())
    parts = urlsplit(spec["base_url"])
    bodies = [
        (m, target, body.encode("latin-1") if body is not None else None, dict(headers))
        for m, target, body, headers in log
    ]
    rss_before = _vm_rss_mb()
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    statuses = 0
    for method, target, body, headers in bodies:
        conn.putrequest(method, target, skip_accept_encoding=True)
        for name, value in headers.items():
            conn.putheader(name, value)
        if body is not None or method in ("POST", "PUT", "PATCH"):
            conn.putheader("Content-Length", str(len(body or b"")))
        conn.endheaders(body)
        resp = conn.getresponse()
        resp.read()
        statuses += resp.status < 500
    conn.close()
    wall = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    return {
        "baseline_wall_s": wall,
        "baseline_cpu_s": cpu,
        "requests": len(bodies),
        "ok": statuses,
        "rss_before_run_mb": rss_before,
        "peak_rss_mb": _maxrss_mb(),
    }


# --- how busy the machine is besides us (other users' test runs make timings meaningless) ----------
_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _system_busy_s() -> float:
    """CPU seconds all CPUs spent non-idle since boot (/proc/stat), or NaN off Linux."""
    try:
        vals = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]
    except (OSError, ValueError, IndexError):
        return float("nan")
    return (sum(vals) - vals[3] - vals[4]) / _CLK_TCK


def _pid_cpu_s(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _CLK_TCK
    except (OSError, ValueError, IndexError):
        return float("nan")


def _children_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _self_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


class ForeignLoad:
    """CPU seconds burnt by processes other than ours while a measured worker ran."""

    def __init__(self, app_pid: int):
        self.app_pid = app_pid

    def __enter__(self) -> "ForeignLoad":
        self.t0 = time.perf_counter()
        self.busy0, self.app0, self.kids0, self.me0 = (
            _system_busy_s(),
            _pid_cpu_s(self.app_pid),
            _children_cpu_s(),
            _self_cpu_s(),
        )
        return self

    def __exit__(self, *exc: Any) -> None:
        ours = (_pid_cpu_s(self.app_pid) - self.app0) + (_children_cpu_s() - self.kids0) + (_self_cpu_s() - self.me0)
        self.wall = time.perf_counter() - self.t0
        self.foreign_s = max(0.0, (_system_busy_s() - self.busy0) - ours)


def wait_until_quiet(threshold: float, timeout_s: float, log) -> float:
    """Wait (up to timeout_s) until other processes use under ``threshold`` of one CPU; returns that share."""
    deadline = time.monotonic() + timeout_s
    warned = False
    quiet_samples = 0
    while True:
        b0, t0 = _system_busy_s(), time.perf_counter()
        time.sleep(0.5)
        share = (_system_busy_s() - b0) / (time.perf_counter() - t0)
        if not share == share:  # NaN: not Linux, do not wait
            return share
        quiet_samples = quiet_samples + 1 if share < threshold else 0
        if quiet_samples >= 2 or time.monotonic() > deadline:  # quiet for a second, or give up
            if share >= threshold:
                log(f"    machine still busy ({share:.2f} CPUs in use by others); measuring anyway")
            return share
        if not warned and share >= threshold:
            log(f"    machine busy ({share:.2f} CPUs in use by other processes); waiting up to {timeout_s:.0f}s")
            warned = True


def _pin(spec: dict[str, Any]) -> None:
    if spec.get("cpu") is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {int(spec["cpu"])})


def run_worker(kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, str(HERE), "--worker", kind, json.dumps(spec)],
        capture_output=True,
        text=True,
        cwd=str(REPO),
        timeout=3600,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{kind} worker failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# =================================================================================================
# Loader timing on the five conformance DAGs.
# =================================================================================================
def time_conformance_loads(repeats: int) -> list[dict[str, Any]]:
    from saasbench.dag import DagLoadError, load_dag

    out: list[dict[str, Any]] = []
    if not CONFORMANCE_DIR.is_dir():
        return out
    for path in sorted(CONFORMANCE_DIR.glob("*/dag.json")):
        times: list[float] = []
        nodes, issues, error = 0, 0, None
        for _ in range(max(1, repeats)):
            t = time.perf_counter()
            try:
                res = load_dag(path)
            except DagLoadError as exc:
                error = f"{len(exc.issues)} load errors"
                times.append(time.perf_counter() - t)
                continue
            times.append(time.perf_counter() - t)
            nodes, issues = len(res.dag.nodes), len(res.issues)
        out.append(
            {
                "dag": path.parent.name,
                "bytes": path.stat().st_size,
                "nodes": nodes,
                "issues": issues,
                "error": error,
                "min_ms": min(times) * 1000,
                "median_ms": statistics.median(times) * 1000,
                "us_per_node": (min(times) * 1e6 / nodes) if nodes else None,
            }
        )
    return out


# =================================================================================================
# Orchestration and output.
# =================================================================================================
def _med(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def bench_level(app: AppProcess, args: argparse.Namespace, work_us: int, tmp: Path, log) -> dict[str, Any]:
    app.call(f"/__bench/config?work_us={work_us}&mode={args.work_mode}")
    cpu = 0 if args.pin else None
    runs: list[dict[str, Any]] = []
    attempts = args.repeats + args.retries
    for r in range(attempts):
        if sum(1 for x in runs if x["clean"]) >= args.repeats:
            break
        app.call("/__bench/reset")
        idle_before = wait_until_quiet(args.quiet_threshold, args.quiet_timeout, log)
        with ForeignLoad(app.proc.pid) as fl_engine:
            eng = run_worker("engine", {"nodes": args.nodes, "seed": args.seed, "base_url": app.base_url, "cpu": cpu})
        stats = app.call("/__bench/stats?log=1")
        log_file = tmp / f"log_{work_us}_{r}.json"
        log_file.write_text(json.dumps(stats.pop("log")))
        app.call("/__bench/reset")
        wait_until_quiet(args.quiet_threshold, args.quiet_timeout, log)
        with ForeignLoad(app.proc.pid) as fl_base:
            base = run_worker("baseline", {"base_url": app.base_url, "log_file": str(log_file), "cpu": cpu})
        bstats = app.call("/__bench/stats")
        http_prims = eng["steps_by_type"].get("P04", 0)
        steps = sum(eng["steps_by_type"].values())
        run = {
            **eng,
            "baseline_wall_s": base["baseline_wall_s"],
            "baseline_cpu_s": base["baseline_cpu_s"],
            "baseline_peak_rss_mb": base["peak_rss_mb"],
            "requests": stats["requests"],
            "baseline_requests": base["requests"],
            "service_s": stats["service_ns"] / 1e9,
            "baseline_service_s": bstats["service_ns"] / 1e9,
            "app_stats": stats,
            "app_stats_baseline": bstats,
            "http_primitives": http_prims,
            "steps": steps,
            "busy_cpus_before": idle_before,
            "foreign_cpu_s_engine": fl_engine.foreign_s,
            "foreign_cpu_s_baseline": fl_base.foreign_s,
            # clean: other processes used under 5% of a CPU while the engine and the baseline ran
            "clean": fl_engine.foreign_s <= 0.05 + 0.05 * fl_engine.wall
            and fl_base.foreign_s <= 0.05 + 0.05 * fl_base.wall,
        }
        extra_s = run["engine_wall_s"] - run["baseline_wall_s"]
        run["harness_ms_per_http_primitive"] = extra_s * 1000 / max(1, http_prims)
        run["harness_ms_per_step"] = extra_s * 1000 / max(1, steps)
        run["harness_cpu_ms_per_http_primitive"] = (
            (run["engine_cpu_s"] - run["baseline_cpu_s"]) * 1000 / max(1, http_prims)
        )
        run["ratio_engine_over_service"] = run["engine_wall_s"] / run["service_s"] if run["service_s"] else float("inf")
        run["ratio_engine_over_undisturbed_service"] = (
            run["engine_wall_s"] / run["baseline_service_s"] if run["baseline_service_s"] else float("inf")
        )
        run["ratio_engine_over_baseline"] = run["engine_wall_s"] / run["baseline_wall_s"]
        run["ratio_baseline_over_service"] = (
            run["baseline_wall_s"] / run["baseline_service_s"] if run["baseline_service_s"] else float("inf")
        )
        # engine/service <= 1.2 needs service S per request >= (engine - service) per request / 0.2, if that cost stayed as it is here
        run["service_ms_per_request_for_target"] = (
            (run["engine_wall_s"] - run["service_s"])
            * 1000
            / max(1, run["requests"])
            / (TARGETS["engine_over_service_ratio"] - 1)
        )
        run["outside_steps_ms"] = run["engine_wall_s"] * 1000 - sum(eng["step_ms_by_type"].values())
        runs.append(run)
        log(
            f"  work_us={work_us} attempt {r + 1}/{attempts} ({'clean' if run['clean'] else 'DISTURBED'}): engine {run['engine_wall_s']:.3f}s (cpu {run['engine_cpu_s']:.3f}s), "
            f"baseline {run['baseline_wall_s']:.3f}s, app service {run['service_s']:.3f}s, {run['requests']} requests, "
            f"{run['harness_ms_per_http_primitive']:.3f} ms/HTTP primitive; other processes used {fl_engine.foreign_s:.2f} CPU-s "
            f"during the engine worker, {fl_base.foreign_s:.2f} during the baseline"
        )
    keys = [
        "engine_wall_s",
        "engine_cpu_s",
        "baseline_wall_s",
        "baseline_cpu_s",
        "service_s",
        "baseline_service_s",
        "harness_ms_per_http_primitive",
        "harness_ms_per_step",
        "harness_cpu_ms_per_http_primitive",
        "ratio_engine_over_service",
        "ratio_engine_over_undisturbed_service",
        "ratio_engine_over_baseline",
        "ratio_baseline_over_service",
        "peak_rss_mb",
        "rss_before_run_mb",
        "baseline_peak_rss_mb",
        "load_s",
        "import_s",
        "build_report_s",
        "report_json_s",
        "outside_steps_ms",
        "gc_pause_s",
        "gc_collections",
        "foreign_cpu_s_engine",
        "foreign_cpu_s_baseline",
        "service_ms_per_request_for_target",
    ]
    clean = [r for r in runs if r["clean"]]
    used = clean or runs
    summary = {
        k: {"median": _med([r[k] for r in used]), "min": min(r[k] for r in used), "max": max(r[k] for r in used)}
        for k in keys
    }
    first = used[0]
    warnings = []
    if len(clean) < args.repeats:
        warnings.append(
            f"only {len(clean)} of {len(runs)} runs were undisturbed by other processes; "
            + ("the summary uses all runs" if not clean else "the summary uses the undisturbed ones")
        )
    if len({r["requests"] for r in runs}) > 1:
        warnings.append(
            f"request counts differ between repeats: {[r['requests'] for r in runs]} (the app state leaked between runs?)"
        )
    if any(r["requests"] != r["baseline_requests"] for r in runs):
        warnings.append("the baseline did not replay every request")
    step_ms_per_type = {
        t: _med([r["step_ms_by_type"][t] / r["steps_by_type"][t] for r in used]) for t in first["steps_by_type"]
    }
    return {
        "work_us": work_us,
        "work_mode": args.work_mode,
        "summary": summary,
        "runs": runs,
        "warnings": warnings,
        "clean_runs": len(clean),
        "runs_in_summary": len(used),
        "requests": first["requests"],
        "http_primitives": first["http_primitives"],
        "steps": first["steps"],
        "steps_by_type": first["steps_by_type"],
        "mean_step_ms_by_type": step_ms_per_type,
        "counts": first["counts"],
        "sample_problems": first["sample_problems"],
    }


def machine_info() -> dict[str, Any]:
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "loadavg_at_start": os.getloadavg(),
    }


def print_tables(result: dict[str, Any]) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # pragma: no cover
        print(json.dumps(result, indent=2, default=str))
        return
    con = Console(width=max(170, Console().width))
    m = result["machine"]
    con.print(
        f"[bold]engine overhead[/] nodes={result['nodes']} repeats={result['repeats']} nproc={m['nproc']} python={m['python']} "
        f"cpu={m['cpu']} loadavg={m['loadavg_at_start']}"
    )

    def f(s: dict[str, Any], k: str, fmt: str = "{:.3f}") -> str:
        return f"{fmt.format(s[k]['median'])} [{fmt.format(s[k]['min'])}..{fmt.format(s[k]['max'])}]"

    t = Table(title="Engine vs the app's own service time (median of the undisturbed runs [min..max])")
    for col in (
        "app work/req µs",
        "runs",
        "requests",
        "P04",
        "steps",
        "engine wall s",
        "baseline wall s",
        "app service s",
        "harness ms/P04 (wall)",
        "harness ms/P04 (cpu)",
        "engine/service",
        "engine/baseline",
        "1.2x needs ms/req",
    ):
        t.add_column(col, justify="right")
    for lvl in result["levels"]:
        s = lvl["summary"]
        t.add_row(
            str(lvl["work_us"]),
            f"{lvl['runs_in_summary']}" + ("" if lvl["clean_runs"] else " (disturbed)"),
            str(lvl["requests"]),
            str(lvl["http_primitives"]),
            str(lvl["steps"]),
            f(s, "engine_wall_s"),
            f(s, "baseline_wall_s"),
            f(s, "service_s"),
            f(s, "harness_ms_per_http_primitive"),
            f(s, "harness_cpu_ms_per_http_primitive"),
            f(s, "ratio_engine_over_service", "{:.2f}"),
            f(s, "ratio_engine_over_baseline", "{:.2f}"),
            f"{s['service_ms_per_request_for_target']['median']:.1f}",
        )
    con.print(t)
    lvl0 = result["levels"][0]
    s0 = lvl0["summary"]
    t2 = Table(
        title=f"Mean step duration by primitive, app work {lvl0['work_us']} µs (report step records; P04 includes the app)"
    )
    t2.add_column("primitive")
    t2.add_column("count", justify="right")
    t2.add_column("mean ms", justify="right")
    for code, ms in sorted(lvl0["mean_step_ms_by_type"].items()):
        t2.add_row(code, str(lvl0["steps_by_type"][code]), f"{ms:.3f}")
    t2.add_row(
        "outside steps, per node",
        str(lvl0["runs"][0]["nodes_run"]),
        f"{s0['outside_steps_ms']['median'] / max(1, lvl0['runs'][0]['nodes_run']):.3f}",
    )
    con.print(t2)
    mem = result.get("memory") or {}
    other = Table(title=f"Other numbers (app work {lvl0['work_us']} µs; medians)")
    other.add_column("what")
    other.add_column("value", justify="right")
    st = lvl0["runs"][0]["app_stats"]
    bst = lvl0["runs"][0]["app_stats_baseline"]
    other.add_row(
        "CPU-s used by other processes during engine / baseline workers",
        f"{s0['foreign_cpu_s_engine']['median']:.2f} / {s0['foreign_cpu_s_baseline']['median']:.2f}",
    )
    other.add_row("node statuses", ", ".join(f"{k}={v}" for k, v in lvl0["counts"].items() if v))
    other.add_row(
        "app service per request p50 / p99 µs (engine run)",
        f"{st.get('service_us_p50', 0):.0f} / {st.get('service_us_p99', 0):.0f}",
    )
    other.add_row(
        "app service per request p50 / p99 µs (baseline run)",
        f"{bst.get('service_us_p50', 0):.0f} / {bst.get('service_us_p99', 0):.0f}",
    )
    other.add_row(
        "baseline client wall per request µs", f"{s0['baseline_wall_s']['median'] * 1e6 / max(1, lvl0['requests']):.0f}"
    )
    other.add_row("load_dag_data, synthetic DAG ms", f"{s0['load_s']['median'] * 1000:.1f}")
    other.add_row("import saasbench + primitives ms (once per process)", f"{s0['import_s']['median'] * 1000:.1f}")
    other.add_row("build_report ms (inside engine wall)", f"{s0['build_report_s']['median'] * 1000:.1f}")
    other.add_row("report.model_dump_json ms (not in engine wall)", f"{s0['report_json_s']['median'] * 1000:.1f}")
    other.add_row(
        "GC pauses during run: total ms / collections",
        f"{s0['gc_pause_s']['median'] * 1000:.1f} / {s0['gc_collections']['median']:.0f}",
    )
    other.add_row(
        "RSS before run / peak RSS MB (engine process)",
        f"{s0['rss_before_run_mb']['median']:.1f} / {s0['peak_rss_mb']['median']:.1f}",
    )
    other.add_row("peak RSS MB (baseline process)", f"{s0['baseline_peak_rss_mb']['median']:.1f}")
    if mem:
        other.add_row("tracemalloc peak during run MB", f"{mem['tracemalloc_peak_mb']:.2f}")
        other.add_row(
            "tracemalloc retained after run MB (report + run context)", f"{mem['tracemalloc_retained_mb']:.2f}"
        )
        other.add_row(
            "tracemalloc peak per node / per step KB",
            f"{mem['tracemalloc_peak_mb'] * 1024 / max(1, lvl0['runs'][0]['nodes_run']):.1f} / {mem['tracemalloc_peak_mb'] * 1024 / max(1, lvl0['steps']):.1f}",
        )
        other.add_row("report.json size MB", f"{mem['report_json_mb']:.2f}")
    con.print(other)
    for lvl in result["levels"]:
        for w in lvl["warnings"]:
            con.print(f"[red]warning[/] work_us={lvl['work_us']}: {w}")
    if result["conformance_loads"]:
        t3 = Table(title="load_dag on the conformance DAGs")
        for col in ("dag", "KB", "nodes", "issues", "min ms", "median ms", "µs/node"):
            t3.add_column(col, justify="right")
        for row in result["conformance_loads"]:
            t3.add_row(
                row["dag"],
                f"{row['bytes'] / 1024:.0f}",
                str(row["nodes"]),
                str(row["issues"]) if not row["error"] else row["error"],
                f"{row['min_ms']:.1f}",
                f"{row['median_ms']:.1f}",
                f"{row['us_per_node']:.0f}" if row["us_per_node"] else "-",
            )
        con.print(t3)
    else:
        con.print(f"(conformance DAGs not found under {CONFORMANCE_DIR}; loader timing skipped)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=1500)
    ap.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="undisturbed runs wanted per app work level (the summary is their median)",
    )
    ap.add_argument(
        "--retries", type=int, default=4, help="extra attempts per level when other processes disturbed a run"
    )
    ap.add_argument(
        "--work-us", default="0,1000,5000,10000", help="comma-separated app service delays per request (microseconds)"
    )
    ap.add_argument("--work-mode", choices=["busy", "sleep"], default="busy")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument(
        "--pin",
        action="store_true",
        help="pin the app to CPU 1 and the client to CPU 0 (measured slower on a 2-core VM: cross-CPU wake-ups)",
    )
    ap.add_argument("--json", dest="json_out", help="write every number here")
    ap.add_argument(
        "--quiet-threshold",
        type=float,
        default=0.3,
        help="before each measured run wait until other processes use under this many CPUs",
    )
    ap.add_argument(
        "--quiet-timeout",
        type=float,
        default=120.0,
        help="how long to wait for a quiet machine before measuring anyway (s)",
    )
    ap.add_argument("--no-memory", action="store_true", help="skip the extra tracemalloc run")
    ap.add_argument("--load-repeats", type=int, default=5)
    ap.add_argument(
        "--profile", help="cProfile one engine run (first --work-us level) into this file and print the top functions"
    )
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("spec", nargs="?", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.serve:
        serve(args.port)
        return 0
    if args.worker:
        fn = {"engine": worker_engine, "baseline": worker_baseline}[args.worker]
        spec = json.loads(args.spec)
        _pin(spec)
        print(json.dumps(fn(spec)))
        return 0

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    from saasbench.primitives.registry import REGISTRY

    missing = [c for c in ("P04", "P07", "P15", "P13") if REGISTRY.spec(c).fn is None]
    if missing:
        log(f"primitives not available yet: {', '.join(missing)}; the engine run would only measure ERROR nodes")
        return 2
    levels = [int(x) for x in str(args.work_us).split(",") if x.strip()]
    result: dict[str, Any] = {
        "nodes": args.nodes,
        "repeats": args.repeats,
        "seed": args.seed,
        "machine": machine_info(),
        "targets": TARGETS,
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "levels": [],
    }
    app = AppProcess(cpu=1 if args.pin else None)
    try:
        with tempfile.TemporaryDirectory(prefix="saasbench-bench-") as tmpdir:
            tmp = Path(tmpdir)
            # warm the app (its first requests pay for lazy imports and allocator growth)
            app.call("/__bench/config?work_us=0")
            conn = http.client.HTTPConnection("127.0.0.1", app.port)
            for i in range(300):
                conn.request("GET", f"/api/items/{i}")
                conn.getresponse().read()
            conn.close()
            if args.profile:
                app.call(f"/__bench/config?work_us={levels[0]}&mode={args.work_mode}")
                app.call("/__bench/reset")
                out = run_worker(
                    "engine",
                    {
                        "nodes": args.nodes,
                        "seed": args.seed,
                        "base_url": app.base_url,
                        "profile": args.profile,
                        "cpu": 0 if args.pin else None,
                    },
                )
                log(f"profiled engine run: {out['engine_wall_s']:.3f}s (cProfile inflates it); stats in {args.profile}")
                import pstats

                for key in ("tottime", "cumulative"):
                    print(f"--- top by {key} ---")
                    pstats.Stats(args.profile).sort_stats(key).print_stats(30)
                return 0
            for work in levels:
                log(f"work_us={work}:")
                result["levels"].append(bench_level(app, args, work, tmp, log))
            if not args.no_memory:
                app.call("/__bench/config?work_us=0")
                app.call("/__bench/reset")
                mem = run_worker(
                    "engine", {"nodes": args.nodes, "seed": args.seed, "base_url": app.base_url, "tracemalloc": True}
                )
                result["memory"] = {
                    k: mem[k]
                    for k in (
                        "tracemalloc_peak_mb",
                        "tracemalloc_retained_mb",
                        "report_json_mb",
                        "peak_rss_mb",
                        "rss_before_run_mb",
                        "engine_wall_s",
                    )
                }
            result["machine"]["loadavg_at_end"] = os.getloadavg()
    finally:
        app.stop()
    result["conformance_loads"] = time_conformance_loads(args.load_repeats)
    print_tables(result)
    for lvl in result["levels"]:
        s = lvl["summary"]
        ok_h = s["harness_ms_per_http_primitive"]["median"] < TARGETS["harness_ms_per_http_primitive"]
        ok_r = s["ratio_engine_over_service"]["median"] <= TARGETS["engine_over_service_ratio"]
        print(
            f"app work {lvl['work_us']:>6} µs/request: harness {s['harness_ms_per_http_primitive']['median']:.3f} ms per P04 "
            f"({'meets' if ok_h else 'misses'} < {TARGETS['harness_ms_per_http_primitive']:g} ms); engine/service "
            f"{s['ratio_engine_over_service']['median']:.2f} ({'meets' if ok_r else 'misses'} <= {TARGETS['engine_over_service_ratio']:g}x)"
        )
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=2, default=str))
        log(f"wrote {args.json_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
