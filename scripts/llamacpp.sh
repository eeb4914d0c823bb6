#!/usr/bin/env bash
# latlab against a real llama.cpp server, as docs/guides/real-servers.md shows it:
#
#   scripts/llamacpp.sh PATH/TO/llama-server [PORT]
#
# Exports latlab's `default` preset as GGUF (`latlab model export --gguf`), serves it with
# llama-server on 127.0.0.1 (one thread, 4 slots, Prometheus metrics on), benches it and
# stops it. Build llama-server from the source vendored in the llama-cpp-python sdist:
#   pip download --no-deps --no-binary :all: llama-cpp-python; tar xzf llama_cpp_python-*.tar.gz
#   cd llama_cpp_python-*/vendor/llama.cpp
#   cmake -B build -DLLAMA_CURL=OFF -DLLAMA_USE_PREBUILT_UI=OFF && cmake --build build --target llama-server -j2
set -euo pipefail
server=${1:?usage: scripts/llamacpp.sh PATH/TO/llama-server [PORT]}
port=${2:-18180}
latlab=${LATLAB:-latlab}
work=$(mktemp -d)
"$latlab" model export "$work/model" --model default --gguf
"$server" -m "$work/model/model.gguf" --host 127.0.0.1 --port "$port" -t 1 -c 8192 -np 4 \
    --metrics > "$work/llama-server.log" 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null || true' EXIT
for _ in $(seq 300); do
    curl -sf "http://127.0.0.1:$port/health" > /dev/null && break
    kill -0 "$pid" || { cat "$work/llama-server.log"; exit 1; }
    sleep 0.2
done
"$latlab" bench --url "http://127.0.0.1:$port" --duration 20 --users 4 --prompt-tokens 256 \
    --output-tokens fixed:64 --scrape 0.5 --out "$work/runs"
echo "run folders and the server's log: $work"
