"""Tests of the LLM judge (saasbench.services.judge) and P17 against a local OpenAI-compatible server."""

from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from fake_llm import FakeLLM, Reply

SECRET = "sk-test-SECRET-0123456789abcdef"
KEY_ENV = "SAASBENCH_TEST_JUDGE_KEY"
PAPER_SYSTEM = (
    "You are an expert evaluator. Score the evidence against the rubric. Respond ONLY with a JSON object: "
    '{"score": <0-5>, "reasoning": "<brief explanation>"}'
)


@pytest.fixture(scope="session", autouse=True)
def _offline_litellm():
    # litellm fetches a remote cost map at import unless told not to
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        yield


@pytest.fixture
def llm():
    with FakeLLM() as server:
        yield server


@pytest.fixture
def key_env(monkeypatch):
    monkeypatch.setenv(KEY_ENV, SECRET)
    return KEY_ENV


def make_judge(llm: FakeLLM, **kw: Any):
    from saasbench.services.judge import Judge, JudgeConfig

    sleeps: list[float] = []
    cfg = dict(
        model="openai/fake", api_base=llm.base_url, retries=3, backoff_base_s=0.001, backoff_cap_s=0.01, timeout_s=5
    )
    cfg.update(kw)
    judge = Judge(JudgeConfig(**cfg), sleep=lambda s: sleeps.append(s))
    judge.sleeps = sleeps  # type: ignore[attr-defined]
    return judge


def ok(score: Any, reasoning: str = "fine") -> Reply:
    return Reply.json({"score": score, "reasoning": reasoning})


# --- template ------------------------------------------------------------------------------------------
def test_template_is_the_papers(llm):
    from saasbench.services.judge import build_messages

    msgs = build_messages("Check (1) X.", "EVIDENCE TEXT", (0, 5))
    assert msgs == [
        {"role": "system", "content": PAPER_SYSTEM},
        {"role": "user", "content": "## Rubric\nCheck (1) X.\n\n## Evidence\nEVIDENCE TEXT"},
    ]
    judge = make_judge(llm)
    llm.queue(ok(4))
    verdict = judge.score("Check (1) X.", "EVIDENCE TEXT", (0, 5))
    assert verdict.ok and verdict.score == 4
    (req,) = llm.chat_requests
    assert req.body["messages"] == msgs
    assert req.body["temperature"] == 0
    assert req.body["model"] == "fake"
    assert "stream" not in req.body or not req.body["stream"]


def test_template_writes_integer_top_and_nonzero_bottom():
    from saasbench.services.judge import system_message

    assert system_message((0, 6.0)).endswith('{"score": <0-6>, "reasoning": "<brief explanation>"}')
    assert "<1-2.5>" in system_message((1, 2.5))


# --- parsing -------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "reply,score,form",
    [
        ('{"score": 4, "reasoning": "good"}', 4, "json"),
        ('{"Score": "3", "reason": "ok"}', 3, "json"),
        ('```json\n{"score": 2, "reasoning": "meh"}\n```', 2, "fenced_json"),
        ('Sure!\n```\n{"score": 5}\n```\nDone.', 5, "fenced_json"),
        (
            'My verdict is {"score": 1.5, "reasoning": "nested {braces} ok", "detail": {"a": 1}} as asked.',
            1.5,
            "embedded_json",
        ),
        ("Score: 4", 4, "pattern"),
        ("**Score:** 3/5\nThe app has a nav bar.", 3, "pattern"),
        ('{"score": 3, "reasoning": "the reply was cut by max_tok', 3, "pattern"),
        ("Reasoning first.\nFinal score: 2 out of 5", 2, "pattern"),
        ("4", 4, "number"),
    ],
)
def test_parse_forms(reply, score, form):
    from saasbench.services.judge import parse_reply

    parsed = parse_reply(reply)
    assert parsed is not None
    assert parsed.score == score
    assert parsed.form == form


