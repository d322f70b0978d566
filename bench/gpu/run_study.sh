#!/usr/bin/env bash
# Run the Inductor GPU studies on a machine that has torch + CUDA but not this project's other
# dependencies: install the carried wheels (.whl-inductor/: optuna, sqlalchemy, alembic, Mako,
# colorlog, tenacity, onnx2torch, setproctitle) into /tmp/site, export the transformer encoder's ONNX, run the
# studies and write results under $OUT (default bench/results). Extra arguments go to the driver
# (bench/gpu/inductor_study.py), e.g. `--gpus 0,1` or `--trials 8`; the default runs both bundled
# studies on GPU 0 with the side-by-side comparison.
#
#   bash bench/gpu/run_study.sh                        # both studies, GPU 0, compare
#   bash bench/gpu/run_study.sh --gpus 0,1 studies/transformer_inductor.toml
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-bench/results}"
mkdir -p "$OUT"
if compgen -G ".whl-inductor/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl-inductor/*.whl
  export PYTHONPATH="/tmp/site:${PWD}${PYTHONPATH:+:$PYTHONPATH}"
else
  export PYTHONPATH="${PWD}${PYTHONPATH:+:$PYTHONPATH}"
fi
# Never use NVLink multicast on shared multi-GPU hosts.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
python3 -m bench.gpu.encoder .tuner/models/encoder.onnx
args=("$@")
if [ ${#args[@]} -eq 0 ]; then
  args=(--compare studies/efficientnet_lite0_inductor.toml studies/transformer_inductor.toml)
fi
python3 -m bench.gpu.inductor_study --out "$OUT/gpu-inductor.json" "${args[@]}"
