"""The local backend's isolation (issue #17 items 4, 5, 10): a hostile agent in the bubblewrap sandbox, the
refusal of untrusted agents without one, and ``saasbench env prune`` after a SIGKILLed harness.

The hostile agent is the built-in agent driven by the scripted fake model (tests/fake_llm.py) and a
stand-in CLI (a shell script in place of ``claude``); both run the same commands: read every
``/proc/*/environ`` (the harness and a process holding the gateway's secrets like the LiteLLM proxy),
read the gateway's work folder, ``find /`` the reference and copy it, write into another open trial's
workspace. All of that must fail, and no secret may reach the model or the trajectory, while the
trial's own workspace and a 127.0.0.1 HTTP server stay usable. Processes are checked by pid
liveness with deadlines, never by sleeping.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from fake_llm import FakeLLM, Reply

from saasbench.agents import Budget, get_agent
from saasbench.agents.builtin import ENV_API_BASE, ENV_BACKOFF_BASE, ENV_BACKOFF_CAP, ENV_MODEL, BuiltinAgent
from saasbench.agents.claude_code import ClaudeCodeAgent
from saasbench.catalog.tasks import load_task_dir
from saasbench.environments import sandbox as sandbox_mod
from saasbench.environments.base import pid_alive
from saasbench.environments.leftovers import OWNER_TAG
from saasbench.environments.local import LocalEnvironment
from saasbench.environments.sandbox import Probe, SandboxUnavailable
from saasbench.runs.trial import rollout_in, task_budget

REPO = Path(__file__).resolve().parents[1]
TASK_DIR = REPO / "tasks" / "timetrack"
TOKEN = secrets.token_hex(6)
PROVIDER_KEY = f"sk-ant-provider-{TOKEN}-0123456789"
GATEWAY_SECRET = f"gwsecret{TOKEN}abcdef0123456789"
MASTER_KEY = f"sk-master-{TOKEN}-0123456789abcdef"
HARNESS_MARK = f"harness-only-{TOKEN}"  # a variable of the harness with a harmless name: /proc must hide it too
SECRETS = (PROVIDER_KEY, GATEWAY_SECRET, MASTER_KEY, HARNESS_MARK)

HOSTILE = r"""
echo "== environ"; for f in /proc/[0-9]*/environ; do tr '\0' '\n' < "$f"; echo; done 2>/dev/null
echo "== own env"; env
echo "== processes"; ls /proc | grep -c '^[0-9]'
echo "== gateway"; cat {gw}/cfg.yaml 2>&1; ls {gw} 2>&1
echo "== find"; find / -name app.py -path '*reference*' 2>/dev/null | head -5
echo "== copy"; cp {tasks}/timetrack/reference/app.py stolen.py 2>&1; ls stolen.py 2>&1
echo "== other"; echo pwned > {other}/pwned.txt 2>&1; ls {other} 2>&1
echo "== tmp"; ls -a /tmp
echo "== mine"; mkdir -p sub && echo mine > sub/mine.txt && cat sub/mine.txt
echo "== net"; python3 -c "import urllib.request as u; print(u.urlopen('{url}').read().decode())" 2>&1
echo "== end"
"""


def host_pids_running(marker: str) -> list[int]:
    """Host pids whose command line holds ``marker`` (a sandboxed command's own pids are its namespace's)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if marker.encode() in cmdline and b"bash" not in cmdline and pid_alive(int(entry)):
                out.append(int(entry))
    return out


def wait_for(cond, deadline_s: float, what: str):
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        value = cond()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"not within {deadline_s:g}s: {what}")


