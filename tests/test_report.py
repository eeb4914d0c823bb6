"""The reports: terminal budget and findings, CSV/Parquet export, `latlab report`, and the HTML
reports (a run's and a sweep's) opened in headless Chromium with every non-file request
blocked, and a screenshot taken."""

import os
import re
from pathlib import Path

import pyarrow.csv
import pyarrow.parquet
import pytest
from rich.console import Console
from timelines import eventful, steady, timeline, write_run
from typer.testing import CliRunner

from latlab.analysis import analyze
from latlab.analysis.decompose import COMPONENTS, decompose
from latlab.cli import app
from latlab.records.folder import read_json
from latlab.records.sweep import SWEEP_JSON, SweepRecord
from latlab.records.timeline import Outcome
from latlab.report.budget_bars import print_budget
from latlab.report.console import print_findings
from latlab.report.export import request_table, write_csv, write_parquet
from latlab.report.html import write_html
from latlab.report.sweep_html import write_sweep_html

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
RENDER_TIMEOUT_S = 240

# The page was 5.0 MB with plotly.js's full bundle (4.8 MB of it); with the basic bundle
# (1.19 MB) the eventful run's page is 1.28 MB and a 2,100-request run's 1.46 MB.
MAX_PAGE_BYTES = 1_500_000
LEGACY_SWEEP = Path(__file__).parent / "fixtures" / "legacy-0.1.0" / "sweep"
WINDOWED = {"rate": 10.0, "warmup_s": 0.2, "cooldown_s": 0.2,
            "slos": {"ttft": 30.0, "e2e_sched": 200.0}}
NEW_CHARTS = ("Distributions (CDF)", "Every request on the run's clock", "How requests ended")


def test_terminal_budget_and_findings(tmp_path):
    a = analyze(write_run(tmp_path, eventful()))
    console = Console(record=True, width=120, color_system=None)
    print_budget(console, a, full=True)
    print_findings(console, a)
    text = console.export_text()
    for bucket in ("network", "queue & overhead", "prefill", "decode"):
        assert bucket in text
    assert f"p99 tail (n={a.tail.n})" in text and "unattributed" in text
    assert a.findings and all(f.title in text for f in a.findings)


def test_terminal_without_successful_requests(tmp_path):
    a = analyze(write_run(tmp_path, [timeline(0, 0, outcome=Outcome.TIMEOUT)]))
    console = Console(record=True, width=120, color_system=None)
    print_budget(console, a)
    print_findings(console, a)
    text = console.export_text()
    assert "nothing to decompose" in text and "1 of 1 requests failed" in text


def test_export_has_one_typed_row_per_request(tmp_path):
    records = eventful()
    a = analyze(write_run(tmp_path, records))
    table = request_table(a)
    assert table.num_rows == len(records)
    csv = pyarrow.csv.read_csv(write_csv(a))
    parquet = pyarrow.parquet.read_table(write_parquet(a))
    assert csv.num_rows == parquet.num_rows == len(records)
    assert parquet.schema == table.schema
    row = parquet.to_pylist()[7]
    d = decompose(records[7])
    assert row["queue_ms"] == pytest.approx(d.ms("queue")) and row["queue_quality"] == "exact"
    assert sum(row[f"{c}_ms"] or 0 for c in COMPONENTS) == pytest.approx(row["e2e_sched"])
    rejected = parquet.to_pylist()[-1]
    assert rejected["outcome"] == "http_429" and rejected["queue_ms"] is None


def test_report_command_on_a_partial_run(tmp_path):
    run = write_run(tmp_path, eventful(), summary=False)
    result = CliRunner().invoke(app, ["report", str(run.path), "--csv", "--parquet"])
    assert result.exit_code == 0, result.output
    assert "recomputed" in result.output and "Findings" in result.output
    for name in ("report.html", "requests.csv", "requests.parquet"):
        assert (run.path / name).stat().st_size > 0


def test_report_command_rejects_a_folder_that_is_not_a_run(tmp_path):
    result = CliRunner().invoke(app, ["report", str(tmp_path)])
    assert result.exit_code == 2 and "not a latlab run folder" in " ".join(result.output.split())


def test_html_is_self_contained(tmp_path):
    a = analyze(write_run(tmp_path, eventful()))
    path = write_html(a.run, a)
    page = path.read_text()
    assert "<script src" not in page and "<link" not in page and "@import" not in page
    assert page.count('class="plotly-graph-div"') == 12
    assert "plotly.js (basic - minified)" in page
    assert path.stat().st_size < MAX_PAGE_BYTES


@pytest.fixture(scope="session")
def chromium() -> str:
    """Debian's chromium, which `make setup` installs where it can (scripts/chromium.sh)."""
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is missing: `make setup` installs Debian's chromium as root "
                    "with apt-get")
    return CHROMIUM



