"""Every ``SAASBENCH_*`` setting an operator can give, its default, and the one place that reads it.

Import-light on purpose (``os`` and ``pathlib`` only): the CLI reads defaults from here without
loading the lake, Docker or Prefect. Values are read when asked for, not at import, so a test or
a worker that sets a variable later is seen.

Variables that are a contract with code inside a trial (what the builtin agent reads, such as
``SAASBENCH_AGENT_MODEL``, and the gateway hook's own variables) are owned by those modules and
listed in :data:`CONTRACT_VARIABLES` only for reference.
"""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_LAKE = "runs/lake"

SETTINGS: dict[str, str] = {
    "SAASBENCH_LAKE": f"results lake URI: a folder, file:///..., or s3://bucket/prefix (default {DEFAULT_LAKE})",
    "SAASBENCH_S3_ENDPOINT": "S3 endpoint URL of an s3:// lake (default $AWS_ENDPOINT_URL_S3, $AWS_ENDPOINT_URL, else AWS)",
    "SAASBENCH_TASKS_DIR": "task catalogue folder (default: the repository's tasks/)",
    "SAASBENCH_CACHE_DIR": "cache root: image cache, base-image tarballs (default $XDG_CACHE_HOME/saasbench or ~/.cache/saasbench)",
    "SAASBENCH_IMAGE_MAP": "the user's image map file (default ~/.config/saasbench/image-map.yaml)",
    "SAASBENCH_ENVS_PER_HOST": "environments at once per host, when a sweep spec leaves it unset",
    "SAASBENCH_LLM_CALLS_PER_PROVIDER": "LLM calls at once per provider: 8, or openai=8,anthropic=4,*=2",
    "SAASBENCH_LIMITS": "'local': process-local semaphores even inside Prefect runs",
    "SAASBENCH_HOST_NAME": "the <host> part of the saasbench-env-<host> concurrency limit (default: the host name)",
    "SAASBENCH_MAX_WORKERS": "threads of a sweep flow's local task runner (default 16)",
    "SAASBENCH_CHROMIUM": "the Chromium executable for the browser primitives (default /usr/bin/chromium)",
    "SAASBENCH_RECEIVER_BIND_HOST": "address the webhook/SMTP receivers bind (default 127.0.0.1)",
    "SAASBENCH_RECEIVER_ADVERTISE_HOST": "address the app is told to reach the receivers at",
    "SAASBENCH_GATEWAY_LOG_LEVEL": "the model gateway's LiteLLM log level (default ERROR)",
    "SAASBENCH_LOCAL_SANDBOX": "local backend sandbox (bubblewrap): auto (default; untrusted agents refused without it), on, off (trust every agent)",
    "SAASBENCH_RUNTIME_DIR": "where live local environments keep their ledgers for `env prune` (default $XDG_RUNTIME_DIR/saasbench or <temp>/saasbench-<uid>)",
}

CONTRACT_VARIABLES = (
    "SAASBENCH_AGENT_MODEL",
    "SAASBENCH_AGENT_API_BASE",
    "SAASBENCH_AGENT_API_KEY_ENV",
    "SAASBENCH_AGENT_API_KEY",
    "SAASBENCH_AGENT_BASE_URL",
    "SAASBENCH_AGENT_MAX_TOKENS",
    "SAASBENCH_AGENT_BACKOFF_BASE_S",
    "SAASBENCH_AGENT_BACKOFF_CAP_S",
    "SAASBENCH_GATEWAY_KEY",
    "SAASBENCH_GATEWAY_CALLS",
    "SAASBENCH_GATEWAY_SECRET",
    "SAASBENCH_GATEWAY_MASTER_KEY",
    "SAASBENCH_GATEWAY_BACKOFF_MIN_S",
    "SAASBENCH_GATEWAY_BACKOFF_MAX_S",
    "SAASBENCH_GATEWAY_NUM_RETRIES",
    "SAASBENCH_EXEC",
    "SAASBENCH_WORKSPACE",
    "SAASBENCH_SERVICE",
    "SAASBENCH_OWNER",
    "SAASBENCH_ENV_ID",
)


class SettingError(ValueError):
    """A setting is present but unusable (e.g. set to an empty string); the message names the variable."""


# Settings a worker must give a real value when it gives one at all: an empty string here is almost
# always a deployment template or a compose file that substituted an unset variable, and silently
# falling back (to runs/lake, or to AWS instead of the store) would write results somewhere else.
NONEMPTY = ("SAASBENCH_LAKE", "SAASBENCH_S3_ENDPOINT", "SAASBENCH_HOST_NAME")


def get(name: str, default: str | None = None) -> str | None:
    """The value of a declared setting ("" counts as unset, except for :data:`NONEMPTY` settings,
    where it is a :class:`SettingError`)."""
    if name not in SETTINGS:
        raise KeyError(f"{name} is not a declared setting (saasbench.settings.SETTINGS)")
    value = os.environ.get(name)
    if value is not None and not value.strip() and name in NONEMPTY:
        raise SettingError(
            f"{name} is set but empty: unset it or give it a value; for Prefect runs set it in the "
            "worker's environment, not in a deployment (infra/README.md, Worker configuration)"
        )
    return value or default


def lake_uri(explicit: str | None = None) -> str:
    """``explicit``, else ``$SAASBENCH_LAKE``, else ``runs/lake``; read when called (on a Prefect worker:
    the worker's environment at run time). An empty ``$SAASBENCH_LAKE`` is a :class:`SettingError`."""
    return explicit or get("SAASBENCH_LAKE") or DEFAULT_LAKE


def s3_endpoint() -> str | None:
    """``$SAASBENCH_S3_ENDPOINT``, else ``$AWS_ENDPOINT_URL_S3``, else ``$AWS_ENDPOINT_URL``, else None (AWS).
    An empty ``$SAASBENCH_S3_ENDPOINT`` is a :class:`SettingError`."""
    return get("SAASBENCH_S3_ENDPOINT") or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")


def tasks_dir() -> Path:
    """``$SAASBENCH_TASKS_DIR``, else the repository's ``tasks/`` folder."""
    value = get("SAASBENCH_TASKS_DIR")
    return Path(value) if value else Path(__file__).resolve().parents[1] / "tasks"


def cache_dir() -> Path:
    """``$SAASBENCH_CACHE_DIR``, else ``$XDG_CACHE_HOME/saasbench``, else ``~/.cache/saasbench``."""
    value = get("SAASBENCH_CACHE_DIR")
    if value:
        return Path(value)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "saasbench"


def image_map_path() -> Path:
    value = get("SAASBENCH_IMAGE_MAP")
    return Path(value) if value else Path.home() / ".config" / "saasbench" / "image-map.yaml"
