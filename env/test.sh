#!/usr/bin/env bash
# The test command: build the environments if needed, then run the suite in both lanes:
# the main one, and the XLA one (torch-xla on the CPU, in its own venv). The main lane runs
# in two passes: two pytest-xdist workers take every test not marked host_timing or alone
# (tests/conftest.py says what stays on one worker), then those run one at a time, with the
# machine to themselves. Each pass ends with its 15 slowest tests.
#   ./env/test.sh            the whole suite (what CI runs)
#   ./env/test.sh --quick    the edit loop: the main lane's tests not marked slow (about 1.5 min)
# Other arguments go to pytest (a file, -k EXPR, -x).
set -euo pipefail
cd "$(dirname "$0")/.."
export RAY_AUTH_MODE=disabled MLFLOW_DISABLE_TELEMETRY=true
# Bytecode cached as Python caches it by default (__pycache__/, ignored by git), even where the
# environment says not to (PYTHONDONTWRITEBYTECODE, set on this project's VMs): else each of
# the suite's processes (drivers, trials, hundreds of them) compiles the package's modules
# again, and each pytest process rewrites every test module's asserts (about 5 s). The quick
# lane, this VM, one run after the other: 154 s with it set, 138 and 135 s without
# (benchmarks/results/test_suite.md, the tenth run).
unset PYTHONDONTWRITEBYTECODE
WORKERS=(-n "${ACCELSWEEP_TEST_WORKERS:-2}" --dist loadfile)
ALONE="host_timing or alone"
# The serial pass (and the XLA lane) collects only the files that hold its tests
# (collecting them all costs about 20 s), unless the command names its own.
ALONE_FILES=$(grep -l -E "mark\.(host_timing|alone)" tests/test_*.py | tr '\n' ' ')

main_lane() {  # main_lane MARKER_EXPRESSION PYTEST_ARGS...: the parallel pass, then the serial one
  local selected=$1
  shift
  local parallel=0 serial=0
  .venv/bin/python -m pytest -q "${WORKERS[@]}" -m "($selected) and not ($ALONE)" --durations=15 "$@" || parallel=$?
  echo "== main lane, one test at a time (marked $ALONE)"
  local files=()
  (( $# )) || read -r -a files <<< "$ALONE_FILES"
  .venv/bin/python -m pytest -q -m "($selected) and ($ALONE)" --durations=15 "${files[@]}" "$@" || serial=$?
  # 5: that pass selected no test (a file or -k with none of them): not a failure.
  for status in $parallel $serial; do
    [[ $status == 0 || $status == 5 ]] || return "$status"
  done
}

if [[ "${1:-}" == "--quick" ]]; then
  shift
  ./env/setup.sh
  echo "== quick lane (.venv: tests not marked slow; ./env/test.sh runs them all)"
  main_lane "not xla and not slow" "$@"
  exit
fi
./env/setup.sh --xla
echo "== main lane (.venv: torch $(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("torch"))'))"
main_lane "not xla" "$@"
echo "== XLA lane (.venv-xla: torch-xla on the CPU, PJRT_DEVICE=CPU)"
xla_files=()
(( $# )) || read -r -a xla_files <<< "$(grep -l -E "mark\.xla" tests/test_*.py | tr '\n' ' ')"
# One process: its tests are XLA compiles that take both cores (two workers measured no faster).
PJRT_DEVICE=CPU .venv-xla/bin/python -m pytest -q -m xla --durations=15 "${xla_files[@]}" "$@"
