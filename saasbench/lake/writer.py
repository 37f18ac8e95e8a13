"""Idempotent, all-or-nothing writes of lake rows, grouped in commit units.

A *unit* is what becomes visible at once: one trial (its rows in every per-trial table), one
sweep row, or one reference validation run. Writing a unit:

1. turns each table's rows into Parquet bytes (schema from :mod:`saasbench.lake.schema`);
2. derives ``<gen>``, a hash of those bytes, and the keys ``.../part-<id>.<gen>.parquet``
   (deterministic: the same rows give the same keys, so a rewrite overwrites in place);
3. puts every part file (each put atomic);
4. puts the commit marker ``_commits/...json`` listing keys and row counts (one atomic object:
   the moment of commit);
5. deletes part files of the unit that no marker lists (a previous write with other rows or
   more tables, or files of a write that crashed before its marker) once they are older than
   :data:`STALE_AFTER_S`: a younger file may be a concurrent writer's, put before its marker.

Readers build their file lists from markers only, so a crash before step 4 leaves the previous
version (or nothing) visible, never a partial unit; a rewrite with different rows switches from the
old file set to the new one in step 4. Two writers of one unit at once (the same sweep run twice) are safe: the
last marker wins and every file a marker lists stays, since step 5 never deletes young files.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from saasbench.lake import schema as S
from saasbench.lake.snapshot import (
    BATCHES,
    COMMITS,
    MARKER_FORMAT,
    read_marker_key,
    read_markers,
    snapshot,
)
from saasbench.lake.store import LakeStoreError, Store, lake_from_uri

_PART_RE = re.compile(r"^part-(?P<id>.+)\.(?P<gen>[0-9a-f]{16})\.parquet$")

Rows = "pa.Table | Iterable[Mapping[str, Any]]"


@dataclass
class TrialRows:
    """The rows of one trial, per table name (any of :data:`schema.TRIAL_TABLES`; missing = none)."""

    sweep_id: str
    trial_id: str
    task_id: str
    tables: dict[str, Any] = field(default_factory=dict)

    def counts(self) -> dict[str, int]:
        return {k: (v.num_rows if isinstance(v, pa.Table) else len(list(v))) for k, v in self.tables.items()}


@dataclass
class Commit:
    """What a write committed: the marker key and the files (table, key, rows)."""

    marker: str
    generation: str
    files: list[dict[str, Any]]
    deleted: list[str]

    def rows(self, table: str) -> int:
        return sum(f["rows"] for f in self.files if f["table"] == table)


# --- keys --------------------------------------------------------------------------------------
def trial_marker_key(sweep_id: str, trial_id: str) -> str:
    return f"{COMMITS}/sweep_id={S.check_id(sweep_id, 'sweep_id')}/trial_id={S.check_id(trial_id, 'trial_id')}.json"


def sweep_marker_key(sweep_id: str) -> str:
    return f"{COMMITS}/sweep_id={S.check_id(sweep_id, 'sweep_id')}/_sweep.json"


def validation_marker_key(task_id: str, run_id: str) -> str:
    return f"{COMMITS}/_validations/task_id={S.check_id(task_id, 'task_id')}/run_id={S.check_id(run_id, 'run_id')}.json"


#: A part file no marker lists is deleted only once it is this old (seconds): younger ones may belong
#: to a write in flight (its files are put before its marker). ``vacuum``'s default is the same.
STALE_AFTER_S = 3600.0


def _part_dir(table: str, ids: Mapping[str, str]) -> str:
    t = S.table(table)
    return table + "/" + "/".join(f"{c}={S.check_id(ids[c], c)}" for c in t.partition_by)


# --- arrow / parquet ---------------------------------------------------------------------------
def to_table(name: str, rows: Any) -> pa.Table:
    """Rows (a pyarrow Table or dicts) as a Table with exactly the schema's columns and types.
    Unknown keys raise (a typo would otherwise vanish); missing nullable columns are NULL."""
    sch = S.table(name).schema
    if isinstance(rows, pa.Table):
        extra = set(rows.column_names) - set(sch.names)
        if extra:
            raise ValueError(f"{name}: unknown column(s) {sorted(extra)}")
        cols = [
            rows.column(n) if n in rows.column_names else pa.nulls(rows.num_rows, f.type)
            for n, f in zip(sch.names, sch)
        ]
        return pa.Table.from_arrays([c.cast(f.type) for c, f in zip(cols, sch)], schema=sch)
    rows = list(rows)
    for i, r in enumerate(rows):
        extra = set(r) - set(sch.names)
        if extra:
            raise ValueError(f"{name} row {i}: unknown column(s) {sorted(extra)}")
    try:
        return pa.Table.from_pylist(rows, schema=sch)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise ValueError(f"{name}: rows do not fit the schema: {exc}") from None


def with_derived(tables: Mapping[str, Any]) -> dict[str, Any]:
    """``tables`` plus the tables derived from them (``node_rollups`` from ``node_results``).
    Derived tables are the writer's: a caller passing one gets an error, not a silent overwrite."""
    given = set(tables) & set(S.DERIVED_TABLES)
    if given:
        raise ValueError(f"{', '.join(sorted(given))}: derived from node_results by the writer; do not pass it")
    out = dict(tables)
    if "node_results" in out:
        from saasbench.lake.rollups import node_rollups

        out["node_results"] = nodes = to_table("node_results", out["node_results"])
        out["node_rollups"] = node_rollups(nodes)
    return out


