#!/usr/bin/env bash
# The wheels that `scripts/gpu_check.sh` needs on a GPU machine that has CUDA's torch but
# cannot reach a package registry: latlab's own dependencies that such an image may lack or
# hold at other versions, at the versions of constraints.txt, downloaded here (where pip
# reaches the registry) into .whl/ for that machine's Python:
#
#   scripts/gpu_wheels.sh [PYTHON_VERSION]     # default 3.12; writes .whl/ (git-ignored)
#
# torch, numpy, scipy, pyarrow, aiohttp and the rest of such an image are used as they are.
set -euo pipefail
cd "$(dirname "$0")/.."
version=${1:-3.12}
packages=(
    orjson pydantic pydantic_core annotated-types typing-inspection typing_extensions
    typer rich shellingham plotly narwhals duckdb pyyaml prometheus_client tokenizers
    fastapi starlette uvicorn h11 anyio safetensors gguf
    opentelemetry-api opentelemetry-sdk opentelemetry-proto opentelemetry-semantic-conventions
    opentelemetry-exporter-otlp-proto-http opentelemetry-exporter-otlp-proto-common
    opentelemetry-exporter-otlp-common opentelemetry-exporter-http-transport
    googleapis-common-protos protobuf annotated-doc click
    pytest pytest-asyncio pytest-timeout pluggy iniconfig httpx httpcore
)
pins=()
for name in "${packages[@]}"; do
    # constraints.txt spells names either way (a-b or a_b); pip does not care
    pattern="^$(echo "$name" | sed 's/[-_]/[-_]/g')=="
    pin=$(grep -iE "$pattern" constraints.txt || true)
    pins+=("${pin:-$name}")
done
rm -rf .whl
${PYTHON:-python3} -m pip download -q --no-deps --only-binary=:all: -d .whl \
    --python-version "$version" --implementation cp --platform manylinux_2_28_x86_64 \
    --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 "${pins[@]}"
du -sh .whl
