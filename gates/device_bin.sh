#!/usr/bin/env bash
# On a GPU machine: unpack what `make device-bin` packed (the full series' CUDA build made elsewhere) and run a
# command with it: BIN names the unpacked folder (llama-completion and its libraries, found through
# LD_LIBRARY_PATH), the wheels are installed once for python3 (pip --no-index) and go on PYTHONPATH with the
# repository root. For one build's comparisons, e.g. of OPENCOTI_KV_DEBUG flags:
#   usage: gates/device_bin.sh DIR COMMAND...
#   e.g.   gates/device_bin.sh build/device-bin 'python3 -m gates.kernel_profile --bin "$BIN" --no-ncu --debug "" no-ring-carry'
# The archive is unpacked again only when its sha256 changed (HOME/.forktool-device-bin/.archive).
# It runs only the build of the carried checkout's own series (gates/series_inputs.sh --check: DIR/inputs.sha256,
# written by `make device-bin`, against this checkout's patches and pin; DEVICE_OTHER_SERIES=1 runs an older build on
# purpose, saying so), so a measurement never describes a build of other patches than the tree it is reported for.
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 DIR COMMAND..." >&2; exit 2; }
dir=$1; shift
[ -f "$dir/full-bin.tgz" ] || { echo "device_bin: $dir/full-bin.tgz missing (make device-bin writes it)" >&2; exit 2; }
bash "$(dirname "$0")/series_inputs.sh" --check "$dir" || exit 2
[ -f "$dir/build-stamp" ] && echo "device_bin: the cuda build of $(cat "$dir/build-stamp")" >&2
BIN=$HOME/.forktool-device-bin
sum=$(sha256sum "$dir/full-bin.tgz" | cut -d' ' -f1)
if [ ! -f "$BIN/.archive" ] || [ "$(cat "$BIN/.archive")" != "$sum" ]; then
  rm -rf "$BIN" && mkdir -p "$BIN"
  tar xzf "$dir/full-bin.tgz" -C "$BIN"
  echo "$sum" > "$BIN/.archive"
  echo "device_bin: unpacked ${sum:0:12} into $BIN" >&2
fi
[ -x "$BIN/llama-completion" ] || { echo "device_bin: $dir/full-bin.tgz holds no llama-completion" >&2; exit 2; }
site=$HOME/.forktool-device-bin-py
if compgen -G "$dir/wheels/*.whl" > /dev/null; then
  want=$(ls "$dir/wheels" | sha256sum)
  if [ ! -f "$site/.installed" ] || [ "$(cat "$site/.installed")" != "$want" ]; then
    rm -rf "$site"
    python3 -m pip install -q --no-index --no-deps --target "$site" "$dir"/wheels/*.whl >&2 \
      || { echo "device_bin: installing $dir/wheels failed" >&2; exit 2; }
    echo "$want" > "$site/.installed"
  fi
fi
export BIN
export LD_LIBRARY_PATH=$BIN${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
[ -d /usr/local/cuda/lib64 ] && export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:/usr/local/cuda/lib64
export PYTHONPATH=$site:$PWD${PYTHONPATH:+:$PYTHONPATH}
exec bash -c "$*"
