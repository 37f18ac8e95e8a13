"""A Docker engine for tests: the host's, or a private ``dockerd`` started for the session.

- ``/var/run/docker.sock`` answers a ping: use it (nothing is started or stopped).
- Otherwise start Debian's ``dockerd`` (package ``docker.io``) with a temporary data root and
  exec root, ``--iptables=false --bridge=none``, storage overlay2 (vfs when overlay2 does not
  start) and a private socket, wait
  for its ping, and stop it by its PID at the end (SIGTERM, then SIGKILL). No iptables rules, no
  default bridge: user-defined bridge networks (one per trial) still work, containers on one
  reach each other by name, and this host reaches them by address (checked on the project machine).
- A missing ``dockerd`` fails the session loudly: CI must ``apt-get install -y docker.io busybox-static``.

Images (no registry is reachable): ``local/busybox:ci`` is imported from the host's static
busybox with every applet linked; ``saasbench/debian-python:bookworm`` (bash + python3, what
the conformance suite needs) is imported from the tarball ``infra/base-image/build.sh --tar-only``
builds once and caches under ``~/.cache/saasbench/base-image`` (debootstrap, ~40 s the first time).

Use from a test module::

    from dockerd import docker_client, busybox_image, python_image   # pytest fixtures (session scope)
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import signal
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

HOST_SOCKET = "/var/run/docker.sock"
BUSYBOX_IMAGE = "local/busybox:ci"
PYTHON_IMAGE = "saasbench/debian-python:bookworm"
REPO = Path(__file__).resolve().parents[1]


class DockerUnavailable(RuntimeError):
    """dockerd is missing or did not start."""


def _ping(base_url: str):
    import docker

    client = docker.DockerClient(base_url=base_url, timeout=60)
    client.ping()
    return client


def _start_dockerd(root: Path) -> tuple[subprocess.Popen, str]:
    """overlay2 when the kernel and file system allow it (containers start 2-4x faster than on
    vfs, which copies the whole image per container), else vfs; ``SAASBENCH_DOCKER_STORAGE`` forces one."""
    exe = shutil.which("dockerd")
    if exe is None:
        raise DockerUnavailable("dockerd not found: apt-get install -y docker.io (and busybox-static)")
    forced = os.environ.get("SAASBENCH_DOCKER_STORAGE")
    drivers = [forced] if forced else ["overlay2", "vfs"]
    for i, driver in enumerate(drivers):
        try:
            return _start_dockerd_with(exe, root / driver, driver)
        except DockerUnavailable:
            if i == len(drivers) - 1:
                raise
    raise AssertionError("unreachable")


def _start_dockerd_with(exe: str, root: Path, driver: str) -> tuple[subprocess.Popen, str]:
    root.mkdir(parents=True)
    sock = root / "docker.sock"
    log = open(root / "dockerd.log", "wb")  # noqa: SIM115 - kept open for the daemon's lifetime
    proc = subprocess.Popen(
        [
            exe,
            "--data-root",
            str(root / "data"),
            "--exec-root",
            str(root / "exec"),
            "--pidfile",
            str(root / "dockerd.pid"),
            "-H",
            f"unix://{sock}",
            f"--storage-driver={driver}",
            "--iptables=false",
            "--ip-masq=false",
            "--bridge=none",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    base_url = f"unix://{sock}"
    end = time.monotonic() + 30
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise DockerUnavailable(
                f"dockerd exited with {proc.returncode}:\n{(root / 'dockerd.log').read_text()[-3000:]}"
            )
        if sock.exists():
            with contextlib.suppress(Exception):  # not ready yet
                _ping(base_url)
                return proc, base_url
        time.sleep(0.1)
    _stop(proc)
    raise DockerUnavailable(f"dockerd did not answer within 30 s:\n{(root / 'dockerd.log').read_text()[-3000:]}")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def _unmount_under(root: Path) -> None:
    """Unmount whatever is still mounted below ``root`` (deepest first), only there."""
    prefix = str(root).rstrip("/") + "/"
    try:
        with open("/proc/self/mountinfo", encoding="utf-8") as fh:
            points = [line.split()[4].replace("\\040", " ") for line in fh]
    except OSError:
        return
    for point in sorted((p for p in points if p.startswith(prefix)), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], check=False, capture_output=True)


def busybox_tar() -> bytes:
    """A root file system with the host's static busybox and a link per applet."""
    busybox = shutil.which("busybox")
    if busybox is None:
        raise DockerUnavailable("busybox not found: apt-get install -y busybox-static")
    applets = subprocess.run([busybox, "--list"], capture_output=True, text=True, check=True).stdout.split()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for d in ("bin", "tmp", "www", "etc"):
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if d == "tmp" else 0o755
            tar.addfile(info)
        tar.add(busybox, arcname="bin/busybox")
        for name in applets:
            if name != "busybox":
                info = tarfile.TarInfo(f"bin/{name}")
                info.type, info.linkname = tarfile.SYMTYPE, "busybox"
                tar.addfile(info)
    return buf.getvalue()


