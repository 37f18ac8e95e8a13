"""A self-contained HTML report of a sweep: the paper's Table 2 and Table 3 plus SVG charts.

One file, no URL of any kind (not even the SVG namespace, which HTML5 does not need): inline
CSS, inline SVG drawn here, no script. A
Content-Security-Policy meta tag (``default-src 'none'``) additionally forbids the page from
loading or running anything. Every string that comes from the lake (agent and model names, task
and node ids, categories, node messages written by untrusted apps) goes through
:func:`html.escape`.
"""

from __future__ import annotations

import datetime as _dt
import html
from collections.abc import Sequence
from pathlib import Path

from saasbench.reports.aggregate import DOMAINS, SweepReport, sweeps_label
from saasbench.reports.backbones import BACKBONES, backbone_for

PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac")
STATUS_COLORS = {
    "PASSED": "#59a14f",
    "FAILED": "#e15759",
    "ERROR": "#b07aa1",
    "SKIPPED_DEPENDENCY": "#f28e2b",
    "SKIPPED_LLM": "#bab0ac",
    "DRY_RUN": "#76b7b2",
    "QUARANTINED": "#9c755f",
}
STATUSES = tuple(STATUS_COLORS)

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem;color:#222;max-width:1200px}
h1{font-size:1.5rem}h2{font-size:1.2rem;margin-top:2rem;border-bottom:1px solid #ddd;padding-bottom:.2rem}
table{border-collapse:collapse;margin:.5rem 0;font-size:.9rem}
th,td{border:1px solid #ccc;padding:.25rem .5rem;text-align:right;vertical-align:top}
th{background:#f3f3f3}td.l,th.l{text-align:left}
td.msg{text-align:left;white-space:pre-wrap;word-break:break-word;max-width:40rem;font-family:monospace;font-size:.8rem}
.note{color:#555;font-size:.85rem}.warn{color:#a00}
svg{display:block;margin:.5rem 0}svg text{font-size:11px;fill:#333}
"""


def _e(value: object) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _num(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def _table(
    table_id: str, head: Sequence[str], rows: Sequence[Sequence[str]], *, left: int = 1, caption: str = ""
) -> str:
    """``rows`` cells are already-escaped HTML; ``head`` is escaped here. First ``left`` columns left-aligned."""
    th = "".join(f'<th class="l">{_e(h)}</th>' if i < left else f"<th>{_e(h)}</th>" for i, h in enumerate(head))
    body = "".join(
        "<tr>" + "".join(f'<td class="l">{c}</td>' if i < left else f"<td>{c}</td>" for i, c in enumerate(r)) + "</tr>"
        for r in rows
    )
    cap = f'<caption class="note">{_e(caption)}</caption>' if caption else ""
    return f'<table id="{_e(table_id)}">{cap}<thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>'


def grouped_bar_chart(
    chart_id: str,
    groups: Sequence[str],
    series: Sequence[tuple[str, Sequence[float | None]]],
    *,
    y_max: float = 100.0,
    title: str = "",
) -> str:
    """Grouped vertical bars: one group per x label, one bar per series (missing values: no bar)."""
    n_series = max(1, len(series))
    bar_w, gap = 14, 18
    group_w = n_series * bar_w + gap
    left, top, plot_h, bottom = 40, 24, 180, 40
    width = left + max(1, len(groups)) * group_w + 20
    legend_h = 16 * len(series)
    height = top + plot_h + bottom + legend_h
    top_val = max([y_max] + [v for _, vals in series for v in vals if v is not None]) or 1.0
    out = [
        (
            f'<svg id="{_e(chart_id)}" class="chart" width="{width}" '
            f'height="{height}" role="img" aria-label="{_e(title)}">'
        )
    ]
    if title:
        out.append(f'<text x="{left}" y="14" font-weight="bold">{_e(title)}</text>')
    for tick in range(5):
        v = top_val * tick / 4
        y = top + plot_h - plot_h * tick / 4
        out.append(
            f'<line x1="{left}" x2="{width - 10}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>'
            f'<text x="{left - 4}" y="{y + 4:.1f}" text-anchor="end">{v:.0f}</text>'
        )
    for gi, g in enumerate(groups):
        gx = left + gi * group_w + gap / 2
        for si, (name, vals) in enumerate(series):
            bar = vals[gi] if gi < len(vals) else None
            if bar is None:
                continue
            h = plot_h * max(bar, 0.0) / top_val
            x = gx + si * bar_w
            y = top + plot_h - h
            out.append(
                f'<rect class="bar" data-series="{_e(name)}" data-group="{_e(g)}" x="{x:.1f}" y="{y:.1f}" '
                f'width="{bar_w - 2}" height="{h:.1f}" fill="{PALETTE[si % len(PALETTE)]}">'
                f"<title>{_e(name)} - {_e(g)}: {bar:.2f}</title></rect>"
            )
        out.append(
            f'<text x="{gx + n_series * bar_w / 2:.1f}" y="{top + plot_h + 14}" text-anchor="middle">{_e(g)}</text>'
        )
    out.append(f'<line x1="{left}" x2="{width - 10}" y1="{top + plot_h}" y2="{top + plot_h}" stroke="#999"/>')
    for si, (name, _vals) in enumerate(series):
        y = top + plot_h + bottom + si * 16
        out.append(
            f'<rect x="{left}" y="{y - 9}" width="10" height="10" fill="{PALETTE[si % len(PALETTE)]}"/>'
            f'<text x="{left + 14}" y="{y}">{_e(name)}</text>'
        )
    out.append("</svg>")
    return "".join(out)


def stacked_bar_chart(chart_id: str, rows: Sequence[tuple[str, dict[str, int]]], *, title: str = "") -> str:
    """One horizontal 100%-stacked bar per row (share of node statuses), segments in STATUSES order."""
    label_w, bar_len, row_h, top = 220, 600, 22, 24
    height = top + len(rows) * row_h + 30
    width = label_w + bar_len + 20
    out = [
        (
            f'<svg id="{_e(chart_id)}" class="chart" width="{width}" '
            f'height="{height}" role="img" aria-label="{_e(title)}">'
        )
    ]
    if title:
        out.append(f'<text x="0" y="14" font-weight="bold">{_e(title)}</text>')
    for ri, (label, counts) in enumerate(rows):
        y = top + ri * row_h
        out.append(f'<text x="{label_w - 6}" y="{y + 14}" text-anchor="end">{_e(label)}</text>')
        total = sum(counts.values())
        x = float(label_w)
        for st in STATUSES:
            c = counts.get(st, 0)
            if not c or not total:
                continue
            w = bar_len * c / total
            out.append(
                f'<rect class="bar" data-status="{st}" x="{x:.1f}" y="{y}" width="{w:.1f}" height="{row_h - 6}" '
                f'fill="{STATUS_COLORS[st]}"><title>{_e(label)} - {st}: {c} ({100 * c / total:.1f}%)</title></rect>'
            )
            x += w
    ly = top + len(rows) * row_h + 16
    lx = label_w
    for st in STATUSES:
        out.append(
            f'<rect x="{lx}" y="{ly - 9}" width="10" height="10" fill="{STATUS_COLORS[st]}"/>'
            f'<text x="{lx + 13}" y="{ly}">{st}</text>'
        )
        lx += 13 + 7 * len(st) + 12
    out.append("</svg>")
    return "".join(out)


def _table2_rows(report: SweepReport, domains: Sequence[str]) -> list[list[str]]:
    rows = []
    for c in report.configs:
        v = c.valid
        rows.append(
            [_e(c.label), _num(v.pass_at_1), _num(v.node_coverage)]
            + [_num(v.domains[d].score) if d in v.domains else "n/a" for d in domains]
        )
    return rows


def _table3_rows(report: SweepReport) -> list[list[str]]:
    return [
        [_e(c.label)] + [_num(c.valid.backbones[b].score) if b in c.valid.backbones else "n/a" for b in BACKBONES]
        for c in report.configs
    ]


def render(report: SweepReport, *, title: str | None = None, generated_at: str | None = None) -> str:
    """The report page as one HTML string."""
    domains = [d for d in DOMAINS] + [d for d in report.domains if d not in DOMAINS]
    title = title or f"SaaSBench report: {sweeps_label(report.sweeps)}"
    generated_at = generated_at or _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
    labels = [c.label for c in report.configs]
    parts = [
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">',
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">",
        f"<title>{_e(title)}</title><style>{CSS}</style></head><body>",
        f"<h1>{_e(title)}</h1>",
        (
            f'<p class="note">Sweeps: {_e(", ".join(report.sweeps))}. Generated {_e(generated_at)}. '
            "Scores are over valid trials (infra outcomes env_error, judge_error, model_error, task_defect excluded) "
            "unless marked "
            "&quot;all&quot;; Pass@1 is the mean over tasks of the task score (mean over attempts first).</p>"
        ),
        "<h2>Table 2: main results</h2>",
        _table("table2", ["Agent / model", "Pass@1", "Node coverage", *domains], _table2_rows(report, domains)),
        grouped_bar_chart(
            "chart-domain",
            domains,
            [
                (c.label, [c.valid.domains[d].score if d in c.valid.domains else None for d in domains])
                for c in report.configs
            ],
            title="Score per domain (valid trials)",
        ),
        "<h2>Table 3: engineering capability backbones</h2>",
        _table("table3", ["Agent / model", *BACKBONES], _table3_rows(report)),
        grouped_bar_chart(
            "chart-backbone",
            list(BACKBONES),
            [
                (c.label, [c.valid.backbones[b].score if b in c.valid.backbones else None for b in BACKBONES])
                for c in report.configs
            ],
            title="Score per backbone (valid trials)",
        ),
        "<h2>Node status distribution</h2>",
        stacked_bar_chart(
            "chart-status",
            [(c.label, c.valid.status_counts.model_dump()) for c in report.configs],
            title="Share of node statuses (valid trials)",
        ),
        "<h2>Trials: denominators, all-trials score, deterministic subscore, dropped judge maxScore</h2>",
        _trials_table(report),
    ]
    if any(len(c.valid.pass_at_k) > 1 for c in report.configs):
        kmax = max(len(c.valid.pass_at_k) for c in report.configs)
        parts.append(f"<h2>pass@k (task score &ge; {_num(report.pass_threshold)})</h2>")
        parts.append(
            _table(
                "passk",
                ["Agent / model", *[f"pass@{k}" for k in range(1, kmax + 1)]],
                [[_e(c.label)] + [_num(c.valid.pass_at_k.get(k)) for k in range(1, kmax + 1)] for c in report.configs],
            )
        )
    parts.append("<h2>Categories</h2>")
    cats = sorted({k for c in report.configs for k in c.valid.categories})
    parts.append(
        _table(
            "categories",
            ["Category", "Backbone", *labels],
            [
                [_e(k), _e(backbone_for(k) or "unknown")]
                + [_num(c.valid.categories[k].score) if k in c.valid.categories else "" for c in report.configs]
                for k in cats
            ],
            left=2,
        )
    )
    if report.unknown_categories:
        parts.append(
            f'<p class="warn" id="unknown-categories">Categories with no backbone ({report.unknown_category_nodes} '
            "node rows; counted in task scores, absent from Table 3): "
            + ", ".join(f"<code>{_e(c)}</code>" for c in report.unknown_categories)
            + "</p>"
        )
    if report.score_mismatches:
        parts.append(
            f'<p class="warn">{len(report.score_mismatches)} trial(s) whose stored task_score differs from '
            "the recomputation from their node rows: "
            + ", ".join(
                f"{_e(m.trial_id)} ({_num(m.stored)} vs {_num(m.recomputed)})" for m in report.score_mismatches[:20]
            )
            + "</p>"
        )
    parts.append("<h2>Nodes not passed</h2>")
    parts.append(
        _table(
            "nodes",
            ["Agent / model", "Task", "Trial", "Node", "Category", "Status", "Message"],
            [
                [
                    _e(f"{i.agent or '-'} / {i.model or '-'}"),
                    _e(i.task_id),
                    _e(i.trial_id),
                    _e(i.node_id),
                    _e(i.category),
                    _e(i.status),
                    f'<span class="msg">{_e(i.message)}</span>',
                ]
                for i in report.node_issues
            ],
            left=7,
        )
    )
    parts.append("</body></html>")
    return "\n".join(parts).replace('<td class="l"><span class="msg">', '<td class="msg"><span class="msg">')


def _trials_table(report: SweepReport) -> str:
    outcomes = sorted({o for c in report.configs for o in c.outcome_counts})
    rows = [
        [
            _e(c.label),
            str(c.all.trials),
            str(c.valid_trials),
            str(c.infra_trials),
            str(c.valid.tasks),
            _num(c.all.pass_at_1),
            _num(c.valid.deterministic),
            _num(c.valid.skipped_llm_max_score),
        ]
        + [str(c.outcome_counts.get(o, 0)) for o in outcomes]
        for c in report.configs
    ]
    return _table(
        "trials",
        [
            "Agent / model",
            "Trials",
            "Valid",
            "Infra (excluded)",
            "Tasks (valid)",
            "Pass@1 (all trials)",
            "Deterministic",
            "Dropped judge maxScore",
            *outcomes,
        ],
        rows,
    )


def write_html(report: SweepReport, path: Path, **kwargs) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(report, **kwargs), encoding="utf-8")
    return path


__all__ = ["grouped_bar_chart", "render", "stacked_bar_chart", "write_html"]
