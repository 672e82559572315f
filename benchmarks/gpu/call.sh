#!/usr/bin/env bash
# One device call of a short GPU allocation, from the repository root: benchmarks/gpu/window.py
# resumed from the last call's archive, then (STAGES) benchmarks/fid_precision.py. Writes
# $OUT/call.json (device, commit, each stage's exit status and summary) first and after every
# stage. Inputs ($INPUTS) and outputs: benchmarks/README.md, "A short GPU allocation".
#
#   COMMIT=<sha> MINUTES=9 benchmarks/gpu/call.sh  # device timeout_s: MINUTES * 60 + 30
set -uo pipefail
OUT=${OUT:-results/gpu-call}
MINUTES=${MINUTES:-9}
FID_MINUTES=${FID_MINUTES:-3}  # of MINUTES, for the FID precision stage when it runs
STAGES=${STAGES:-window fid_precision}
SETS=${SETS:-/tmp/sets}  # the results set is built in $SETS/$SET
SET=${SET:-gpu-window-h200}
G=${INPUTS:-.gpu}
FID_ARGS=${FID_ARGS:-}  # more benchmarks/fid_precision.py options (a CPU test: --num 8 ...)
WEIGHTS=/tmp/pt_inception-2015-12-05-6726825d.pth
WEIGHTS_SHA256=d9b36da80a6304d8ab322478ec0416c4a40882483c18593cf29fbe0cc25e83cd
begin=$(date +%s)
mkdir -p "$OUT" "$SETS"
device=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
COMMIT=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
export DEVICE="${device:-no GPU}" DPSINKHORN_COMMIT=$COMMIT  # the window's commit too
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
record() {  # record STAGE KEY=VALUE ...: merged into $OUT/call.json (atomic)
  python3 - "$OUT/call.json" "$@" <<'PY'
import json, os, sys
path, stage, pairs = sys.argv[1], sys.argv[2], sys.argv[3:]
call = json.load(open(path)) if os.path.exists(path) else {}
call.update(device=os.environ["DEVICE"], commit=os.environ["DPSINKHORN_COMMIT"])
call.setdefault("stages", {}).setdefault(stage, {}).update(p.split("=", 1) for p in pairs)
json.dump(call, open(path + ".tmp", "w"), indent=1)
os.replace(path + ".tmp", path)
PY
}
record setup started="$(date -u +%FT%TZ)"

if compgen -G "$G/whl/*.whl" >/dev/null; then  # envs/fetch_wheels.sh's; dpsinkhorn itself from src/
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$G"/whl/*.whl \
    && export PYTHONPATH=/tmp/site:$PYTHONPATH PATH=/tmp/site/bin:$PATH \
    && printf '#!/bin/sh\nexec python3 -m dpsinkhorn "$@"\n' >/tmp/site/bin/dpsinkhorn \
    && chmod +x /tmp/site/bin/dpsinkhorn
fi
cat "$G"/inception.part* >"$WEIGHTS" 2>/dev/null  # split -b 40M: a call's transfer
train_only=--train-only weights="absent or incomplete: --train-only"
echo "$WEIGHTS_SHA256  $WEIGHTS" | sha256sum -c --status 2>/dev/null && train_only= weights=joined
record setup weights="$weights" torch="$(python3 -c 'import torch; print(torch.__version__)' 2>&1)"
compgen -G "$G/set.tgz.part*" >/dev/null && cat "$G"/set.tgz.part* | tar xz -C "$SETS"

fid_stage= fid_minutes=0  # the FID precision stage runs with the whole weights only
[[ " $STAGES " == *" fid_precision "* && -z $train_only ]] && fid_stage=1 fid_minutes=$FID_MINUTES
work=/tmp/window-work
if [[ " $STAGES " == *" window "* ]]; then
  archive=()  # the last call's archive, returned in parts of at most 15 MiB
  cat "$G"/state.tgz.part* >/tmp/state.tgz 2>/dev/null && archive=(--archive-in /tmp/state.tgz)
  minutes=$(python3 -c "print(max(0.05, $MINUTES - $fid_minutes - ($(date +%s) - $begin) / 60))")
  rm -rf "$work" "$OUT"/state.tgz*
  # shellcheck disable=SC2086
  python3 benchmarks/gpu/window.py --minutes "$minutes" "${archive[@]}" $train_only \
    --workdir "$work" --archive-out "$OUT/state.tgz" --results-set "$SETS/$SET" \
    --rates results-paper-scale/step-rates-h200/step_rates.json \
    --config "data_mirror=$(realpath "$G")/data" "fid_weights=$WEIGHTS" >/tmp/window.out 2>&1
  rc=$?
  cat /tmp/window.out >>"$OUT/window.log"
  [ -f "$OUT/state.tgz" ] && split -b 15M "$OUT/state.tgz" "$OUT/state.tgz.part" \
    && rm "$OUT/state.tgz"
  record window rc=$rc seconds=$(($(date +%s) - begin)) summary="$(tail -20 /tmp/window.out)"
  [ -d "$SETS/$SET" ] && tar czf - -C "$SETS" "$SET" | split -b 15M - "$OUT/set.tgz.part"
fi
if [[ -n $fid_stage ]]; then  # the real-data row, the committed MNIST DP-MERF generator and
  generators=(results-paper-scale/dpmerf-cpu/mnist_dpmerf/generator.pt)  # those trained here
  for g in "$work"/results/paper/mnist_*/generator.pt; do [ -f "$g" ] && generators+=("$g"); done
  left=$(python3 -c "print(int($MINUTES * 60 - ($(date +%s) - $begin)))")
  # shellcheck disable=SC2086
  timeout "$left" python3 benchmarks/fid_precision.py \
    --weights "$WEIGHTS" --data-mirror "$G/data" --generators "${generators[@]}" $FID_ARGS \
    --out "$OUT/fid_precision.json" >/tmp/fid_precision.log 2>&1
  record fid_precision rc=$? log="$(tail -5 /tmp/fid_precision.log)"
fi
record setup seconds=$(($(date +%s) - begin))
