"""How long `latlab predict` takes on first use (no calibration cached: it calibrates
latlab's engine first), for one or more source trees of latlab side by side, one after the
other, each with an empty `$LATLAB_CACHE`:

    git archive main | tar -x -C /tmp/latlab-before
    flock /tmp/latlab-bench.lock python benchmarks/first_calibration.py \
        --src /tmp/latlab-before --src . --burners 2          # a busy host: ≤ 10 min

`--burners N` starts N busy loops (stopped by PID at the end) for the whole comparison, so a
host's load is made, not hoped for; the load average is sampled through each run. Per run:
the seconds to the first progress line (imports), to the probes (the in-process grid and
its reference steps), latlab serve's start and each probe (from the progress lines), the
first answer, the CPU seconds of predict and of its latlab serve in each stage (each probe
its own), and the calibration's fit error, held-out error and probe replays.

`--calibration FILE` times the answer alone instead: the same `predict` given that
calibration (`--no-probe`: no machine check), so what follows a calibration — the
prediction, its findings and the advice effects it simulates — is compared by itself; the
advice effects it printed are counted.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMMAND = ["predict", "--rate", "3", "--requests", "500", "--draws", "0"]
LIMIT_S = 400.0  # a run that takes longer than this is stopped (by PID) and reported


@dataclass
class Run:
    src: Path
    wall_s: float = 0.0
    lines: list[tuple[float, str]] = field(default_factory=list)  # (seconds, stderr line)
    loads: list[float] = field(default_factory=list)  # 1-minute load averages sampled
    calibration: dict | None = None
    returncode: int | None = None
    cpu_s: float = 0.0  # user + system seconds of the command and its children (latlab serve)
    output: str = ""  # what it printed on stdout
    cpu: list[tuple[float, float, float]] = field(default_factory=list)  # (s, predict, serve)

    @property
    def advice_effects(self) -> int:
        """The advised settings whose effect it printed (simulated: not "not predicted")."""
        return self.output.count("predicted for `") - self.output.count("not predicted for `")

    def first(self, pattern: str) -> float | None:
        return next((t for t, line in self.lines if re.search(pattern, line)), None)

    def stages(self) -> list[tuple[str, str]]:
        imports, probing = self.first(r"calibrating latlab's engine"), self.first(r"probing")
        ready = self.first(r"latlab serve (for the probes )?ready")
        waited = next((float(m[1]) for _, line in self.lines
                       if (m := re.search(r"waited ([\d.]+) s for it", line))), None)
        reference = self.first(r"the reference steps")
        out = [("imports (first progress line)", _s(imports)),
               ("engine build, grid, reference steps", _s(_minus(probing, imports))),
               ("  of which the reference steps", _s(_minus(probing, reference))),
               ("  of which waiting for latlab serve", _s(waited)),
               ("latlab serve's start after the grid",
                _s(_minus(ready, probing) if ready and probing and ready > probing else 0.0))]
        for _, line in self.lines:
            if m := re.search(r"probe (\d+/\d+) done in ([\d.]+) s", line):
                out.append((f"probe {m[1]}", f"{float(m[2]):.1f} s"))
        out.append(("calibration to prediction", _s(_minus(self.wall_s, self.first(
            r"^calibration: ")))))
        out.append(("first answer", f"{self.wall_s:.1f} s"))
        out.append(("advice effects printed", str(self.advice_effects)))
        out.append(("CPU seconds (all its processes)", f"{self.cpu_s:.1f} s"))
        probes = [(m[1], t) for t, line in self.lines
                  if (m := re.search(r"probe (\d+)/\d+: ", line))]
        bounds = [("imports", 0.0), ("build, grid (serve starts)", imports),
                  ("reference steps", reference), *((f"probe {i}", t) for i, t in probes),
                  ("answer", self.first(r"^calibration: ")), ("", self.wall_s)]
        bounds = [(name, t) for name, t in bounds if t is not None]  # a stage not printed
        for (name, start), (_, end) in zip(bounds, bounds[1:]):
            if self.cpu:
                (m0, s0), (m1, s1) = self.cpu_at(start), self.cpu_at(end)
                out.append((f"  CPU s in {name} (predict + serve)",
                            f"{m1 - m0:.1f} + {s1 - s0:.1f}"))
        if ready is not None and self.cpu:
            out.append(("  serve's CPU s to ready", f"{self.cpu_at(ready)[1]:.1f}"))
        return out

    def cpu_at(self, t: float) -> tuple[float, float]:
        """The CPU seconds of predict and of its latlab serve last sampled by `t`."""
        before = [(m, s) for when, m, s in self.cpu if when <= t]
        return before[-1] if before else (0.0, 0.0)

    def fit(self) -> list[tuple[str, str]]:
        cal = self.calibration
        if cal is None:
            return [("calibration", "none written")]
        f = cal["fit"]
        held = f"{100 * f['holdout_mape']:.1f}%" if f.get("holdout_mape") is not None else "–"
        rows = [("fit error (grid, mean)", f"{100 * f['mape']:.1f}% ({f['samples']} steps)"),
                ("held-out error (grid)", held)]
        for note in cal["notes"]:
            if m := re.search(r"mean error on the served steps ([\d.]+%) before, ([\d.]+%)",
                              note):
                rows.append(("served steps, error after fit", m[2]))
            elif note.startswith("probe replayed"):
                replays = sum(name.startswith("probe replay") for name, _ in rows)
                rows.append((f"probe replay {replays + 1}", note.removeprefix(
                    "probe replayed on the calibration: ")))
        replays = [abs(float(x)) for name, line in rows if name.startswith("probe replay")
                   for x in re.findall(r"\(([+-][\d.]+)%\)", line)]
        if replays:
            rows.append(("probe replays: mean |error|",
                         f"{sum(replays) / len(replays):.1f}% ({len(replays)})"))
        return rows


def _minus(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def _s(x: float | None) -> str:
    return "–" if x is None else f"{x:.1f} s"


TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of process `pid` (None once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / TICK


def child_pids(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def run_once(src: Path, python: str, keep: Path | None = None,
             calibration: Path | None = None) -> Run:
    """`latlab predict` from `src` with an empty cache (or given `calibration`), its stderr
    lines timed; the calibration it made copied to `keep` (a file) if given."""
    run = Run(src)
    with tempfile.TemporaryDirectory(prefix="latlab-first-cal-") as cache:
        env = os.environ | {"LATLAB_CACHE": cache, "PYTHONPATH": str(src)}
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(2.0):
                run.loads.append(os.getloadavg()[0])

        def sample_cpu() -> None:  # predict's and its latlab serve's (its child) CPU seconds
            main = serve = 0.0
            server: int | None = None
            while not stop.wait(0.2):
                server = server or next(iter(child_pids(proc.pid)), None)
                main = cpu_s(proc.pid) or main
                serve = (cpu_s(server) if server else None) or serve
                run.cpu.append((time.perf_counter() - started, main, serve))

        sampler = threading.Thread(target=sample, daemon=True)
        cpu_sampler = threading.Thread(target=sample_cpu, daemon=True)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        sampler.start()
        given = ["--calibration", str(calibration), "--no-probe"] if calibration else []
        stdout = Path(cache) / "stdout.txt"
        with stdout.open("w") as out:
            proc = subprocess.Popen([python, "-m", "latlab", *COMMAND, *given], env=env,
                                    cwd=cache, stdout=out, stderr=subprocess.PIPE, text=True)
        cpu_sampler.start()
        timer = threading.Timer(LIMIT_S, proc.terminate)  # predict stops its probes' serve
        timer.start()
        try:
            for line in proc.stderr:
                run.lines.append((time.perf_counter() - started, line.rstrip()))
            run.returncode = proc.wait()
        finally:
            timer.cancel()
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            stop.set()
            sampler.join()
            cpu_sampler.join()
        run.wall_s = time.perf_counter() - started
        run.output = stdout.read_text()
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        run.cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        found = sorted(Path(cache).glob("calibration-engine-*.json"))
        if found:
            run.calibration = json.loads(found[0].read_text())
            if keep is not None:
                keep.parent.mkdir(parents=True, exist_ok=True)
                keep.write_text(found[0].read_text())
    return run


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", type=Path, action="append",
                        help="a latlab source tree (repeatable; default: this checkout)")
    parser.add_argument("--burners", type=int, default=0, help="busy loops to run meanwhile")
    parser.add_argument("--warm-s", type=float, default=0.0,
                        help="seconds the burners run before the first version")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--log", action="store_true", help="print each run's stderr lines")
    parser.add_argument("--keep", type=Path, help="a folder to keep each run's calibration in")
    parser.add_argument("--calibration", type=Path,
                        help="time predict given this calibration (the answer alone)")
    args = parser.parse_args()
    sources = [p.resolve() for p in (args.src or [ROOT])]
    print(f"uptime at the start: {uptime()}")
    burners = [subprocess.Popen([args.python, "-c", "while True: pass"])
               for _ in range(args.burners)]
    runs = []
    try:
        time.sleep(args.warm_s if burners else 0)
        for src in sources:
            print(f"{src}: uptime {uptime()}", flush=True)
            keep = (args.keep / f"{len(runs) + 1}-{src.name}.json") if args.keep else None
            runs.append(run_once(src, args.python, keep, args.calibration))
            r = runs[-1]
            print(f"  first answer in {r.wall_s:.1f} s (exit {r.returncode}), load average "
                  f"{min(r.loads, default=0):.1f}–{max(r.loads, default=0):.1f}", flush=True)
            if args.log or r.returncode:
                for t, line in r.lines:
                    print(f"  {t:6.1f} {line}")
    finally:
        for p in burners:
            p.kill()
            p.wait()
    print(f"uptime at the end: {uptime()} ({args.burners} burners)\n")
    tables = [dict(r.stages() + r.fit()) for r in runs]
    tables = [t | {"load average during (1 min, min–max)":
                   f"{min(r.loads, default=0):.1f}–{max(r.loads, default=0):.1f}"}
              for t, r in zip(tables, runs)]
    names = list(dict.fromkeys(name for t in tables for name in t))
    for i, r in enumerate(runs, 1):
        print(f"[{i}] {r.src}")
    print(f"{'':<38}" + "".join(f"{f'[{i}]':>14}" for i in range(1, len(runs) + 1)))
    for name in names:
        if name.startswith("probe replay"):
            for i, t in enumerate(tables, 1):
                print(f"{name} [{i}]: {t.get(name, '–')}")
        else:
            print(f"{name:<38}" + "".join(f"{t.get(name, '–'):>14}" for t in tables))


if __name__ == "__main__":
    main()
