"""Concurrency limits (saasbench.services.limits): environments per host and LLM calls per provider.

Without Prefect the limits are process-local semaphores; inside Prefect flow/task runs they are
Prefect global concurrency limits created from the sweep's config. Overlap is measured with an
instrumented fake trial (enter/exit under a lock); "at most n" waits on an event that only another
trial entering would set, and "n do overlap" uses a barrier, so nothing depends on timing.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from types import SimpleNamespace

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_HOME", tempfile.mkdtemp(prefix="saasbench-prefect-test-"))

import pytest

from saasbench import lake as lakelib
from saasbench.failures import AgentError
from saasbench.runs import sweep as sw
from saasbench.runs import trial as trial_mod
from saasbench.services import limits

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def clean_limits(monkeypatch):
    for var in (
        "SAASBENCH_ENVS_PER_HOST",
        "SAASBENCH_LLM_CALLS_PER_PROVIDER",
        "SAASBENCH_LIMITS",
        "SAASBENCH_HOST_NAME",
    ):
        monkeypatch.delenv(var, raising=False)
    limits.reset()
    yield
    limits.reset()


class Overlap:
    """Counts how many holders are inside at once."""

    def __init__(self, hold):
        self.lock = threading.Lock()
        self.active = 0
        self.max_active = 0
        self.entries = 0
        self.other_entered = threading.Event()
        self.hold = hold

    def __enter__(self):
        with self.lock:
            self.active += 1
            self.entries += 1
            self.max_active = max(self.max_active, self.active)
            if self.active >= 2:
                self.other_entered.set()
        return self

    def __exit__(self, *exc):
        with self.lock:
            self.active -= 1

    def run(self):
        with self:
            self.hold(self)


def wait_for_other(seconds: float):
    """Hold: return when a second holder enters (a broken limit) or after ``seconds``."""
    return lambda ov: ov.other_entered.wait(seconds)


def meet(n: int):
    barrier = threading.Barrier(n, timeout=90)
    return lambda ov: barrier.wait()


def fake_trial(overlap: Overlap, during=None):
    """A rollout_in stand-in: runs while the trial holds its environment, then 'the agent fails' (recorded, fast)."""

    def run(env, task, agent, budget, **kw):
        with overlap:
            if during:
                during()
            overlap.hold(overlap)
        raise AgentError("fake agent: done")

    return run


def spec_for(tmp_path: Path, sweep_id: str, **kw) -> dict:
    data = {
        "sweep_id": sweep_id,
        "tasks": ["timetrack"],
        "agents": ["oracle", "nop"],
        "attempts": 2,
        "lake": str(tmp_path / "lake"),
        "report_dir": str(tmp_path / "reports"),
        "retry_delays": [0],
        "concurrency": 4,
    }
    data.update(kw)
    return data


# --- configuration --------------------------------------------------------------------------------
def test_parse_and_configure(monkeypatch):
    assert limits.parse_llm_calls(8) == {"*": 8}
    assert limits.parse_llm_calls("openai=8, anthropic=4,*=2") == {"openai": 8, "anthropic": 4, "*": 2}
    assert limits.parse_llm_calls({"OpenAI": 3}) == {"openai": 3}
    assert limits.parse_llm_calls(None) == {} and limits.parse_llm_calls("") == {}
    with pytest.raises(ValueError):
        limits.parse_llm_calls("openai=lots")
    assert limits.current() == limits.LimitConfig()  # defaults: unlimited
    monkeypatch.setenv("SAASBENCH_ENVS_PER_HOST", "3")
    monkeypatch.setenv("SAASBENCH_LLM_CALLS_PER_PROVIDER", "openai=5,*=2")
    cfg = limits.current()
    assert cfg.envs_per_host == 3 and cfg.llm_limit("openai") == 5 and cfg.llm_limit("anthropic") == 2
    # spec fields win over the environment; unset fields fall back to it
    spec = sw.SweepSpec(sweep_id="x", tasks=["t"], agents=["a"], envs_per_host=1)
    cfg = limits.configure_from_spec(spec)
    assert cfg.envs_per_host == 1 and cfg.llm_limit("openai") == 5
    assert limits.current() is cfg
    with pytest.raises(ValueError):
        sw.SweepSpec(sweep_id="x", tasks=["t"], agents=["a"], envs_per_host=0)
    with pytest.raises(ValueError):
        sw.SweepSpec(sweep_id="x", tasks=["t"], agents=["a"], llm_calls_per_provider={"openai": 0})
    monkeypatch.setenv("SAASBENCH_HOST_NAME", "Build Box/1")
    assert limits.env_limit_name() == "saasbench-env-build_box_1"
    assert limits.llm_limit_name("openai") == "saasbench-llm-openai"


def test_llm_provider():
    assert limits.llm_provider("openai/gpt-4o") == "openai"
    assert limits.llm_provider("anthropic/claude-sonnet-4-5") == "anthropic"
    assert limits.llm_provider("openrouter/anthropic/claude-3") == "openrouter"
    assert limits.llm_provider("claude-3-5-sonnet-20241022") == "anthropic"
    assert limits.llm_provider("gpt-4o-mini") == "openai"
    assert limits.llm_provider("my-local-thing") == "unknown"


def test_unlimited_is_a_no_op():
    with limits.environment_slot() as mode, limits.llm_slot("openai") as mode2:
        assert mode == mode2 == "unlimited"


# --- fallback: process-local semaphores -----------------------------------------------------------
def threads(n: int, target) -> None:
    ts = [threading.Thread(target=target) for _ in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    assert not any(t.is_alive() for t in ts)


def test_local_semaphore_limits_environments():
    limits.configure(envs_per_host=1)
    ov = Overlap(wait_for_other(0.3))
    modes = []

    def one():
        with limits.environment_slot() as mode:
            modes.append(mode)
            ov.run()

    threads(4, one)
    assert modes == ["local"] * 4 and ov.entries == 4 and ov.max_active == 1

    limits.configure(envs_per_host=2)
    ov2 = Overlap(meet(2))  # two must be inside together to pass the barrier

    def two():
        with limits.environment_slot():
            ov2.run()

    threads(4, two)
    assert ov2.max_active == 2


def test_judge_calls_are_limited_per_provider():
    from saasbench.services.judge import Judge, JudgeConfig

    limits.configure(llm_calls_per_provider={"openai": 1, "*": 3})
    ov = Overlap(wait_for_other(0.3))
    other = Overlap(meet(3))  # another provider has its own limit (3 here)

    def completion(**kw):
        (ov if kw["model"].startswith("openai/") else other).run()
        return SimpleNamespace(
            choices=[SimpleNamespace(message=SimpleNamespace(content='{"score": 1}'))],
            usage=SimpleNamespace(prompt_tokens=1, completion_tokens=1),
        )

    verdicts = []

    def ask(model):
        judge = Judge(JudgeConfig(model=model, api_base="http://127.0.0.1:9"), completion=completion)
        verdicts.append(judge.score("rubric", f"evidence {threading.get_ident()}", (0, 1)))

    threads(3, lambda: ask("openai/gpt-4o"))
    threads(3, lambda: ask("anthropic/claude-x"))
    assert all(v.ok and v.score == 1 for v in verdicts) and len(verdicts) == 6
    assert ov.entries == 3 and ov.max_active == 1
    assert other.max_active == 3


def test_plain_sweep_limits_environments(tmp_path, monkeypatch):
    ov = Overlap(wait_for_other(0.5))
    monkeypatch.setattr(trial_mod, "rollout_in", fake_trial(ov))
    out = sw.run_sweep_plain(spec_for(tmp_path, "lim-plain-1", envs_per_host=1), sleep=lambda s: None)
    assert set(out.values()) == {"agent_error"} and len(out) == 4
    assert ov.entries == 4 and ov.max_active == 1

    ov2 = Overlap(meet(2))
    monkeypatch.setattr(trial_mod, "rollout_in", fake_trial(ov2))
    out = sw.run_sweep_plain(spec_for(tmp_path, "lim-plain-2", envs_per_host=2), sleep=lambda s: None)
    assert len(out) == 4 and ov2.max_active == 2


def test_sweep_cmd_limit_options(tmp_path, monkeypatch):
    import typer
    from typer.testing import CliRunner

    from saasbench.cli.sweep import sweep_cmd

    app = typer.Typer()
    app.command("sweep")(sweep_cmd)
    app.command("noop")(lambda: None)
    ov = Overlap(wait_for_other(0.3))
    monkeypatch.setattr(trial_mod, "rollout_in", fake_trial(ov))
    spec = tmp_path / "s.yaml"
    spec.write_text(f"tasks: [timetrack]\nagents: [oracle, nop]\nreport_dir: {tmp_path / 'rep'}\n")
    base = ["sweep", str(spec), "--lake", str(tmp_path / "lake"), "--concurrency", "2"]
    res = CliRunner().invoke(
        app, base + ["--sweep-id", "cli-lim", "--no-prefect", "--envs-per-host", "1", "--llm-calls", "openai=2,*=1"]
    )
    assert res.exit_code == 0, res.output
    assert "ran 2 trial(s) now" in res.output and ov.entries == 2 and ov.max_active == 1
    assert limits.current() == limits.LimitConfig(envs_per_host=1, llm_calls={"openai": 2, "*": 1})
    res = CliRunner().invoke(app, base + ["--no-prefect", "--dispatch", "deployment"])
    assert res.exit_code == 2 and "needs Prefect" in res.output
    res = CliRunner().invoke(app, base + ["--no-prefect", "--llm-calls", "openai=many"])
    assert res.exit_code == 2 and "--llm-calls" in res.output


def test_core_imports_and_limits_without_prefect(tmp_path):
    script = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name == "prefect" or name.startswith("prefect."):
            raise ImportError("prefect is blocked in this test")
sys.meta_path.insert(0, Block())
from saasbench.services import judge
from saasbench.services import limits
from saasbench.runs import sweep
limits.configure(envs_per_host=1, llm_calls_per_provider=2)
with limits.environment_slot() as a, limits.llm_slot("openai") as b:
    print(a, b, "prefect" in sys.modules)
"""
    res = subprocess.run(
        [sys.executable, "-c", script], cwd=str(REPO), capture_output=True, text=True, check=False, timeout=120
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["local", "local", "False"]


# --- Prefect global concurrency limits ------------------------------------------------------------
@pytest.fixture(scope="module")
def harness():
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=90):
        yield


