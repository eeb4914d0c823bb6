"""Do `latlab ab`'s verdicts hold? An A/A pair, a large effect and a real prefix-cache gain,
each a real `latlab ab` against real servers, with the host's load beside every case.

    python benchmarks/verdicts.py                         # latlab serve: the three cases
    python benchmarks/verdicts.py --llama-server BIN      # and llama.cpp's llama-server
    python benchmarks/verdicts.py --cases aa twofold --rounds 2 --max-rounds 2
    python benchmarks/verdicts.py --cases gateway         # direct against through LiteLLM

Cases (latlab serve, embedded, one thread):

* `aa`: the same setting on both sides: no verdict may say better or worse;
* `twofold`: `--max-num-seqs 1` against 4 with 4 users: queueing makes TTFT several times
  worse; it must never be "same", and should be decided;
* `prefix`: a 768-token shared prefix without and with `--enable-prefix-caching`: TTFT
  about halves; `ab` should find it "better";
* `gateway`: `latlab serve` directly against the same server through LiteLLM's proxy (its
  own venv, tests/gateways.py): the proxy's hop must not be "same";
* `llama-aa`, `llama-np1` (with `--llama-server`): one llama-server against itself, and
  `-np 4` against `-np 1` with 4 users;
* `llama-launch` (with `--llama-server`): `-np 4` against `-np 1` again, each side's server
  started by `ab` itself from a `--launch` template (`{args}`: the side's flags).

Prints, per case, each headline metric's A and B, interval and verdict, the rounds `ab` ran
and the load average through the case; `--out` keeps the ab folders.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.request import urlopen

HEADLINE = ("p50_ttft", "p99_ttft", "p50_tpot", "p99_e2e", "output_tokens_per_s")
ROOT = Path(__file__).resolve().parent.parent
WORK = ["--prompt-tokens", "64", "--output-tokens", "fixed:16", "--users", "4"]


@dataclass
class Case:
    name: str
    a: str
    b: str
    args: list[str] = field(default_factory=list)
    expect: str = ""  # what must hold, in words


def latlab_cases() -> dict[str, Case]:
    base = "--model tiny --threads 1 --no-warmup"
    prefix = "--model default --threads 1 --max-model-len 1024 --no-warmup"
    return {
        "aa": Case("A/A (latlab serve)", base, base, WORK,
                   "no better/worse"),
        "twofold": Case("max-num-seqs 4 → 1, 4 users", f"{base} --max-num-seqs 4",
                        f"{base} --max-num-seqs 1", WORK, "TTFT never same; worse"),
        "prefix": Case("prefix caching, 768-token prefix", prefix,
                       f"{prefix} --enable-prefix-caching",
                       ["--prefix-tokens", "768", "--prompt-tokens", "32", "--output-tokens",
                        "fixed:8", "--users", "1"], "TTFT better"),
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def llama_server(binary: str, model: Path, parallel: int, log: Path):
    port = free_port()
    with open(log, "wb") as out:
        process = subprocess.Popen([binary, "-m", str(model), "--host", "127.0.0.1", "--port",
                                    str(port), "-t", "1", "-c", str(2048 * parallel), "-np",
                                    str(parallel), "--metrics"], stdout=out,
                                   stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise SystemExit(f"llama-server exited: see {log}")
            try:
                with urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.5)
        else:
            raise SystemExit("llama-server did not become ready in 120 s")
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def run_ab(case: Case, out: Path, common: list[str]) -> tuple[dict, float, float]:
    """The ab's record, its wall time and the highest 1-minute load average during it."""
    command = [sys.executable, "-m", "latlab", "ab", "--a", case.a, "--b", case.b, *case.args,
               *common, "--out", str(out), "--json"]
    started, peak = time.monotonic(), os.getloadavg()[0]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    while process.poll() is None:
        peak = max(peak, os.getloadavg()[0])
        time.sleep(1)
    stdout = process.stdout.read()
    if process.returncode != 0:
        raise SystemExit(f"{case.name}: latlab ab exited {process.returncode}")
    return json.loads(stdout), time.monotonic() - started, peak