@pytest.mark.parametrize(
    "reply",
    [
        "",
        "   ",
        "I cannot evaluate this.",
        '{"score": true}',
        '{"score": null}',
        '{"reasoning": "no score"}',
        "NaN",
        '{"score": "high"}',
        # the model echoed the told range instead of a score: no score, never a real 0
        '{"score": 0-4, "reasoning": "the app is complete"}',
        '{"score": "0-4", "reasoning": "fine"}',
        '{"score": <0-5>, "reasoning": "<brief explanation>"}',
        '```json\n{"score": 0-5}\n```',
        "Score: 0-4",
        "Score: 0 - 4",
        "Score: 0 to 4",
        "score: 1\u20135",
        "Score: 0.5-4.5",
        '"score": "10-40"',
    ],
)
def test_parse_rejects(reply):
    from saasbench.services.judge import parse_reply

    assert parse_reply(reply) is None


@pytest.mark.parametrize(
    "reply,score",
    [
        ("Score: 4.", 4),
        ("Score: 3/5 - good", 3),
        ("Score: 2 out of 5", 2),
        ("The scale is 0-4.\nScore: 3", 3),
        ('{"score": 3, "reasoning": "on the 0-4 scale"}', 3),
        ("Score: -2", -2),
    ],
)
def test_parse_ranges_do_not_hide_real_scores(reply, score):
    from saasbench.services.judge import parse_reply

    parsed = parse_reply(reply)
    assert parsed is not None and parsed.score == score


def test_echoed_range_takes_the_parse_failure_path(llm):
    judge = make_judge(llm, parse_retries=1)
    llm.queue(Reply.text('{"score": 0-4, "reasoning": "x"}'), Reply.text('{"score": "0-4"}'))
    verdict = judge.score("r", "e", (0, 4))
    assert not verdict.ok and verdict.score is None
    assert verdict.error is not None and "unparseable" in verdict.error
    assert len(llm.chat_requests) == 2


def test_clip_and_rescale():
    from saasbench.services.judge import normalise, parse_reply

    assert normalise(parse_reply('{"score": 7}'), (0, 5)) == 5
    assert normalise(parse_reply('{"score": -2}'), (0, 5)) == 0
    assert normalise(parse_reply("Score: 8/10"), (0, 5)) == 4  # the judge used another scale
    assert normalise(parse_reply("Score: 4/5"), (0, 5)) == 4


def test_judge_clips_into_range(llm):
    judge = make_judge(llm)
    llm.queue(ok(7))
    verdict = judge.score("r", "e", (0, 5))
    assert verdict.score == 5
    assert judge.calls[0].parsed_score == 7 and judge.calls[0].score == 5


# --- retries -------------------------------------------------------------------------------------------
def test_retries_transient_then_succeeds(llm):
    judge = make_judge(llm, retries=5, backoff_base_s=0.001, backoff_cap_s=1.0)
    llm.queue(Reply.error(500), Reply.error(429), Reply.error(503), ok(3))
    verdict = judge.score("r", "e", (0, 5))
    assert verdict.ok and verdict.score == 3
    assert verdict.attempts == 4
    assert len(llm.chat_requests) == 4
    assert judge.sleeps == [0.001, 0.002, 0.004]  # exponential backoff


def test_retry_after_is_honoured_up_to_the_cap(llm):
    judge = make_judge(llm, backoff_base_s=0.001, backoff_cap_s=0.05)
    llm.queue(Reply.error(429, retry_after=30), ok(2))
    assert judge.score("r", "e", (0, 5)).score == 2
    assert judge.sleeps == [0.05]


def test_timeout_and_dropped_connection_are_retried(llm):
    judge = make_judge(llm, timeout_s=0.5)
    llm.queue(Reply.slow('{"score": 1}', 5.0), Reply.drop(), ok(4))
    verdict = judge.score("r", "e", (0, 5))
    assert verdict.ok and verdict.score == 4
    assert len(llm.chat_requests) == 3
    assert verdict.attempts == 3