def server_limit(name: str):
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return client.read_global_concurrency_limit_by_name(name)


def test_prefect_env_limit_one_serialises_trials(harness, tmp_path, monkeypatch):
    from saasbench.flows.sweep import sweep_flow

    name = limits.env_limit_name()
    seen_active: list[int] = []
    ov = Overlap(wait_for_other(1.0))
    monkeypatch.setattr(
        trial_mod, "rollout_in", fake_trial(ov, during=lambda: seen_active.append(server_limit(name).active_slots))
    )
    res = sweep_flow(spec_for(tmp_path, "lim-prefect-1", envs_per_host=1))
    assert set(res["outcomes"].values()) == {"agent_error"} and len(res["outcomes"]) == 4
    assert ov.entries == 4 and ov.max_active == 1
    # the slot each trial held was the server's: one occupied slot of the limit while inside
    assert seen_active == [1, 1, 1, 1]
    lim = server_limit(name)
    assert lim.limit == 1 and lim.active and lim.active_slots == 0
    assert lakelib.committed_trials(str(tmp_path / "lake"), "lim-prefect-1") == {
        t.trial_id for t in sw.plan(sw.SweepSpec.model_validate(spec_for(tmp_path, "lim-prefect-1")))
    }


def test_prefect_env_limit_two_overlaps(harness, tmp_path, monkeypatch):
    from saasbench.flows.sweep import sweep_flow

    ov = Overlap(meet(2))
    monkeypatch.setattr(trial_mod, "rollout_in", fake_trial(ov))
    res = sweep_flow(spec_for(tmp_path, "lim-prefect-2", envs_per_host=2, llm_calls_per_provider={"anthropic": 4}))
    assert len(res["outcomes"]) == 4 and ov.entries == 4 and ov.max_active == 2
    assert server_limit(limits.env_limit_name()).limit == 2  # updated from 1 by this sweep's config
    assert server_limit("saasbench-llm-anthropic").limit == 4  # named providers are created at sweep start


def test_prefect_llm_limit_from_default(harness):
    from prefect import flow, task

    from saasbench.services.judge import Judge, JudgeConfig

    ov = Overlap(wait_for_other(0.5))
    modes: list[str] = []

    def completion(**kw):
        modes.append("called")
        ov.run()
        return SimpleNamespace(choices=[SimpleNamespace(message=SimpleNamespace(content='{"score": 2}'))], usage=None)

    @task
    def ask(i: int) -> float | None:
        judge = Judge(JudgeConfig(model="openai/gpt-4o", api_base="http://127.0.0.1:9"), completion=completion)
        return judge.score("rubric", f"evidence {i}", (0, 2)).score

    @flow
    def judged() -> list:
        limits.configure(llm_calls_per_provider="*=1")  # the default limit: upserted on first use
        with limits.llm_slot("openai") as mode:
            modes.append(mode)
        return [f.result() for f in [ask.submit(i) for i in range(3)]]

    assert judged() == [2.0, 2.0, 2.0]
    assert modes[0] == "prefect" and ov.entries == 3 and ov.max_active == 1
    assert server_limit("saasbench-llm-openai").limit == 1
