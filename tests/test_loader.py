"""Bad input for the DAG loader, the execution order, and placeholder resolution.

Every load error must name the file, the node id and the field; warnings and
normalisations are recorded, never silent.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from saasbench.dag import DagLoadError, execution_order, load_dag, load_dag_data
from saasbench.dag.placeholders import UnresolvedPlaceholder, placeholders_in
from saasbench.evaluation.context import RunContext, Target


def make_node(node_id: str, prereqs: list[str] | None = None, **overrides: Any) -> dict[str, Any]:
    node: dict[str, Any] = {
        "id": node_id,
        "prereqs": prereqs or [],
        "steps": [{"type": "P13", "inputs": {"role": "admin"}}],
        "scoring": {"category": "Cat", "subcategory": "", "method": "binary", "maxScore": 1},
    }
    node.update(overrides)
    return node


def write(tmp_path: Path, data: Any, name: str = "dag.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data, indent=2) if not isinstance(data, str) else data)
    return path


def load_error(tmp_path: Path, data: Any) -> DagLoadError:
    path = write(tmp_path, data)
    with pytest.raises(DagLoadError) as info:
        load_dag(path)
    return info.value


# --- errors -------------------------------------------------------------------------------------
def test_malformed_json_names_the_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, '{\n  "nodes": [\n    {"id": "A",,}\n  ]\n}\n', name="broken.json")
    with pytest.raises(DagLoadError) as info:
        load_dag(path)
    message = str(info.value)
    assert str(path) in message
    assert "line 3" in message and "invalid JSON" in message
    assert info.value.issues[0].file == str(path)


def test_unreadable_file_is_an_error_not_a_crash(tmp_path: Path) -> None:
    missing = tmp_path / "nope.json"
    with pytest.raises(DagLoadError) as info:
        load_dag(missing)
    assert str(missing) in str(info.value) and "cannot read" in str(info.value)


@pytest.mark.parametrize(
    ("node", "field", "fragment"),
    [
        (
            make_node("BAD_METHOD", scoring={"category": "C", "method": "vibes", "maxScore": 1}),
            "scoring.method",
            "unknown scoring method 'vibes'",
        ),
        (
            make_node("NEG_MAX", scoring={"category": "C", "method": "binary", "maxScore": -2}),
            "scoring.maxScore",
            "maxScore must be >= 0, got -2",
        ),
        (
            make_node("NAN_MAX", scoring={"category": "C", "method": "binary", "maxScore": "lots"}),
            "scoring.maxScore",
            "maxScore must be a number",
        ),
        ({k: v for k, v in make_node("NO_STEPS").items() if k != "steps"}, "steps", "missing or empty 'steps'"),
        (make_node("EMPTY_STEPS", steps=[]), "steps", "missing or empty 'steps'"),
        ({k: v for k, v in make_node("NO_SCORING").items() if k != "scoring"}, "scoring", "missing 'scoring'"),
        (
            make_node("UNKNOWN_CODE", steps=[{"type": "P13", "inputs": {}}, {"type": "P99", "inputs": {}}]),
            "steps[1].type",
            "unknown primitive code 'P99'",
        ),
        (make_node("NO_CODE", steps=[{"inputs": {}}]), "steps[0].type", "no primitive code"),
        (
            make_node("BAD_INPUTS", steps=[{"type": "P13", "inputs": ["role"]}]),
            "steps[0].inputs",
            "inputs must be an object",
        ),
        ({**make_node("BAD_PREREQS"), "prereqs": [1, 2]}, "prereqs", "list of node ids"),
        (make_node("SELF", prereqs=["SELF"]), "prereqs", "itself"),
    ],
)
def test_each_error_names_file_node_and_field(tmp_path: Path, node: dict, field: str, fragment: str) -> None:
    err = load_error(tmp_path, {"nodes": [make_node("OK"), node]})
    path = str(tmp_path / "dag.json")
    assert len(err.issues) == 1, err.issues
    issue = err.issues[0]
    assert (issue.file, issue.node, issue.field) == (path, node["id"], field)
    assert fragment in issue.message
    # the exception text carries all three as well
    assert str(err) == f"{path} node {node['id']} field {field}: {issue.message}"


def test_duplicate_ids(tmp_path: Path) -> None:
    err = load_error(tmp_path, {"nodes": [make_node("A"), make_node("B"), make_node("A")]})
    assert [(i.node, i.field, i.message) for i in err.issues] == [("A", "id", "duplicate node id")]


def test_node_without_id(tmp_path: Path) -> None:
    err = load_error(tmp_path, {"nodes": [make_node("A"), {"steps": [], "scoring": {}}]})
    assert [(i.node, i.field) for i in err.issues] == [("#1", "id")]
    assert "node #1 has no string 'id'" in str(err)


def test_missing_nodes_list(tmp_path: Path) -> None:
    err = load_error(tmp_path, {"meta": {}})
    assert err.issues[0].field == "nodes" and "missing 'nodes'" in str(err)


def test_cycle_is_printed(tmp_path: Path) -> None:
    err = load_error(
        tmp_path, {"nodes": [make_node("A", ["C"]), make_node("B", ["A"]), make_node("C", ["B"]), make_node("D")]}
    )
    (issue,) = err.issues
    assert issue.field == "prereqs" and issue.node == "A"
    # A needs C, C needs B, B needs A
    assert issue.message == "prerequisite cycle: A -> C -> B -> A"
    assert "A -> C -> B -> A" in str(err)


def test_every_error_is_reported_not_just_the_first(tmp_path: Path) -> None:
    err = load_error(
        tmp_path,
        {
            "nodes": [
                make_node("X", scoring={"category": "C", "method": "nope", "maxScore": 1}),
                make_node("Y", steps=[{"type": "P404"}]),
                make_node("Z", scoring={"category": "C", "method": "binary", "maxScore": -1}),
            ]
        },
    )
    assert [(i.node, i.field) for i in err.issues] == [
        ("X", "scoring.method"),
        ("Y", "steps[0].type"),
        ("Z", "scoring.maxScore"),
    ]


# --- warnings (the DAG still loads) -------------------------------------------------------------
def test_dangling_prereq_is_a_warning_and_the_dag_loads(tmp_path: Path) -> None:
    result = load_dag(write(tmp_path, {"nodes": [make_node("A"), make_node("B", ["A", "GHOST"])]}))
    (warning,) = result.warnings
    assert (warning.node, warning.field) == ("B", "prereqs")
    assert "'GHOST' names no node" in warning.message
    assert result.dag.node("B").prereqs == ["A", "GHOST"]  # kept as written, ignored for gating
    assert [n.id for n in execution_order(result.dag.nodes)] == ["A", "B"]


def test_unknown_node_key_is_kept_in_extras(tmp_path: Path) -> None:
    node = make_node("A", inputs={"pass_threshold": 0.5}, _eval_fix="changed the path")
    result = load_dag(write(tmp_path, {"nodes": [node]}))
    loaded = result.dag.node("A")
    assert loaded.extras == {"inputs": {"pass_threshold": 0.5}, "_eval_fix": "changed the path"}
    # the unknown key is reported; the free-text annotation is not
    assert [(w.node, w.field) for w in result.warnings] == [("A", "inputs")]
    assert "not understood" in result.warnings[0].message


def test_unknown_scoring_and_step_keys_are_warnings(tmp_path: Path) -> None:
    node = make_node(
        "A",
        scoring={"category": "C", "method": "binary", "maxScore": 1, "weight": 2},
        steps=[{"type": "P13", "inputs": {}, "note": "x"}],
    )
    result = load_dag(write(tmp_path, {"nodes": [node]}))
    assert sorted(w.field for w in result.warnings) == ["scoring.weight", "steps[0].note"]
    assert result.dag.node("A").scoring.extras == {"weight": 2}


def test_meta_totals_that_disagree_are_warnings_and_node_sums_win(tmp_path: Path) -> None:
    nodes = [
        make_node("A", scoring={"category": "Auth", "method": "binary", "maxScore": 3}),
        make_node("B", scoring={"category": "API", "method": "binary", "maxScore": 4}),
    ]
    data = {
        "meta": {"total_nodes": 3, "total_maxScore": 10},
        "scoring_config": {"total_max_score": 7, "categories": {"Auth": 5, "API": {"maxScore": 4, "node_count": 2}}},
        "nodes": nodes,
    }
    result = load_dag(write(tmp_path, data))
    fields = sorted(w.field for w in result.warnings)
    assert fields == [
        "meta.total_maxScore",
        "meta.total_nodes",
        "scoring_config.categories.API",
        "scoring_config.categories.Auth",
    ]
    by_field = {w.field: w.message for w in result.warnings}
    assert "says 10, nodes sum to 7" in by_field["meta.total_maxScore"]
    assert "says 3, the file has 2 nodes" in by_field["meta.total_nodes"]
    assert "maxScore 5 disagrees with node sum 3" in by_field["scoring_config.categories.Auth"]
    assert "node_count 2 disagrees with 1 nodes" in by_field["scoring_config.categories.API"]
    assert result.dag.total_max_score == 7  # 3 + 4: the node sum wins


def test_agreeing_totals_are_silent(tmp_path: Path) -> None:
    data = {"meta": {"total_nodes": 1, "total_max_score": 1}, "nodes": [make_node("A")]}
    assert load_dag(write(tmp_path, data)).issues == []


# --- normalisations ----------------------------------------------------------------------------
def test_legacy_constructs_are_normalised_and_recorded(tmp_path: Path) -> None:
    legacy = {
        "id": "LEGACY",
        "primitive_chain": [{"primitive": "P13", "inputs": {"role": "admin"}}],
        "scoring": {"category": "C", "method": "llm_judge", "max_score": 4},
        "_run_last": True,
    }
    other = {
        "id": "OTHER",
        "steps": [{"type": "P13"}],
        "max_score": 2,
        "scoring": {"category": "C", "method": "llm-as-judge"},
    }
    result = load_dag(write(tmp_path, [legacy, other]))
    node = result.dag.node("LEGACY")
    assert node.steps[0].type == "P13" and node.steps[0].inputs == {"role": "admin"}
    assert node.method == "llm-judge" and node.max_score == 4 and node.run_last is True
    assert result.dag.node("OTHER").max_score == 2 and result.dag.node("OTHER").method == "llm-judge"
    recorded = {(i.node, i.field) for i in result.normalisations}
    assert recorded == {
        (None, None),  # bare list of nodes wrapped as {nodes: [...]}
        ("LEGACY", "primitive_chain"),  # primitive_chain -> steps
        ("LEGACY", "steps[0].primitive"),  # step key primitive -> type
        ("LEGACY", "scoring.method"),  # llm_judge -> llm-judge
        ("LEGACY", "scoring.max_score"),  # scoring.max_score -> scoring.maxScore
        ("LEGACY", "_run_last"),  # _run_last -> run_last
        ("OTHER", "scoring.method"),  # llm-as-judge -> llm-judge
        ("OTHER", "max_score"),  # node-level max_score -> scoring.maxScore
    }
    assert result.warnings == []
    messages = " | ".join(i.message for i in result.normalisations)
    assert "'llm_judge' -> 'llm-judge'" in messages and "'primitive_chain' -> 'steps'" in messages


def test_node_level_max_score_that_disagrees_is_a_warning(tmp_path: Path) -> None:
    node = make_node("A", max_score=9)
    result = load_dag(write(tmp_path, {"nodes": [node]}))
    assert result.dag.node("A").max_score == 1  # scoring.maxScore wins
    assert [(w.node, w.field) for w in result.warnings] == [("A", "max_score")]


def test_nodes_keyed_by_id_and_string_prereqs(tmp_path: Path) -> None:
    data = {
        "nodes": {
            "A": {k: v for k, v in make_node("A").items() if k != "id"},
            "B": {**{k: v for k, v in make_node("B").items() if k != "id"}, "prereqs": "A"},
        }
    }
    result = load_dag(write(tmp_path, data))
    assert [n.id for n in result.dag.nodes] == ["A", "B"] and result.dag.node("B").prereqs == ["A"]
    assert {i.field for i in result.normalisations} == {None, "prereqs"}


def test_the_demo_dag_loads_cleanly() -> None:
    path = Path(__file__).resolve().parent / "apps" / "teamnotes_dag.json"
    result = load_dag(path)
    assert [str(i) for i in result.issues] == []
    assert len(result.dag.nodes) == result.dag.meta["total_nodes"]
    assert result.dag.total_max_score == result.dag.meta["total_maxScore"]
    assert not any(n.method == "llm-judge" for n in result.dag.nodes)  # the demo runs without a judge


# --- execution order ---------------------------------------------------------------------------
def order(nodes: list[dict[str, Any]]) -> list[str]:
    return [n.id for n in execution_order(load_dag_data({"nodes": nodes}).dag.nodes)]


def test_ties_keep_file_order() -> None:
    assert order([make_node("Z"), make_node("A"), make_node("M")]) == ["Z", "A", "M"]
    # C and B become ready at once when A finishes: file order (C before B) decides, not the alphabet
    assert order([make_node("A"), make_node("C", ["A"]), make_node("B", ["A"])]) == ["A", "C", "B"]


def test_prerequisites_run_first_even_when_they_come_later_in_the_file() -> None:
    nodes = [make_node("D", ["B"]), make_node("A"), make_node("B", ["A"]), make_node("C")]
    # A is the first ready node; B becomes ready after it and precedes C in the file; then D
    assert order(nodes) == ["A", "B", "D", "C"]


def test_run_last_nodes_go_last_in_file_order() -> None:
    nodes = [
        make_node("LOGOUT", run_last=True),
        make_node("A"),
        make_node("ROTATE", _run_last=True),
        make_node("B", ["A"]),
    ]
    assert order(nodes) == ["A", "B", "LOGOUT", "ROTATE"]


def test_a_node_that_needs_a_run_last_node_waits_for_it() -> None:
    nodes = [make_node("AFTER", ["LOGOUT"]), make_node("LOGOUT", run_last=True), make_node("A")]
    assert order(nodes) == ["A", "LOGOUT", "AFTER"]


def test_order_is_stable_across_runs() -> None:
    nodes = [make_node(f"N{i}", [f"N{i - 3}"] if i >= 3 else []) for i in range(12)]
    first = order(nodes)
    assert all(order(nodes) == first for _ in range(5))
    assert first == [f"N{i}" for i in range(12)]


# --- placeholders ------------------------------------------------------------------------------
@pytest.fixture
def ctx() -> RunContext:
    c = RunContext(
        Target(base_url="http://app.test:8000/"),
        variables={
            "n": 5,
            "name": "Ann",
            "flag": True,
            "nothing": None,
            "obj": {"b": {"c": [10, 20]}},
            "xs": ["first", "second"],
            "edges": [{"node": {"id": "e0"}}],
            "saved": {"status": 201, "body": {"id": 7, "result": {"uuid": "u-1"}}},
            "a.b": "flat",
            "OVERRIDE": "from-var",
            "EMPTY": "",
        },
        env_defaults={"OVERRIDE": "from-env", "ONLY_ENV": "env-value", "EMPTY": "env-for-empty"},
    )
    c.nodes["CREATE_NODE"] = {"status": "PASSED", "created_id": 42, "id": 42, "response_body": {"name": "x"}}
    return c


def test_whole_string_placeholder_takes_the_raw_value(ctx: RunContext) -> None:
    assert ctx.resolve("{{n}}") == 5
    assert ctx.resolve("{{flag}}") is True
    assert ctx.resolve("{{nothing}}") is None
    assert ctx.resolve("{{obj}}") == {"b": {"c": [10, 20]}}
    assert ctx.resolve("{{obj.b.c}}") == [10, 20]
    assert ctx.resolve("{{CREATE_NODE.created_id}}") == 42


def test_placeholders_inside_text_are_spliced_as_text(ctx: RunContext) -> None:
    assert ctx.resolve("id={{n}}") == "id=5"
    assert ctx.resolve("{{name}}-{{n}}") == "Ann-5"
    assert ctx.resolve("flag={{flag}} none={{nothing}}") == "flag=true none=null"
    assert ctx.resolve("c={{obj.b.c}}") == "c=[10, 20]"
    assert ctx.resolve("/api/items/{{CREATE_NODE.id}}/notes") == "/api/items/42/notes"


def test_paths_indexes_and_scopes(ctx: RunContext) -> None:
    assert ctx.resolve("{{xs[0]}}") == "first"
    assert ctx.resolve("{{xs[1]}}") == "second"
    assert ctx.resolve("{{obj.b.c[1]}}") == 20
    assert ctx.resolve("{{edges.0.node.id}}") == "e0"  # numeric dotted index
    assert ctx.resolve("{{edges[0].node.id}}") == "e0"
    assert ctx.resolve("{{saved.id}}") == 7  # a response record falls through to its body
    assert ctx.resolve("{{saved.body.result.uuid}}") == "u-1"
    assert ctx.resolve("{{a.b}}") == "flat"  # a flat key stored with a dot
    assert ctx.resolve("{{base_url}}") == "http://app.test:8000"
    ctx.node_scope["name"] = "node-local"  # the running node's captures win
    assert ctx.resolve("{{name}}") == "node-local"


def test_nested_structures_are_resolved(ctx: RunContext) -> None:
    value = {"a": ["{{n}}", {"b": "x{{n}}"}], "c": 3, "d": None}
    assert ctx.resolve(value) == {"a": [5, {"b": "x5"}], "c": 3, "d": None}


def test_app_template_syntax_is_left_untouched(ctx: RunContext) -> None:
    sql = "SELECT * FROM t WHERE owner = '{{ current_username() }}'"
    assert ctx.resolve(sql) == sql
    assert ctx.resolve("{{ name }}") == "{{ name }}"  # spaces: not ours
    assert ctx.resolve("{{}}") == "{{}}"
    assert placeholders_in(sql) == []


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("{{missing}}", "{{missing}}"),
        ("/api/{{missing.id}}/x", "{{missing.id}}"),
        ("{{xs[5]}}", "{{xs[5]}}"),
        ("{{CREATE_NODE.nope}}", "{{CREATE_NODE.nope}}"),
        ("{{obj.b.zzz}}", "{{obj.b.zzz}}"),
        ("${NOT_SET}", "${NOT_SET}"),
        ("prefix ${NOT_SET} suffix", "${NOT_SET}"),
    ],
)
def test_unresolved_placeholders_raise_and_name_themselves(ctx: RunContext, text: str, named: str) -> None:
    with pytest.raises(UnresolvedPlaceholder) as info:
        ctx.resolve(text)
    assert info.value.placeholder == named
    assert named in str(info.value)


def test_shell_placeholders(ctx: RunContext) -> None:
    assert ctx.resolve("${ONLY_ENV:-fallback}") == "env-value"  # meta.env_defaults
    assert ctx.resolve("${OVERRIDE:-fallback}") == "from-var"  # a run variable (--var) beats env_defaults
    assert ctx.resolve("${UNSET:-/api/v1}/users") == "/api/v1/users"  # the inline default
    assert ctx.resolve("${UNSET:-}") == ""  # an empty default is a value
    assert ctx.resolve("${EMPTY:-dflt}") == "dflt"  # an empty variable takes the default
    assert ctx.resolve("${n}") == 5  # whole string: raw value
    assert ctx.resolve("${API:-/api}/{{xs[0]}}") == "/api/first"


def test_placeholders_in_lists_every_expression() -> None:
    value = {"path": "/a/{{x.y}}/{{z[0]}}", "h": ["${V:-d}"]}
    assert placeholders_in(value) == ["{{x.y}}", "{{z[0]}}", "${V}"]


def test_state_read_without_a_dependency_is_a_warning() -> None:
    """{{OTHER.created_id}} or another node's capture without a prerequisite is order-dependent."""

    def n(node_id: str, steps: list, prereqs: list | None = None) -> dict:
        return {
            "id": node_id,
            "prereqs": prereqs or [],
            "steps": steps,
            "scoring": {"category": "CRUD", "method": "binary", "maxScore": 1},
        }

    make = n("MAKE", [{"type": "P04", "inputs": {"method": "POST", "path": "/x", "save_as": "thing"}}])
    declared = n("DECLARED", [{"type": "P04", "inputs": {"path": "/x/{{MAKE.created_id}}/{{thing.id}}"}}], ["MAKE"])
    transitive = n("TRANSITIVE", [{"type": "P04", "inputs": {"path": "/x/{{thing.created_id}}"}}], ["DECLARED"])
    by_node = n("BY_NODE", [{"type": "P04", "inputs": {"path": "/x/{{MAKE.created_id}}"}}])
    by_capture = n(
        "BY_CAPTURE",
        [{"type": "P15", "inputs": {}}, {"type": "P04", "inputs": {"path": "/x/{{thing.created_id}}/{{thing.id}}"}}],
    )
    own = n(
        "OWN",
        [
            {"type": "P04", "inputs": {"method": "POST", "path": "/y", "save_as": "mine"}},
            {"type": "P04", "inputs": {"path": "/y/{{mine.created_id}}"}},
        ],
    )
    result = load_dag_data({"nodes": [make, declared, transitive, by_node, by_capture, own]})
    found = [(i.node, i.field) for i in result.issues if i.kind == "warning" and "order-dependent" in i.message]
    assert found == [("BY_NODE", "steps[0].inputs"), ("BY_CAPTURE", "steps[1].inputs")]
