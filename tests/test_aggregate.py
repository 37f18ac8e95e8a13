"""Golden aggregation over a small lake written with saasbench.lake.writer.

Every expected number is worked out by hand in a comment next to the assertion.

Sweep ``sw1``, config oh / m1:
  taskA (domain CF), two completed attempts:
    a0: n1 Deployment   binary    PASSED              10/10
        n2 DataModel    weighted  PASSED             2.5/5
        n3 ArchitectureQuality llm-judge SKIPPED_LLM   0/8   (out of numerator and denominator)
        n4 RBAC         binary    SKIPPED_DEPENDENCY   0/5   (maxScore stays in the denominator)
        n5 XMPPSignaling binary   FAILED               0/2   (category with no backbone; hostile message)
        S = 100 * (10+2.5+0+0) / (10+5+5+2) = 1250/22 = 56.8181..  -> 56.82; deterministic the same
    a1: the same nodes, all PASSED with full marks: S = 30/30 = 100
  taskB (domain SI):
    b0 completed: m1 Authentication binary PASSED 4/4, m2 API_CRUD binary FAILED 0/4,
                  m3 CRUD llm-judge PASSED 2/6
        S = 100 * 6/14 = 42.857..; deterministic = 100 * 4/8 = 50
    b1 env_error: no node rows (the environment never came up)
config cc / m2: taskA once: n1 PASSED 10/10, n2 FAILED 0/5, n3 FAILED 0/8, n4 SKIPPED_DEPENDENCY 0/5,
                n5 FAILED 0/2 -> S = 10/30 = 33.33..
Sweep ``sw2`` (for compare), oh / m1: taskA once, all PASSED (100); taskB once:
    m1 FAILED 0/4 (lost), m2 PASSED 4/4 (gained), m3 PASSED 2/6 -> S = 6/14 = 42.857..
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from saasbench.evaluation import scoring
from saasbench.lake import connect, write_sweep, write_trial
from saasbench.lake.writer import TrialRows
from saasbench.reports import aggregate
from saasbench.reports.backbones import BACKBONES, backbone_for, mapping, unknown_categories

HOSTILE = "<script>alert(1)</script>"

NODES_A = [  # node_id, category, method, tier, max_score
    ("n1", "Deployment", "binary", "linear_crud", 10.0),
    ("n2", "DataModel", "weighted", "linear_crud", 5.0),
    ("n3", "ArchitectureQuality", "llm-judge", "workflow_automator", 8.0),
    ("n4", "RBAC", "binary", "workflow_automator", 5.0),
    ("n5", "XMPPSignaling", "binary", "workflow_automator", 2.0),
]
NODES_B = [
    ("m1", "Authentication", "binary", "linear_crud", 4.0),
    ("m2", "API_CRUD", "binary", "linear_crud", 4.0),
    ("m3", "CRUD", "llm-judge", "linear_crud", 6.0),
]


def _nodes(spec, results, *, sweep, trial, task, agent, model, attempt):
    rows = []
    for i, ((nid, cat, method, tier, mx), (status, score)) in enumerate(zip(spec, results)):
        rows.append(
            {
                "sweep_id": sweep,
                "trial_id": trial,
                "task_id": task,
                "agent": agent,
                "model": model,
                "attempt": attempt,
                "node_id": nid,
                "node_index": i,
                "category": cat,
                "subcategory": "",
                "method": method,
                "complexity_tier": tier,
                "status": status,
                "score": score,
                "max_score": mx,
                "message": HOSTILE if nid == "n5" and status != "PASSED" else f"{nid} {status}",
            }
        )
    return rows


def _trial(lake, *, sweep, trial, task, domain, agent, model, attempt, outcome, task_score, nodes=None):
    row = {
        "sweep_id": sweep,
        "trial_id": trial,
        "task_id": task,
        "agent": agent,
        "model": model,
        "attempt": attempt,
        "domain": domain,
        "outcome": outcome,
        "valid": outcome not in aggregate.INFRA_OUTCOMES,
        "task_score": task_score,
    }
    tables = {"trials": [row]}
    if nodes:
        tables["node_results"] = nodes
    write_trial(lake, TrialRows(sweep_id=sweep, trial_id=trial, task_id=task, tables=tables))


ALL_PASSED_A = [("PASSED", 10.0), ("PASSED", 5.0), ("PASSED", 8.0), ("PASSED", 5.0), ("PASSED", 2.0)]


def build_lake(root: Path) -> str:
    lake = str(root / "lake")
    write_sweep(lake, {"sweep_id": "sw1", "name": "golden"})
    write_sweep(lake, {"sweep_id": "sw2", "name": "golden-2"})
    kw = {"sweep": "sw1", "agent": "oh", "model": "m1"}
    _trial(
        lake,
        trial="a0",
        task="taskA",
        domain="CF",
        attempt=0,
        outcome="completed",
        task_score=56.82,
        nodes=_nodes(
            NODES_A,
            [("PASSED", 10.0), ("PASSED", 2.5), ("SKIPPED_LLM", 0.0), ("SKIPPED_DEPENDENCY", 0.0), ("FAILED", 0.0)],
            trial="a0",
            task="taskA",
            attempt=0,
            **kw,
        ),
        **kw,
    )
    _trial(
        lake,
        trial="a1",
        task="taskA",
        domain="CF",
        attempt=1,
        outcome="completed",
        task_score=100.0,
        nodes=_nodes(NODES_A, ALL_PASSED_A, trial="a1", task="taskA", attempt=1, **kw),
        **kw,
    )
    _trial(
        lake,
        trial="b0",
        task="taskB",
        domain="SI",
        attempt=0,
        outcome="completed",
        task_score=42.86,
        nodes=_nodes(
            NODES_B, [("PASSED", 4.0), ("FAILED", 0.0), ("PASSED", 2.0)], trial="b0", task="taskB", attempt=0, **kw
        ),
        **kw,
    )
    _trial(lake, trial="b1", task="taskB", domain="SI", attempt=1, outcome="env_error", task_score=None, **kw)
    kc = {"sweep": "sw1", "agent": "cc", "model": "m2"}
    _trial(
        lake,
        trial="c0",
        task="taskA",
        domain="CF",
        attempt=0,
        outcome="completed",
        task_score=33.33,
        nodes=_nodes(
            NODES_A,
            [("PASSED", 10.0), ("FAILED", 0.0), ("FAILED", 0.0), ("SKIPPED_DEPENDENCY", 0.0), ("FAILED", 0.0)],
            trial="c0",
            task="taskA",
            attempt=0,
            **kc,
        ),
        **kc,
    )
    k2 = {"sweep": "sw2", "agent": "oh", "model": "m1"}
    _trial(
        lake,
        trial="x0",
        task="taskA",
        domain="CF",
        attempt=0,
        outcome="completed",
        task_score=100.0,
        nodes=_nodes(NODES_A, ALL_PASSED_A, trial="x0", task="taskA", attempt=0, **k2),
        **k2,
    )
    _trial(
        lake,
        trial="y0",
        task="taskB",
        domain="SI",
        attempt=0,
        outcome="completed",
        task_score=42.86,
        nodes=_nodes(
            NODES_B, [("FAILED", 0.0), ("PASSED", 4.0), ("PASSED", 2.0)], trial="y0", task="taskB", attempt=0, **k2
        ),
        **k2,
    )
    return lake


@pytest.fixture(scope="module")
def lake(tmp_path_factory) -> str:
    return build_lake(tmp_path_factory.mktemp("agg"))


@pytest.fixture(scope="module")
def report(lake) -> aggregate.SweepReport:
    return aggregate.sweep_report(lake, "sw1")


def _cfg(report, agent):
    return next(c for c in report.configs if c.agent == agent)


# --- backbones --------------------------------------------------------------------------------
def test_backbone_exact_then_prefix_then_seed_patterns() -> None:
    assert backbone_for("APIKey") == "AuthZ"  # exact dictionary beats the API* prefix
    assert backbone_for("API_FHIR") == "API"  # prefix API*
    assert backbone_for("ApiGateway") == "API"  # prefix Api*
    assert backbone_for("BusinessLogic_2FA") == "AuthZ"  # exact beats BusinessLogic*
    assert backbone_for("BusinessLogic_DoubleEntry") == "Logic"
    assert backbone_for("DataModelIndexes") == "Data"
    assert backbone_for("UIConsistency") == "Quality"
    assert backbone_for("AuthorizationPolicies") == "AuthZ"
    assert backbone_for("CacheSystem") == "Data"  # seed Cache*
    assert backbone_for("VaultCRUD") == "API"  # seed *CRUD
    assert backbone_for("OAuth2") == "AuthZ"  # seed OAuth*
    assert backbone_for("SecurityQuality") == "AuthZ"  # seed Security*
    assert backbone_for("XMPPSignaling") is None  # never a silent default
    assert backbone_for("deployment") is None  # case-sensitive, like the paper's dictionary
    assert unknown_categories(["RBAC", "XMPPSignaling", None, "XMPPSignaling"]) == ["", "XMPPSignaling"]


def test_every_paper_seed_is_in_the_data_file() -> None:
    data = mapping()
    exact = {**data["exact"], **data["implied"]}
    patterns = {r["pattern"]: r["backbone"] for r in data["prefix_rules"] + data["seed_patterns"]}
    seeds = {
        "Deploy": "Deployment Setup Build Configuration Maintenance Teardown TestFixture BackgroundJobs CLI",
        "Data": "DataModel* Datasource DatabaseDiscovery Metadata Cache* FileSystem MediaManagement Upload "
        "ImportExport IngestionCLI EventProcessing RLS Lineage",
        "API": "API* CRUD *CRUD GraphQL* tRPC WebSocket Webhook* Realtime NotificationRealtime Search* Action* "
        "ChatSystem TransactionalEmail Validation",
        "Logic": "BusinessLogic* Workflow Cron* Async* Order Cart Subscription Payment Tax Inventory InvoiceLifecycle "
        "ChargeModels BadgeSystem QuestSystem PetMount Recording BreakoutRooms Whiteboard ConferenceFlow "
        "ModerationReview TrustLevel TemplateManagement Plugin HookSystem Sharing",
        "AuthZ": "Authentication Authorization* RBAC AccessControl Permission AuditLog AuditCompliance PasswordPolicy "
        "BruteForceDetection APIKey Security* OAuth* OIDCProtocol SAMLProtocol TokenExchange "
        "IdentityProvider KeyManagement ProtocolMappers UserManagement BusinessLogic_2FA BusinessLogic_Identity",
        "Quality": "ArchitectureQuality Architecture Frontend* UI* EdgeCases ErrorHandling AdminPanel AdminUI "
        "Internationalization Localization ConfigAndAdmin",
    }
    for backbone, names in seeds.items():
        for name in names.split():
            if "*" in name:
                assert patterns.get(name) == backbone, name
            else:
                assert exact.get(name) == backbone, name
                assert backbone_for(name) == backbone, name
    assert set(data["implied"]) == set(data["implied_reasons"])
    assert set(data["backbones"]) == set(BACKBONES)


def test_conformance_categories_all_map() -> None:
    import json

    from shared_data import CONFORMANCE_DIR

    cats = set()
    for dag in Path(CONFORMANCE_DIR).glob("*/dag.json"):
        data = json.loads(dag.read_text())
        for n in data["nodes"] if isinstance(data, dict) else data:
            cats.add((n.get("scoring") or {}).get("category") or n.get("category"))
    assert cats, f"no conformance DAGs under {CONFORMANCE_DIR}"
    assert unknown_categories(cats) == []


# --- golden aggregation -----------------------------------------------------------------------
def test_trial_scores(report) -> None:
    t = {x.trial_id: x for x in report.trials}
    assert t["a0"].task_score == 56.82  # 1250/22 = 56.818..
    assert t["a0"].deterministic_score == 56.82  # no llm-judge node counts (n3 is SKIPPED_LLM anyway)
    assert t["a0"].skipped_llm_max_score == 8.0  # n3's dropped judge maxScore
    assert t["a0"].node_coverage == 40.0  # 2 PASSED / 5 nodes
    assert t["a1"].task_score == 100.0
    assert t["b0"].task_score == 42.86  # 6/14
    assert t["b0"].deterministic_score == 50.0  # m1 + m2: 4/8
    assert t["b1"].task_score is None and t["b1"].effective_score == 0.0 and not t["b1"].valid
    assert report.score_mismatches == []  # the stored trials.task_score agrees with scoring.py


def test_trial_score_equals_scoring_module(lake) -> None:
    """The lake rows, scored through scoring.py directly, give the same numbers as the report."""
    con = connect(lake)
    rows, nodes, _ = aggregate.load_rows(con, ["sw1"])
    rep = aggregate.compute(rows, nodes)
    for t in rep.trials:
        mine = [aggregate.node_result(n) for n in nodes if n["trial_id"] == t.trial_id]
        assert t.task_score == scoring.task_score(mine)
        assert t.deterministic_score == scoring.deterministic_score(mine)


def test_benchmark_valid_vs_all(report) -> None:
    c = _cfg(report, "oh")
    assert (c.valid_trials, c.infra_trials) == (3, 1)
    assert c.outcome_counts == {"completed": 3, "env_error": 1}
    # valid: taskA = (56.8181.. + 100)/2 = 78.4090..; taskB = 42.857..; mean = 60.633.. -> 60.63
    assert c.valid.pass_at_1 == 60.63
    assert c.valid.tasks == 2 and c.valid.trials == 3
    # all: taskB = (42.857.. + 0 [env_error counts 0])/2 = 21.428..; (78.409.. + 21.428..)/2 = 49.918.. -> 49.92
    assert c.all.pass_at_1 == 49.92
    assert c.all.trials == 4
    # deterministic, valid: taskA 78.409..; taskB 50 -> 64.204.. -> 64.2
    assert c.valid.deterministic == 64.2
    # node coverage pooled over node rows: PASSED a0 2 + a1 5 + b0 2 = 9 of 5+5+3 = 13 -> 69.23
    assert c.valid.node_coverage == 69.23
    assert c.all.node_coverage == 69.23  # b1 has no node rows
    assert c.valid.skipped_llm_max_score == 8.0
    sc = c.valid.status_counts
    assert (sc.PASSED, sc.FAILED, sc.SKIPPED_LLM, sc.SKIPPED_DEPENDENCY) == (9, 2, 1, 1)
    assert _cfg(report, "cc").valid.pass_at_1 == 33.33  # 10/30


def test_domains(report) -> None:
    c = _cfg(report, "oh")
    assert c.valid.domains["CF"].score == 78.41  # taskA mean over attempts
    assert c.valid.domains["SI"].score == 42.86  # taskB, valid attempt only
    assert c.all.domains["SI"].score == 21.43  # (42.857.. + 0)/2
    assert report.domains == ["CF", "SI"]
    assert set(_cfg(report, "cc").valid.domains) == {"CF"}


def test_backbones_and_categories(report) -> None:
    b = _cfg(report, "oh").valid.backbones
    assert b["Deploy"].score == 100.0  # n1 10/10 in both attempts
    assert b["Data"].score == 75.0  # n2: a0 2.5/5 = 50, a1 100 -> 75
    # n3 is SKIPPED_LLM in a0 (no percent: that attempt is left out) and 8/8 in a1 -> 100
    assert b["Quality"].score == 100.0
    assert b["Quality"].pooled.skipped_llm_max_score == 8.0
    # taskA: n4 a0 SKIPPED_DEPENDENCY 0/5 = 0, a1 5/5 = 100 -> 50; taskB: m1 4/4 = 100; (50 + 100)/2 = 75
    assert b["AuthZ"].score == 75.0
    assert b["AuthZ"].pooled.percent == 64.29  # pooled: (0+5+4)/(5+5+4) = 9/14 = 64.285..
    assert b["API"].score == 20.0  # m2 0/4 + m3 2/6 = 2/10
    assert "Logic" not in b  # no Logic node in this sweep
    assert report.unknown_categories == ["XMPPSignaling"]
    assert report.unknown_category_nodes == 3  # n5 in a0, a1, c0
    cats = _cfg(report, "oh").valid.categories
    assert cats["DataModel"].score == 75.0
    assert cats["XMPPSignaling"].score == 50.0  # a0 0/2, a1 2/2 -> 50: still scored per category
    tiers = _cfg(report, "oh").valid.complexity_tiers
    # linear_crud: taskA n1+n2: a0 12.5/15 = 83.33.., a1 100 -> 91.66..; taskB 6/14 = 42.857..; mean 67.26..
    assert tiers["linear_crud"].score == 67.26
    assert report.trajectory_available is False and _cfg(report, "oh").valid.trajectories == {}


def test_pass_at_k(report) -> None:
    c = _cfg(report, "oh")
    # valid: taskA n=2, c=1 (a1 reaches 100): pass@1 = 1 - C(1,1)/C(2,1) = 0.5, pass@2 = 1 - C(1,2)/C(2,2) = 1
    #        taskB n=1, c=0: pass@1 = 0.  pass@1 = (0.5 + 0)/2 = 25%; pass@2 over tasks with n >= 2: 100%
    assert c.valid.pass_at_k == {1: 25.0, 2: 100.0}
    # all: taskB n=2 (b1 scores 0), c=0: pass@2 = 0 -> (1 + 0)/2 = 50%
    assert c.all.pass_at_k == {1: 25.0, 2: 50.0}
    assert aggregate.pass_at_k(5, 2, 3) == pytest.approx(1 - math.comb(3, 3) / math.comb(5, 3))  # 0.9


def test_threshold_changes_pass_at_k(lake) -> None:
    rep = aggregate.sweep_report(lake, "sw1", pass_threshold=50.0)
    c = _cfg(rep, "oh")
    # taskA: both attempts >= 50 (56.82, 100): c=2 -> pass@1 = 1; taskB: 42.86 < 50 -> 0; mean 50%
    assert c.valid.pass_at_k[1] == 50.0


def test_voided_cheat_scores_zero() -> None:
    trials = [
        {
            "sweep_id": "s",
            "trial_id": "t",
            "task_id": "k",
            "agent": "a",
            "model": "m",
            "attempt": 0,
            "domain": "DW",
            "outcome": "voided_cheat",
            "task_score": 100.0,
        }
    ]
    nodes = [
        {
            "sweep_id": "s",
            "trial_id": "t",
            "task_id": "k",
            "node_id": "x",
            "category": "Workflow",
            "method": "binary",
            "status": "PASSED",
            "score": 3.0,
            "max_score": 3.0,
        }
    ]
    rep = aggregate.compute(trials, nodes)
    c = rep.configs[0]
    assert c.valid.pass_at_1 == 0.0 and c.valid.node_coverage == 0.0 and c.valid_trials == 1


# --- compare ----------------------------------------------------------------------------------
def test_compare(lake) -> None:
    cmp = aggregate.compare(lake, "sw1", "sw2")
    assert cmp.only_in_a == ["cc / m2"] and cmp.only_in_b == []
    (c,) = cmp.configs
    # taskA: 100 - 78.409.. = 21.5909..; taskB: 42.857.. - 42.857.. = 0; mean 10.795.. -> 10.8
    assert c.tasks == 2 and c.mean_diff == 10.8
    assert c.mean_a == 60.63 and c.mean_b == 71.43
    # with two tasks the bootstrap means are 0, 10.8 or 21.59 (each pair of draws); 2.5%/97.5% quantiles
    # of 10,000 resamples land on the extremes (each has probability 1/4)
    assert (c.ci_low, c.ci_high) == (0.0, 21.59)
    again = aggregate.compare(lake, "sw1", "sw2")
    assert (again.configs[0].ci_low, again.configs[0].ci_high) == (c.ci_low, c.ci_high)  # fixed seed
    ch = {(x.task_id, x.node_id): (x.status_a, x.status_b, x.change) for x in cmp.node_changes}
    # taskA nodes passed in >= half of sw1's attempts and in sw2: unchanged
    assert ch == {("taskB", "m1"): ("PASSED", "FAILED", "lost"), ("taskB", "m2"): ("FAILED", "PASSED", "gained")}


def test_bootstrap_ci_is_deterministic_and_brackets_mean() -> None:
    diffs = [1.0, 2.0, 3.0, 4.0, 10.0]
    lo, hi = aggregate.bootstrap_ci(diffs, resamples=2000, seed=7)
    assert lo < sum(diffs) / len(diffs) < hi
    assert aggregate.bootstrap_ci(diffs, resamples=2000, seed=7) == (lo, hi)
    assert aggregate.bootstrap_ci([]) is None


# --- CLI functions ----------------------------------------------------------------------------
def test_report_and_compare_commands(lake, tmp_path) -> None:
    import typer
    from typer.testing import CliRunner

    from saasbench.cli.results import compare_cmd, report_cmd

    app = typer.Typer()
    app.command("report")(report_cmd)
    app.command("compare")(compare_cmd)
    runner = CliRunner()
    html = tmp_path / "r.html"
    res = runner.invoke(app, ["report", "--sweep", "sw1", "--lake", lake, "--html", str(html)], env={"COLUMNS": "250"})
    assert res.exit_code == 0, res.output
    assert "Table 2" in res.output and "Table 3" in res.output
    assert "60.63" in res.output and "49.92" in res.output and "XMPPSignaling" in res.output
    assert "3/4" in res.output  # valid / all trials
    assert html.is_file()
    res = runner.invoke(app, ["compare", "sw1", "sw2", "--lake", lake], env={"COLUMNS": "250"})
    assert res.exit_code == 0, res.output
    assert "+10.80" in res.output and "gained" in res.output and "lost" in res.output
    res = runner.invoke(app, ["report", "--sweep", "nope", "--lake", lake])
    assert res.exit_code == 2


# --- the breakdown helper is scoring.aggregate ------------------------------------------------
def test_group_aggregate_equals_scoring_aggregate() -> None:
    import random

    from saasbench.evaluation.results import NodeResult, Status

    rng = random.Random(1234)
    statuses = list(Status)
    for _ in range(500):
        nodes = []
        for i in range(rng.randrange(0, 12)):
            mx = rng.choice([0.0, 0.5, 1.0, 2.0, 3.3, 5.0, 10.0, 0.1])
            st = rng.choice(statuses)
            sc = round(rng.uniform(0, mx), 1) if st == Status.PASSED else 0.0
            nodes.append(
                NodeResult(
                    id=f"n{i}",
                    category="C",
                    method=rng.choice(["binary", "llm-judge"]),
                    status=st,
                    score=sc,
                    max_score=mx,
                )
            )
        assert aggregate.group_aggregate(nodes) == scoring.aggregate(nodes)
        assert aggregate.group_percent(nodes) == scoring.aggregate(nodes).percent


# --- the SQL path equals the Python reference path ----------------------------------------------
def _assert_same(a, b, path="report") -> None:
    """Equal structure, key order and values; floats to 1e-9."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), f"{path}: keys {list(a)} != {list(b)}"
        for k in a:
            _assert_same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), (
            f"{path}: lengths {len(a)} != {len(b) if isinstance(b, list) else b}"
        )
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same(x, y, f"{path}[{i}]")
    elif isinstance(a, float) and isinstance(b, float):
        assert (math.isnan(a) and math.isnan(b)) or abs(a - b) <= 1e-9, f"{path}: {a} != {b}"
    else:
        assert type(a) is type(b) or {type(a), type(b)} <= {int, float}, (
            f"{path}: {a!r} ({type(a)}) != {b!r} ({type(b)})"
        )
        assert a == b, f"{path}: {a!r} != {b!r}"


