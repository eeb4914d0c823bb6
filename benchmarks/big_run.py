"""Big runs: how long `latlab report` and `latlab compare` take, and how much memory, on
synthetic run folders of N requests (10k, 100k, 1M).

    .venv/bin/python benchmarks/big_run.py                       # 10k and 100k
    .venv/bin/python benchmarks/big_run.py --requests 1000000
    .venv/bin/python benchmarks/big_run.py --baseline /tmp/latlab-main   # before/after
    .venv/bin/python benchmarks/big_run.py --requests 12000,100000,1000000 \
        --baseline /tmp/latlab-before --baseline-max 1000000

Each run folder looks like a real one: `config.json` (a 20 req/s open loop, its clock and
warmup), `requests.jsonl` (one record a line, ~64 token events each, server timings,
connection phases, two tenants, about 2% failures of four classes, a slow stretch) and
`server_timings.jsonl` (a tenth of the requests get their server timings from spans instead
of in-band). No summary.json: `report` computes the summary too, as `bench` does at the end
of every run. The second folder of a pair ran the same workload with a slower queue, so
`compare` has a change to find.

`report` and `compare` run as subprocesses of this script, `--repeat` times each, the
variants interleaved: `first` reads folders for the first time (their kept columns removed
before each run, so `requests.jsonl` is parsed, and kept again); `again` reads the columns
the first read kept in the folder (`requests.columns/`, as after `bench`, which reads its run
at the end); `--baseline DIR` runs a second latlab checkout (e.g. `git archive <commit> | tar
-x -C /tmp/latlab-before`, the commit before a change) on the same folders, reading them for
the first time too, and prints the ratios to `first`; it is skipped above `--baseline-max`
requests (an old enough checkout, analysing row by row, needs ~16 GB at 1M). The median wall
time (and the fastest) and the largest peak RSS (`os.wait4`) are printed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import orjson

from latlab.records.cache import COLUMNS

ROOT = Path(__file__).resolve().parents[1]
RATE = 20.0  # requests per second: a run of N requests lasts N / RATE seconds
TOKENS = 64
T0 = 5_000_000_000_000  # the load generator's perf_counter_ns at the first arrival
MS = 1_000_000
FAILURES = (("http_5xx", 500), ("timeout", None), ("http_429", 429), ("stream_broken", 200))
CHUNK = 20_000


def config(n: int) -> dict:
    duration = n / RATE
    return {
        "schema_version": 1, "kind": "bench", "latlab_version": "bench", "command": "big_run",
        "name": "big",
        "bench": {"url": "http://127.0.0.1:8000", "model": "m", "duration_s": duration,
                  "warmup_s": min(5.0, duration / 10), "arrivals": {"rate": RATE},
                  "workload": {"tenants": {"batch": 0.3, "chat": 0.7}}},
        "target": {"url": "http://127.0.0.1:8000", "model": "m"},
        "warmup_s": min(5.0, duration / 10), "duration_s": duration, "slos": {"ttft": 500.0},
        "clock": {"perf_counter_ns": T0, "unix_time": 1.8e9, "t0_ns": T0,
                  "end_ns": T0 + int(duration * 1e9)},
    }


def make_run(path: Path, n: int, seed: int = 0, queue_factor: float = 1.0) -> Path:
    """Write a synthetic run folder of `n` requests at `path` and return it."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_bytes(orjson.dumps(config(n)))
    rng = np.random.default_rng(seed)
    with open(path / "requests.jsonl", "wb") as requests, \
            open(path / "server_timings.jsonl", "wb") as joined:
        for start in range(0, n, CHUNK):
            lines, spans = _chunk(rng, start, min(CHUNK, n - start), n, queue_factor)
            requests.write(b"".join(lines))
            joined.write(b"".join(spans))
    return path


