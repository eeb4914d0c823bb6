"""`latlab bench --url` with its defaults against every OpenAI-compatible server on this
machine: does it work, count tokens right and say nothing wrong?

    python benchmarks/any_server.py [--llama-server BIN] [--transformers BIN]
                                    [--transformers-model tiny|default] [--duration S]
                                    [--only latlab,llamacpp,transformers,strict]

Starts each server on 127.0.0.1 (and stops it, by its process group), exports the model it
serves with `latlab model export` (the `default` preset: latlab serve's own, as GGUF for
llama.cpp; `transformers serve` gets `tiny` unless told otherwise, as its eager CPU decoding
of `default` takes longer than a 20 s run on a small machine), and runs `latlab bench --url
URL` with nothing else but `--model` where the server lists none:

* latlab serve;
* llama.cpp's llama-server (4 slots, one thread), when built (`scripts/llamacpp.sh`);
* `transformers serve`, without and with `--continuous-batching` (its first requests load
  it: that run is cold, the next one warm), when installed (`pip install
  'transformers[serving]'`, or /work/build/venv-hf);
* a server that keeps to OpenAI's schema and ends its streams without [DONE]
  (`tests/sse_server.strict`).

For each run it prints the exit code, the requests (in the window) and how many succeeded,
whether every successful request's token count is the server's usage and how its events
add up, the findings, and the notes that say what latlab adapted to.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from sse_server import Server, strict  # noqa: E402

from latlab.load.target.launch import ServerLaunch, free_port, start_server  # noqa: E402
from latlab.records.folder import RunFolder  # noqa: E402

HF_OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_UPDATE_CHECK": "1",
              "HF_HUB_DISABLE_TELEMETRY": "1"}
ADAPTED = ("refused", "without `data: [DONE]`", "did not list a model", "ended before")


def latlab(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "latlab", *args], capture_output=True,
                          text=True, cwd=ROOT)


def bench(name: str, url: str, out: Path, duration: float, model: str | None = None) -> dict:
    row = _bench(name, url, out, duration, model)
    show(row)
    return row


def _bench(name: str, url: str, out: Path, duration: float, model: str | None = None) -> dict:
    args = ["bench", "--url", url, "--out", str(out), "--json", "--no-progress"]
    if duration:
        args += ["--duration", f"{duration:g}"]
    if model:
        args += ["--model", model]
    done = latlab(*args)
    try:
        record = json.loads(done.stdout)
    except json.JSONDecodeError:
        return {"server": name, "exit": done.returncode, "error": done.stderr.strip()[-300:]}
    records = RunFolder.open(record["run"]).read_records()
    ok = [r for r in records if r.ok]
    return {"server": name, "exit": done.returncode, "requests": len(records),
            "in_window": record["in_window"], "ok": record["ok"], "ok_all": len(ok),
            "usage": sum(r.tokens_from_usage for r in ok),
            "events_match": sum(sum(r.token_counts) == r.completion_tokens for r in ok),
            "findings": [f["rule"] for f in record["findings"] or []],
            "notes": [w for w in record["warnings"] if any(a in w for a in ADAPTED)],
            "run": record["run"]}


def show(row: dict) -> None:
    if "error" in row:
        print(f"{row['server']:<30} exit {row['exit']}: {row['error']}")
        return
    print(f"{row['server']:<30} exit {row['exit']}  {row['requests']:>3} requests, "
          f"{row['in_window']:>3} in the window, {row['ok']:>3} ok there "
          f"({row['ok_all']} of {row['requests']} in all); token counts from usage "
          f"{row['usage']}/{row['ok_all']}, events add up {row['events_match']}/{row['ok_all']}")
    print(f"{'':<30} findings: {', '.join(row['findings']) or 'none'}")
    for note in row["notes"]:
        print(f"{'':<30} note: {note[:150]}")
    print(f"{'':<30} load average {os.getloadavg()[0]:.2f}", flush=True)


def serve(command: list[str], port: int, folder: Path, name: str, env: dict | None = None):
    url = f"http://127.0.0.1:{port}"
    os.environ.update(env or {})
    return start_server(ServerLaunch(tuple(command), url, f"{url}/health", name),
                        ready_timeout_s=300, log_path=folder / f"{name}.log")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llama-server", default="/work/build/llama-server")
    parser.add_argument("--transformers", default="/work/build/venv-hf/bin/transformers")
    parser.add_argument("--transformers-model", choices=("tiny", "default"), default="tiny")
    parser.add_argument("--duration", type=float, default=0,
                        help="seconds of load (default: bench's own)")
    parser.add_argument("--only", default="latlab,llamacpp,transformers,strict",
                        help="the servers to run, comma-separated")
    args = parser.parse_args()
    only = set(args.only.split(","))
    work = Path(tempfile.mkdtemp(prefix="latlab-any-server-"))
    model, hf_model = work / "default", work / args.transformers_model
    for folder, gguf in ((model, ["--gguf"]), (hf_model, [])):
        exported = latlab("model", "export", str(folder), "--model", folder.name, *gguf)
        if exported.returncode:
            sys.exit(exported.stderr)
    out, rows = work / "runs", []
    print(f"load average before: {os.getloadavg()[0]:.2f}; work folder {work}")

    if "latlab" in only:
        port = free_port("127.0.0.1")
        with serve([sys.executable, "-m", "latlab", "serve", "--port", str(port)], port, work,
                   "latlab-serve"):
            rows.append(bench("latlab serve", f"http://127.0.0.1:{port}", out, args.duration))
    if "llamacpp" in only and Path(args.llama_server).is_file():
        port = free_port("127.0.0.1")
        with serve([args.llama_server, "-m", str(model / "model.gguf"), "--host", "127.0.0.1",
                    "--port", str(port), "-t", "1", "-c", "8192", "-np", "4", "--metrics"],
                   port, work, "llama-server"):
            rows.append(bench("llama-server -np 4", f"http://127.0.0.1:{port}", out,
                              args.duration))
    if "transformers" in only and Path(args.transformers).is_file():
        for batching in ([], ["--continuous-batching"]):
            port = free_port("127.0.0.1")
            label = "transformers serve" + (" --cb" if batching else "")
            with serve([args.transformers, "serve", "--host", "127.0.0.1", "--port", str(port),
                        "--device", "cpu", *batching, str(hf_model)], port, work,
                       label.replace(" ", "-"), HF_OFFLINE):
                for run in (["cold", "warm"] if batching else [""]):
                    rows.append(bench(f"{label} {run}".strip(), f"http://127.0.0.1:{port}", out,
                                      args.duration, model=str(hf_model)))
    if "strict" in only:
        with Server(strict()) as server:
            rows.append(bench("strict, no [DONE]", server.url, out, args.duration))
    print(f"load average after: {os.getloadavg()[0]:.2f}; {len(rows)} runs")


if __name__ == "__main__":
    main()
