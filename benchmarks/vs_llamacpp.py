"""latlab's engine against llama.cpp's llama-server: the same model, workload and threads.

    python benchmarks/vs_llamacpp.py                      # float32 weights and KV, 1 and 2 threads
    python benchmarks/vs_llamacpp.py --dtype bfloat16     # bf16 weights and KV on both
    python benchmarks/vs_llamacpp.py --llama-server /work/build/llama-server --threads 1 2

It exports the `default` preset (`latlab model export`), converts it to GGUF with llama.cpp's
own `convert_hf_to_gguf.py` (run by `LLAMA_CONVERT_PYTHON`, a Python that has its
requirements; the unknown BPE pre-tokenizer is named "gpt-2", which it is: GPT-2's byte-level
regex) or, with `--gguf latlab` (float32), writes it with `latlab model export --gguf`, checks
that both servers tokenize alike and decode the same greedy tokens, then for each thread count
starts one server at a time on 127.0.0.1 (llama-server, then `latlab serve`, each on its own,
with the same threads for its computation) and runs the same closed-loop workload against
each: `--users` concurrent users, each sending `--rounds` streamed completions of distinct
random `--prompt-tokens`-token prompts (token ids, so no tokenizer is involved) with
`--output-tokens` fixed outputs (ignore_eos), greedy. It prints output tok/s, TTFT p50/p99,
the server's CPU use (of one core = 100; its three busiest threads' too) and the 1-minute load
average before the run (after waiting up to `--wait-load` s for it to fall below
`--max-load`), and latlab's ratio to llama-server over the means of `--repeats` runs in
alternating order (a noisy machine then hits both alike). Every process it starts is stopped
by its PID.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import psutil

from latlab.metrics.stats import percentile

LLAMA_DIR = Path(os.environ.get("LLAMA_CPP_DIR",
                                "/work/llama/llama_cpp_python-0.3.36/vendor/llama.cpp"))
CONVERT_PYTHON = os.environ.get("LLAMA_CONVERT_PYTHON", "/work/llama/venv/bin/python")
# Runs llama.cpp's converter unmodified, naming the pre-tokenizer its hash table lacks.
CONVERT = """
import runpy, sys
root = sys.argv.pop(1)
sys.path[:0] = [root, root + "/gguf-py"]
import conversion.base as base
known = base.TextModel.get_vocab_base_pre
def get_vocab_base_pre(self, tokenizer):
    try:
        return known(self, tokenizer)
    except NotImplementedError:  # latlab's tokenizer: byte-level BPE with GPT-2's regex
        return "gpt-2"
base.TextModel.get_vocab_base_pre = get_vocab_base_pre
sys.argv[0] = root + "/convert_hf_to_gguf.py"
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def export_and_convert(folder: Path, dtype: str, writer: str = "llama.cpp") -> Path:
    subprocess.run([sys.executable, "-m", "latlab", "model", "export", str(folder / "hf"),
                    "--model", "default", *(["--gguf"] if writer == "latlab" else [])],
                   check=True, capture_output=True)
    if writer == "latlab":
        return folder / "hf" / "model.gguf"
    gguf = folder / f"default-{dtype}.gguf"
    outtype = {"float32": "f32", "bfloat16": "bf16"}[dtype]
    done = subprocess.run([CONVERT_PYTHON, "-c", CONVERT, str(LLAMA_DIR), str(folder / "hf"),
                           "--outfile", str(gguf), "--outtype", outtype],
                          capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"convert_hf_to_gguf.py failed:\n{done.stderr[-3000:]}")
    return gguf


class Server:
    """One server process on 127.0.0.1, stopped by its PID on exit."""

    def __init__(self, name: str, command: list[str], port: int, ready_path: str) -> None:
        self.name, self.url = name, f"http://127.0.0.1:{port}"
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT)
        self.ready_path = ready_path

    async def wait_ready(self, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        async with aiohttp.ClientSession() as session:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    break
                try:
                    async with session.get(self.url + self.ready_path) as r:
                        if r.status == 200:
                            return
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.2)
        self.log.seek(0)
        raise RuntimeError(f"{self.name} did not become ready:\n{self.log.read()[-2000:]}")

    def cpu_s(self) -> float:
        t = psutil.Process(self.proc.pid).cpu_times()
        return t.user + t.system

    def thread_cpu_s(self) -> dict[int, float]:
        return {t.id: t.user_time + t.system_time
                for t in psutil.Process(self.proc.pid).threads()}

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def llama_server(binary: Path, gguf: Path, threads: int, dtype: str, users: int,
                 context: int) -> Server:
    port = free_port()
    kv = {"float32": "f32", "bfloat16": "bf16"}[dtype]
    command = [str(binary), "-m", str(gguf), "--host",
               "127.0.0.1", "--port", str(port), "-t", str(threads), "-tb", str(threads),
               "-np", str(users), "-c", str(users * context), "-ctk", kv, "-ctv", kv,
               "-b", "512", "-ub", "512", "--no-webui"]
    return Server("llama-server", command, port, "/health")