def _chunk(rng: np.random.Generator, start: int, m: int, n: int, queue_factor: float
           ) -> tuple[list[bytes], list[bytes]]:
    index = np.arange(start, start + m)
    scheduled = T0 + (index * 1e9 / RATE + rng.uniform(0, 1e9 / RATE, m)).astype(np.int64)
    batch = rng.random(m) < 0.3
    prompt = np.where(batch, rng.integers(1500, 4000, m), rng.integers(20, 400, m))
    slow = (index > 0.6 * n) & (index < 0.65 * n)  # a stretch where the server queues
    wait = rng.exponential(0.3, m) * MS
    new = rng.random(m) < 0.02
    connect = np.where(new, rng.uniform(0.2, 1.0, m) * MS, 0)
    sent = scheduled + (wait + connect).astype(np.int64)
    pre, post = rng.uniform(0.2, 1.0, m), rng.uniform(0.1, 0.5, m)
    queue = rng.exponential(5.0, m) * queue_factor * np.where(slow, 20.0, 1.0)
    prefill = 5.0 + prompt * 0.02 * rng.uniform(0.9, 1.1, m)
    gaps = rng.lognormal(np.log(20.0), 0.25, (m, TOKENS - 1))
    gaps[rng.random((m, TOKENS - 1)) < 0.02] *= 8  # stalls
    upload = rng.uniform(0.2, 0.6, m)
    first = sent + ((upload + pre + queue + prefill + 0.3) * MS).astype(np.int64)
    tokens = first[:, None] + np.concatenate(
        [np.zeros((m, 1), np.int64), np.cumsum(gaps * MS, axis=1).astype(np.int64)], axis=1)
    decode = (tokens[:, -1] - tokens[:, 0]) / MS
    total = pre + queue + prefill + decode + post
    usage = sent + ((upload + total + 0.3) * MS).astype(np.int64)
    done = usage + 50_000
    failed = rng.random(m) < 0.02
    kind = rng.integers(0, len(FAILURES), m)
    spans_only = rng.random(m) < 0.1
    lines, spans = [], []
    for i in range(m):
        server = {"preprocess": round(float(pre[i]), 4), "queue": round(float(queue[i]), 4),
                  "prefill": round(float(prefill[i]), 4), "decode": round(float(decode[i]), 4),
                  "postprocess": round(float(post[i]), 4), "total": round(float(total[i]), 4)}
        rid = f"big-{index[i]}"
        record = {
            "id": rid, "index": int(index[i]), "worker": int(index[i] % 4),
            "api": "completions", "prompt_tokens_planned": int(prompt[i]), "max_tokens": TOKENS,
            "fitted": False, "tenant": "batch" if batch[i] else "chat", "priority": None,
            "scheduled_ns": int(scheduled[i]), "sent_ns": int(sent[i]),
            "headers_ns": int(first[i]) - 200_000, "first_token_ns": int(tokens[i, 0]),
            "last_token_ns": int(tokens[i, -1]), "usage_ns": int(usage[i]),
            "done_ns": int(done[i]),
            "connection": {"new": bool(new[i]), "pool_wait_ns": None, "dns_ns": None,
                           "connect_ns": int(connect[i]) if new[i] else None, "tls_ns": None},
            "token_ns": tokens[i], "token_counts": [1] * TOKENS,
            "outcome": "ok", "status": 200, "error": None,
            "prompt_tokens": int(prompt[i]), "cached_tokens": 0, "completion_tokens": TOKENS,
            "tokens_from_usage": True, "server": server, "server_request_id": rid,
            "trace_id": f"{index[i]:032x}", "retries": 0,
        }
        if failed[i]:
            outcome, status = FAILURES[kind[i]]
            cut = int(rng.integers(1, TOKENS)) if outcome == "stream_broken" else 0
            record.update(outcome=outcome, status=status, error=f"synthetic {outcome}",
                          token_ns=tokens[i, :cut], token_counts=[1] * cut, server=None,
                          completion_tokens=None, tokens_from_usage=False, usage_ns=None,
                          first_token_ns=int(tokens[i, 0]) if cut else None,
                          last_token_ns=int(tokens[i, cut - 1]) if cut else None,
                          done_ns=int(tokens[i, cut]) if cut else int(first[i]))
        elif spans_only[i]:
            record["server"] = None
            spans.append(orjson.dumps({"id": rid, "server": {**server, "source": "otel"},
                                       "cached_tokens": 0}, option=orjson.OPT_APPEND_NEWLINE))
        lines.append(orjson.dumps(record, option=orjson.OPT_SERIALIZE_NUMPY
                                  | orjson.OPT_APPEND_NEWLINE))
    return lines, spans


