"""``lake check`` and ``lake repair``: find and fix damage the commit protocol cannot prevent.

The writers never leave a partial commit (:mod:`saasbench.lake.writer`), but objects can still be
damaged from outside: a marker overwritten with garbage, a part file deleted or truncated by hand
or by a failing disk. Readers skip a marker they cannot parse, so its unit silently disappears,
and one missing file makes every query over its table fail. This module makes that loud and
repairable:

- :func:`check_lake` reads every marker and every file a marker lists (present, the size the
  marker recorded, a Parquet footer pyarrow can read) and returns the problems, one line each.
- :func:`repair_lake` fixes what it can without losing anything still readable:

  * a **garbage unit marker** is rebuilt from its unit's part files (named
    ``part-<unit id>.<generation>.parquet``; the newest generation whose files all read);
  * a **garbage batch marker** is rebuilt from ``<table>/_batch/<batch id>/`` (its units read from
    the files' key columns);
  * a **unit marker listing a missing or damaged file** is moved to ``_damaged/`` (the unit is no
    longer committed) and the trial's ``commit`` stage checkpoint is dropped, so
    ``saasbench sweep`` on the same spec commits it again from its checkpoints, without running
    the agent again;
  * a **batch marker listing a missing or damaged file** is rewritten without it (its other
    tables keep serving) and records ``damaged_files``;
  * a marker that cannot be rebuilt is moved to ``_damaged/`` with the reason.

Nothing is deleted: quarantined markers keep their bytes under ``_damaged/``.
"""

from __future__ import annotations

import io
import json
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from saasbench.lake import schema as S
from saasbench.lake.snapshot import BATCHES, COMMITS, MARKER_FORMAT, marker_problem, parse_marker
from saasbench.lake.store import Store, lake_from_uri

__all__ = ["DAMAGED", "LakeCheck", "Problem", "RepairResult", "check_lake", "repair_lake"]

DAMAGED = "_damaged"
_TRIAL_KEY = re.compile(rf"^{COMMITS}/sweep_id=(?P<sweep>[^/]+)/trial_id=(?P<trial>[^/]+)\.json$")
_SWEEP_KEY = re.compile(rf"^{COMMITS}/sweep_id=(?P<sweep>[^/]+)/_sweep\.json$")
_VALIDATION_KEY = re.compile(rf"^{COMMITS}/_validations/task_id=(?P<task>[^/]+)/run_id=(?P<run>[^/]+)\.json$")
_BATCH_KEY = re.compile(rf"^{BATCHES}/(?P<batch>[^/]+)\.json$")
_PART = re.compile(r"part-(?P<id>.+)\.(?P<gen>[0-9a-f]{16})\.parquet$")


@dataclass
class Problem:
    kind: str  # bad_marker | missing_file | damaged_file
    key: str  # the marker (bad_marker) or the file
    marker: str
    detail: str

    def line(self) -> str:
        where = self.key if self.key == self.marker else f"{self.key} (listed by {self.marker})"
        return f"{self.kind}: {where}: {self.detail}"


@dataclass
class LakeCheck:
    markers: int = 0
    files: int = 0
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass
class RepairResult:
    rebuilt: list[str] = field(default_factory=list)
    quarantined: list[str] = field(default_factory=list)
    rewritten: list[str] = field(default_factory=list)
    quarantined_trials: list[tuple[str, str]] = field(default_factory=list)  # (sweep_id, trial_id)
    # quarantined trials whose frozen end state survives: (sweep_id, trial_id, end_states row), for
    # saasbench.runs.rescore.seed_checkpoints (the lake layer does not know the trial stages)
    restorable: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    seeded: list[tuple[str, str]] = field(default_factory=list)  # restorable trials whose stages were seeded

    def lines(self) -> list[str]:
        seeded = set(self.seeded)
        return (
            [f"rebuilt {k}" for k in self.rebuilt]
            + [f"quarantined {k} (moved to {DAMAGED}/)" for k in self.quarantined]
            + [f"rewrote {k} without its damaged files" for k in self.rewritten]
            + [
                f"trial {t} of sweep {sw}: seeded its stages from its frozen end state; the next run of the "
                "sweep commits it again without running the agent"
                if (sw, t) in seeded
                else f"trial {t} of sweep {sw} is no longer committed: the next run of the sweep runs it again"
                for sw, t in self.quarantined_trials
            ]
        )