def test_permanent_errors_are_not_retried_and_keys_are_redacted(llm, key_env):
    judge = make_judge(llm, api_key_env=key_env)
    llm.queue(Reply.error(401, f"Incorrect API key provided: {SECRET}"))
    verdict = judge.score("r", "e", (0, 5))
    assert not verdict.ok
    assert "401" in verdict.error
    assert len(llm.chat_requests) == 1
    assert llm.chat_requests[0].headers.get("authorization") == f"Bearer {SECRET}"  # the key was used...
    dumped = verdict.model_dump_json() + json.dumps([c.model_dump(mode="json") for c in judge.calls])
    assert SECRET not in dumped  # ...and never recorded
    assert "[REDACTED]" in dumped


def test_deadline_bounds_the_whole_call(llm):
    import time

    judge = make_judge(llm, timeout_s=5)
    llm.queue(Reply.slow('{"score": 1}', 5.0))
    t0 = time.monotonic()
    verdict = judge.score("r", "e", (0, 5), deadline_s=0.3)
    assert time.monotonic() - t0 < 2
    assert not verdict.ok and "deadline" in verdict.error


def test_outage_gives_error_after_retries(llm):
    judge = make_judge(llm, retries=2)
    verdict = judge.score("r", "e", (0, 5))  # the default reply is HTTP 500
    assert not verdict.ok and "500" in verdict.error
    assert len(llm.chat_requests) == 3
    assert judge.calls[-1].attempts == 3


def test_unparseable_reply_is_asked_again_then_fails(llm):
    judge = make_judge(llm, parse_retries=1)
    llm.queue(Reply.text("I think it is pretty good overall."), Reply.text("garbage ###"))
    verdict = judge.score("r", "e", (0, 5))
    assert not verdict.ok and "unparseable" in verdict.error
    assert len(llm.chat_requests) == 2
    assert verdict.raw_reply == "garbage ###"


def test_unparseable_then_parseable(llm):
    judge = make_judge(llm, parse_retries=2)
    llm.queue(Reply.text("hmm"), Reply.text("Score: 4"))
    assert judge.score("r", "e", (0, 5)).score == 4


def test_missing_key_variable_skips_without_calling(llm, monkeypatch):
    monkeypatch.delenv("SAASBENCH_TEST_NO_SUCH_KEY", raising=False)
    judge = make_judge(llm, api_key_env="SAASBENCH_TEST_NO_SUCH_KEY")
    verdict = judge.score("r", "e", (0, 5))
    assert not verdict.ok and "SAASBENCH_TEST_NO_SUCH_KEY" in verdict.error
    assert llm.chat_requests == []


def test_config_refuses_a_key_in_place_of_a_variable_name():
    from pydantic import ValidationError

    from saasbench.services.judge import JudgeConfig

    with pytest.raises(ValidationError) as err:
        JudgeConfig(model="openai/fake", api_key_env=SECRET)
    assert SECRET not in str(err.value)


# --- cache and votes -----------------------------------------------------------------------------------
def test_cache_hit_does_not_call_again(llm, tmp_path):
    judge = make_judge(llm, cache_dir=tmp_path / "cache")
    llm.queue(ok(3))
    first = judge.score("rubric", "evidence", (0, 5))
    second = judge.score("rubric", "evidence", (0, 5))
    assert first.score == second.score == 3
    assert not first.cached and second.cached
    assert len(llm.chat_requests) == 1
    assert [c.cached for c in judge.calls] == [False, True]
    assert judge.calls[0].cache_key == judge.calls[1].cache_key

    # a new judge (a new run) finds the call on disk
    again = make_judge(llm, cache_dir=tmp_path / "cache")
    assert again.score("rubric", "evidence", (0, 5)).cached
    assert len(llm.chat_requests) == 1
    files = list((tmp_path / "cache").rglob("*"))
    assert [p for p in files if p.suffix == ".json"] and not [p for p in files if p.name.endswith(".tmp")]

    # other evidence, rubric or model: a new call
    llm.queue(ok(1), ok(2))
    assert judge.score("rubric", "other evidence", (0, 5)).score == 1
    assert judge.score("other rubric", "evidence", (0, 5)).score == 2
    assert len(llm.chat_requests) == 3


