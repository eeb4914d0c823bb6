"""The HTML report's charts and page, without a browser: CDFs on log axes with the summary's
percentiles, their CIs and the SLOs; warmup and cooldown shaded; the Gantt chart and its
sample; how requests ended over time; the vendored plotly.js bundle; no dict reprs."""

import re

import plotly.graph_objects as go
import pytest
from plotly.offline import get_plotlyjs
from timelines import eventful, steady, timeline, write_run

from latlab.analysis import analyze
from latlab.metrics.slo import meets_slos
from latlab.records.timeline import Outcome
from latlab.report import figures, gantt, timeseries
from latlab.report.html import write_html
from latlab.report.page import PLOTLY_JS, chart, settings_table
from latlab.report.palette import OUTCOME_COLORS

SLOS = {"ttft": 30.0, "tpot": 6.0, "e2e_sched": 200.0}
BUNDLE_VERSION = re.compile(r"plotly\.js (?:\([^)]*\) )?v(\d+\.\d+\.\d+)")


def run(tmp_path, records, **config):
    """The analysis of a run with `config` (the summary recomputed with its window and SLOs)."""
    return analyze(write_run(tmp_path, records, config={"rate": 10.0, **config}, summary=False))


def panel_traces(fig, xaxis):
    return [t for t in fig.data if (t.xaxis or "x") == xaxis]


def test_cdfs_are_on_log_axes_with_the_summarys_percentiles_and_the_slos(tmp_path):
    a = run(tmp_path, eventful(), slos=SLOS)
    fig = figures.cdf_figure(a)
    layout = fig.to_plotly_json()["layout"]
    axes = [k for k in layout if k.startswith("xaxis")]
    assert len(axes) == 4 and all(layout[k]["type"] == "log" for k in axes)

    ttft = panel_traces(fig, "x")
    for q, y in (("p50", 50), ("p99", 99)):
        p = a.summary.latency["ttft"].percentiles[q]
        (marker,) = [t for t in ttft if t.name == f"{q} with its 95% CI"]
        assert list(marker.x) == [p.value] and list(marker.y) == [y]
        for bar, ci in ((marker.error_x.array[0], p.ci_high), (marker.error_x.arrayminus[0],
                                                                p.ci_low)):
            assert bar is None if ci is None else bar == pytest.approx(abs(ci - p.value))
    assert marker.error_x.arrayminus[0] is not None
    (slo,) = [t for t in ttft if t.name.startswith("SLO")]
    assert slo.name == "SLO ttft ≤ 30.0 ms" and list(slo.x) == [30.0, 30.0]
    assert [t.name for t in panel_traces(fig, "x3") if t.name.startswith("SLO")] == []

    e2e = panel_traces(fig, "x4")
    assert {"E2E", "E2E from schedule", "SLO e2e_sched ≤ 200.0 ms"} <= {t.name for t in e2e}
    (line,) = [t for t in e2e if t.name == "E2E"]
    assert list(line.x) == sorted(line.x) and line.y[-1] == 100


def test_a_cdf_of_many_samples_keeps_its_tail(tmp_path):
    values = list(range(1, 100_001))
    x, y = figures._cdf(values)
    assert len(x) <= figures.CDF_POINTS and x[-1] == 100_000 and y[-1] == 100
    assert (y >= 99.9).sum() >= 10  # the tail beyond p99.9 still has a shape


@pytest.mark.parametrize("warmup, cooldown", [(0.2, 0.3), (0.0, 0.0)])
def test_warmup_and_cooldown_are_shaded_on_the_run_clock(tmp_path, warmup, cooldown):
    a = run(tmp_path, steady(20, gap=50.0), warmup_s=warmup, cooldown_s=cooldown)
    clock = timeseries.run_clock(a)
    expected = []
    if warmup:
        expected.append((0.0, warmup))
    if cooldown:
        end = (a.window.end_ns - clock.origin_ns) / 1e9
        assert end == pytest.approx(clock.span_s - cooldown, abs=1e-6)
        expected.append((end, clock.span_s))
    for fig in (timeseries.over_time_figure(a), timeseries.outcomes_figure(a),
                gantt.gantt_figure(a)):
        shapes = [x for s in fig.layout.shapes for x in (s.x0, s.x1)]
        assert shapes == pytest.approx([x for pair in expected for x in pair])
        labels = [n.text for n in fig.layout.annotations if n.text in ("warmup", "cooldown")]
        assert labels == [name for name, s in (("warmup", warmup), ("cooldown", cooldown)) if s]