def _parquet_bytes(tbl: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(tbl, sink, compression="zstd", row_group_size=64 * 1024)
    return sink.getvalue().to_pybytes()


def _check_ids(name: str, tbl: pa.Table, ids: Mapping[str, str]) -> None:
    for col, want in ids.items():
        if col in tbl.column_names and tbl.num_rows:
            got = set(tbl.column(col).to_pylist())
            if got != {want}:
                raise ValueError(
                    f"{name}: column {col} must be {want!r} in every row of this unit, got {sorted(map(str, got))}"
                )


# --- the commit protocol -----------------------------------------------------------------------
Hook = Callable[[str, str], None]


def _commit(
    store: Store,
    marker_key: str,
    unit: dict[str, Any],
    tables: Mapping[str, Any],
    file_id: str,
    ids_for_partition: Mapping[str, str],
    *,
    hook: Hook | None = None,
) -> Commit:
    built: list[tuple[str, pa.Table, bytes]] = []
    for name, rows in with_derived(tables).items():
        tbl = to_table(name, rows)
        _check_ids(name, tbl, {k: v for k, v in unit.items() if k in ("sweep_id", "trial_id", "task_id", "run_id")})
        if tbl.num_rows:
            built.append((name, tbl, _parquet_bytes(tbl)))
    h = hashlib.sha256()
    for name, _t, data in sorted(built, key=lambda b: b[0]):
        h.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    gen = h.hexdigest()[:16]

    files = [
        {
            "table": name,
            "key": f"{_part_dir(name, ids_for_partition)}/part-{file_id}.{gen}.parquet",
            "rows": tbl.num_rows,
            "bytes": len(data),
        }
        for name, tbl, data in built
    ]

    for f, (_name, _tbl, data) in zip(files, built):
        if hook:
            hook("before_file", f["key"])
        store.put(f["key"], data)
    if hook:
        hook("before_marker", marker_key)
    marker = {
        "format": MARKER_FORMAT,
        "schema_version": S.SCHEMA_VERSION,
        **unit,
        "generation": gen,
        "written_at": _now(),
        "files": files,
    }
    store.put(marker_key, json.dumps(marker, sort_keys=True).encode())

    # clean up: files of this unit that no marker lists any more (earlier writes, crashed writes), but
    # only those older than STALE_AFTER_S: a younger file may belong to a concurrent writer of the same
    # unit (the same sweep run twice at once) whose marker is not written yet, and deleting it would
    # leave that marker listing a missing file. What is spared here goes at the next write or vacuum.
    current = read_marker(store, marker_key) or marker  # ours, or a concurrent writer's newer one
    keep = {f["key"] for f in files} | {f.get("key") for f in current.get("files", [])}
    cutoff = time.time() - STALE_AFTER_S
    stale = set()
    unit_tables = [n for n, t in S.TABLES.items() if t.unit == unit["unit"]]
    for name in unit_tables:
        d = _part_dir(name, ids_for_partition) + "/"
        for key, mtime in store.list_info(d + f"part-{file_id}."):
            m = _PART_RE.match(key[len(d) :])
            if m and m.group("id") == file_id and key not in keep and mtime <= cutoff:
                stale.add(key)
    if stale:
        store.delete(sorted(stale))
    return Commit(marker=marker_key, generation=gen, files=files, deleted=sorted(stale))


def write_trial(lake: Store | str, rows: TrialRows, *, hook: Hook | None = None) -> Commit:
    """Write one trial's rows in every per-trial table and commit them at once.

    Idempotent: writing the same rows again changes nothing visible; writing other rows for the
    same (sweep_id, trial_id) replaces the trial. ``hook(event, key)`` is called before each file
    and before the marker (tests use it to simulate a crash).
    """
    store = lake_from_uri(lake)
    unknown = set(rows.tables) - set(S.TRIAL_TABLES)
    if unknown:
        raise ValueError(f"not per-trial tables: {sorted(unknown)} (per-trial: {', '.join(S.TRIAL_TABLES)})")
    ids = {"sweep_id": S.check_id(rows.sweep_id, "sweep_id"), "task_id": S.check_id(rows.task_id, "task_id")}
    S.check_id(rows.trial_id, "trial_id")
    unit = {"unit": "trial", "sweep_id": rows.sweep_id, "trial_id": rows.trial_id, "task_id": rows.task_id}
    return _commit(
        store, trial_marker_key(rows.sweep_id, rows.trial_id), unit, rows.tables, rows.trial_id, ids, hook=hook
    )


def write_sweep(lake: Store | str, row: Mapping[str, Any], *, hook: Hook | None = None) -> Commit:
    """Write (or replace) the ``sweeps`` row of one sweep."""
    store = lake_from_uri(lake)
    sweep_id = S.check_id(row["sweep_id"], "sweep_id")
    unit = {"unit": "sweep", "sweep_id": sweep_id}
    return _commit(
        store, sweep_marker_key(sweep_id), unit, {"sweeps": [dict(row)]}, sweep_id, {"sweep_id": sweep_id}, hook=hook
    )


def write_validation(lake: Store | str, task_id: str, run_id: str, rows: Any, *, hook: Hook | None = None) -> Commit:
    """Write (or replace) the ``reference_validations`` rows of one validate-reference run."""
    store = lake_from_uri(lake)
    unit = {"unit": "validation", "task_id": S.check_id(task_id, "task_id"), "run_id": S.check_id(run_id, "run_id")}
    return _commit(
        store,
        validation_marker_key(task_id, run_id),
        unit,
        {"reference_validations": rows},
        run_id,
        {"task_id": task_id},
        hook=hook,
    )


# --- reading markers ---------------------------------------------------------------------------
read_marker = read_marker_key


def list_commits(lake: Store | str, *, sweep_id: str | None = None) -> list[dict[str, Any]]:
    """All commit markers (sweep rows, trials, validations, batches), optionally only those of one
    sweep (validations are always included: they belong to tasks, not sweeps)."""
    return read_markers(lake_from_uri(lake), sweep_id=sweep_id)


def committed_trials(lake: Store | str, sweep_id: str) -> set[str]:
    """Trial ids of ``sweep_id`` that are committed, by a trial write or a batch (a resumed sweep
    skips these)."""
    return snapshot(lake_from_uri(lake), sweep_id=sweep_id).trial_ids(sweep_id)


def is_committed(lake: Store | str, sweep_id: str, trial_id: str) -> bool:
    store = lake_from_uri(lake)
    m = read_marker(store, trial_marker_key(sweep_id, trial_id))
    if m is not None and not m.get("deleted") and not store.list(f"{BATCHES}/"):
        return True  # the common case without batches: one GET, one LIST
    return trial_id in committed_trials(store, sweep_id)


def vacuum(
    lake: Store | str,
    *,
    older_than_s: float = STALE_AFTER_S,
    dry_run: bool = False,
    objects: bool = False,
    objects_older_than_s: float = 7 * 86400.0,
) -> list[str]:
    """Delete part files no commit marker lists (left by writes that crashed before their marker
    and were never rewritten), if older than ``older_than_s`` so in-flight writes are spared.
    Returns the keys deleted (or that would be, with ``dry_run``).

    Content-addressed objects (``objects/sha256/...``: frozen end states, docs/endstate.md) are
    never part files, so this never deletes them by default. With ``objects=True`` it also deletes
    the objects that no ``end_states`` row of any commit marker references (its ``manifest_key`` and
    ``object_keys``; a row superseded by a rewrite still protects its objects until its file is
    gone) and that are older than ``objects_older_than_s`` (default a week: a trial freezes its end
    state before its evaluation and commits the row after it). An ``end_states`` file that cannot
    be read stops the object sweep before anything is deleted."""

    store = lake_from_uri(lake)
    damaged: list[tuple[str, str]] = []
    markers = read_markers(store, damaged=damaged)
    if damaged:  # their files are listed by nothing readable: vacuum would delete a unit's only copy
        raise LakeStoreError(
            f"{len(damaged)} commit marker(s) cannot be read (e.g. {damaged[0][0]}: {damaged[0][1]}): vacuum "
            "would delete the files they list; run `saasbench lake repair` first"
        )
    listed = {f["key"] for m in markers for f in m["files"]}
    cutoff = time.time() - older_than_s
    orphans = [
        key
        for name in S.TABLES
        for key, mtime in store.list_info(name + "/")
        if key.endswith(".parquet") and key not in listed and mtime <= cutoff
    ]
    if objects:
        referenced = referenced_objects(store, markers)
        obj_cutoff = time.time() - objects_older_than_s
        orphans += [
            key for key, mtime in store.list_info(OBJECTS + "/") if key not in referenced and mtime <= obj_cutoff
        ]
    if orphans and not dry_run:
        store.delete(orphans)
    return orphans


OBJECTS = "objects"


def referenced_objects(store: Store, markers: list[dict[str, Any]] | None = None) -> set[str]:
    """Every object key an ``end_states`` row of any commit marker names (manifest and components).
    Raises when a listed ``end_states`` file cannot be read (never guess which objects are free)."""
    import io

    markers = list_commits(store) if markers is None else markers
    keys = sorted({f["key"] for m in markers for f in m["files"] if f.get("table") == "end_states"})
    out: set[str] = set()
    for key, data in store.get_many(keys).items():
        if data is None:
            raise FileNotFoundError(f"end_states file {key} is listed by a commit marker but missing")
        tbl = pq.read_table(io.BytesIO(data), columns=["manifest_key", "object_keys"])
        for mkey, okeys in zip(tbl.column("manifest_key").to_pylist(), tbl.column("object_keys").to_pylist()):
            if mkey:
                out.add(mkey)
            if okeys is None and mkey:  # a row without the list: the manifest names its objects
                okeys = _object_keys_in(store, mkey)
            out.update(k for k in okeys or () if k)
    return out


def _object_keys_in(store: Store, manifest_key: str) -> list[str]:
    data = store.get(manifest_key)
    if data is None:
        return []
    found: list[str] = []

    def walk(v: Any) -> None:
        if isinstance(v, str) and v.startswith(OBJECTS + "/"):
            found.append(v)
        elif isinstance(v, dict):
            for x in v.values():
                walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)

    walk(json.loads(data))
    return found


