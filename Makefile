# cachebuild: every target creates/refreshes the virtualenv it needs.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
CACHE  ?= cache/causal
DST    ?=
GRAPHS ?= 5000

.PHONY: help venv demo test test-fast bench-smoke lint types check bench bench-quick bench-deps gpu-check ramdisk-stage ramdisk-clean clean

help:
	@echo "make demo            venv + install + build a small causal cache ($(GRAPHS) graphs) + verify + inspect"
	@echo "make test            venv + install + the test suite"
	@echo "make lint            ruff: errors (unused or undefined names, bad defaults) and formatting (ruff format --check) in every package, test, benchmark and example"
	@echo "make types           mypy: cachebuild and loaders (strict on the loader, the format and the tools; pyproject.toml [tool.mypy])"
	@echo "make check           what CI (.ci/run) runs: lint, types, tests, bench-smoke"
	@echo "make bench           every benchmark of this tree, peers included (appends to benchmarks/RESULTS.md; ~25 min)"
	@echo "make bench-smoke     the benchmark scripts in quick mode, with checks (tests/test_bench_quick.py; CI runs it after test)"
	@echo "make bench-quick     every benchmark in its quick mode (BENCH_QUICK=1: tiny caches, short runs, nothing recorded; < 2 min)"
	@echo "make gpu-check       on a CUDA machine: the gpu tests + benchmarks/bench_gpu.py -> benchmarks/gpu-check/gpu-check.md"
	@echo "make ramdisk-stage   copy CACHE=$(CACHE) into /dev/shm/cachebuild/<name> and verify it"
	@echo "make ramdisk-clean   remove the staged copy"

# The stamp is rebuilt whenever pyproject.toml changes. torch is pinned first:
# 2.13.0 has a local CPU wheel; any other version pulls GBs of CUDA packages.
$(BIN)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[dev]'
	@command -v zstd >/dev/null || (command -v apt-get >/dev/null && (apt-get install -y -qq zstd >/dev/null 2>&1 || (apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq zstd >/dev/null 2>&1))) || echo "note: the zstd command is missing; its interop test will be skipped"
	touch $@

venv: $(BIN)/.installed

demo: venv
	$(BIN)/cachebuild generate --graphs $(GRAPHS) --out cache/demo
	$(BIN)/cachebuild verify cache/demo
	$(BIN)/cachebuild inspect cache/demo

test: venv
	$(BIN)/python -m pytest -q --durations=25 -m "not bench_smoke"

# The benchmark scripts end to end in quick mode, with checks (tests/test_bench_quick.py); CI runs it after `test`.
bench-smoke: venv
	$(BIN)/python -m pytest -q -m bench_smoke

lint: venv
	$(BIN)/ruff check cachebuild loaders tests benchmarks examples
	$(BIN)/ruff format --check cachebuild loaders tests benchmarks examples

types: venv
	$(BIN)/mypy

check: lint types test bench-smoke

test-fast: venv
	$(BIN)/python -m pytest -q -m "not slow and not dist"

# The peers are a bench extra; LitData goes in with --no-deps (benchmarks/README.md says why).
bench-deps: venv
	$(BIN)/python -m pip install -q -c benchmarks/constraints.txt -e '.[bench]'
	$(BIN)/python -m pip install -q -c benchmarks/constraints.txt --no-deps 'litdata==0.2.76'

# bench_decode and bench_mix compare against an older code tree (--old DIR); bench_gpu needs CUDA (make gpu-check).
BENCHES = bench_build bench_load bench_mel bench_feed bench_remote bench_mixture bench_small bench_pool_mixing

bench: bench-deps
	set -e; for b in $(BENCHES); do $(BIN)/python benchmarks/$$b.py; done

# CI's smoke test: every benchmark end to end on tiny inputs, nothing recorded (tests/test_bench_quick.py
# runs the same); peers that are not installed are skipped with a note.
bench-quick: venv
	set -e; for b in $(BENCHES) peers; do BENCH_QUICK=1 $(BIN)/python benchmarks/$$b.py; done

# No venv here: a GPU machine brings its own CUDA build of torch (GPU_PY=python3); see benchmarks/gpu_check.sh.
gpu-check:
	bash benchmarks/gpu_check.sh

ramdisk-stage: venv
	$(BIN)/cachebuild stage $(CACHE) $(DST)

# where ramdisk-stage puts CACHE when DST is not given (same rule as cachebuild.tools.stage.default_dst)
STAGED = $(if $(DST),$(DST),/dev/shm/cachebuild/$(notdir $(abspath $(CACHE))))

ramdisk-clean: venv
	$(BIN)/cachebuild unstage $(STAGED)

clean:
	rm -rf cache/demo .pytest_cache