def test_failures_are_not_cached(llm, tmp_path):
    judge = make_judge(llm, retries=0, parse_retries=0, cache_dir=tmp_path)
    llm.queue(Reply.text("garbage"), ok(2))
    assert not judge.score("r", "e", (0, 5)).ok
    assert judge.score("r", "e", (0, 5)).score == 2
    assert len(llm.chat_requests) == 2


def test_k_vote_median_and_spread(llm):
    judge = make_judge(llm, votes=3)
    llm.queue(ok(2), ok(5), ok(4))
    verdict = judge.score("r", "e", (0, 5))
    assert verdict.score == 4 and verdict.spread == 3 and verdict.votes == [2, 5, 4]
    assert len({c.cache_key for c in judge.calls}) == 3
    assert [c.vote for c in judge.calls] == [0, 1, 2]
    again = judge.score("r", "e", (0, 5))
    assert again.cached and again.score == 4 and len(llm.chat_requests) == 3


def test_single_vote_key_is_vote_zero_of_k(llm):
    one = make_judge(llm)
    three = make_judge(llm, votes=3)
    assert one.cache_key("p", "e", 0) == three.cache_key("p", "e", 0)
    assert three.cache_key("p", "e", 1) != three.cache_key("p", "e", 0)


def test_cache_key_covers_reply_changing_settings(llm):
    from saasbench.services.judge import Judge, JudgeConfig

    def key(**kw: Any) -> str:
        cfg = dict(model="openai/fake", api_base="http://a.example/v1", temperature=0.0, max_tokens=1024)
        cfg.update(kw)
        return Judge(JudgeConfig(**cfg)).cache_key("p", "e", 0)

    base = key()
    # settings that do not change the reply keep the key
    assert key(timeout_s=3, retries=0, parse_retries=0, votes=5, api_key_env="SOME_KEY", backoff_cap_s=1) == base
    assert key(api_base="http://a.example/v1/") == base  # a trailing slash is the same server
    # settings that change the reply change it
    others = [
        key(api_base="http://b.example/v1"),
        key(api_base=None),
        key(max_tokens=64),
        key(temperature=0.7),
        key(model="openai/other"),
        key(drop_params=False),
    ]
    assert base not in others and len(set(others)) == len(others)


def test_cached_reply_not_reused_under_other_settings(llm, tmp_path):
    cache = tmp_path / "cache"
    llm.queue(ok(3), ok(1), ok(2))
    assert make_judge(llm, cache_dir=cache).score("r", "e", (0, 5)).score == 3
    assert make_judge(llm, cache_dir=cache).score("r", "e", (0, 5)).cached
    short = make_judge(llm, cache_dir=cache, max_tokens=16).score("r", "e", (0, 5))
    warm = make_judge(llm, cache_dir=cache, temperature=1.0).score("r", "e", (0, 5))
    assert (short.score, short.cached, warm.score, warm.cached) == (1, False, 2, False)
    assert len(llm.chat_requests) == 3


def test_configured_max_tokens_and_temperature_reach_the_request(llm):
    from saasbench.services.judge import Judge, JudgeConfig

    # as a sweep spec or the CLI would build it (plain JSON values)
    cfg = JudgeConfig.model_validate(
        {"model": "openai/fake", "api_base": llm.base_url, "max_tokens": 77, "temperature": 0.5, "votes": 2}
    )
    llm.queue(ok(2), ok(4))
    assert Judge(cfg).score("r", "e", (0, 5)).score == 3
    assert [r.body["max_tokens"] for r in llm.chat_requests] == [77, 77]
    assert [r.body["temperature"] for r in llm.chat_requests] == [0.5, 0.5]

    default = make_judge(llm)
    llm.queue(Reply.text("garbage"), ok(1))  # the re-ask after an unparseable reply too
    assert default.score("r2", "e", (0, 5)).score == 1
    assert [r.body["max_tokens"] for r in llm.chat_requests[2:]] == [1024, 1024]


