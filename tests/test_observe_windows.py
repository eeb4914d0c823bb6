"""`latlab observe`'s windows: the watermark (how long a window waits for late spans), each
call in its own start time's window however late its spans arrive, the same windows live and
from the spans' file, client-only calls (the model's time unsplit, streaming unknown unless
the span says), and the peak-hours rule only over whole windows with calls enough."""

import gc
import socket
import threading
import time

import httpx
import numpy as np
import orjson
import pytest
from otlp_export import export
from processes import wait_until

from latlab.analysis.decompose import decompose
from latlab.analysis.windows import peak_over
from latlab.load.target.launch import free_port
from latlab.load.telemetry.calls import calls_of, record_of, streamed
from latlab.load.telemetry.observer import Observer
from latlab.load.telemetry.trace_wait import INITIAL_NS, LEARNING_TRACES, TraceWait
from latlab.load.telemetry.watermark import RETRY_GAP_NS, Watermark
from latlab.records.config import RunConfig
from latlab.records.folder import RunFolder
from latlab.records.observe import (
    MIN_WINDOW_CALLS,
    WINDOWS,
    ObserveConfig,
    ObservedWindow,
    Quantiles,
)
from latlab.records.spans import Span
from latlab.records.table import as_table
from latlab.services.observe import run_observe
from latlab.services.observe_windows import Windows

S = 10**9
MS = 10**6
T0 = 1_790_000_000 * S  # unix ns


def test_the_watermark_waits_for_the_latest_call_seen_and_what_is_still_waiting():
    mark = Watermark(floor_ns=5 * S, bound_ns=120 * S)
    now = T0 + 1000 * S
    assert mark.at(now, None) == now - 5 * S  # nothing seen yet: an exporter's batch delay
    mark.saw(2 * S)
    assert mark.lag_ns == 5 * S  # below the floor
    mark.saw(12 * S)
    assert mark.lag_ns == 15 * S  # the latest call seen, with a quarter more
    mark.saw(3 * S)
    assert mark.lag_ns == 15 * S  # an earlier, quicker call changes nothing
    assert mark.at(now, now - 40 * S) == now - 40 * S  # a trace still waiting holds it back
    assert mark.at(now, now - 500 * S) == now - 120 * S  # ... at most the bound
    mark.saw(1000 * S)
    assert mark.lag_ns == 120 * S