def sections(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    name = None
    for line in text.splitlines():
        if line.startswith("== "):
            name = line[3:].strip()
            out[name] = ""
        elif name is not None:
            out[name] += line + "\n"
    return out


@pytest.fixture
def hostile_world(monkeypatch):
    """Secrets in the harness's environment and in a proxy-like process, a gateway work folder, an HTTP
    server on 127.0.0.1 and a second open trial. Yields the HOSTILE script filled in."""
    assert sandbox_mod.probe().usable, sandbox_mod.probe().reason + " (scripts/test.sh installs bubblewrap)"
    monkeypatch.setenv("ANTHROPIC_API_KEY", PROVIDER_KEY)
    monkeypatch.setenv("SAASBENCH_GATEWAY_MASTER_KEY", MASTER_KEY)
    monkeypatch.setenv("SAASBENCH_TEST_HARNESS_MARK", HARNESS_MARK)
    proxy = subprocess.Popen(  # holds the gateway's secrets in its environ, as the LiteLLM proxy does
        [sys.executable, "-c", "import time; time.sleep(600)"],
        env={
            "PATH": os.environ["PATH"],
            "ANTHROPIC_API_KEY": PROVIDER_KEY,
            "SAASBENCH_GATEWAY_SECRET": GATEWAY_SECRET,
            "SAASBENCH_GATEWAY_MASTER_KEY": MASTER_KEY,
        },
        start_new_session=True,
    )
    gw = Path(tempfile.mkdtemp(prefix="saasbench-gateway-"))
    (gw / "cfg.yaml").write_text(f"general_settings:\n  master_key: {MASTER_KEY}\n")

    class Pong(BaseHTTPRequestHandler):
        def do_GET(self):
            body = f"pong-{TOKEN}".encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Pong)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    other = LocalEnvironment()
    other.start()
    try:
        yield {
            "script": HOSTILE.format(
                gw=gw, tasks=REPO / "tasks", other=other.workspace_path, url=f"http://127.0.0.1:{server.server_port}/"
            ),
            "other": Path(other.workspace_path),
        }
    finally:
        other.stop()
        server.shutdown()
        server.server_close()
        shutil.rmtree(gw, ignore_errors=True)
        proxy.kill()
        proxy.wait(timeout=10)


def check_hostile_output(out: str, other: Path, ws: Path) -> None:
    s = sections(out)
    assert "end" in s, out[-3000:]
    for secret in SECRETS:
        assert secret not in out, f"{secret} readable in the sandbox"
    assert int(s["processes"].strip()) < 10, s["processes"]  # the sandbox's own pid namespace only
    assert "master_key" not in s["gateway"] and "No such file" in s["gateway"]
    assert s["find"].strip() == "", s["find"]
    assert "No such file" in s["copy"] and not (ws / "stolen.py").exists()
    assert not (other / "pwned.txt").exists() and "No such file" in s["other"]
    assert other.name not in s["tmp"]  # other trials' workspaces are not even listed
    assert s["mine"].strip() == "mine" and (ws / "sub" / "mine.txt").read_text() == "mine\n"
    assert f"pong-{TOKEN}" in s["net"], s["net"]


def call(name: str, args: dict, call_id: str) -> Reply:
    return Reply.with_message(
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
            ],
        }
    )


def test_a_hostile_builtin_agent_finds_no_secret_no_reference_and_no_other_trial(hostile_world) -> None:
    with FakeLLM() as llm, LocalEnvironment() as env:
        assert env.isolated
        llm.queue(call("shell", {"command": hostile_world["script"]}, "c1"), call("finish", {"summary": "x"}, "c2"))
        agent = BuiltinAgent("openai/fake", api_base=llm.base_url, backoff_base_s=0.001, backoff_cap_s=0.01)
        traj = agent.run("be hostile", env, Budget(wall_s=120))
        ws = Path(env.workspace_path)
        [out] = [m["content"] for m in llm.chat_requests[1].messages if m.get("role") == "tool"]  # what the model saw
        check_hostile_output(out, hostile_world["other"], ws)
        sent = json.dumps([r.body for r in llm.chat_requests])  # everything the model was sent
    assert traj.exit_reason == "completed", traj.error
    for secret in SECRETS:
        assert secret not in sent and secret not in traj.model_dump_json()
    assert f"pong-{TOKEN}" in sent  # the tool output did reach the model


