#!/usr/bin/env bash
# The measurements that need a GPU (issues 6 and 15), on one GPU machine; it may be offline.
# Run from the project root; each stage appends to $OUT (default results/gpu):
#
#   DATA=<folder with MNIST/raw/*.gz> benchmarks/gpu/run.sh tests bench loop
#   DATA=... WEIGHTS=<pt_inception-2015-12-05-6726825d.pth> benchmarks/gpu/run.sh row
#   benchmarks/gpu/run.sh targets          # the issue's targets: measured, met or not
#
#   tests    tests/test_cuda.py (no host sync; CUDA graph replay = eager bit for bit under
#            deterministic cuDNN; reduced precision within tolerance), the solver tests
#   bench    dpsinkhorn bench: eager (+ layers, solver alone), CUDA graphs, + compiled solver,
#            each of those two in tf32 and bf16 (+ their precision_error), sweep of 8 eager
#            and with both options (fp32, tf32, bf16); the graphed step is also profiled
#            (--profile: device time per kernel of the replay) -> bench.jsonl
#   loop     `dpsinkhorn train` of the paper's MNIST experiment for LOOP_STEPS (default 20000)
#            steps with both options in each precision: the training loop's own steps/s
#            (its train_log.csv, after the first 10% of the steps) -> loop_<precision>.csv
#   row      the MNIST Table 1 paper row end to end (160k steps, 5 x 60k samples, 5 FIDs,
#            15 classifiers in 3 jobs) through Snakemake with cuda_graphs and compile_solver,
#            in PRECISION (default fp32; tf32 or bf16 where bench shows them within tolerance
#            and faster); each call's seconds are appended to row_seconds.txt, every job's
#            Snakemake benchmark copied to row_benchmarks/. Rerun the same command after an
#            interruption: training resumes from its checkpoint and finished jobs are kept.
#   targets  benchmarks/gpu/targets.py on $OUT: each target of issue 15 with its measurement
#
# The machine's working tree is a fresh copy at every call and its /tmp lasts only while it
# stays warm. So results/, data/ and .snakemake/ live under PERSIST (default
# /tmp/dpsinkhorn-persist) and the working tree gets symlinks to them: a row split over several
# calls resumes where the last call stopped (as long as the machine stayed warm).
#
# Dependencies: installed (make install), or, offline, wheels from
# benchmarks/gpu/fetch_wheels.sh installed with WHEELS=<folder> (into /tmp/dpsinkhorn-site,
# where later calls on the same machine find them without WHEELS).
set -euo pipefail
OUT=${OUT:-results/gpu}
PERSIST=${PERSIST:-/tmp/dpsinkhorn-persist}
DATA=${DATA:-}
LOOP_STEPS=${LOOP_STEPS:-20000}

# results/, data/ and .snakemake/ -> $PERSIST (what a fresh copy holds is merged in first)
mkdir -p "$PERSIST"
for dir in results data .snakemake; do
  mkdir -p "$PERSIST/$dir"
  if [[ -e $dir && ! -L $dir ]]; then
    cp -a "$dir/." "$PERSIST/$dir/"
    rm -rf "$dir"
  fi
  ln -sfn "$PERSIST/$dir" "$dir"
done
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if [[ -n $DATA ]]; then export DPSINKHORN_DATA_MIRROR=$DATA; fi

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
git rev-parse --short HEAD 2> /dev/null | tee -a "$OUT/commit.txt" || true

cat << EOF
where everything is:
  persistent folder    $PERSIST (results/, data/, .snakemake/ of the working tree link here)
  this call's output   $OUT (device.txt, commit.txt, tests.log, bench.jsonl, loop_*.csv,
                       row.log, row_seconds.txt, row_benchmarks/, targets.md)
  paper row results    $PERSIST/results/paper/mnist_dpsinkhorn/
  Snakemake logs       $PERSIST/results/paper/logs/, per-job times $PERSIST/results/paper/benchmarks/
