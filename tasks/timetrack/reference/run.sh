#!/usr/bin/env bash
# Start the TimeTrack reference service.
#   PORT           port to listen on (default 8080)
#   DATABASE_PATH  SQLite database file (default ./data/timetrack.db); created with the schema at start
set -euo pipefail
cd "$(dirname "$0")"
export PORT="${PORT:-8080}"
export DATABASE_PATH="${DATABASE_PATH:-./data/timetrack.db}"
exec python3 app.py
