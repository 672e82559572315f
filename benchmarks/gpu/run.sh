#!/usr/bin/env bash
# The speed measurements that need a GPU (issue 6), on one GPU machine; it may be offline.
# Run from the project root; each stage appends to $OUT (default results/gpu):
#
#   DATA=<folder with MNIST/raw/*.gz> benchmarks/gpu/run.sh tests bench
#   DATA=... WEIGHTS=<pt_inception-2015-12-05-6726825d.pth> benchmarks/gpu/run.sh row
#
#   tests  tests/test_cuda.py (no host sync; CUDA graph replay = eager), the solver tests
#   bench  dpsinkhorn bench: eager (+ layers, solver alone), CUDA graphs, + compiled solver,
#          each of those two in tf32 and bf16 (+ their precision_error), sweep of 8 eager
#          and with both options (fp32, tf32) -> bench.jsonl
#   row    the MNIST Table 1 paper row end to end (160k steps, 5 x 60k samples, 5 FIDs,
#          15 classifiers) through Snakemake with cuda_graphs and compile_solver, in
#          PRECISION (default fp32; tf32 or bf16 where bench shows them within tolerance
#          and faster); each job's
#          time is in results/paper/benchmarks/*.tsv (row_benchmarks.txt), the whole in
#          row_seconds.txt. With DPSINKHORN_JOBS_PER_GPU=J, J evaluation steps share the GPU
#          (the row's wall time; leave it unset to time each step alone: the issue's
#          "each under a minute"). Rerun the same command after an interruption: training resumes
#          from its checkpoint.
#
# Dependencies: installed (make install), or, offline, wheels from
# benchmarks/gpu/fetch_wheels.sh installed with WHEELS=<folder> (into /tmp/dpsinkhorn-site,
# where later calls on the same machine find them without WHEELS).
set -euo pipefail
OUT=${OUT:-results/gpu}
DATA=${DATA:?set DATA to the folder holding MNIST/raw/*.gz}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 DPSINKHORN_DATA_MIRROR=$DATA

SITE=/tmp/dpsinkhorn-site  # wheels installed by an earlier call on the same machine stay
if [[ -n ${WHEELS:-} ]]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$SITE" \
    "$WHEELS"/*.whl
fi
if [[ -d $SITE ]]; then
  export PYTHONPATH=$SITE:$PWD/src${PYTHONPATH:+:$PYTHONPATH} PATH=$SITE/bin:$PATH
fi
if ! command -v dpsinkhorn > /dev/null; then  # the project itself, uninstalled: src on the path
  mkdir -p /tmp/dpsinkhorn-bin
  printf '#!/bin/sh\nexec python3 -m dpsinkhorn "$@"\n' > /tmp/dpsinkhorn-bin/dpsinkhorn
  chmod +x /tmp/dpsinkhorn-bin/dpsinkhorn
  export PATH=/tmp/dpsinkhorn-bin:$PATH PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
fi
python3 -c "import torch; c = torch.cuda; print(torch.__version__, c.is_available() and c.get_device_name())" \
  | tee -a "$OUT/device.txt"

bench() {
  dpsinkhorn bench --config config/config.yaml --experiment mnist_dpsinkhorn --device "${DEVICE:-cuda}" "$@" \
    | tee -a "$OUT/bench.jsonl"
}

for stage in "$@"; do
  case $stage in
    tests)
      python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py tests/test_ot.py 2>&1 \
        | tee "$OUT/tests.log"
      ;;
    bench)
      dpsinkhorn data --dataset mnist --root data --mirror "$DATA"
      bench --impl both --steps 200 --warmup 20 --layers --solver
      bench --impl ours --steps 2000 --warmup 20 --cuda-graphs
      bench --impl ours --steps 2000 --warmup 20 --cuda-graphs --compile-solver
      for precision in tf32 bf16; do
        bench --impl ours --steps 2000 --warmup 20 --cuda-graphs --precision $precision
        bench --impl ours --steps 2000 --warmup 20 --cuda-graphs --compile-solver --precision $precision
      done
      bench --impl ours --steps 200 --warmup 20 --sweep 8
      bench --impl ours --steps 1000 --warmup 20 --sweep 8 --cuda-graphs --compile-solver
      bench --impl ours --steps 1000 --warmup 20 --sweep 8 --cuda-graphs --compile-solver --precision tf32
      ;;
    row)
      weights=${WEIGHTS:?set WEIGHTS to pytorch-fid\'s Inception weights file}
      targets=$(dpsinkhorn targets --config config/config.yaml --cells table1 \
        | sed -n 's/^#   cell mnist_dpsinkhorn: //p')
      start=$(date +%s)
      snakemake --profile profiles/default --config data_mirror="$DATA" \
        fid_weights="$weights" cuda_graphs=True compile_solver=True precision="${PRECISION:-fp32}" \
        -- $targets \
        2>&1 | tee -a "$OUT/row.log"
      echo "$(($(date +%s) - start)) s (this call)" | tee -a "$OUT/row_seconds.txt"
      tail -n +1 results/paper/benchmarks/*.tsv > "$OUT/row_benchmarks.txt"  # one file per job
      ;;
    *)
      echo "unknown stage $stage (tests, bench, row)" >&2
      exit 2
      ;;
  esac
done
