"""Many units in a few large files: bulk writes and compaction.

Per-trial commits (``write_trial``) are right while a sweep runs: each finished trial becomes
visible at once and a crash loses nothing else. But a lake of 10,000 trials is then 20,000+
small Parquet files and 10,000 markers, and reading it is dominated by per-file overhead (on S3,
one or more HTTP requests per file). Two ways out, one format:

- :func:`write_batch` commits rows of many units (trials, sweep rows, validation runs) at once:
  per table, files of up to ``max_file_rows`` rows sorted by (sweep_id, task_id, trial_id), so
  DuckDB skips row groups of other sweeps and tasks by their min/max statistics; and one batch
  marker ``_commits/_batches/<batch_id>.json`` listing the files and the units they hold.
- :func:`compact` rewrites what is committed (the whole lake, or one sweep) as one batch, then
  deletes the markers and files it merged. Every step is safe to crash: see
  :mod:`saasbench.lake.snapshot` for how readers pick one source per unit.

A unit in a batch is replaced whole: the batch holds all of that unit's rows in every table.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from saasbench.lake import schema as S
from saasbench.lake.snapshot import (
    BATCHES,
    MARKER_FORMAT,
    UNIT_COLUMNS,
    UnitKey,
    read_marker_key,
    resolve,
    snapshot,
    unit_key,
)
from saasbench.lake.store import LakeStoreError, Store, lake_from_uri
from saasbench.lake.writer import (
    Commit,
    Hook,
    _now,
    _parquet_bytes,
    to_table,
    with_derived,
)

DEFAULT_FILE_ROWS = 2_000_000
_SORT_KEYS = ("sweep_id", "task_id", "trial_id", "run_id")


def batch_marker_key(batch_id: str) -> str:
    return f"{BATCHES}/{S.check_id(batch_id, 'batch_id')}.json"


def _written_marker(store: Store, key: str) -> dict[str, Any]:
    """The marker this process just committed (re-read so the snapshot sees what readers see)."""
    m = read_marker_key(store, key)
    if m is None:
        raise LakeStoreError(f"the batch marker {key} just written cannot be read back")
    return m


def _units_of(name: str, tbl: pa.Table) -> dict[UnitKey, dict[str, Any]]:
    """The distinct units whose rows ``tbl`` holds, as batch unit entries (without sources)."""
    kind = S.table(name).unit
    cols = list(UNIT_COLUMNS[kind]) + (["task_id"] if kind == "trial" else [])
    if not tbl.num_rows:
        return {}
    distinct = tbl.select(cols).group_by(cols).aggregate([]).to_pylist()
    out: dict[UnitKey, dict[str, Any]] = {}
    for row in distinct:
        key = (kind, *(row[c] for c in UNIT_COLUMNS[kind]))
        if key in out and out[key].get("task_id") != row.get("task_id"):
            raise ValueError(
                f"{name}: trial {key[2]!r} of sweep {key[1]!r} has rows of two tasks "
                f"({out[key]['task_id']!r}, {row['task_id']!r})"
            )
        for c in cols:
            S.check_id(row[c], c)
        out[key] = {"unit": kind, **row}
    return out


def _sorted(tbl: pa.Table) -> pa.Table:
    keys = [(c, "ascending") for c in _SORT_KEYS if c in tbl.column_names]
    return tbl.take(pc.sort_indices(tbl, sort_keys=keys)) if keys and tbl.num_rows > 1 else tbl


def write_batch(
    lake: Store | str,
    tables: Mapping[str, Any],
    *,
    max_file_rows: int = DEFAULT_FILE_ROWS,
    sources: Mapping[UnitKey, tuple[str, str]] | None = None,
    hook: Hook | None = None,
    workers: int = 4,
) -> Commit:
    """Commit rows of many units at once as one batch.

    ``tables``: table name -> rows (a pyarrow Table or dicts), any tables of :data:`schema.TABLES`.
    Every unit (trial, sweep, validation run) found in the rows is replaced whole by this batch.
    Idempotent: the same rows give the same batch id and keys. ``sources`` (used by
    :func:`compact`) gives, per unit, the generation and time of the content the rows came from.
    """
    store = lake_from_uri(lake)
    if max_file_rows < 1:
        raise ValueError("max_file_rows must be >= 1")
    unknown = set(tables) - set(S.TABLES)
    if unknown:
        raise ValueError(f"not lake tables: {sorted(unknown)}")
    built: dict[str, pa.Table] = {}
    units: dict[UnitKey, dict[str, Any]] = {}
    for name, rows in with_derived(tables).items():
        tbl = to_table(name, rows)
        if not tbl.num_rows:
            continue
        for key, entry in _units_of(name, tbl).items():
            if key in units and units[key].get("task_id") != entry.get("task_id"):
                raise ValueError(f"trial {key[2]!r} of sweep {key[1]!r} has rows of two tasks")
            units[key] = entry
        built[name] = _sorted(tbl)
    if not units:
        raise ValueError("write_batch: no rows to write")

    slices = [
        (name, i, tbl.slice(off, max_file_rows))
        for name, tbl in sorted(built.items())
        for i, off in enumerate(range(0, tbl.num_rows, max_file_rows))
    ]
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:  # pyarrow encodes without the GIL
        datas = list(pool.map(lambda s: _parquet_bytes(s[2]), slices))
    h = hashlib.sha256()
    for (name, i, _t), data in zip(slices, datas):
        h.update(f"{name}/{i}".encode() + b"\0" + hashlib.sha256(data).digest())
    gen = h.hexdigest()[:16]
    batch_id = f"b-{gen}"
    files = [
        {"table": name, "key": f"{name}/_batch/{batch_id}/part-{i:05d}.parquet", "rows": t.num_rows, "bytes": len(data)}
        for (name, i, t), data in zip(slices, datas)
    ]

    def put(item: tuple[dict[str, Any], bytes]) -> None:
        if hook:
            hook("before_file", item[0]["key"])
        store.put(item[0]["key"], item[1])

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        list(pool.map(put, zip(files, datas)))
    now = _now()
    entries = []
    for key, e in sorted(units.items()):
        src_gen, src_at = (sources or {}).get(key, (gen, now))
        entries.append({**e, "source_generation": src_gen, "source_written_at": src_at})
    marker_key = batch_marker_key(batch_id)
    marker = {
        "format": MARKER_FORMAT,
        "schema_version": S.SCHEMA_VERSION,
        "unit": "batch",
        "batch_id": batch_id,
        "generation": gen,
        "written_at": now,
        "files": files,
        "units": entries,
        "sweeps": sorted({k[1] for k in units if k[0] != "validation"}),
        "has_validations": any(k[0] == "validation" for k in units),
    }
    if hook:
        hook("before_marker", marker_key)
    store.put(marker_key, json.dumps(marker, sort_keys=True).encode())
    return Commit(marker=marker_key, generation=gen, files=files, deleted=[])


@dataclass
class CompactResult:
    """What :func:`compact` did."""

    batch: Commit | None
    units: int = 0
    markers_deleted: list[str] = field(default_factory=list)
    files_deleted: int = 0

    @property
    def changed(self) -> bool:
        return self.batch is not None or bool(self.markers_deleted)


def compact(
    lake: Store | str, *, sweep_id: str | None = None, max_file_rows: int = DEFAULT_FILE_ROWS, hook: Hook | None = None
) -> CompactResult:
    """Rewrite the committed rows of the lake (or of one sweep) as one batch, then delete what it
    replaced: unit markers merged into it, batches it serves all units of, tombstones no batch
    needs any more. Crash-safe at every step; concurrent trial writes keep winning (newer)."""
    from saasbench.lake.query import connect_snapshot

    store = lake_from_uri(lake)
    snap = snapshot(store, sweep_id=sweep_id)

    def in_scope(k: UnitKey) -> bool:
        return sweep_id is None or (k[0] != "validation" and k[1] == sweep_id)

    live = {k: s for k, s in snap.winners.items() if in_scope(k) and not s.deleted}
    loose = [k for k, s in live.items() if not s.batch]
    serving = {s.key for s in live.values() if s.batch}
    done = not loose and len(serving) <= 1 and not any(b in snap.excluded for b in serving)
    result = CompactResult(batch=None)
    if live and not done:
        tables = _read_tables(connect_snapshot(store, snap, sweep_id=sweep_id), with_validations=sweep_id is None)
        sources = {k: (s.generation, s.written_at) for k, s in live.items()}
        result.batch = write_batch(store, tables, max_file_rows=max_file_rows, sources=sources, hook=hook)
        result.units = len(live)
        new_marker = _written_marker(store, result.batch.marker)
        snap = resolve([m for m in snap.markers if m["marker"] != result.batch.marker] + [new_marker])
    # clean up: merged unit markers, batches serving nothing, tombstones no batch holds any more
    if hook:
        hook("before_cleanup", "")
    held = {k for ks in snap.excluded.values() for k in ks} | {k for k, s in snap.winners.items() if s.batch}
    doomed = [m for m in snap.consumed if (k := unit_key(m)) and in_scope(k)] + list(snap.dead_batches)
    doomed += [s.marker for k, s in snap.winners.items() if s.deleted and not s.batch and k not in held and in_scope(k)]
    _delete_markers(store, doomed, result)
    return result


def _read_tables(con: Any, *, with_validations: bool = True) -> dict[str, pa.Table]:
    """Every row the connection's views serve, per table, to be rewritten as one batch (then the
    connection is closed). Derived tables are left out: the writer derives them again, so lakes
    older than a derived table gain it here."""
    try:
        tables = {}
        for name, t in S.TABLES.items():
            if name in S.DERIVED_TABLES or (not with_validations and t.unit == "validation"):
                continue
            tbl = con.execute(f'SELECT * FROM "{name}"').arrow()
            tables[name] = tbl.read_all() if isinstance(tbl, pa.RecordBatchReader) else tbl
        return tables
    finally:
        con.close()


def _delete_markers(store: Store, doomed: list[dict[str, Any]], result: CompactResult) -> None:
    """Delete markers (first: their units switch to the batch at once) and then their files;
    a marker rewritten since it was read is newer than the batch and is kept."""
    for m in doomed:
        current = read_marker_key(store, m["marker"])
        if current is None or current.get("generation") != m.get("generation"):
            continue
        store.delete([m["marker"]])
        keys = [f["key"] for f in m["files"] if isinstance(f.get("key"), str)]
        store.delete(keys)
        result.markers_deleted.append(m["marker"])
        result.files_deleted += len(keys)


DEFAULT_MAX_BATCHES = 8


def merge_batches(
    lake: Store | str,
    *,
    max_batches: int = DEFAULT_MAX_BATCHES,
    max_file_rows: int = DEFAULT_FILE_ROWS,
    hook: Hook | None = None,
) -> CompactResult:
    """Keep the lake at most ``max_batches`` batches: when more batches serve units, merge all but
    the largest into one. A finished sweep is compacted into its own batch, so without this a
    lake of 200 sweeps is 200 batches, and a report over all of them opens 200 files per table
    (on S3 several requests each). Size-tiered: each merge rewrites the small batches, not the
    largest one, and loose per-trial files are left to :func:`compact`. Crash-safe like
    :func:`compact`: the merged batch holds the same content (same source generations) and is
    newer, so it serves those units; the old batches then serve nothing and are deleted."""
    from saasbench.lake.query import connect_snapshot
    from saasbench.lake.snapshot import Snapshot

    if max_batches < 2:
        raise ValueError("max_batches must be >= 2 (the largest batch is never merged)")
    store = lake_from_uri(lake)
    snap = snapshot(store)
    result = CompactResult(batch=None)
    serving = {s.key for s in snap.winners.values() if s.batch}
    if len(serving) > max_batches:
        rows = {
            m["marker"]: sum(int(f.get("rows", 0)) for f in m["files"]) for m in snap.markers if m["marker"] in serving
        }
        chosen = serving - {max(serving, key=lambda b: (rows[b], b))}
        part = Snapshot(
            markers=[m for m in snap.markers if m["marker"] in chosen],
            winners={k: s for k, s in snap.winners.items() if s.batch and s.key in chosen},
            batch_files={t: [e for e in entries if e[0] in chosen] for t, entries in snap.batch_files.items()},
            excluded={b: ks for b, ks in snap.excluded.items() if b in chosen},
        )
        tables = _read_tables(connect_snapshot(store, part))
        sources = {k: (s.generation, s.written_at) for k, s in part.winners.items()}
        result.batch = write_batch(store, tables, max_file_rows=max_file_rows, sources=sources, hook=hook)
        result.units = len(sources)
        snap = resolve(snap.markers + [_written_marker(store, result.batch.marker)])
    if hook:
        hook("before_cleanup", "")
    _delete_markers(store, list(snap.dead_batches), result)
    return result
