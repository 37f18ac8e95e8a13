"""Assertion, file, judge and permission dialects of the full public DAGs (issue #13, part A).

Each snippet reproduces a construct of a public SaaSBench DAG (task id named in the test) so CI
covers it without the public files: it must load with zero errors, every rewrite must be listed as
a normalisation, every DAG defect must be a warning naming the field, and where behaviour matters
the step is run both on data that satisfies it and on data that does not. The meaning of each
construct is the one of the task's own reference harness (docs/dag-semantics.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
from dialects import clean, kinds, load, run
from localhttp import serve_http

from saasbench.evaluation.context import RunContext, RunOptions, Target
from saasbench.evaluation.results import StepResult
from saasbench.primitives.registry import REGISTRY
from saasbench.services.http import HttpResponse
from saasbench.services.judge import JudgeVerdict


# --- helpers -----------------------------------------------------------------------------------------
def doc_ctx(document: Any) -> RunContext:
    ctx = RunContext(Target())
    ctx.last_document = document
    return ctx


def p07(document: Any, *assertions: dict[str, Any]) -> StepResult:
    return run(doc_ctx(document), "P07", {"assertions": list(assertions)})


def response(
    path: str = "/x",
    status: int = 200,
    text: str = "{}",
    body: Any = None,
    method: str = "GET",
    headers: dict[str, str] | None = None,
) -> HttpResponse:
    return HttpResponse(
        method=method,
        url=f"http://app.test{path}",
        status=status,
        headers=headers or {"content-type": "application/json"},
        text=text,
        body=body if body is not None else text,
        is_json=body is not None,
        elapsed_ms=1.0,
    )


# --- P07: store_as (cvyocaao operator, dfhjkeb/iyjruvfz/rjhcjrst key) ----------------------------------
CVYOCAAO_STORE = {"path": "$.access_token", "operator": "store_as", "key": "sa_access_token"}


def test_p07_operator_store_as_loads_as_op_store() -> None:
    clean(
        "P07", {"assertions": [CVYOCAAO_STORE]}, "operator 'store_as' with key -> op store, save_as 'sa_access_token'"
    )
    model = REGISTRY.spec("P07").inputs.model_validate({"assertions": [CVYOCAAO_STORE]})
    assert (model.assertions[0].op, model.assertions[0].save_as) == ("store", "sa_access_token")


def test_p07_operator_store_as_captures_first_element_then_id() -> None:
    ctx = doc_ctx({"access_token": "tok-1"})
    assert run(ctx, "P07", {"assertions": [CVYOCAAO_STORE]}).passed and ctx.vars["sa_access_token"] == "tok-1"
    ctx = doc_ctx([{"id": "u-1", "username": "x"}, {"id": "u-2"}])  # GET /users?username=... then store $[0].id or $
    assert run(ctx, "P07", {"assertions": [{"path": "$", "operator": "store_as", "key": "uid"}]}).passed
    assert ctx.vars["uid"] == "u-1"
    ctx = doc_ctx([{"name": "other", "id": 1}, {"name": "eval-parent-group", "id": 7}])  # CRUD_GROUP filter path
    step = {"path": "$[?(@.name=='eval-parent-group')].id", "operator": "store_as", "key": "parent_group_id"}
    assert run(ctx, "P07", {"assertions": [step]}).passed and ctx.vars["parent_group_id"] == 7


def test_p07_operator_store_as_fails_when_there_is_nothing_to_store() -> None:
    ctx = doc_ctx({"error": "invalid_client"})
    result = run(ctx, "P07", {"assertions": [CVYOCAAO_STORE]})
    assert not result.passed and "nothing to store under 'sa_access_token'" in result.message
    assert "sa_access_token" not in ctx.vars


def test_defects_load_with_a_warning_and_make_the_node_error() -> None:
    defects = [  # (code, inputs, warning fragment): steps that cannot mean anything
        ("P07", {"assertions": [{"path": "$.id", "operator": "store_as"}]}, "names no 'key' to store the value under"),
        ("P07", {"assertions": [{"path": [1, 2]}]}, "is a list holding no path string"),
        (
            "P02",
            {"path": "package.json", "patterns": [{"all_of": ["x"]}]},
            "each entry is a string or {any_of: [strings]}",
        ),
        ("P02", {"path": "package.json"}, "the step searches for nothing"),
    ]
    for code, inputs, fragment in defects:
        assert not kinds(code, inputs, "error"), (code, inputs)
        warnings = kinds(code, inputs, "warning")
        assert len(warnings) == 1 and fragment in warnings[0] and "ERROR at run time" in warnings[0], warnings
        node = load({"type": "P15", "inputs": {}}, {"type": code, "inputs": inputs}).dag.nodes[0]
        assert node.defects and fragment in node.defects[0]
    from saasbench.evaluation.engine import Engine

    report = Engine(
        load({"type": "P07", "inputs": {"assertions": [{"path": "$.id", "operator": "store_as"}]}}).dag,
        RunContext(Target()),
    ).run()
    assert report.nodes[0].status.value == "ERROR" and "names no 'key'" in report.nodes[0].message


def test_p07_assertion_key_store_as_is_save_as() -> None:
    dfhjkeb = {"path": "$.customer.id", "store_as": "crud_cid"}  # alone: the value must be there (dfhjkeb)
    clean("P07", {"assertions": [dfhjkeb]}, "assertion 'store_as' -> save_as")
    ctx = doc_ctx({"customer": {"id": "cus_1"}})
    assert run(ctx, "P07", {"assertions": [dfhjkeb]}).passed and ctx.vars["crud_cid"] == "cus_1"
    ctx = doc_ctx({"customer": {}})
    assert not run(ctx, "P07", {"assertions": [dfhjkeb]}).passed and "crud_cid" not in ctx.vars
    iyjruvfz = {
        "path": "$.data.uid",
        "expected_pattern": "^[1-9A-HJ-NP-Za-km-z]{22}$",
        "store_as": "${PREV_BOOKING_UID}",
    }
    clean(
        "P07",
        {"assertions": [iyjruvfz]},
        "assertion 'store_as' -> save_as",
        "assertion 'expected_pattern' -> op matches_regex",
    )
    ctx = doc_ctx({"data": {"uid": "a" * 22}})
    assert run(ctx, "P07", {"assertions": [iyjruvfz]}).passed and ctx.vars["PREV_BOOKING_UID"] == "a" * 22
    assert ctx.resolve("/bookings/${PREV_BOOKING_UID}") == "/bookings/" + "a" * 22
    assert not p07({"data": {"uid": "0OIl"}}, iyjruvfz).passed


# --- P07: new operators ----------------------------------------------------------------------------------
def test_p07_min_value_is_gte_on_numbers_and_numeric_strings() -> None:
    lgzivily = {"path": "$.data.id", "match_type": "min_value", "expected": 1}
    clean("P07", {"assertions": [lgzivily]}, "operator key 'match_type' -> op")
    assert p07({"data": {"id": 12}}, lgzivily).passed and p07({"data": {"id": "3"}}, lgzivily).passed
    assert not p07({"data": {"id": 0}}, lgzivily).passed and not p07({"data": {}}, lgzivily).passed
    sgdoserd = {"path": "$.counts.MessageWillBePosted", "min_value": 1}  # the bare key form
    clean("P07", {"assertions": [sgdoserd]}, "assertion 'min_value' -> op gte")
    assert p07({"counts": {"MessageWillBePosted": 2}}, sgdoserd).passed
    assert not p07({"counts": {"MessageWillBePosted": 0}}, sgdoserd).passed


def test_p07_numeric_string_needs_a_string_number_equal_to_expected() -> None:
    step = {"path": "$.data.attributes.amount", "expected": "300", "match_type": "numeric_string"}  # rjhcjrst
    clean("P07", {"assertions": [step]})
    assert p07({"data": {"attributes": {"amount": "300.000000000000"}}}, step).passed
    assert not p07({"data": {"attributes": {"amount": 300}}}, step).passed  # a JSON number is not a numeric string
    assert not p07({"data": {"attributes": {"amount": "301"}}}, step).passed
    assert not p07({"data": {"attributes": {"amount": "n/a"}}}, step).passed
    rate = {"path": "$.rate", "expected_numeric": 1.085, "tolerance": 0.0001, "match_type": "numeric_string"}
    clean("P07", {"assertions": [rate]}, "'expected_numeric' -> expected")
    assert p07({"rate": "1.085040000000"}, rate).passed and not p07({"rate": "1.09"}, rate).passed


def test_p07_array_min_length_needs_an_array() -> None:
    step = {"path": "$.keys", "operator": "array_min_length", "expected": 2}  # cvyocaao OIDC_JWKS_KEYS
    clean("P07", {"assertions": [step]}, "operator 'array_min_length' -> length_gte with expected_type array")
    assert p07({"keys": [{"kid": 1}, {"kid": 2}]}, step).passed
    assert not p07({"keys": [{"kid": 1}]}, step).passed and not p07({"keys": "abcdef"}, step).passed
    gavmyneb = {"path": "$", "array_min_length": 3}  # the bare key form
    clean("P07", {"assertions": [gavmyneb]}, "assertion 'array_min_length' -> op length_gte")
    assert p07([1, 2, 3], gavmyneb).passed and not p07({"a": 1, "b": 2, "c": 3}, gavmyneb).passed


def test_p07_any_match_checks_each_matched_value() -> None:
    currency = {"path": "$..currency_code", "match_type": "any_match", "expected": "EUR"}  # rjhcjrst API_SUMMARY_BASIC
    typed = {
        "path": "$..monetary_value",
        "type": "string",
        "match_type": "any_match",
        "comment": "strings, never numbers",
    }
    names = {"path": "$[*].name", "match_type": "any_match", "expected": "EvalPAT"}
    clean("P07", {"assertions": [currency, typed, names]})
    summary = {
        "a": {"currency_code": "USD", "monetary_value": 1},
        "b": {"currency_code": "EUR", "monetary_value": "2.00"},
    }
    assert p07(summary, currency, typed).passed
    assert not p07({"a": {"currency_code": "USD"}}, currency).passed
    assert not p07({"a": {"monetary_value": 1}}, typed).passed  # no matched value is a string
    assert p07([{"name": "x"}, {"name": "EvalPAT (2024)"}], names).passed  # a string may contain it
    assert not p07([{"name": "x"}], names).passed and not p07([], names).passed


def test_p07_type_operators_contains_all_and_eq_or_empty() -> None:
    is_object = {"path": "$", "operator": "is_object"}  # ghmkznee
    is_string = {"path": "$.error", "operator": "is_string"}  # cvyocaao
    clean("P07", {"assertions": [is_object, is_string]}, "operator 'is_object' -> has_type object")
    assert p07({"error": "invalid_grant"}, is_object, is_string).passed
    assert not p07([], is_object).passed and not p07({"error": {"code": 1}}, is_string).passed
    grants = {"path": "$.grant_types_supported", "operator": "contains_all", "expected": ["password", "refresh_token"]}
    clean("P07", {"assertions": [grants]}, "operator 'contains_all' -> contains")
    assert p07({"grant_types_supported": ["password", "refresh_token", "x"]}, grants).passed
    assert not p07({"grant_types_supported": ["password"]}, grants).passed
    clear = {"path": "$.api.data.message", "expected": None, "operator": "eq_or_empty"}  # gmdnohlg USER_STATUS_CLEAR
    clean("P07", {"assertions": [clear]})
    for ok in ({"api": {"data": {}}}, {"api": {"data": {"message": None}}}, {"api": {"data": {"message": ""}}}):
        assert p07(ok, clear).passed, ok
    assert not p07({"api": {"data": {"message": "on holiday"}}}, clear).passed
    named = {"path": "$.m", "expected": "hi", "operator": "eq_or_empty"}
    assert p07({"m": "hi"}, named).passed and p07({"m": []}, named).passed and not p07({"m": "ho"}, named).passed


def test_p07_type_object_or_array() -> None:
    step = {"path": "$", "type": "object_or_array"}  # sgdoserd (29 nodes)
    clean("P07", {"assertions": [step]}, "assertion 'type' -> expected_type")
    assert p07({}, step).passed and p07([1], step).passed
    assert not p07("ok", step).passed and not p07(None, step).passed


def test_p07_type_exists() -> None:
    kmasmnil = {"path": "$.data.organizationId", "expected": "{{org_id}}", "type": "exists"}  # AUTH_API_KEY
    clean("P07", {"assertions": [kmasmnil]}, "type 'exists' beside another check -> dropped")
    ctx = doc_ctx({"data": {"organizationId": "org-1"}})
    ctx.capture("org_id", "org-1")
    assert run(ctx, "P07", {"assertions": [kmasmnil]}).passed
    ctx.last_document = {"data": {"organizationId": "org-2"}}
    assert not run(ctx, "P07", {"assertions": [kmasmnil]}).passed
    alone = {"path": "$.data.id", "type": "exists"}
    clean("P07", {"assertions": [alone]}, "type 'exists' -> op exists")
    assert p07({"data": {"id": 1}}, alone).passed and not p07({"data": {}}, alone).passed


def test_p07_expected_and_pattern_together() -> None:
    gmdnohlg = {
        "path": "$.api.data.expiration",
        "expected": "2030-12-31",
        "operator": "regex_match",
        "pattern": r"^\d{4}-\d{2}-\d{2}",
    }
    warnings = kinds("P07", {"assertions": [gmdnohlg]}, "warning")
    assert not kinds("P07", {"assertions": [gmdnohlg]}, "error")
    assert len(warnings) == 1 and "the pattern is matched and the expected value is ignored" in warnings[0]
    assert warnings[0].startswith("steps[0].inputs: P07:")
    assert p07({"api": {"data": {"expiration": "2031-01-05 00:00:00"}}}, gmdnohlg).passed  # the pattern decides
    assert not p07({"api": {"data": {"expiration": "never"}}}, gmdnohlg).passed
    kmasmnil = {"path": "$.data.id", "expected": "matches_regex", "pattern": "^[a-z0-9]{25}$"}  # CRUD_CONTACT
    warnings = kinds("P07", {"assertions": [kmasmnil]}, "warning")
    assert not kinds("P07", {"assertions": [kmasmnil]}, "error")
    assert len(warnings) == 1 and "names the operator matches_regex" in warnings[0]
    assert p07({"data": {"id": "a" * 25}}, kmasmnil).passed and not p07({"data": {"id": "A-1"}}, kmasmnil).passed
    both = {"path": "$.x", "expected": "a", "pattern": "b"}  # no operator names either: still a real error
    assert kinds("P07", {"assertions": [both]}, "error")


def test_p07_path_list_is_path_any_of() -> None:
    step = {
        "path": ["$.data.uid", "$.data[0].uid"],
        "expected_pattern": "^u",
        "store_as": "${TEST_BOOKING_UID}",
    }  # iyjruvfz
    clean("P07", {"assertions": [step]}, "'path' given as a list -> path_any_of")
    ctx = doc_ctx({"data": [{"uid": "u-9"}]})
    assert run(ctx, "P07", {"assertions": [step]}).passed and ctx.vars["TEST_BOOKING_UID"] == "u-9"
    assert not p07({"data": {"uid": "x"}}, step).passed


def test_p07_bare_bound_and_flag_keys() -> None:
    cases = [  # (assertion, passing document, failing document)
        ({"path": "$", "type": "array", "min_length": 1}, [1], []),  # sgdoserd, hhrdixum
        ({"path": "$.data", "max_length": 2}, {"data": [1, 2]}, {"data": [1, 2, 3]}),  # rjhcjrst
        ({"path": "$.token", "not_exists": True}, {"id": 1}, {"token": "t"}),  # sgdoserd
        (
            {"path": "$.first.id", "expected_eq": "$.second.id"},
            {"first": {"id": 1}, "second": {"id": 1}},
            {"first": {"id": 1}, "second": {"id": 2}},
        ),  # sgdoserd
        ({"path": "$.errors", "empty_or_absent": True}, {"data": {}}, {"errors": [{"message": "boom"}]}),  # gavmyneb
        (
            {"path": "$.product.variants", "expected_not_empty": True},
            {"product": {"variants": [1]}},
            {"product": {"variants": []}},
        ),
        ({"path": "$.returns", "expected_length_gte": 1}, {"returns": [1]}, {"returns": []}),  # dfhjkeb
    ]
    for step, good, bad in cases:
        clean("P07", {"assertions": [step]})
        assert p07(good, step).passed, step
        assert not p07(bad, step).passed, step


# --- P01 / P02 -------------------------------------------------------------------------------------------
@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    (tmp_path / "resources/views/v2/layout").mkdir(parents=True)
    (tmp_path / "resources/views/v2/layout/default.twig").write_text("<html>{% block content %}{% endblock %}</html>")
    (tmp_path / "package.json").write_text(
        '{"devDependencies": {"TypeScript": "5"}, "dependencies": {"@medusajs/framework": "2"}}'
    )
    return tmp_path


def ws_ctx(root: Path) -> RunContext:
    return RunContext(Target(workspace=root))


def test_p01_any_of(workspace: Path) -> None:
    rjhcjrst = {
        "any_of": ["resources/views/layouts/app.blade.php", "resources/views/v2/layout/default.twig"],
        "type": "file",
    }
    assert not kinds("P01", rjhcjrst, "error")
    assert any("'any_of' -> 'path_any_of'" in n for n in kinds("P01", rjhcjrst, "normalisation"))
    assert run(ws_ctx(workspace), "P01", rjhcjrst).passed
    assert not run(ws_ctx(workspace), "P01", {"any_of": ["a.php", "b.twig"]}).passed


def test_p02_patterns_all_of_with_any_of_groups(workspace: Path) -> None:
    dfhjkeb = {"path": "package.json", "patterns": ["typescript", {"any_of": ["@nestjs/core", "@medusajs", "express"]}]}
    clean("P02", dfhjkeb, "'patterns' -> every pattern must be found", "'patterns' without match_type -> icontains")
    result = run(ws_ctx(workspace), "P02", dfhjkeb)
    assert result.passed, result.message
    assert not run(
        ws_ctx(workspace), "P02", {"path": "package.json", "patterns": ["typescript", {"any_of": ["koa", "hono"]}]}
    ).passed
    assert not run(ws_ctx(workspace), "P02", {"path": "package.json", "patterns": ["typescript", "fastify"]}).passed


def test_p02_without_path_searches_the_last_response() -> None:
    cvyocaao = {"match_type": "contains", "pattern": "EntityDescriptor"}  # SAML_METADATA: P04 then P02
    clean("P02", cvyocaao, "no path -> source last_response")
    ctx = RunContext(Target())
    assert not run(ctx, "P02", cvyocaao).passed  # no response yet: fails, says why
    ctx.set_response(
        response("/realms/master/protocol/saml/descriptor", text='<md:EntityDescriptor entityID="x">', body=None)
    )
    assert run(ctx, "P02", cvyocaao).passed
    ctx.set_response(response(text="<html>not found</html>"))
    result = run(ctx, "P02", cvyocaao)
    assert not result.passed and "not found in the last response" in result.message


def test_p02_output_var_searches_the_last_command_output() -> None:
    sgdoserd = {
        "output_var": "stdout",
        "match_type": "regex",
        "pattern": r"^(0600|600) /(?:tmp|var/run)/[A-Za-z0-9_-]+\.sock",
    }
    clean("P02", sgdoserd, "'output_var' -> source command_output")
    ctx = RunContext(Target())
    ctx.last_document = {
        "exit_code": 0,
        "stdout": "600 /tmp/mm_local.sock\n",
        "stderr": "",
        "output": "600 /tmp/mm_local.sock\n",
    }
    assert run(ctx, "P02", sgdoserd).passed
    ctx.last_document = {"exit_code": 1, "stdout": "NO_SOCKET_FOUND\n", "stderr": "", "output": "NO_SOCKET_FOUND\n"}
    assert not run(ctx, "P02", sgdoserd).passed
    ctx.last_document = {"status": 200}  # the last step ran no command
    assert "no command output" in run(ctx, "P02", sgdoserd).message


# --- P17 evidence types -------------------------------------------------------------------------------------
PUBLIC_EVIDENCE = {  # every evidence_type value of the 23 public DAGs -> what this engine collects
    "code_files": "code_files",
    "screenshot": "screenshot",
    "rendered_dom": "rendered_dom",
    "http_response_body": "http_response_body",
    "api_response": "http_response_body",
    "http_response_json": "http_response_body",
    "multi_endpoint_responses": "http_response_body",
    "page_html": "rendered_dom",
    "code_files_and_config": "code_files",
    "api_responses": "http_exchanges",
    "http_responses": "http_exchanges",
    "http_response_payload": "http_exchanges",
    "http_response_headers": "http_response_headers",
    "db_query_result": "db_query_result",
    "directory_listing": "directory_listing",
    "logs": "logs",
    "container_logs": "logs",
}


@pytest.mark.parametrize("public, canonical", sorted(PUBLIC_EVIDENCE.items()))
def test_p17_every_public_evidence_type_loads(public: str, canonical: str) -> None:
    inputs = {"evidence_type": public, "rubric_prompt": "Judge it.", "score_range": [0, 5]}
    assert not kinds("P17", inputs, "error")
    assert REGISTRY.spec("P17").inputs.model_validate(inputs).evidence_type == canonical
    warnings = kinds("P17", inputs, "warning")
    assert bool(warnings) == (canonical == "logs"), warnings  # only the uncollected kind warns


class FakeJudge:
    def __init__(self) -> None:
        self.evidence: list[str] = []

    def score(self, rubric: str, evidence: str, score_range: Any, **_: Any) -> JudgeVerdict:
        self.evidence.append(evidence)
        return JudgeVerdict(score=3, score_range=tuple(score_range), model="fake", prompt_hash="h", evidence_digest="d")


def judged(ctx: RunContext, inputs: dict[str, Any]) -> tuple[StepResult, str]:
    judge = FakeJudge()
    ctx.judge, ctx.options.judge_enabled = judge, True
    result = run(ctx, "P17", {"rubric_prompt": "Judge it. Score 0-5.", **inputs})
    return result, (judge.evidence[-1] if judge.evidence else "")


def test_p17_http_exchanges_from_the_response_log() -> None:
    ctx = RunContext(Target(), options=RunOptions())
    log = [
        response("/realms/master/.well-known/openid-configuration", text='{"issuer": "x"}'),
        response("/admin/realms", status=401, text='{"error": "HTTP 401 Unauthorized"}'),
        response("/realms/master/protocol/openid-connect/certs", text='{"keys": []}'),
    ]
    ctx.set_response(log[-1])
    ctx.response_log = [dataclasses.replace(r, body=None) for r in log]  # RunContext.set_response's light copies
    cvyocaao = {"evidence_type": "api_responses", "api_path_filters": ["/.well-known/openid-configuration", "/certs"]}
    result, evidence = judged(ctx, cvyocaao)
    assert result.passed and "2 HTTP exchange(s)" in evidence and "openid-configuration -> 200" in evidence
    assert "/admin/realms" not in evidence
    result, evidence = judged(ctx, {"evidence_type": "http_responses"})  # ghmkznee: the whole log
    assert result.passed and "/admin/realms -> 401" in evidence and "HTTP 401 Unauthorized" in evidence
    result, evidence = judged(ctx, {"evidence_type": "api_responses", "api_path_filters": ["/nothing-matches"]})
    assert "3 HTTP exchange(s)" in evidence  # no exchange matches: all of them, as the reference does


def test_p17_http_exchanges_without_a_log_uses_the_last_response() -> None:
    ctx = RunContext(Target(), options=RunOptions())
    ctx.set_response(response("/api/v1/projects/99999/", status=404, text='{"detail": "Not found."}'))
    ctx.__dict__.pop("response_log", None)  # a context that keeps no log
    result, evidence = judged(ctx, {"evidence_type": "http_response_payload"})
    assert result.passed and "Not found." in evidence and "-> 404" in evidence
    assert "only the last response is kept" in evidence
    empty = RunContext(Target(), options=RunOptions())
    empty.__dict__.pop("response_log", None)
    result, _ = judged(empty, {"evidence_type": "http_response_payload"})
    assert not result.passed and "no HTTP exchange" in result.message


def test_p17_http_response_headers_with_source_files(tmp_path: Path) -> None:
    (tmp_path / "app/controllers").mkdir(parents=True)
    (tmp_path / "app/controllers/application_controller.rb").write_text("protect_from_forgery with: :exception\n")
    ctx = RunContext(Target(workspace=tmp_path), options=RunOptions())
    ctx.set_response(
        response(
            "/login/canvas",
            text="<html/>",
            headers={"content-security-policy": "default-src 'self'", "x-frame-options": "SAMEORIGIN"},
        )
    )
    gavmyneb = {
        "evidence_type": "http_response_headers",
        "files_to_sample": ["app/controllers/application_controller.rb"],
    }
    result, evidence = judged(ctx, gavmyneb)
    assert result.passed and "content-security-policy: default-src 'self'" in evidence
    assert "protect_from_forgery" in evidence
    result, evidence = judged(RunContext(Target(), options=RunOptions()), {"evidence_type": "http_response_headers"})
    assert not result.passed and "no HTTP response" in result.message


def test_p17_db_query_result_judges_the_last_rows() -> None:
    ctx = doc_ctx(
        {"rows": [{"user": "admin", "event": "patient-record-insert", "success": 1}], "count": 1, "rowcount": 1}
    )
    result, evidence = judged(ctx, {"evidence_type": "db_query_result"})
    assert result.passed and "patient-record-insert" in evidence and "1 row(s)" in evidence
    result, _ = judged(doc_ctx({"status": 200}), {"evidence_type": "db_query_result"})
    assert not result.passed and "no database query result" in result.message


def test_p17_directory_listing(tmp_path: Path) -> None:
    for rel in (
        "apps/web/page.tsx",
        "apps/api/v2/src/main.ts",
        "packages/prisma/schema.prisma",
        "node_modules/x/index.js",
    ):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x")
    iyjruvfz = {"evidence_type": "directory_listing", "base_dir": "/app", "depth": 2}
    clean("P17", {**iyjruvfz, "rubric_prompt": "x"}, "base_dir '/app' -> '.'")
    result, evidence = judged(RunContext(Target(workspace=tmp_path), options=RunOptions()), iyjruvfz)
    assert result.passed and "apps/web/" in evidence and "packages/prisma/" in evidence and "node_modules/" in evidence
    assert (
        "apps/web/page.tsx" not in evidence and "node_modules/x/" not in evidence
    )  # depth 2; skipped folder not entered
    deeper = {"evidence_type": "directory_listing", "base_dir": "/app/apps/api", "depth": 3}
    result, evidence = judged(RunContext(Target(workspace=tmp_path), options=RunOptions()), deeper)
    assert result.passed and "v2/src/main.ts" in evidence
    result, _ = judged(
        RunContext(Target(workspace=tmp_path), options=RunOptions()), {**deeper, "base_dir": "/app/missing"}
    )
    assert not result.passed and "not found" in result.message


def test_p17_container_logs_warns_and_is_judge_skipped() -> None:
    xayqujrv = {
        "evidence_type": "container_logs",
        "files_to_sample": [],
        "rubric_prompt": "Inspect the logs.",
        "score_range": [0, 8],
    }
    warnings = kinds("P17", xayqujrv, "warning")
    assert (
        len(warnings) == 1
        and "keeps no log text" in warnings[0]
        and warnings[0].startswith("steps[0].inputs.evidence_type")
    )
    result, _ = judged(RunContext(Target(), options=RunOptions()), xayqujrv)
    assert result.judge_skipped and not result.passed


def test_p17_json_and_page_html_aliases_collect_the_reference_evidence() -> None:
    ctx = RunContext(Target(), options=RunOptions())
    ctx.set_response(
        response("/apis/default/api/patient", status=400, text='{"validationErrors": {"fname": "required"}}')
    )
    result, evidence = judged(ctx, {"evidence_type": "http_response_json"})
    assert result.passed and "validationErrors" in evidence
    ctx.capture("rendered_dom", "<main><h1>Segments</h1></main>")
    result, evidence = judged(ctx, {"evidence_type": "page_html"})
    assert result.passed and "<h1>Segments</h1>" in evidence


# --- P14 expected_result not_denied (sgdoserd) -----------------------------------------------------------
class _Statuses(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server API
        code = int(self.path.strip("/").split("/")[-1] or 200)
        body = b'{"ok": true}'
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def status_app() -> Iterator[str]:
    with serve_http(_Statuses) as url:
        yield url


def test_p14_not_denied_loads() -> None:
    sgdoserd = {"action": "GET /api/v4/brand/image", "expected_result": "not_denied"}
    assert not kinds("P14", sgdoserd, "error") and not kinds("P14", sgdoserd, "warning")
    assert REGISTRY.spec("P14").inputs.model_validate(sgdoserd).outcome == "not_denied"
    with_status = {**sgdoserd, "expected_status": 200}
    assert any("ignores expected_status" in w for w in kinds("P14", with_status, "warning"))


def test_p14_not_denied_passes_anything_but_401_and_403(status_app: str) -> None:
    ctx = RunContext(Target(base_url=status_app))
    for code, passed in ((200, True), (404, True), (400, True), (501, True), (401, False), (403, False)):
        result = run(ctx, "P14", {"action": f"GET /brand/{code}", "expected_result": "not_denied"})
        assert result.passed is passed, (code, result.message)
