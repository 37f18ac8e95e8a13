"""Shared test fixtures and markers.

Fixtures for real services live in their own modules and are made available to every test here:
``dockerd`` (a Docker engine and the imported images), ``pgserver`` (PostgreSQL, MariaDB, the
MongoDB wire emulator) and ``s3server`` (moto on 127.0.0.1).

Markers (declared in pyproject.toml, ``--strict-markers``) are set here, from what a test needs,
so no test file has to remember them:

- ``docker``, ``db``, ``s3``: the test uses one of those fixtures;
- ``prefect``, ``browser``, ``agent_cli``, ``slow``: the module starts a Prefect server, drives
  Chromium, runs a real agent CLI, or runs whole trials and sweeps (``MODULE_MARKS``), or one test
  of a module does (``TEST_MARKS``); a fixture parametrised over a service marks the items that use
  it (``PARAM_MARKS``: the S3 lake);
- ``unit``: none of the above: runs in seconds without system services
  (``bash scripts/test.sh -m unit``). Under ``-m unit`` the modules of ``MODULE_MARKS`` are not
  even imported: none of their tests is a unit test, and importing them (Prefect's server,
  Playwright, ...) costs seconds.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from dockerd import busybox_image, docker_client, postgres_image, python_image  # noqa: F401 - shared fixtures
from pgserver import mariadb_server, mongo_server, postgres_server  # noqa: F401 - shared fixtures
from s3server import s3_server  # noqa: F401 - shared fixture

# CLI output must not depend on the terminal the suite runs in or on the length of a temporary path: every
# rich console (the commands' and typer's help) is this wide, whatever the terminal (rich reads COLUMNS when a
# console is made; without it a console on a terminal takes the terminal's width, elsewhere 80 columns).
# Error lines are never wrapped anyway (saasbench.cli.common.fail).
os.environ["COLUMNS"] = "500"
os.environ.pop("LINES", None)

FIXTURE_MARKS = {
    "docker_client": "docker",
    "busybox_image": "docker",
    "python_image": "docker",
    "postgres_image": "docker",
    "postgres_server": "db",
    "mariadb_server": "db",
    "mongo_server": "db",
    "s3_server": "s3",
}
MODULE_MARKS = {
    "test_flows": ("prefect",),
    "test_limits": ("prefect",),
    "test_run_lake": ("prefect",),
    "test_prefect_server": ("prefect",),
    "test_auth_html_csrf": ("browser",),
    "test_browser_dialects": ("browser",),
    "test_primitives_browser": ("browser",),
    "test_report_html": ("browser",),
    "test_agent_adapters": ("agent_cli",),
    "test_gateway": ("agent_cli",),
    # whole trials, sweeps, reference runs or receivers that wait out negative timeouts (measured: 5-70 s a module)
    "test_conformance_run": ("slow",),
    "test_sweep": ("slow",),
    "test_timetrack_task": ("slow",),
    "test_validate_reference": ("slow",),
    "test_agent_builtin": ("slow",),
    "test_rollout": ("slow",),
    "test_primitives_integrations": ("slow",),
    "test_stages": ("slow",),
    "test_rescore": ("slow",),
    "test_endstate": ("slow",),
    "test_model_outages": ("slow",),  # a LiteLLM gateway and whole trials with outages
    "test_local_isolation": ("slow",),  # whole trials in the sandbox, SIGKILLed harness subprocesses
    "test_base_install": ("slow", "prefect"),  # a fresh venv and `pip install -e .` (from pip's cache)
}
# single tests of otherwise quick modules (every parametrisation of the function)
TEST_MARKS = {
    # two whole trials of the demo task: the local backend starts the app, the browser nodes drive Chromium
    ("test_cli", "test_demo_runs_oracle_and_nop_on_the_demo_task"): ("slow", "browser", "prefect"),
    # the backend conformance check: ~20 real subprocesses, a real HTTP service, a 0.5 s timeout waited out
    ("test_environment_local", "test_local_backend_passes_self_check"): ("slow",),
    # a writer / compactor in a Python subprocess (a fresh import of the lake), killed with SIGKILL mid-way
    ("test_lake", "test_sigkill_mid_write_shows_old_or_new_never_partial"): ("slow",),
    ("test_lake_batch", "test_sigkill_during_compaction"): ("slow",),
    # the CLI in a subprocess starting the embedded Prefect server with a zero start timeout (~15 s)
    ("test_adversarial_inputs", "test_embedded_prefect_not_starting_names_the_setting_and_no_prefect"): ("prefect",),
}
# fixtures parametrised over a service: the parameter value that needs it
PARAM_MARKS = {("lake", "s3"): "s3"}
SERVICE_MARKS = {"docker", "db", "s3", "prefect", "browser", "agent_cli", "slow"}


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if config.getoption("markexpr", "").strip() == "unit" and collection_path.suffix == ".py":
        return collection_path.stem in MODULE_MARKS or None
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        module = item.module.__name__ if item.module else ""
        wanted = {FIXTURE_MARKS[f] for f in getattr(item, "fixturenames", ()) if f in FIXTURE_MARKS}
        wanted |= set(MODULE_MARKS.get(module, ()))
        wanted |= set(TEST_MARKS.get((module, getattr(item, "originalname", item.name)), ()))
        params = getattr(getattr(item, "callspec", None), "params", {})
        wanted |= {mark for (name, value), mark in PARAM_MARKS.items() if params.get(name) == value}
        wanted |= {m.name for m in item.iter_markers() if m.name in SERVICE_MARKS}
        for name in sorted(wanted):
            item.add_marker(name)
        if not wanted:
            item.add_marker("unit")
