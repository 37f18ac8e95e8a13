"""The results lake: Parquet tables in a local folder or an S3 bucket, queried with DuckDB.

Write::

    from saasbench import lake
    store = lake.lake_from_uri("s3://results/saasbench")     # or "runs/lake", "file:///..."
    lake.write_sweep(store, lake.sweep_row("sw1", config=cfg, tasks=[...], agents=[...]))
    lake.write_trial(store, lake.from_trial_result(result, sweep_id="sw1", trial_id="t1", task=task))

Read::

    con = lake.connect(store)                         # DuckDB views: trials, node_results, ...
    lake.query(store, "SELECT agent, avg(task_score) FROM trials WHERE sweep_id = ? GROUP BY 1", ["sw1"])

Schema: :mod:`saasbench.lake.schema` (``SCHEMA_VERSION``, ``TABLES``). Writes are idempotent and
all-or-nothing per trial (commit markers); see :mod:`saasbench.lake.writer`. Bulk writes and
compaction (many units in a few large files): :mod:`saasbench.lake.batch`; how readers pick one
source per unit: :mod:`saasbench.lake.snapshot`.
"""

from saasbench.lake.batch import CompactResult, compact, merge_batches, write_batch
from saasbench.lake.query import (
    committed_files,
    connect,
    describe,
    format_table,
    query,
    query_cmd,
)
from saasbench.lake.records import (
    TrialInfo,
    from_trial_result,
    redact,
    sweep_row,
    trial_rows,
    validation_rows,
)
from saasbench.lake.schema import (
    AGENT_OUTCOMES,
    INFRA_OUTCOMES,
    OUTCOMES,
    SCHEMA_VERSION,
    TABLES,
    TRIAL_TABLES,
    VALID_OUTCOMES,
    TableDef,
    check_id,
    table,
)
from saasbench.lake.store import (
    DEFAULT_LAKE,
    LakeStoreError,
    LocalStore,
    S3Store,
    Store,
    lake_from_uri,
)
from saasbench.lake.writer import (
    Commit,
    TrialRows,
    committed_trials,
    delete_trial,
    is_committed,
    list_commits,
    vacuum,
    write_sweep,
    write_trial,
    write_validation,
)

__all__ = [
    "AGENT_OUTCOMES",
    "DEFAULT_LAKE",
    "INFRA_OUTCOMES",
    "OUTCOMES",
    "SCHEMA_VERSION",
    "TABLES",
    "TRIAL_TABLES",
    "VALID_OUTCOMES",
    "Commit",
    "CompactResult",
    "LakeStoreError",
    "LocalStore",
    "S3Store",
    "Store",
    "TableDef",
    "TrialInfo",
    "TrialRows",
    "check_id",
    "committed_files",
    "committed_trials",
    "compact",
    "connect",
    "delete_trial",
    "describe",
    "format_table",
    "from_trial_result",
    "is_committed",
    "lake_from_uri",
    "list_commits",
    "merge_batches",
    "query",
    "query_cmd",
    "redact",
    "sweep_row",
    "table",
    "trial_rows",
    "vacuum",
    "validation_rows",
    "write_batch",
    "write_sweep",
    "write_trial",
    "write_validation",
]
