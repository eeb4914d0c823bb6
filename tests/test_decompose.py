import copy

import numpy as np
import pytest
from timelines import MS, steady, timeline, write_run

from latlab.analysis import analyze
from latlab.analysis.budget import budget, tail_budget
from latlab.analysis.decompose import COMPONENTS, NetworkBaseline, Quality, decompose, decompose_all
from latlab.analysis.requests import in_flight_at_send
from latlab.records.table import as_table
from latlab.records.timeline import Outcome, ServerTiming


def test_components_recover_the_planted_stages_and_add_up():
    r = timeline(0, 100, client_wait=3, connect=2, upload=4, download=6, preprocess=1.5,
                 queue=7, prefill=20, tokens=5, itl=10, postprocess=0.25, tail=0.5, untimed=0.75)
    d = decompose(r)
    expected = {"client_wait": 3, "connect": 2, "network": 10, "preprocess": 1.5, "queue": 7,
                "prefill": 20, "decode": 40, "postprocess": 0.75, "unattributed": 0.75}
    assert {k: d.ms(k) for k in expected} == pytest.approx(expected, abs=1e-6)
    assert d.total == pytest.approx((r.done_ns - r.scheduled_ns) / MS)
    assert sum(d.ms(c) for c in COMPONENTS) == pytest.approx(d.total)
    assert d.quality("connect") == Quality.EXACT and d.quality("queue") == Quality.EXACT
    assert d.quality("network") == Quality.DERIVED and d.quality("client_wait") == Quality.DERIVED
    assert "ttft_unsplit" not in d.components
    assert d.bucket("network") == pytest.approx(12)
    assert d.bucket("queue & overhead") == pytest.approx(3 + 1.5 + 7 + 0.75 + 0.75)


def test_without_server_timings_the_client_view_is_kept_and_the_rest_unavailable():
    r = timeline(0, 0, client_wait=3, connect=2, queue=7, prefill=20, tokens=5, itl=10,
                 server=False)
    d = decompose(r)
    for name in ("network", "preprocess", "queue", "prefill"):
        assert d.quality(name) == Quality.UNAVAILABLE and d.components[name].ms is None
    assert d.ms("ttft_unsplit") == pytest.approx((r.first_token_ns - r.sent_ns) / MS)
    assert d.ms("ttft_unsplit") == pytest.approx(0.5 + 1 + 7 + 20 + 0.5)
    assert d.ms("decode") == pytest.approx(40) and d.quality("decode") == Quality.ESTIMATED
    assert d.ms("postprocess") == pytest.approx((r.done_ns - r.last_token_ns) / MS)
    assert d.ms("unattributed") == pytest.approx(0, abs=1e-9)
    assert sum(d.ms(c) for c in COMPONENTS) == pytest.approx(d.total)


def test_a_partial_server_timing_leaves_its_time_unattributed():
    r = timeline(0, 0, upload=4, download=6, queue=7)
    r.server.total = None
    r.server.queue = None
    r.server.prefill = None
    d = decompose(r)
    assert d.quality("network") == Quality.UNAVAILABLE and d.quality("queue") == Quality.UNAVAILABLE
    assert d.ms("unattributed") == pytest.approx(4 + 6 + 7 + 10)
    assert sum(d.ms(c) for c in COMPONENTS) == pytest.approx(d.total)


def test_without_a_server_total_the_queue_is_what_ttft_leaves_after_network_and_prefill():
    """llama.cpp reports prefill and decode, no total and no queue."""
    r = timeline(0, 0, connect=2.0, upload=1, download=1, preprocess=0, queue=7, prefill=30)
    r.server = ServerTiming(prefill=30.0, decode=r.server.decode, source="llamacpp")
    d = decompose(r)
    assert d.ms("network") == pytest.approx(2.0) and d.quality("network") == Quality.ESTIMATED
    assert d.ms("queue") == pytest.approx(1 + 7 + 1 - 2.0) and d.quality("queue") == Quality.DERIVED
    assert d.quality("prefill") == d.quality("decode") == Quality.EXACT
    reused = timeline(1, 0, upload=1, download=1, preprocess=0, queue=7, prefill=30)
    reused.server = ServerTiming(prefill=30.0, source="llamacpp")
    assert decompose(reused, NetworkBaseline(rtt_ms=3.0)).ms("network") == pytest.approx(3.0)
    assert decompose(reused).quality("network") == Quality.UNAVAILABLE
    assert sum(d.ms(c) for c in COMPONENTS) == pytest.approx(d.total)


