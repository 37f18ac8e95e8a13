"""The task catalogue: the ``task.yaml`` model, loading tasks, importing public SaaSBench tasks.

A task is a folder ``tasks/<id>/`` holding:

- ``task.yaml``: metadata (:class:`TaskSpec`): id, title, category, domain, stack, app port and
  start command, database, auth profile, timeouts, reference recipe, environment;
- ``task.md``: the PRD given to the agent;
- ``knowledge_base.json``: clarifications (:class:`KBEntry`), given to the agent;
- ``dag.json``: the validation DAG, never shown to the agent;
- ``reference/`` (optional): a reference implementation the ``oracle`` agent installs;
- ``environment/`` (optional): container files (``docker-compose.yml``, Dockerfiles, ...).

The catalogue root is ``$SAASBENCH_TASKS_DIR`` or the repository's ``tasks/`` folder.
:func:`import_public_task` turns the public SaaSBench layout into this one.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from saasbench import settings
from saasbench.catalog.prompt_facts import PromptFacts
from saasbench.inputs import InputError, check_id, check_relative, confine, load_yaml
from saasbench.services.auth import AuthProfile

TASK_FILE = "task.yaml"
PRD_FILE = "task.md"
KB_FILE = "knowledge_base.json"
DAG_FILE = "dag.json"
MAX_PROMPT_CHARS = 1_000_000  # prompt_for_model.md is read up to this many characters
IMPORT_MAX_FILE_BYTES = 256 * 1024 * 1024  # `tasks import`: the largest file it copies (sources, not data)
IMPORT_MAX_TOTAL_BYTES = 1024 * 1024 * 1024  # `tasks import`: the most it copies from one task folder

Domain = Literal["CG", "PC", "CF", "DCI", "SI", "DW"]


class _Open(BaseModel):
    """Models of files people write by hand: unknown keys are kept, never dropped."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)


class AppSpec(_Open):
    port: int = Field(
        default=8000, description="The port the app listens on in its container (local runs allocate a free one)"
    )
    health_path: str = Field(default="/", description="GET this path; 2xx/3xx means the app is up")
    start_command: str | None = Field(
        default="bash run.sh",
        description="Deployment contract: run in the workspace after the agent, with PORT and DATABASE_PATH set; "
        "None means the agent leaves the app running itself",
    )


class DatabaseSpec(_Open):
    engine: str = Field(default="sqlite", description="sqlite, postgresql, mysql, mariadb or mongodb")
    path: str | None = Field(default=None, description="SQLite: file path relative to the workspace")
    version: str | None = None
    name: str | None = None
    user: str | None = None
    password: str | None = None
    port: int | None = None
    extensions: list[str] = Field(default_factory=list)


class TimeoutsSpec(_Open):
    agent_s: float = Field(default=10800, gt=0, description="Wall clock of the agent's rollout")
    agent_steps: int = Field(default=500, gt=0, description="Step budget of the rollout (agent turns / tool calls)")
    tool_call_s: float = Field(default=900, gt=0, description="Wall clock of one agent tool call")
    eval_node_s: float = Field(default=120, gt=0, description="Deadline of one DAG node")
    health_s: float = Field(default=60, gt=0, description="How long the app may take to answer its health path")


class ReferenceSpec(_Open):
    source: str = Field(default="reference", description="Folder of the reference implementation, relative to the task")
    install: list[str] = Field(default_factory=list, description="Shell commands run in the workspace after copying")
    start_command: str | None = Field(default=None, description="Overrides app.start_command for the reference")