def latlab_server(model: Path, threads: int, dtype: str, users: int) -> Server:
    port = free_port()
    command = [sys.executable, "-m", "latlab", "serve", "--model", str(model), "--port",
               str(port), "--threads", str(threads), "--dtype", dtype, "--max-num-seqs",
               str(users), "--max-num-batched-tokens", "512"]
    return Server("latlab serve", command, port, "/ready")


async def one_request(session: aiohttp.ClientSession, url: str, prompt: list[int],
                      output_tokens: int) -> tuple[float, int]:
    """TTFT (s) and output tokens of one streamed completion."""
    body = {"prompt": prompt, "max_tokens": output_tokens, "temperature": 0, "stream": True,
            "ignore_eos": True, "cache_prompt": False,
            "stream_options": {"include_usage": True}}
    sent = time.perf_counter()
    ttft, tokens = None, 0
    async with session.post(url + "/v1/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.content:
            if not line.startswith(b"data: {"):
                continue
            event = json.loads(line[6:])
            if event.get("choices") and ttft is None:
                ttft = time.perf_counter() - sent
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
    return ttft, tokens


async def workload(server: Server, args: argparse.Namespace, seed: int) -> dict:
    rng = random.Random(seed)
    prompts = [[[rng.randrange(16, 8192) for _ in range(args.prompt_tokens)]
                for _ in range(args.rounds)] for _ in range(args.users)]
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout,
                                     # a new connection per request: llama-server drops
                                     # pooled keep-alive ones now and then
                                     connector=aiohttp.TCPConnector(limit=0, force_close=True)
                                     ) as session:
        await asyncio.gather(*(one_request(session, server.url, [rng.randrange(16, 8192)] * 8,
                                           8) for _ in range(args.users)))   # warm-up
        cpu, threads, start = server.cpu_s(), server.thread_cpu_s(), time.perf_counter()

        async def user(mine: list[list[int]]) -> list[tuple[float, int]]:
            return [await one_request(session, server.url, p, args.output_tokens)
                    for p in mine]

        results = [r for rs in await asyncio.gather(*(user(p) for p in prompts)) for r in rs]
        elapsed, cpu = time.perf_counter() - start, server.cpu_s() - cpu
        threads = {k: v - threads.get(k, 0) for k, v in server.thread_cpu_s().items()}
    ttfts = sorted(t * 1000 for t, _ in results)
    tokens = sum(n for _, n in results)
    assert tokens == args.users * args.rounds * args.output_tokens, "short outputs"
    return {"tok_s": tokens / elapsed, "ttft_p50": percentile(ttfts, 50),
            "ttft_p99": percentile(ttfts, 99), "cpu": 100 * cpu / elapsed, "time": elapsed,
            # the busiest threads' CPU (% of a core): where the server's cores go
            "threads": "/".join(f"{100 * t / elapsed:.0f}"
                                for t in sorted(threads.values(), reverse=True)[:3])}


async def llama_greedy(server: Server, prompt: list[int], text: str) -> tuple[list, list]:
    """llama-server's greedy tokens after `prompt`, and its tokens of `text`."""
    async with aiohttp.ClientSession() as session:
        body = {"prompt": prompt, "n_predict": 16, "temperature": 0, "ignore_eos": True,
                "cache_prompt": False, "n_probs": 1}
        async with session.post(server.url + "/completion", json=body) as r:
            generated = (await r.json())["completion_probabilities"]
        async with session.post(server.url + "/tokenize", json={"content": text}) as r:
            tokens = (await r.json())["tokens"]
    return [g["id"] for g in generated], tokens