@pytest.mark.timeout(RENDER_TIMEOUT_S)
@pytest.mark.parametrize("windowed", [True, False])
def test_html_renders_offline_in_chromium(tmp_path, chromium, windowed):
    if windowed:  # tenants, failures, warmup, cooldown and SLOs (the summary recomputed)
        a = analyze(write_run(tmp_path, eventful(), config=WINDOWED, summary=False))
    else:
        a = analyze(write_run(tmp_path, steady(30, prompt=200)))
    path = write_html(a.run, a)
    assert path.stat().st_size < MAX_PAGE_BYTES
    charts = render(chromium, path, tmp_path / "report.png")
    assert len(charts) == (12 if windowed else 10)
    titles = [c["title"] for c in charts]
    assert all(any(t.startswith(new) for t in titles) for new in NEW_CHARTS)
    (cdf,) = [c for c in charts if c["title"] == "Distributions (CDF)"]
    assert cdf["xtypes"] == ["log"] * 4
    slos = [name for name in cdf["names"] if name.startswith("SLO")]
    assert slos == (["SLO ttft ≤ 30.0 ms", "SLO e2e_sched ≤ 200.0 ms"] if windowed else [])
    shaded = [c["shapes"] for c in charts
              if c["title"].startswith(("Over time", "Every request", "How requests ended"))]
    assert shaded == ([2, 2, 2] if windowed else [0, 0, 0])


@pytest.mark.timeout(RENDER_TIMEOUT_S)
def test_sweep_html_renders_offline_in_chromium(tmp_path, chromium):
    path = write_sweep_html(tmp_path, read_json(LEGACY_SWEEP / SWEEP_JSON, SweepRecord))
    assert path.stat().st_size < MAX_PAGE_BYTES
    assert "plotly.js (basic - minified)" in path.read_text()
    assert len(render(chromium, path, tmp_path / "sweep.png")) == 2


CHARTS_JS = """[...document.querySelectorAll('.js-plotly-plot')].map(d => ({
    svg: !!d.querySelector('.main-svg'),
    traces: d.data.length,
    title: (d.layout.title && d.layout.title.text) || '',
    names: d.data.map(t => t.name || ''),
    xtypes: Object.keys(d._fullLayout).filter(k => /^xaxis[0-9]*$/.test(k)).sort()
        .map(k => d._fullLayout[k].type),
    shapes: (d._fullLayout.shapes || []).length}))"""
VISIBLE_JS = """document.body.innerText + '\\n'
    + [...document.querySelectorAll('svg text')].map(t => t.textContent).join('\\n')"""


def render(chromium: str, path: Path, screenshot: Path) -> list[dict]:
    """Open `path` with every non-file request blocked, wait for every chart and take a
    screenshot; check that every chart rendered with data, that nothing went wrong in the
    console and that no visible text is a dict; return each chart's title, trace names,
    x axis types and number of shapes."""
    from playwright.sync_api import sync_playwright

    expected = path.read_text().count('class="plotly-graph-div"')
    errors: list[str] = []
    blocked: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS, timeout=60_000)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            page.set_default_timeout(60_000)
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))

            def only_files(route):
                if route.request.url.startswith("file:"):
                    route.continue_()
                else:
                    blocked.append(route.request.url)
                    route.abort()

            page.route("**/*", only_files)
            page.goto(path.as_uri(), wait_until="load")
            page.wait_for_function(
                f"document.querySelectorAll('.js-plotly-plot .main-svg').length >= {expected}")
            rendered = page.locator(".js-plotly-plot").count()
            charts = page.evaluate(CHARTS_JS)
            visible = page.evaluate(VISIBLE_JS)
            page.screenshot(path=str(screenshot), full_page=True)
        finally:
            browser.close()
    assert rendered == len(charts) == expected
    assert all(c["svg"] and c["traces"] >= 1 for c in charts)
    assert errors == [] and blocked == []
    assert [line for line in visible.splitlines() if re.search(r"[{}]", line)] == []
    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return charts


def test_a_long_finding_prints_whole_when_piped(capsys, monkeypatch):
    """Piped output is read by logs and scripts: a finding's advice is never cropped at the
    console's width."""
    from types import SimpleNamespace

    from latlab.analysis.findings import Finding, Severity
    from latlab.commands.common import console
    from latlab.report.console import print_findings

    monkeypatch.setenv("COLUMNS", "80")
    fix = "try this " + "and then that " * 30 + "(--the-last-flag)"
    finding = Finding("rule", Severity.WARNING, "a title", ["evidence " * 20], "decode", fix, 1.0)
    print_findings(console(), SimpleNamespace(findings=[finding], unevaluated=[]))
    out = capsys.readouterr().out
    assert f"try first: {fix}" in out and "evidence " * 20 in out