def test_a_non_streamed_answer_from_llama_cpp_counts_its_decode_once():
    """Not streamed, the one event comes after the decode: the queue derived from it must
    leave the decode out (it was counted twice, and the rest showed as -50% unattributed)."""
    streamed = timeline(0, 0, connect=2.0, upload=1, download=1, preprocess=0, queue=7,
                        prefill=30, tokens=20, itl=10)
    whole = copy.deepcopy(streamed)
    whole.token_ns, whole.token_counts, whole.first_token_ns = [], [], None
    whole.add_token_event(whole.done_ns, 20)  # one body: the whole answer
    for r in (streamed, whole):
        r.server = ServerTiming(prefill=30.0, decode=190.0, source="llamacpp")
    for d in (decompose(streamed), decompose(whole)):
        assert d.ms("queue") == pytest.approx(1 + 7 + 1 - 2.0, abs=0.5)
        assert abs(d.ms("unattributed")) < 1.0
        assert sum(d.ms(c) for c in COMPONENTS) == pytest.approx(d.total)


def test_a_run_baseline_splits_transit_into_network_and_server_intake():
    """A request the server read late (frozen, overloaded) waited in intake, not the network."""
    r = timeline(0, 0, upload=1, download=1)
    late = timeline(1, 0, upload=801, download=1)  # read 800 ms after it arrived
    base = NetworkBaseline(transit_ms=2.0)
    on_time, frozen = decompose(r, base), decompose(late, base)
    assert on_time.ms("network") == pytest.approx(2.0) and on_time.ms("intake") == pytest.approx(0)
    assert frozen.ms("network") == pytest.approx(2.0) and frozen.ms("intake") == pytest.approx(800)
    assert frozen.quality("intake") == Quality.DERIVED
    assert frozen.bucket("network") == pytest.approx(2.0)
    assert frozen.bucket("queue & overhead") >= 800
    assert sum(frozen.ms(c) for c in COMPONENTS) == pytest.approx(frozen.total)


def test_non_streamed_and_unscheduled_requests():
    r = timeline(0, 50, client_wait=5, upload=4, download=6, tail=0.0)
    r.usage_ns = None  # the body's arrival is done
    r.scheduled_ns = None
    d = decompose(r)
    assert d.total == pytest.approx((r.done_ns - r.sent_ns) / MS)
    assert d.quality("client_wait") == Quality.UNAVAILABLE
    assert d.ms("network") == pytest.approx(10)
    assert sum(d.ms(c) for c in COMPONENTS) == pytest.approx(d.total)


def test_failed_requests_have_no_decomposition():
    assert decompose(timeline(0, 0, outcome=Outcome.HTTP_5XX)) is None


def test_tail_budget_shows_what_makes_slow_requests_slow():
    records = steady(99) + [timeline(99, 99 * 100, queue=500)]
    parts = decompose_all(as_table(records))
    mean, tail = budget(parts), tail_budget(parts)
    assert sum(mean.components.values()) == pytest.approx(mean.total)
    assert tail.n == 1 and tail.components["queue"] == pytest.approx(500)
    assert mean.components["queue"] == pytest.approx(5)
    assert tail.share("queue & overhead") > 0.8 > 0.2 > mean.share("queue & overhead")
    assert mean.buckets().keys() == {"network", "queue & overhead", "prefill", "decode"}


def test_a_budget_of_some_requests_is_theirs_given_as_rows_or_a_mask():
    parts = decompose_all(as_table([timeline(i, i * 1000, queue=10 * i) for i in range(10)]))
    rows = np.array([1, 4, 7])
    mask = np.isin(np.arange(10), rows)
    by_rows, by_mask = budget(parts, rows), budget(parts, mask)
    assert by_rows.n == 3 and by_rows.components["queue"] == pytest.approx(40)
    assert by_rows.components == pytest.approx(by_mask.components)
    assert (parts.value("queue", rows) == parts.value("queue")[rows]).all()


def test_mixed_runs_report_coverage():
    records = [timeline(i, i * 100, server=i % 2 == 0) for i in range(10)]
    b = budget(decompose_all(as_table(records)))
    assert b.coverage["queue"] == pytest.approx(0.5) and b.coverage["ttft_unsplit"] == 0.5
    assert "first token (unsplit)" in b.buckets()
    assert sum(b.components.values()) == pytest.approx(b.total)


def test_in_flight_at_send_counts_the_others():
    records = [timeline(0, 0, tokens=20), timeline(1, 10), timeline(2, 20), timeline(3, 500)]
    assert in_flight_at_send(records).tolist() == [0, 1, 2, 0]


def test_analyze_breaks_the_run_down(tmp_path):
    records = [timeline(i, i * 50, prompt=[10, 300, 2000][i % 3], tenant="ab"[i % 2],
                        priority=i % 2, prefill=[5, 20, 90][i % 3]) for i in range(60)]
    a = analyze(write_run(tmp_path, records))
    assert [g.label for g in a.by_prompt] == ["0–63", "256–1023", "1024–4095"]
    assert [round(g.budget.components["prefill"]) for g in a.by_prompt] == [5, 20, 90]
    assert [(g.label, g.n) for g in a.by_tenant] == [("a", 30), ("b", 30)]
    assert [g.label for g in a.by_priority] == ["0", "1"]
    assert 2 <= len(a.over_time) <= 10 and sum(g.n for g in a.over_time) == 60
    assert not a.summary_recomputed
    assert [f.rule for f in a.findings] == ["prefill_bound"]


