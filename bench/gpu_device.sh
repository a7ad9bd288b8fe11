#!/usr/bin/env bash
# Every GPU check of issue 46 in one run, for a lent GPU machine (about 6 minutes, <= 10).
#
# Here, once (the GPU image lacks pydantic, FastAPI and uvicorn, and ../shared does not travel):
#   bench/gpu_device.sh prepare
# then with the device tool:
#   run(command="bash bench/gpu_device.sh", carry=[".whl", ".data"], timeout_s=540)
# Outputs land in $OUT: machine.txt, the test log, each benchmark's log and JSON.
# `bash bench/gpu_device.sh profile`: where a batch's time goes (bench/gpu_profile.py);
# `bash bench/gpu_device.sh serve`: only the HTTP capacity (part 3).
set -uo pipefail
cd "$(dirname "$0")/.."

if [[ "${1:-}" == "prepare" ]]; then
  grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >>.git/info/exclude
  grep -qx '/.data/' .git/info/exclude 2>/dev/null || echo '/.data/' >>.git/info/exclude
  mkdir -p .data && cp ../shared/datasets/fb100_cornell5.npz .data/  # ../shared does not travel
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 \
    typing-inspection==0.4.5 fastapi==0.165.0 starlette==1.10.0 uvicorn==0.54.0 \
    opentelemetry-api==1.45.2
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
if [[ "${1:-}" == "profile" ]]; then  # where a batch's time goes, per allocator
  for allocator in numba torch; do
    (cd bench && timeout 150 python3 gpu_profile.py --allocator $allocator) 2>&1 \
      | grep -v "NumbaPerformanceWarning\|warn(errors" | tee "$OUT/profile_$allocator.txt"
  done
  exit
fi
if [[ "${1:-}" == "serve" ]]; then  # only part 3 below
  (cd bench && timeout 200 python3 gpu_serve.py --rounds 1) 2>&1 | tee "$OUT/serve.log"
  cp bench/results/gpu_serve.json "$OUT/" 2>/dev/null || echo "no serving JSON" >&2
  exit
fi
nvidia-smi --query-gpu=name,memory.total --format=csv | tee "$OUT/machine.txt"
python3 -c "import torch, numba; print('torch', torch.__version__, 'numba', numba.__version__)" \
  | tee -a "$OUT/machine.txt"

# numba's allocations through torch's caching allocator, unless that fails here in a fresh process
timeout 60 python3 -c "
from numba import cuda
from gnnserve.sampling.cuda_memory import use_torch_allocator
assert use_torch_allocator()
assert cuda.to_device(list(range(9))).copy_to_host().sum() == 36
" >"$OUT/allocator.txt" 2>&1 || export GNNSERVE_CUDA_ALLOCATOR=numba
echo "allocator: ${GNNSERVE_CUDA_ALLOCATOR:-torch}" | tee -a "$OUT/machine.txt"

# 1. the sampler's kernels on the real GPU (bit-identical draws, launch counts, device pipeline),
#    the served device path, and every gpu-marked test
timeout 100 python3 -m pytest -q -p no:cacheprovider -o addopts="" -W ignore::Warning \
  tests/sampling/test_cuda_sampler.py tests/sampling/test_device.py tests/sampling/test_paths.py \
  tests/sampling/test_cuda_memory.py tests/engine/test_device_path.py \
  tests/features/test_tiered.py tests/newnodes/test_inference_gpu.py 2>&1 | tee "$OUT/tests.log"

# 2. sample + gather + model per batch (1, 64, 1,024 seeds): cuda vs cuda-torch vs the CPU path
(cd bench && timeout 120 python3 gpu_pipeline.py --rounds 2) 2>&1 \
  | grep -v "NumbaPerformanceWarning\|warn(errors" | tee "$OUT/bench.log"
cp bench/results/gpu_pipeline_gpu.json "$OUT/" 2>/dev/null || echo "no pipeline JSON" >&2

# 3. HTTP capacity (p99 <= 30 ms) through serve --device cuda against serve on the CPU path
(cd bench && timeout 160 python3 gpu_serve.py --rounds 1) 2>&1 | tee "$OUT/serve.log"
cp bench/results/gpu_serve.json "$OUT/" 2>/dev/null || echo "no serving JSON" >&2
