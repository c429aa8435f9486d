#!/usr/bin/env bash
# The GPU gates of 0089 on a CUDA machine with forktool installed: source archives of the series positions, one
# CUDA build plus host-only switches (positions whose archive is unchanged since the last build are reused), then
# `python -m gates.gpu` and the plots. Results in build/gpu-gates/out.
#   GPU_GATES_ONLY    gates to run (default a,b,c,d,e; f = the per-token breakdown, g = the budget curve)
#   GPU_GATES_BUNDLE  a folder that already holds the archives `python -m gates.bundle` wrote (made where forktool
#                     runs, carried to a GPU machine without it); unset: they are made here
#   GPU_GATES_ARGS    more arguments for `python -m gates.gpu` (e.g. --budget-ctxs 1048576)
#   a before.tar.gz placed in the bundle beforehand is built too and compared as "before"; without one,
#   "before" is the full build on its copying tail path (OPENCOTI_KV_DEBUG=copy-tail); GPU_GATES_ARGS with
#   --compare-debug FLAGS (the full build with those flags), --before-bin or --before-copy names it instead
set -euo pipefail
py=${PYTHON:-python3}
bundle=${GPU_GATES_BUNDLE:-build/device-bundle}
if [ -z "${GPU_GATES_BUNDLE:-}" ]; then "$py" -m gates.bundle --out "$bundle"; fi
bash gates/device_build.sh "$bundle" build/device-out 16
# "before": a before build when there is one, else the full build on its copying tail path, unless GPU_GATES_ARGS
# names its own (--before-bin, --before-copy, --compare-debug: gates.gpu refuses two)
before=()
case " ${GPU_GATES_ARGS:-} " in
  *" --before-bin"*|*" --before-copy"*|*" --compare-debug"*) ;;
  *) if [ -d build/device-out/before ]; then before=(--before-bin build/device-out/before); else before=(--before-copy); fi ;;
esac
rc=0
# shellcheck disable=SC2086  # GPU_GATES_ARGS is a list of words
"$py" -m gates.gpu --full-bin build/device-out/full --pre-bin build/device-out/pre0089 \
  --upstream-bin build/device-out/upstream "${before[@]}" --work build/gpu-gates --out build/gpu-gates/out \
  --only "${GPU_GATES_ONLY:-a,b,c,d,e}" ${GPU_GATES_ARGS:-} || rc=$?
if [ -f build/gpu-gates/out/rolling_kv_curve.csv ]; then
  "$py" -m gates.plot build/gpu-gates/out/rolling_kv_curve.csv -o build/gpu-gates/out/rolling_kv_curve.png
fi
if [ -f build/gpu-gates/out/budget_curve.csv ]; then
  "$py" -m gates.plot_budget build/gpu-gates/out/budget_curve.csv -o build/gpu-gates/out/budget_curve.png
fi
exit $rc