def delete_trial(lake: Store | str, sweep_id: str, trial_id: str) -> bool:
    """Remove a trial; False if it was not committed. Its own marker goes first (invisible at
    once), then its files; a trial held by a batch gets a tombstone marker instead, which hides
    its rows in the batch until the next ``compact``."""
    store = lake_from_uri(lake)
    key = trial_marker_key(sweep_id, trial_id)
    snap = snapshot(store, sweep_id=sweep_id)
    win = snap.winners.get(("trial", sweep_id, trial_id))
    if win is None or win.deleted:
        return False
    m = read_marker(store, key)
    unit = ("trial", sweep_id, trial_id)
    if win.batch or any(unit in held for held in snap.excluded.values()):  # a batch holds its rows: hide them
        tomb: dict[str, Any] = {
            "format": MARKER_FORMAT,
            "schema_version": S.SCHEMA_VERSION,
            "unit": "trial",
            "sweep_id": sweep_id,
            "trial_id": trial_id,
            "task_id": _task_of(win, trial_id) if win.batch else win.marker.get("task_id"),
            "deleted": True,
            "generation": "deleted",
            "written_at": _now(),
            "files": [],
        }
        store.put(key, json.dumps(tomb, sort_keys=True).encode())
    else:
        store.delete([key])
    if m is not None:
        store.delete([f["key"] for f in m["files"]])
    return True


def _task_of(src: Any, trial_id: str) -> str | None:
    for e in src.marker.get("units", []):
        if isinstance(e, dict) and e.get("unit") == "trial" and e.get("trial_id") == trial_id:
            return e.get("task_id")
    return None


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")