# --- checking ---------------------------------------------------------------------------------------------------
def file_problem(data: bytes | None, want_bytes: Any = None) -> str | None:
    """Why a listed Parquet file cannot serve its rows (None: it can)."""
    if data is None:
        return "missing"
    if isinstance(want_bytes, int) and len(data) != want_bytes:
        return f"{len(data)} bytes, the marker recorded {want_bytes}"
    if len(data) < 12 or data[:4] != b"PAR1" or data[-4:] != b"PAR1":
        return "not a Parquet file (truncated?)"
    try:
        import pyarrow.parquet as pq

        pq.read_metadata(io.BytesIO(data))
    except Exception as exc:  # noqa: BLE001 - any reader failure is the finding
        return f"unreadable Parquet footer: {exc}"
    return None


def check_lake(lake: Store | str) -> LakeCheck:
    """Every marker parsed, every file a marker lists read (a full read: a maintenance command)."""
    store = lake_from_uri(lake)
    out = LakeCheck()
    keys = [k for k in store.list(f"{COMMITS}/") if k.endswith(".json")]
    out.markers = len(keys)
    for key, data in store.get_many(keys).items():
        why = marker_problem(data)
        if why is not None:
            out.problems.append(Problem("bad_marker", key, key, why))
            continue
        m = parse_marker(key, data)
        assert m is not None
        for f in m["files"]:
            fkey = f.get("key") if isinstance(f, dict) else None
            if not isinstance(fkey, str):
                out.problems.append(Problem("bad_marker", key, key, "a file entry without a key"))
                continue
            out.files += 1
            bad = file_problem(store.get(fkey), f.get("bytes"))
            if bad is not None:
                out.problems.append(Problem("missing_file" if bad == "missing" else "damaged_file", fkey, key, bad))
    return out


# --- repairing --------------------------------------------------------------------------------------------------
def repair_lake(lake: Store | str, *, dry_run: bool = False) -> tuple[LakeCheck, RepairResult]:
    """Check, then fix every problem found (see the module docstring). Idempotent."""
    store = lake_from_uri(lake)
    report = check_lake(store)
    result = RepairResult()
    bad_files: dict[str, list[Problem]] = {}
    for p in report.problems:
        if p.kind == "bad_marker":
            rebuilt = _rebuild(store, p.key)
            if rebuilt is not None:
                if not dry_run:
                    store.put(p.key, json.dumps(rebuilt, sort_keys=True).encode())
                result.rebuilt.append(p.key)
            else:
                _quarantine(store, p.key, p.detail, result, dry_run)
        else:
            bad_files.setdefault(p.marker, []).append(p)
    for marker_key, problems in bad_files.items():
        m = parse_marker(marker_key, store.get(marker_key))
        if m is None:
            continue
        why = "; ".join(p.line() for p in problems)
        if m.get("unit") == "batch":
            damaged = {p.key for p in problems}
            keep = [f for f in m["files"] if f.get("key") not in damaged]
            m.pop("marker", None)
            m["files"] = keep
            m["damaged_files"] = sorted(set(m.get("damaged_files", [])) | damaged)
            if not dry_run:
                store.put(marker_key, json.dumps(m, sort_keys=True).encode())
            result.rewritten.append(marker_key)
            continue
        _quarantine(store, marker_key, why, result, dry_run)
        if m.get("unit") == "trial":
            result.quarantined_trials.append((m["sweep_id"], m["trial_id"]))
            row = _end_state_row(store, m, {p.key for p in problems})
            if row is not None:
                result.restorable.append((m["sweep_id"], m["trial_id"], row))
    return report, result


def _end_state_row(store: Store, marker: dict[str, Any], damaged: set[str]) -> dict[str, Any] | None:
    """The trial's ``end_states`` row, if its file is intact and points at the stored records."""
    import pyarrow.parquet as pq

    f = next((f for f in marker["files"] if f.get("table") == "end_states" and f.get("key") not in damaged), None)
    data = store.get(f["key"]) if f else None
    if data is None or file_problem(data) is not None:
        return None
    rows = pq.read_table(io.BytesIO(data)).to_pylist()
    row = rows[0] if rows else None
    return row if row and row.get("rollout_key") and row.get("manifest_key") else None


def _quarantine(store: Store, key: str, why: str, result: RepairResult, dry_run: bool) -> None:
    data = store.get(key)
    if not dry_run:
        if data is not None:
            store.put(f"{DAMAGED}/{key}", data)
        store.put(f"{DAMAGED}/{key}.why.txt", why.encode())
        store.delete([key])
    result.quarantined.append(key)


def _mtime_iso(store: Store, key: str) -> str:
    info = store.list_info(key)
    ts = next((t for k, t in info if k == key), None)
    when = datetime.fromtimestamp(ts, tz=UTC) if ts is not None else datetime.now(UTC)
    return when.isoformat()


