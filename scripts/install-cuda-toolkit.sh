#!/usr/bin/env bash
# A CUDA toolkit without a GPU and without NVIDIA's installers: nvcc, its back end (cicc, ptxas, fatbinary), the
# runtime, CCCL and cuBLAS from NVIDIA's PyPI wheels, laid out as a toolkit directory that CMake's
# FindCUDAToolkit and forktool's cuda profile take as it is (bin/, include/, lib/, nvvm/, targets/x86_64-linux/).
#
#   scripts/install-cuda-toolkit.sh PREFIX     (or `make cuda-toolkit CUDA_PREFIX=PREFIX`)
#
# Then CUDACXX=PREFIX/bin/nvcc (or PREFIX/bin on PATH) makes it the toolkit of `forktool build --profile cuda`
# and `forktool build --check --profile cuda`. The install is checked before it is kept: nvcc compiles a kernel
# that includes the runtime, CUB and cuBLAS headers, for the architecture registry/build.yaml builds (sm_90),
# and the object is linked against the runtime and cuBLAS. A PREFIX that already holds this exact set of
# wheels is kept as it is (a restored CI cache); another one is replaced whole, never half-written.
#
# Environment: PYTHON (default python3; its pip downloads the wheels), CUDA_ARCH (default 90).
set -euo pipefail

# One CUDA 13.0 release. cuBLAS is the pin of pyproject.toml's `cuda` extra (tests/test_cuda_toolkit.py keeps
# the two in step); the others are the versions NVIDIA's cuda-toolkit 13.0.3 metapackage names.
WHEELS=(
  nvidia-cuda-nvcc==13.0.88
  nvidia-nvvm==13.0.88
  nvidia-cuda-crt==13.0.88
  nvidia-cuda-runtime==13.0.96
  nvidia-cuda-cccl==13.0.85
  nvidia-cuda-culibos==13.0.85
  nvidia-cublas==13.0.2.14
)
STAMP=forktool-cuda-toolkit.txt

die() { echo "install-cuda-toolkit: $*" >&2; exit 1; }
version() { "$1/bin/nvcc" --version | sed -n 's/.*release [0-9.]*, V\([0-9.]*\).*/\1/p'; }

[ $# -eq 1 ] && [ -n "$1" ] || die "usage: $0 PREFIX (the directory to hold the toolkit)"
case "$(uname -s)-$(uname -m)" in
  Linux-x86_64) ;;
  *) die "NVIDIA publishes these wheels for Linux x86_64; this is $(uname -s) $(uname -m)" ;;
esac
prefix=$(realpath -m -- "$1")
python=${PYTHON:-python3}
arch=${CUDA_ARCH:-90}
want=$(printf '%s\n' "${WHEELS[@]}")

if [ -f "$prefix/$STAMP" ] && [ "$(cat "$prefix/$STAMP")" = "$want" ] && [ -x "$prefix/bin/nvcc" ]; then
  echo "cuda toolkit: $prefix already holds these wheels (nvcc $(version "$prefix"))"
  exit 0
fi
"$python" -m pip --version >/dev/null 2>&1 || die "$python has no pip (set PYTHON to a Python with pip)"

parent=$(dirname -- "$prefix")
mkdir -p -- "$parent"
work=$(mktemp -d "$parent/.cuda-toolkit.XXXXXX")
trap 'rm -rf -- "$work"' EXIT

echo "cuda toolkit: downloading ${#WHEELS[@]} wheels with $python -m pip"
"$python" -m pip install --quiet --disable-pip-version-check --root-user-action=ignore --no-deps --only-binary :all: \
  --target "$work/site" "${WHEELS[@]}" || die "pip could not install the wheels (see above)"

# every wheel of CUDA 13 puts its files under nvidia/cu13/: together they are the toolkit's tree
tk="$work/toolkit"
mv -- "$work/site/nvidia/cu13" "$tk"
rm -rf -- "$tk/.metadata"
[ -x "$tk/bin/nvcc" ] && [ -x "$tk/nvvm/bin/cicc" ] && [ -x "$tk/bin/ptxas" ] \
  || die "the wheels did not bring nvcc, cicc and ptxas under nvidia/cu13/"
# what a toolkit installer adds: the unversioned library names the linker and CMake look for, lib64, and the
# targets/ directory nvcc.profile names for its include and library paths
for so in "$tk"/lib/lib*.so.*; do
  base=${so%.so.*}.so
  [ -e "$base" ] || ln -s "$(basename -- "$so")" "$base"
done
ln -s lib "$tk/lib64"
mkdir -p "$tk/targets/x86_64-linux"
ln -s ../../include "$tk/targets/x86_64-linux/include"
ln -s ../../lib "$tk/targets/x86_64-linux/lib"

# the check: a kernel through cicc, ptxas and fatbinary, with the headers ggml-cuda uses, then a host link
cat > "$work/check.cu" <<'CU'
#include <cuda_runtime.h>
#include <cublas_v2.h>
#include <cub/cub.cuh>
__global__ void scale(float *x, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= a;
}
int main() {
  cublasHandle_t h;
  if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) return 1;  // no GPU here: only the link is checked
  scale<<<1, 32>>>(nullptr, 2.0f, 0);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
CU
"$tk/bin/nvcc" -arch="sm_$arch" -o "$work/check" "$work/check.cu" -L"$tk/lib" -lcublas \
  || die "the toolkit from the wheels does not compile a kernel (see nvcc's error above)"

echo "$want" > "$tk/$STAMP"
rm -rf -- "$prefix"
mv -- "$tk" "$prefix"
echo "cuda toolkit: $prefix (nvcc $(version "$prefix")); a kernel with the runtime, CUB and cuBLAS compiled and linked for sm_$arch"
