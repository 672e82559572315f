#!/usr/bin/env bash
# The evaluation issue's one GPU call (benchmarks/README.md, "One short GPU call"), made the
# first call of a window allocation: it takes setup1/ of `dpsinkhorn gpu-window-carry` into
# the machine's cache (the wheels, MNIST, a committed generator and the Inception weights'
# first part, which waits there for call 2 of `window_call.sh`), then runs
# `dpsinkhorn bench-eval` at the paper's protocol (random Inception weights, MNIST's real
# test set) and, with the time left, the CUDA tests of the fast classifier loop.
#
#   benchmarks/gpu/bench_eval_call.sh BUDGET_S
#
# BENCH_ARGS  more options of bench-eval (e.g. "--step-precisions" to skip the step section)
#
# Writes $OUT/bench-eval.json (rewritten after each section: a deadline keeps what was
# measured), $OUT/bench-eval.log and $OUT/cuda-tests.log.
set -uo pipefail
BUDGET=${1:-300}
CARRY=${CARRY:-.window}; OUT=${OUT:-results/bench-eval}; CACHE=${CACHE:-/tmp/window}
export PYTHONUNBUFFERED=1
start=$SECONDS
mkdir -p "$OUT" "$CACHE"
if [[ ! -d /tmp/site ]]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
    "$CARRY"/setup1/wheels/*.whl
fi
export PYTHONPATH=/tmp/site:$PWD/src PATH=/tmp/site/bin:$PATH
python3 -c "import sys; from pathlib import Path; from dpsinkhorn.window_setup import take_setup
print('setup1:', take_setup(Path(sys.argv[1]), Path(sys.argv[2])))" "$CARRY/setup1" "$CACHE"
python3 -m dpsinkhorn data --dataset mnist --mirror "$CACHE/mirror" --root /tmp/bench-data > /dev/null
echo "set up in $((SECONDS - start)) s; $(nvidia-smi --query-gpu=name --format=csv,noheader)"
left=$((BUDGET - (SECONDS - start) - 45))
gen=$(ls "$CACHE"/import/*/generator.pt | head -1)  # a committed generator setup1 carried
echo "generator: $gen"
timeout "$left" python3 -m dpsinkhorn bench-eval --device cuda \
  --generator "$gen" --test /tmp/bench-data/mnist/test.npz \
  --out "$OUT/bench-eval.json" --sqrtm eigh --compare-epochs 2 --steps 200 ${BENCH_ARGS:-} 2>&1 |
  tee "$OUT/bench-eval.log"
echo "bench-eval: rc ${PIPESTATUS[0]} at $((SECONDS - start)) s"
left=$((BUDGET - (SECONDS - start) - 5))
if ((left > 15)); then
  DPSINKHORN_DATA_MIRROR="$CACHE/mirror" timeout "$left" python3 -m pytest -q \
    -p no:cacheprovider tests/test_cuda_fastfit.py tests/test_cuda.py 2>&1 |
    tee "$OUT/cuda-tests.log" | tail -5
fi
echo "done at $((SECONDS - start)) s"
