#!/usr/bin/env bash
# Build (or refresh) the environments this project runs in, from nothing:
#   .venv      the dev environment: torch 2.14.1, JAX, Ray, Optuna, MLflow, timm, pytest
#   .venv-xla  with --xla: torch 2.9.0 + torch_xla 2.9.0 for the XLA-on-CPU test lane
# Each is rebuilt only when its constraints file or pyproject.toml changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}

build() {  # build VENV CONSTRAINTS EXTRAS
  local venv=$1 constraints=$2 extras=$3
  local stamp="$venv/.accelsweep-stamp"
  local want
  want=$(cat "$constraints" pyproject.toml | sha256sum | cut -d' ' -f1)
  if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    echo "env: $venv is up to date"
    return
  fi
  echo "env: building $venv (a few minutes the first time)"
  rm -rf "$venv"
  "$PYTHON" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --upgrade pip
  "$venv/bin/python" -m pip install --quiet -c "$constraints" -e ".[$extras]"
  echo "$want" > "$stamp"
}

build .venv env/dev-constraints.txt dev,jax
if [[ "${1:-}" == "--xla" ]]; then
  build .venv-xla env/xla-constraints.txt dev,xla
fi