# --- images ----------------------------------------------------------------------------------------------
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)


def test_screenshot_evidence_is_sent_as_image_urls(llm, tmp_path):
    from saasbench.services.judge import screenshot_evidence

    shot = tmp_path / "home.png"
    shot.write_bytes(PNG)
    ev = screenshot_evidence([str(shot)], dom="<main><nav>Home</nav></main>")
    judge = make_judge(llm)
    llm.queue(ok(5))
    assert judge.score("Layout?", ev.text, (0, 6), images=ev.images).score == 5
    content = llm.chat_requests[0].body["messages"][1]["content"]
    assert content[0] == {"type": "text", "text": f"## Rubric\nLayout?\n\n## Evidence\n{ev.text}"}
    assert content[1]["type"] == "image_url"
    assert content[1]["image_url"]["url"] == "data:image/png;base64," + base64.b64encode(PNG).decode()
    assert "<nav>Home</nav>" in ev.text


# --- evidence sampling ----------------------------------------------------------------------------------
def _write(root: Path, rel: str, text: str) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


@pytest.fixture
def workspace(tmp_path):
    root = tmp_path / "ws"
    for i in range(40):
        _write(root, f"src/models/model_{i:02d}.py", f"# model {i}\n" + "x = 1\n" * 2000)
    _write(root, "src/billing/invoice_service.py", "class InvoiceService:\n    def total(self): ...\n")
    _write(root, "src/auth/permissions.py", "def can(user, action): return user.is_admin\n")
    _write(root, "config/app.yaml", "port: 8080\n")
    _write(root, "config/db.yaml", "host: db\n")
    _write(root, "README.md", "# App\n")
    _write(root, "node_modules/lib/index.js", "module.exports = 1\n")
    _write(root, "tests/test_billing.py", "def test(): pass\n")
    _write(root, "package-lock.json", "{}\n")
    (root / "static").mkdir()
    (root / "static/logo.png").write_bytes(PNG)
    return root


def _ws(root: Path):
    from saasbench.services.workspace import Workspace

    return Workspace(root)


def test_code_evidence_is_deterministic_and_fair(workspace, tmp_path):
    from saasbench.services.judge import code_evidence

    entries = ["src", "keyword:billing", "config/*.yaml", "README.md"]
    rubric = "Evaluate the billing invoice logic and permission checks."
    ev = code_evidence(_ws(workspace), entries, rubric, total_chars=20_000, per_file_chars=4_000)
    assert len(ev.text) <= 20_000
    sampled = ev.summary["files"]
    # every entry got something although "src" alone could fill the budget
    per_entry = {e["entry"]: e["sampled"] for e in ev.summary["entries"]}
    assert per_entry["config/*.yaml"] == 2 and per_entry["README.md"] == 1, per_entry
    assert per_entry["keyword:billing"] == 0  # its one file was already taken by "src"
    # rubric keywords rank the billing and auth files first within src
    assert sampled[0] == "src/billing/invoice_service.py"
    assert "src/auth/permissions.py" in sampled
    assert "config/app.yaml" in sampled and "README.md" in sampled
    # skipped folders and junk never sampled
    assert not any(
        s.startswith(("node_modules/", "tests/")) or s.endswith((".png", "package-lock.json")) for s in sampled
    )
    # per-file budget
    for piece in ev.text.split("### ")[1:]:
        assert len(piece) < 4_000 + 200
    # identical inputs -> identical text, even from a copy at another path
    again = code_evidence(_ws(workspace), entries, rubric, total_chars=20_000, per_file_chars=4_000)
    assert again.text == ev.text
    copy = tmp_path / "elsewhere" / "copy"
    shutil.copytree(workspace, copy)
    assert code_evidence(_ws(copy), entries, rubric, total_chars=20_000, per_file_chars=4_000).text == ev.text
    assert "File listing" in ev.text and "src/billing/invoice_service.py" in ev.text


