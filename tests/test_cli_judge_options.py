"""The judge's max_tokens, temperature, timeout and votes are reachable from every command that judges
(issue #19): ``--judge-max-tokens``, ``--judge-temperature``, ``--judge-timeout`` and ``--judge-votes`` on
``evaluate``, ``run``, ``sweep`` and ``rescore`` (and a sweep spec's ``judge:`` block); what is given
reaches the HTTP request the judge sends (tests/fake_llm.py records them)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_cli_judge_db import _dag, teamnotes  # noqa: F401 - fixture: the TeamNotes app on 127.0.0.1
from typer.testing import CliRunner

from saasbench import lake as lakelib
from saasbench.cli.main import app
from tests.fake_llm import FakeLLM, Reply

runner = CliRunner()


def _evaluate(tmp_path: Path, base_url: str, ws: Path, *extra: str):
    return runner.invoke(
        app,
        [
            "evaluate",
            "--dag",
            str(_dag(tmp_path / "dag.json")),
            "--base-url",
            base_url,
            "--workspace",
            str(ws),
            "--out",
            str(tmp_path / "out"),
            "--var",
            "item=a",
            *extra,
        ],
    )


def test_evaluate_judge_options_reach_the_judge_request(teamnotes, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    base_url, ws = teamnotes
    with FakeLLM(default=Reply.json({"score": 3, "reasoning": "fine"})) as llm:
        llm.queue(Reply.slow(json.dumps({"score": 3, "reasoning": "late"}), 5.0))  # past --judge-timeout 1
        result = _evaluate(
            tmp_path,
            base_url,
            ws,
            "--judge-model",
            "openai/fake",
            "--judge-api-base",
            llm.base_url,
            "--judge-max-tokens",
            "77",
            "--judge-temperature",
            "0.35",
            "--judge-timeout",
            "1",
            "--judge-votes",
            "2",
        )
        assert result.exit_code == 0, result.output
        requests = llm.chat_requests
    # one llm-judge node, two votes; the first answer came after 5 s, past the 1 s timeout: asked again
    assert len(requests) == 3
    assert {(r.body["max_tokens"], r.body["temperature"]) for r in requests} == {(77, 0.35)}
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    arch = next(n for n in report["nodes"] if n["id"] == "ARCH")
    assert arch["status"] == "PASSED" and arch["score"] == 6.0


def test_judge_options_need_a_judge_and_valid_values(teamnotes, tmp_path):  # noqa: F811
    base_url, ws = teamnotes
    res = _evaluate(tmp_path, base_url, ws, "--judge-max-tokens", "10", "--judge-votes", "3")
    assert res.exit_code == 2 and "--judge-max-tokens/--judge-votes need a judge" in res.output
    res = _evaluate(tmp_path, base_url, ws, "--judge-model", "openai/fake", "--judge-temperature", "3")
    assert res.exit_code == 2 and "invalid judge settings" in res.output
    res = runner.invoke(app, ["sweep", "--task", "timetrack", "--agent", "nop", "--no-prefect", "--judge-timeout", "5"])
    assert res.exit_code == 2 and "--judge-timeout need a judge" in res.output
    res = runner.invoke(app, ["run", "--task", "timetrack", "--agent", "nop", "--no-prefect", "--judge-votes", "2"])
    assert res.exit_code == 2 and "--judge-votes need a judge" in res.output


@pytest.mark.slow
def test_sweep_spec_judge_block_cli_overrides_and_rescore(tmp_path, monkeypatch):
    """A sweep spec's ``judge:`` sets max_tokens and temperature, ``saasbench sweep`` adds --judge-votes and
    --judge-timeout to it; ``saasbench rescore --judge-only --judge-max-tokens`` changes only that setting
    of the parent's judge. Every judge request carries the settings in force."""
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    lake = str(tmp_path / "lake")
    with FakeLLM(default=Reply.json({"score": 4, "reasoning": "fine"})) as llm:
        spec = tmp_path / "sweep.yaml"
        spec.write_text(
            json.dumps(  # YAML is a superset of JSON
                {
                    "sweep_id": "s-judgeopts",
                    "tasks": ["timetrack"],
                    "agents": ["oracle"],
                    "lake": lake,
                    "report_dir": str(tmp_path / "reports"),
                    "judge": {"model": "openai/fake", "api_base": llm.base_url, "max_tokens": 55, "temperature": 0.2},
                }
            )
        )
        res = runner.invoke(app, ["sweep", str(spec), "--no-prefect", "--judge-votes", "2", "--judge-timeout", "30"])
        assert res.exit_code == 0, res.output
        swept = list(llm.chat_requests)
        nodes = lakelib.query(
            lake, "SELECT count(*) AS n FROM node_results WHERE method = 'llm-judge'", sweep_id="s-judgeopts"
        ).to_pylist()[0]["n"]
        assert nodes and len(swept) == 2 * nodes
        assert {(r.body["max_tokens"], r.body["temperature"]) for r in swept} == {(55, 0.2)}
        res = runner.invoke(
            app,
            [
                "rescore",
                "s-judgeopts",
                "--judge-only",
                "--judge-max-tokens",
                "66",
                "--sweep-id",
                "s-rj",
                "--lake",
                lake,
            ],
        )
        assert res.exit_code == 0, res.output
        rejudged = llm.chat_requests[len(swept) :]
    assert rejudged and {(r.body["max_tokens"], r.body["temperature"]) for r in rejudged} == {(66, 0.2)}
    assert len(rejudged) == len(swept)  # still two votes per node: only max_tokens changed
    configs = {
        r["sweep_id"]: json.loads(r["config_json"])["judge"]
        for r in lakelib.query(lake, "SELECT sweep_id, config_json FROM sweeps").to_pylist()
    }
    settings = {
        s: (j["model"], j["max_tokens"], j["temperature"], j["votes"], j["timeout_s"]) for s, j in configs.items()
    }
    assert settings == {"s-judgeopts": ("openai/fake", 55, 0.2, 2, 30.0), "s-rj": ("openai/fake", 66, 0.2, 2, 30.0)}
