"""The environment spec: which containers one trial of a task needs, and how to read it from compose.

An :class:`EnvSpec` is a set of :class:`ServiceSpec` (image or build, environment, volumes,
healthcheck, dependencies, command). One service holds the agent's workspace (``app`` by
default); the Docker backend (:mod:`saasbench.environments.docker`) starts them on a private network.

:func:`import_compose` reads the subset of ``docker-compose.yml`` the public SaaSBench tasks use
and rejects every other key with a :class:`SpecError` naming it, so a task never runs with a
setting silently dropped. Keys that make no sense for an isolated trial (``container_name``,
``restart``, ``networks``, fixed host ports) are accepted, recorded in ``ignored`` and not applied:
every trial gets its own network and no fixed host ports, so two trials of one task never clash.

Variables (``${VAR}``, ``${VAR:-default}``, ``${VAR-default}``, ``$VAR``, ``$$``) are resolved from the
``.env`` next to the compose file and the ``variables`` argument, never from the host environment
(a trial must not depend on who runs it). An unset variable without a default is an error.
"""

from __future__ import annotations

import os
import re
import secrets
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from saasbench.inputs import InputError, load_yaml

if TYPE_CHECKING:
    from saasbench.catalog.tasks import Task

__all__ = [
    "WORKSPACE",
    "BuildSpec",
    "DependsOn",
    "EnvSpec",
    "HealthcheckSpec",
    "ServiceSpec",
    "SpecError",
    "VolumeSpec",
    "import_compose",
    "parse_duration",
    "read_env_file",
]

WORKSPACE = "workspace"  # VolumeSpec.source that means "the trial's workspace"
DEFAULT_IMAGE = "saasbench/debian-python:bookworm"  # infra/base-image/build.sh; a task without services runs on it
DEFAULT_WORKSPACE_TARGET = "/app"

# How each compose key is treated. The file is first validated against the published compose
# specification (its JSON schema, vendored by check-jsonschema); then every key is either applied,
# ignored with a reason (recorded in EnvSpec.ignored), or rejected (it would change what a trial
# does and this backend cannot do it), so no setting is ever dropped silently.
APPLIED_SERVICE_KEYS = {
    "image",
    "build",
    "environment",
    "env_file",
    "ports",
    "expose",
    "volumes",
    "depends_on",
    "healthcheck",
    "command",
    "entrypoint",
    "working_dir",
    "user",
    "dns",
    "extra_hosts",
    "stdin_open",
    "tty",
    "ulimits",
    "shm_size",
    "hostname",
    "labels",
}
IGNORED_SERVICE_KEYS = {
    "container_name": "names are per trial, so two trials of one task never clash",
    "restart": "a trial's containers live as long as the trial; the harness watches them instead",
    "networks": "every trial gets one private network; services reach each other by service name and their aliases",
    "pull_policy": "trials never pull during a run; images come from the engine or the image map",
    "platform": "the engine's own platform is used",
    "logging": "the harness captures container logs itself",
    "init": "every trial container runs with an init process",
    "stop_grace_period": "trial teardown removes containers forcefully",
    "deploy": "Swarm deployment settings do not apply to one-host trials",
}
SERVICE_KEYS = APPLIED_SERVICE_KEYS | set(IGNORED_SERVICE_KEYS)
TOP_KEYS = {"services", "volumes", "networks", "version", "name"}
IGNORED_TOP_KEYS = {
    "version": "obsolete in the compose specification",
    "name": "project names are per trial",
    "networks": "every trial gets one private network",
}
BUILD_KEYS = {"context", "dockerfile", "args"}
HEALTH_KEYS = {"test", "interval", "timeout", "retries", "start_period", "start_interval", "disable"}