def test_early_broad_entry_cannot_starve_later_ones(workspace):
    from saasbench.services.judge import code_evidence

    ev = code_evidence(_ws(workspace), ["keyword:model", "config/db.yaml"], "models", total_chars=12_000)
    assert "config/db.yaml" in ev.summary["files"]
    assert len(ev.text) <= 12_000


def test_code_evidence_entries_and_fallback(workspace):
    from saasbench.services.judge import code_evidence

    ev = code_evidence(_ws(workspace), ["tests"], "billing")  # naming a skipped folder enters it
    assert ev.summary["files"] == ["tests/test_billing.py"]
    ev = code_evidence(_ws(workspace), ["../etc/passwd", "/etc/passwd", "nope/"], "billing invoices")
    kinds = [e["kind"] for e in ev.summary["entries"]]
    assert kinds[:3] == ["outside workspace", "outside workspace", "missing"]
    assert ev.summary["fallback_whole_workspace"] is True
    assert ev.summary["files"][0] == "src/billing/invoice_service.py"
    ev = code_evidence(_ws(workspace), ["src/**/*.py"], "auth", max_files=3)
    assert len(ev.summary["files"]) == 3 and ev.summary["files"][0] == "src/auth/permissions.py"
    tail = code_evidence(_ws(workspace), ["src/models/model_00.py"], "x", strategy="tail", per_file_chars=500)
    assert "# model 0" not in tail.text.split("```py", 1)[1]


def test_code_evidence_empty_workspace(tmp_path):
    from saasbench.services.judge import NoEvidence, code_evidence

    (tmp_path / "empty").mkdir()
    got = code_evidence(_ws(tmp_path / "empty"), ["src"], "anything")
    assert isinstance(got, NoEvidence) and "no evidence" in got.message


# --- P17 through the engine ------------------------------------------------------------------------------
def _ensure_p17() -> None:
    """Register the real P17 (another test may have swapped or unregistered it)."""
    from saasbench.primitives import judge as p17
    from saasbench.primitives.registry import REGISTRY

    if REGISTRY.spec("P17").fn is not p17.llm_judge:
        REGISTRY.register("P17", p17.llm_judge, p17.P17Inputs, raw_fields=p17.RAW_FIELDS)


def _judge_dag(p17_inputs: dict[str, Any], *, max_score: float = 10, before: list[dict] | None = None) -> Any:
    from saasbench.dag import load_dag_data

    _ensure_p17()

    nodes = [
        {
            "id": "README_EXISTS",
            "steps": [{"type": "P01", "inputs": {"path": "README.md"}}],
            "scoring": {"category": "Deployment", "method": "binary", "maxScore": 5},
        },
        {
            "id": "CODE_QUALITY",
            "prereqs": ["README_EXISTS"],
            "steps": (before or []) + [{"type": "P17", "inputs": p17_inputs}],
            "scoring": {"category": "ArchitectureQuality", "method": "llm-judge", "maxScore": max_score},
        },
    ]
    return load_dag_data({"nodes": nodes})


def _run(load, workspace: Path, judge: Any, *, enabled: bool = True, base_url: str | None = None):
    from saasbench.evaluation.context import RunContext, RunOptions, Target
    from saasbench.evaluation.engine import Engine

    ctx = RunContext(Target(workspace=workspace, base_url=base_url), options=RunOptions(judge_enabled=enabled))
    ctx.judge = judge
    report = Engine(load.dag, ctx).run()
    return {n.id: n for n in report.nodes}, report


RUBRIC = {
    "rubric_prompt": "Evaluate the billing invoice code. Score 0-5.",
    "score_range": [0, 5],
    "files_to_sample": ["src/billing", "keyword:auth"],
}


