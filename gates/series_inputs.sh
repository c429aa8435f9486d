#!/usr/bin/env bash
# What a packed build or source bundle was made from, and the check that it is the carried checkout's series.
#   gates/series_inputs.sh              the digest of patches/series, patches/*.patch, vendor/vendor.lock and
#                                       registry/build.yaml (the profiles' flags) of the checkout in the current directory (`make device-bin` and `gates.bundle`
#                                       write it beside what they pack, as inputs.sha256)
#   gates/series_inputs.sh --check DIR  exit 0 where DIR/inputs.sha256 equals that digest; else exit 2 saying so,
#                                       unless DEVICE_OTHER_SERIES=1 (an older build or bundle on purpose), which
#                                       goes on and says that the results describe that build, not this tree
set -euo pipefail
export LC_ALL=C
digest() { sha256sum patches/series patches/*.patch vendor/vendor.lock registry/build.yaml | sha256sum | cut -c1-64; }
if [ "${1:-}" != --check ]; then digest; exit 0; fi
dir=${2:?usage: $0 [--check DIR]}
[ -f "$dir/inputs.sha256" ] || { echo "$dir holds no inputs.sha256, so nothing says which series it was made" \
  "from: make it again here (make device-bin, or make device-kit / python -m gates.bundle)" >&2; exit 2; }
made=$(cat "$dir/inputs.sha256")
here=$(digest 2>/dev/null || echo "(unreadable: run in the repository root)")
[ "$made" = "$here" ] && exit 0
if [ "${DEVICE_OTHER_SERIES:-}" != 1 ]; then
  echo "$dir was made from other patches, another pin or other build flags than this checkout's (made from ${made:0:12}, this" \
    "checkout ${here:0:12}): make it again (make device-bin, or make device-kit / python -m gates.bundle), or set" \
    "DEVICE_OTHER_SERIES=1 to use it anyway" >&2
  exit 2
fi
echo "$dir was made from other series inputs (${made:0:12}) than this checkout's (${here:0:12}), used as" \
  "DEVICE_OTHER_SERIES=1 asks: its results describe that build, not this tree" >&2