class SpecError(ValueError):
    """The spec or compose file uses something this backend does not support, or is malformed."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class BuildSpec(_Strict):
    context: str = Field(default=".", description="Build context folder (relative to the spec's base_dir)")
    dockerfile: str = Field(default="Dockerfile", description="Dockerfile, relative to the context")
    args: dict[str, str] = Field(default_factory=dict, description="Build arguments")


class HealthcheckSpec(_Strict):
    test: list[str] = Field(description='["CMD", exe, args...] or ["CMD-SHELL", "shell command"]')
    interval: float = Field(default=2.0, gt=0, description="Seconds between probes")
    timeout: float = Field(default=10.0, gt=0, description="Seconds one probe may take")
    retries: int = Field(default=3, ge=1)
    start_period: float = Field(default=0.0, ge=0, description="Seconds during which failures do not count")

    @field_validator("test", mode="before")
    @classmethod
    def _test(cls, v: Any) -> Any:
        if isinstance(v, str):
            return ["CMD-SHELL", v]
        return v

    @model_validator(mode="after")
    def _kind(self) -> HealthcheckSpec:
        if not self.test or self.test[0] not in ("CMD", "CMD-SHELL") or len(self.test) < 2:
            raise ValueError(f'healthcheck test must be ["CMD", ...] or ["CMD-SHELL", "..."], got {self.test!r}')
        return self

    def argv(self) -> list[str]:
        """The probe as an argv to exec in the container."""
        return ["/bin/sh", "-c", self.test[1]] if self.test[0] == "CMD-SHELL" else list(self.test[1:])


class DependsOn(_Strict):
    condition: Literal["service_started", "service_healthy", "service_completed_successfully"] = "service_started"


class VolumeSpec(_Strict):
    """A mount: ``source`` is ``workspace`` (the trial's workspace), a named volume (created per
    trial, removed at teardown) or a path relative to the spec's base_dir (bind mount)."""

    source: str
    target: str
    kind: Literal["workspace", "volume", "bind"] = "volume"
    read_only: bool = False


class ServiceSpec(_Strict):
    image: str | None = None
    build: BuildSpec | None = None
    environment: dict[str, str] = Field(default_factory=dict)
    env_file: list[str] = Field(default_factory=list, description="Files of KEY=VALUE lines, relative to base_dir")
    ports: list[int] = Field(
        default_factory=list, description="Container ports the service listens on (never published to fixed host ports)"
    )
    volumes: list[VolumeSpec] = Field(default_factory=list)
    healthcheck: HealthcheckSpec | None = None
    depends_on: dict[str, DependsOn] = Field(default_factory=dict)
    command: list[str] | str | None = Field(
        default=None, description="Overrides the image's CMD; a string is split into words like compose does (no shell)"
    )
    init_sql: str | None = Field(
        default=None, description="SQL file (relative to base_dir) mounted into /docker-entrypoint-initdb.d/"
    )
    init_sql_target: str | None = Field(
        default=None,
        description="Where init_sql is mounted (the compose target; its "
        "name orders the init scripts); default /docker-entrypoint-initdb.d/<file name>",
    )
    aliases: list[str] = Field(
        default_factory=list,
        description="More host names of the service on the trial network "
        "(compose networks.<net>.aliases); the service name always resolves",
    )
    entrypoint: list[str] | str | None = Field(
        default=None, description="Overrides the image's ENTRYPOINT (a string is split into words, no shell)"
    )
    working_dir: str | None = Field(
        default=None, description="Working directory of the main process and of exec (default: the workspace mount)"
    )
    user: str | None = None
    hostname: str | None = None
    dns: list[str] = Field(default_factory=list, description="DNS servers of the container")
    extra_hosts: dict[str, str] = Field(default_factory=dict, description="host name -> address lines in /etc/hosts")
    stdin_open: bool = False
    tty: bool = False
    ulimits: dict[str, tuple[int, int]] = Field(default_factory=dict, description="name -> (soft, hard)")
    shm_size: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    container_name: str | None = Field(
        default=None, description="Recorded from compose, never used (names are per trial)"
    )

    @field_validator("depends_on", mode="before")
    @classmethod
    def _deps(cls, v: Any) -> Any:
        if isinstance(v, list):
            return {str(name): {} for name in v}
        return v

    @field_validator("environment", mode="before")
    @classmethod
    def _env(cls, v: Any) -> Any:
        return _env_mapping(v)

    @field_validator("env_file", mode="before")
    @classmethod
    def _env_file(cls, v: Any) -> Any:
        return [v] if isinstance(v, str) else v

    @model_validator(mode="after")
    def _image_or_build(self) -> ServiceSpec:
        if self.image is None and self.build is None:
            raise ValueError("a service needs an image or a build")
        return self

    def workspace_target(self) -> str | None:
        return next((v.target for v in self.volumes if v.kind == "workspace"), None)