def report(case: Case, record: dict, seconds: float, load: float) -> None:
    rounds = max(r["round"] for r in record["rounds"])
    print(f"\n{case.name} — expect: {case.expect}; {rounds} rounds a side, {seconds:.0f} s, "
          f"load average up to {load:.1f} on {os.cpu_count()} cores")
    for change in record["changes"]:
        if change["key"] not in HEADLINE:
            continue
        interval = ("–" if change["low"] is None else
                    f"[{100 * change['low']:+.0f}%, {100 * change['high']:+.0f}%]")
        a, b = (f"{v:,.1f}" if v is not None else "–" for v in (change["a"], change["b"]))
        print(f"  {change['label']:<18}{a:>10} → {b:<10}{interval:>20}  {change['verdict']}"
              + (f" (round {change['decided_at']})" if change["decided_at"] else ""))
    called = [c["label"] for c in record["changes"] if c["verdict"] in ("better", "worse")]
    print(f"  better/worse anywhere: {', '.join(called) or 'none'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", default=["aa", "twofold", "prefix"])
    parser.add_argument("--llama-server", help="llama.cpp's llama-server binary")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds a round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-rounds", type=int, default=10)
    parser.add_argument("--out", type=Path, help="keep the ab folders here")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="latlab-verdicts-"))
    common = ["--duration", str(args.duration), "--rounds", str(args.rounds),
              "--max-rounds", str(args.max_rounds)]
    cases = latlab_cases()
    with ExitStack() as stack:
        if args.llama_server:
            model = out / "gguf"
            subprocess.run([sys.executable, "-m", "latlab", "model", "export", str(model),
                            "--model", "default", "--gguf"], check=True,
                           stdout=subprocess.DEVNULL)
            gguf = model / "model.gguf"
            if not any(c.startswith("llama") for c in args.cases):
                args.cases += ["llama-aa", "llama-np1"]
            one = four = ""  # the servers the URL cases measure, started for them alone
            if {"llama-aa", "llama-np1"} & set(args.cases):
                four = stack.enter_context(llama_server(args.llama_server, gguf, 4,
                                                        out / "np4.log"))
            if "llama-np1" in args.cases:
                one = stack.enter_context(llama_server(args.llama_server, gguf, 1,
                                                       out / "np1.log"))
            cases["llama-aa"] = Case("A/A (llama-server -np 4)", four, four, WORK,
                                     "no better/worse")
            cases["llama-np1"] = Case("llama-server -np 4 → -np 1, 4 users", four, one, WORK,
                                      "TTFT worse")
            template = (f"{args.llama_server} -m {gguf} --host 127.0.0.1 --port {{port}} -t 1 "
                        "-c 8192 --metrics {args}")
            cases["llama-launch"] = Case("llama-server -np 4 → -np 1 by --launch, 4 users",
                                         "-np 4", "-np 1", [*WORK, "--launch", template],
                                         "TTFT worse")
        if "gateway" in args.cases:
            sys.path.insert(0, str(ROOT / "tests"))
            from gateways import LITELLM_KEY, litellm_binary, litellm_proxy

            from latlab.load.target.launch import embedded_engine

            if litellm_binary() is None:
                raise SystemExit("the gateway case needs LiteLLM (see tests/gateways.py)")
            engine = stack.enter_context(embedded_engine(
                ["--model", "tiny", "--threads", "1", "--no-warmup"], log_path=out / "engine.log"))
            proxy = stack.enter_context(litellm_proxy(engine.url, out / "litellm", "tiny"))
            cases["gateway"] = Case("direct → through LiteLLM", engine.url, proxy,
                                    [*WORK, "--model", "tiny", "--api-key", LITELLM_KEY],
                                    "TTFT worse, never same")
        for name in args.cases:
            if name not in cases:
                raise SystemExit(f"unknown case {name!r}: one of {', '.join(cases)}")
            record, seconds, load = run_ab(cases[name], out / name, common)
            report(cases[name], record, seconds, load)
    print(f"\nab folders: {out}")


if __name__ == "__main__":
    main()
