#!/usr/bin/env bash
# The test command: build the environments if needed, then run the suite in both lanes:
# the main one, and the XLA one (torch-xla on the CPU, in its own venv).
set -euo pipefail
cd "$(dirname "$0")/.."
./env/setup.sh --xla
export RAY_AUTH_MODE=disabled MLFLOW_DISABLE_TELEMETRY=true
echo "== main lane (.venv: torch $(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("torch"))'))"
.venv/bin/python -m pytest -q -m "not xla" "$@"
echo "== XLA lane (.venv-xla: torch-xla on the CPU, PJRT_DEVICE=CPU)"
PJRT_DEVICE=CPU .venv-xla/bin/python -m pytest -q -m xla "$@"
