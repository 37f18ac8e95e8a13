"""What is committed in the lake right now: commit markers resolved into one source per unit.

Two kinds of commit markers exist (both written by :mod:`saasbench.lake.writer`):

- **unit markers**, one per unit (a trial, a sweep row, a reference validation run), written by
  ``write_trial``/``write_sweep``/``write_validation``; the unit's files sit in Hive partitions.
  ``delete_trial`` may leave a *tombstone*: a unit marker with ``deleted: true`` and no files.
- **batch markers** (``_commits/_batches/<batch_id>.json``), written by ``write_batch`` and
  ``compact``: a few large files holding many units, and the list of units they hold, each with
  the generation and time of the content it was made from (``source_generation``,
  ``source_written_at``).

A unit may appear in several markers (a trial written after a compaction, a compaction that
crashed before deleting the markers it merged). :func:`resolve` picks one *winner* per unit:

1. a unit marker whose generation equals a batch entry's ``source_generation`` was merged into
   that batch: the batch serves it (same rows, fewer files);
2. otherwise the candidate with the newest content time wins (a unit marker's ``written_at``, a
   batch entry's ``source_written_at``; ties go to the unit marker, then the newer batch).

Readers take the winner's rows only: a batch that lost some units is read with those units
filtered out (:attr:`Snapshot.excluded`). So every crash point of ``compact`` and any interleaving
of compaction and trial writes shows each unit exactly once. Times come from the writers' clocks:
writers on different machines are assumed to agree to well under the time between two writes of
the same unit (minutes: a trial is rerun only after it finished).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, cast

from saasbench.lake import schema as S
from saasbench.lake.store import Store

COMMITS = "_commits"
BATCHES = f"{COMMITS}/_batches"
MARKER_FORMAT = "saasbench-lake-commit/1"

UnitKey = tuple[str, ...]  # ("trial", sweep_id, trial_id) | ("sweep", sweep_id) | ("validation", task_id, run_id)

# the columns that identify a unit's rows, per unit kind
UNIT_COLUMNS: dict[str, tuple[str, ...]] = {
    "trial": ("sweep_id", "trial_id"),
    "sweep": ("sweep_id",),
    "validation": ("task_id", "run_id"),
}


def unit_key(m: dict[str, Any]) -> UnitKey | None:
    """The unit a unit marker (or a batch's unit entry) stands for; None if malformed."""
    kind = m.get("unit")
    if kind == "trial":  # the common case, spelled out: a 10,000-trial batch calls this 10,000 times
        s, t = m.get("sweep_id"), m.get("trial_id")
        return ("trial", s, t) if type(s) is str and s and type(t) is str and t else None
    cols = UNIT_COLUMNS.get(kind)  # type: ignore[arg-type]
    if cols is None:
        return None
    vals = [m.get(c) for c in cols]
    if not all(isinstance(v, str) and v for v in vals):
        return None
    return cast(UnitKey, (kind, *vals))  # checked above: a known kind and non-empty str values


def marker_problem(data: bytes | None) -> str | None:
    """Why these bytes are not a usable commit marker (None: they are)."""
    if data is None:
        return "missing"
    try:
        m = json.loads(data)
    except ValueError as exc:
        return f"not JSON ({exc})"
    if not isinstance(m, dict) or m.get("format") != MARKER_FORMAT:
        return f"not a {MARKER_FORMAT} marker"
    if not isinstance(m.get("files"), list):
        return "no file list"
    if m.get("unit") == "batch":
        if not isinstance(m.get("units"), list):
            return "a batch marker without its unit list"
    elif unit_key(m) is None:
        return "no valid unit (unit kind and ids)"
    return None


def parse_marker(key: str, data: bytes | None) -> dict[str, Any] | None:
    """A marker's JSON, or None when absent, damaged or not ours (never half-read)."""
    if marker_problem(data) is not None:
        return None
    assert data is not None
    m: dict[str, Any] = json.loads(data)
    m["marker"] = key
    return m


def read_marker_key(store: Store, key: str) -> dict[str, Any] | None:
    """One marker by key (None when absent or not a valid marker)."""
    return parse_marker(key, store.get(key))


def read_markers(
    store: Store, *, sweep_id: str | None = None, damaged: list[tuple[str, str]] | None = None
) -> list[dict[str, Any]]:
    """Every marker of the lake; with ``sweep_id``: that sweep's unit markers, the validation
    markers and the batches that hold any of them. Markers that cannot be parsed are skipped and,
    with ``damaged``, appended to it as (key, why)."""
    if sweep_id is None:
        keys = store.list(f"{COMMITS}/")
    else:
        keys = (
            store.list(f"{COMMITS}/sweep_id={S.check_id(sweep_id, 'sweep_id')}/")
            + store.list(f"{COMMITS}/_validations/")
            + store.list(f"{BATCHES}/")
        )
    keys = [k for k in keys if k.endswith(".json")]
    out = []
    for key, data in store.get_many(keys).items():
        m = parse_marker(key, data)
        if m is None:
            if damaged is not None and data is not None:
                damaged.append((key, marker_problem(data) or "unreadable"))
            continue
        if (
            sweep_id is not None
            and m.get("unit") == "batch"
            and sweep_id not in m.get("sweeps", [])
            and not m.get("has_validations")
        ):
            continue
        out.append(m)
    return out


@dataclass
class Source:
    """One candidate for a unit: a unit marker or an entry of a batch marker."""

    marker: dict[str, Any]
    generation: str
    written_at: str
    batch: bool
    deleted: bool = False

    @property
    def order(self) -> tuple[str, bool, str, str]:
        """Newer content first; on a tie a unit marker, then the batch written last."""
        return (self.written_at, not self.batch, str(self.marker.get("written_at", "")), self.key)

    @property
    def key(self) -> str:
        return self.marker["marker"]


@dataclass
class Snapshot:
    """The resolved lake: winners per unit, files to read per table, exclusions per batch."""

    markers: list[dict[str, Any]]
    winners: dict[UnitKey, Source] = field(default_factory=dict)
    # per table: files of winning unit markers (Hive-partitioned), grouped by schema version
    unit_files: dict[str, dict[int, list[str]]] = field(default_factory=dict)
    # per table: (batch marker key, schema version, files) of batches that serve >= 1 unit
    batch_files: dict[str, list[tuple[str, int, list[str]]]] = field(default_factory=dict)
    # per batch marker key: the units it holds but does not serve (read with these filtered out)
    excluded: dict[str, list[UnitKey]] = field(default_factory=dict)
    # unit markers merged into a batch (compact deletes them) and batches serving nothing
    consumed: list[dict[str, Any]] = field(default_factory=list)
    dead_batches: list[dict[str, Any]] = field(default_factory=list)
    # sweeps with a serving source that has node_results but no node_rollups (written before
    # rollups existed): readers roll those sweeps up from their node rows
    rollups_missing: set[str] = field(default_factory=set)
    # markers that could not be parsed, (key, why): their units are invisible until `lake repair`
    damaged: list[tuple[str, str]] = field(default_factory=list)

    def units(self, kind: str, *, sweep_id: str | None = None) -> list[UnitKey]:
        """Live (not deleted) units of a kind, optionally of one sweep."""
        return [
            k
            for k, s in self.winners.items()
            if k[0] == kind and not s.deleted and (sweep_id is None or kind == "validation" or k[1] == sweep_id)
        ]

    def trial_ids(self, sweep_id: str) -> set[str]:
        return {k[2] for k in self.units("trial", sweep_id=sweep_id)}


def _better(a: Source, b: Source) -> Source:
    return a if a.order >= b.order else b


def resolve(markers: Iterable[dict[str, Any]]) -> Snapshot:
    """Pick the winner of every unit and the file lists readers need (see the module doc)."""
    markers = list(markers)
    snap = Snapshot(markers=markers)
    unit_markers: dict[UnitKey, Source] = {}
    batch_entries: dict[UnitKey, list[Source]] = {}
    batches = [m for m in markers if m.get("unit") == "batch"]
    for m in markers:
        if m.get("unit") == "batch":
            continue
        k = unit_key(m)
        if k is None:
            continue
        src = Source(m, str(m.get("generation", "")), str(m.get("written_at", "")), False, bool(m.get("deleted")))
        old = unit_markers.get(k)
        unit_markers[k] = src if old is None else _better(src, old)
    for b in batches:
        shared: dict[tuple[str, str], Source] = {}  # a batch's entries share a few sources: one object each
        for e in b["units"]:
            k = unit_key(e) if isinstance(e, dict) else None
            if k is None:
                continue
            gw = (str(e.get("source_generation", "")), str(e.get("source_written_at", "")))
            bsrc = shared.get(gw)
            if bsrc is None:
                bsrc = shared[gw] = Source(b, gw[0], gw[1], True)
            batch_entries.setdefault(k, []).append(bsrc)

    served: dict[str, int] = {b["marker"]: 0 for b in batches}
    for k, entries in batch_entries.items():  # the common case, fast: a unit only one batch holds
        if len(entries) == 1 and k not in unit_markers:
            snap.winners[k] = entries[0]
            served[entries[0].key] += 1
    for k in (set(unit_markers) | set(batch_entries)) - snap.winners.keys():
        um = unit_markers.get(k)
        entries = batch_entries.get(k, [])
        cands = list(entries)
        merged = [s for s in entries if um is not None and not um.deleted and s.generation == um.generation]
        if um is not None and merged:
            snap.consumed.append(um.marker)  # rule 1: the batch holding the same rows serves it
            cands = merged + [s for s in entries if s not in merged]
            win = merged[0]
            for s in merged[1:]:
                win = _better(s, win)
        else:
            if um is not None:
                cands.append(um)
            win = cands[0]
            for s in cands[1:]:
                win = _better(s, win)
        snap.winners[k] = win
        for s in entries:
            if s is win:
                served[s.key] += 1
            elif s.key != win.key:  # a batch that lists the unit twice still serves it
                snap.excluded.setdefault(s.key, []).append(k)

    for k, src in snap.winners.items():
        if src.batch or src.deleted:
            continue
        ver = int(src.marker.get("schema_version") or 0)
        for f in src.marker["files"]:
            t = f.get("table")
            if t in S.TABLES and isinstance(f.get("key"), str):
                snap.unit_files.setdefault(t, {}).setdefault(ver, []).append(f["key"])
        if _lacks_rollups(src.marker) and k[0] == "trial":
            snap.rollups_missing.add(k[1])
    for b in batches:
        if not served[b["marker"]]:
            snap.dead_batches.append(b)
            snap.excluded.pop(b["marker"], None)
            continue
        ver = int(b.get("schema_version") or 0)
        per_table: dict[str, list[str]] = {}
        for f in b["files"]:
            t = f.get("table")
            if t in S.TABLES and isinstance(f.get("key"), str):
                per_table.setdefault(t, []).append(f["key"])
        for t, keys in per_table.items():
            snap.batch_files.setdefault(t, []).append((b["marker"], ver, sorted(keys)))
        if _lacks_rollups(b):
            snap.rollups_missing.update(str(x) for x in b.get("sweeps", []))
    for t in snap.unit_files:
        snap.unit_files[t] = {v: sorted(set(ks)) for v, ks in snap.unit_files[t].items()}
    return snap


def _lacks_rollups(marker: dict[str, Any]) -> bool:
    tables = {f.get("table") for f in marker["files"] if isinstance(f, dict)}
    return "node_results" in tables and "node_rollups" not in tables


class LakeDamagedWarning(UserWarning):
    """The lake has commit markers that cannot be read: their units are missing from every view."""


def snapshot(store: Store, *, sweep_id: str | None = None) -> Snapshot:
    """Read the markers (of one sweep, or all) and resolve them. Unreadable markers are loud: a
    :class:`LakeDamagedWarning` names them (their units are missing until ``saasbench lake repair``)."""
    damaged: list[tuple[str, str]] = []
    snap = resolve(read_markers(store, sweep_id=sweep_id, damaged=damaged))
    snap.damaged = damaged
    if damaged:
        import warnings

        first = ", ".join(f"{k} ({why})" for k, why in damaged[:3])
        warnings.warn(
            LakeDamagedWarning(
                f"lake {store.uri}: {len(damaged)} commit marker(s) cannot be read and their rows are missing "
                f"from every query: {first}{' ...' if len(damaged) > 3 else ''}; run `saasbench lake check` "
                "and `saasbench lake repair`"
            ),
            stacklevel=2,
        )
    return snap
