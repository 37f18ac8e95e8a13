"""Micro-benchmarks behind the hot spots named in docs/benchmarks.md.

Each line times one layer of an HTTP primitive in isolation (best of 3 batches, microseconds per
call), so the engine-overhead numbers of ``bench/engine_overhead.py`` can be attributed:

    .venv/bin/python bench/engine_hotspots.py [--n 3000] [--gc-runs 3]

The HTTP lines talk to the same local app as engine_overhead.py (in its own process); the
others are CPU only. The "cold CPU" lines run the same CPU-only steps right after a sleep (the
harness sleeps in recv() while the app works). ``--gc-runs`` also runs the 1,500-node DAG with the default GC settings and
with the loaded objects frozen and a larger gen-0 threshold, alternating, to size the GC cost.
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import engine_overhead as eo  # noqa: E402


def bench(name: str, fn, n: int, rows: list) -> float:
    fn()
    batches = []
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        batches.append((time.perf_counter() - t) / n * 1e6)
    rows.append((name, min(batches), statistics.median(batches)))
    print(f"{name:62s} {min(batches):9.1f} µs   (median of 3 batches {statistics.median(batches):.1f})", flush=True)
    return min(batches)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=3000)
    ap.add_argument("--gc-runs", type=int, default=3)
    ap.add_argument("--json", dest="json_out")
    args = ap.parse_args()
    n = args.n

    import httpx

    from saasbench.dag import load_dag_data
    from saasbench.evaluation.context import RunContext, RunOptions, Target
    from saasbench.evaluation.engine import Engine, build_report
    from saasbench.evaluation.results import NodeResult, Status, StepRecord
    from saasbench.primitives.registry import REGISTRY
    from saasbench.services.auth import AuthProfile

    REGISTRY.spec("P04")
    rows: list = []
    app = eo.AppProcess()
    try:
        print("-- one GET /api/items/42 over keep-alive loopback (app work 0) --")
        conn = http.client.HTTPConnection("127.0.0.1", app.port)

        def plain() -> None:
            conn.request("GET", "/api/items/42", headers={"Authorization": "Bearer x"})
            json.loads(conn.getresponse().read())

        bench("http.client request + read + json.loads", plain, n, rows)
        raw = httpx.Client()
        bench("httpx.Client.get + .json()", lambda: raw.get(app.base_url + "/api/items/42").json(), n, rows)
        ctx = RunContext(
            Target(base_url=app.base_url),
            options=RunOptions(),
            auth_profile=AuthProfile.model_validate(eo.AUTH_PROFILE),
        )
        engine = Engine(load_dag_data(eo.make_dag(10)).dag, ctx)
        ctx.start_node_clock(3600)
        engine._run_step("P13", {"role": "admin"})
        ident = ctx.auth.active
        bench(
            "saasbench.services.http.HttpClient.request (identity, stream, cap)",
            lambda: ctx.http.request("GET", "/api/items/42", identity=ident, timeout_s=30),
            n,
            rows,
        )
        bench(
            "Engine._run_step P04 GET (resolve + validate + P04)",
            lambda: engine._run_step("P04", {"method": "GET", "path": "/api/items/42"}),
            n,
            rows,
        )

        print("-- CPU only --")
        resp = httpx.Response(
            200,
            headers={"content-type": "application/json"},
            content=b'{"id": 42}',
            request=httpx.Request("GET", app.base_url + "/api/items/42"),
        )
        bench(
            "Identity.cookies.extract_cookies (response without Set-Cookie)",
            lambda: ident.cookies.extract_cookies(resp),
            n,
            rows,
        )
        bench("HttpClient.url (urljoin; called twice per P04)", lambda: ctx.http.url("/api/items/42"), n, rows)
        bench(
            "httpx.Client.build_request GET",
            lambda: ctx.http._client.build_request(
                "GET", app.base_url + "/api/items/42", headers={"Authorization": "Bearer x"}
            ),
            n,
            rows,
        )
        p04 = {"method": "GET", "path": "/api/items/{{C1.id}}"}
        ctx.nodes["C1"] = {"id": 100001, "status": "PASSED"}
        p07 = {
            "assertions": [
                {"path": "$.id", "expected": 42, "operator": "equals"},
                {"path": "$.name", "expected": "item-42", "operator": "equals"},
                {"path": "$.owner.email", "expected": None, "operator": "exists"},
            ]
        }
        s04, s07, s15 = REGISTRY.spec("P04"), REGISTRY.spec("P07"), REGISTRY.spec("P15")
        bench("ctx.resolve(P04 inputs with {{C1.id}})", lambda: {k: ctx.resolve(v) for k, v in p04.items()}, n, rows)
        bench(
            "P04Inputs.model_validate (again at run time)",
            lambda: s04.inputs.model_validate({"method": "GET", "path": "/api/items/1"}),
            n,
            rows,
        )
        bench(
            "P15Inputs.model_validate (again at run time)",
            lambda: s15.inputs.model_validate({"expected_status": 200}),
            n,
            rows,
        )
        bench(
            "P07Inputs.model_validate, 3 assertions (again at run time)",
            lambda: s07.inputs.model_validate(p07),
            n,
            rows,
        )
        engine._run_step("P04", {"method": "GET", "path": "/api/items/42"})
        i07 = s07.inputs.model_validate(p07)
        bench("P07 function, 3 assertions", lambda: s07.fn(i07, ctx), n, rows)
        bench("Engine._run_step P15", lambda: engine._run_step("P15", {"expected_status": 200}), n, rows)
        bench("Engine._run_step P07, 3 assertions", lambda: engine._run_step("P07", p07), n, rows)
        bench("Engine._run_step P13 (cached identity)", lambda: engine._run_step("P13", {"role": "admin"}), n, rows)
        r = engine._run_step("P04", {"method": "GET", "path": "/api/items/42"})
        bench(
            "StepRecord(...) with P04 evidence",
            lambda: StepRecord(
                index=0, type="P04", passed=True, message=r.message, duration_ms=1.0, evidence=r.evidence
            ),
            n,
            rows,
        )
        rec = StepRecord(index=0, type="P04", passed=True, message=r.message, duration_ms=1.0, evidence=r.evidence)
        bench(
            "NodeResult(...) with 4 step records",
            lambda: NodeResult(
                id="N", category="C", method="binary", status=Status.PASSED, score=1, max_score=1, steps=[rec] * 4
            ),
            n,
            rows,
        )
        results = [
            NodeResult(
                id=f"N{i}",
                category="CRUD",
                method="binary",
                complexity_tier="linear_crud",
                status=Status.PASSED,
                score=1,
                max_score=1,
                steps=[rec] * 3,
            )
            for i in range(1500)
        ]
        dag = load_dag_data(eo.make_dag(1500)).dag
        bench(
            "build_report, 1,500 node results",
            lambda: build_report(dag, results, started_at="x", elapsed_s=1.0, ctx=ctx),
            20,
            rows,
        )

        print(
            "-- the same CPU-only work (Engine._run_step P15 + P07) right after the process slept, as it does while the app works --"
        )
        cold_rows = []
        for gap_ms in (0, 1, 5):
            times = []
            for _ in range(400):
                if gap_ms:
                    time.sleep(gap_ms / 1000)
                t = time.perf_counter()
                engine._run_step("P15", {"expected_status": 200})
                engine._run_step("P07", p07)
                times.append((time.perf_counter() - t) * 1e6)
            times.sort()
            cold_rows.append(
                {"sleep_ms": gap_ms, "median_us": times[len(times) // 2], "p90_us": times[int(len(times) * 0.9)]}
            )
            print(
                f"  after sleeping {gap_ms} ms: median {times[len(times) // 2]:.1f} µs, p90 {times[int(len(times) * 0.9)]:.1f} µs",
                flush=True,
            )

        gc_rows = []
        if args.gc_runs:
            print(
                "-- GC: 1,500-node engine run, default GC vs gc.freeze() + set_threshold(50000, 20, 20) (app work 0) --"
            )
            for _ in range(args.gc_runs):
                for label, spec in (("default", {}), ("frozen+50k", {"gc_threshold": [50_000, 20, 20]})):
                    app.call("/__bench/reset")
                    out = eo.run_worker("engine", {"nodes": 1500, "seed": 7, "base_url": app.base_url, **spec})
                    gc_rows.append(
                        {
                            "gc": label,
                            "engine_wall_s": out["engine_wall_s"],
                            "engine_cpu_s": out["engine_cpu_s"],
                            "gc_pause_s": out["gc_pause_s"],
                            "gc_collections": out["gc_collections"],
                            "peak_rss_mb": out["peak_rss_mb"],
                        }
                    )
                    print(
                        f"  {label:11s} engine {out['engine_wall_s']:.3f}s cpu {out['engine_cpu_s']:.3f}s  GC {out['gc_pause_s'] * 1000:.0f} ms "
                        f"in {out['gc_collections']} collections, peak RSS {out['peak_rss_mb']:.0f} MB",
                        flush=True,
                    )
    finally:
        app.stop()
    if args.json_out:
        Path(args.json_out).write_text(
            json.dumps(
                {
                    "micro_us": [{"what": a, "best_us": b, "median_us": c} for a, b, c in rows],
                    "cold_cpu": cold_rows,
                    "gc": gc_rows,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