def test_the_gantt_chart_shows_every_request_coloured_by_outcome(tmp_path):
    records = eventful()
    a = run(tmp_path, records)
    fig = gantt.gantt_figure(a)
    bars = {t.name: t for t in fig.data if t.type == "bar"}
    assert {name: len(t.y) for name, t in bars.items()} == {"ok": 60, "http_429": 3}
    assert all(t.marker.color == OUTCOME_COLORS[name] for name, t in bars.items())
    assert "all 63 requests" in fig.layout.title.text
    (ticks,) = [t for t in fig.data if t.type == "scatter"]
    slowest = sorted((r for r in records if r.token_ns), key=lambda r: r.done_ns
                     - r.scheduled_ns, reverse=True)[: gantt.TICKED]
    assert len(ticks.x) == sum(len(r.token_ns) for r in slowest)
    rows = {int(y) for y in ticks.y}
    ok = bars["ok"]
    starts = {int(y): b for y, b in zip(ok.y, ok.base)}
    origin = min(r.scheduled_ns for r in records)
    assert {round(starts[y], 6) for y in rows} == {
        round((r.scheduled_ns - origin) / 1e9, 6) for r in slowest}


def test_a_large_run_is_sampled_and_its_page_stays_small(tmp_path):
    records = [timeline(i, i * 2.0, tokens=40, itl=2.0, queue=i % 37) for i in range(2000)]
    records += [timeline(2000 + i, i * 40.0, outcome=Outcome.TIMEOUT) for i in range(100)]
    a = run(tmp_path, records, slos=SLOS)
    fig = gantt.gantt_figure(a)
    bars = {t.name: t for t in fig.data if t.type == "bar"}
    assert sum(len(t.y) for t in bars.values()) == gantt.MAX_REQUESTS
    assert len(bars["timeout"].y) == 100
    assert "400 of 2100 requests" in fig.layout.title.text
    (ticks,) = [t for t in fig.data if t.type == "scatter"]
    assert len(ticks.x) == gantt.TICKED * 40
    assert write_html(a.run, a).stat().st_size < 1_600_000


def test_a_cdf_of_more_samples_than_it_draws_says_how_many_it_drew(tmp_path, monkeypatch):
    monkeypatch.setattr(figures, "MAX_CDF_SAMPLES", 100)
    a = run(tmp_path, steady(30))  # 30 requests of 10 tokens: 270 ITL samples
    titles = [t.text for t in figures.cdf_figure(a).layout.annotations]
    assert "ITL (ms); CDF of an even 90 of 270" in titles
    assert "TTFT (ms)" in titles  # 30 samples: all of them
    (line,) = [t for t in figures.cdf_figure(a).data if t.name == "ITL"]
    assert len(line.x) == 90


def test_ttft_against_prompt_length_says_when_it_shows_a_sample(tmp_path, monkeypatch):
    monkeypatch.setattr(figures, "MAX_POINTS", 10)
    a = run(tmp_path, steady(30))
    fig = figures.ttft_prompt_figure(a)
    assert sum(len(t.x) for t in fig.data) == 10
    assert "(10 of 30 requests, evenly spaced)" in fig.layout.title.text


def test_how_requests_ended_over_time_counts_goodput_and_failures(tmp_path):
    records = eventful()
    a = run(tmp_path, records, slos=SLOS)
    fig = timeseries.outcomes_figure(a)
    width = fig.data[0].width
    counts = {t.name: round(sum(t.y) * width) for t in fig.data if t.type == "bar"}
    good = sum(1 for row in a.rows if row.record.ok and meets_slos(row.metrics, SLOS))
    assert 0 < good < 60
    assert counts == {"met the SLOs": good, "succeeded, missed an SLO": 60 - good,
                      "http_429": 3}
    assert [t.name for t in fig.data if t.type == "scatter"] == ["failed (% of ended)"]
    assert "ttft ≤ 30.0 ms" in fig.layout.title.text

    cancelled = timeline(10, 50.0, outcome=Outcome.CANCELLED)
    plain = timeseries.outcomes_figure(run(tmp_path / "plain", [*steady(10), cancelled]))
    assert [t.name for t in plain.data] == ["ok", "cancelled"]  # cancelled is not failed
    assert "no SLO given" in plain.layout.title.text