def test_engine_scores_the_judge(llm, workspace):
    judge = make_judge(llm)
    llm.queue(ok(3, "decent"))
    nodes, report = _run(_judge_dag(RUBRIC), workspace, judge)
    node = nodes["CODE_QUALITY"]
    assert node.status.value == "PASSED" and node.score == 6  # 3 on [0, 5] -> 6 of 10
    step = node.steps[-1]
    assert step.evidence["model"] == "openai/fake" and step.evidence["cached"] is False
    assert step.evidence["evidence"]["files"][:2] == ["src/billing/invoice_service.py", "src/auth/permissions.py"]
    assert node.judge["score"] == 3
    assert report.summary.task_score == pytest.approx(100 * (5 + 6) / 15, abs=0.01)
    user = llm.chat_requests[0].body["messages"][1]["content"]
    assert user.startswith(
        "## Rubric\nEvaluate the billing invoice code. Score 0-5.\n\n## Evidence\n# Workspace evidence"
    )


def test_engine_clips_judge_above_range(llm, workspace):
    llm.queue(ok(7))
    nodes, _ = _run(_judge_dag(RUBRIC), workspace, make_judge(llm))
    assert nodes["CODE_QUALITY"].score == 10


def test_outage_is_skipped_llm_and_excluded(llm, workspace):
    judge = make_judge(llm, retries=2)  # every reply is HTTP 500
    nodes, report = _run(_judge_dag(RUBRIC), workspace, judge)
    node = nodes["CODE_QUALITY"]
    assert node.status.value == "SKIPPED_LLM"
    assert "500" in node.message
    assert len(llm.chat_requests) == 3
    assert report.summary.task_score == 100.0  # 5/5: the skipped node is out of both sums
    assert report.summary.max_score == 5
    assert report.summary.skipped_llm_max_score == 10


def test_malformed_reply_is_skipped_llm(llm, workspace):
    llm.queue(Reply.text("no idea"), Reply.text("still no idea"))
    nodes, report = _run(_judge_dag(RUBRIC), workspace, make_judge(llm, parse_retries=1))
    assert nodes["CODE_QUALITY"].status.value == "SKIPPED_LLM"
    assert "unparseable" in nodes["CODE_QUALITY"].message
    assert report.summary.skipped_llm_max_score == 10


def test_disabled_judge_is_skipped_llm(llm, workspace):
    nodes, _ = _run(_judge_dag(RUBRIC), workspace, None, enabled=True)
    assert nodes["CODE_QUALITY"].status.value == "SKIPPED_LLM"
    assert "judge disabled" in nodes["CODE_QUALITY"].message
    nodes, report = _run(_judge_dag(RUBRIC), workspace, make_judge(llm), enabled=False)
    assert nodes["CODE_QUALITY"].status.value == "SKIPPED_LLM"
    assert report.summary.task_score == 100.0
    assert llm.chat_requests == []


def test_missing_response_is_failed_not_skipped(llm, workspace):
    inputs = {"rubric": "Is the page good?", "evidence_source": "last_body", "maxScore": 4}
    nodes, report = _run(_judge_dag(inputs, max_score=4), workspace, make_judge(llm))
    node = nodes["CODE_QUALITY"]
    assert node.status.value == "FAILED" and node.score == 0
    assert "no HTTP response" in node.message
    assert report.summary.max_score == 9  # a missing page counts against the app
    assert llm.chat_requests == []


def test_response_evidence_and_aliases(llm, workspace):
    from saasbench.evaluation.context import RunContext, RunOptions, Target
    from saasbench.primitives.registry import REGISTRY
    from saasbench.services.http import HttpResponse

    _ensure_p17()
    ctx = RunContext(Target(workspace=workspace), options=RunOptions(judge_enabled=True))
    ctx.judge = make_judge(llm)
    ctx.last_response = HttpResponse(
        method="GET",
        url="http://app/items?token=abc",
        status=200,
        headers={"content-type": "application/json"},
        text='{"items": []}',
        body={"items": []},
        is_json=True,
        elapsed_ms=1.0,
    )
    spec = REGISTRY.spec("P17")
    inputs = spec.inputs.model_validate(
        {"prompt": "Empty list ok?", "evidence_source": "http_response_body", "max_score": 2}
    )
    llm.queue(ok(2))
    result = spec.fn(inputs, ctx)
    assert result.passed and result.judge_score == 2 and result.judge_range == (0, 2)
    user = llm.chat_requests[0].body["messages"][1]["content"]
    assert 'HTTP 200 application/json\nRequest: GET /items\n\n{"items": []}' in user
    assert "token=abc" not in user


