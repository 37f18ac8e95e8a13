"""Throwaway database servers for tests: PostgreSQL (initdb + pg_ctl) and MariaDB (mariadbd).

Each server gets a fresh temporary directory, listens on a free 127.0.0.1 port only, and is
stopped by its own PID at the end (``pg_ctl stop``, then SIGTERM/SIGKILL of the postmaster PID;
SIGTERM/SIGKILL of the mariadbd PID). Missing binaries raise :class:`ServerUnavailable` so a
test session fails loudly instead of skipping: CI must install them (PostgreSQL 15 is in the
machine image; MariaDB comes from the Debian package ``mariadb-server``).

Running as root (the project's machines), PostgreSQL refuses to run as root, so its commands run
as the ``postgres`` user through ``runuser`` and the data directory is owned by that user.

Use from a test module::

    from pgserver import postgres_server        # pytest fixture (session scope): yields a DSN
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest


class ServerUnavailable(RuntimeError):
    """The server binaries are missing or the server did not start."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(port: int, pid_alive, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not pid_alive():
            raise ServerUnavailable(f"server process exited before listening on port {port}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise ServerUnavailable(f"server did not listen on 127.0.0.1:{port} within {timeout_s:g}s")


def _stop_pid(pid: int, timeout_s: float = 15.0) -> None:
    """SIGTERM one PID we started, wait, then SIGKILL it."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


# --- PostgreSQL -----------------------------------------------------------------------------------
def find_pg_bin() -> Path:
    """The directory holding initdb/pg_ctl: $SAASBENCH_PG_BIN, newest /usr/lib/postgresql/*/bin, or PATH."""
    env = os.environ.get("SAASBENCH_PG_BIN")
    candidates = [Path(env)] if env else []
    versions = sorted(
        glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: _version_key(Path(p).parent.name), reverse=True
    )
    candidates += [Path(p) for p in versions]
    which = shutil.which("initdb")
    if which:
        candidates.append(Path(which).parent)
    for c in candidates:
        if (c / "initdb").is_file() and (c / "pg_ctl").is_file():
            return c
    raise ServerUnavailable(
        "PostgreSQL binaries not found (looked in $SAASBENCH_PG_BIN, /usr/lib/postgresql/*/bin, PATH): "
        "install the Debian package postgresql (apt-get install -y postgresql)"
    )


def _version_key(name: str) -> tuple:
    return tuple(int(p) if p.isdigit() else 0 for p in name.split("."))


