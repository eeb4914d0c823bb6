"""A self-contained HTML page of charts: the reports' style, plotly.js's basic bundle inline
(vendored in `vendor/`: see its README), one copy of the chart template, no network."""

from __future__ import annotations

import functools
import html
import itertools
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
import plotly.io as pio
from plotly.io.json import to_json_plotly

from latlab.units import MISSING, number

PLOTLY_JS = Path(__file__).parent / "vendor" / "plotly-basic.min.js"
BUNDLE_TRACES = frozenset({"scatter", "bar", "pie"})
TEMPLATE = "plotly_white"
PLOT_CONFIG = {"displaylogo": False, "responsive": True}
STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0 auto;
max-width:1100px;padding:1rem 2rem;color:#222}
h1{font-size:1.5rem}h2{font-size:1.2rem;margin-top:2rem;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:.9rem}td,th{padding:.2rem .6rem;text-align:right}
td:first-child,th:first-child{text-align:left}tr:nth-child(even){background:#f6f6f6}
.note{background:#fff6e0;padding:.4rem .8rem;margin:.3rem 0;border-left:4px solid #e0901a}
.finding{border-left:6px solid;padding:.3rem 1rem;margin:.8rem 0;background:#fafafa}
.badge{color:#fff;padding:0 .4rem;border-radius:3px;font-size:.8rem;text-transform:uppercase}
.dim{color:#777}pre{background:#f6f6f6;padding:.8rem;overflow:auto;font-size:.8rem}
.ci{color:#777;font-size:.75rem;white-space:nowrap}.warn{color:#b45309}
table.settings td{text-align:left;font-family:ui-monospace,monospace;font-size:.8rem}
"""

_chart_ids = itertools.count(1)


def e(text: str) -> str:
    """`text` escaped for HTML."""
    return html.escape(text, quote=True)


@functools.cache
def plotly_js() -> str:
    return PLOTLY_JS.read_text(encoding="utf-8")


@functools.cache
def _template_json() -> str:
    return to_json_plotly(pio.templates[TEMPLATE].to_plotly_json())


def document(title: str, body: list[str]) -> str:
    """A page of `body`'s HTML parts with the style, plotly.js and the charts' template."""
    return (f"<!DOCTYPE html><html lang=en><head><meta charset=utf-8>"
            f"<title>{e(title)}</title><style>{STYLE}</style>"
            f"<script>{plotly_js()}</script>"
            f"<script>var LATLAB_TEMPLATE={_template_json()};</script></head>"
            f"<body>{''.join(body)}</body></html>")


def chart(fig: go.Figure | None, about: str) -> str:
    """A figure with its caption, for `document` (the template is the page's, not each
    figure's own copy)."""
    if fig is None:
        return ""
    figure = fig.to_plotly_json()
    unknown = {t.get("type", "scatter") for t in figure["data"]} - BUNDLE_TRACES
    if unknown:
        raise ValueError(f"trace types {sorted(unknown)} are not in the plotly.js bundle "
                         f"(only {sorted(BUNDLE_TRACES)}): see latlab/report/vendor/README.md")
    layout = {k: v for k, v in figure["layout"].items() if k != "template"}
    div = f"chart-{next(_chart_ids)}"
    height = layout.get("height")
    style = f"height:{height}px;width:100%" if height else "width:100%"
    return (f"<p class=dim>{e(about)}</p>"
            f"<div id={div} class=\"plotly-graph-div\" style=\"{style}\"></div>"
            f"<script>Plotly.newPlot(\"{div}\",{to_json_plotly(figure['data'])},"
            f"Object.assign({{template:LATLAB_TEMPLATE}},{to_json_plotly(layout)}),"
            f"{to_json_plotly(PLOT_CONFIG)});</script>")


def settings_table(data: dict[str, Any]) -> str:
    """Nested settings (a config's JSON) as one row per setting, `bench.arrivals.rate`."""
    rows = "".join(f"<tr><td>{e(key)}</td><td>{e(value)}</td></tr>"
                   for key, value in _flatten(data, ""))
    return f"<table class=settings>{rows}</table>"


def _flatten(data: Any, prefix: str) -> list[tuple[str, str]]:
    if isinstance(data, dict) and data:
        return [row for key, value in data.items()
                for row in _flatten(value, f"{prefix}.{key}" if prefix else str(key))]
    if isinstance(data, list) and any(isinstance(v, (dict, list)) for v in data):
        return [row for i, value in enumerate(data) for row in _flatten(value, f"{prefix}.{i}")]
    return [(prefix, setting(data))]


def setting(value: Any) -> str:
    """One setting as text: "none" for an empty list or mapping, "–" for a missing value."""
    if value is None:
        return MISSING
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return number(value, "{:d}")
    if isinstance(value, float):
        return number(value, "{:.10g}")
    if isinstance(value, (list, tuple, dict)):
        return ", ".join(setting(v) for v in value) or "none"
    return str(value)
