#!/usr/bin/env bash
# The engine's GPU checks in one run, for a machine with a CUDA GPU (issues 28 and 37):
#
#   scripts/gpu_wheels.sh               # here, where pip reaches the registry: .whl/
#   scripts/gpu_check.sh OUT            # there, in the repository's root; at most 9 minutes
#   scripts/gpu_check.sh OUT --cpu      # the same steps, small, on a CPU (a dry run)
#
# 1. the device: nvidia-smi, torch, the GPU's name (OUT/device.txt);
# 2. the engine's tests on that device (OUT/tests.txt): tests/test_engine_device.py, whose
#    CUDA-only tests capture and replay the decode graphs against the eager output, the other
#    engine tests, which run on CUDA there (`--device auto`), and the engine's loop in a
#    process of its own (tests/test_server_engine_core.py), and the Triton kernel that reads
#    the paged KV in place against the gather (tests/test_engine_paged_attention.py);
# 3. benchmarks/engine_gpu.py (OUT/engine_gpu.txt): the 1B Llama shape in bf16, decode steps
#    at batch 1/16/64 against the roofline with graphs and the Triton attention
#    (`graphs/triton`), with graphs and the gather (`graphs/gather`), and eagerly; the decode
#    attention of one layer at batch 64 (gathered, or read in place); output tok/s against
#    Hugging Face `generate`;
# 4. benchmarks/engine_host.py (OUT/engine_host.txt): the host's time per step outside the
#    model at 64 streams;
# 5. benchmarks/engine_serving.py (OUT/engine_serving.txt): `latlab bench`, 64 streaming
#    users, against `latlab serve --device cuda` with its engine's loop in a thread and in a
#    process of its own; run folders and step logs under OUT/serving;
# 6. `latlab ab` (OUT/ab_attention.txt): `--attention gather` against `--attention triton`
#    under 64 streaming users, two rounds a side (on --cpu an A/A of the gather); ab folder
#    under OUT/ab. (Issue 33's budget ab ran on an H200 before: docs/performance/verdicts.md.)
#
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: scripts/gpu_check.sh OUT [--cpu]}
cpu=${2:-}
python=${PYTHON:-python3}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
if compgen -G ".whl/*.whl" > /dev/null; then
    "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site:$PWD
fi
status=()

step() {  # step NAME SECONDS COMMAND...: its output to OUT/NAME.txt and to stdout
    local name=$1 limit=$2
    shift 2
    echo "== $name: $*" | tee "$out/$name.txt"
    timeout "$limit" "$@" 2>&1 | tee -a "$out/$name.txt"
    local rc=${PIPESTATUS[0]}
    status+=("$name: exit $rc$([ "$rc" = 124 ] && echo " (timed out after $limit s)")")
}

device_info='
import subprocess, torch
try:
    print(subprocess.run(["nvidia-smi"], capture_output=True, text=True).stdout)
except OSError:
    print("(no nvidia-smi)")
print("torch", torch.__version__, "CUDA", torch.version.cuda, "GPU", torch.cuda.is_available())
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print(p.name, f"{p.total_memory / 2**30:.0f} GiB,", p.multi_processor_count, "SMs")'

if [ "$cpu" = --cpu ]; then
    device=cpu
    bench=(--device cpu --shape default --dtype float32 --batches 1 8 --output 32 --steps 20
           --copy-mib 256 --attention-batch 8)
    tests=(tests/test_engine_device.py tests/test_engine_paged_attention.py)
    host=(--device cpu --model tiny --steps 10)
    serving=(--device cpu --model tiny --users 8 --duration 5)
    engine="--device cpu --model tiny --no-warmup"
    users=8
    kernel=gather
else
    device=cuda
    bench=(--device cuda --shape 1b --dtype bfloat16 --batches 1 16 64 --steps 30)
    tests=(tests/test_engine_device.py tests/test_engine_model.py tests/test_engine_sampling.py
           tests/test_engine_scheduler.py tests/test_engine_techniques.py
           tests/test_engine_policies.py tests/test_server_engine_core.py
           tests/test_engine_paged_attention.py)
    host=(--device cuda --model default --dtype bfloat16 --steps 30)
    serving=(--device cuda --model default --dtype bfloat16 --users 64 --duration 10)
    engine="--device cuda --dtype bfloat16 --max-num-seqs 64"
    users=64
    kernel=triton
fi

step device 20 "$python" -c "$device_info"
step tests 110 "$python" -m pytest -q -p no:cacheprovider -n 0 -rs "${tests[@]}"
step engine_gpu 130 "$python" benchmarks/engine_gpu.py "${bench[@]}"
step engine_host 35 "$python" benchmarks/engine_host.py --baseline none --rounds 1 "${host[@]}"
step engine_serving 130 "$python" benchmarks/engine_serving.py --rounds 1 --keep "$out/serving" \
    "${serving[@]}"
step ab_attention 110 "$python" -m latlab ab --a "$engine --attention gather" \
    --b "$engine --attention $kernel" --users "$users" --rounds 2 --max-rounds 2 \
    --duration 8 --prompt-tokens 256 --output-tokens fixed:128 --out "$out/ab"

{
    echo "device: $device; $(date -u +%FT%TZ)"
    sed -n '/^decode step/,$p' "$out/engine_gpu.txt"
    sed -n '/ on .* streams;/,$p' "$out/engine_host.txt"
    sed -n '/streaming users/,$p' "$out/engine_serving.txt"
    grep -E "TTFT p(50|99) |TPOT p50 |ITL p(50|99) |E2E p99 |output tokens/s" \
        "$out/ab_attention.txt"
    tail -n 1 "$out/tests.txt"
    printf '%s\n' "${status[@]}"
} > "$out/summary.txt"
echo
cat "$out/summary.txt"
