#!/usr/bin/env bash
# The GPU gates of 0089 on a CUDA machine with forktool installed: source archives of three series
# positions, one CUDA build plus host-only switches, then gates (a)-(d). Results in build/gpu-gates/out.
set -euo pipefail
python3 gates/device_bundle.py --out build/device-bundle
bash gates/device_build.sh build/device-bundle build/device-out 16
python3 gates/gpu_gates.py --full-bin build/device-out/full --pre-bin build/device-out/pre0089 \
  --upstream-bin build/device-out/upstream --work build/gpu-gates --out build/gpu-gates/out
