#!/usr/bin/env bash
# Run by Snakemake inside the new conda environment, from the working directory, which
# must be the repository root (the default): installs dpsinkhorn with the exact versions
# of envs/requirements.lock (the ones CI checked).
set -euo pipefail
python -m pip install -c envs/requirements.lock -e .
