"""One glob for the whole project (P03 file counts and P17 judge evidence): its semantics, pinned.

Before, P17 used its own glob where ``src/**.ts`` spanned directories and ``[]]x`` raised re.error
(the node became ERROR); P03 used this one. No real DAG uses ``**`` inside a segment (checked on the
28 full public DAGs), so unifying on the pathlib/.gitignore reading changes no real score.
"""

from __future__ import annotations

from pathlib import Path

from saasbench.services.judge import code_evidence
from saasbench.services.workspace import Workspace, glob_to_regex


def test_double_star_spans_directories_only_as_a_whole_segment() -> None:
    assert glob_to_regex("src/**/*.ts").fullmatch("src/a/b.ts")
    assert glob_to_regex("src/**/*.ts").fullmatch("src/b.ts")
    assert glob_to_regex("src/**.ts").fullmatch("src/b.ts")
    assert not glob_to_regex("src/**.ts").fullmatch("src/a/b.ts")
    assert glob_to_regex("**").fullmatch("a/b/c")
    assert not glob_to_regex("*.py").fullmatch("a/b.py")


def test_brackets_are_members_not_errors() -> None:
    rx = glob_to_regex("[]]x")
    assert rx.fullmatch("]x") and not rx.fullmatch("ax")
    assert glob_to_regex("[!a]b").fullmatch("cb") and not glob_to_regex("[!a]b").fullmatch("ab")
    assert glob_to_regex("a[").fullmatch("a[")  # an unclosed bracket is literal


def test_the_judge_samples_with_the_same_glob(tmp_path: Path) -> None:
    (tmp_path / "src" / "a").mkdir(parents=True)
    (tmp_path / "src" / "top.ts").write_text("export const top = 1;\n")
    (tmp_path / "src" / "a" / "deep.ts").write_text("export const deep = 2;\n")
    (tmp_path / "]x").write_text("odd name\n")
    ws = Workspace(tmp_path)
    shallow = code_evidence(ws, ["src/**.ts"], "rubric")
    assert (
        "### src/top.ts" in shallow.text and "### src/a/deep.ts" not in shallow.text
    )  # sampled files, not the listing
    deep = code_evidence(ws, ["src/**/*.ts"], "rubric")
    assert "### src/top.ts" in deep.text and "### src/a/deep.ts" in deep.text
    assert "odd name" in code_evidence(ws, ["[]]x"], "rubric").text  # compiled, not an ERROR
