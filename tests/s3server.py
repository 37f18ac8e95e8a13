"""A throwaway S3 endpoint for tests: ``moto_server`` (moto[server]) as a subprocess.

MinIO is not obtainable on the project's machines (no Debian or PyPI package of the server), so
the tests use moto's standalone server: a real HTTP S3 endpoint on a free 127.0.0.1 port, with a
bucket created up front. The process is started from this venv, stopped by its own PID (SIGTERM,
then SIGKILL) at the end of the session; nothing else is touched. If it cannot start, the fixture
raises: a test session fails loudly instead of skipping.

Use from a test module::

    from s3server import s3_server   # pytest fixture (session scope): yields an S3Server

The fixture sets dummy ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/``AWS_DEFAULT_REGION`` for
the session (moto accepts any) and restores the previous values afterwards.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest


class ServerUnavailable(RuntimeError):
    """moto_server is missing or did not start."""


@dataclass
class S3Server:
    endpoint_url: str
    bucket: str
    pid: int
    region: str = "us-east-1"

    def client(self):
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name=self.region,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )

    def uri(self, prefix: str) -> str:
        return f"s3://{self.bucket}/{prefix}"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _moto_command(port: int) -> list[str]:
    exe = Path(sys.executable).parent / "moto_server"
    if exe.exists():
        return [str(exe), "-H", "127.0.0.1", "-p", str(port)]
    return [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]


def _stop_pid(proc: subprocess.Popen, timeout_s: float = 10.0) -> None:
    if proc.poll() is not None:
        return
    os.kill(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=timeout_s)


def start_moto(timeout_s: float = 30.0) -> tuple[subprocess.Popen, str, Path]:
    try:
        import moto  # noqa: F401
    except ImportError as exc:
        raise ServerUnavailable(
            "moto[server] is not installed in this venv (pip install 'moto[server]==5.2.5')"
        ) from exc
    port = free_port()
    log = Path(tempfile.mkdtemp(prefix="moto-")) / "moto.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(_moto_command(port), stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServerUnavailable(f"moto_server exited ({proc.returncode}): {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(url + "/", timeout=1) as r:
                if r.status == 200:
                    return proc, url, log
        except OSError:
            time.sleep(0.05)
    _stop_pid(proc)
    raise ServerUnavailable(f"moto_server did not answer on {url} within {timeout_s:g}s")


_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
_CLEAR = ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "SAASBENCH_S3_ENDPOINT")


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    saved = {k: os.environ.get(k) for k in (*_ENV, *_CLEAR)}
    os.environ.update(_ENV)
    for k in _CLEAR:
        os.environ.pop(k, None)
    proc, url, _log = start_moto()
    try:
        server = S3Server(endpoint_url=url, bucket="saasbench-results", pid=proc.pid)
        server.client().create_bucket(Bucket=server.bucket)
        yield server
    finally:
        _stop_pid(proc)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