@pytest.mark.parametrize("sweeps", [["sw1"], ["sw2"], ["sw1", "sw2"], ["sw2", "sw1"]])
@pytest.mark.parametrize("threshold", [100.0, 50.0])
def test_sql_path_equals_reference_on_golden(lake, sweeps, threshold) -> None:
    fast = aggregate.sweep_report(lake, sweeps, pass_threshold=threshold)
    ref = aggregate.sweep_report_reference(lake, sweeps, pass_threshold=threshold)
    _assert_same(fast.model_dump(), ref.model_dump())


def _random_rows(seed: int, n_trials: int):
    import random

    rng = random.Random(seed)
    statuses = (
        ["PASSED"] * 5 + ["FAILED"] * 3 + ["ERROR", "SKIPPED_DEPENDENCY", "SKIPPED_LLM", "DRY_RUN", "QUARANTINED"]
    )
    cats = ["Deployment", "DataModel", "RBAC", "API_CRUD", "ArchitectureQuality", "XMPPSignaling", "Workflow", None, ""]
    outcomes = ["completed"] * 6 + ["agent_timeout", "voided_cheat", "env_error", "judge_error", "task_defect", None]
    configs = [("oh", "m1"), ("cc", "m2"), ("oh", None), (None, None)]
    trials, nodes = [], []
    for i in range(n_trials):
        sweep = rng.choice(["s1", "s2"])
        task = f"task{rng.randrange(12)}"
        agent, model = rng.choice(configs)
        outcome = rng.choice(outcomes)
        trials.append(
            {
                "sweep_id": sweep,
                "trial_id": f"t{i}",
                "task_id": task,
                "agent": agent,
                "model": model,
                "attempt": rng.randrange(3),
                "domain": rng.choice(["CF", "SI", "DW", "XX", None, ""]),
                "outcome": outcome,
                "task_score": rng.choice([None, 50.0]),
                "deterministic_score": None,
                "trajectory": rng.choice(["short", "long", None]),
            }
        )
        if outcome == "env_error" and rng.random() < 0.7:
            continue  # mostly no node rows
        for j in range(rng.randrange(0, 15)):
            mx = rng.choice([0.0, 0.1, 0.3, 0.5, 1.0, 2.0, 3.3, 5.0, 10.0, 240.0, None])
            st = rng.choice(statuses + [None])
            sc = round(rng.uniform(0, mx), 1) if st == "PASSED" and mx else rng.choice([0.0, None])
            nodes.append(
                {
                    "sweep_id": sweep,
                    "trial_id": f"t{i}",
                    "task_id": task,
                    "agent": agent,
                    "model": model,
                    "attempt": 0,
                    "node_id": f"n{rng.randrange(20)}.{j}",
                    "node_index": rng.choice([j, 20 - j, None]),
                    "category": rng.choice(cats),
                    "subcategory": "",
                    "method": rng.choice(["binary", "weighted", "llm-judge", None]),
                    "complexity_tier": rng.choice(["linear_crud", "workflow_automator", "", None]),
                    "status": st,
                    "score": sc,
                    "max_score": mx,
                    "message": rng.choice(["", None, "x" * 3000, "m"]),
                }
            )
    for k in range(3):  # orphans: node rows of no trial
        nodes.append({**nodes[k], "trial_id": f"orphan{k}"})
    return trials, nodes


