"""Content-addressed image builds: build each distinct (Dockerfile, context, base image) once.

The key of a build is the sha256 of the Dockerfile, every file of the build context (sorted by
path: path, executable bit, contents; ``.dockerignore`` patterns honoured), the build arguments
and the image ids of the ``FROM`` images. The image is tagged ``<repository>:<key[:24]>`` and
labelled ``saasbench.cache-key``; an existing tag is a hit and costs one API call.

One build per key at a time, also across processes: the builder holds an ``fcntl`` lock on
``<cache_dir>/locks/<key>.lock``; a second process waits on the lock and then finds the image.
Build logs are kept in ``<cache_dir>/logs/<key>.log``; every build appends a line to
``<cache_dir>/builds.jsonl``; each use touches ``<cache_dir>/used/<key>`` (the LRU clock for
:meth:`ImageCache.prune`). ``cache_dir`` defaults to ``$SAASBENCH_CACHE_DIR/images`` or
``~/.cache/saasbench/images``.

Base images are never pulled here (no registry is assumed): a ``FROM`` image must already be on
the engine (``docker import``, ``infra/base-image/build.sh``) or be an earlier stage of the same
Dockerfile; otherwise :class:`BuildError` says which.
"""

from __future__ import annotations

import fcntl
import fnmatch
import hashlib
import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from saasbench import settings

if TYPE_CHECKING:
    import docker

__all__ = ["BuildError", "CachedImage", "ImageCache", "ImageRef", "default_cache_dir"]

L_KEY = "saasbench.cache-key"
L_BUILT = "saasbench.built-at"
KEY_CHARS = 24


class BuildError(RuntimeError):
    """The build failed (message ends with the last log lines) or an input is missing."""


@dataclass
class ImageRef:
    tag: str
    image_id: str
    key: str
    built: bool  # False: a cache hit
    log_path: Path | None


@dataclass
class CachedImage:
    tag: str
    image_id: str
    key: str
    size: int
    created: str
    last_used: float  # epoch seconds (the image's build time when never used since)


def default_cache_dir() -> Path:
    root = str(settings.cache_dir())
    return Path(root) / "images"


def _dockerignore(context: Path) -> list[str]:
    f = context / ".dockerignore"
    if not f.is_file():
        return []
    pats = []
    for line in f.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            pats.append(line.rstrip("/").lstrip("/"))
    return pats


def _ignored(rel: str, patterns: list[str]) -> bool:
    hit = False
    for pat in patterns:  # later patterns win, "!" re-includes (as docker does)
        neg = pat.startswith("!")
        p = pat[1:] if neg else pat
        if (
            fnmatch.fnmatch(rel, p)
            or fnmatch.fnmatch(rel, p + "/*")
            or (p.startswith("**/") and fnmatch.fnmatch(rel, p[3:]))
        ):
            hit = not neg
    return hit