class EnvSpec(_Strict):
    services: dict[str, ServiceSpec]
    app_service: str | None = Field(
        default=None,
        description="The service holding the workspace where exec runs; "
        "default: the one mounting the workspace, else 'app', else the only service",
    )
    base_dir: str | None = Field(
        default=None, description="Folder relative paths (build, env_file, bind mounts) are resolved in"
    )
    ignored: list[str] = Field(
        default_factory=list, description="Compose settings accepted but not applied, each with why"
    )
    warnings: list[str] = Field(
        default_factory=list, description="What the import could not honour (e.g. a missing env_file)"
    )
    substitutions: dict[str, str] = Field(
        default_factory=dict,
        description="service -> 'declared -> used' image swaps made by an image map (saasbench.catalog.imagemap)",
    )
    missing_variables: dict[str, str] = Field(
        default_factory=dict,
        description="Variables used without a value or default (only from a non-strict import): name -> where and why",
    )

    @model_validator(mode="after")
    def _check(self) -> EnvSpec:
        if not self.services:
            raise ValueError("an environment needs at least one service")
        for name, svc in self.services.items():
            for dep, cond in svc.depends_on.items():
                if dep not in self.services:
                    raise ValueError(f"service {name!r} depends on unknown service {dep!r}")
                if cond.condition == "service_healthy" and self.services[dep].healthcheck is None:
                    raise ValueError(
                        f"service {name!r} waits for {dep!r} to be healthy, but {dep!r} has no healthcheck"
                    )
        self.start_order()  # raises on a cycle
        app = self.app()
        if self.services[app].workspace_target() is None:
            self.services[app].volumes.append(
                VolumeSpec(source=WORKSPACE, target=DEFAULT_WORKSPACE_TARGET, kind="workspace")
            )
        return self

    def app(self) -> str:
        if self.app_service is not None:
            if self.app_service not in self.services:
                raise ValueError(f"app_service {self.app_service!r} is not a service ({', '.join(self.services)})")
            return self.app_service
        with_ws = [n for n, s in self.services.items() if s.workspace_target() is not None]
        if with_ws:
            return with_ws[0]
        if "app" in self.services:
            return "app"
        if len(self.services) == 1:
            return next(iter(self.services))
        raise ValueError("cannot tell which service is the app: set app_service")

    def start_order(self) -> list[str]:
        """Services so that each comes after everything it depends on (declaration order otherwise)."""
        order: list[str] = []
        state: dict[str, int] = {}

        def visit(name: str, path: list[str]) -> None:
            if state.get(name) == 2:
                return
            if state.get(name) == 1:
                raise ValueError(f"dependency cycle: {' -> '.join(path + [name])}")
            state[name] = 1
            for dep in self.services[name].depends_on:
                visit(dep, path + [name])
            state[name] = 2
            order.append(name)

        for name in self.services:
            visit(name, [])
        return order

    def path(self, rel: str) -> Path:
        p = Path(rel)
        if p.is_absolute():
            return p
        if self.base_dir is None:
            raise SpecError(f"relative path {rel!r} in a spec without base_dir")
        return Path(self.base_dir) / p


# --- helpers -------------------------------------------------------------------------------------
def _env_mapping(v: Any) -> Any:
    if v is None:
        return {}
    if isinstance(v, list):
        out = {}
        for item in v:
            key, sep, value = str(item).partition("=")
            out[key] = value if sep else ""
        return out
    if isinstance(v, dict):
        return {
            str(k): "" if val is None else (str(val).lower() if isinstance(val, bool) else str(val))
            for k, val in v.items()
        }
    return v


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(us|ms|s|m|h)")


