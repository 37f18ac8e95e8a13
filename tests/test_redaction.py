"""The one text redaction (saasbench/redaction.py) used by the judge, the builtin agent and the CLI agents."""

from __future__ import annotations

from saasbench.redaction import MARKER, redact_text


def test_every_secret_is_masked_longest_first() -> None:
    text = "key sk-abcdef and its prefix sk-abc and again sk-abcdef"
    out = redact_text(text, ["sk-abc", "sk-abcdef"])
    assert "sk-abc" not in out and out.count(MARKER) == 3
    assert redact_text("token=abcd", "abcd") == f"token={MARKER}"


def test_short_and_placeholder_values_are_not_secrets() -> None:
    assert redact_text("a no-key b", ["no-key", "ab", None, ""]) == "a no-key b"
    assert redact_text("nothing", None) == "nothing"