EOF

need_data() {
  [[ -n $DATA ]] || { echo "set DATA to the folder holding MNIST/raw/*.gz" >&2; exit 2; }
  dpsinkhorn data --dataset mnist --root data --mirror "$DATA"
}

bench() {
  dpsinkhorn bench --config config/config.yaml --experiment mnist_dpsinkhorn --device "${DEVICE:-cuda}" "$@" \
    | tee -a "$OUT/bench.jsonl"
}

for stage in "$@"; do
  case $stage in
    tests)
      need_data
      # cuBLAS is deterministic only with a fixed workspace (read before its first use)
      CUBLAS_WORKSPACE_CONFIG=${CUBLAS_WORKSPACE_CONFIG:-:4096:8} \
        python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py tests/test_ot.py 2>&1 \
        | tee "$OUT/tests.log"
      ;;
    bench)
      need_data
      bench --impl both --steps 200 --warmup 20 --layers --solver
      bench --impl ours --steps 2000 --warmup 20 --cuda-graphs
      bench --impl ours --steps 2000 --warmup 20 --cuda-graphs --compile-solver --profile 200
      for precision in tf32 bf16; do
        bench --impl ours --steps 2000 --warmup 20 --cuda-graphs --precision $precision
        bench --impl ours --steps 2000 --warmup 20 --cuda-graphs --compile-solver --precision $precision --profile 200
      done
      bench --impl ours --steps 200 --warmup 20 --sweep 8
      for precision in fp32 tf32 bf16; do
        bench --impl ours --steps 1000 --warmup 20 --sweep 8 --cuda-graphs --compile-solver --precision $precision
      done
      ;;
    loop)
      need_data
      for precision in ${LOOP_PRECISIONS:-fp32 tf32 bf16}; do
        run=$PERSIST/loop_$precision
        rm -rf "$run"  # a fresh run each time: the loop's rate, not a resume
        start=$(date +%s)
        dpsinkhorn train --config config/config.yaml --experiment mnist_dpsinkhorn --out "$run" \
          --stop-after "$LOOP_STEPS" --device "${DEVICE:-cuda}" --cuda-graphs --compile-solver \
          --precision "$precision" --no-progress 2>&1 | tail -n 3 || true  # exits 75 (stopped)
        echo "loop $precision: $LOOP_STEPS steps in $(($(date +%s) - start)) s (process)"
        cp "$run/train_log.csv" "$OUT/loop_$precision.csv"
      done
      ;;
    row)
      need_data
      weights=${WEIGHTS:?set WEIGHTS to pytorch-fid\'s Inception weights file}
      targets=$(dpsinkhorn targets --config config/config.yaml --cells table1 \
        | sed -n 's/^#   cell mnist_dpsinkhorn: //p')
      start=$(date +%s)
      snakemake --profile profiles/default --config data_mirror="$DATA" \
        fid_weights="$weights" cuda_graphs=True compile_solver=True precision="${PRECISION:-fp32}" \
        -- $targets \
        2>&1 | tee -a "$OUT/row.log"
      echo "$(($(date +%s) - start)) s (this call, PRECISION=${PRECISION:-fp32}, $(date -u +%FT%TZ))" \
        | tee -a "$OUT/row_seconds.txt" "$PERSIST/row_seconds.txt"
      cp "$PERSIST/row_seconds.txt" "$OUT/row_seconds.txt"  # every call's seconds so far
      mkdir -p "$OUT/row_benchmarks"
      cp results/paper/benchmarks/*.tsv "$OUT/row_benchmarks/"  # one file per job
      ;;
    targets)
      python3 benchmarks/gpu/targets.py "$OUT" | tee "$OUT/targets.md"
      ;;
    *)
      echo "unknown stage $stage (tests, bench, loop, row, targets)" >&2
      exit 2
      ;;
  esac
done
