"""``saasbench lake compact|merge|vacuum|check|repair``: maintain the results lake.

Heavy imports (the lake's batch writer, DuckDB) happen inside the commands.
"""

from __future__ import annotations

from typing import Annotated, Optional

import typer
from rich.markup import escape

from saasbench import settings
from saasbench.cli.common import LakeOption
from saasbench.cli.common import console as _console
from saasbench.cli.common import fail as _fail

lake_app = typer.Typer(
    help="Maintain the results lake: compact small files, vacuum orphans, check and repair damage.",
    no_args_is_help=True,
)


@lake_app.command("compact")
def compact_cmd(
    lake: LakeOption = None,
    sweep: Annotated[
        Optional[str], typer.Option("--sweep", help="Compact only this sweep (default: the whole lake)")
    ] = None,
    max_file_rows: Annotated[
        int, typer.Option("--max-file-rows", min=1, help="Rows per Parquet file at most")
    ] = 2_000_000,
) -> None:
    """Rewrite the committed rows (of the lake or one sweep) as a few large files, then delete the
    small per-trial files they replace. Safe to interrupt; readers always see every row once.

    Example: saasbench lake compact --lake s3://results/saasbench
    """
    from saasbench.lake.batch import compact

    lake = settings.lake_uri(lake)
    try:
        res = compact(lake, sweep_id=sweep, max_file_rows=max_file_rows)
    except Exception as exc:  # noqa: BLE001 - store/DuckDB errors become one line, exit 2
        raise _fail(f"cannot compact the lake {lake}: {type(exc).__name__}: {exc}") from None
    console = _console()
    if res.batch is None and not res.markers_deleted:
        console.print("nothing to compact")
        return
    if res.batch is not None:
        rows = sum(f["rows"] for f in res.batch.files)
        console.print(
            f"compacted {res.units} unit(s), {rows:,} row(s) into {len(res.batch.files)} file(s): "
            f"{escape(res.batch.marker)}"
        )
    console.print(f"deleted {len(res.markers_deleted)} marker(s) and {res.files_deleted} file(s) they listed")


@lake_app.command("merge")
def merge_cmd(
    lake: LakeOption = None,
    max_batches: Annotated[int, typer.Option("--max-batches", min=2, help="Batches to keep at most")] = 8,
    max_file_rows: Annotated[
        int, typer.Option("--max-file-rows", min=1, help="Rows per Parquet file at most")
    ] = 2_000_000,
) -> None:
    """Merge batches (one per finished sweep) into one when there are more than --max-batches,
    leaving the largest as it is. Finished sweeps run this by themselves; safe to interrupt.

    Example: saasbench lake merge --lake s3://results/saasbench --max-batches 4
    """
    from saasbench.lake.batch import merge_batches

    lake = settings.lake_uri(lake)
    try:
        res = merge_batches(lake, max_batches=max_batches, max_file_rows=max_file_rows)
    except Exception as exc:  # noqa: BLE001 - store/DuckDB errors become one line, exit 2
        raise _fail(f"cannot merge the batches of the lake {lake}: {type(exc).__name__}: {exc}") from None
    console = _console()
    if res.batch is None and not res.markers_deleted:
        console.print(f"nothing to merge (at most {max_batches} batches)")
        return
    if res.batch is not None:
        console.print(f"merged {res.units} unit(s) into {escape(res.batch.marker)}")
    console.print(f"deleted {len(res.markers_deleted)} batch marker(s) and {res.files_deleted} file(s) they listed")


@lake_app.command("vacuum")
def vacuum_cmd(
    lake: LakeOption = None,
    older_than_s: Annotated[
        float, typer.Option("--older-than", min=0, help="Only files at least this old (seconds)")
    ] = 3600.0,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="List, do not delete")] = False,
    objects: Annotated[
        bool,
        typer.Option(
            "--objects",
            help="Also delete end-state objects (objects/sha256/...) that no committed end_states row references",
        ),
    ] = False,
    objects_older_than_s: Annotated[
        float, typer.Option("--objects-older-than", min=0, help="Only objects at least this old (seconds)")
    ] = 7 * 86400.0,
) -> None:
    """Delete Parquet files no commit lists (left by writes that crashed before committing).

    End-state objects are kept unless --objects is given; then those no end_states row references
    (and older than --objects-older-than) go too.
    """
    from saasbench.lake import vacuum

    lake = settings.lake_uri(lake)
    try:
        keys = vacuum(
            lake,
            older_than_s=older_than_s,
            dry_run=dry_run,
            objects=objects,
            objects_older_than_s=objects_older_than_s,
        )
    except Exception as exc:  # noqa: BLE001 - store errors become one line, exit 2
        raise _fail(f"cannot vacuum the lake {lake}: {type(exc).__name__}: {exc}") from None
    console = _console()
    for k in keys:
        console.print(escape(k), highlight=False)
    console.print(f"{len(keys)} orphan file(s) {'found' if dry_run else 'deleted'}")


@lake_app.command("check")
def check_cmd(lake: LakeOption = None) -> None:
    """Read every commit marker and every file they list; print each problem on one line.

    Exit 0 when the lake is sound, 1 when it has problems (then run `saasbench lake repair`).

    Example: saasbench lake check --lake s3://results/saasbench
    """
    from saasbench.lake.check import check_lake

    lake = settings.lake_uri(lake)
    try:
        report = check_lake(lake)
    except Exception as exc:  # noqa: BLE001 - store errors become one line, exit 2
        raise _fail(f"cannot check the lake {lake}: {type(exc).__name__}: {exc}") from None
    console = _console()
    for p in report.problems:
        console.print(escape(p.line()), highlight=False)
    console.print(
        f"{report.markers} marker(s), {report.files} file(s): "
        + ("sound" if report.ok else f"{len(report.problems)} problem(s); fix with `saasbench lake repair`")
    )
    if not report.ok:
        raise typer.Exit(1)


@lake_app.command("repair")
def repair_cmd(
    lake: LakeOption = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Say what would be done, change nothing")] = False,
) -> None:
    """Fix what `lake check` finds without losing anything still readable: rebuild garbage markers
    from their files, take units whose files are gone out of the lake (their markers kept under
    _damaged/; the next run of the sweep commits those trials again from their stage checkpoints),
    drop damaged files from batch markers.

    Example: saasbench lake repair --lake runs/lake
    """
    from saasbench.lake.check import repair_lake

    lake = settings.lake_uri(lake)
    try:
        report, result = repair_lake(lake, dry_run=dry_run)
        if result.restorable and not dry_run:
            from saasbench.lake.store import lake_from_uri
            from saasbench.runs.rescore import reseed_repaired

            result.seeded = reseed_repaired(lake_from_uri(lake), result.restorable)
    except Exception as exc:  # noqa: BLE001 - store errors become one line, exit 2
        raise _fail(f"cannot repair the lake {lake}: {type(exc).__name__}: {exc}") from None
    console = _console()
    for p in report.problems:
        console.print(escape(p.line()), highlight=False)
    lines = result.lines()
    for line in lines:
        console.print(("would: " if dry_run else "") + escape(line), highlight=False)
    console.print(f"{len(report.problems)} problem(s), {len(lines)} action(s){' (dry run)' if dry_run else ''}")
