#!/usr/bin/env bash
# One device call of a short GPU allocation, from the repository root: benchmarks/gpu/window.py
# on window.yaml, resumed from what the last call returned, then (STAGES) the FID precision
# measurement. Writes $OUT/call.json (device, commit, what each stage measured or why it
# failed) first and after every stage, so it comes back even when the rest fails.
#
#   COMMIT=<sha> MINUTES=9 benchmarks/gpu/call.sh  # device timeout_s: MINUTES * 60 + 30
#
# MINUTES is the whole call; the window gets MINUTES - FID_MINUTES when the FID precision
# stage runs (the weights are there), the rest goes to that stage (generators: the
# committed MNIST DP-MERF one and those the window trained on MNIST, and the real-data row).
#
# Inputs in $INPUTS (default .gpu/, carried; .git/info/exclude ignores it), each optional:
#   whl/*.whl          the wheels benchmarks/gpu/fetch_wheels.sh fetched
#   data/              MNIST/raw and FashionMNIST/raw (the data mirror)
#   inception.part*    the FID weights split to fit a call's transfer (split -b 40M): joined
#                      when their sha256 is the shared file's, else the call only trains
#   state.tgz*, set.tgz.part*  what the last call returned (its archive; the results set)
# Returns in $OUT: call.json, window.log, state.tgz[.partNNN] (private: keep, never publish),
# set.tgz.partaa... (the results set, tar.gz split at 15 MiB: commit it), fid_precision.json.
set -uo pipefail
OUT=${OUT:-results/gpu-call}
MINUTES=${MINUTES:-9}
FID_MINUTES=${FID_MINUTES:-3}
STAGES=${STAGES:-window fid_precision}
SET=${SET:-gpu-window-h200}
SETS=${SETS:-/tmp/sets}  # the results set is built in $SETS/$SET
G=${INPUTS:-.gpu}
FID_ARGS=${FID_ARGS:-}  # more benchmarks/fid_precision.py options (a CPU test: --num 8 ...)
WEIGHTS_SHA256=d9b36da80a6304d8ab322478ec0416c4a40882483c18593cf29fbe0cc25e83cd
mkdir -p "$OUT" "$SETS"
begin=$(date +%s)
commit=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
device=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
export DEVICE="${device:-no GPU}" COMMIT="$commit" CALL_JSON="$OUT/call.json"
record() {  # record STAGE KEY=VALUE ...: merged into call.json
  python3 - "$@" <<'PY'
import json, os, sys
path = os.environ["CALL_JSON"]
call = json.load(open(path)) if os.path.exists(path) else {}
call.update(device=os.environ["DEVICE"], commit=os.environ["COMMIT"])
stage = call.setdefault("stages", {}).setdefault(sys.argv[1], {})
stage.update(dict(arg.split("=", 1) for arg in sys.argv[2:]))
json.dump(call, open(path + ".tmp", "w"), indent=1)
os.replace(path + ".tmp", path)
PY
}
record setup started="$(date -u +%FT%TZ)"

export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
if compgen -G "$G/whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$G"/whl/*.whl \
    && export PYTHONPATH=/tmp/site:$PWD/src PATH=/tmp/site/bin:$PATH
fi
weights=/tmp/pt_inception-2015-12-05-6726825d.pth
rm -f "$weights"  # only this call's parts count
if compgen -G "$G/inception.part*" >/dev/null; then cat "$G"/inception.part* >"$weights"; fi
train_only=--train-only
echo "$WEIGHTS_SHA256  $weights" | sha256sum -c --status 2>/dev/null && train_only=
found=joined; [ -n "$train_only" ] && found="absent or incomplete: --train-only"
record setup weights="$found" torch="$(python3 -c 'import torch; print(torch.__version__)' 2>&1)"
compgen -G "$G/set.tgz.part*" >/dev/null && cat "$G"/set.tgz.part* | tar xz -C "$SETS"

fid_stage=; fid_minutes=0
[[ " $STAGES " == *" fid_precision "* && -z $train_only ]] && fid_stage=1 fid_minutes=$FID_MINUTES
work=/tmp/window-work
if [[ " $STAGES " == *" window "* ]]; then
  archive=()
  compgen -G "$G/state.tgz*" >/dev/null && archive=(--archive-in "$G/state.tgz")
  # shellcheck disable=SC2086
  minutes=$(python3 -c "print(max(0.05, $MINUTES - $fid_minutes - ($(date +%s) - $begin) / 60))")
  rm -rf "$work"
  python3 benchmarks/gpu/window.py --minutes "$minutes" "${archive[@]}" $train_only \
    --workdir "$work" \
    --archive-out "$OUT/state.tgz" --results-set "$SETS/$SET" --commit "$commit" \
    --rates results-paper-scale/step-rates-h200/step_rates.json \
    --config "data_mirror=$(realpath "$G")/data" "fid_weights=$weights" >/tmp/window.out 2>&1
  rc=$?
  cat /tmp/window.out >>"$OUT/window.log"
  record window rc=$rc seconds=$(($(date +%s) - begin)) summary="$(tail -20 /tmp/window.out)"
  [ -d "$SETS/$SET" ] && tar czf - -C "$SETS" "$SET" | split -b 15M - "$OUT/set.tgz.part"
fi
if [[ -n $fid_stage ]]; then
  left=$(python3 -c "print(int($MINUTES * 60 - ($(date +%s) - $begin)))")
  generators=(results-paper-scale/dpmerf-cpu/mnist_dpmerf/generator.pt)
  for g in "$work"/results/paper/mnist_*/generator.pt; do [ -f "$g" ] && generators+=("$g"); done
  timeout "$left" python3 benchmarks/fid_precision.py --weights "$weights" \
    --data-mirror "$G/data" --generators "${generators[@]}" $FID_ARGS \
    --out "$OUT/fid_precision.json" >/tmp/fid_precision.log 2>&1
  record fid_precision rc=$? log="$(tail -5 /tmp/fid_precision.log)"
fi
record setup seconds=$(($(date +%s) - begin))
