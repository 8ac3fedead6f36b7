#!/usr/bin/env bash
# The test command: build the environments if needed, then run the suite.
set -euo pipefail
cd "$(dirname "$0")/.."
./env/setup.sh
export RAY_AUTH_MODE=disabled MLFLOW_DISABLE_TELEMETRY=true
.venv/bin/python -m pytest -q "$@"
