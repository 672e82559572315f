#!/usr/bin/env bash
# Refresh envs/requirements.lock: install the package with its `dev` extra into a throwaway
# venv, with the open ranges of pyproject.toml only, and write the exact versions pip chose.
# Usage (from the repository root): make lock   [PYTHON=python3.11]
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$python" -m venv "$tmp/venv"
"$tmp/venv/bin/python" -m pip install --quiet '.[dev]'
{
  echo "# Exact versions of every Python dependency, as \`make install\` (and CI) installs them."
  echo "# Written by envs/lock.sh ('make lock') on $(date -u +%Y-%m-%d) with"
  echo "# $("$tmp/venv/bin/python" --version) on $(uname -sm); used as pip constraints (-c)."
  "$tmp/venv/bin/python" -m pip freeze --exclude-editable | grep -v '^dpsinkhorn[ =@]'
} > envs/requirements.lock.tmp
mv envs/requirements.lock.tmp envs/requirements.lock
echo "wrote envs/requirements.lock ($(grep -vc '^#' envs/requirements.lock) packages)"
