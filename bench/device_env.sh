#!/usr/bin/env bash
# Sourced by the scripts run on a lent GPU machine (bench/gpu_device.sh, bench/cores_device.sh).
# `prepare` (here, once): the wheels the machine's image lacks into .whl/ and the datasets into
# .data/ (../shared does not travel), both ignored by git and named in the run's `carry`.
# There: installs the wheels to /tmp/site and sets PYTHONPATH, OUT and GNNSERVE_DATASETS.
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
  exit 0
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
