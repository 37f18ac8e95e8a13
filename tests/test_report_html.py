"""The HTML report, opened in headless Chromium: tables render, SVG charts have bars, nothing leaves
the page, and a hostile node message shows as text (never runs)."""

from __future__ import annotations

import html
import re
from pathlib import Path

import pytest
from test_aggregate import HOSTILE, build_lake

from saasbench.reports import aggregate
from saasbench.reports.report_html import (
    grouped_bar_chart,
    render,
    stacked_bar_chart,
    write_html,
)

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]


@pytest.fixture(scope="module")
def page_file(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("html")
    report = aggregate.sweep_report(build_lake(root), "sw1")
    return write_html(report, root / "report.html", generated_at="2026-12-02T00:00:00+00:00")


def test_static_page_is_self_contained(page_file: Path) -> None:
    text = page_file.read_text()
    assert "<script" not in text.replace(html.escape(HOSTILE), "")  # the only "script" is the escaped message
    assert html.escape(HOSTILE) in text
    assert not re.search(r"(src|href)\s*=\s*[\"']?(https?:)?//", text)  # no external URL
    assert "http:" not in text and "https:" not in text and "//" not in text  # not even a namespace URI
    assert "@import" not in text and "url(" not in text
    assert "default-src 'none'" in text


def test_every_lake_string_is_escaped() -> None:
    evil = '"><img src=x onerror=alert(1)>'
    report = aggregate.compute(
        [
            {
                "sweep_id": "s",
                "trial_id": "t",
                "task_id": evil,
                "agent": evil,
                "model": evil,
                "attempt": 0,
                "domain": evil,
                "outcome": "completed",
            }
        ],
        [
            {
                "sweep_id": "s",
                "trial_id": "t",
                "task_id": evil,
                "node_id": evil,
                "category": evil,
                "method": "binary",
                "status": "FAILED",
                "score": 0.0,
                "max_score": 1.0,
                "message": evil,
            }
        ],
    )
    page = render(report)
    assert "<img" not in page and html.escape(evil) in page
    svg = grouped_bar_chart("c", [evil], [(evil, [1.0])]) + stacked_bar_chart("s", [(evil, {"PASSED": 1})])
    assert "<img" not in svg


def test_page_in_headless_chromium(page_file: Path) -> None:
    assert Path(CHROMIUM).exists(), "Debian chromium is needed (scripts/test.sh installs it)"
    from playwright import sync_api

    blocked: list[str] = []
    dialogs: list[str] = []

    def route(r) -> None:
        if r.request.url.startswith("file://"):
            r.continue_()
        else:
            blocked.append(r.request.url)
            r.abort()

    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            page = browser.new_page()
            page.route("**/*", route)
            page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
            page.goto(page_file.as_uri())
            page.wait_for_load_state("load")

            assert page.locator("#table2 tbody tr").count() == 2  # oh / m1 and cc / m2
            assert page.locator("#table2 thead th").count() == 9  # label, Pass@1, coverage, 6 domains
            assert page.locator("#table3 tbody tr").count() == 2
            assert page.locator("#table3 thead th").count() == 7  # label + six backbones
            assert page.locator("#trials tbody tr").count() == 2
            row = page.locator("#table2 tbody tr", has_text="oh / m1").first
            assert "60.63" in row.inner_text() and "69.23" in row.inner_text()

            for chart in ("#chart-domain", "#chart-backbone", "#chart-status"):
                assert page.locator(f"svg{chart}").count() == 1
                assert page.locator(f"svg{chart} rect.bar").count() > 0, chart
            # domain chart: oh has CF and SI, cc has CF -> 3 bars; backbone: oh 5 + cc 4 -> 9 bars
            assert page.locator("#chart-domain rect.bar").count() == 3
            assert page.locator("#chart-backbone rect.bar").count() == 9
            box = page.locator("#chart-status rect.bar").first.bounding_box()
            assert box and box["width"] > 0 and box["height"] > 0

            cells = page.locator("#nodes tbody td", has_text=HOSTILE)
            assert cells.count() >= 1  # shown as text
            assert page.locator("#nodes script").count() == 0  # never parsed as a tag
            assert page.locator("body script").count() == 0
            assert "XMPPSignaling" in page.locator("#unknown-categories").inner_text()
        finally:
            browser.close()
    assert blocked == []
    assert dialogs == []


def test_no_browser_needed_for_render_of_empty_report() -> None:
    page = render(aggregate.compute([], []))
    assert '<table id="table2">' in page and "<svg" in page
