#!/usr/bin/env bash
# The engine's GPU checks in one run, for a machine with a CUDA GPU (issue 28's GPU part):
#
#   scripts/gpu_wheels.sh               # here, where pip reaches the registry: .whl/
#   scripts/gpu_check.sh OUT            # there, in the repository's root; at most 9 minutes
#   scripts/gpu_check.sh OUT --cpu      # the same steps, small, on a CPU (a dry run)
#
# 1. the device: nvidia-smi, torch, the GPU's name (OUT/device.txt);
# 2. the engine's tests on that device (OUT/tests.txt): tests/test_engine_device.py, whose
#    CUDA-only tests capture and replay the decode graphs against the eager output, then the
#    other engine tests, which run on CUDA there (`--device auto`);
# 3. benchmarks/engine_gpu.py (OUT/engine_gpu.txt): the 1B Llama shape in bf16, decode steps
#    with graphs and eagerly at batch 1/16/64 against the roofline, output tok/s against
#    Hugging Face `generate`;
# 4. end to end (OUT/serve_bench.txt): `latlab bench` starting `latlab serve --device cuda`,
#    64 users, its run folder under OUT/runs.
#
# Wheels in .whl/ (carried with the working tree) are installed first into /tmp/site, ahead
# of the image's own packages. Each step has its own time limit and the script goes on after
# a failure; OUT/summary.txt ends with each step's exit status.
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
           --copy-mib 256)
    tests=(tests/test_engine_device.py)
    serve="--device cpu --model tiny --max-num-seqs 8"
    users=8
else
    device=cuda
    bench=(--device cuda --shape 1b --dtype bfloat16 --batches 1 16 64)
    tests=(tests/test_engine_device.py tests/test_engine_model.py tests/test_engine_sampling.py
           tests/test_engine_scheduler.py tests/test_engine_techniques.py
           tests/test_engine_policies.py)
    serve="--device cuda --dtype bfloat16 --max-num-seqs 64"
    users=64
fi

step device 60 "$python" -c "$device_info"
step tests 180 "$python" -m pytest -q -p no:cacheprovider -n 0 -rs "${tests[@]}"
step engine_gpu 240 "$python" benchmarks/engine_gpu.py "${bench[@]}"
step serve_bench 120 "$python" -m latlab bench --serve-args "$serve" --users "$users" \
    --duration 20 --prompt-tokens 256 --output-tokens fixed:128 --out "$out/runs"

{
    echo "device: $device; $(date -u +%FT%TZ)"
    sed -n '/^decode step/,$p' "$out/engine_gpu.txt"
    tail -n 1 "$out/serve_bench.txt"
    tail -n 1 "$out/tests.txt"
    printf '%s\n' "${status[@]}"
} > "$out/summary.txt"
echo
cat "$out/summary.txt"
