"""A lake that goes down stops a sweep at once (issue #17 item 9).

Before: with the S3 endpoint killed mid-sweep, a ``--no-prefect`` sweep ran its remaining trials for
114 s and discarded every one (nothing could be committed). Now the first trial that cannot reach
the lake stops the sweep: no further trial starts, and the sweep raises a one-line ``LakeError``
that says how many trials were left for the next run. A real moto S3 server, killed by its PID.
"""

from __future__ import annotations

import os
import signal

import pytest
from s3server import start_moto
from shared_data import oracle_sweep_spec

from saasbench import lake as lakelib
from saasbench.agents.oracle import OracleAgent
from saasbench.failures import LakeError
from saasbench.runs import sweep as sw


@pytest.fixture
def moto(monkeypatch):
    for k, v in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(k, v)
    proc, url, _log = start_moto()
    monkeypatch.setenv("SAASBENCH_S3_ENDPOINT", url)
    import boto3

    boto3.client("s3", endpoint_url=url, region_name="us-east-1").create_bucket(Bucket="outage")
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def test_a_lake_outage_stops_the_sweep_and_leaves_the_rest_pending(tmp_path, moto, monkeypatch):
    runs: list[str] = []
    real = OracleAgent.run

    def counting(self, prompt, env, budget):
        runs.append(env.workspace_path)
        return real(self, prompt, env, budget)

    monkeypatch.setattr(OracleAgent, "run", counting)
    spec = oracle_sweep_spec(tmp_path, "s-lakeout", lake="s3://outage/lake", attempts=4, retries=1, compact=False)
    assert len(sw.plan(spec)) == 4

    def kill_after_first(trial, outcome) -> None:
        if moto.poll() is None:
            os.kill(moto.pid, signal.SIGKILL)  # the object store dies after the first commit
            moto.wait(timeout=10)

    with pytest.raises(LakeError) as err:
        sw.run_sweep_plain(spec, 1, sleep=lambda s: None, on_done=kill_after_first)
    message = str(err.value)
    assert "\n" not in message and "cannot be written" in message and "run the sweep again" in message
    # the next trial failed at its first checkpoint, before its agent ran; the two after it never started
    assert len(runs) == 1
    assert "2 trial(s) not started, 1 committed" in message


def test_a_lake_down_at_the_start_fails_before_any_trial(tmp_path, moto, monkeypatch):
    monkeypatch.setattr(OracleAgent, "run", lambda *a: pytest.fail("no trial may start"))
    os.kill(moto.pid, signal.SIGKILL)
    moto.wait(timeout=10)
    spec = oracle_sweep_spec(tmp_path, "s-lakedown0", lake="s3://outage/lake")
    with pytest.raises(lakelib.LakeStoreError, match="outage/lake"):
        sw.run_sweep_plain(spec, 1, sleep=lambda s: None)
