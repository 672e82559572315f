#!/usr/bin/env bash
# make test-slurm: the workflow through profiles/slurm on a live single-node SLURM cluster.
#
#   tests/slurm/run_live_cluster.sh [pytest args]
#
# Installs slurm-wlm and munge if missing (apt-get, root), starts slurmctld and slurmd on
# this machine with their state in a temporary folder (tests/slurm/cluster.sh), runs
# tests/test_slurm.py against it, and stops the cluster whatever happens. The folder
# (slurm.conf, daemon logs) is kept when the tests fail. Data and FID weights:
# DPSINKHORN_DATA_MIRROR and DPSINKHORN_FID_WEIGHTS, as for the smoke test.
set -euo pipefail
cd "$(dirname "$0")/../.."
cluster=tests/slurm/cluster.sh

"$cluster" install
dir=$(mktemp -d "${TMPDIR:-/tmp}/dpsinkhorn-slurm.XXXXXX")
status=1
# shellcheck disable=SC2317  # (run by the trap)
cleanup() {
    "$cluster" stop "$dir" || true
    if ((status == 0)); then
        rm -rf "$dir"
    else
        echo "test cluster's configuration and logs kept in $dir" >&2
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

start=$SECONDS
"$cluster" start "$dir"
export SLURM_CONF=$dir/slurm.conf DPSINKHORN_SLURM=1
set +e
python -m pytest -m slurm tests/test_slurm.py -v -s -p no:cacheprovider --durations=10 "$@"
status=$?
set -e
echo "make test-slurm: $((SECONDS - start)) s (exit $status)"
exit $status