class PostgresServer:
    """A temporary PostgreSQL cluster: ``start()`` returns the DSN, ``stop()`` removes everything."""

    def __init__(self) -> None:
        self.bin = find_pg_bin()
        self.root = Path(tempfile.mkdtemp(prefix="saasbench-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.port = 0
        self.pid: int | None = None
        self._as_postgres = os.geteuid() == 0

    def _cmd(self, args: list[str]) -> list[str]:
        if self._as_postgres:
            return ["runuser", "-u", "postgres", "--", *args]
        return args

    def _run(self, args: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(self._cmd(args), capture_output=True, text=True, timeout=timeout, cwd=self.root)

    def start(self) -> str:
        if self._as_postgres:
            try:
                pw = pwd.getpwnam("postgres")
            except KeyError as exc:
                raise ServerUnavailable("running as root but there is no 'postgres' user to run PostgreSQL as") from exc
            os.chown(self.root, pw.pw_uid, pw.pw_gid)
        r = self._run(
            [
                str(self.bin / "initdb"),
                "-D",
                str(self.data),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ]
        )
        if r.returncode != 0:
            raise ServerUnavailable(f"initdb failed ({r.returncode}): {r.stderr.strip() or r.stdout.strip()}")
        self.port = free_port()
        opts = (
            f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.root} -c fsync=off "
            "-c synchronous_commit=off -c full_page_writes=off -c max_connections=20"
        )
        r = self._run(
            [
                str(self.bin / "pg_ctl"),
                "-D",
                str(self.data),
                "-l",
                str(self.log),
                "-o",
                opts,
                "-w",
                "-t",
                "60",
                "start",
            ],
            timeout=90,
        )
        pid_file = self.data / "postmaster.pid"
        if pid_file.exists():
            self.pid = int(pid_file.read_text().split("\n", 1)[0])
        if r.returncode != 0:
            log = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
            self.stop()
            raise ServerUnavailable(f"pg_ctl start failed ({r.returncode}): {r.stderr.strip()}\n{log}")
        _wait_port(self.port, lambda: self.pid is None or _alive(self.pid))
        return self.dsn

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def stop(self) -> None:
        try:
            if self.data.exists():
                self._run(
                    [str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "-t", "30", "stop"], timeout=45
                )
        except (subprocess.TimeoutExpired, OSError):
            pass
        if self.pid is not None and _alive(self.pid):
            _stop_pid(self.pid)
        shutil.rmtree(self.root, ignore_errors=True)


# --- MariaDB --------------------------------------------------------------------------------------
def find_mariadb() -> tuple[str, str]:
    server = shutil.which("mariadbd") or ("/usr/sbin/mariadbd" if os.path.exists("/usr/sbin/mariadbd") else None)
    install = shutil.which("mariadb-install-db")
    if not server or not install:
        raise ServerUnavailable(
            "MariaDB binaries not found (mariadbd, mariadb-install-db): install the Debian package mariadb-server"
        )
    return server, install


class MariaDbServer:
    """A temporary MariaDB server, root with an empty password over TCP (recipe of db-feasibility.md)."""

    def __init__(self) -> None:
        self.server, self.install = find_mariadb()
        self.root = Path(tempfile.mkdtemp(prefix="saasbench-mariadb-"))
        self.port = 0
        self.proc: subprocess.Popen | None = None

    def start(self, database: str = "saas") -> str:
        opts = [
            "--no-defaults",
            f"--datadir={self.root / 'data'}",
            "--innodb-log-file-size=8M",
            "--innodb-buffer-pool-size=32M",
        ]
        user = ["--user=root"] if os.geteuid() == 0 else []
        r = subprocess.run(
            [self.install, *opts, *user, "--auth-root-authentication-method=normal", "--skip-test-db"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if r.returncode != 0:
            raise ServerUnavailable(f"mariadb-install-db failed ({r.returncode}): {r.stderr.strip()[-1500:]}")
        self.port = free_port()
        log = open(self.root / "stdout.log", "wb")
        self.proc = subprocess.Popen(
            [
                self.server,
                *opts,
                *user,
                "--bind-address=127.0.0.1",
                f"--port={self.port}",
                "--skip-name-resolve",
                f"--socket={self.root / 'mysqld.sock'}",
                f"--pid-file={self.root / 'mysqld.pid'}",
                f"--log-error={self.root / 'err.log'}",
                "--performance-schema=OFF",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        try:
            _wait_port(self.port, lambda: self.proc is not None and self.proc.poll() is None)
            self._create_database(database)
        except Exception:  # noqa: BLE001 - a server probe during start-up
            err = (
                (self.root / "err.log").read_text(errors="replace")[-2000:] if (self.root / "err.log").exists() else ""
            )
            self.stop()
            raise ServerUnavailable(f"mariadbd did not start: {err}") from None
        return f"mysql://root@127.0.0.1:{self.port}/{database}"

    def _create_database(self, database: str) -> None:
        import pymysql

        deadline = time.monotonic() + 30
        while True:
            try:
                conn = pymysql.connect(host="127.0.0.1", port=self.port, user="root", password="", autocommit=True)
                break
            except pymysql.err.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        with conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE IF NOT EXISTS `{database}`")
        conn.close()

    def stop(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:  # our child: wait() reaps it (kill(pid, 0) would see a zombie)
                self.proc.terminate()
                try:
                    self.proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(timeout=10)
            self.proc = None
        shutil.rmtree(self.root, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# --- pytest fixtures ------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """DSN of a PostgreSQL cluster started for the test session (fails, never skips, without binaries)."""
    server = PostgresServer()
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture(scope="session")
def mariadb_server() -> Iterator[str]:
    """DSN (mysql://root@127.0.0.1:PORT/saas) of a MariaDB server started for the test session."""
    server = MariaDbServer()
    try:
        yield server.start()
    finally:
        server.stop()


# --- MongoDB wire-protocol emulator (nx-27017, SQLite-backed; not a real mongod) ---------------------
def find_nx27017() -> str:
    import sys

    beside = Path(sys.executable).parent / "nx-27017"
    found = str(beside) if beside.exists() else shutil.which("nx-27017")
    if not found:
        raise ServerUnavailable("nx-27017 (MongoDB wire-protocol emulator) not found: pip install nx-27017")
    return found


class MongoEmulator:
    """nx-27017 on a free port: enough for pymongo CRUD, counts, aggregates and index listing."""

    def __init__(self) -> None:
        self.binary = find_nx27017()
        self.root = Path(tempfile.mkdtemp(prefix="saasbench-nx27017-"))
        self.port = 0
        self.proc: subprocess.Popen | None = None

    def start(self, database: str = "app") -> str:
        self.port = free_port()
        log = open(self.root / "server.log", "wb")
        self.proc = subprocess.Popen(
            [self.binary, "--data-dir", str(self.root / "data"), "--host", "127.0.0.1", "-p", str(self.port)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        try:
            _wait_port(self.port, lambda: self.proc is not None and self.proc.poll() is None)
        except ServerUnavailable:
            text = (self.root / "server.log").read_text(errors="replace")[-2000:]
            self.stop()
            raise ServerUnavailable(f"nx-27017 did not start: {text}") from None
        return f"mongodb://127.0.0.1:{self.port}/{database}"

    def stop(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.terminate()
                try:
                    self.proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(timeout=10)
            self.proc = None
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture(scope="session")
def mongo_server() -> Iterator[str]:
    """DSN (mongodb://127.0.0.1:PORT/app) of an nx-27017 emulator started for the test session."""
    server = MongoEmulator()
    try:
        yield server.start()
    finally:
        server.stop()
