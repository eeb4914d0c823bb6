"""`latlab predict` on a third-party server: llama.cpp's `llama-server` serving latlab's
default preset as GGUF. Calibrated from run folders, predicted at other rates, checked
against measured runs at those rates.

    python benchmarks/predict_llamacpp.py --server /work/llama/.../build/bin/llama-server \
        --model /tmp/gguf/default-f32.gguf

1. Start llama-server on loopback (`--parallel` slots, `--ctx-size` 2048 per slot, one thread).
2. Measure its capacity (a closed loop of `--parallel` users) and two calibration runs: one
   request at a time (prefill against prompt length, from llama.cpp's `timings`) and Poisson
   at --calibrate-at × capacity (TPOT against concurrency).
3. `latlab calibrate --from` those two folders, with the engine limits llama-server was
   started with (slots, batch, context per slot).
4. Measure runs at --evaluate-at × capacity and predict each: replayed (its own requests)
   and fresh (the long-run distribution at its rate); print the errors.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from latlab.services.bench import run_bench
from latlab.commands.common import console
from latlab.load.target.launch import free_port, interrupt_on_sigterm, start_server
from latlab.records.bench import BenchConfig
from latlab.records.folder import RunFolder
from latlab.records.arrivals import ArrivalConfig
from latlab.records.workload import WorkloadConfig
from latlab.sim.calibration import run_calibration, save
from latlab.sim.fleet import simulate
from latlab.sim.validate import METRICS, QUANTILES, compare
from latlab.sim.workload import build

PER_SLOT_CONTEXT = 2048


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", required=True, help="the llama-server binary")
    parser.add_argument("--model", required=True, help="the GGUF file")
    parser.add_argument("--parallel", type=int, default=8)
    parser.add_argument("--batch", type=int, default=512, help="llama-server --batch-size")
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--calibrate-at", type=float, default=0.4)
    parser.add_argument("--evaluate-at", default="0.25,0.6,0.85")
    parser.add_argument("--out", default="runs")
    args = parser.parse_args()
    interrupt_on_sigterm()  # SIGTERM stops the servers this script started, as Ctrl-C does
    err = console(stderr=True)
    out = Path(args.out)
    port = free_port("127.0.0.1")
    url = f"http://127.0.0.1:{port}"
    command = [args.server, "-m", args.model, "--host", "127.0.0.1", "--port", str(port),
               "--parallel", str(args.parallel), "--ctx-size",
               str(PER_SLOT_CONTEXT * args.parallel), "--threads", "1", "--batch-size",
               str(args.batch), "--ubatch-size", str(args.batch)]
    shape = {"max_num_seqs": args.parallel, "max_num_batched_tokens": args.batch,
             "max_model_len": PER_SLOT_CONTEXT, "num_kv_blocks": args.parallel *
             PER_SLOT_CONTEXT // 16, "block_size": 16}
    with tempfile.TemporaryDirectory() as tmp:
        server = start_server(command, url, url + "/health", log_path=Path(tmp) / "llama.log",
                              name="llama-server")
        try:
            salts = iter(range(1, 1000))

            def bench(arrivals: ArrivalConfig, name: str, **kw) -> RunFolder:
                # Each run its own prompt words: llama-server's prompt cache keeps nothing
                # from an earlier run (its hits would make prefills look free)
                workload = WorkloadConfig(prompt_salt=next(salts))
                config = BenchConfig(url=url, model="default", workload=workload,
                                     arrivals=arrivals, duration_s=args.duration,
                                     warmup_s=5.0, cooldown_s=2.0, out=out, name=name,
                                     server_kind="llamacpp", **kw)
                return RunFolder(run_bench(config, console=err).run.path)

            probe = bench(ArrivalConfig(process="closed", users=args.parallel), "llama-capacity")
            top = probe.read_summary().throughput.achieved_rate
            err.print(f"llama-server capacity ({args.parallel} users): {top:.2f} req/s")
            low = bench(ArrivalConfig(process="closed", users=1), "llama-calibrate-1-user")
            mid = bench(ArrivalConfig(process="poisson", rate=args.calibrate_at * top),
                        f"llama-calibrate-{args.calibrate_at:g}")
            cal = run_calibration([low.path, mid.path], shape)
            save(cal, out / "llama-calibration.json")
            print(f"calibration: {cal.headline()}")
            print(f"  step time = {cal.step.describe()}")
            for note in cal.notes:
                print(f"  {note}")
            print(f"capacity probe replayed: {compare(cal, probe).line()}")
            for fraction in (float(f) for f in args.evaluate_at.split(",")):
                rate = round(fraction * top, 2)
                run = bench(ArrivalConfig(process="poisson", rate=rate), f"llama-eval-{rate:g}")
                check = compare(cal, run)
                fresh = simulate(build(WorkloadConfig(), ArrivalConfig(process="poisson",
                                                                        rate=rate), 20_000,
                                       None), cal)
                print(f"{fraction:.0%} of capacity, {rate:g} req/s, replayed: {check.line()}")
                print("  fresh: " + ", ".join(
                    f"{m} p{q:g} {100 * (p - check.measured[m][q]) / check.measured[m][q]:+.1f}%"
                    for m, q, p in _fresh(fresh)))
        finally:
            server.stop()


def _fresh(result):
    import numpy as np

    c = result.columns
    first, last = result.first_last_token()
    ok = c.outcome == 0
    values = {"ttft": (first - c.sent)[ok] * 1e3, "e2e": (c.done - c.sent)[ok] * 1e3,
              "tpot": ((last - first) / np.maximum(c.output - 1, 1))[ok & (c.output > 1)] * 1e3}
    return [(m, q, float(np.percentile(values[m], q))) for m in METRICS for q in QUANTILES]


if __name__ == "__main__":
    main()