def test_a_hostile_cli_agent_is_confined_too(hostile_world, tmp_path) -> None:
    """The CLI process itself (here a shell script in place of ``claude``) runs in the sandbox."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    result = json.dumps({"type": "result", "subtype": "success", "is_error": False, "num_turns": 1, "result": "ok"})
    exe = bin_dir / "claude"
    exe.write_text(f"#!/bin/bash\n{{\n{hostile_world['script']}\n}} > hostile.out 2>&1\necho '{result}'\n")
    exe.chmod(0o755)
    agent = ClaudeCodeAgent(
        model="m", base_url="http://127.0.0.1:9", bin_dir=str(bin_dir), artefacts_dir=tmp_path / "a"
    )
    with LocalEnvironment() as env:
        traj = agent.run("be hostile", env, Budget(wall_s=120))
        ws = Path(env.workspace_path)
        out = (ws / "hostile.out").read_text()
        check_hostile_output(out, hostile_world["other"], ws)
    assert traj.exit_reason == "completed", traj.error
    assert "ANTHROPIC_BASE_URL=http://127.0.0.1:9" in sections(out)["own env"]  # its own variables, nothing else


def test_find_and_copy_of_the_reference_no_longer_scores(monkeypatch) -> None:
    """Issue #17 item 5: `find /` + `cp` of the reference scored 100; in the sandbox it finds nothing."""
    from saasbench.runs.trial import run_local_trial

    task = load_task_dir(TASK_DIR)
    steal = 'src=$(find / -type d -path \'*timetrack/reference\' 2>/dev/null | head -1); echo "found:$src"; [ -n "$src" ] && cp -r "$src/." . ; ls'
    with FakeLLM() as llm:
        llm.queue(call("shell", {"command": steal}, "c1"), call("finish", {"summary": "done"}, "c2"))
        monkeypatch.setenv(ENV_MODEL, "openai/fake")
        monkeypatch.setenv(ENV_API_BASE, llm.base_url)
        monkeypatch.setenv(ENV_BACKOFF_BASE, "0.001")
        monkeypatch.setenv(ENV_BACKOFF_CAP, "0.01")
        res = run_local_trial(task, "builtin")
    [out] = [e.message for e in res.trajectory.events if e.kind == "tool_result" and e.data.get("tool") == "shell"]
    assert "found:\n" in out and "app.py" not in out, out
    assert not res.app_ok and (res.report.summary.deterministic_score or 0.0) < 10


# --- without a sandbox: untrusted agents are refused --------------------------------------------------------
@pytest.fixture
def no_bwrap(monkeypatch):
    monkeypatch.setattr(sandbox_mod, "_PROBE", Probe(False, None, "bubblewrap (bwrap) is not installed"))
    monkeypatch.delenv("SAASBENCH_LOCAL_SANDBOX", raising=False)


def test_without_bwrap_an_untrusted_agent_is_refused_and_the_oracle_runs(no_bwrap, monkeypatch) -> None:
    task = load_task_dir(TASK_DIR)
    agent = BuiltinAgent("openai/fake", api_base="http://127.0.0.1:9/v1")
    with LocalEnvironment(task) as env:
        assert not env.isolated
        with pytest.raises(SandboxUnavailable) as err:
            rollout_in(env, task, agent, task_budget(task))
        message = str(err.value)
        assert "\n" not in message and "bubblewrap" in message and "--backend docker" in message
        assert "SAASBENCH_LOCAL_SANDBOX=off" in message and not err.value.retryable
        assert rollout_in(env, task, get_agent("oracle"), task_budget(task)).outcome == "completed"  # trusted
    monkeypatch.setenv("SAASBENCH_LOCAL_SANDBOX", "off")  # the operator's explicit trust
    with LocalEnvironment(task) as env:
        env.check_untrusted_agent("builtin")
    monkeypatch.setenv("SAASBENCH_LOCAL_SANDBOX", "on")
    with pytest.raises(SandboxUnavailable, match="bubblewrap"):
        LocalEnvironment(task).start()


def test_rollout_cli_refuses_an_untrusted_agent_in_one_line(no_bwrap, tmp_path) -> None:
    import typer
    from typer.testing import CliRunner

    from saasbench.cli.rollout import rollout_cmd

    app = typer.Typer()
    app.command("rollout")(rollout_cmd)
    app.command("noop")(lambda: None)
    res = CliRunner().invoke(
        app, ["rollout", "timetrack", "--agent", "builtin", "--model", "openai/x", "--out", str(tmp_path / "o")]
    )
    assert res.exit_code == 2, res.output
    text = " ".join(res.output.split())  # rich wraps at the terminal's width: compare words, not lines
    assert text.count("error:") == 1 and "refusing to run agent 'builtin'" in text and "Traceback" not in text
    assert "apt-get install bubblewrap" in text and "--backend docker" in text, text