def parse_duration(value: Any) -> float:
    """Compose durations (``1m30s``, ``500ms``, ``10s``) or plain numbers (seconds) -> seconds."""
    if isinstance(value, (int, float)):
        return float(value)
    text = str(value).strip()
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text)
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise SpecError(f"not a duration: {value!r} (use e.g. 10s, 1m30s, 500ms)")
    scale = {"us": 1e-6, "ms": 1e-3, "s": 1, "m": 60, "h": 3600}
    return sum(float(n) * scale[u] for n, u in parts)


def read_env_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines (``#`` comments, optional ``export``, optional quotes), as compose reads them."""
    out: dict[str, str] = {}
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[7:].lstrip()
        key, sep, value = line.partition("=")
        if not sep:
            continue
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        elif " #" in value:
            value = value.split(" #", 1)[0].rstrip()
        out[key.strip()] = value
    return out


_VAR = re.compile(r"\$(?:\$|\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))")


def _interpolate(value: Any, variables: dict[str, str], where: str, missing: dict[str, str] | None = None) -> Any:
    """Substitute compose variables. An unset variable without a default raises :class:`SpecError`,
    unless ``missing`` is a dict: then it becomes "" and ``missing[name]`` says where and why."""
    if isinstance(value, dict):
        return {k: _interpolate(v, variables, f"{where}.{k}", missing) for k, v in value.items()}
    if isinstance(value, list):
        return [_interpolate(v, variables, f"{where}[{i}]", missing) for i, v in enumerate(value)]
    if not isinstance(value, str):
        return value

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1) or m.group(4)
        op, arg = m.group(2), m.group(3)
        current = variables.get(name)
        if op in (":-", "-"):
            if current is None or (op == ":-" and current == ""):
                return arg or ""
            return current
        if op in (":?", "?"):
            if current is None or (op == ":?" and current == ""):
                if missing is None:
                    raise SpecError(f"{where}: variable {name} is required: {arg}")
                missing.setdefault(name, f"{where}: required ({arg})" if arg else f"{where}: required")
                return ""
            return current
        if current is None:
            if missing is None:
                raise SpecError(f"{where}: variable {name} is not set (in .env or variables) and has no default")
            missing.setdefault(name, f"{where}: not set and no default")
            return ""
        return current

    return _VAR.sub(sub, value)


def _parse_port(item: Any, where: str) -> int:
    if isinstance(item, int):
        return item
    if isinstance(item, dict):
        if "target" not in item:
            raise SpecError(f"{where}: port mapping without target")
        return int(item["target"])
    text = str(item).split("/", 1)[0]
    container = text.rsplit(":", 1)[-1]
    if "-" in container:
        raise SpecError(f"{where}: port ranges are not supported ({item!r})")
    try:
        return int(container)
    except ValueError:
        raise SpecError(f"{where}: cannot read port {item!r}") from None


def _parse_volume(item: Any, where: str, named: set[str]) -> VolumeSpec:
    if isinstance(item, dict):
        unknown = set(item) - {"type", "source", "target", "read_only"}
        if unknown:
            raise SpecError(f"{where}: unsupported volume key(s) {', '.join(sorted(unknown))}")
        source, target, ro = str(item.get("source", "")), str(item["target"]), bool(item.get("read_only", False))
    else:
        parts = str(item).split(":")
        if len(parts) == 1:
            raise SpecError(f"{where}: anonymous volumes are not supported ({item!r}); name it")
        source, target = parts[0], parts[1]
        opts = parts[2].split(",") if len(parts) > 2 else []
        ro = "ro" in opts
    if (
        source.rstrip("/") in ("./workspace", "workspace")
        or source.rstrip("/").endswith("/workspace")
        and source.startswith(".")
    ):
        return VolumeSpec(source=WORKSPACE, target=target, kind="workspace", read_only=ro)
    if source.startswith((".", "/", "~")):
        return VolumeSpec(source=source, target=target, kind="bind", read_only=ro)
    if named and source not in named:
        raise SpecError(f"{where}: volume {source!r} is not declared under the top-level volumes:")
    return VolumeSpec(source=source, target=target, kind="volume", read_only=ro)