def same_model(server: Server, model: Path, dtype: str) -> str:
    """Whether llama-server and latlab's engine tokenize alike and decode alike (greedy)."""
    from latlab.engine.engine import LLMEngine
    from latlab.engine.sampling_params import SamplingParams
    from latlab.records.engine import EngineConfig

    engine = LLMEngine(EngineConfig(model=str(model), dtype=dtype, warmup=False))
    text = "def main():\n    print('hello, world')  # 3.14 ok?"
    prompt = engine.tokenizer.encode(text)
    theirs, their_tokens = asyncio.run(llama_greedy(server, prompt, text))
    ours = engine.generate([prompt], SamplingParams(max_tokens=16, temperature=0,
                                                    ignore_eos=True))[0].output_token_ids
    agree = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), len(theirs))
    tokenization = "identical" if their_tokens == prompt else "DIFFERENT"
    return f"tokenization {tokenization}; greedy decoding agrees on {agree} of 16 tokens"


def quiet_load(limit: float, wait_s: float) -> float:
    """The 1-minute load average once it is below `limit`, or after `wait_s` seconds."""
    deadline = time.monotonic() + wait_s
    while os.getloadavg()[0] >= limit and time.monotonic() < deadline:
        time.sleep(5)
    return os.getloadavg()[0]


def run(server: Server, args: argparse.Namespace, seed: int,
        check: Path | None = None) -> dict:
    try:
        asyncio.run(server.wait_ready())
        if check is not None:
            print(f"same model: {same_model(server, check, args.dtype)}", flush=True)
        return asyncio.run(workload(server, args, seed))
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--users", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3, help="requests per user")
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--output-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2, help="runs per server, alternating")
    parser.add_argument("--max-load", type=float, default=1.5,
                        help="wait for the 1-minute load average below this before each run")
    parser.add_argument("--wait-load", type=float, default=0,
                        help="wait at most this many seconds for it (then run anyway)")
    parser.add_argument("--llama-server", type=Path, default=LLAMA_DIR / "build/bin/llama-server",
                        help="the llama-server binary (default: under LLAMA_CPP_DIR)")
    parser.add_argument("--gguf", choices=["llama.cpp", "latlab"], default="llama.cpp",
                        help="who writes the GGUF: llama.cpp's converter or latlab's writer")
    args = parser.parse_args()
    if not args.llama_server.is_file():
        sys.exit(f"no llama-server at {args.llama_server} (--llama-server or LLAMA_CPP_DIR)")
    if args.gguf == "latlab" and args.dtype != "float32":
        sys.exit("--gguf latlab writes float32 weights only; use --dtype float32")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        gguf = export_and_convert(folder, args.dtype, args.gguf)
        context = args.prompt_tokens + args.output_tokens + 64
        print(f"model: the default preset (12.6M parameters), {args.dtype} weights and KV "
              f"(GGUF by {args.gguf}); "
              f"{args.users} users x {args.rounds} streamed requests, {args.prompt_tokens}-token "
              f"prompts, {args.output_tokens} output tokens (ignore_eos), greedy")
        print(f"{'threads':>7}  {'server':<13}{'out tok/s':>10}{'TTFT p50':>10}{'TTFT p99':>10}"
              f"{'CPU %':>7}{'time s':>8}{'load':>6}  busiest threads' CPU %")
        names = ["llama-server", "latlab serve"]
        checked = False
        for threads in args.threads:
            rows: dict[str, list[dict]] = {name: [] for name in names}
            for repeat in range(args.repeats):  # the order alternates: A B, B A, ...
                for name in names if repeat % 2 == 0 else names[::-1]:
                    server = (llama_server(args.llama_server, gguf, threads, args.dtype,
                                           args.users, context)
                              if name == "llama-server"
                              else latlab_server(folder / "hf", threads, args.dtype, args.users))
                    check = folder / "hf" if name == "llama-server" and not checked else None
                    checked = True
                    load = quiet_load(args.max_load, args.wait_load)
                    r = run(server, args, seed=threads * 100 + repeat, check=check)
                    rows[name].append(r)
                    print(f"{threads:>7}  {name:<13}{r['tok_s']:>10.0f}{r['ttft_p50']:>8.0f}ms"
                          f"{r['ttft_p99']:>8.0f}ms{r['cpu']:>7.0f}{r['time']:>8.1f}{load:>6.2f}  "
                          f"{r['threads']}",
                          flush=True)
            a, b = ({k: sum(r[k] for r in rows[n]) / len(rows[n]) for k in ("tok_s", "ttft_p99")}
                    for n in ("latlab serve", "llama-server"))
            print(f"{threads:>7}  latlab / llama-server (means of {args.repeats}): output tok/s "
                  f"{a['tok_s'] / b['tok_s']:.2f}x, p99 TTFT {a['ttft_p99'] / b['ttft_p99']:.2f}x "
                  "(below 1 is better)", flush=True)

if __name__ == "__main__":
    main()