def _con_from_rows(trials, nodes):
    import duckdb
    import pyarrow as pa

    from saasbench.lake import schema as S

    con = duckdb.connect()
    tsch = pa.schema([f for f in S.TRIALS if f.name in aggregate.TRIAL_COLUMNS] + [pa.field("trajectory", pa.string())])
    nsch = pa.schema([f for f in S.NODE_RESULTS if f.name in aggregate.NODE_COLUMNS])
    con.register("t_arrow", pa.Table.from_pylist(trials, schema=tsch))
    con.register("n_arrow", pa.Table.from_pylist(nodes, schema=nsch))
    con.execute("CREATE VIEW trials AS SELECT * FROM t_arrow")
    con.execute("CREATE VIEW node_results AS SELECT * FROM n_arrow")
    return con


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_sql_path_equals_reference_on_random_trials(seed) -> None:
    trials, nodes = _random_rows(seed, 300)
    con = _con_from_rows(trials, nodes)
    for sweeps in (["s1"], ["s1", "s2"]):
        for threshold in (100.0, 40.0):
            fast = aggregate._sql_report(con, sweeps, threshold)
            assert fast is not None
            ref = aggregate.sweep_report_reference(con, sweeps, pass_threshold=threshold)
            _assert_same(fast.model_dump(), ref.model_dump())
            assert aggregate.sweep_report(con, sweeps, pass_threshold=threshold) == fast
    assert ref.trajectory_available and ref.orphan_node_rows == 3 and ref.score_mismatches


