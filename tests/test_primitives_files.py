"""File primitives P01-P03 against temporary workspaces: verdicts, confinement, limits, dialects."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from saasbench.dag import load_dag_data
from saasbench.evaluation.context import RunContext, Target
from saasbench.evaluation.results import StepResult
from saasbench.primitives import files
from saasbench.primitives.registry import REGISTRY


def run(code: str, inputs: dict[str, Any], workspace: Path | None) -> StepResult:
    spec = REGISTRY.spec(code)
    assert spec is not None and spec.fn is not None and spec.inputs is not None
    ctx = RunContext(Target(workspace=workspace))
    return spec.fn(spec.inputs.model_validate(inputs), ctx)


def write(root: Path, rel: str, text: str | bytes = "") -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    write(root, "requirements.txt", "Flask==3.0\nSQLAlchemy>=2\n")
    write(root, "README.md", "# Demo\n")
    write(root, "src/app/main.py", "import os\n\nclass Project:\n    pass\n")
    write(root, "src/app/util.py", "def helper():\n    return 1\n")
    write(root, "src/web/index.ts", "export const x = 1\n")
    write(root, "src/web/view.tsx", "export default function View() {}\n")
    write(root, "node_modules/lib/index.js", "emitDatabaseBatchEvent()\n")
    write(root, "db/migrations/2024/001_init.sql", "CREATE TABLE t (id int);\n")
    write(root, "db/migrations/002_more.sql", "ALTER TABLE t ADD c int;\n")
    return root


# --- P01 ---------------------------------------------------------------------------------------------
def test_p01_file_exists_and_missing(ws: Path) -> None:
    ok = run("P01", {"path": "requirements.txt"}, ws)
    assert ok.passed and ok.evidence["matched"] == ["requirements.txt"]
    missing = run("P01", {"path": "Gemfile"}, ws)
    assert not missing.passed and "Gemfile not found" in missing.message


def test_p01_dir_type(ws: Path) -> None:
    assert run("P01", {"path": "src/app", "type": "dir"}, ws).passed
    assert run("P01", {"path": "src/app/", "type": "dir"}, ws).passed
    wrong = run("P01", {"path": "src/app"}, ws)  # default type is file
    assert not wrong.passed and "is a dir, expected a file" in wrong.message
    assert not run("P01", {"path": "README.md", "type": "dir"}, ws).passed
    assert run("P01", {"path": ".", "type": "dir"}, ws).passed


def test_p01_path_any_of(ws: Path) -> None:
    result = run("P01", {"path": "pyproject.toml", "path_any_of": ["setup.py", "requirements.txt"]}, ws)
    assert result.passed and result.value == {"path": "requirements.txt", "type": "file"}
    assert [c["path"] for c in result.evidence["checked"]] == ["pyproject.toml", "setup.py", "requirements.txt"]
    assert not run("P01", {"path_any_of": ["a", "b"]}, ws).passed


@pytest.mark.parametrize(
    "path,needle",
    [
        ("/etc/passwd", "absolute"),
        ("../outside.txt", "escapes the workspace"),
        ("src/../../outside.txt", "escapes the workspace"),
        ("..", "escapes the workspace"),
    ],
)
def test_p01_refuses_paths_outside_the_workspace(ws: Path, path: str, needle: str) -> None:
    write(ws.parent, "outside.txt", "secret")
    result = run("P01", {"path": path}, ws)
    assert not result.passed and needle in result.message


def test_escaping_candidate_fails_even_when_another_matches(ws: Path) -> None:
    result = run("P01", {"path": "/etc/hostname", "path_any_of": ["README.md"]}, ws)
    assert not result.passed and "absolute" in result.message


def test_dotdot_that_stays_inside_is_fine(ws: Path) -> None:
    assert run("P01", {"path": "src/../README.md"}, ws).passed


def test_symlink_out_of_the_workspace_is_refused(ws: Path) -> None:
    secret = write(ws.parent, "secret/key.txt", "TOPSECRET")
    os.symlink(secret.parent, ws / "linkdir")
    os.symlink(secret, ws / "linkfile")
    for path in ("linkdir/key.txt", "linkfile"):
        result = run("P01", {"path": path}, ws)
        assert not result.passed and "outside the workspace" in result.message
    grep = run("P02", {"path": "linkfile", "pattern": "TOPSECRET"}, ws)
    assert not grep.passed and "outside the workspace" in grep.message
    # a directory walk silently ignores links that leave the workspace
    walk = run("P02", {"path": ".", "pattern": "TOPSECRET"}, ws)
    assert not walk.passed


def test_symlink_inside_the_workspace_is_followed(ws: Path) -> None:
    os.symlink(ws / "README.md", ws / "README.link")
    assert run("P01", {"path": "README.link"}, ws).passed


def test_no_workspace(ws: Path) -> None:
    for code, inputs in (("P01", {"path": "x"}), ("P02", {"path": "x", "pattern": "y"}), ("P03", {"glob": "*"})):
        result = run(code, inputs, None)
        assert not result.passed and result.message == "no workspace: pass --workspace"


def test_workspace_that_does_not_exist(tmp_path: Path) -> None:
    result = run("P01", {"path": "x"}, tmp_path / "nope")
    assert not result.passed and "is not a directory" in result.message


def test_p01_requires_a_path() -> None:
    spec = REGISTRY.spec("P01")
    with pytest.raises(Exception, match="path"):
        spec.inputs.model_validate({"type": "file"})


# --- P02 ---------------------------------------------------------------------------------------------
def test_p02_contains_is_case_sensitive(ws: Path) -> None:
    assert run("P02", {"path": "requirements.txt", "pattern": "Flask"}, ws).passed
    lower = run("P02", {"path": "requirements.txt", "pattern": "flask"}, ws)
    assert not lower.passed and "not found" in lower.message
    ci = run("P02", {"path": "requirements.txt", "pattern": "flask", "match_type": "icontains"}, ws)
    assert ci.passed and ci.evidence["matches"][0] == {"file": "requirements.txt", "line": 1, "text": "Flask==3.0"}


def test_p02_regex_is_multiline(ws: Path) -> None:
    result = run("P02", {"path": "src/app/main.py", "pattern": r"^class Project\b", "match_type": "regex"}, ws)
    assert result.passed and result.value == {"file": "src/app/main.py", "line": 3}
    assert run(
        "P02", {"path": "requirements.txt", "pattern": "(?i)(sqlalchemy|alembic)", "match_type": "regex"}, ws
    ).passed


def test_p02_invalid_regex_fails_the_step(ws: Path) -> None:
    result = run("P02", {"path": "README.md", "pattern": "(unclosed", "match_type": "regex"}, ws)
    assert not result.passed and "invalid regex" in result.message


def test_p02_walks_directories_skipping_node_modules(ws: Path) -> None:
    result = run("P02", {"path": "src/", "pattern": "export", "match_type": "contains"}, ws)
    assert result.passed
    assert result.evidence["matched"] == ["src/web/index.ts", "src/web/view.tsx"]
    hidden = run("P02", {"path": ".", "pattern": "emitDatabaseBatchEvent"}, ws)
    assert not hidden.passed  # only inside node_modules
    explicit = run("P02", {"path": "node_modules/lib/index.js", "pattern": "emitDatabaseBatchEvent"}, ws)
    assert explicit.passed  # naming the file is explicit


def test_p02_allowed_exts(ws: Path) -> None:
    assert not run("P02", {"path": "src", "pattern": "export", "allowed_exts": [".py"]}, ws).passed
    assert run("P02", {"path": "src", "pattern": "export", "allowed_exts": ["tsx"]}, ws).evidence["matched"] == [
        "src/web/view.tsx"
    ]


def test_p02_skips_binary_and_large_files_in_walks(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(ws, "assets/blob.bin", b"\x00\x01needle\x00")
    write(ws, "assets/big.txt", "x" * 100 + "needle")
    monkeypatch.setattr(files, "MAX_FILE_BYTES", 50)
    result = run("P02", {"path": "assets", "pattern": "needle"}, ws)
    assert not result.passed
    assert result.evidence["skipped"] == {"larger_than_limit": 1, "binary": 1}
    # an explicitly named binary file is searched anyway
    assert run("P02", {"path": "assets/blob.bin", "pattern": "needle"}, ws).passed


def test_p02_path_any_of_and_missing_paths(ws: Path) -> None:
    result = run("P02", {"path": "Gemfile", "path_any_of": ["requirements.txt"], "pattern": "SQLAlchemy"}, ws)
    assert result.passed and result.evidence["matched"] == ["requirements.txt"]
    missing = run("P02", {"path": "Gemfile", "pattern": "rails"}, ws)
    assert not missing.passed and "Gemfile not found" in missing.message


def test_p02_refuses_escapes(ws: Path) -> None:
    write(ws.parent, "outside.txt", "secret")
    result = run("P02", {"path": "../outside.txt", "pattern": "secret"}, ws)
    assert not result.passed and "escapes the workspace" in result.message


def test_p02_walk_cap_is_reported(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for i in range(10):
        write(ws, f"many/f{i:02}.txt", "nothing here")
    monkeypatch.setattr(files, "MAX_FILES_WALKED", 4)
    result = run("P02", {"path": "many", "pattern": "needle"}, ws)
    assert not result.passed
    assert "stopped after walking 4 files (cap)" in result.message
    assert result.evidence["files_walked"] == 4


def test_p02_evidence_lists_the_first_few_matches(ws: Path) -> None:
    for i in range(8):
        write(ws, f"hits/f{i}.txt", "hit\n")
    result = run("P02", {"path": "hits", "pattern": "hit"}, ws)
    assert result.passed and len(result.evidence["matched"]) == files.MAX_EVIDENCE_FILES


# --- P03 ---------------------------------------------------------------------------------------------
def test_p03_recursive_glob(ws: Path) -> None:
    result = run("P03", {"glob": "**/*.py", "min_expected": 2}, ws)
    assert result.passed and result.value == 2
    assert run("P03", {"glob": "*.py"}, ws).value == 0  # '*' stays in one directory
    assert run("P03", {"glob": "*.md"}, ws).passed


def test_p03_conformance_shape(ws: Path) -> None:
    result = run("P03", {"glob": "**/migrations/**/*.sql", "min_expected": 1}, ws)
    assert result.passed and result.value == 2
    assert result.evidence["matched"] == ["db/migrations/002_more.sql", "db/migrations/2024/001_init.sql"]


def test_p03_braces(ws: Path) -> None:
    result = run("P03", {"glob": "src/**/*.{ts,tsx}", "min_expected": 2}, ws)
    assert result.passed and result.value == 2
    assert run("P03", {"glob": "src/{app,web}/*", "min_expected": 4}, ws).passed
    assert files.expand_braces("a/{b,c{d,e}}.{x,y}") == ["a/b.x", "a/b.y", "a/cd.x", "a/cd.y", "a/ce.x", "a/ce.y"]
    assert files.expand_braces("literal{x}") == ["literal{x}"]


def test_p03_min_expected_not_reached(ws: Path) -> None:
    result = run("P03", {"glob": "**/*.py", "min_expected": 5}, ws)
    assert not result.passed and "2 file(s) match" in result.message and ">= 5" in result.message


def test_p03_base_dir_and_any_of(ws: Path) -> None:
    assert run("P03", {"glob": "*.py", "base_dir": "src/app", "min_expected": 2}, ws).passed
    result = run("P03", {"glob": "**/*.ts", "base_dir_any_of": ["frontend", "src/web"]}, ws)
    assert result.passed
    assert [b["base_dir"] for b in result.evidence["bases"]] == ["frontend", "src/web"]
    missing = run("P03", {"glob": "*", "base_dir": "nope"}, ws)
    assert not missing.passed and "base_dir nope not found" in missing.message


def test_p03_skips_node_modules_unless_named(ws: Path) -> None:
    assert run("P03", {"glob": "**/*.js"}, ws).value == 0
    assert run("P03", {"glob": "node_modules/**/*.js"}, ws).value == 1


def test_p03_counts_files_only(ws: Path) -> None:
    assert run("P03", {"glob": "src/*"}, ws).value == 0  # src holds only directories


@pytest.mark.parametrize(
    "inputs,needle",
    [
        ({"glob": "../*"}, "escapes the workspace"),
        ({"glob": "/etc/*"}, "absolute"),
        ({"glob": "*", "base_dir": "/etc"}, "absolute"),
        ({"glob": "../../*", "base_dir": "src"}, "escapes the workspace"),
        ({"glob": "{a,../b}/*"}, "escapes the workspace"),
    ],
)
def test_p03_refuses_escapes(ws: Path, inputs: dict[str, Any], needle: str) -> None:
    result = run("P03", inputs, ws)
    assert not result.passed and needle in result.message


def test_p03_cap_is_reported(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(files, "MAX_FILES_WALKED", 3)
    result = run("P03", {"glob": "**/*", "min_expected": 100}, ws)
    assert not result.passed and "stopped after walking 3 files (cap)" in result.message


def test_glob_translation() -> None:
    rx = files.glob_to_regex
    assert rx("**/*.py").fullmatch("a/b/c.py") and rx("**/*.py").fullmatch("c.py")
    assert not rx("*.py").fullmatch("a/c.py")
    assert rx("file?.txt").fullmatch("file1.txt") and not rx("file?.txt").fullmatch("file10.txt")
    assert rx("[!a]*.txt").fullmatch("b.txt") and not rx("[!a]*.txt").fullmatch("a.txt")
    assert rx("a/**").fullmatch("a/b/c")
    assert rx("a.b").fullmatch("a.b") and not rx("a.b").fullmatch("axb")


# --- dialects through the loader -------------------------------------------------------------------
def _node(steps: list[dict[str, Any]]) -> dict[str, Any]:
    return {"id": "N", "steps": steps, "scoring": {"category": "Deployment", "method": "binary", "maxScore": 1}}


def test_legacy_inputs_are_normalised_and_listed() -> None:
    result = load_dag_data(
        {
            "nodes": [
                _node(
                    [
                        {"type": "P01", "inputs": {"path": ["a", "b"], "type": "directory"}},
                        {"type": "P02", "inputs": {"path": "src/", "regex": "x+", "alt_paths": ["lib/"]}},
                        {"type": "P02", "inputs": {"path": "a", "pattern": "x", "case_sensitive": False}},
                        {"type": "P03", "inputs": {"pattern": "**/*.sql", "min_count": 2, "base_dir": ["db", "sql"]}},
                    ]
                )
            ]
        }
    )
    messages = [i.message for i in result.normalisations]
    assert any("P01: 'path' given as a list" in m for m in messages)
    assert any("type 'directory' -> 'dir'" in m for m in messages)
    assert any("'regex' -> 'pattern'" in m for m in messages)
    assert any("'alt_paths' -> 'path_any_of'" in m for m in messages)
    assert any("case-insensitive flag" in m for m in messages)
    assert any("'pattern' -> 'glob'" in m for m in messages)
    assert any("'min_count' -> 'min_expected'" in m for m in messages)
    assert any("'base_dir' given as a list" in m for m in messages)
    assert not result.warnings

    spec = REGISTRY.spec("P03")
    model = spec.inputs.model_validate({"pattern": "**/*.sql", "min_count": 2, "base_dir": ["db", "sql"]})
    assert (model.glob, model.min_expected, model.base_dir, model.base_dir_any_of) == (
        "**/*.sql",
        2,
        None,
        ["db", "sql"],
    )
    p02 = REGISTRY.spec("P02").inputs.model_validate({"path": "a", "pattern": "x", "case_sensitive": False})
    assert p02.match_type == "icontains"


def test_bad_inputs_are_load_errors() -> None:
    from saasbench.dag import DagLoadError

    with pytest.raises(DagLoadError) as err:
        load_dag_data(
            {"nodes": [_node([{"type": "P02", "inputs": {"path": "a", "pattern": "x", "match_type": "fuzzy"}}])]}
        )
    assert any("match_type" in (i.field or "") for i in err.value.issues)
    with pytest.raises(DagLoadError):
        load_dag_data({"nodes": [_node([{"type": "P01", "inputs": {"type": "file"}}])]})


def test_unknown_input_keys_are_warnings() -> None:
    result = load_dag_data({"nodes": [_node([{"type": "P01", "inputs": {"path": "a", "mode": "strict"}}])]})
    assert any("'mode' not understood" in w.message for w in result.warnings)


def test_placeholders_in_paths_resolve_through_the_engine(ws: Path) -> None:
    from saasbench.evaluation.engine import Engine

    dag = load_dag_data(
        {
            "nodes": [
                _node(
                    [
                        {"type": "P01", "inputs": {"path": "{{readme}}"}},
                        {"type": "P03", "inputs": {"glob": "${SRC_DIR:-src}/**/*.py", "min_expected": 2}},
                    ]
                )
            ]
        }
    ).dag
    ctx = RunContext(Target(workspace=ws), variables={"readme": "README.md"})
    report = Engine(dag, ctx).run()
    assert report.nodes[0].status.value == "PASSED", report.nodes[0].message
