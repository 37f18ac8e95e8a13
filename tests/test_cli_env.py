"""`saasbench env up/exec/down/prune` against a real Docker engine."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from saasbench.environments.docker import L_TRIAL


def _cli(*args: str, env: dict[str, str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "saasbench.cli.main", *args], env=env, capture_output=True, text=True, timeout=120, **kw
    )


def test_env_up_exec_and_teardown(docker_client, python_image):  # noqa: F811
    env = {**os.environ, "DOCKER_HOST": docker_client.saasbench_base_url, "COLUMNS": "200"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "saasbench.cli.main", "env", "up", "timetrack", "--backend", "docker"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    trial = None
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if line.startswith("trial id "):
                trial = line.split()[2]
            if "holding the environment" in line:
                break
        out = "".join(lines)
        assert trial and "app up at http://" in out, out
        listing = _cli("env", "exec", trial, "ls /app", env=env)
        assert listing.returncode == 0 and "run.sh" in listing.stdout, listing.stdout + listing.stderr
        failing = _cli("env", "exec", trial, "exit 3", env=env)
        assert failing.returncode == 3
    finally:
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=120)
    assert "environment stopped" in rest
    assert docker_client.containers.list(all=True, filters={"label": f"{L_TRIAL}={trial}"}) == []
    assert "nothing" in _cli("env", "prune", "--dry-run", env=env).stdout
