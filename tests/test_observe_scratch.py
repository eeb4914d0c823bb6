"""`latlab observe`'s open windows wait on disk (`.open-windows/` in the run folder): gone when
observe ends, SIGTERM included; left by a process killed outright, and then removed by the
next observe with the same --out, never while the observe that made it runs. A window read
back from its segments is analysed as the calls themselves would be."""

import signal
import subprocess
import sys
import time

import httpx
import orjson
from otlp_export import export
from processes import interrupted, wait_until
from test_observe_windows import T0, genai_call, run_folder, take

from latlab.analysis.windows import analyze_window
from latlab.load.target.launch import free_port
from latlab.load.telemetry.observer import Observer
from latlab.records.folder import REPORT
from latlab.records.observe import WINDOWS, ObserveConfig
from latlab.services.observe import run_observe
from latlab.services.observe_scratch import (
    DIRECTORY,
    END_SCRATCH,
    SEGMENT_CALLS,
    Scratch,
    clear_stale,
)
from latlab.services.observe_windows import Windows

S = 10**9


class Sender:
    """Once observe listens, a call's spans every second until its open window is on disk."""

    def __init__(self, port: int, out) -> None:
        self.port, self.out, self.sent, self.last = port, out, 0, 0.0

    def __call__(self) -> bool:
        if list(self.out.glob(f"*/{DIRECTORY}/*.jsonl")):
            return True
        if time.monotonic() - self.last >= 1:
            try:
                httpx.post(f"http://127.0.0.1:{self.port}/v1/traces", timeout=5,
                           content=export([f"{self.sent + 1:032x}"], time.time_ns() - S),
                           headers={"Content-Type": "application/json"})
            except httpx.TransportError:  # not listening yet
                return False
            self.sent += 1
            self.last = time.monotonic()
        return False


def observe(out, sig: int) -> tuple[int, bytes]:
    port = free_port()
    args = ["observe", "--otlp-port", str(port), "--out", str(out), "--window", "3600",
            "--trace-wait", "1"]
    code, _, err = interrupted(args, Sender(port, out), "an open window on disk", sig=sig)
    return code, err


def test_sigterm_ends_observe_with_its_windows_written_and_no_scratch_left(tmp_path):
    code, err = observe(tmp_path, signal.SIGTERM)
    assert code == 0, err.decode()
    (folder,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert not (folder / DIRECTORY).exists()
    assert sum(orjson.loads(line)["calls"] for line in
               (folder / WINDOWS).read_bytes().splitlines()) >= 1


def test_a_killed_observes_scratch_is_removed_by_the_next_never_a_running_ones(tmp_path):
    code, _ = observe(tmp_path, signal.SIGKILL)
    assert code == -signal.SIGKILL
    (killed,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert list((killed / DIRECTORY).glob("*.jsonl"))  # left behind
    spans = tmp_path / "spans.json"
    spans.write_bytes(export(["a" * 32], 1_790_000_000 * S) + b"\n")
    (tmp_path / "running").mkdir()
    with Scratch(tmp_path / "running") as running:  # an observe still at work
        result = run_observe(ObserveConfig(from_file=spans, out=tmp_path))
        assert running.path.is_dir()
    assert result.cleared == [killed] and not (killed / DIRECTORY).exists()
    assert (killed / "requests.jsonl").is_file()  # the killed run's calls stay
    assert not (result.run.path / DIRECTORY).exists()
    assert clear_stale(tmp_path) == []


def test_a_window_of_many_segments_reads_back_whole_in_start_order(tmp_path, monkeypatch):
    observer = Observer(1 * S, 100_000)
    calls = [genai_call(f"{i + 1:032x}", T0 + (i * 7919 % 25) * S // 10, 300 + i)
             for i in range(25)]  # started out of the order they arrive in
    observer.add([s for c in calls for s in c], T0 + 4 * S)
    records = observer.finish()
    assert len(records) == len(calls)
    kept = {}
    for segment in (SEGMENT_CALLS, 4):
        monkeypatch.setattr("latlab.services.observe_scratch.SEGMENT_CALLS", segment)
        run, config = run_folder(tmp_path / str(segment))
        with Windows(run, config, 10 * S, 30 * S) as windows:
            for i in range(0, len(records), 3):  # a few calls at a time, as they complete
                take(records[i:i + 3], windows)
            assert len(list((run.path / DIRECTORY).glob("*.jsonl"))) == \
                -(-len(records) // segment)
            (kept[segment],) = windows.close()
            assert not list((run.path / DIRECTORY).glob("*.jsonl"))
    assert kept[4].calls == len(calls) and kept[4] == kept[SEGMENT_CALLS]
    # the same as the analysis of every field of the calls as they were made
    whole, _ = analyze_window(run, config, sorted(records, key=lambda r: r.origin_ns), T0,
                              T0 + 10 * S)
    whole.partial = kept[4].partial
    assert kept[4] == whole


def test_a_killed_ends_scratch_is_removed_by_the_next_observe(tmp_path):
    """The end's `end.scratch/` of an observe killed outright (here: a process holding it,
    SIGKILLed) is removed by the next observe with the same --out; a live one's stays."""
    killed = tmp_path / "killed"
    killed.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom pathlib import Path\n"
         "from latlab.records.spill import Spill\n"
         "with Spill(Path(sys.argv[1])):\n    print('held', flush=True)\n    time.sleep(60)",
         str(killed / END_SCRATCH)], stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline() == b"held\n"
        spans = tmp_path / "spans.json"
        spans.write_bytes(export(["a" * 32], 1_790_000_000 * S) + b"\n")
        assert run_observe(ObserveConfig(from_file=spans, out=tmp_path)).cleared == []
        assert (killed / END_SCRATCH).is_dir()  # its process lives
    finally:
        holder.kill()
        holder.wait()
    result = run_observe(ObserveConfig(from_file=spans, out=tmp_path))
    assert result.cleared == [killed] and not (killed / END_SCRATCH).exists()


def test_sigterm_during_the_end_leaves_no_end_scratch(tmp_path):
    """More SIGTERMs while observe shuts down (one at once, one more while the end works when
    its `end.scratch/` is caught) do not stop it halfway: the folder is finished and its
    scratch removed."""
    port = free_port()
    send = Sender(port, tmp_path)
    observe_ = subprocess.Popen([sys.executable, "-m", "latlab", "observe", "--otlp-port",
                                 str(port), "--out", str(tmp_path), "--window", "3600",
                                 "--trace-wait", "1"], stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE)
    try:
        wait_until(lambda: observe_.poll() is not None or send(), 60, "an open window")
        observe_.send_signal(signal.SIGTERM)
        observe_.send_signal(signal.SIGTERM)  # always one more while it shuts down
        wait_until(lambda: observe_.poll() is not None
                   or list(tmp_path.glob(f"*/{END_SCRATCH}")), 60, "the end")
        if observe_.poll() is None:
            observe_.send_signal(signal.SIGTERM)
        code = observe_.wait(60)
    finally:
        if observe_.poll() is None:
            observe_.kill()
            observe_.wait()
    assert code == 0, observe_.stderr.read().decode()
    (folder,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert (folder / REPORT).is_file() and not (folder / END_SCRATCH).exists()
