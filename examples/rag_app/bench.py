"""Benchmark examples/rag_app end to end on this machine: start latlab serve and the RAG app on
127.0.0.1, both exporting their spans to latlab's OTLP receiver, run `latlab bench` against
the app, and stop both (by process group, on errors and Ctrl-C too).

    python examples/rag_app/bench.py                      # the run of docs/guides/sessions.md
    python examples/rag_app/bench.py --lookup-ms 0 -- --duration 10 --users 2

Arguments after `--` go to `latlab bench` (default: 30 s, 4 users, chat, 64-token questions,
32-token answers).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from latlab.load.target.launch import ServerLaunch, embedded_engine, free_port, start_server

APP = Path(__file__).with_name("app.py")
BENCH = ["--api", "chat", "--duration", "30", "--users", "4", "--prompt-tokens", "fixed:64",
         "--output-tokens", "fixed:32", "--name", "rag_app"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="default", help="latlab serve's --model")
    parser.add_argument("--docs", type=int, default=5000)
    parser.add_argument("--lookup-ms", type=float, default=50.0,
                        help="the simulated document store's latency")
    parser.add_argument("bench", nargs="*", help="latlab bench arguments (after --)")
    args = parser.parse_args()
    otlp = free_port()
    endpoint = f"http://127.0.0.1:{otlp}/v1/traces"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with embedded_engine(["--model", args.model, "--otlp-endpoint", endpoint]) as engine:
        app = ServerLaunch((sys.executable, str(APP), "--llm-url", engine.url, "--port",
                            str(port), "--docs", str(args.docs), "--lookup-ms",
                            str(args.lookup_ms), "--otlp-endpoint", endpoint),
                           url, url + "/health", "rag_app")
        with start_server(app, ready_timeout_s=60):
            command = [sys.executable, "-m", "latlab", "bench", "--url", url, "--otlp-port",
                       str(otlp), *(args.bench or BENCH)]
            return subprocess.call(command)


if __name__ == "__main__":
    sys.exit(main())