def test_loader_normalises_p17_dialects():
    load = _judge_dag(
        {
            "rubric": "R",
            "evidence_source": "codebase",
            "max_score": 6,
            "evidence_files": ["src"],
            "sample_limit": 12,
            "rubric_id": "R01",
            "sample_strategy": "structure_and_key_files",
        }
    )
    messages = [i.message for i in load.issues if i.kind == "normalisation"]
    for expected in (
        "'rubric' -> 'rubric_prompt'",
        "'evidence_source' -> 'evidence_type'",
        "'codebase' -> 'code_files'",
        "'max_score' -> 'score_range'",
        "'evidence_files' -> 'files_to_sample'",
        "'sample_limit' -> 'max_files'",
    ):
        assert any(expected in m for m in messages), (expected, messages)
    assert not [i for i in load.issues if i.kind == "warning" and "P17" in i.message]


def test_rubric_is_not_placeholder_resolved(llm, workspace):
    inputs = {
        "rubric_prompt": "Templates like {{user_name}} must be escaped. Score 0-5.",
        "files_to_sample": ["README.md"],
    }
    llm.queue(ok(1))
    nodes, _ = _run(_judge_dag(inputs), workspace, make_judge(llm))
    assert nodes["CODE_QUALITY"].status.value == "PASSED"
    assert "{{user_name}}" in llm.chat_requests[0].body["messages"][1]["content"]
    # no score_range: taken from the rubric text, handed to the engine so 1 of 5 -> 2 of 10
    assert nodes["CODE_QUALITY"].score == 2
    assert llm.chat_requests[0].body["messages"][0]["content"] == PAPER_SYSTEM


def test_keys_never_in_evidence_or_records(llm, workspace, key_env, monkeypatch):
    llm.queue(Reply.text(json.dumps({"score": 4, "reasoning": f"the key {SECRET} leaked"})))
    judge = make_judge(llm, api_key_env=key_env)
    nodes, report = _run(_judge_dag(RUBRIC), workspace, judge)
    assert nodes["CODE_QUALITY"].status.value == "PASSED"
    assert llm.chat_requests[0].headers.get("authorization") == f"Bearer {SECRET}"
    blob = (
        report.model_dump_json()
        + json.dumps([c.model_dump(mode="json") for c in judge.calls])
        + repr(judge)
        + judge.config.model_dump_json()
    )
    assert SECRET not in blob
    assert KEY_ENV in judge.config.model_dump_json()  # the name is kept, the value never


def test_cached_judge_through_engine(llm, workspace, tmp_path):
    llm.queue(ok(5))
    _run(_judge_dag(RUBRIC), workspace, make_judge(llm, cache_dir=tmp_path / "c"))
    nodes, _ = _run(_judge_dag(RUBRIC), workspace, make_judge(llm, cache_dir=tmp_path / "c"))
    assert nodes["CODE_QUALITY"].steps[-1].evidence["cached"] is True
    assert nodes["CODE_QUALITY"].score == 10
    assert len(llm.chat_requests) == 1


# --- the fake server itself (used by other tests too) ----------------------------------------------------
@pytest.mark.filterwarnings("ignore:Item .*ReadOnly:UserWarning")
def test_fake_llm_models_and_streaming(llm):
    import urllib.request

    from saasbench.services.judge import _litellm

    with urllib.request.urlopen(llm.base_url + "/models") as resp:
        assert json.load(resp)["data"][0]["id"] == "fake"
    llm.queue(Reply.text("hello streaming world"))
    chunks = _litellm().completion(
        model="openai/fake",
        api_base=llm.base_url,
        api_key="x",
        stream=True,
        messages=[{"role": "user", "content": "hi"}],
    )
    text = "".join((c.choices[0].delta.content or "") for c in chunks)
    assert text == "hello streaming world"
    assert llm.chat_requests[-1].body["stream"] is True