def test_the_trace_wait_is_learnt_from_the_gaps_and_grows_with_a_split_trace():
    observer = Observer(TraceWait(), 100_000)
    assert observer.wait.ns == INITIAL_NS  # twice the SDK's delay while it learns
    for i in range(LEARNING_TRACES):  # each trace's spans in one export, as a Collector sends
        observer.add(genai_call(f"{i + 1:032x}", T0 + i * S // 10, 300), T0 + i * S // 10 + S)
    observer.ready(T0 + 60 * S)
    assert observer.traces == LEARNING_TRACES and observer.wait.ns == 1 * S  # no gap seen
    root, retrieval, client = genai_call("f" * 32, T0 + 70 * S, 300)
    observer.add([retrieval], T0 + 71 * S)
    observer.ready(T0 + 73 * S)  # quiet for 1 s: explained with its retrieval span alone
    observer.add([root, client], T0 + 76 * S)  # the rest, in the next batch 5 s later
    assert observer.wait.splits == 1 and observer.wait.ns == 10 * S  # twice that gap
    fixed = Observer(3e9, 100)
    assert fixed.wait.ns == 3 * S


def genai_call(trace: str, start_ns: int, ms: int, stream: bool | None = None,
               ttfc_s: float | None = None) -> list[Span]:
    """An application's call: its server span, a retrieval span and the GenAI instrumentation's
    CLIENT span (opentelemetry-instrumentation-openai-v2), no model server's span."""
    attrs = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai",
             "gen_ai.request.model": "tiny", "gen_ai.response.id": f"chatcmpl-{trace}",
             "gen_ai.usage.input_tokens": 120, "gen_ai.usage.output_tokens": 16}
    if stream is not None:
        attrs["gen_ai.request.stream"] = stream
    if ttfc_s is not None:
        attrs["gen_ai.response.time_to_first_chunk"] = ttfc_s
    root = Span(trace, trace[:16], "POST /v1/chat/completions", start_ns,
                start_ns + (ms + 60) * MS, None, "server", {}, [], "rag_app")
    retrieval = Span(trace, trace[16:] + "r", "retrieval", start_ns + MS, start_ns + 50 * MS,
                     root.span_id, "internal", {}, [], "rag_app")
    client = Span(trace, trace[16:] + "c", "chat tiny", start_ns + 55 * MS,
                  start_ns + (55 + ms) * MS, root.span_id, "client", attrs, [], "rag_app")
    return [root, retrieval, client]


def exported(calls: list[list[Span]], delay_ns: int = 5 * S) -> list[tuple[int, list[Span]]]:
    """The spans as a BatchSpanProcessor sends them: every `delay_ns` (its schedule delay),
    each batch the spans that ended since the last; (arrival, batch) in arrival order."""
    spans = sorted((s for c in calls for s in c), key=lambda s: s.end_ns)
    batches: dict[int, list[Span]] = {}
    for s in spans:
        tick = -(-(s.end_ns - T0) // delay_ns) * delay_ns + T0 + 3 * MS
        batches.setdefault(tick, []).append(s)
    return sorted(batches.items())


def traffic() -> list[list[Span]]:
    """Two minutes of an application's calls: 2 a second, 8 a second in the middle 40 s;
    every twentieth call 9 s long (the slowest, whose spans come last)."""
    rng = np.random.default_rng(7)
    calls, t, i = [], 0.0, 0
    while t < 120:
        rate = 8 if 40 <= t < 80 else 2
        t += rng.exponential(1 / rate)
        ms = 9000 if i % 20 == 0 else int(rng.uniform(200, 2500))
        calls.append(genai_call(f"{i + 1:032x}", T0 + int(t * S), ms, stream=i % 2 == 0))
        i += 1
    return calls


def run_folder(tmp_path) -> tuple[RunFolder, RunConfig]:
    run = RunFolder.create(tmp_path, "windows")
    config = RunConfig(kind="observed")
    run.write_config(config)
    return run, config


def live(tmp_path, batches, window_s: float) -> tuple[Windows, Observer]:
    """What `latlab observe` does live, on a clock that ticks each second: the batches as
    they arrive, then the calls complete and the windows the watermark passed."""
    run, config = run_folder(tmp_path)
    observer = Observer(TraceWait(), 100_000)  # the trace wait learnt, as by default
    with Windows(run, config, int(window_s * S), observer.mark.bound_ns,
                 since_ns=T0 - S) as windows:
        pending = list(batches)
        now, seen = T0, []
        while pending or observer.pending_spans:
            now += S
            while pending and pending[0][0] <= now:
                arrival, batch = pending.pop(0)
                observer.add(batch, arrival)
            seen += take(observer.ready(now), windows)
            windows.close(observer.watermark(now))
        seen += take(observer.finish(), windows)
        windows.close()
        windows.check(as_table(seen))  # at the end, over every call observed
    return windows, observer


def take(records, windows: Windows) -> list:
    windows.add(records, [orjson.dumps(r.to_json()) + b"\n" for r in records])
    return records


@pytest.mark.parametrize("window_s", [10, 60])
def test_every_call_lands_in_its_own_window_live_as_from_the_file(tmp_path, window_s):
    calls = traffic()
    batches = exported(calls)
    windows, observer = live(tmp_path / "live", batches, window_s)
    assert observer.calls == len(calls) and windows.late == 0
    assert sum(w.calls for w in windows.kept) == len(calls)  # every call in a window
    starts = sorted(c[0].start_ns for c in calls)
    for w in windows.kept:  # ... its own: the one its start time falls in
        assert w.calls == sum(w.start_ns <= s < w.end_ns for s in starts)
    # The same spans in the order they arrived, as a Collector's file exporter writes them.
    spans = tmp_path / "spans.jsonl"
    spans.write_bytes(b"".join(orjson.dumps(s.to_json()) + b"\n" for _, b in batches
                               for s in b))
    result = run_observe(ObserveConfig(from_file=spans, out=tmp_path / "from",
                                       window_s=window_s))
    written = [orjson.loads(line) for line in
               (result.run.path / WINDOWS).read_bytes().splitlines()]
    assert [(w["start_ns"], w["calls"], w["partial"]) for w in written] == \
        [(w.start_ns, w.calls, w.partial) for w in windows.kept]
    assert windows.kept[-1].partial  # the last call's: cut where the observation ended
    assert [[f["title"] for f in w["findings"]] for w in written] == \
        [[f.title for f in w.findings] for w in windows.kept]
    assert (result.peak is None) == (windows.peak is None)
    assert result.record.late == 0 and result.record.streamed == len(calls[::2])


def test_the_collector_is_paused_while_spans_come_in_and_given_back_after(tmp_path,
                                                                         monkeypatch):
    spans = tmp_path / "spans.jsonl"
    spans.write_bytes(b"".join(orjson.dumps(s.to_json()) + b"\n" for _, b in
                               exported(traffic()) for s in b))
    seen, add = [], Observer.add
    monkeypatch.setattr(Observer, "add", lambda self, batch, now_ns: (
        seen.append(gc.isenabled()), add(self, batch, now_ns)))
    assert gc.isenabled()
    result = run_observe(ObserveConfig(from_file=spans, out=tmp_path / "out"))
    assert result.record.calls and seen and not any(seen)
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_the_collector_is_given_back_when_the_intake_fails(tmp_path, monkeypatch):
    spans = tmp_path / "spans.jsonl"
    spans.write_bytes(b"".join(orjson.dumps(s.to_json()) + b"\n" for _, b in
                               exported(traffic()) for s in b))

    def broken(self, batch, now_ns):
        assert not gc.isenabled()
        raise RuntimeError("the intake broke")

    monkeypatch.setattr(Observer, "add", broken)
    with pytest.raises(RuntimeError, match="the intake broke"):
        run_observe(ObserveConfig(from_file=spans, out=tmp_path / "out"))
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_a_call_later_than_the_bound_is_counted_late_not_in_a_wrong_window(tmp_path):
    run, config = run_folder(tmp_path)
    observer = Observer(1 * S, 100_000, Watermark(5 * S, 30 * S))
    early, stalled = genai_call("a" * 32, T0 + S, 500), genai_call("b" * 32, T0 + 2 * S, 500)
    observer.add(early, T0 + 3 * S)
    with Windows(run, config, 10 * S, 30 * S) as windows:
        for now in range(4, 60):  # the stalled exporter's batch comes 60 s late
            take(observer.ready(T0 + now * S), windows)
            windows.close(observer.watermark(T0 + now * S))
        assert [w.calls for w in windows.kept] == [1]
        observer.add(stalled, T0 + 62 * S)
        take(observer.ready(T0 + 70 * S) + observer.ready(T0 + 80 * S), windows)  # other half
    assert windows.late == 1 and [w.calls for w in windows.kept] == [1]


def test_a_client_only_call_is_the_models_time_unsplit_and_streaming_as_its_span_says():
    (call,) = calls_of(genai_call("c" * 32, T0, 800, ttfc_s=0.25))
    r = record_of(call, 0)
    parts = decompose(r)
    assert parts.bucket("model server (unsplit)") == pytest.approx(800)
    assert parts.bucket("queue & overhead") == pytest.approx(0, abs=1e-6)
    assert (r.first_token_ns - call.client.start_ns) == 250 * MS  # the client's first chunk
    assert streamed(call) is True  # a first chunk's time: only a stream has one
    (plain,) = calls_of(genai_call("d" * 32, T0, 800))
    assert streamed(plain) is None  # the instrumentation's default span does not say
    (whole,) = calls_of(genai_call("e" * 32, T0, 800, stream=False))
    assert streamed(whole) is False


def window(minute: int, calls: int, rate: float, p99: float, partial: bool = False):
    return ObservedWindow(start_ns=T0 + minute * 60 * S, end_ns=T0 + (minute + 1) * 60 * S,
                          calls=calls, failed=0, rate=rate, e2e=Quantiles(p50=p99 / 2, p99=p99),
                          shares={"queue & overhead": 0.5}, partial=partial)


def test_peak_hours_only_over_whole_windows_with_calls_enough():
    steady = [window(m, 120, 2.0, 500.0) for m in range(1, 7)]
    busy = [window(m, 480, 8.0, 2500.0) for m in range(7, 10)]
    assert peak_over(steady + busy) is not None  # latency grew with the rate
    # A window cut short by observe's start or end reads a low rate, and slow calls in a
    # nearly empty window read a high p99: neither is compared.
    cut = [window(0, 12, 0.2, 2500.0, partial=True), window(10, 30, 0.5, 3000.0, partial=True)]
    sparse = [window(m, MIN_WINDOW_CALLS - 1, 0.3, 3000.0) for m in range(11, 14)]
    assert peak_over(steady + cut + sparse) is None
    short = window(14, 60, 1.0, 250.0)  # undercounted: its slowest calls came late
    short.late = 60
    assert peak_over(steady + [short, short.model_copy()]) is None


def test_the_watermark_waits_while_exports_are_refused_and_until_they_may_come_again():
    mark = Watermark(floor_ns=5 * S, bound_ns=120 * S)
    mark.refused(T0 + 100 * S)  # refused: its calls started at most the lag before
    mark.refused(T0 + 110 * S)  # ... still refusing: where the refusals began
    for now in (T0 + 110 * S, T0 + 110 * S + RETRY_GAP_NS):
        assert mark.at(now, None) == T0 + 95 * S
    after = T0 + 111 * S + RETRY_GAP_NS  # the retries are in (or given up): it moves on
    assert mark.at(after, None) == after - 5 * S
    mark.refused(T0 + 300 * S)
    assert mark.at(T0 + 300 * S, None) == T0 + 295 * S  # a new refusal, from where it is
    for now in range(330, 430, 30):  # refused without end: at most the bound behind
        mark.refused(T0 + now * S)
    assert mark.at(T0 + 420 * S, None) == T0 + 300 * S


def test_calls_whose_export_was_refused_land_in_their_own_window(tmp_path):
    """The receiver refuses an export while spans wait (503); the exporter sends it again 20 s
    later. Its calls' window waits for them instead of closing without them."""
    run, config = run_folder(tmp_path)
    observer = Observer(8 * S, max_spans=6)  # two calls' spans wait at most
    first = [genai_call(f"{i:032x}", T0 + i * S, 500) for i in (1, 2)]
    refused = [genai_call(f"{i:032x}", T0 + i * S, 500) for i in (3, 4, 5)]
    exports = {10: [s for c in first for s in c], 11: [s for c in refused for s in c]}
    with Windows(run, config, 10 * S, observer.mark.bound_ns) as windows:
        for now in range(10, 120):
            batch = exports.pop(now, None)
            if batch is not None and not observer.accepting(T0 + now * S):
                exports[now + 20] = batch  # the exporter's retry
            elif batch is not None:
                observer.add(batch, T0 + now * S)
            take(observer.ready(T0 + now * S), windows)
            windows.close(observer.watermark(T0 + now * S))
        take(observer.finish(), windows)
        windows.close()
    assert exports == {} and observer.calls == 5
    assert windows.late == 0 and [w.calls for w in windows.kept] == [5]


def test_a_window_finding_not_supported_by_all_calls_is_left_out(tmp_path, monkeypatch):
    """Six minutes at 1 call/s, every tenth call 3 s long. In minutes 1 and 2 an exporter
    stalled: half their calls, the slow ones among them, reach the file minutes later, past
    --max-lateness, so they are late and those two windows read half the rate and a quarter
    of the p99: the windows as written say "latency explodes at peak hours". Over all calls
    every minute is alike, so there is no such finding."""
    calls, stalled = [], []
    minute = T0 - T0 % (60 * S) + 60 * S
    for i in range(360):
        call = genai_call(f"{i + 1:032x}", minute + i * S, 3000 if i % 10 == 0 else 500)
        (stalled if 60 <= i < 180 and i % 2 == 0 else calls).append(call)
    spans = tmp_path / "spans.jsonl"
    ordered = sorted((s for c in calls for s in c), key=lambda s: s.end_ns)
    ordered += [s for c in stalled for s in c]
    spans.write_bytes(b"".join(orjson.dumps(s.to_json()) + b"\n" for s in ordered))
    monkeypatch.setattr("latlab.services.observe.FILE_BATCH", 6)  # a second's spans a batch
    result = run_observe(ObserveConfig(from_file=spans, out=tmp_path, max_lateness_s=30))
    assert result.record.late == len(stalled) == 60
    assert [(w.calls, w.late) for w in result.windows] == \
        [(60, 0), (30, 30), (30, 30), (60, 0), (60, 0), (60, 0)]
    as_written = [w.model_copy(update={"late": 0}) for w in result.windows]
    assert "peak hours" in peak_over(as_written).title  # before their late calls came
    assert result.peak is None and result.unsupported_peak is None  # over all calls
    written = [orjson.loads(line) for line in
               (result.run.path / WINDOWS).read_bytes().splitlines()]
    assert [w["late"] for w in written] == [0, 30, 30, 0, 0, 0]


def test_the_rolling_window_is_the_calls_that_started_in_the_last_window_length(tmp_path):
    run, config = run_folder(tmp_path)
    observer = Observer(1 * S, 100_000)
    observer.add([s for i in range(30) for s in
                  genai_call(f"{i + 1:032x}", T0 + i * S, 100 * (i + 1), ttfc_s=0.05)], T0)
    records = observer.finish()
    with Windows(run, config, 10 * S, 30 * S) as windows:
        take(records[:10], windows)
        take(records[10:], windows)  # two batches
        roll = windows.rolling(T0 + 25 * S)  # the calls that started at 15 s to 24 s
    assert (roll.calls, roll.failed, roll.rate) == (10, 0, 1.0)
    shown = [r for r in records if T0 + 15 * S <= r.origin_ns < T0 + 25 * S]
    e2e = np.array([(r.done_ns - r.sent_ns) / 1e6 for r in shown])
    ttft = np.array([(r.first_token_ns - r.sent_ns) / 1e6 for r in shown])
    assert roll.e2e.p50 == pytest.approx(np.percentile(e2e, 50), rel=0.02)
    assert roll.ttft.p99 == pytest.approx(np.percentile(ttft, 99), rel=0.02)


def test_the_check_drops_a_peak_the_windows_read_that_all_their_calls_do_not(tmp_path):
    observer = Observer(1 * S, 100_000)
    observer.add([s for i in range(240) for s in genai_call(  # the windows' (minutes 1 to 4)
        f"{i + 1:032x}", T0 + (60 + i) * S, 3000 if i % 10 == 0 else 500)], T0)
    table = as_table(observer.finish())
    run, config = run_folder(tmp_path)
    with Windows(run, config, 60 * S, 120 * S) as windows:
        # As written while two minutes' slow half had not come (and was not seen late).
        windows.kept = [window(m, 30, 0.5, 600.0) for m in (1, 2)] + \
            [window(m, 60, 1.0, 3000.0) for m in (3, 4)]
        windows.peak = peak_over(windows.kept)
        assert windows.peak is not None
        windows.check(table)
    assert [w.late for w in windows.kept] == [30, 30, 0, 0]
    assert windows.peak is None and "peak hours" in windows.unsupported_peak.title
    # Minute 4, written by the watermark, holds the last call: cut by the end, as --from says.
    assert [w.partial for w in windows.kept] == [False, False, False, True]


def test_observe_answers_503_with_retry_after_while_spans_wait(tmp_path):
    port = free_port()
    stop, done = threading.Event(), {}
    config = ObserveConfig(otlp_port=port, out=tmp_path, max_pending_spans=1, trace_wait_s=60)
    thread = threading.Thread(target=lambda: done.update(result=run_observe(config, stop=stop)))
    thread.start()
    try:
        url = f"http://127.0.0.1:{port}/v1/traces"
        wait_until(lambda: _listening(port), 60, "observe listening")
        answers = [httpx.post(url, content=export([trace], time.time_ns() - S), timeout=10,
                              headers={"Content-Type": "application/json"})
                   for trace in ("a" * 32, "b" * 32)]
    finally:
        stop.set()
        thread.join(120)
    assert [a.status_code for a in answers] == [200, 503]
    assert answers[1].headers["Retry-After"] == "1"
    assert done["result"].record.throttled == 1


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0
