#!/usr/bin/env bash
# Build (or refresh) the environments this project runs in, from nothing:
#   .venv      the dev environment: torch 2.14.1, JAX, Ray, Optuna, MLflow, timm, pytest
#   .venv-xla  with --xla: torch 2.9.0 + torch_xla 2.9.0 for the XLA-on-CPU test lane
# Each is rebuilt only when its constraints file, pyproject.toml or setup.py changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}

# GiB a build needs: the venv (.venv 7, .venv-xla 8: CUDA builds of torch, whose CUDA
# libraries PyPI's torch always brings) plus pip's downloads while it installs.
NEED_GIB=11

build() {  # build VENV CONSTRAINTS EXTRAS
  local venv=$1 constraints=$2 extras=$3
  local stamp="$venv/.accelsweep-stamp"
  local want
  want=$(cat "$constraints" pyproject.toml setup.py | sha256sum | cut -d' ' -f1)
  if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    echo "env: $venv is up to date"
    return
  fi
  local free_gib
  free_gib=$(df -Pk . | awk 'NR == 2 { print int($4 / 1048576) }')
  if (( free_gib < NEED_GIB )); then
    echo "env: building $venv needs about $NEED_GIB GiB free on this disk; it has $free_gib GiB." >&2
    echo "env: free some (old clones' .venv and .venv-xla, about 15 GiB a clone; pip's cache: pip cache purge) and rerun." >&2
    exit 1
  fi
  echo "env: building $venv (a few minutes the first time)"
  rm -rf "$venv"
  "$PYTHON" -m venv "$venv"
  # pip warns once per package about this machine's missing extra indexes: keep them out
  # of the log, so that a real error is not buried.
  "$venv/bin/python" -m pip install --quiet --upgrade pip 2> >(grep -v "^WARNING: Location '.*' is ignored" >&2)
  # setuptools says in a box, at every editable install, that a folder named like the
  # package may shadow it: information, not a warning (setuptools' InformationOnly).
  PYTHONWARNINGS="ignore:Editable installation" \
    "$venv/bin/python" -m pip install --quiet -c "$constraints" -e ".[$extras]" \
    2> >(grep -v "^WARNING: Location '.*' is ignored" >&2)
  echo "$want" > "$stamp"
}

build .venv env/dev-constraints.txt dev,jax
if [[ "${1:-}" == "--xla" ]]; then
  build .venv-xla env/xla-constraints.txt dev,xla
fi