def _check_keys(data: dict, allowed: set[str], where: str) -> None:
    unknown = sorted(k for k in set(data) - allowed if not str(k).startswith("x-"))
    if unknown:
        raise SpecError(
            f"{where}: unsupported compose key {unknown[0]!r}"
            + (f" (also {', '.join(map(repr, unknown[1:]))})" if len(unknown) > 1 else "")
            + f"; supported: {', '.join(sorted(allowed))}"
        )


_SCHEMA: dict[str, Any] | None = None


def compose_schema() -> dict[str, Any]:
    """The published compose specification's JSON schema, as vendored (and kept current) by check-jsonschema."""
    global _SCHEMA
    if _SCHEMA is None:
        import json
        from importlib import resources

        text = (
            resources.files("check_jsonschema.builtin_schemas.vendor").joinpath("compose-spec.json").read_text("utf-8")
        )
        _SCHEMA = json.loads(text)
    return _SCHEMA


def validate_compose(data: Any, where: str) -> None:
    """Raise :class:`SpecError` listing (up to five) places where ``data`` breaks the compose specification."""
    import jsonschema

    schema = compose_schema()
    validator = jsonschema.validators.validator_for(schema)(schema)
    errors = sorted(validator.iter_errors(data), key=lambda e: list(map(str, e.absolute_path)))
    if errors:
        shown = "; ".join(
            f"{'.'.join(map(str, e.absolute_path)) or 'top level'}: {e.message[:200]}" for e in errors[:5]
        )
        raise SpecError(
            f"{where}: not a valid compose file (compose specification): {shown}"
            + (f" (+{len(errors) - 5} more)" if len(errors) > 5 else "")
        )


def _words(value: Any) -> list[str] | str | None:
    return value if isinstance(value, (list, str)) or value is None else str(value)