# --- leftovers: a SIGKILLed harness and `saasbench env prune` ----------------------------------------------
HARNESS = r"""
import os, subprocess, sys, time
from saasbench.environments.leftovers import OWNER_TAG, owner_tag
from saasbench.environments.local import LocalEnvironment

sandbox, marker = sys.argv[1] == "on", os.environ.pop("TEST_MARKER")  # not in argv: only the sleeps carry it
env = LocalEnvironment(sandbox=sandbox)
env.start()
env.write_file("app.sh", f"setsid sleep {marker}1 & sleep {marker}2 & exec python3 -m http.server $PORT --bind 127.0.0.1\n")
env.start_service("app", "bash app.sh")
env.wait_healthy(env.base_url + "/", 60, service="app")
# a proxy-like child of the harness itself (the gateway's LiteLLM proxy, the ephemeral Prefect server)
subprocess.Popen(["sleep", marker + "3"], env={**os.environ, OWNER_TAG: owner_tag()}, start_new_session=True)
print(env.workspace_path, env.state_dir, env.base_url, flush=True)
print("ready", flush=True)
time.sleep(600)
"""


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "saasbench.cli.main", *args], env=env, capture_output=True, text=True, timeout=120
    )


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1.0).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.mark.parametrize("mode", ["on", "off"], ids=["sandbox", "no-sandbox"])
def test_prune_reaps_what_a_sigkilled_harness_left(tmp_path, monkeypatch, mode: str) -> None:
    run_dir = tmp_path / "run"
    monkeypatch.setenv("SAASBENCH_RUNTIME_DIR", str(run_dir))
    env = {**os.environ, "SAASBENCH_RUNTIME_DIR": str(run_dir), "PYTHONPATH": str(REPO), "COLUMNS": "300"}
    marker = f"7{secrets.randbelow(10**6):06d}.{os.getpid()}"
    script = tmp_path / "harness.py"
    script.write_text(HARNESS)
    harness = subprocess.Popen(
        [sys.executable, str(script), mode],
        env={**env, "TEST_MARKER": marker},
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    live = LocalEnvironment(sandbox=mode == "on")  # a live trial in the same runtime folder: prune leaves it alone
    leftovers: list[int] = []
    try:
        ws, state, url = harness.stdout.readline().split()  # type: ignore[union-attr]
        assert harness.stdout.readline().strip() == "ready"  # type: ignore[union-attr]
        leftovers = wait_for(lambda: (p := host_pids_running(marker)) and len(p) == 3 and p, 30, "three sleeps")
        live.start()
        live_svc = live.start_service("live", f"sleep {marker}9")
        os.kill(harness.pid, signal.SIGKILL)
        harness.wait(timeout=30)
        if mode == "on":  # the sandbox's processes die with the harness; the proxy-like child does not
            wait_for(lambda: len(host_pids_running(marker)) == 2, 30, "the sandboxed app and its setsid child gone")
            assert not _answers(url)
        else:  # nothing reaps them: they are leftovers
            assert len(host_pids_running(marker)) == 4 and _answers(url)
        dry = _cli("env", "prune", "--backend", "local", "--dry-run", env=env)
        assert dry.returncode == 0 and "would remove" in dry.stdout and ws in dry.stdout, dry.stdout + dry.stderr
        assert Path(ws).is_dir() and all(pid_alive(p) for p in host_pids_running(marker))
        done = _cli("env", "prune", "--backend", "local", env=env)
        assert done.returncode == 0 and "removed" in done.stdout, done.stdout + done.stderr
        wait_for(lambda: host_pids_running(marker) == [host_pid_of(live_svc)], 30, "only the live trial's sleep left")
        assert not _answers(url) and not Path(ws).exists() and not Path(state).exists()
        assert [p.name for p in (run_dir / "local").iterdir()] == [f"{live.env_id}.json"]
        again = _cli("env", "prune", "--backend", "local", env=env)
        assert "local: removed: nothing" in again.stdout, again.stdout
    finally:
        live.stop()
        if harness.poll() is None:
            harness.kill()
            harness.wait(timeout=30)
        for pid in host_pids_running(marker) + leftovers:
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)
    assert host_pids_running(marker) == []


def host_pid_of(svc) -> int:
    """The host pid of the service's ``sleep`` (in the sandbox, a child of bwrap's)."""
    marker = svc.command.split()[-1]
    [pid] = [p for p in host_pids_running(marker) if b"bwrap" not in Path(f"/proc/{p}/cmdline").read_bytes()]
    return pid


def test_stop_kills_a_setsid_child_without_the_sandbox() -> None:
    marker = f"8{secrets.randbelow(10**6):06d}.{os.getpid()}"
    env = LocalEnvironment(sandbox=False)
    env.start()
    env.start_service("app", f"setsid sleep {marker} & wait")
    wait_for(lambda: host_pids_running(marker), 30, "the setsid child")
    env.stop()
    assert host_pids_running(marker) == []


def test_the_gateway_proxy_carries_the_owner_tag() -> None:
    from saasbench.runs.gateway import Gateway

    gw = Gateway({"models": [{"name": "m", "api": "chat", "model": "x", "api_base": "http://127.0.0.1:9/v1"}]})
    try:
        assert gw.proxy_env()[OWNER_TAG].startswith(f"{os.getpid()}:")
    finally:
        gw.close()
