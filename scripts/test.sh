#!/usr/bin/env bash
# Run the saasbench test suite from a fresh clone: creates .venv if missing, installs the
# package with its test extras, isolates Prefect/litellm state, then runs pytest.
#
#   bash scripts/test.sh                      # whole suite
#   bash scripts/test.sh tests/test_cli.py -k evaluate
#
# Environment: PYTHON (interpreter used to create .venv, default python3; needs >= 3.11).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON="${PYTHON:-python3}"
VENV=.venv

# System packages the tests start for real: PostgreSQL and MariaDB servers (database
# primitives; the tests run initdb/mariadbd themselves on 127.0.0.1), a Docker engine (the
# tests start their own dockerd; images come from `docker import` of busybox and of a
# debootstrap Debian root, since registries are unreachable), Debian's docker-compose (1.29, to
# validate infra/compose.yaml with `docker-compose config`), bubblewrap (the local backend's
# sandbox, tests/test_local_isolation.py). Installed only when
# missing, so a warm machine pays nothing.
APT_PACKAGES=(postgresql mariadb-server patch docker.io docker-compose busybox-static debootstrap chromium git bubblewrap)
install_system_deps() {
    local missing=()
    for pkg in "${APT_PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    if [ "$(id -u)" != 0 ] && ! command -v sudo >/dev/null 2>&1; then
        echo "error: missing system packages: ${missing[*]} (install them as root)" >&2
        exit 2
    fi
    local SUDO=""; [ "$(id -u)" != 0 ] && SUDO=sudo
    echo "installing system packages: ${missing[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# Services the tests need while they run (and their cleanup in stop_services). None yet.
start_services() {
    :
}

stop_services() {
    :
}

ensure_venv() {
    if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c 'import sys' >/dev/null 2>&1; then
        if ! command -v "$PYTHON" >/dev/null 2>&1; then
            echo "error: $PYTHON not found; install Python >= 3.11 or set PYTHON=/path/to/python3" >&2
            exit 2
        fi
        if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
            echo "error: $PYTHON is $("$PYTHON" -V 2>&1); saasbench needs Python >= 3.11 (set PYTHON=...)" >&2
            exit 2
        fi
        echo "creating $VENV with $("$PYTHON" -V 2>&1)"
        rm -rf "$VENV"
        if ! "$PYTHON" -m venv "$VENV"; then
            echo "error: '$PYTHON -m venv' failed; on Debian/Ubuntu install the venv module: apt-get install python3-venv" >&2
            exit 2
        fi
    fi
    # Reinstall only when the project metadata changed (the install is editable: code changes need none).
    local stamp="$VENV/.saasbench-test-install" want
    want="$("$VENV/bin/python" -c 'import hashlib, sys; print(hashlib.sha256(open("pyproject.toml", "rb").read()).hexdigest())')"
    if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
        echo "installing saasbench[test] into $VENV"
        "$VENV/bin/python" -m pip install --disable-pip-version-check -q -e '.[test]'
        echo "$want" >"$stamp"
    fi
}

# The real agent CLIs, run by the adapter tests against local fake model servers. Installed
# from the npm registry and PyPI into a cache outside the repository, once per machine.
AGENT_CLI_DIR="${SAASBENCH_AGENT_CLI_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/saasbench/agent-clis}"
install_agent_clis() {
    mkdir -p "$AGENT_CLI_DIR"
    if [ ! -x "$AGENT_CLI_DIR/claude/bin/claude" ]; then
        echo "installing Claude Code CLI into $AGENT_CLI_DIR/claude"
        npm install -g --silent --prefix "$AGENT_CLI_DIR/claude" @anthropic-ai/claude-code@2.1.197 >/dev/null
    fi
    if [ ! -x "$AGENT_CLI_DIR/codex/bin/codex" ]; then
        echo "installing Codex CLI into $AGENT_CLI_DIR/codex"
        npm install -g --silent --prefix "$AGENT_CLI_DIR/codex" @openai/codex@0.171.0 >/dev/null
    fi
    if [ ! -x "$AGENT_CLI_DIR/openhands/bin/openhands" ]; then
        local py312=""
        for candidate in python3.12 "$HOME"/.pyenv/versions/3.12*/bin/python3.12 /usr/bin/python3.12; do
            if "$candidate" -V >/dev/null 2>&1; then py312="$candidate"; break; fi
        done
        if [ -z "$py312" ]; then
            echo "error: python3.12 is needed for the OpenHands CLI (openhands 1.16 requires Python >= 3.12)" >&2
            exit 2
        fi
        echo "installing OpenHands CLI into $AGENT_CLI_DIR/openhands"
        rm -rf "$AGENT_CLI_DIR/openhands"
        "$py312" -m venv "$AGENT_CLI_DIR/openhands"
        "$AGENT_CLI_DIR/openhands/bin/pip" install -q --disable-pip-version-check openhands==1.16.0
    fi
    export SAASBENCH_CLAUDE_BIN="$AGENT_CLI_DIR/claude/bin/claude"
    export SAASBENCH_CODEX_BIN="$AGENT_CLI_DIR/codex/bin/codex"
    export SAASBENCH_OPENHANDS_BIN="$AGENT_CLI_DIR/openhands/bin/openhands"
}

# `bash scripts/test.sh -m unit`: tests that need no system service (tests/conftest.py sets the markers)
UNIT_ONLY=0
if [ "${1:-}" = "-m" ] && [ "${2:-}" = "unit" ]; then UNIT_ONLY=1; fi
if [ "$UNIT_ONLY" = 0 ]; then install_system_deps; fi
ensure_venv
if [ "$UNIT_ONLY" = 0 ]; then install_agent_clis; fi

PREFECT_HOME="$(mktemp -d "${TMPDIR:-/tmp}/saasbench-prefect.XXXXXX")"
export PREFECT_HOME
export PREFECT_SERVER_ANALYTICS_ENABLED=false
export LITELLM_LOCAL_MODEL_COST_MAP=True

cleanup() {
    stop_services
    rm -rf "$PREFECT_HOME"
}
trap cleanup EXIT

start_services

# Lint first: cheap, and a broken import order or a blind except is a review finding, not a test result.
"$VENV/bin/ruff" check --quiet . || { echo "ruff check failed (run: $VENV/bin/ruff check --fix .)" >&2; exit 1; }
"$VENV/bin/ruff" format --check --quiet . || { echo "ruff format check failed (run: $VENV/bin/ruff format .)" >&2; exit 1; }
"$VENV/bin/mypy" --no-error-summary || { echo "mypy failed ([tool.mypy] files in pyproject.toml)" >&2; exit 1; }

status=0
"$VENV/bin/python" -m pytest -q "$@" || status=$?
exit "$status"
