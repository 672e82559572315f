#!/usr/bin/env bash
# One call of a short GPU window, the same script every call (benchmarks/README.md, "A short
# GPU window"). Run from the repository root on the GPU machine, with what this call carried
# under CARRY (default .window/: setup<N>/ from `dpsinkhorn gpu-window-carry`, and the last
# call's state.tgz):
#
#   benchmarks/gpu/window_call.sh N BUDGET_S COMMIT [LATER_S]
#
# N         the call's number: setup<N>/ is taken into the machine's cache (/tmp/window)
# BUDGET_S  seconds this script may take in all (the window stops its work in time to pack)
# COMMIT    the checkout's commit (a copied tree may have no .git)
# LATER_S   work seconds of this allocation's calls after this one (default 0): a training
#           starts only when it fits this call and those
# BENCH=1   first measure steps/s (bf16, tf32, a sweep of 8, the non-private B = 500 step) and
#           a torch profiler summary of the graphed bf16 step: $OUT/bench.jsonl (the sweep in
#           tf32: vmap does not apply bf16 autocast)
# Writes $OUT/state.tgz (parts when large, within ARCHIVE_MIB, default 16, the room
# gpu-window-carry --archive-mib keeps): carry it into the next call as $CARRY/state.tgz.
# Writes $OUT/results-paper-scale/<device>-<commit>/: the finished cells with provenance,
# a results set to commit as it is (copy it into the checkout's results-paper-scale/), and
# $OUT/results-set.tgz, the same set as one file.
set -uo pipefail
N=$1; BUDGET=$2; COMMIT=$3; LATER=${4:-0}
CARRY=${CARRY:-.window}; OUT=${OUT:-results/window}; CACHE=${CACHE:-/tmp/window}
export PYTHONUNBUFFERED=1
start=$SECONDS
mkdir -p "$OUT" "$CACHE"
if [[ ! -d /tmp/site ]]; then  # wheels (first call on this machine)
  wheels=$(ls -d "$CARRY"/setup*/wheels 2> /dev/null | head -1)
  if [[ -z $wheels ]]; then  # e.g. the last call's machine was given back between calls
    echo "call $N: a fresh machine and no wheels carried: carry setup1 to setup$N of" \
      ".window/ again (the wheels, the weights' parts)" >&2
    exit 2
  fi
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
    "$wheels"/*.whl
fi
export PYTHONPATH=/tmp/site:$PWD/src PATH=/tmp/site/bin:/tmp/window-bin:$PATH
mkdir -p /tmp/window-bin  # `dpsinkhorn` for the workflow's jobs: the project uninstalled
printf '#!/bin/sh\nexec python3 -m dpsinkhorn "$@"\n' > /tmp/window-bin/dpsinkhorn
chmod +x /tmp/window-bin/dpsinkhorn
if [[ -d $CARRY/setup$N ]]; then
  python3 -c "import sys; from pathlib import Path; from dpsinkhorn.window_setup import take_setup
print('setup$N:', take_setup(Path(sys.argv[1]), Path(sys.argv[2])))" "$CARRY/setup$N" "$CACHE"
fi
device="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) (torch $(python3 -c 'import torch; print(torch.__version__)'))"
echo "call $N on $device: set up in $((SECONDS - start)) s"
if [[ ${BENCH:-0} == 1 ]]; then
  python3 -m dpsinkhorn data --dataset mnist --mirror "$CACHE/mirror" --root /tmp/bench-data > /dev/null
  sed "s|^data_dir:.*|data_dir: /tmp/bench-data|" config/config.yaml > /tmp/bench-config.yaml
  bench() {  # bench ARGS...: one JSON line appended to $OUT/bench.jsonl
    timeout "${BENCH_TIMEOUT:-90}" python3 -m dpsinkhorn bench --config /tmp/bench-config.yaml \
      --device cuda --impl ours --cuda-graphs --compile-solver "$@" >> "$OUT/bench.jsonl" \
      2>> "$OUT/bench.err"
    echo "bench $*: rc $? at $((SECONDS - start)) s"
  }
  bench --experiment mnist_dpsinkhorn --steps 1000 --warmup 20 --precision bf16 --profile 50
  bench --experiment mnist_dpsinkhorn --steps 1000 --warmup 20 --precision tf32
  bench --experiment mnist_dpsinkhorn --steps 200 --warmup 10 --precision tf32 --sweep 8  # bf16 cannot sweep
  bench --experiment mnist_nonprivate --steps 300 --warmup 10 --precision bf16
fi
archive=()
[[ -f $CARRY/state.tgz || -f $CARRY/state.tgz.part000 ]] && archive=(--archive-in "$CARRY/state.tgz")
python3 -m dpsinkhorn gpu-window --config benchmarks/gpu/window.yaml "${archive[@]}" \
  --archive-out "$OUT/state.tgz" --budget-s $((BUDGET - (SECONDS - start))) --reserve-s 45 \
  --archive-cap-mib "${ARCHIVE_MIB:-16}" --later-s "$LATER" --results-set "$OUT/results-paper-scale" \
  --commit "$COMMIT" --device-name "$device" --import-root "$CACHE/import" \
  --workdir /tmp/window-work \
  --snakemake-config data_mirror="$CACHE/mirror" fid_weights="$CACHE/inception_pool3.pth"
echo "window: rc $? at $((SECONDS - start)) s"
# The device tool returns files at most two folders below $OUT: the set travels as one file
# too (tar xzf results-set.tgz in the checkout's root puts it in results-paper-scale/).
[[ -d $OUT/results-paper-scale ]] && tar czf "$OUT/results-set.tgz" -C "$OUT" results-paper-scale