def test_every_outcome_has_a_colour():
    assert set(OUTCOME_COLORS) == {str(o) for o in Outcome}


def test_the_vendored_bundle_is_the_plotly_js_the_python_package_writes_for():
    ours = BUNDLE_VERSION.search(PLOTLY_JS.read_text()[:300])
    theirs = BUNDLE_VERSION.search(get_plotlyjs()[:300])
    assert ours and theirs and ours[1] == theirs[1]
    assert "(basic - minified)" in PLOTLY_JS.read_text()[:300]


def test_a_trace_the_bundle_lacks_is_refused():
    fig = go.Figure(go.Histogram(x=[1, 2, 3]))
    with pytest.raises(ValueError, match="histogram"):
        chart(fig, "a histogram")


def test_settings_read_as_rows_not_dicts():
    table = settings_table({"bench": {"slos": {}, "tags": [], "rate": 2.5, "url": None,
                                      "stream": True, "serve_args": ["--model", "tiny"]}})
    assert "{" not in table and "}" not in table and "[" not in table
    for row in ("<td>bench.slos</td><td>none</td>", "<td>bench.rate</td><td>2.5</td>",
                "<td>bench.url</td><td>–</td>", "<td>bench.stream</td><td>yes</td>",
                "<td>bench.serve_args</td><td>--model, tiny</td>"):
        assert row in table


def test_no_text_of_the_report_is_a_dict(tmp_path):
    a = run(tmp_path, eventful(), slos=SLOS, warmup_s=0.2, cooldown_s=0.2)
    page = write_html(a.run, a).read_text()
    assert page.count("LATLAB_TEMPLATE=") == 1  # one copy of the chart template
    html = page[page.index("<body>"):]
    scripts = re.compile(r"<script>.*?</script>", re.S)
    assert not re.search(r"[{}]", scripts.sub("", html))
    assert f"failures: http_429 ×{a.summary.failures['http_429']}" in html
    p = a.summary.latency["ttft"].percentiles["p50"]
    assert f"{p.ci_low:.1f} ms to {p.ci_high:.1f} ms" in html
    texts = []
    for make in (figures.cdf_figure, figures.waterfall_figure, figures.budget_figure,
                 gantt.gantt_figure, timeseries.over_time_figure, timeseries.outcomes_figure):
        fig = make(a).to_plotly_json()
        texts += [fig["layout"].get("title", {}).get("text", "")]
        texts += [n.get("text", "") for n in fig["layout"].get("annotations", [])]
        for t in fig["data"]:
            texts += [t.get("name") or ""] + list(t.get("text") or [])
            texts.append(re.sub(r"%\{[^}]*\}", "", t.get("hovertemplate") or ""))
    assert [t for t in texts if re.search(r"[{}]", str(t))] == []


def test_the_gantt_charts_slowest_taken_a_block_at_a_time_are_those_a_sort_finds(monkeypatch):
    """The slowest streamed requests found a few at a time (equally long ones across blocks)
    are those a stable sort of every request's time finds, the earlier of equal ones first;
    the sample's other requests are those `np.isin` leaves."""
    import numpy as np

    from latlab.records.columns import MISSING

    rng = np.random.default_rng(7)
    n = 500
    origin = rng.integers(0, 10**9, n)
    origin[::37] = MISSING
    end = origin + rng.integers(1, 6, n) * 10**6  # few lengths: many ties

    class Table:
        origin_ns, end_ns, events = origin, end, rng.integers(0, 3, n)

    timed = np.flatnonzero(origin != MISSING)
    span, streamed = end[timed] - origin[timed], Table.events[timed] > 0
    expected = timed[streamed][np.argsort(-span[streamed], kind="stable")][:gantt.TICKED]
    monkeypatch.setattr(figures, "BLOCK", 16)
    assert gantt._slowest(Table, timed).tolist() == expected.tolist()
    failed = rng.random(len(timed)) < 0.3
    chosen, sampled = gantt.sample(timed, expected, failed)
    kept = list(dict.fromkeys([*expected.tolist(), *timed[failed][:gantt.MAX_REQUESTS // 4]]))
    assert not sampled or chosen[len(kept):].tolist() == \
        timed[~np.isin(timed, kept)][(np.arange(gantt.MAX_REQUESTS - len(kept))
                                      * (len(timed) - len(kept))
                                      / (gantt.MAX_REQUESTS - len(kept))).astype(int)].tolist()
