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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from saasbench.auth import AuthProfile

TASK_FILE = "task.yaml"
PRD_FILE = "task.md"
KB_FILE = "knowledge_base.json"
DAG_FILE = "dag.json"

Domain = Literal["CG", "PC", "CF", "DCI", "SI", "DW"]


class _Open(BaseModel):
    """Models of files people write by hand: unknown keys are kept, never dropped."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)


class AppSpec(_Open):
    port: int = Field(default=8000, description="The port the app listens on in its container (local runs allocate a free one)")
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
        default_factory=dict, description="Backend settings; ``env`` (a mapping) is passed to every service and command")
    exec_env: dict[str, str] = Field(
        default_factory=dict, description="Variables every P12/P21 command gets in a trial (literal values; win over exec_env_file)")
    exec_env_file: str | None = Field(
        default=None, description="K=V / export K=V file (relative to the task folder, confined to it) for P12/P21 commands; "
        "$VAR expands against earlier lines and the environment's variables; parsed, never run")
    prd: str = Field(default=PRD_FILE, description="PRD file, relative to the task folder")
    knowledge_base: str = Field(default=KB_FILE, description="Knowledge base file, relative to the task folder")
    dag: str = Field(default=DAG_FILE, description="Validation DAG file, relative to the task folder")
    integrity_paths: list[str] | None = Field(
        default=None,
        description="Workspace paths (files or folders, relative to the workspace) the evaluator relies on: hashed "
        "after the harness prepared the workspace and again after the rollout; any change (modified, deleted, created) "
        "voids the trial (voided_cheat). Unset: the staged PRD and KB copies are hashed and a change is only reported "
        "(severity warn), since no evaluator reads them")

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
    env = os.environ.get("SAASBENCH_TASKS_DIR")
    return Path(env) if env else Path(__file__).resolve().parents[1] / "tasks"


def load_task_dir(folder: str | Path) -> Task:
    """Load ``folder/task.yaml``. Raises :class:`TaskError` naming the file and the bad fields."""
    folder = Path(folder)
    path = folder / TASK_FILE
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise TaskError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise TaskError(f"{path}: invalid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise TaskError(f"{path}: top level must be a mapping")
    raw.setdefault("id", folder.name)
    try:
        spec = TaskSpec.model_validate(raw)
    except ValidationError as exc:
        raise TaskError(f"{path}: {_errors(exc)}") from None
    task = Task(root=folder.resolve(), spec=spec)
    _ = task.exec_env_path  # a missing or escaping exec_env_file is a load error, not a trial failure
    return task


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


_DB_IMAGES = (("pgvector", "postgresql"), ("postgis", "postgresql"), ("postgres", "postgresql"), ("mariadb", "mariadb"),
              ("mysql", "mysql"), ("mongo", "mongodb"))
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
        data = yaml.safe_load(compose.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
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
        if ports:
            host, container = ports[0]
            facts["app_port"] = host or container
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


def import_public_task(src: str | Path, dest_root: str | Path | None = None, *, overwrite: bool = False) -> ImportResult:
    """Import one public SaaSBench task folder (``task_<id>/``) as ``<dest_root>/<id>/``.

    Reads ``tasks/task_<id>/task/task.md``, ``tasks/task_<id>/kb/knowledge_base.json``,
    ``tasks/task_<id>/docker/`` and ``check/task_<id>_e/evaluate/dag.json`` (``dag_smoke.json``
    when there is no ``dag.json``, with a warning); writes ``task.md``, ``knowledge_base.json``,
    ``dag.json`` (+ ``scoring_config.json``), ``environment/`` (the docker files, without the
    ``workspace/`` folder) and a derived ``task.yaml``. The PRD and KB are not in the public git
    repository (they are downloaded separately), so their absence is a warning, not an error.

    Raises :class:`TaskError` when ``src`` does not have that layout, the DAG does not load
    (every error listed), or the destination exists and ``overwrite`` is false.
    """
    from saasbench.dag import DagLoadError, load_dag

    src = Path(src).resolve()
    if not src.is_dir():
        raise TaskError(f"{src}: not a folder")
    m = re.fullmatch(r"task_([A-Za-z0-9_-]+)", src.name)
    task_id = m.group(1) if m else src.name
    public_id = f"task_{task_id}"
    warnings: list[str] = []
    inner = src / "tasks" / public_id
    if not inner.is_dir():
        inner = _one(sorted(p for p in (src / "tasks").glob("task_*") if p.is_dir()), "tasks/task_* folders", warnings) \
            if (src / "tasks").is_dir() else None
    evaluate = src / "check" / f"{public_id}_e" / "evaluate"
    if not evaluate.is_dir():
        evaluate = _one(sorted(p for p in (src / "check").glob("*_e/evaluate") if p.is_dir()), "check/*_e/evaluate folders",
                        warnings) if (src / "check").is_dir() else None
    if evaluate is None:
        raise TaskError(f"{src}: not a public SaaSBench task folder (expected check/{public_id}_e/evaluate/dag.json)")
    dag_src = evaluate / DAG_FILE
    if not dag_src.is_file():
        smoke = evaluate / "dag_smoke.json"
        if not smoke.is_file():
            raise TaskError(f"{evaluate}: no dag.json (nor dag_smoke.json)")
        warnings.append("no dag.json; imported dag_smoke.json (a subset of the benchmark's nodes)")
        dag_src = smoke
    try:
        loaded = load_dag(dag_src)
    except DagLoadError as exc:
        raise TaskError(f"{dag_src}: DAG does not load: " + "; ".join(str(i) for i in exc.issues[:10])
                        + (f" (+{len(exc.issues) - 10} more)" if len(exc.issues) > 10 else "")) from None

    dest_root = Path(dest_root) if dest_root is not None else tasks_root()
    dest = dest_root / task_id
    if dest.exists():
        if not overwrite:
            raise TaskError(f"{dest} already exists (use overwrite to replace it)")
        shutil.rmtree(dest)
    dest.mkdir(parents=True)

    shutil.copy2(dag_src, dest / DAG_FILE)
    if (evaluate / "scoring_config.json").is_file():
        shutil.copy2(evaluate / "scoring_config.json", dest / "scoring_config.json")

    title = None
    prd = inner / "task" / PRD_FILE if inner is not None else None
    if prd is not None and prd.is_file():
        shutil.copy2(prd, dest / PRD_FILE)
        title = _first_heading(prd.read_text(encoding="utf-8", errors="replace"))
    else:
        warnings.append("no task/task.md (the PRD is published separately); add task.md before running agents")
    kb = inner / "kb" / KB_FILE if inner is not None else None
    if kb is not None and kb.is_file():
        try:
            parse_kb(json.loads(kb.read_text(encoding="utf-8-sig")), source=str(kb))
        except (json.JSONDecodeError, TaskError) as exc:
            warnings.append(f"knowledge base does not match {{id, question, answer, source_reference, confidence}}: {exc}")
        shutil.copy2(kb, dest / KB_FILE)
    else:
        warnings.append("no kb/knowledge_base.json (published separately)")
    prompt = src / "check" / public_id / "prompt_for_model.md"
    if prompt.is_file():
        shutil.copy2(prompt, dest / "prompt_for_model.md")
        title = title or _first_heading(prompt.read_text(encoding="utf-8", errors="replace"))

    facts: dict[str, Any] = {}
    docker = inner / "docker" if inner is not None else None
    if docker is not None and docker.is_dir():
        shutil.copytree(docker, dest / "environment", ignore=lambda d, names: ["workspace"] if Path(d) == docker else [],
                        symlinks=True)
        compose = next((docker / n for n in ("docker-compose.yml", "docker-compose.yaml", "compose.yaml") if (docker / n).is_file()), None)
        if compose is not None:
            facts = _compose_facts(compose, warnings)
        else:
            warnings.append("docker/ has no docker-compose.yml; database engine and app port unknown")
        if "app_port" not in facts:
            port = _dotenv_port(docker / ".env") or _dotenv_port(docker / ".env.example")
            if port:
                facts["app_port"] = port
    else:
        warnings.append("no docker/ folder; environment unknown")

    spec: dict[str, Any] = {"id": task_id, "title": title or public_id}
    if loaded.dag.meta.get("category"):
        spec["category"] = loaded.dag.meta["category"]
    app_port = facts.get("app_port")
    if app_port is None:
        warnings.append("app port not found in docker-compose.yml or .env; defaulted to 8000")
    spec["app"] = {"port": int(app_port or 8000), "health_path": "/", "start_command": "bash run.sh"}
    if "database" in facts:
        db = dict(facts["database"])
        spec["database"] = {k: db[k] for k in ("engine", "version", "name", "user", "password", "port") if k in db}
    else:
        warnings.append("no database service recognised in docker-compose.yml")
    spec["timeouts"] = {"agent_s": 10800, "eval_node_s": 120, "health_s": 60}
    spec["environment"] = {"compose": "environment/docker-compose.yml", "services": facts.get("services", [])} \
        if (dest / "environment" / "docker-compose.yml").is_file() else {}
    spec["source"] = {"kind": "saasbench-public", "task": public_id, "dag": dag_src.name}
    warnings.append("domain, stack and auth profile are not derivable from the public layout; fill them in task.yaml")
    (dest / TASK_FILE).write_text(
        "# Imported from the public SaaSBench layout by `saasbench tasks import`; review domain, stack and auth.\n"
        + yaml.safe_dump(spec, sort_keys=False, allow_unicode=True), encoding="utf-8")
    task = load_task_dir(dest)
    return ImportResult(task=task, warnings=warnings, dag_warnings=[str(i) for i in loaded.warnings])
