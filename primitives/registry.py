"""The one registry of primitive codes.

A primitive is a function ``(inputs, ctx) -> StepResult``. Its inputs are a pydantic model
(subclass of :class:`PrimitiveInputs`) whose ``before`` validators normalise the legacy
dialects found in real DAGs and call :func:`saasbench.dag.note` for each one, so
``saasbench dag check`` can list them. Custom primitives register the same way (a plugin
module imported with ``--plugin``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Literal

from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:
    from saasbench.evaluation.context import RunContext
    from saasbench.evaluation.results import StepResult


class PrimitiveInputs(BaseModel):
    """Base of every input model: unknown keys are kept (and reported by the loader)."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)


def rename_aliases(data: dict[str, Any], target: str, aliases: tuple[str, ...]) -> None:
    """Move the first legacy alias present to ``target`` (unless it is set) and note the normalisation."""
    from saasbench.dag import note

    for key in aliases:
        if key in data and target not in data:
            data[target] = data.pop(key)
            note(f"'{key}' -> '{target}'")


Group = Literal["file", "http", "db", "container", "auth", "browser", "judge", "integration", "reserved"]


@dataclass
class PrimitiveSpec:
    code: str
    name: str
    group: Group
    description: str
    inputs: type[PrimitiveInputs] | None = None
    fn: Callable[[Any, "RunContext"], "StepResult"] | None = None
    # Input fields whose {{...}} text is interpreted by the primitive itself, not the resolver
    # (e.g. P08's magic "{{not_null}}" expectations).
    raw_fields: frozenset[str] = field(default_factory=frozenset)
    reserved: bool = False

    @property
    def status(self) -> str:
        if self.fn is not None:
            return "available"
        return "reserved" if self.reserved else "pending"


# The paper's Table 12 (and the codes the public DAGs use), with names and groups.
_CATALOGUE: list[tuple[str, str, Group, str]] = [
    ("P01", "file_exists", "file", "A file or directory exists in the workspace"),
    (
        "P02",
        "file_content_match",
        "file",
        "A workspace file (or any file under a directory) contains a substring or regex",
    ),
    ("P03", "file_count", "file", "At least N workspace files match a glob"),
    ("P04", "http_request", "http", "Send an HTTP request as the active identity; passes when a response arrives"),
    ("P05", "api_crud", "http", "Create -> read -> update -> delete round trip on a REST resource"),
    ("P06", "json_schema_match", "http", "Required (dotted) fields are present in the last response body"),
    ("P07", "json_value_assert", "http", "Path-based assertions on the last response body or document"),
    ("P08", "db_query", "db", "Run SQL against the app database and compare the result"),
    ("P09", "db_table_exists", "db", "Tables exist in the app database"),
    ("P10", "db_column_check", "db", "Columns (and types) exist on a table"),
    ("P11", "db_index_check", "db", "Indexes exist on a table"),
    ("P12", "container_exec", "container", "Run a command in the app container; check exit code and output"),
    ("P13", "auth_login", "auth", "Log in as a role through the task's auth profile and make it the active identity"),
    ("P14", "permission_check", "auth", "A role is allowed or denied an action"),
    ("P15", "status_code_assert", "http", "The last response status is one of the expected codes"),
    ("P16", "response_time_check", "http", "The last response arrived within a time budget"),
    ("P17", "llm_judge", "judge", "Rubric-based LLM scoring of gathered evidence"),
    ("P18", "browser_interaction", "browser", "Browser steps: goto, click, fill, type, wait"),
    ("P19", "dom_assertion", "browser", "DOM assertions by CSS selector"),
    ("P20", "reserved_p20", "reserved", "Reserved in the paper; used by no DAG"),
    ("P21", "log_content_check", "container", "A log file in the app container contains a pattern"),
    ("P22", "graphql_request", "http", "GraphQL request; the response becomes the last response"),
    ("P23", "file_upload", "http", "Multipart upload, then download check"),
    ("P24", "queue_job_check", "integration", "Trigger, then poll for a background job's effect"),
    ("P25", "webhook_probe", "reserved", "Reserved in the paper (webhook probe); used by no DAG"),
    ("P26", "search_query", "http", "Search query returns the expected hits"),
    ("P27", "webhook_delivery", "integration", "The app delivers a webhook to a receiver started for the run"),
    ("P28", "email_check", "integration", "The app sends an email caught by an SMTP sink"),
    ("P29", "multi_step_workflow", "http", "Multi-step workflow with state checks and a final DB verify"),
    ("RENDER_DOM", "render_dom", "browser", "Render a page in headless Chromium and keep the sanitised DOM"),
    ("SCREENSHOT", "screenshot", "browser", "Screenshot a page in headless Chromium"),
    ("P_INGEST", "event_ingest", "integration", "Send analytics events and check they were ingested"),
]


class Registry:
    def __init__(self) -> None:
        self._specs: dict[str, PrimitiveSpec] = {}
        for code, name, group, description in _CATALOGUE:
            self._specs[code] = PrimitiveSpec(code, name, group, description, reserved=group == "reserved")

    def spec(self, code: str) -> PrimitiveSpec | None:
        self._ensure_builtins()
        return self._specs.get(code)

    def all(self) -> list[PrimitiveSpec]:
        self._ensure_builtins()
        return list(self._specs.values())

    def register(
        self,
        code: str,
        fn: Callable[[Any, "RunContext"], "StepResult"],
        inputs: type[PrimitiveInputs],
        *,
        name: str | None = None,
        group: Group | None = None,
        description: str | None = None,
        raw_fields: frozenset[str] | set[str] = frozenset(),
    ) -> PrimitiveSpec:
        """Register (or replace) the implementation of a code; new codes are allowed for plugins."""
        old = self._specs.get(code)
        spec = PrimitiveSpec(
            code=code,
            name=name or (old.name if old else code.lower()),
            group=group or (old.group if old else "integration"),
            description=description or (old.description if old else (fn.__doc__ or "").strip().split("\n")[0]),
            inputs=inputs,
            fn=fn,
            raw_fields=frozenset(raw_fields),
        )
        self._specs[code] = spec
        return spec

    def unregister(self, code: str) -> None:
        """Forget an implementation (tests use it to restore a pending code)."""
        old = self._specs.get(code)
        if old is not None:
            self._specs[code] = PrimitiveSpec(old.code, old.name, old.group, old.description, reserved=old.reserved)

    def remove(self, code: str) -> None:
        """Forget a plugin code entirely; catalogue codes go back to pending instead."""
        if code in {c for c, *_ in _CATALOGUE}:
            self.unregister(code)
        else:
            self._specs.pop(code, None)

    _loaded = False

    def _ensure_builtins(self) -> None:
        if not Registry._loaded:
            Registry._loaded = True
            from saasbench.primitives import load_builtin_primitives

            load_builtin_primitives()


REGISTRY = Registry()


def primitive(
    code: str,
    inputs: type[PrimitiveInputs],
    *,
    raw_fields: frozenset[str] | set[str] = frozenset(),
    description: str | None = None,
):
    """Decorator: ``@primitive("P04", P04Inputs)`` registers a function for a code."""

    def wrap(fn):
        REGISTRY.register(code, fn, inputs, raw_fields=raw_fields, description=description)
        return fn

    return wrap
