#!/usr/bin/env bash
# On a CUDA machine: build the cuda profile from the full-series source archive once, then switch the
# sources to the other series positions writing only files whose bytes differ, so `make` rebuilds just
# the host objects (the series is host-only: the CUDA DSO must come out byte-identical every time).
# A position whose archive has the same sha256 as at its last build is not rebuilt (OUT/<position>/.archive), as long
# as its files are still the ones that build wrote (OUT/<position>/.manifest: every file's sha256 and every link's
# target; a file changed, added or removed since means a rebuild, saying why); a position whose archive is not in the
# bundle is not built (full is required). The bundle must be of the carried checkout's series: its inputs.sha256
# (written by gates.bundle) is checked by gates/series_inputs.sh --check, DEVICE_OTHER_SERIES=1 overriding it.
#   DEVICE_BUILD_SERVER=1  also build llama-server for the full series (the needle gate boots it)
# usage: gates/device_build.sh BUNDLE_DIR OUT_DIR [JOBS]
set -euo pipefail
bundle=$1; out=$2; jobs=${3:-16}
work=build/device
mkdir -p "$work" "$out"
flags=(-G "Unix Makefiles" -DCMAKE_BUILD_TYPE=Release -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF
       -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DGGML_NATIVE=OFF -DGGML_BACKEND_DL=ON
       -DGGML_CPU_ALL_VARIANTS=OFF -DCMAKE_BUILD_RPATH_USE_ORIGIN=ON
       -DGGML_CUDA=ON -DGGML_CUDA_NCCL=OFF -DCMAKE_CUDA_ARCHITECTURES=90)
server=${DEVICE_BUILD_SERVER:-0}
if [ "$server" = 1 ]; then flags+=(-DLLAMA_BUILD_SERVER=ON); else flags+=(-DLLAMA_BUILD_SERVER=OFF); fi
targets=(llama-completion llama-perplexity llama-bench ggml-cuda)
[ -f "$bundle/full.tar.gz" ] || { echo "device_build: $bundle/full.tar.gz missing" >&2; exit 2; }
bash "$(dirname "$0")/series_inputs.sh" --check "$bundle" || exit 2  # the carried checkout's own series only
positions=(full)
for v in before pre0089 upstream; do
  if [ -f "$bundle/$v.tar.gz" ]; then positions+=("$v"); fi
done
src=$work/src
export GIT_CEILING_DIRECTORIES=$PWD/$work
manifest() {  # what a build's output directory holds: each file's sha256, each link's target
  (cd "$1" && find . -mindepth 1 ! -name .archive ! -name .manifest | LC_ALL=C sort | while IFS= read -r f; do
    if [ -L "$f" ]; then echo "link $f $(readlink "$f")"
    elif [ -f "$f" ]; then echo "file $f $(sha256sum < "$f" | cut -d' ' -f1)"
    else echo "dir $f"; fi
  done)
}
for v in "${positions[@]}"; do
  sum=$(sha256sum "$bundle/$v.tar.gz" | cut -d' ' -f1)
  if [ -f "$out/$v/.archive" ] && [ "$(cat "$out/$v/.archive")" = "$sum" ] && [ -x "$out/$v/llama-completion" ] \
     && { [ "$server" != 1 ] || [ "$v" != full ] || [ -x "$out/$v/llama-server" ]; }; then
    if [ -f "$out/$v/.manifest" ] && [ "$(manifest "$out/$v")" = "$(cat "$out/$v/.manifest")" ]; then
      echo "$v: unchanged since its last build (archive ${sum:0:12}), reused"
      continue
    fi
    echo "$v: $out/$v is not what its last build wrote (a file changed, added or removed, or no .manifest): rebuilt"
  fi
  rm -rf "$work/$v" && mkdir -p "$work/$v"
  tar xzf "$bundle/$v.tar.gz" -C "$work/$v"
  if [ ! -d "$src" ]; then
    cp -a "$work/$v/llama.cpp" "$src"
  else
    python3 - "$work/$v/llama.cpp" "$src" <<'PY'
import filecmp, os, shutil, sys
new, dst = sys.argv[1], sys.argv[2]
changed = 0
for d, _, files in os.walk(new):
    for f in files:
        a = os.path.join(d, f); b = os.path.join(dst, os.path.relpath(a, new))
        if not os.path.exists(b) or not filecmp.cmp(a, b, shallow=False):
            os.makedirs(os.path.dirname(b), exist_ok=True); shutil.copy2(a, b); os.utime(b); changed += 1
for d, _, files in os.walk(dst):
    for f in files:
        b = os.path.join(d, f)
        if not os.path.exists(os.path.join(new, os.path.relpath(b, dst))):
            os.unlink(b); changed += 1
print(f"switched {changed} files")
PY
  fi
  t0=$(date +%s)
  if [ ! -f "$work/bld/CMakeCache.txt" ]; then
    cmake -S "$src" -B "$work/bld" "${flags[@]}" -DLLAMA_BUILD_COMMIT=device-gates >"$out/configure.log" 2>&1
  fi
  extra=()
  if [ "$server" = 1 ] && [ "$v" = full ]; then extra=(llama-server); fi
  make -C "$work/bld" -j"$jobs" "${targets[@]}" "${extra[@]}" >"$out/make-$v.log" 2>&1
  t1=$(date +%s)
  echo "$v: make $((t1-t0)) s, $(grep -c 'Building' "$out/make-$v.log" || true) objects"
  rm -rf "${out:?}/$v" && mkdir -p "$out/$v" && cp -a "$work/bld/bin/." "$out/$v/"
  manifest "$out/$v" > "$out/$v/.manifest"
  echo "$sum" > "$out/$v/.archive"
done
sha256sum "$out"/*/libggml-cuda.so "$out"/*/libggml-base.so "$out"/*/libllama.so | tee "$out/artifact-sha256.txt"
