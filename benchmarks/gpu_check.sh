#!/usr/bin/env bash
# make gpu-check: every GPU test, then the GPU benchmarks, into one results folder.
#   GPU_PY   the Python with a CUDA build of torch (default: .venv/bin/python if present, else python3)
#   GPU_OUT  where the results go (default: benchmarks/gpu-check); gpu-check.md is the one file to read
# On a machine without CUDA it says so and exits 0.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${GPU_PY:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
OUT=${GPU_OUT:-benchmarks/gpu-check}
mkdir -p "$OUT"
if ! "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu-check: no CUDA device visible to $PY; nothing to check (run this on a GPU machine)"
    exit 0
fi
tests=$(grep -l "pytest.mark.gpu" tests/test_*.py | tr '\n' ' ')
echo "== gpu tests: $tests"
"$PY" -m pytest -q -m gpu -p no:cacheprovider $tests 2>&1 | tee "$OUT/gpu-tests.txt"
test_rc=${PIPESTATUS[0]}
echo "== bench_gpu"
"$PY" benchmarks/bench_gpu.py --out "$OUT/gpu.json" --md "$OUT/gpu.md" ${BENCH_ARGS:-}
bench_rc=$?
{
    echo "# gpu-check, $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo
    echo "## GPU tests (exit $test_rc)"
    echo
    echo '```'
    tail -n 15 "$OUT/gpu-tests.txt"
    echo '```'
    echo
    echo "## bench_gpu (exit $bench_rc)"
    echo
    cat "$OUT/gpu.md" 2>/dev/null || echo "(no table: see the log above)"
} > "$OUT/gpu-check.md"
echo "gpu-check: results in $OUT/gpu-check.md"
[ "$test_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
