"""SQL over the lake with DuckDB: one view per table over committed files only.

:func:`connect` reads the commit markers, builds each table's file list from them and creates a
temporary view per table in a fresh in-memory DuckDB connection::

    CREATE VIEW trials AS
      SELECT * FROM (<typed empty relation of the current schema>)
      UNION ALL BY NAME
      SELECT * FROM read_parquet([<committed files>], hive_partitioning=true, union_by_name=true)

so every view has every current column with its type, even over no files or files written before
a column was added. A ``commits`` view lists the markers (unit, ids, generation, written_at, rows).

Only file paths built from validated ids and the lake root ever enter SQL text (quoted); values
from apps stay inside Parquet files, and user values for a query are passed as parameters.
"""

from __future__ import annotations

import csv
import io
import json
import os
import sys
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Literal, TextIO

import duckdb
import pyarrow as pa

from saasbench.lake import schema as S
from saasbench.lake.store import Store, lake_from_uri
from saasbench.lake.writer import list_commits


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def empty_select(table: str) -> str:
    """A SELECT with the table's columns and types and no rows."""
    cols = ", ".join(f"CAST(NULL AS {S.duckdb_type(f.type)}) AS {_ident(f.name)}" for f in S.table(table).schema)
    return f"SELECT {cols} WHERE false"


def committed_files(lake: Store | str, *, sweep_id: str | None = None) -> tuple[dict[str, list[str]], list[dict[str, Any]]]:
    """({table: [keys]}, markers) of everything committed (optionally one sweep + validations)."""
    markers = list_commits(lake, sweep_id=sweep_id)
    files: dict[str, list[str]] = {name: [] for name in S.TABLES}
    for m in markers:
        for f in m["files"]:
            if f.get("table") in files:
                files[f["table"]].append(f["key"])
    return {k: sorted(set(v)) for k, v in files.items()}, markers


def connect(lake: Store | str | None = None, *, sweep_id: str | None = None,
            con: duckdb.DuckDBPyConnection | None = None) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection with a view per lake table (and ``commits``) over committed files.

    ``lake``: path, ``file:///...``, ``s3://bucket/prefix`` or a Store (None: ``$SAASBENCH_LAKE``
    or ``runs/lake``). ``sweep_id`` limits the views to one sweep (plus reference validations),
    reading only that sweep's markers. The views are a snapshot: reconnect to see newer commits.
    """
    store = lake_from_uri(lake)
    files, markers = committed_files(store, sweep_id=sweep_id)
    con = con or duckdb.connect(config={"autoinstall_known_extensions": "false"})
    if any(files.values()):
        store.configure_duckdb(con)
    for name in S.TABLES:
        empty = empty_select(name)
        if files[name]:
            paths = "[" + ", ".join(_quote(store.url(k)) for k in files[name]) + "]"
            sql = (f"CREATE OR REPLACE TEMPORARY VIEW {_ident(name)} AS SELECT * FROM ({empty}) "
                   f"UNION ALL BY NAME SELECT * FROM read_parquet({paths}, hive_partitioning=true, union_by_name=true)")
        else:
            sql = f"CREATE OR REPLACE TEMPORARY VIEW {_ident(name)} AS {empty}"
        con.execute(sql)
    _commits_view(con, markers)
    return con


def _commits_view(con: duckdb.DuckDBPyConnection, markers: list[dict[str, Any]]) -> None:
    rows = [{"unit": m.get("unit"), "sweep_id": m.get("sweep_id"), "trial_id": m.get("trial_id"),
             "task_id": m.get("task_id"), "run_id": m.get("run_id"), "generation": m.get("generation"),
             "written_at": m.get("written_at"), "marker": m.get("marker"),
             "files": len(m["files"]), "rows": sum(int(f.get("rows", 0)) for f in m["files"])} for m in markers]
    sch = pa.schema([("unit", pa.string()), ("sweep_id", pa.string()), ("trial_id", pa.string()),
                     ("task_id", pa.string()), ("run_id", pa.string()), ("generation", pa.string()),
                     ("written_at", pa.string()), ("marker", pa.string()), ("files", pa.int64()), ("rows", pa.int64())])
    tbl = pa.Table.from_pylist(rows, schema=sch)
    con.register("_saasbench_commits_arrow", tbl)
    con.execute("CREATE OR REPLACE TEMPORARY VIEW commits AS SELECT unit, sweep_id, trial_id, task_id, run_id, generation, "
                "CAST(written_at AS TIMESTAMP WITH TIME ZONE) AS written_at, marker, files, rows FROM _saasbench_commits_arrow")


def _arrow(result: Any) -> pa.Table:
    out = result.arrow()
    return out.read_all() if isinstance(out, pa.RecordBatchReader) else out


def query(lake: Store | str | None, sql: str, params: Sequence[Any] | dict[str, Any] | None = None, *,
          sweep_id: str | None = None) -> pa.Table:
    """Run ``sql`` over the lake's views; ``params`` bind ``?`` / ``$name`` placeholders."""
    con = connect(lake, sweep_id=sweep_id)
    try:
        return _arrow(con.execute(sql, params) if params is not None else con.execute(sql))
    finally:
        con.close()


