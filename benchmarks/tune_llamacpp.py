"""`latlab tune` of a real llama-server, as docs/guides/tune.md shows it: latlab's `default`
preset exported as GGUF, served on one thread with its defaults (4 slots), 8 chat users with
prompts of 64-448 tokens and answers of 32-128, goodput under TTFT <= 2 s and TPOT <= 150 ms.

    python benchmarks/tune_llamacpp.py /work/build/llama-server [--out DIR]

Prints the load average before and after and the wall time; the tune folder (tune.json, each
ab's rounds, the servers' logs) stays under --out.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("server", type=Path, help="the llama-server binary")
    parser.add_argument("--out", type=Path, default=Path("runs"))
    parser.add_argument("--duration", default="25")
    parser.add_argument("--max-rounds", default="3")
    args = parser.parse_args()
    if not os.access(args.server, os.X_OK):
        sys.exit(f"{args.server}: not an executable llama-server")
    with tempfile.TemporaryDirectory() as scratch:
        model = Path(scratch) / "model"
        subprocess.run([sys.executable, "-m", "latlab", "model", "export", str(model),
                        "--model", "default", "--gguf"], check=True, capture_output=True)
        launch = (f"{args.server} -m {model / 'model.gguf'} -t 1 -c 8192 --host 127.0.0.1 "
                  "--port {port} {args}")
        print(f"load average before: {os.getloadavg()}", flush=True)
        started = time.monotonic()
        done = subprocess.run([
            sys.executable, "-m", "latlab", "tune", "--launch", launch, "--users", "8",
            "--prompt-tokens", "uniform:64,448", "--output-tokens", "uniform:32,128",
            "--duration", args.duration, "--slo", "ttft=2s", "--slo", "tpot=150ms",
            "--max-rounds", args.max_rounds, "--out", str(args.out)])
        print(f"tune took {time.monotonic() - started:.0f} s; "
              f"load average after: {os.getloadavg()}")
    sys.exit(done.returncode)


if __name__ == "__main__":
    main()
