"""How far to trust `latlab predict` on a third-party server: llama.cpp's `llama-server`
serving latlab's default preset as GGUF. Calibrated from two run folders, checked on
held-out runs at other rates: the measured percentiles inside the predicted intervals.

    python benchmarks/predict_llamacpp.py --server /work/build/llama-server \
        --model /tmp/gguf/default-f32.gguf            # latlab model export --gguf makes it

1. Start llama-server on loopback (`--parallel` slots, `--ctx-size` 2048 per slot, one
   thread).
2. Measure its capacity (a closed loop of `--parallel` users) and two calibration runs: one
   request at a time (prefill against prompt length, from llama.cpp's `timings`) and Poisson
   at --calibrate-at × capacity (TPOT against concurrency); `latlab calibrate --from` them,
   with the limits llama-server was started with (slots, batch, context per slot).
3. Measure held-out Poisson runs at --evaluate-at × capacity (each its own prompt words:
   llama-server's prompt cache keeps nothing from another run), recording the machine's load.
4. Predict each as `latlab predict --check` does and print the verdict (`predict_trust.py`):
   coverage, widths below 70% of capacity, SLO-max and the replicas for a goal.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from predict_trust import Background, evaluate, load_average, middle_slo, print_verdict

from latlab.commands.common import console
from latlab.load.target.interrupts import interrupt_on_sigterm
from latlab.load.target.launch import ServerLaunch, free_port, start_server
from latlab.records.arrivals import ArrivalConfig
from latlab.records.bench import BenchConfig
from latlab.records.folder import RunFolder
from latlab.records.workload import WorkloadConfig
from latlab.services.bench import run_bench
from latlab.services.predict_intervals import Intervals
from latlab.sim.calibration import fit_warning, run_calibration, save

PER_SLOT_CONTEXT = 2048


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", required=True, help="the llama-server binary")
    parser.add_argument("--model", required=True, help="the GGUF file")
    parser.add_argument("--parallel", type=int, default=8)
    parser.add_argument("--batch", type=int, default=512, help="llama-server --batch-size")
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--calibrate-at", type=float, default=0.4)
    parser.add_argument("--evaluate-at", default="0.25,0.55,0.7,0.85")
    parser.add_argument("--draws", type=int, default=20)
    parser.add_argument("--fleet-rate", type=float,
                        help="req/s the replicas are sized for (default 2.5 × capacity)")
    parser.add_argument("--out", default="runs")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    interrupt_on_sigterm()  # SIGTERM stops the servers this script started, as Ctrl-C does
    err = console(stderr=True)
    out = Path(args.out)
    background = Background()
    port = free_port("127.0.0.1")
    url = f"http://127.0.0.1:{port}"
    command = [args.server, "-m", args.model, "--host", "127.0.0.1", "--port", str(port),
               "--parallel", str(args.parallel), "--ctx-size",
               str(PER_SLOT_CONTEXT * args.parallel), "--threads", "1", "--batch-size",
               str(args.batch), "--ubatch-size", str(args.batch)]
    shape = {"max_num_seqs": args.parallel, "max_num_batched_tokens": args.batch,
             "max_model_len": PER_SLOT_CONTEXT, "num_kv_blocks": args.parallel *
             PER_SLOT_CONTEXT // 16, "block_size": 16}
    salts = iter(range(1, 1000))
    with tempfile.TemporaryDirectory() as tmp:
        server = start_server(ServerLaunch(tuple(command), url, url + "/health", "llama-server"),
                              log_path=Path(tmp) / "llama.log")
        try:
            def bench(arrivals: ArrivalConfig, name: str) -> tuple[RunFolder, dict]:
                load, started = load_average(), time.monotonic()
                config = BenchConfig(url=url, model="default",
                                     workload=WorkloadConfig(prompt_salt=next(salts)),
                                     arrivals=arrivals, duration_s=args.duration,
                                     warmup_s=5.0, cooldown_s=2.0, out=out, name=name,
                                     server_kind="llamacpp")
                run = RunFolder(run_bench(config, console=err).run.path)
                return run, {"run": str(run.path), "load_average": [load, load_average()],
                             "other_cores": background.mean(started, time.monotonic())}

            probe, seen = bench(ArrivalConfig(process="closed", users=args.parallel),
                                "llama-capacity")
            top = probe.read_summary().throughput.achieved_rate
            print(f"llama-server capacity ({args.parallel} users): {top:.2f} req/s; "
                  f"load average {seen['load_average']}, other processes "
                  f"{seen['other_cores']:.2f} cores")
            low, _ = bench(ArrivalConfig(process="closed", users=1), "llama-calibrate-1-user")
            mid, _ = bench(ArrivalConfig(process="poisson", rate=args.calibrate_at * top),
                           f"llama-calibrate-{args.calibrate_at:g}")
            cal = run_calibration([low.path, mid.path], shape)
            save(cal, out / "llama-calibration.json")
            points = []
            for fraction in (float(f) for f in args.evaluate_at.split(",")):
                rate = round(fraction * top, 2)
                _, seen = bench(ArrivalConfig(process="poisson", rate=rate),
                                f"llama-eval-{rate:g}")
                points.append(seen | {"fraction": fraction, "rate": rate})
        finally:
            server.stop()
    print(f"calibration: {cal.headline()}")
    print(f"  step time = {cal.step.describe()}")
    print(f"  spread: {cal.spread.describe()}")
    if warning := fit_warning(cal):
        print(f"  warning: {warning}")
    for p in points:
        print(f"  {Path(p['run']).name}: other processes {p['other_cores']:.2f} cores, load "
              + "/".join(f"{x:.2f}" for x in p["load_average"]))
    slos = middle_slo(points)
    print(f"SLO: {slos}")
    intervals = Intervals(draws=args.draws)
    result = evaluate(cal, points, slos, args.fleet_rate or 2.5 * top, intervals, out)
    print_verdict(result, intervals)
    if args.json:
        args.json.write_text(json.dumps({"calibration": cal.headline(), "capacity": top,
                                         "points": points} | result, indent=2, default=str))


if __name__ == "__main__":
    main()
