#!/usr/bin/env bash
# Run by Snakemake inside the new conda environment, from the working directory, which
# must be the repository root (the default): installs dpsinkhorn with its dependencies.
set -euo pipefail
python -m pip install -e .
