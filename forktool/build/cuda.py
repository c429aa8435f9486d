"""The CUDA toolkit as CMake needs it: nvcc, cuBLAS (the toolkit's or the nvidia-cublas wheel's), libcuda."""

from __future__ import annotations

import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from forktool import proc
from forktool.errors import ConfigError

STUB_DIR = "forktool-stubs"  # inside the build directory: the link-time stand-in for the driver library

# where the nvidia-cublas wheels put their files, newest first: 13.x (nvidia/cu13), 12.x (nvidia/cublas)
_WHEEL_DIRS = ("nvidia/cu13", "nvidia/cublas")


@dataclass(frozen=True)
class Toolkit:
    nvcc: str
    root: Path  # the toolkit holding nvcc (its bin/..)
    cublas: Path | None  # the wheel's libcublas when the toolkit has none
    cublas_lt: Path | None
    cublas_include: Path | None
    driver: Path | None  # libcuda found on this machine; None: a stub is made at configure time

    def cmake_flags(self, bdir: Path) -> list[str]:
        """What CMake's FindCUDAToolkit needs: the toolkit of this nvcc (FindCUDAToolkit runs before the CUDA
        language is enabled and would otherwise take the first nvcc on PATH, not $CUDACXX's), and where cuBLAS and
        libcuda are when the toolkit lacks them."""
        flags = [f"-DCUDAToolkit_ROOT={self.root}"]
        if self.cublas and self.cublas_lt and self.cublas_include:
            flags += [f"-DCUDA_cublas_LIBRARY={self.cublas}", f"-DCUDA_cublasLt_LIBRARY={self.cublas_lt}",
                      f"-DCMAKE_CUDA_STANDARD_INCLUDE_DIRECTORIES={self.cublas_include}"]
        if self.driver is None:
            # the backend links libcuda for its virtual-memory calls; a machine without a GPU driver links against
            # an empty stand-in (as the toolkit's own stubs/libcuda.so is), so that code still compiles
            flags.append(f"-DCUDA_cuda_driver_LIBRARY={bdir / STUB_DIR / 'libcuda.so'}")
        return flags


def find_nvcc() -> str | None:
    """nvcc as CMake would find it: $CUDACXX when it is set (CMake takes that one or fails, so no other counts),
    else PATH, then /usr/local/cuda/bin."""
    cudacxx = os.environ.get("CUDACXX", "")
    cands = (cudacxx,) if cudacxx else (shutil.which("nvcc") or "", "/usr/local/cuda/bin/nvcc")
    for cand in cands:
        if cand and os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    return None


def toolkit_root(nvcc: str) -> Path:
    """The toolkit directory of nvcc (its bin/..); where nvcc is a wrapper script elsewhere, the first of
    $CUDA_PATH, $CUDA_HOME and /usr/local/cuda that holds the runtime's headers."""
    cands = [Path(nvcc).resolve().parent.parent, *(Path(os.environ[v]) for v in ("CUDA_PATH", "CUDA_HOME")
                                                     if os.environ.get(v)), Path("/usr/local/cuda")]
    return next((c for c in cands if (c / "include" / "cuda_runtime.h").is_file()), cands[0])


def _first(patterns: list[Path]) -> Path | None:
    for pattern in patterns:
        found = sorted(pattern.parent.glob(pattern.name)) if pattern.parent.is_dir() else []
        if found:
            return found[0]
    return None


def _lib_dirs(root: Path) -> list[Path]:
    return [root / "lib64", root / "lib", *sorted(root.glob("targets/*/lib"))]


def find_toolkit() -> Toolkit:
    """The toolkit on this machine; ConfigError naming what is missing and how to get it."""
    nvcc = find_nvcc()
    if nvcc is None:
        cudacxx = os.environ.get("CUDACXX", "")
        if cudacxx:
            raise ConfigError(f"nvcc not found: $CUDACXX names {cudacxx}, which is not an executable file",
                              where="cuda profile", hint="point CUDACXX at nvcc, or unset it to use PATH")
        raise ConfigError("nvcc not found ($CUDACXX, PATH, /usr/local/cuda/bin)", where="cuda profile",
                          hint="install the CUDA toolkit (nvcc) to compile the cuda profile "
                               "(`make cuda-toolkit` installs one from PyPI, docs/ci.md)")
    root = toolkit_root(nvcc)
    libs = _lib_dirs(root)
    cublas = cublas_lt = include = None
    if _first([d / "libcublas.so*" for d in libs]) is None:
        for sub in _WHEEL_DIRS:
            base = next((Path(p) / sub for p in sys.path if p and (Path(p) / sub / "include" / "cublas_v2.h").is_file()),
                        None)
            if base is None:
                continue
            cublas = _first([base / "lib" / "libcublas.so*"])
            cublas_lt = _first([base / "lib" / "libcublasLt.so*"])
            include = base / "include"
            if cublas and cublas_lt:
                break
        if not (cublas and cublas_lt):
            raise ConfigError(f"cuBLAS not found: not in {root} and no nvidia-cublas wheel in this Python",
                              where="cuda profile",
                              hint="`pip install 'forktool[cuda]'` (the nvidia-cublas wheel), or `make setup` where "
                                   "nvcc is installed")
    driver = _first([d / "stubs" / "libcuda.so" for d in libs] + [d / "libcuda.so*" for d in libs]
                    + [Path("/usr/lib/x86_64-linux-gnu/libcuda.so*"), Path("/usr/lib64/libcuda.so*")])
    return Toolkit(nvcc, root, cublas, cublas_lt, include, driver)


_DRIVER_FN_RE = re.compile(rb"\b(cu[A-Z][A-Za-z0-9_]*)\s*\(")


def make_driver_stub(bdir: Path, nvcc: str | None = None) -> None:
    """A stand-in libcuda.so for the link, as the toolkit's own stubs/libcuda.so is: every driver function cuda.h
    declares (names as the preprocessor leaves them, e.g. cuMemAlloc_v2) defined empty, under the driver's soname,
    so what links against it records libcuda.so.1 and loads the real driver on a GPU machine. Compiled here."""
    out = bdir / STUB_DIR / "libcuda.so"
    if out.is_file():
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise ConfigError("no C compiler to make the libcuda stand-in", where=str(out), hint="install gcc")
    root = toolkit_root(nvcc or find_nvcc() or "/usr/local/cuda/bin/nvcc")
    header = bdir / STUB_DIR / "driver.h"
    header.write_bytes(b"#include <cuda.h>\n")
    pre = proc.run([cc, "-E", "-I", root / "include", "-x", "c", header], check=False)
    names = sorted(set(_DRIVER_FN_RE.findall(pre.stdout)))
    src = bdir / STUB_DIR / "libcuda.c"
    src.write_bytes(b"".join(b"int %s(void) { return 999; }\n" % n for n in names))  # CUDA_ERROR_UNKNOWN
    proc.run([cc, "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", out, src])
