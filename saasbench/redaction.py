"""The one text redaction: secrets (API keys, tokens) never reach the lake, logs or trajectories.

Every place that records text an LLM call, a CLI agent or an error produced passes the secrets it
knows through :func:`redact_text`. Config mappings are redacted by key with
:func:`saasbench.lake.records.redact` (secret-looking keys), a different job.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

MARKER = "[REDACTED]"
MIN_SECRET_LEN = 4  # shorter values are too likely to occur by chance; placeholder keys are never secrets
NOT_SECRETS = frozenset({"no-key", "sk-none", "none"})


def redact_text(text: str, secrets: Any) -> str:
    """``text`` with every occurrence of each secret (a string, or an iterable of them) replaced by
    :data:`MARKER`. Longer secrets first, so one that contains another is masked whole."""
    values: Iterable[Any] = [secrets] if isinstance(secrets, str) or secrets is None else secrets
    usable = sorted(
        {s for s in values if isinstance(s, str) and len(s) >= MIN_SECRET_LEN and s not in NOT_SECRETS},
        key=len,
        reverse=True,
    )
    for secret in usable:
        text = text.replace(secret, MARKER)
    return text
