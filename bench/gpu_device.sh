#!/usr/bin/env bash
# Every GPU check of issue 46 in one run, for a lent GPU machine (about 6 minutes, <= 10).
#
# Here, once (the GPU image lacks pydantic, FastAPI and uvicorn, and ../shared does not travel):
#   bench/gpu_device.sh prepare          (bench/device_env.sh)
# then with the device tool:
#   run(command="bash bench/gpu_device.sh", carry=[".whl", ".data"], timeout_s=540)
# Outputs land in $OUT: machine.txt, the test log, each benchmark's log and JSON.
# `bash bench/gpu_device.sh profile`: where a batch's time goes (bench/gpu_profile.py);
# `bash bench/gpu_device.sh serve`: only the HTTP capacity (part 3).
set -uo pipefail
# shellcheck source=bench/device_env.sh
source "$(dirname "$0")/device_env.sh" "$@"  # `prepare` here; there, the wheels and paths
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
