"""The reports: terminal budget and findings, CSV/Parquet export, `latlab report`, and the HTML
report opened in headless Chromium with every non-file request blocked."""

import os
import shutil
import subprocess

import pyarrow.csv
import pyarrow.parquet
import pytest
from rich.console import Console
from timelines import steady, timeline, write_run
from typer.testing import CliRunner

from latlab.analysis import analyze
from latlab.analysis.decompose import COMPONENTS, decompose
from latlab.cli import app
from latlab.report.console import print_budget, print_findings
from latlab.report.export import request_table, write_csv, write_parquet
from latlab.report.html import write_html
from latlab.records.timeline import Outcome

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
INSTALL_TIMEOUT_S = 600


def eventful() -> list:
    """Two tenants, growing prompts and queue, a few rejections: every chart has data."""
    records = [timeline(i, i * 20, tenant="ab"[i % 2], priority=i % 3, prompt=100 + 40 * i,
                        prefill=5 + 0.1 * i, queue=3 * i, tokens=12) for i in range(60)]
    return records + [timeline(60 + i, i * 100, outcome=Outcome.HTTP_429) for i in range(3)]


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
    page = write_html(a.run, a).read_text()
    assert "<script src" not in page and "<link" not in page and "@import" not in page
    assert page.count('class="plotly-graph-div"') == 10


@pytest.fixture(scope="session")
def chromium() -> str:
    """Debian's chromium, installed with apt when missing and possible."""
    if not os.path.exists(CHROMIUM):
        if os.geteuid() != 0 or shutil.which("apt-get") is None:
            pytest.skip(f"{CHROMIUM} is missing and cannot be installed here (needs root and "
                        "apt-get): install Debian's chromium package")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        install = ["apt-get", "install", "-y", "-q", "chromium"]
        try:
            if subprocess.run(install, capture_output=True, env=env,
                              timeout=INSTALL_TIMEOUT_S).returncode != 0:
                # a fresh machine may have no package lists yet
                subprocess.run(["apt-get", "update", "-q"], capture_output=True, env=env,
                               timeout=INSTALL_TIMEOUT_S, check=True)
                subprocess.run(install, capture_output=True, env=env, timeout=INSTALL_TIMEOUT_S,
                               check=True)
        except (subprocess.SubprocessError, OSError) as e:
            pytest.skip(f"{CHROMIUM} is missing and `apt-get install chromium` failed: {e}")
    return CHROMIUM


@pytest.mark.timeout(INSTALL_TIMEOUT_S + 120)
@pytest.mark.parametrize("tenants", [True, False])
def test_html_renders_offline_in_chromium(tmp_path, chromium, tenants):
    from playwright.sync_api import sync_playwright

    records = eventful() if tenants else steady(30, prompt=200)
    a = analyze(write_run(tmp_path, records))
    path = write_html(a.run, a)
    charts = path.read_text().count('class="plotly-graph-div"')
    assert charts == (10 if tenants else 8)

    errors: list[str] = []
    blocked: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS, timeout=60_000)
        try:
            page = browser.new_page()
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
                f"document.querySelectorAll('.js-plotly-plot .main-svg').length >= {charts}")
            rendered = page.locator(".js-plotly-plot").count()
            with_svg = page.evaluate("[...document.querySelectorAll('.js-plotly-plot')]"
                                     ".filter(d => d.querySelector('.main-svg')).length")
            traces = page.evaluate("[...document.querySelectorAll('.js-plotly-plot')]"
                                   ".map(d => d.data.length)")
        finally:
            browser.close()
    assert rendered == with_svg == charts
    assert all(n >= 1 for n in traces)
    assert errors == [] and blocked == []