def _read_ok(store: Store, key: str) -> tuple[int, int] | None:
    """(rows, bytes) of a readable Parquet file, else None."""
    data = store.get(key)
    if file_problem(data) is not None:
        return None
    import pyarrow.parquet as pq

    assert data is not None
    return pq.read_metadata(io.BytesIO(data)).num_rows, len(data)


def _rebuild(store: Store, key: str) -> dict[str, Any] | None:
    """The marker ``key`` should hold, from the files on disk; None when they do not allow it."""
    if m := _TRIAL_KEY.match(key):
        return _rebuild_unit(
            store,
            {"unit": "trial", "sweep_id": m["sweep"], "trial_id": m["trial"]},
            m["trial"],
            f"sweep_id={m['sweep']}/",
        )
    if m := _SWEEP_KEY.match(key):
        return _rebuild_unit(store, {"unit": "sweep", "sweep_id": m["sweep"]}, m["sweep"], f"sweep_id={m['sweep']}/")
    if m := _VALIDATION_KEY.match(key):
        return _rebuild_unit(
            store, {"unit": "validation", "task_id": m["task"], "run_id": m["run"]}, m["run"], f"task_id={m['task']}/"
        )
    if m := _BATCH_KEY.match(key):
        return _rebuild_batch(store, m["batch"])
    return None


def _rebuild_unit(store: Store, unit: dict[str, Any], file_id: str, prefix: str) -> dict[str, Any] | None:
    gens: dict[str, list[tuple[str, str, float]]] = {}  # generation -> (table, key, mtime)
    for name, t in S.TABLES.items():
        if t.unit != unit["unit"]:
            continue
        for k, mtime in store.list_info(f"{name}/{prefix}"):
            fm = _PART.search(k.rsplit("/", 1)[-1])
            if fm and fm["id"] == file_id:
                gens.setdefault(fm["gen"], []).append((name, k, mtime))
    for gen, entries in sorted(gens.items(), key=lambda kv: -max(e[2] for e in kv[1])):
        files: list[dict[str, Any]] = []
        for name, k, _ in entries:
            ok = _read_ok(store, k)
            if ok is None:
                break
            files.append({"table": name, "key": k, "rows": ok[0], "bytes": ok[1]})
        else:
            if unit["unit"] == "trial":
                task = re.search(r"/task_id=([^/]+)/", str(files[0]["key"]))
                if task is None:
                    continue
                unit = {**unit, "task_id": task.group(1)}
            newest = max(e[2] for e in entries)
            return {
                "format": MARKER_FORMAT,
                "schema_version": S.SCHEMA_VERSION,
                **unit,
                "generation": gen,
                "written_at": datetime.fromtimestamp(newest, tz=UTC).isoformat(),
                "files": sorted(files, key=lambda f: f["table"]),
                "repaired": True,
            }
    return None


def _rebuild_batch(store: Store, batch_id: str) -> dict[str, Any] | None:
    import pyarrow.parquet as pq

    files = []
    units: dict[tuple[str, ...], dict[str, Any]] = {}
    newest = 0.0
    for name, t in S.TABLES.items():
        for k, mtime in store.list_info(f"{name}/_batch/{batch_id}/"):
            data = store.get(k)
            if file_problem(data) is not None:
                continue
            assert data is not None
            cols = {
                "trial": ["sweep_id", "trial_id", "task_id"],
                "sweep": ["sweep_id"],
                "validation": ["task_id", "run_id"],
            }
            tbl = pq.read_table(io.BytesIO(data), columns=cols[t.unit])
            for row in tbl.group_by(cols[t.unit]).aggregate([]).to_pylist():
                ukey = (t.unit, *(str(row[c]) for c in cols[t.unit] if c != "task_id" or t.unit == "validation"))
                units[ukey] = {"unit": t.unit, **{c: row[c] for c in cols[t.unit]}}
            files.append({"table": name, "key": k, "rows": tbl.num_rows, "bytes": len(data)})
            newest = max(newest, mtime)
    if not files:
        return None
    at = datetime.fromtimestamp(newest, tz=UTC).isoformat()
    return {
        "format": MARKER_FORMAT,
        "schema_version": S.SCHEMA_VERSION,
        "unit": "batch",
        "batch_id": batch_id,
        "generation": batch_id.removeprefix("b-"),
        "written_at": at,
        "files": sorted(files, key=lambda f: f["key"]),
        "units": [
            {**e, "source_generation": f"repaired-{batch_id}", "source_written_at": at}
            for _, e in sorted(units.items())
        ],
        "sweeps": sorted({e["sweep_id"] for e in units.values() if e["unit"] != "validation"}),
        "has_validations": any(e["unit"] == "validation" for e in units.values()),
        "repaired": True,
    }