@pytest.fixture(scope="session")
def docker_client() -> Iterator:
    """A ``docker.DockerClient`` to the host engine or a private dockerd for this session
    (``client.saasbench_base_url``: its address, for subprocesses that need their own client)."""
    if os.path.exists(HOST_SOCKET):
        try:
            client = _ping(f"unix://{HOST_SOCKET}")
        except Exception:  # noqa: BLE001 - a stale socket: start our own
            client = None
        if client is not None:
            client.saasbench_base_url = f"unix://{HOST_SOCKET}"
            yield client
            client.close()
            return
    root = Path(tempfile.mkdtemp(prefix="sbdk-", dir="/tmp"))  # short: unix socket paths are limited to 107 bytes
    proc, base_url = _start_dockerd(root)
    client = _ping(base_url)
    client.saasbench_base_url = base_url  # for subprocesses that need their own client
    try:
        yield client
    finally:
        client.close()
        _stop(proc)
        _unmount_under(root)  # dockerd leaves exec-root/netns/default mounted after it stops
        subprocess.run(["rm", "-rf", "--one-file-system", str(root)], check=False)


@pytest.fixture(scope="session")
def busybox_image(docker_client) -> str:
    """``local/busybox:ci``, imported once (every busybox applet on PATH, /bin/sh included)."""
    import docker.errors

    try:
        docker_client.images.get(BUSYBOX_IMAGE)
    except docker.errors.ImageNotFound:
        repo, tag = BUSYBOX_IMAGE.split(":")
        docker_client.api.import_image_from_data(
            busybox_tar(), repository=repo, tag=tag, changes=["ENV PATH=/bin", 'CMD ["/bin/sh"]']
        )
    return BUSYBOX_IMAGE


@pytest.fixture(scope="session")
def python_image(docker_client) -> str:
    """``saasbench/debian-python:bookworm`` (Debian minbase + python3), from the cached debootstrap tarball."""
    return _debian_image(docker_client, PYTHON_IMAGE)


POSTGRES_IMAGE = "saasbench/debian-postgres:bookworm"


@pytest.fixture(scope="session")
def postgres_image(docker_client) -> str:
    """``saasbench/debian-postgres:bookworm`` (Debian minbase + python3 + postgresql 15 + redis-server),
    from its own cached debootstrap tarball (a few minutes the first time). The image has no
    entrypoint of its own: ``infra/image-maps/debian-substitutes.yaml`` gives the postgres and
    redis services theirs."""
    return _debian_image(docker_client, POSTGRES_IMAGE, extra_packages="postgresql,redis-server", timeout_s=1800)


def _debian_image(docker_client, image: str, *, extra_packages: str = "", timeout_s: float = 900) -> str:
    """``image`` in the engine: imported from the cached debootstrap tarball infra/base-image/build.sh makes."""
    import docker.errors

    try:
        docker_client.images.get(image)
        return image
    except docker.errors.ImageNotFound:
        pass
    script = REPO / "infra" / "base-image" / "build.sh"
    env = {**os.environ, "IMAGE": image, "EXTRA_PACKAGES": extra_packages}
    r = subprocess.run(
        ["bash", str(script), "--tar-only"], capture_output=True, text=True, timeout=timeout_s, check=False, env=env
    )
    if r.returncode != 0:
        raise DockerUnavailable(f"{script} --tar-only failed ({r.returncode}):\n{r.stderr[-3000:]}")
    tar = r.stdout.strip().splitlines()[-1]
    repo, tag = image.split(":")
    docker_client.api.import_image_from_file(
        tar,
        repository=repo,
        tag=tag,
        changes=["ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", 'CMD ["bash"]'],
    )
    return image