class TaskSpec(_Open):
    """The file format of ``task.yaml``. Unknown keys are kept (``model_extra``)."""

    id: str
    title: str = ""
    category: str = ""
    domain: Domain | None = None
    complexity_tier: str | None = None
    stack: Any = None
    app: AppSpec = Field(default_factory=AppSpec)
    database: DatabaseSpec | None = None
    auth: AuthProfile | None = None
    timeouts: TimeoutsSpec = Field(default_factory=TimeoutsSpec)
    reference: ReferenceSpec | None = None
    environment: dict[str, Any] = Field(
        default_factory=dict, description="Backend settings; ``env`` (a mapping) is passed to every service and command"
    )
    exec_env: dict[str, str] = Field(
        default_factory=dict,
        description="Variables every P12/P21 command gets in a trial (literal values; win over exec_env_file)",
    )
    exec_env_file: str | None = Field(
        default=None,
        description="K=V / export K=V file (relative to the task folder, confined to it) for P12/P21 commands; "
        "$VAR expands against earlier lines and the environment's variables; parsed, never run",
    )
    facts: PromptFacts | None = Field(
        default=None,
        description="Facts the agent is told (product, container, workdir, tools, database, ports, evaluation "
        "users), read from the public prompt_for_model.md at import; the prompt is built from them",
    )
    prd: str = Field(default=PRD_FILE, description="PRD file, relative to the task folder")
    knowledge_base: str = Field(default=KB_FILE, description="Knowledge base file, relative to the task folder")
    dag: str = Field(default=DAG_FILE, description="Validation DAG file, relative to the task folder")
    integrity_paths: list[str] | None = Field(
        default=None,
        description="Workspace paths (files or folders, relative to the workspace) the evaluator relies on: hashed "
        "after the harness prepared the workspace and again after the rollout; any change (modified, deleted, created) "
        "voids the trial (voided_cheat). Unset: the staged PRD and KB copies are hashed and a change is only reported "
        "(severity warn), since no evaluator reads them",
    )

    @field_validator("id")
    @classmethod
    def _id(cls, value: str) -> str:
        # the lake's own rule: a task id the lake would refuse fails here, not after a whole trial
        return check_id(value, "task id")

    @field_validator("exec_env", mode="before")
    @classmethod
    def _exec_env(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        out = {}
        for key, val in value.items():
            if not isinstance(key, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
                raise ValueError(f"{key!r} is not a variable name")
            if isinstance(val, bool):
                val = "true" if val else "false"
            out[key] = str(val) if isinstance(val, (int, float)) else val
        return out


class KBEntry(_Open):
    """One knowledge-base clarification."""

    id: str | int
    question: str = ""
    answer: str = ""
    source_reference: str | None = None
    confidence: str | float | None = None


class TaskError(ValueError):
    """A task folder cannot be found or loaded; the message names the folder and the field."""


@dataclass
class Task:
    """A loaded task folder."""

    root: Path
    spec: TaskSpec

    @property
    def id(self) -> str:
        return self.spec.id

    @property
    def title(self) -> str:
        return self.spec.title or self.spec.id

    @property
    def prd_path(self) -> Path:
        return self.root / self.spec.prd

    @property
    def kb_path(self) -> Path:
        return self.root / self.spec.knowledge_base

    @property
    def dag_path(self) -> Path:
        return self.root / self.spec.dag

    @property
    def reference_dir(self) -> Path | None:
        """The reference implementation folder, or None when the task has none."""
        if self.spec.reference is None:
            return None
        path = (self.root / self.spec.reference.source).resolve()
        return path if path.is_dir() else None

    @property
    def app_origins(self) -> list[str]:
        """Where DAGs written for the benchmark's machine reach this task's app (``http://localhost:<port>``,
        ``http://127.0.0.1:<port>``, for the published host port and the app port)."""
        ports = {self.spec.app.port}
        if self.spec.facts is not None:
            ports |= {p for p in (self.spec.facts.host_port, self.spec.facts.app_port) if p}
        return [f"http://{host}:{port}" for port in sorted(ports) for host in ("localhost", "127.0.0.1")]

    @property
    def environment_dir(self) -> Path:
        return self.root / "environment"

    @property
    def exec_env_path(self) -> Path | None:
        """``exec_env_file`` resolved inside the task folder (TaskError when it leaves it or is missing)."""
        if not self.spec.exec_env_file:
            return None
        root = self.root.resolve()
        path = (root / self.spec.exec_env_file).resolve()
        if root not in path.parents:
            raise TaskError(f"{root / TASK_FILE}: exec_env_file {self.spec.exec_env_file!r} is outside the task folder")
        if not path.is_file():
            raise TaskError(f"{root / TASK_FILE}: exec_env_file {self.spec.exec_env_file!r} does not exist")
        return path

    def load_kb(self) -> list[KBEntry]:
        """The KB entries: a list, or an object with ``clarifications``/``entries``/``items``."""
        if not self.kb_path.is_file():
            return []
        return parse_kb(json.loads(self.kb_path.read_text(encoding="utf-8-sig")), source=str(self.kb_path))


def parse_kb(raw: Any, source: str = "<memory>") -> list[KBEntry]:
    if isinstance(raw, dict):
        for key in ("clarifications", "entries", "items", "knowledge_base"):
            if isinstance(raw.get(key), list):
                raw = raw[key]
                break
    if not isinstance(raw, list):
        raise TaskError(f"{source}: knowledge base must be a list of entries or an object with 'clarifications'")
    try:
        return [KBEntry.model_validate(e) for e in raw]
    except ValidationError as exc:
        raise TaskError(f"{source}: invalid knowledge base entry: {_errors(exc)}") from None


def _errors(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'top level'}: {e['msg']}" for e in exc.errors()[:5])


# --- the catalogue -------------------------------------------------------------------------------
def tasks_root() -> Path:
    """``$SAASBENCH_TASKS_DIR``, else the repository's ``tasks/`` folder."""
    return settings.tasks_dir()


def load_task_dir(folder: str | Path) -> Task:
    """Load ``folder/task.yaml``. Raises :class:`TaskError` naming the file and the bad fields."""
    folder = Path(folder)
    path = folder / TASK_FILE
    try:
        raw = load_yaml(path, what="task.yaml")
    except InputError as exc:
        raise TaskError(str(exc)) from None
    if not isinstance(raw, dict):
        raise TaskError(f"{path}: top level must be a mapping")
    raw.setdefault("id", folder.name)
    try:
        spec = TaskSpec.model_validate(raw)
    except ValidationError as exc:
        raise TaskError(f"{path}: {_errors(exc)}") from None
    task = Task(root=folder.resolve(), spec=spec)
    check_task_paths(task)
    _ = task.exec_env_path  # a missing or escaping exec_env_file is a load error, not a trial failure
    return task


def check_task_paths(task: Task) -> None:
    """Every path task.yaml names stays inside its folder: the task folder for ``prd``, ``knowledge_base``,
    ``dag``, ``reference.source``, ``exec_env_file`` and ``environment.compose`` (relative, no ``..`` out,
    symlinks resolved and checked), the workspace for ``database.path`` and ``integrity_paths`` (relative,
    no ``..`` out). Raises :class:`TaskError` naming task.yaml and the field."""
    spec = task.spec
    in_task: list[tuple[str, Any]] = [
        ("prd", spec.prd),
        ("knowledge_base", spec.knowledge_base),
        ("dag", spec.dag),
        ("reference.source", spec.reference.source if spec.reference is not None else None),
        ("exec_env_file", spec.exec_env_file),
        ("environment.compose", (spec.environment or {}).get("compose")),
    ]
    in_workspace: list[tuple[str, Any]] = [("database.path", spec.database.path if spec.database else None)]
    in_workspace += [(f"integrity_paths[{i}]", p) for i, p in enumerate(spec.integrity_paths or [])]
    try:
        for what, value in in_task:
            if value is not None:
                confine(task.root, str(value), what)
        for what, value in in_workspace:
            if value is not None:
                check_relative(str(value), what, "the workspace")
    except InputError as exc:
        raise TaskError(f"{task.root / TASK_FILE}: {exc}") from None


def find_tasks(root: str | Path | None = None, *, errors: list[str] | None = None) -> list[Task]:
    """Every task folder (a folder with ``task.yaml``) directly under ``root``, sorted by id.

    A broken task raises :class:`TaskError`, unless ``errors`` is a list: then its message is
    appended there and the task skipped (``tasks list`` shows them).
    """
    root = Path(root) if root is not None else tasks_root()
    out: list[Task] = []
    if not root.is_dir():
        return out
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and (p / TASK_FILE).is_file()):
        try:
            out.append(load_task_dir(folder))
        except TaskError as exc:
            if errors is None:
                raise
            errors.append(str(exc))
    return sorted(out, key=lambda t: t.id)


def load_task(id_or_path: str | Path, root: str | Path | None = None) -> Task:
    """A task by folder path, ``task.yaml`` path, or id in the catalogue (``task_<id>`` also accepted)."""
    candidate = Path(id_or_path)
    if candidate.is_file() and candidate.name == TASK_FILE:
        return load_task_dir(candidate.parent)
    if candidate.is_dir() and (candidate / TASK_FILE).is_file():
        return load_task_dir(candidate)
    root = Path(root) if root is not None else tasks_root()
    text = str(id_or_path)
    for name in dict.fromkeys([text, text.removeprefix("task_")]):
        if re.fullmatch(r"[A-Za-z0-9_.-]+", name) and (root / name / TASK_FILE).is_file():
            return load_task_dir(root / name)
    for task in find_tasks(root, errors=[]):
        if task.id in (text, text.removeprefix("task_")):
            return task
    known = ", ".join(t.id for t in find_tasks(root, errors=[])) or "none"
    raise TaskError(f"no task {text!r} (not a task folder, and not an id under {root}; known: {known})")


# --- importing the public SaaSBench layout -----------------------------------------------------------
@dataclass
class ImportResult:
    task: Task
    warnings: list[str] = field(default_factory=list)  # import notes (missing PRD, guessed fields, ...)
    dag_warnings: list[str] = field(default_factory=list)  # from load_dag


_DB_IMAGES = (
    ("pgvector", "postgresql"),
    ("postgis", "postgresql"),
    ("postgres", "postgresql"),
    ("mariadb", "mariadb"),
    ("mysql", "mysql"),
    ("mongo", "mongodb"),
)
_DB_ENV = {
    "name": ("POSTGRES_DB", "MYSQL_DATABASE", "MARIADB_DATABASE", "MONGO_INITDB_DATABASE"),
    "user": ("POSTGRES_USER", "MYSQL_USER", "MARIADB_USER", "MONGO_INITDB_ROOT_USERNAME"),
    "password": ("POSTGRES_PASSWORD", "MYSQL_PASSWORD", "MARIADB_PASSWORD", "MONGO_INITDB_ROOT_PASSWORD"),
}


def _one(paths: list[Path], what: str, warnings: list[str]) -> Path | None:
    if len(paths) > 1:
        warnings.append(f"several {what} found; using {paths[0]}")
    return paths[0] if paths else None


def _first_heading(text: str) -> str | None:
    for line in text.splitlines():
        m = re.match(r"^\s{0,3}#{1,6}\s+(.+?)\s*#*\s*$", line)
        if m:
            return m.group(1).strip()
    return None


def _env_list(value: Any) -> dict[str, str]:
    if isinstance(value, dict):
        return {str(k): "" if v is None else str(v) for k, v in value.items()}
    out: dict[str, str] = {}
    for item in value or []:
        k, _, v = str(item).partition("=")
        out[k] = v
    return out


def _ports(value: Any) -> list[tuple[int | None, int]]:
    """(host port, container port) pairs of a compose ``ports`` list."""
    out: list[tuple[int | None, int]] = []
    for item in value or []:
        if isinstance(item, dict):
            try:
                out.append((int(item["published"]) if item.get("published") else None, int(item["target"])))
            except (KeyError, TypeError, ValueError):
                continue
            continue
        parts = str(item).split("/")[0].split(":")
        try:
            nums = [int(p) for p in parts if p]
        except ValueError:
            continue
        if len(nums) == 1:
            out.append((None, nums[0]))
        elif nums:
            out.append((nums[-2], nums[-1]))
    return out


def _compose_facts(compose: Path, warnings: list[str]) -> dict[str, Any]:
    """Database engine/version/credentials and the app port read from docker-compose.yml."""
    try:
        data = load_yaml(compose, what="compose file") or {}
    except InputError as exc:
        warnings.append(f"cannot read {compose.name}: {exc}")
        return {}
    services = data.get("services") if isinstance(data, dict) else None
    if not isinstance(services, dict):
        warnings.append(f"{compose.name} has no services")
        return {}
    facts: dict[str, Any] = {"services": sorted(services)}
    for name, svc in services.items():
        if not isinstance(svc, dict):
            continue
        image = str(svc.get("image") or "")
        base = image.rsplit("/", 1)[-1]
        engine = next((e for key, e in _DB_IMAGES if base.startswith(key)), None)
        if engine and "database" not in facts:
            db: dict[str, Any] = {"engine": engine, "service": name, "image": image}
            if ":" in base:
                db["version"] = base.split(":", 1)[1]
            env = _env_list(svc.get("environment"))
            for key, names in _DB_ENV.items():
                value = next((env[n] for n in names if env.get(n)), None)
                if value and "${" not in value:
                    db[key] = value
            ports = _ports(svc.get("ports"))
            if ports:
                db["port"] = ports[0][1]
            facts["database"] = db
    app_name = "app" if "app" in services else next((n for n in services if "app" in n), None)
    if app_name and isinstance(services[app_name], dict):
        ports = _ports(services[app_name].get("ports"))
        if ports:  # the port inside the container (AppSpec.port); the host side is the benchmark machine's
            facts["app_port"] = ports[0][1]
    return facts


def _dotenv_port(path: Path) -> int | None:
    try:
        for line in path.read_text(encoding="utf-8").splitlines():
            m = re.match(r"^\s*(?:export\s+)?(?:APP_)?PORT\s*=\s*['\"]?(\d+)", line)
            if m:
                return int(m.group(1))
    except OSError:
        pass
    return None


def _find_public_dirs(src: Path, public_id: str, warnings: list[str]) -> tuple[Path | None, Path | None, Path | None]:
    """(tasks/task_<id>, check/task_<id>, check/task_<id>_e/evaluate) of a public task folder, each None when absent."""
    inner: Path | None = src / "tasks" / public_id
    if not (src / "tasks" / public_id).is_dir():
        inner = (
            _one(sorted(p for p in (src / "tasks").glob("task_*") if p.is_dir()), "tasks/task_* folders", warnings)
            if (src / "tasks").is_dir()
            else None
        )
    check: Path | None = src / "check" / public_id
    if not (src / "check" / public_id).is_dir():
        check = (
            _one(
                sorted(p for p in (src / "check").glob("task_*") if p.is_dir() and not p.name.endswith("_e")),
                "check/task_* folders",
                warnings,
            )
            if (src / "check").is_dir()
            else None
        )
    evaluate: Path | None = src / "check" / f"{public_id}_e" / "evaluate"
    if not (src / "check" / f"{public_id}_e" / "evaluate").is_dir():
        evaluate = (
            _one(
                sorted(p for p in (src / "check").glob("*_e/evaluate") if p.is_dir()),
                "check/*_e/evaluate folders",
                warnings,
            )
            if (src / "check").is_dir()
            else None
        )
    return inner, check, evaluate


def _pick_dag(evaluate: Path | None, dag: Path | None, warnings: list[str]) -> Path | None:
    if dag is not None:
        if not Path(dag).is_file():
            raise TaskError(f"{dag}: no such DAG file")
        return Path(dag)
    if evaluate is None:
        return None
    if (evaluate / DAG_FILE).is_file():
        return evaluate / DAG_FILE
    if (evaluate / "dag_smoke.json").is_file():
        warnings.append("no dag.json; imported dag_smoke.json (a subset of the benchmark's nodes)")
        return evaluate / "dag_smoke.json"
    warnings.append(
        "no dag.json in check/*_e/evaluate (the repository's large DAGs are not always shipped); "
        "attach one with `saasbench tasks import --dag FILE` or place it as dag.json"
    )
    return None


def _users_profile(facts: Any) -> dict[str, Any] | None:
    """The evaluation users of the prompt as an auth profile (role -> credentials); schemes come from the DAG."""
    users: dict[str, dict[str, Any]] = {}
    for user in facts.users:
        base = re.sub(r"[^a-z0-9_]+", "_", (user.role or "user").lower()).strip("_") or "user"
        role, n = base, 2
        while role in users:
            role, n = f"{base}{n}", n + 1
        fields = {
            k: v
            for k, v in (
                ("username", user.username),
                ("email", user.email),
                ("password", user.password),
                ("name", user.name),
            )
            if v
        }
        fields.update({k: v for k, v in user.extra.items() if k not in fields})
        users[role] = fields
    return {"users": users, "default_role": next(iter(users))} if users else None


def _mb(n: int) -> str:
    return f"{n / (1024 * 1024):,.0f} MB" if n >= 1024 * 1024 else f"{n:,} bytes"


class _ImportPlan:
    """What ``tasks import`` copies, checked before anything is written: regular files (and folders) whose
    real path is inside the source task folder, each at most :data:`IMPORT_MAX_FILE_BYTES`, together at most
    :data:`IMPORT_MAX_TOTAL_BYTES`. A symlink is followed when it stays inside the folder (its target is
    copied as a file) and refused when it leaves it; anything else (a FIFO, a device, a dangling link) is
    refused. Refused means :class:`TaskError` and nothing imported."""

    def __init__(self, root: Path):
        self.root = Path(os.path.realpath(root))
        self.items: list[tuple[Path, str]] = []  # (real source path, destination path relative to the task)
        self.total = 0

    def _real(self, path: Path) -> Path:
        real = Path(os.path.realpath(path))
        if real != self.root and self.root not in real.parents:
            raise TaskError(
                f"{path}: a symlink to {real}, outside the task folder {self.root}: refused "
                "(tasks import copies only files inside the task folder; replace the link with the file)"
            )
        return real

    def file(self, path: Path, dest: str, *, confined: bool = True) -> Path:
        real = self._real(path) if confined else Path(os.path.realpath(path))
        try:
            st = os.stat(real)
        except OSError as exc:
            raise TaskError(f"{path}: cannot read ({exc.strerror or exc}): refused (a dangling symlink?)") from None
        if not stat.S_ISREG(st.st_mode):
            raise TaskError(f"{path}: not a regular file: refused (tasks import copies regular files and folders only)")
        if st.st_size > IMPORT_MAX_FILE_BYTES:
            raise TaskError(
                f"{path}: {_mb(st.st_size)}, over the {_mb(IMPORT_MAX_FILE_BYTES)} tasks import copies per file "
                "(a task folder holds sources, not data: remove the file or keep it outside the task folder)"
            )
        self.total += st.st_size
        if self.total > IMPORT_MAX_TOTAL_BYTES:
            raise TaskError(
                f"{self.root}: over {_mb(IMPORT_MAX_TOTAL_BYTES)} to copy (at {path}): refused "
                "(a task folder holds sources, not data: remove the large files)"
            )
        self.items.append((real, dest))
        return real

    def tree(self, folder: Path, dest: str, skip: tuple[str, ...] = ()) -> None:
        """Every file under ``folder`` (``skip``: names left out at its top level)."""
        active: set[Path] = set()

        def walk(path: Path, rel: str) -> None:
            real = self._real(path)
            if real in active:
                raise TaskError(f"{path}: a symlink loop (it leads back to {real}): refused")
            active.add(real)
            for entry in sorted(os.scandir(path), key=lambda e: e.name):
                if not rel and entry.name in skip:
                    continue
                child, child_rel = Path(entry.path), f"{rel}/{entry.name}" if rel else entry.name
                if entry.is_dir(follow_symlinks=True):
                    walk(child, child_rel)
                else:
                    self.file(child, f"{dest}/{child_rel}")
            active.discard(real)

        walk(folder, "")

    def write(self, dest_root: Path) -> None:
        for real, rel in self.items:
            target = dest_root / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            with open(real, "rb") as fin, open(target, "wb") as fout:
                # at most the cap even if the file grew since it was checked
                shutil.copyfileobj(_Capped(fin, IMPORT_MAX_FILE_BYTES), fout)
            shutil.copystat(real, target)


class _Capped:
    def __init__(self, fh: Any, limit: int):
        self.fh, self.left = fh, limit

    def read(self, n: int = -1) -> bytes:
        if self.left <= 0:
            return b""
        data = self.fh.read(self.left if n < 0 else min(n, self.left))
        self.left -= len(data)
        return data


def import_public_task(
    src: str | Path, dest_root: str | Path | None = None, *, overwrite: bool = False, dag: str | Path | None = None
) -> ImportResult:
    """Import one public SaaSBench task folder (``task_<id>/``) as ``<dest_root>/<id>/``.

    Reads what is there and records what is not: ``tasks/task_<id>/task/task.md`` and
    ``kb/knowledge_base.json`` (published separately, so often absent), ``tasks/task_<id>/docker/``
    (compose file mapped with :func:`saasbench.catalog.envspec.import_compose`), ``check/task_<id>/
    prompt_for_model.md`` (parsed into :class:`saasbench.catalog.prompt_facts.PromptFacts`: product,
    container, workdir, tools, database, app port, evaluation users) and
    ``check/task_<id>_e/evaluate/dag.json`` (``dag_smoke.json`` when there is none, or ``dag``).
    Writes the files it found and a derived ``task.yaml``; :func:`readiness` tells what is missing.

    Raises :class:`TaskError` when ``src`` is not a public task folder, the DAG does not load
    (every error listed; nothing is written), or the destination exists and ``overwrite`` is false.
    """
    from saasbench.catalog.envspec import SpecError, import_compose
    from saasbench.catalog.prompt_facts import parse_prompt_for_model
    from saasbench.dag import DagLoadError, load_dag

    src = Path(src).resolve()
    if not src.is_dir():
        raise TaskError(f"{src}: not a folder")
    m = re.fullmatch(r"task_([A-Za-z0-9_-]+)", src.name)
    task_id = m.group(1) if m else src.name
    try:
        check_id(task_id, "task id")  # the lake's rule: refused now, not when the first trial commits
    except ValueError as exc:
        raise TaskError(f"{src}: {exc} (rename the folder task_<id>)") from None
    public_id = f"task_{task_id}"
    warnings: list[str] = []
    inner, check, evaluate = _find_public_dirs(src, public_id, warnings)
    if inner is None and evaluate is None:
        raise TaskError(
            f"{src}: not a public SaaSBench task folder (expected tasks/{public_id}/ and check/{public_id}_e/evaluate/)"
        )
    dag_src = _pick_dag(evaluate, Path(dag) if dag is not None else None, warnings)

    # Every file to copy, checked before any is read or written (symlinks, special files, sizes).
    plan = _ImportPlan(src)
    if dag_src is not None:
        dag_src = plan.file(dag_src, DAG_FILE, confined=dag is None)  # a --dag file is the user's own choice
    if evaluate is not None and (evaluate / "scoring_config.json").is_file():
        plan.file(evaluate / "scoring_config.json", "scoring_config.json")
    prd = inner / "task" / PRD_FILE if inner is not None else None
    prd = plan.file(prd, PRD_FILE) if prd is not None and prd.is_file() else None
    kb = inner / "kb" / KB_FILE if inner is not None else None
    kb = plan.file(kb, KB_FILE) if kb is not None and kb.is_file() else None
    prompt = check / "prompt_for_model.md" if check is not None else None
    prompt = plan.file(prompt, "prompt_for_model.md") if prompt is not None and prompt.is_file() else None
    docker = inner / "docker" if inner is not None else None
    if docker is not None and docker.is_dir():
        plan.tree(docker, "environment", skip=("workspace",))
        docker = Path(os.path.realpath(docker))
    else:
        docker = None

    loaded = None
    if dag_src is not None:
        try:
            loaded = load_dag(dag_src)
        except DagLoadError as exc:
            raise TaskError(
                f"{dag_src}: DAG does not load: "
                + "; ".join(str(i) for i in exc.issues[:10])
                + (f" (+{len(exc.issues) - 10} more)" if len(exc.issues) > 10 else "")
            ) from None

    facts = None
    if prompt is not None:
        with prompt.open(encoding="utf-8", errors="replace") as fh:  # real prompts are ~10 KB; a huge file is capped
            facts = parse_prompt_for_model(fh.read(MAX_PROMPT_CHARS), source=str(prompt))
        warnings += [f"prompt_for_model.md: {w}" for w in facts.warnings]
    else:
        warnings.append("no check/task_*/prompt_for_model.md: product, container, users and tools unknown")

    dest_root = Path(dest_root) if dest_root is not None else tasks_root()
    dest = dest_root / task_id
    if dest.exists():
        if not overwrite:
            raise TaskError(f"{dest} already exists (use overwrite to replace it)")
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    plan.write(dest)

    title = None
    if prd is not None:
        title = _first_heading(prd.read_text(encoding="utf-8", errors="replace"))
    else:
        warnings.append("no task/task.md (the PRD is published separately: `saasbench tasks fetch` downloads it)")
    if kb is not None:
        try:
            parse_kb(json.loads(kb.read_text(encoding="utf-8-sig")), source=str(kb))
        except (json.JSONDecodeError, TaskError) as exc:
            warnings.append(
                f"knowledge base does not match {{id, question, answer, source_reference, confidence}}: {exc}"
            )
    else:
        warnings.append("no kb/knowledge_base.json (published separately: `saasbench tasks fetch` downloads it)")
    if prompt is not None:
        title = (
            (facts.product if facts is not None else None)
            or title
            or _first_heading(prompt.read_text(encoding="utf-8", errors="replace"))
        )

    compose_facts: dict[str, Any] = {}
    environment: dict[str, Any] = {}
    if docker is not None:
        compose = next(
            (n for n in ("docker-compose.yml", "docker-compose.yaml", "compose.yaml") if (docker / n).is_file()), None
        )
        if compose is not None:
            compose_facts = _compose_facts(docker / compose, warnings)
            try:
                env = import_compose(dest / "environment" / compose, strict=False)
            except SpecError as exc:
                warnings.append(f"{compose} does not map to a trial environment: {exc}")
            else:
                # The reference harness starts a trial's stack in "model" mode: IMAGE_TAG=model (the clean toolchain
                # image, no app) and APP_CMD="sleep infinity" (the agent starts the app itself).
                environment = {
                    "compose": f"environment/{compose}",
                    "services": list(env.services),
                    "app_service": env.app(),
                    "variables": {"IMAGE_TAG": "model", "APP_CMD": "sleep infinity"},
                }
                documented = ", ".join(facts.env_vars) if facts is not None and facts.env_vars else "none listed"
                warnings += [
                    f"{w} (variables the prompt documents: {documented})" if "env_file" in w else w
                    for w in env.warnings
                ]
                if env.missing_variables:
                    environment["secrets"] = sorted(env.missing_variables)
                    warnings.append(
                        "variables without a value or default, generated per trial as random secrets "
                        "(environment.secrets; set environment.variables to fix a value): "
                        + "; ".join(f"{k} ({v})" for k, v in sorted(env.missing_variables.items()))
                    )
        else:
            warnings.append("docker/ has no docker-compose.yml; database engine and app port unknown")
        if "app_port" not in compose_facts:
            port = _dotenv_port(docker / ".env") or _dotenv_port(docker / ".env.example")
            if port:
                compose_facts["app_port"] = port
    else:
        warnings.append("no docker/ folder; environment unknown")
    if facts is not None:
        if facts.database is not None and facts.database.host:
            environment["db_host"] = facts.database.host
        environment.update(
            {
                k: v
                for k, v in (
                    ("product", facts.product),
                    ("container", facts.container),
                    ("workdir", facts.workdir),
                    ("base_os", facts.base_os),
                    ("tools", facts.tools),
                    ("requirements", facts.requirements),
                )
                if v
            }
        )

    spec: dict[str, Any] = {"id": task_id, "title": title or public_id}
    if loaded is not None and loaded.dag.meta.get("category"):
        spec["category"] = loaded.dag.meta["category"]
    app_port = (facts.app_port if facts is not None else None) or compose_facts.get("app_port")
    if app_port is None:
        warnings.append("app port not found in prompt_for_model.md, docker-compose.yml or .env; defaulted to 8000")
    # The agent starts the app itself (the prompt says so); there is no deployment contract to run after it.
    spec["app"] = {"port": int(app_port or 8000), "health_path": "/", "start_command": None}
    database = {
        k: v
        for k, v in (compose_facts.get("database") or {}).items()
        if k in ("engine", "version", "name", "user", "password", "port")
    }
    if facts is not None and facts.database is not None:
        fdb = facts.database
        database.update(
            {
                k: v
                for k, v in (
                    ("engine", fdb.engine),
                    ("name", fdb.name),
                    ("user", fdb.user),
                    ("password", fdb.password),
                    ("port", fdb.port),
                )
                if v
            }
        )
        if fdb.version:
            database.setdefault("version", fdb.version)
        if fdb.extensions:
            database["extensions"] = list(fdb.extensions)
    if database.get("engine"):
        spec["database"] = database
    else:
        warnings.append("no database recognised in the prompt or docker-compose.yml")
    profile = _users_profile(facts) if facts is not None else None
    if profile is not None:
        spec["auth"] = profile
    spec["timeouts"] = {"agent_s": 10800, "eval_node_s": 120, "health_s": 60}
    spec["environment"] = environment
    if facts is not None:
        spec["facts"] = facts.model_dump(mode="json", exclude={"prompt_text", "warnings"}, exclude_none=True)
    spec["source"] = {
        "kind": "saasbench-public",
        "task": public_id,
        "dag": dag_src.name if dag_src is not None else None,
    }
    warnings.append("domain and stack are not derivable from the public layout; fill them in task.yaml")
    (dest / TASK_FILE).write_text(
        "# Imported from the public SaaSBench layout by `saasbench tasks import`; review domain and stack.\n"
        + yaml.safe_dump(spec, sort_keys=False, allow_unicode=True),
        encoding="utf-8",
    )
    task = load_task_dir(dest)
    return ImportResult(task=task, warnings=warnings, dag_warnings=[str(i) for i in loaded.warnings] if loaded else [])


def attach_dag(task: Task, dag: str | Path) -> list[str]:
    """Check ``dag`` with the loader and copy it in as the task's DAG; returns the loader's warnings."""
    from saasbench.dag import DagLoadError, load_dag

    try:
        loaded = load_dag(dag)
    except DagLoadError as exc:
        raise TaskError(f"{dag}: DAG does not load: " + "; ".join(str(i) for i in exc.issues[:10])) from None
    shutil.copy2(dag, task.dag_path)
    return [str(i) for i in loaded.warnings]


# --- readiness ---------------------------------------------------------------------------------------
class Readiness(BaseModel):
    """What a task still lacks to run, as ``tasks list``/``tasks show``/``tasks fetch`` report it."""

    task: str
    needs: list[str] = Field(
        default_factory=list, description="DAG, PRD, images, variables, files: each blocks a trial"
    )
    notes: list[str] = Field(
        default_factory=list, description="Details and things that do not block (smoke-only DAG, ...)"
    )
    images: list[Any] = Field(
        default_factory=list, description="saasbench.catalog.imagemap.ImageNeed per service (Docker tasks)"
    )

    @property
    def status(self) -> str:
        return "ready" if not self.needs else "needs " + ", ".join(self.needs)


def docker_client_or_none(timeout_s: float = 5) -> Any | None:
    """A client for the engine ``$DOCKER_HOST`` names (or the default socket), or None when none answers."""
    try:
        import docker

        client = docker.from_env(timeout=timeout_s)
        client.ping()
        return client
    except Exception:  # noqa: BLE001 - no engine is an answer here, not an error
        return None


def readiness(task: Task, *, docker_client: Any | None = None) -> Readiness:
    """Check the DAG (present, loads), PRD and KB, variables and images (with ``docker_client``; else unchecked)."""
    from saasbench.dag import DagLoadError, load_dag

    out = Readiness(task=task.id)
    public = (task.spec.model_extra or {}).get("source", {}) or {}
    if not task.dag_path.is_file():
        out.needs.append("DAG")
        out.notes.append(f"no {task.spec.dag}: `saasbench tasks import --dag FILE {task.id}` or place it there")
    else:
        try:
            loaded = load_dag(task.dag_path)
            if public.get("dag") == "dag_smoke.json":
                out.notes.append(f"smoke DAG only ({len(loaded.dag.nodes)} nodes), not the benchmark's full DAG")
        except DagLoadError as exc:
            out.needs.append("DAG")
            out.notes.append(f"{task.spec.dag} does not load ({len(exc.issues)} error(s); saasbench dag check)")
    missing_inputs = [
        p.name
        for p in (task.prd_path, task.kb_path)
        if not p.is_file() and (p == task.prd_path or public.get("kind") == "saasbench-public")
    ]
    if missing_inputs:
        out.needs.append("PRD")
        out.notes.append(f"missing {' and '.join(missing_inputs)} (`saasbench tasks fetch {task.id}` downloads them)")
    block = task.spec.environment or {}
    if block.get("compose") or isinstance(block.get("services"), dict):
        from saasbench.catalog.envspec import SpecError, env_spec_for_task
        from saasbench.catalog.imagemap import image_needs

        try:
            env = env_spec_for_task(task)
        except SpecError as exc:
            out.needs.append("variables" if "variable" in str(exc) else "environment")
            out.notes.append(str(exc))
        else:
            out.notes += env.warnings
            if any("bind mount source" in w for w in env.warnings):
                out.needs.append("files")
            out.images = image_needs(env, docker_client)
            absent = [n for n in out.images if n.available is False]
            if absent:
                out.needs.append("images")
                out.notes.append(
                    "images not in the engine: "
                    + ", ".join(sorted({str(n.image) for n in absent}))
                    + " (pull or import them, or map substitutes: saasbench tasks images)"
                )
            elif docker_client is None and any(n.image for n in out.images):
                out.notes.append("images not checked (no Docker engine answered)")
    return out
