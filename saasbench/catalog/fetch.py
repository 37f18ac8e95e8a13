"""``saasbench tasks fetch``: bring the public SaaSBench tasks onto this machine and import them.

Two sources, as the benchmark publishes them:

- the git repository (default ``https://github.com/ShadeCloak/SaaSbench``) at a pinned commit:
  per task ``eval/task_<id>/`` with the compose files, the prompt, the scoring config and the DAG;
- the dataset host (default Hugging Face, dataset ``SaaSBench/SaaSBench``): per task
  ``tasks/task_<id>/task.md`` (the PRD) and ``tasks/task_<id>/knowledge_base.json``, the files the
  repository leaves out. Files are read from ``<endpoint>/datasets/<dataset>/resolve/<revision>/<path>``
  (``$HF_ENDPOINT`` selects a mirror, ``$HF_TOKEN`` is sent as a bearer token and never logged).

Each task is imported with :func:`saasbench.catalog.tasks.import_public_task` and its readiness reported.
A task that fails (not in the repository, dataset file missing, download error) is reported with
its cause; the others go on. Downloads are size-capped and time-limited: the dataset host is a
network peer, not trusted input.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from saasbench import settings
from saasbench.catalog.tasks import KB_FILE, PRD_FILE, TaskError, import_public_task

DEFAULT_REPO = "https://github.com/ShadeCloak/SaaSbench.git"
DEFAULT_COMMIT = "a1fcfbd4d9f2efbbbfe2b4f77e6f1c759ada517b"  # the commit the conformance data was copied from
DEFAULT_DATASET = "SaaSBench/SaaSBench"
DEFAULT_ENDPOINT = "https://huggingface.co"
MAX_DOWNLOAD_BYTES = 64 * 1024 * 1024
TASK_DIR_IN_REPO = "eval"


class FetchError(RuntimeError):
    """The repository cannot be cloned at the commit, or the arguments are wrong."""


@dataclass
class FetchedTask:
    task: str  # public id, task_<id>
    imported: bool = False
    task_id: str | None = None  # catalogue id
    path: str | None = None
    downloaded: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _git(args: list[str], cwd: Path | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0"}
    return subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def checkout(repo: str, commit: str, cache_dir: Path) -> Path:
    """A work tree of ``repo`` at ``commit`` under ``cache_dir`` (reused when already there).

    Fetches only that commit (``--depth 1``) when the server allows it; otherwise the whole history.
    """
    if not re.fullmatch(r"[0-9a-fA-F]{7,40}", commit):
        raise FetchError(f"--commit must be a commit id (hex), got {commit!r}: a branch name would not be reproducible")
    if shutil.which("git") is None:
        raise FetchError("git is not installed")
    dest = cache_dir / commit
    if (dest / ".git").is_dir() and _git(["rev-parse", "HEAD"], dest).stdout.strip().startswith(commit.lower()):
        return dest
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for step in (["init", "-q"], ["remote", "add", "origin", repo]):
        r = _git(step, dest)
        if r.returncode:
            raise FetchError(f"git {' '.join(step)}: {r.stderr.strip()}")
    r = _git(["fetch", "-q", "--depth", "1", "origin", commit], dest)
    if r.returncode:  # servers that refuse a fetch by commit id: take everything
        r = _git(["fetch", "-q", "origin"], dest)
        if r.returncode:
            shutil.rmtree(dest, ignore_errors=True)
            raise FetchError(f"cannot fetch {repo}: {r.stderr.strip()[-500:]}")
    r = _git(["-c", "advice.detachedHead=false", "checkout", "-q", commit], dest)
    if r.returncode:
        shutil.rmtree(dest, ignore_errors=True)
        raise FetchError(f"commit {commit} is not in {repo}: {r.stderr.strip()[-500:]}")
    return dest


def available_tasks(tree: Path) -> list[str]:
    root = tree / TASK_DIR_IN_REPO
    return sorted(p.name for p in root.glob("task_*") if p.is_dir()) if root.is_dir() else []


def download(url: str, dest: Path, *, token: str | None = None, timeout_s: float = 60) -> int:
    """Stream ``url`` into ``dest`` (size-capped; written to a temporary name, then renamed). Returns bytes."""
    import httpx

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    tmp = dest.with_name(dest.name + ".part")
    size = 0
    with httpx.stream("GET", url, headers=headers, timeout=timeout_s, follow_redirects=True) as resp:
        if resp.status_code != 200:
            raise FetchError(f"GET {url}: HTTP {resp.status_code}")
        with tmp.open("wb") as fh:
            for chunk in resp.iter_bytes():
                size += len(chunk)
                if size > MAX_DOWNLOAD_BYTES:
                    fh.close()
                    tmp.unlink(missing_ok=True)
                    raise FetchError(f"GET {url}: larger than {MAX_DOWNLOAD_BYTES} bytes")
                fh.write(chunk)
    tmp.replace(dest)
    return size


def dataset_url(endpoint: str, dataset: str, revision: str, path: str) -> str:
    return f"{endpoint.rstrip('/')}/datasets/{dataset}/resolve/{revision}/{path}"


def fetch_tasks(
    tasks: list[str] | None = None,
    *,
    repo: str = DEFAULT_REPO,
    commit: str = DEFAULT_COMMIT,
    dataset: str | None = DEFAULT_DATASET,
    endpoint: str | None = None,
    revision: str = "main",
    dest_root: Path | None = None,
    cache_dir: Path | None = None,
    overwrite: bool = True,
) -> list[FetchedTask]:
    """Clone ``repo`` at ``commit``, import ``tasks`` (default: all), download their PRD and KB.

    ``dataset=None`` skips the downloads (the tasks then need a PRD, as their readiness says).
    """
    cache_dir = cache_dir or settings.cache_dir() / "public"
    tree = checkout(repo, commit, cache_dir)
    known = available_tasks(tree)
    wanted = [t if t.startswith("task_") else f"task_{t}" for t in (tasks or known)]
    endpoint = endpoint or os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT
    token = os.environ.get("HF_TOKEN") or None
    out: list[FetchedTask] = []
    for public in wanted:
        item = FetchedTask(task=public)
        out.append(item)
        if public not in known:
            item.errors.append(f"not in {repo} at {commit[:12]} (it has {len(known)} task folder(s))")
            continue
        try:
            result = import_public_task(tree / TASK_DIR_IN_REPO / public, dest_root, overwrite=overwrite)
        except TaskError as exc:
            item.errors.append(str(exc))
            continue
        item.imported, item.task_id, item.path = True, result.task.id, str(result.task.root)
        item.warnings = [w for w in result.warnings if "published separately" not in w]
        if dataset is None:
            continue
        for name in (PRD_FILE, KB_FILE):
            url = dataset_url(endpoint, dataset, revision, f"tasks/{public}/{name}")
            try:
                download(url, result.task.root / name, token=token)
                item.downloaded.append(name)
            except (FetchError, OSError) as exc:
                item.errors.append(f"{name}: {exc}")
            except Exception as exc:  # noqa: BLE001 - httpx transport errors: recorded per task, the others go on
                item.errors.append(f"{name}: GET {url}: {type(exc).__name__}: {exc}")
    return out