Format = Literal["table", "csv", "json"]


def _jsonable(v: Any) -> Any:
    if isinstance(v, datetime):
        return v.isoformat()
    if isinstance(v, (bytes, bytearray)):
        return v.hex()
    return v


def format_table(tbl: pa.Table, fmt: Format = "table", out: TextIO | None = None, *, max_width: int = 80) -> None:
    out = out or sys.stdout
    rows = tbl.to_pylist()
    if fmt == "json":
        json.dump([{k: _jsonable(v) for k, v in r.items()} for r in rows], out, default=str, ensure_ascii=False, indent=1)
        out.write("\n")
    elif fmt == "csv":
        w = csv.writer(out, lineterminator="\n")
        w.writerow(tbl.column_names)
        for r in rows:
            w.writerow(["" if v is None else (json.dumps(v, default=str) if isinstance(v, (list, dict)) else _jsonable(v))
                        for v in r.values()])
    elif fmt == "table":
        from rich.console import Console
        from rich.table import Table
        from rich.text import Text

        t = Table(show_lines=False)
        for c in tbl.column_names:
            t.add_column(c, overflow="fold")
        for r in rows:
            cells = []
            for v in r.values():
                s = "NULL" if v is None else str(_jsonable(v))
                cells.append(Text(s if len(s) <= max_width else s[:max_width - 1] + "…"))  # Text: never markup
            t.add_row(*cells)
        console = Console(file=out, width=max(120, len(tbl.column_names) * 12)) if out is not sys.stdout else Console()
        console.print(t)
        console.print(f"{tbl.num_rows} row(s)", style="dim")
    else:
        raise ValueError(f"unknown format {fmt!r} (table, csv, json)")


def query_cmd(sql: str, lake: str | None = None, format: Format = "table", *, sweep_id: str | None = None,
              out: TextIO | None = None) -> int:
    """The ``saasbench query "SQL"`` command: run SQL over the lake and print the result.

    ``lake`` defaults to ``$SAASBENCH_LAKE`` or ``runs/lake``. Returns the exit code (0 ok, 1 on a
    SQL or store error, printed to stderr).
    Example: ``saasbench query "SELECT agent, avg(task_score) FROM trials GROUP BY 1"``
    """
    lake = lake or os.environ.get("SAASBENCH_LAKE") or "runs/lake"
    try:
        tbl = query(lake, sql, sweep_id=sweep_id)
    except (duckdb.Error, ValueError, OSError) as exc:
        print(f"query failed: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # noqa: BLE001 - a CLI prints every failure as one line (LakeStoreError, boto, ...)
        print(f"query failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    format_table(tbl, format, out)
    return 0


def describe() -> str:
    """The lake's tables and columns as text (for ``--help`` and docs)."""
    buf = io.StringIO()
    for name, t in S.TABLES.items():
        buf.write(f"{name} (partitioned by {', '.join(t.partition_by)}): {t.doc}\n")
        for f in t.schema:
            doc = (f.metadata or {}).get(b"doc", b"").decode()
            buf.write(f"  {f.name:26} {S.duckdb_type(f.type):26} {doc}\n")
    return buf.getvalue()