def test_sql_path_sums_in_reference_order() -> None:
    """0.1 + 0.2 over 240 rounds to 0.13; a compensated or reordered sum (0.3 / 240 = 0.125) gives 0.12."""
    trials = [
        {
            "sweep_id": "s",
            "trial_id": "t",
            "task_id": "k",
            "agent": "a",
            "model": "m",
            "attempt": 0,
            "domain": "CF",
            "outcome": "completed",
            "task_score": None,
            "deterministic_score": None,
            "trajectory": None,
        }
    ]
    nodes = [
        {
            "sweep_id": "s",
            "trial_id": "t",
            "task_id": "k",
            "node_id": f"n{i}",
            "node_index": i,
            "category": "RBAC",
            "method": "weighted",
            "status": "PASSED",
            "score": sc,
            "max_score": mx,
        }
        for i, (sc, mx) in enumerate([(0.1, 100.0), (0.2, 100.0), (0.0, 40.0)])
    ]
    con = _con_from_rows(trials, nodes)
    fast = aggregate._sql_report(con, ["s"], 100.0)
    assert fast.trials[0].task_score == aggregate.sweep_report_reference(con, ["s"]).trials[0].task_score == 0.13


def test_sql_path_falls_back_for_rows_only_the_reference_handles() -> None:
    trials, nodes = _random_rows(5, 20)
    con = _con_from_rows(trials + [dict(trials[0])], nodes)  # a duplicated trial row
    assert aggregate._sql_report(con, ["s1", "s2"], 100.0) is None
    _assert_same(
        aggregate.sweep_report(con, ["s1", "s2"]).model_dump(),
        aggregate.sweep_report_reference(con, ["s1", "s2"]).model_dump(),
    )
    con = _con_from_rows(trials, nodes + [{**nodes[0], "status": "BOGUS"}])
    assert aggregate._sql_report(con, ["s1", "s2"], 100.0) is None
    with pytest.raises(ValueError):
        aggregate.sweep_report(con, ["s1", "s2"])


def test_sweeps_label_keeps_titles_short() -> None:
    assert aggregate.sweeps_label(["sw1"]) == "sweep sw1"
    assert aggregate.sweeps_label(["sw1", "sw2"]) == "sweeps sw1, sw2"
    many = [f"s{i:03d}" for i in range(200)]
    assert aggregate.sweeps_label(many) == "200 sweeps (s000 ... s199)"
