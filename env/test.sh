#!/usr/bin/env bash
# The test command: build the environments if needed, then run the suite in both lanes:
# the main one, and the XLA one (torch-xla on the CPU, in its own venv). Each lane ends
# with its 15 slowest tests.
#   ./env/test.sh            the whole suite (what CI runs)
#   ./env/test.sh --quick    the edit loop: the main lane's tests not marked slow (under 2 min)
# Other arguments go to pytest (a file, -k EXPR, -x).
set -euo pipefail
cd "$(dirname "$0")/.."
export RAY_AUTH_MODE=disabled MLFLOW_DISABLE_TELEMETRY=true
if [[ "${1:-}" == "--quick" ]]; then
  shift
  ./env/setup.sh
  echo "== quick lane (.venv: tests not marked slow; ./env/test.sh runs them all)"
  exec .venv/bin/python -m pytest -q -m "not xla and not slow" --durations=15 "$@"
fi
./env/setup.sh --xla
echo "== main lane (.venv: torch $(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("torch"))'))"
.venv/bin/python -m pytest -q -m "not xla" --durations=15 "$@"
echo "== XLA lane (.venv-xla: torch-xla on the CPU, PJRT_DEVICE=CPU)"
PJRT_DEVICE=CPU .venv-xla/bin/python -m pytest -q -m xla --durations=15 "$@"
