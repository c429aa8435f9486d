#!/usr/bin/env bash
# `forktool gates 0089` one gate at a time, as many as fit in a wall-clock budget, for a GPU machine lent by the
# call (a 10-minute limit per command, a cap on how many files come back). Each gate runs as its own
# `GPU_GATES_ONLY=<gate> forktool gates 0089` (the builds are reused from the call before: gates/device_build.sh
# skips a position whose archive is unchanged); a gate whose estimate no longer fits is skipped, saying so. Every
# gate's forktool report, JSON, curves and logs, and the build logs, are packed into OUT/gates.tgz.
#   usage: gates/run_within.sh OUT LIMIT_S GATE[:EST_S[:GPU_GATES_ARGS]]...
#   e.g.   gates/run_within.sh "$OUT" 585 a:480 b:175 c:260 d:200
#   FORKTOOL   how to run forktool (default: python3 -m forktool)
#   KIT        a folder `make device-kit` wrote elsewhere (carried to a machine without network): its bundle/ is
#              the GPU_GATES_BUNDLE, its wheels/ are installed once into ~/.forktool-kit (pip --no-index) for
#              python3, and the repository root goes on PYTHONPATH
#   GPU_GATES_BUNDLE is passed through otherwise (archives made elsewhere by python -m gates.bundle)
set -u
[ $# -ge 3 ] || { echo "usage: $0 OUT LIMIT_S GATE[:EST_S[:ARGS]]..." >&2; exit 2; }
out=$1; limit=$2; shift 2
case $limit in ''|*[!0-9]*) echo "run_within: LIMIT_S must be whole seconds, not '$limit'" >&2; exit 2;; esac
mkdir -p "$out/gates" || exit 2
if [ -n "${KIT:-}" ]; then
  [ -d "$KIT/bundle" ] || { echo "run_within: KIT=$KIT has no bundle/ (make device-kit writes one)" >&2; exit 2; }
  export GPU_GATES_BUNDLE=$KIT/bundle
  if [ -d "$KIT/wheels" ]; then
    site=$HOME/.forktool-kit
    if [ ! -f "$site/.installed" ] || [ "$(cat "$site/.installed")" != "$(ls "$KIT/wheels" | sha256sum)" ]; then
      rm -rf "$site"
      python3 -m pip install -q --no-index --no-deps --target "$site" "$KIT"/wheels/*.whl > "$out/gates/pip.log" 2>&1 \
        || { echo "run_within: installing $KIT/wheels failed (see $out/gates/pip.log)" >&2; exit 2; }
      ls "$KIT/wheels" | sha256sum > "$site/.installed"
    fi
    export PYTHONPATH=$site:$PWD${PYTHONPATH:+:$PYTHONPATH}
  fi
  [ -d /usr/local/cuda/lib64 ] && export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
read -r -a forktool <<< "${FORKTOOL:-python3 -m forktool}"
# each gate starts from empty result folders, so that no file is put down to a gate that did not write it; what an
# earlier run left there is kept apart first
for d in build/gpu-gates/out build/gates; do
  if [ -d "$d" ]; then mkdir -p "$out/gates/0-earlier/$d" && cp -r "$d/." "$out/gates/0-earlier/$d/"; fi
done
t0=$(date +%s)
worst=0
i=0
for spec in "$@"; do
  i=$((i + 1))
  g=${spec%%:*}; est=60; args=""
  if [ "$spec" != "$g" ]; then rest=${spec#*:}; est=${rest%%:*}; [ "$rest" != "$est" ] && args=${rest#*:}; fi
  el=$(( $(date +%s) - t0 ))
  if [ $((el + est)) -gt "$limit" ]; then
    echo "skip $g: $el s gone + its estimate $est s > $limit s" | tee -a "$out/gates/summary.txt"
    worst=1; continue
  fi
  echo "run $g at $el s (GPU_GATES_ARGS=[$args])" | tee -a "$out/gates/summary.txt"
  rm -rf build/gpu-gates/out build/gates
  GPU_GATES_ONLY=$g GPU_GATES_ARGS=$args timeout $((limit - el)) "${forktool[@]}" gates 0089 \
    > "$out/gates/$i-$g.forktool.txt" 2>&1
  rc=$?
  [ $rc -ne 0 ] && worst=1
  if [ $rc -eq 124 ]; then  # timeout stopped forktool (and, through it, the gate's whole process group)
    echo "  $g: stopped by the time limit at $(( $(date +%s) - t0 )) s (exit 124): not checked" | tee -a "$out/gates/summary.txt"
  else
    echo "  $g: exit $rc at $(( $(date +%s) - t0 )) s" | tee -a "$out/gates/summary.txt"
  fi
  mkdir -p "$out/gates/$i-$g"
  cp -r build/gpu-gates/out/. "$out/gates/$i-$g/" 2>/dev/null
  cp build/gates/*.log "$out/gates/$i-$g/" 2>/dev/null
done
cp build/device-out/*.txt build/device-out/*.log "$out/gates/" 2>/dev/null
tar czf "$out/gates.tgz" -C "$out" gates && rm -rf "$out/gates"
exit $worst