def context_digest(context: Path, dockerfile: str = "Dockerfile") -> hashlib._Hash:
    """sha256 over the Dockerfile and the context files (sorted, .dockerignore honoured)."""
    h = hashlib.sha256()
    df = context / dockerfile
    h.update(b"dockerfile\0" + df.read_bytes() + b"\0")
    patterns = _dockerignore(context)
    files: list[tuple[str, Path]] = []
    for dirpath, dirnames, filenames in os.walk(context):
        dirnames.sort()
        for name in filenames:
            full = Path(dirpath) / name
            rel = full.relative_to(context).as_posix()
            if not _ignored(rel, patterns):
                files.append((rel, full))
    for rel, full in sorted(files):
        st = os.lstat(full)
        h.update(rel.encode() + b"\0")
        if os.path.islink(full):
            h.update(b"link\0" + os.readlink(full).encode() + b"\0")
            continue
        h.update(b"x\0" if st.st_mode & 0o111 else b"-\0")
        with open(full, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
        h.update(b"\0")
    return h


_FROM = re.compile(r"^\s*FROM\s+(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?", re.IGNORECASE | re.MULTILINE)
_ARG = re.compile(r"^\s*ARG\s+([A-Za-z_][A-Za-z0-9_]*)(?:=(\S*))?", re.IGNORECASE | re.MULTILINE)


def base_images(dockerfile_text: str, buildargs: dict[str, str] | None = None) -> list[str]:
    """The external images a Dockerfile starts from (earlier stages and ``scratch`` excluded)."""
    args = {m.group(1): (m.group(2) or "") for m in _ARG.finditer(dockerfile_text.split("FROM", 1)[0])}
    args.update(buildargs or {})
    stages: set[str] = set()
    out: list[str] = []
    for m in _FROM.finditer(dockerfile_text):
        image = re.sub(
            r"\$\{?([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}?",
            lambda a: args.get(a.group(1)) or (a.group(2) or ""),
            m.group(1),
        )
        if image.lower() not in stages and image != "scratch" and image not in out:
            out.append(image)
        if m.group(2):
            stages.add(m.group(2).lower())
    return out


class ImageCache:
    """Builds images once per content key. ``repository``: the tag's name part."""

    def __init__(
        self, client: docker.DockerClient, cache_dir: str | Path | None = None, repository: str = "saasbench/env"
    ):
        self.client = client
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self.repository = repository
        for sub in ("locks", "logs", "used"):
            (self.cache_dir / sub).mkdir(parents=True, exist_ok=True)

    def key(self, context: str | Path, dockerfile: str = "Dockerfile", buildargs: dict[str, str] | None = None) -> str:
        import docker.errors

        context = Path(context)
        df = context / dockerfile
        if not df.is_file():
            raise BuildError(f"no Dockerfile at {df}")
        h = context_digest(context, dockerfile)
        h.update(json.dumps(sorted((buildargs or {}).items())).encode())
        for base in base_images(df.read_text(encoding="utf-8"), buildargs):
            try:
                h.update(f"from {base} {self.client.images.get(base).id}\0".encode())
            except docker.errors.ImageNotFound:
                raise BuildError(
                    f"{df}: base image {base} is not on the engine (no registry here: "
                    f"docker import it or run infra/base-image/build.sh)"
                ) from None
        return h.hexdigest()

    def tag_for(self, key: str) -> str:
        return f"{self.repository}:{key[:KEY_CHARS]}"

    def ensure(
        self, context: str | Path, dockerfile: str = "Dockerfile", buildargs: dict[str, str] | None = None
    ) -> ImageRef:
        """The image for this context, built if no image has its key yet. Raises :class:`BuildError`."""
        import docker.errors

        key = self.key(context, dockerfile, buildargs)
        tag = self.tag_for(key)
        with open(self.cache_dir / "locks" / f"{key}.lock", "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                image = self.client.images.get(tag)
                built, log = False, None
            except docker.errors.ImageNotFound:
                image, log = (
                    self._build(Path(context), dockerfile, buildargs, key, tag),
                    self.cache_dir / "logs" / f"{key}.log",
                )
                built = True
            (self.cache_dir / "used" / key).touch()
        return ImageRef(tag=tag, image_id=image.id, key=key, built=built, log_path=log)

    def _build(self, context: Path, dockerfile: str, buildargs: dict[str, str] | None, key: str, tag: str) -> Any:
        import docker.errors

        log_path = self.cache_dir / "logs" / f"{key}.log"
        t0 = time.time()
        error = None
        with open(log_path, "w", encoding="utf-8") as log:
            try:
                for item in self.client.api.build(
                    path=str(context),
                    dockerfile=dockerfile,
                    tag=tag,
                    buildargs=buildargs or None,
                    rm=True,
                    forcerm=True,
                    decode=True,
                    pull=False,
                    labels={L_KEY: key, L_BUILT: str(int(t0))},
                ):
                    if "stream" in item:
                        log.write(item["stream"])
                    elif "error" in item:
                        error = item["error"]
                        log.write("ERROR: " + error + "\n")
                    elif "status" in item:
                        log.write(item["status"] + "\n")
                    log.flush()
            except docker.errors.APIError as exc:
                error = str(exc)
                log.write("ERROR: " + error + "\n")
        if error is not None:
            tail = "\n".join(log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-30:])
            raise BuildError(
                f"building {context / dockerfile} failed: {error}\n--- last build log lines ({log_path}) ---\n{tail}"
            )
        with open(self.cache_dir / "builds.jsonl", "a", encoding="utf-8") as fh:
            fh.write(
                json.dumps(
                    {
                        "key": key,
                        "tag": tag,
                        "context": str(context),
                        "dockerfile": dockerfile,
                        "pid": os.getpid(),
                        "started": t0,
                        "seconds": round(time.time() - t0, 3),
                    }
                )
                + "\n"
            )
        return self.client.images.get(tag)

    def builds(self) -> list[dict[str, Any]]:
        """Every build this cache dir has recorded (oldest first)."""
        f = self.cache_dir / "builds.jsonl"
        if not f.is_file():
            return []
        return [json.loads(line) for line in f.read_text(encoding="utf-8").splitlines() if line.strip()]

    def list_images(self) -> list[CachedImage]:
        """The cached images on the engine, least recently used first."""
        out = []
        for img in self.client.images.list(filters={"label": L_KEY}):
            key = img.labels.get(L_KEY, "")
            tags = [t for t in img.tags if t.startswith(self.repository + ":")]
            if not tags:
                continue
            used = self.cache_dir / "used" / key
            try:
                last = used.stat().st_mtime
            except OSError:
                last = float(img.labels.get(L_BUILT) or 0)
            out.append(
                CachedImage(
                    tag=tags[0],
                    image_id=img.id,
                    key=key,
                    size=int(img.attrs.get("Size") or 0),
                    created=str(img.attrs.get("Created", "")),
                    last_used=last,
                )
            )
        return sorted(out, key=lambda c: c.last_used)

    def prune(self, max_age_s: float | None = None, max_bytes: int | None = None) -> list[CachedImage]:
        """Remove cached images unused for more than ``max_age_s``, then the least recently used
        until the rest fit in ``max_bytes``. Images in use by a container are kept. Returns the removed."""
        import docker.errors

        images = self.list_images()
        now = time.time()
        removed = []
        total = sum(i.size for i in images)
        for img in images:
            too_old = max_age_s is not None and now - img.last_used > max_age_s
            too_big = max_bytes is not None and total > max_bytes
            if not (too_old or too_big):
                continue
            try:
                self.client.images.remove(img.tag)
            except docker.errors.APIError:  # in use (a container) or already gone
                continue
            total -= img.size
            removed.append(img)
            (self.cache_dir / "used" / img.key).unlink(missing_ok=True)
        return removed