def _bool(value: Any, where: str) -> bool:
    """A compose boolean: true/false, or (after interpolation) a string such as "true", "no", "1"."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "yes", "y", "on", "1"):
        return True
    if text in ("false", "no", "n", "off", "0", ""):
        return False
    raise SpecError(f"{where}: not a boolean: {value!r}")


def _ulimits(value: Any, where: str) -> dict[str, tuple[int, int]]:
    out: dict[str, tuple[int, int]] = {}
    for name, limit in (value or {}).items():
        if isinstance(limit, dict):
            out[str(name)] = (int(limit["soft"]), int(limit["hard"]))
        else:
            out[str(name)] = (int(limit), int(limit))
    return out


def _extra_hosts(value: Any) -> dict[str, str]:
    if isinstance(value, dict):
        return {str(k): str(v[0] if isinstance(v, list) else v) for k, v in value.items()}
    out: dict[str, str] = {}
    for item in value or []:
        text = str(item)
        sep = "=" if "=" in text else ":"
        host, _, addr = text.partition(sep)
        out[host] = addr
    return out


def _env_files(value: Any, where: str, base: Path, warnings: list[str]) -> list[str]:
    """The env files that exist; a missing required one is a warning (the trial starts without its variables)."""
    out: list[str] = []
    for f in value if isinstance(value, list) else [value]:
        rel, required = (str(f["path"]), bool(f.get("required", True))) if isinstance(f, dict) else (str(f), True)
        if (base / rel).is_file():
            out.append(rel)
        elif required:
            warnings.append(
                f"{where}.env_file: {rel} does not exist next to the compose file; the service starts "
                "without its variables (create it before running trials)"
            )
    return out


def import_compose(
    path: str | Path, *, variables: dict[str, str] | None = None, app_service: str | None = None, strict: bool = True
) -> EnvSpec:
    """Read a ``docker-compose.yml`` into an :class:`EnvSpec`.

    The file is validated against the compose specification's JSON schema, YAML anchors and
    merge keys are resolved by the YAML reader, and top-level ``x-`` extension fields are dropped
    after that. ``variables`` override the ``.env`` next to the file. ``./workspace`` bind mounts
    become the trial's workspace; other relative bind mounts stay relative to the compose folder
    (a ``*.sql`` mounted into ``/docker-entrypoint-initdb.d`` becomes ``init_sql``). Keys that do
    not matter for a trial are listed in ``ignored`` with a reason; a missing ``env_file`` is a
    warning in ``warnings``. Raises :class:`SpecError` naming an invalid value, a key this backend
    cannot honour, or (when ``strict``) an unset variable without a default; without ``strict``
    such variables become "" and are listed in ``missing_variables`` (what ``tasks import`` uses
    to tell which variables a task must be given).
    """
    path = Path(path)
    try:
        data = load_yaml(path, what="compose file")
    except InputError as exc:
        raise SpecError(str(exc)) from None
    if not isinstance(data, dict) or not isinstance(data.get("services"), dict):
        raise SpecError(f"{path}: no services: mapping")
    validate_compose(data, str(path))
    ignored: list[str] = [f"{k} (top level): {IGNORED_TOP_KEYS[k]}" for k in IGNORED_TOP_KEYS if data.get(k)]
    ignored += [
        f"{k} (top level): extension field, used through YAML anchors only" for k in data if str(k).startswith("x-")
    ]
    _check_keys(data, TOP_KEYS, path.name)
    warnings: list[str] = []
    env_vars: dict[str, str] = {}
    dotenv = path.parent / ".env"
    if dotenv.is_file():
        env_vars.update(read_env_file(dotenv))
    env_vars.update(variables or {})
    named = set((data.get("volumes") or {}).keys())
    missing: dict[str, str] | None = None if strict else {}
    services: dict[str, Any] = {}
    for name, raw in data["services"].items():
        where = f"{path.name}: services.{name}"
        if not isinstance(raw, dict):
            raise SpecError(f"{where}: not a mapping")
        _check_keys(raw, SERVICE_KEYS, where)
        svc = _interpolate({k: v for k, v in raw.items() if not str(k).startswith("x-")}, env_vars, where, missing)
        out: dict[str, Any] = {}
        for key in sorted(set(IGNORED_SERVICE_KEYS) & set(svc)):
            ignored.append(f"services.{name}.{key}: {IGNORED_SERVICE_KEYS[key]}")
        if "container_name" in svc:
            out["container_name"] = str(svc["container_name"])
        if "image" in svc:
            out["image"] = str(svc["image"])
        if "build" in svc:
            b = svc["build"]
            if isinstance(b, str):
                out["build"] = {"context": b}
            else:
                _check_keys(b, BUILD_KEYS, f"{where}.build")
                out["build"] = {
                    "context": str(b.get("context", ".")),
                    "dockerfile": str(b.get("dockerfile", "Dockerfile")),
                    "args": _env_mapping(b.get("args")),
                }
            if "image" in out:
                ignored.append(f"services.{name}.image ({out.pop('image')}): built locally instead")
        out["environment"] = svc.get("environment")
        if "env_file" in svc:
            out["env_file"] = _env_files(svc["env_file"], where, path.parent, warnings)
        ports = [_parse_port(p, f"{where}.ports") for p in svc.get("ports") or []]
        if ports:
            ignored.append(
                f"services.{name}.ports host side: published ports would clash between trials; "
                "the service is reached on the trial network instead"
            )
        ports += [_parse_port(p, f"{where}.expose") for p in svc.get("expose") or []]
        if ports:
            out["ports"] = list(dict.fromkeys(ports))
        vols = [_parse_volume(v, f"{where}.volumes", named) for v in svc.get("volumes") or []]
        keep = []
        for v in vols:
            if v.kind == "bind" and v.source.endswith(".sql") and v.target.startswith("/docker-entrypoint-initdb.d"):
                out["init_sql"], out["init_sql_target"] = v.source, v.target
            else:
                keep.append(v)
        out["volumes"] = keep
        for v in vols:
            if v.kind == "bind" and not (path.parent / os.path.expanduser(v.source)).exists():
                warnings.append(
                    f"{where}.volumes: bind mount source {v.source} does not exist next to the compose file "
                    "(not shipped?); the service cannot start without it"
                )
        if "healthcheck" in svc:
            h = svc["healthcheck"] or {}
            _check_keys(h, HEALTH_KEYS, f"{where}.healthcheck")
            if not h.get("disable"):
                hc: dict[str, Any] = {"test": h.get("test")}
                for key in ("interval", "timeout", "start_period"):
                    if key in h:
                        hc[key] = parse_duration(h[key])
                if "retries" in h:
                    hc["retries"] = int(h["retries"])
                if hc["test"] not in (None, ["NONE"]):
                    out["healthcheck"] = hc
        if "depends_on" in svc:
            deps = svc["depends_on"]
            if isinstance(deps, dict):
                deps = {d: {"condition": (c or {}).get("condition", "service_started")} for d, c in deps.items()}
            out["depends_on"] = deps
        for key in ("command", "entrypoint"):
            if key in svc:
                out[key] = _words(svc[key])
        for key in ("working_dir", "user", "hostname", "shm_size"):
            if svc.get(key) is not None:
                out[key] = str(svc[key])
        if "dns" in svc:
            out["dns"] = [str(d) for d in (svc["dns"] if isinstance(svc["dns"], list) else [svc["dns"]])]
        if "extra_hosts" in svc:
            out["extra_hosts"] = _extra_hosts(svc["extra_hosts"])
        for key in ("stdin_open", "tty"):
            if key in svc:
                out[key] = _bool(svc[key], f"{where}.{key}")
        if "ulimits" in svc:
            out["ulimits"] = _ulimits(svc["ulimits"], f"{where}.ulimits")
        if "labels" in svc:
            out["labels"] = _env_mapping(svc["labels"])
        if isinstance(svc.get("networks"), dict):  # one trial network, but the host names a task relies on stay
            out["aliases"] = list(
                dict.fromkeys(
                    str(a)
                    for net in svc["networks"].values()
                    if isinstance(net, dict)
                    for a in net.get("aliases") or []
                    if str(a) != name
                )
            )
        services[name] = out
    try:
        return EnvSpec(
            services=services,
            app_service=app_service,
            base_dir=str(path.parent.resolve()),
            ignored=ignored,
            warnings=warnings,
            missing_variables=missing or {},
        )
    except ValueError as exc:
        raise SpecError(f"{path}: {exc}") from None


# --- the environment a task declares ----------------------------------------------------------------
def compose_variables(task: Task) -> dict[str, str]:
    """Variables for the task's compose file: ``environment.variables`` (literal values), plus a fresh
    random value per call for each name in ``environment.secrets`` (secrets the upstream recipe says
    to generate, e.g. with ``openssl rand -hex 32``; one environment = one call, so its services agree)."""
    block = task.spec.environment or {}
    out = {str(k): str(v) for k, v in (block.get("variables") or {}).items()}
    for name in block.get("secrets") or []:
        out.setdefault(str(name), secrets.token_hex(32))
    return out


def env_spec_for_task(task: Task, *, image: str = DEFAULT_IMAGE) -> EnvSpec:
    """The task's environment: ``environment.compose`` (a compose file in the task folder),
    ``environment.services`` as a mapping (an inline :class:`EnvSpec`), or else one ``app``
    service on ``image`` with the workspace at ``/app``; then the image map is applied
    (:mod:`saasbench.catalog.imagemap`)."""
    from saasbench.catalog.imagemap import apply_image_map, image_map_for  # imagemap imports this module

    block = task.spec.environment or {}
    if block.get("compose"):
        spec = import_compose(
            task.root / str(block["compose"]), app_service=block.get("app_service"), variables=compose_variables(task)
        )
    elif isinstance(block.get("services"), dict):
        data = {k: v for k, v in block.items() if k in ("services", "app_service")}
        spec = EnvSpec.model_validate({**data, "base_dir": str(task.root)})
    else:
        return EnvSpec(services={"app": ServiceSpec(image=image)})
    return apply_image_map(spec, image_map_for(task))