def measure(argv: list[str], checkout: Path) -> tuple[float, int, int]:
    """Run `latlab ARGV` from `checkout`: (seconds, peak RSS in bytes, exit code)."""
    env = {**os.environ, "PYTHONPATH": str(checkout), "COLUMNS": "100"}
    code = "import sys; from latlab.cli import main; sys.argv[0] = 'latlab'; main()"
    with tempfile.TemporaryFile() as err:  # a pipe nobody reads until the end could fill
        start = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-c", code, *argv], env=env, cwd=checkout,
                                stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode not in (0, 1):
            err.seek(0)
            sys.stderr.write(err.read().decode()[-3000:])
    return seconds, usage.ru_maxrss * 1024, proc.returncode


def _cells(runs: dict[str, list[tuple[float, int, int]]]) -> str:
    """Each variant's median (fastest) seconds and largest peak RSS, and the ratios."""
    cells, summary = [], {}
    for name, results in runs.items():
        if any(rc not in (0, 1) for *_, rc in results):
            cells.append(f"{'failed':>16} {'':>11}")
            continue
        seconds = sorted(s for s, *_ in results)
        peak = max(rss for _, rss, _ in results)
        summary[name] = (float(np.median(seconds)), peak)
        cells.append(f"{f'{summary[name][0]:.1f} ({seconds[0]:.1f})':>16} {peak / 1e9:>11.2f}")
    line = " ".join(cells)
    if "first" in summary and "baseline" in summary:
        (s0, m0), (s1, m1) = summary["first"], summary["baseline"]
        line += f"  {s1 / s0:>9.1f}× {m1 / m0:>9.1f}×"
    return line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", default="10000,100000",
                        help="comma-separated run sizes (default 10000,100000)")
    parser.add_argument("--repeat", type=int, default=3,
                        help="times each command runs on each checkout, interleaved (default 3)")
    parser.add_argument("--baseline", type=Path, help="another latlab checkout to time too")
    parser.add_argument("--baseline-max", type=int, default=100_000,
                        help="largest run the baseline is timed on (default 100000)")
    parser.add_argument("--dir", type=Path, help="where to write the runs (default: a temp dir, "
                                                 "removed at the end)")
    args = parser.parse_args()
    root = args.dir or Path(tempfile.mkdtemp(prefix="latlab-big-"))
    # (checkout, whether the folders keep their columns from an earlier read)
    variants = {"first": (ROOT, False), "again": (ROOT, True)}
    if args.baseline:
        variants["baseline"] = (args.baseline.resolve(), False)
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; median (min) of "
          f"{args.repeat} runs, peak RSS the largest")
    print(f"{'requests':>9} {'jsonl MB':>8} {'command':>8} "
          + " ".join(f"{name + ' s':>16} {name + ' GB':>11}" for name in variants)
          + ("  first vs baseline: time, memory" if args.baseline else ""), flush=True)
    try:
        for n in (int(v) for v in args.requests.split(",")):
            a = make_run(root / f"a-{n}", n, seed=1)
            b = make_run(root / f"b-{n}", n, seed=2, queue_factor=1.3)
            size = (a / "requests.jsonl").stat().st_size / 1e6
            for command, argv in (("report", ["report", str(a), "-o", str(root / "r.html")]),
                                  ("compare", ["compare", str(a), str(b)])):
                timed = {name: v for name, v in variants.items()
                         if name != "baseline" or n <= args.baseline_max}
                runs: dict[str, list[tuple[float, int, int]]] = {name: [] for name in timed}
                for _ in range(args.repeat):
                    for name, (checkout, kept) in timed.items():
                        if not kept:  # parsed from requests.jsonl; "first" keeps them again
                            for folder in (a, b):
                                shutil.rmtree(folder / COLUMNS, ignore_errors=True)
                        runs[name].append(measure(argv, checkout))
                print(f"{n:>9} {size:>8.0f} {command:>8} " + _cells(runs), flush=True)
            shutil.rmtree(a), shutil.rmtree(b)
        print(f"load average at the end {os.getloadavg()[0]:.1f}")
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
