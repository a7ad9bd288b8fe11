#!/usr/bin/env bash
# Issue 44's 16-core run on a lent GPU machine (its 16 CPU cores; <= 10 minutes): HTTP capacity
# at p99 <= 30 ms of `serve --workers W` for W = 1, 2, 4, 8, 16 (bench/cores.py, gnnserve arms
# alone: no PyG sampler can be installed there, see bench/cores.py).
#
# Here, once: bench/gpu_device.sh prepare
# then with the device tool:
#   run(command="bash bench/cores_device.sh", carry=[".whl", ".data"], timeout_s=600)
# Outputs in $OUT: cores.log and the JSON (bench/results/cores_16cpu.json when it has 16 cores).
set -uo pipefail
# shellcheck source=bench/device_env.sh
source "$(dirname "$0")/device_env.sh" "$@"
nproc | tee "$OUT/machine.txt"
(cd bench && timeout 560 python3 cores.py --workers 1,2,4,8,16 --rounds 1 --budget-s 480 \
  --no-baseline) 2>&1 | grep -v "NumbaPerformanceWarning\|warn(errors" | tee "$OUT/cores.log"
cp bench/results/cores_*cpu.json "$OUT/" 2>/dev/null || echo "no cores JSON" >&2
