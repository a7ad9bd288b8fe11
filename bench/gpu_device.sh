#!/usr/bin/env bash
# Every GPU check of issue 27 part 6 in one run, for a lent GPU machine (<= 10 minutes).
#
# Here, once (the GPU image lacks pydantic, which gnnserve.config imports):
#   bench/gpu_device.sh prepare
# then with the device tool: run(command="bash bench/gpu_device.sh", carry=[".whl", ".data"], timeout_s=600)
# Outputs land in $OUT: the test log, the benchmark log and its JSON.
set -uo pipefail
cd "$(dirname "$0")/.."

if [[ "${1:-}" == "prepare" ]]; then
  grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >>.git/info/exclude
  grep -qx '/.data/' .git/info/exclude 2>/dev/null || echo '/.data/' >>.git/info/exclude
  mkdir -p .data && cp ../shared/datasets/fb100_cornell5.npz .data/  # ../shared does not travel
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 \
    typing-inspection==0.4.5
  exit
fi

OUT="${OUT:-/tmp/gpu-out}"
mkdir -p "$OUT"
if [[ -d .whl ]]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH="/tmp/site:${PYTHONPATH:-}"
fi
# numba-cuda 0.30 still registers np.row_stack, which numpy 2.4 removed: shim it at start-up
mkdir -p /tmp/site
echo 'import numpy as _np; _np.row_stack = getattr(_np, "row_stack", _np.vstack)' >/tmp/site/sitecustomize.py
[[ -d .data ]] && export GNNSERVE_DATASETS="$PWD/.data"
export PYTHONPATH="$PWD/src:$PWD:/tmp/site:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv | tee "$OUT/machine.txt"
python3 -c "import torch, numba; print('torch', torch.__version__, 'numba', numba.__version__)" \
  | tee -a "$OUT/machine.txt"

# 1. the sampler's kernels on the real GPU (bit-identical draws, launch counts, device pipeline)
#    and every gpu-marked test
timeout 240 python3 -m pytest -q -p no:cacheprovider -o addopts="" \
  tests/sampling/test_cuda_sampler.py tests/sampling/test_device.py tests/sampling/test_paths.py \
  tests/features/test_tiered.py tests/newnodes/test_inference_gpu.py 2>&1 | tee "$OUT/tests.log"

# 2. sample + gather + model per batch: cuda vs cuda-torch vs the CPU path (16 cores) vs PyG
(cd bench && timeout 300 python3 gpu_pipeline.py --rounds 3) 2>&1 | tee "$OUT/bench.log"
cp bench/results/gpu_pipeline_gpu.json "$OUT/" 2>/dev/null || echo "no benchmark JSON" >&2
