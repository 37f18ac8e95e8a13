"""The architecture as a test: the layer import rule, and docs/architecture.md naming every module.

Each layer may import only from the layers below it (docs/architecture.md, "Layers"). The check
parses every module (imports inside functions count; imports under ``if TYPE_CHECKING:`` do not,
they are annotations only). import-linter cannot see ``saasbench.primitives``/``agents``/``flows``,
which setuptools maps from top-level folders, so the rule is checked here with ``ast``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# top to bottom; a module may import its own layer and the layers after it
LAYERS: list[tuple[str, ...]] = [
    ("saasbench.cli", "saasbench.flows"),
    ("saasbench.runs",),
    ("saasbench.reports",),
    ("saasbench.lake",),
    ("saasbench.agents", "saasbench.primitives"),
    ("saasbench.environments",),
    ("saasbench.catalog",),
    ("saasbench.evaluation",),
    ("saasbench.services",),
    ("saasbench.dag",),
    ("saasbench.settings", "saasbench.failures", "saasbench.redaction", "saasbench.inputs"),
]
# Declared exceptions, each with its reason (keep this list short; docs/architecture.md repeats it).
ALLOWED = {
    # the one primitive registry is looked up by code: the loader validates inputs against it, the engine
    # runs through it; the registry module itself imports no primitive at load (its modules load lazily)
    ("saasbench.dag", "saasbench.primitives.registry"),
    ("saasbench.evaluation.engine", "saasbench.primitives.registry"),
}


def module_files() -> dict[str, Path]:
    out = {}
    for base, dotted in (
        (REPO / "saasbench", "saasbench"),
        (REPO / "primitives", "saasbench.primitives"),
        (REPO / "agents", "saasbench.agents"),
        (REPO / "flows", "saasbench.flows"),
    ):
        for path in base.rglob("*.py"):
            if path.is_symlink() or any(p.is_symlink() for p in path.parents if base in p.parents):
                continue
            rel = path.relative_to(base).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            out[".".join([dotted, *parts])] = path
    return out


def layer_of(module: str) -> int | None:
    for index, names in enumerate(LAYERS):
        if any(module == n or module.startswith(n + ".") for n in names):
            return index
    return None


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_of(path: Path, module: str) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)  # `from saasbench import settings`
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return {f for f in found if f.startswith("saasbench")}


def test_every_module_is_in_a_layer() -> None:
    unplaced = [m for m in module_files() if m != "saasbench" and layer_of(m) is None]
    assert unplaced == [], f"modules outside every layer (add them to LAYERS and docs/architecture.md): {unplaced}"


def test_layers_import_only_downwards() -> None:
    modules = module_files()
    violations = []
    for module, path in sorted(modules.items()):
        mine = layer_of(module)
        if mine is None:
            continue
        for target in sorted(imports_of(path, module)):
            theirs = layer_of(target)
            if (
                theirs is None
                or theirs >= mine
                or any(
                    (module == a or module.startswith(a + ".")) and (target == b or target.startswith(b + "."))
                    for a, b in ALLOWED
                )
            ):
                continue
            violations.append(f"{module} ({'|'.join(LAYERS[mine])}) imports {target} ({'|'.join(LAYERS[theirs])})")
    assert violations == [], "upward imports:\n" + "\n".join(violations)


def test_the_rule_catches_an_upward_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from saasbench.runs.sweep import plan\n", encoding="utf-8")
    ok = tmp_path / "ok.py"
    ok.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from saasbench.runs.sweep import plan\n",
        encoding="utf-8",
    )
    assert "saasbench.runs.sweep" in imports_of(bad, "saasbench.dag")
    assert imports_of(ok, "saasbench.dag") == set()
    assert layer_of("saasbench.runs.sweep") < layer_of("saasbench.dag")


def test_architecture_doc_lists_every_module() -> None:
    """The Layout section names every module by its path (a package by its folder), so it cannot drift."""
    doc = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    layout = doc.split("## Layout", 1)[1].split("\n## ", 1)[0]
    missing = []
    for path in module_files().values():
        rel = path.relative_to(REPO).as_posix()
        wanted = rel.removesuffix("__init__.py") if rel.endswith("/__init__.py") else rel
        if f"`{wanted}`" not in layout:
            missing.append(wanted)
    assert missing == [], f"docs/architecture.md's Layout does not name: {sorted(missing)}"


def test_backend_names_come_from_the_registry() -> None:
    import pytest
    from pydantic import ValidationError

    from saasbench.environments import backend_names, check_backend, register_backend
    from saasbench.runs.sweep import SweepSpec

    assert backend_names()[:2] == ("local", "docker")
    with pytest.raises(ValueError, match="choose local or docker"):
        check_backend("podman")
    with pytest.raises(ValidationError, match="unknown backend 'podman'"):
        SweepSpec(sweep_id="s", tasks=["t"], agents=["nop"], backend="podman")
    register_backend("podman", lambda task, **kw: ("podman", task))
    try:
        from saasbench.environments import create_environment

        assert SweepSpec(sweep_id="s", tasks=["t"], agents=["nop"], backend="podman").backend == "podman"
        assert create_environment("podman", "T") == ("podman", "T")
    finally:
        from saasbench import environments

        environments._BACKENDS.pop("podman")


# Callers ask an environment the member that answers their question (saasbench/environments/base.py:
# runs_on_host, gateway_ip, container_name, ...), never its kind: a new backend then only overrides members.
_ASKS_KIND = re.compile(r"\b(?:env|environment)\.kind\s*(?:==|!=|\bin\b|\bnot in\b)|getattr\((?:env|environment),")
_ASKS_KIND_PENDING: dict[str, int] = {}  # none left


def test_callers_ask_the_environment_interface_not_its_kind() -> None:
    found: dict[str, list[str]] = {}
    for base in ("saasbench", "primitives", "agents", "flows", "bench"):
        for path in sorted((REPO / base).rglob("*.py")):
            if any(p.is_symlink() for p in [path, *path.parents] if REPO in p.parents):
                continue
            rel = path.relative_to(REPO).as_posix()
            if rel == "saasbench/environments/base.py":  # the interface: its conformance suite reads members by name
                continue
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if _ASKS_KIND.search(line):
                    found.setdefault(rel, []).append(f"{rel}:{number}: {line.strip()}")
    over = [hit for rel, hits in found.items() if len(hits) > _ASKS_KIND_PENDING.get(rel, 0) for hit in hits]
    assert over == [], "ask a declared Environment member instead:\n" + "\n".join(over)