def test_analyze_recomputes_the_summary_of_a_partial_run(tmp_path):
    records = steady(30)
    run = write_run(tmp_path, records, config={"warmup_s": 1.0}, summary=False)
    a = analyze(run)
    assert a.summary_recomputed and any("recomputed" in n for n in a.notes)
    assert a.summary.in_window == 20  # requests scheduled in the first second are warmup
    assert a.mean.n == 20  # the budget covers the same requests as the summary
    assert len(a.rows) == 30  # the warmup's records are kept


def test_notes_say_when_the_server_reports_nothing_or_leaves_time_unattributed(tmp_path):
    client_only = analyze(write_run(tmp_path, steady(20, server=False)))
    assert any("no timings" in n for n in client_only.notes)
    leaky = analyze(write_run(tmp_path, steady(20, untimed=30)))
    assert any("unattributed" in n and "not small" in n for n in leaky.notes)


def test_a_run_decomposed_a_block_at_a_time_is_decomposed_as_a_whole(monkeypatch):
    records = [timeline(i, i * 100, server=i % 3 != 0, connect=2.0 if i % 4 == 0 else None,
                        queue=i % 7, outcome=Outcome.TIMEOUT if i == 5 else Outcome.OK)
               for i in range(23)]
    records[10].server.application = {"retrieval": 4.0}
    table = as_table(records)
    base = NetworkBaseline(transit_ms=0.4)
    whole = decompose_all(table, base)
    monkeypatch.setattr("latlab.analysis.decompose.BLOCK_ROWS", 5)
    blocks = decompose_all(table, base)
    assert blocks.ms.keys() == whole.ms.keys()
    for name in whole.ms:
        np.testing.assert_array_equal(blocks.ms[name], whole.ms[name])
        np.testing.assert_array_equal(blocks.quality[name], whole.quality[name])
    for name in ("total", "has_server", "decomposed"):
        np.testing.assert_array_equal(getattr(blocks, name), getattr(whole, name))
    assert whole.ms["tls"].strides == (0,) == blocks.ms["tls"].strides  # no request has one
    assert [blocks.row(i) for i in range(23)] == [whole.row(i) for i in range(23)]


def test_a_loaded_clients_slow_connects_leave_the_gateway_its_hop():
    """Behind a gateway, the network is one TCP round trip: the kernel's of the handshakes,
    else the quickest connect. A loaded client's connects carry its own delays (a recorded
    LiteLLM run's ranged 0.36-73 ms), and their median, more than a local gateway's whole
    hop, left the gateway 0."""
    from latlab.analysis.analyze import network_baseline

    records = [timeline(i, 100 * i, connect=c) for i, c in enumerate([0.2, 9.0, 12.0, 15.0])]
    for r in records:
        r.server.gateway_intake, r.server.gateway_tail = 2.0, 1.0
    base = network_baseline(as_table(records))  # no kernel round trip: the quickest connect
    assert base.tcp_rtt_ms == pytest.approx(0.2) and base.rtt_ms == pytest.approx(10.5)
    for r in records:
        r.connection.rtt_ns = 50_000  # the kernel's: 0.05 ms
    t = as_table(records)
    base = network_baseline(t)
    assert base.tcp_rtt_ms == pytest.approx(0.05)
    parts = decompose_all(t, base)
    assert parts.value("network") == pytest.approx([0.05] * 4)
    assert parts.value("gateway_intake") + parts.value("gateway_tail") == pytest.approx(
        [2.95] * 4)


def test_in_flight_at_send_a_block_at_a_time_into_a_spill(tmp_path, monkeypatch):
    """The counts written a few requests at a time to a spill (mapped back) equal those made
    in one piece, never-sent requests (0) among them."""
    from dataclasses import replace

    from latlab.records.spill import Spill
    from latlab.records.table import as_table

    records = [timeline(i, 7.0 * (i % 9) + i, tokens=3 + i % 11) for i in range(40)]
    records[3] = replace(records[3], sent_ns=None, scheduled_ns=None)  # never sent
    whole = in_flight_at_send(records)
    monkeypatch.setattr("latlab.analysis.requests.IN_FLIGHT_BLOCK", 6)
    with Spill(tmp_path / "spill") as spill:
        spilled = in_flight_at_send(as_table(records), spill)
        assert spilled.tolist() == whole.tolist() and whole[3] == 0 and whole.max() > 3
        assert not spilled.flags.writeable  # a read-only mapping of its file
