#!/usr/bin/env bash
# Run one sweep on a lent GPU machine through Ray, Optuna and MLflow, and bring its MLflow
# store back. The machine has torch, Triton and JAX but no Ray, Optuna or MLflow and no
# registry: env/gpu_bundle.py builds what it lacks, here, into .gpu-bundle/ (ignored by git).
#
#   here, once (and after a change of requirements):
#     .venv/bin/python env/gpu_bundle.py build
#   there, through the device tool's run, in the repository root, carrying the bundle:
#     run(command="bash env/gpu_run.sh sweeps/attention_kernels.py --platform cuda --smoke",
#         carry=[".gpu-bundle"])
#
# The arguments are the sweep: a script path or `-m module`, with its own flags; this
# script adds --tracking-uri and --storage-path (do not pass them). `--pytest ARGS` runs
# pytest instead, in the same environment (e.g. --pytest -s tests/test_cuda_kernels.py),
# its output in $OUT/pytest.log. `--plan FILE` runs FILE's steps in turn, one a line:
# `CAP_S NAME SCRIPT|--pytest|--python ARGS...` (a SCRIPT is a sweep and gets the store's
# flags; `--python` runs a plain script), each stopped with SIGINT after its CAP_S seconds
# and all of them within PLAN_DEADLINE_S (default 480 s); each step's output and the
# files it writes under $OUT/results go back in results.tar.gz, its exit status in
# steps.txt. The sweep is stopped
# with SIGINT after SWEEP_TIMEOUT_S (default 480 s: a device command may run 600 s), and
# what it finished is still in the store. It writes to $OUT, which comes back:
#   mlflow-store.tar.gz   accelsweep-gpu/: mlflow.db, mlartifacts/ (reports, plots), the Optuna study
#   sweep.log             the sweep's output
#   machine-packages.txt  the machine's `pip list --format=freeze`, for the next build's --installed
#   machine.txt           the GPU (nvidia-smi), Python and torch as this run found them
# Open the store here where it was written (its artifact paths are absolute):
#   tar xzf mlflow-store.tar.gz -C /tmp
#   .venv/bin/mlflow ui --backend-store-uri sqlite:////tmp/accelsweep-gpu/mlflow.db --host 127.0.0.1
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
BUNDLE=${GPU_BUNDLE:-$REPO/.gpu-bundle}
STORE=/tmp/accelsweep-gpu             # fixed: the store's artifact URIs name it
SITE=/tmp/accelsweep-site             # the bundle, installed
WHEELS=/tmp/accelsweep-wheels
PYTHON=${PYTHON:-python3}             # on the machine: the Python that holds torch

fail() { echo "error: $*" >&2; exit 2; }
[[ $# -gt 0 ]] || fail "name the sweep: bash env/gpu_run.sh SCRIPT|-m MODULE [its flags]"
[[ -n "${OUT:-}" && -d "$OUT" ]] || fail "\$OUT is not a folder: run this through the device tool's run"
[[ -f "$BUNDLE/wheels.tar.xz" && -f "$BUNDLE/bundle.json" ]] ||
  fail "no bundle in $BUNDLE: build it here with env/gpu_bundle.py build and carry .gpu-bundle"
for flag in "$@"; do
  case $flag in --tracking-uri*|--storage-path*) fail "$flag is set by env/gpu_run.sh (the store must come back)";; esac
done
[[ $1 != --pytest || $# -gt 1 ]] || fail "--pytest needs pytest's arguments (e.g. tests/test_cuda_kernels.py)"

{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1 || echo "no nvidia-smi"
  "$PYTHON" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1 || true
} > "$OUT/machine.txt"
"$PYTHON" -m pip list --format=freeze > "$OUT/machine-packages.txt" 2>/dev/null   # before the bundle joins the path

rm -rf "$WHEELS" "$SITE" "$STORE" && mkdir -p "$WHEELS" "$SITE" "$STORE"
tar xJf "$BUNDLE/wheels.tar.xz" -C "$WHEELS"
"$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "$WHEELS"/*.whl
# accelsweep is this checkout: its front door (accelsweep/__init__.py) finds sweeps/,
# trainables/ and kernels/ beside it when nothing is installed.
export PYTHONPATH="$SITE:$REPO${PYTHONPATH:+:$PYTHONPATH}"   # Ray's workers inherit it
export RAY_AUTH_MODE=disabled MLFLOW_DISABLE_TELEMETRY=true PYTHONUNBUFFERED=1
# JAX takes 75% of the GPU's memory at its first call unless told not to: a process that
# runs JAX and torch kernels both (tests/test_cuda_kernels.py) would leave torch a quarter.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
"$PYTHON" env/gpu_bundle.py check --bundle "$BUNDLE" --site "$SITE"

set +e
if [[ $1 == --plan ]]; then
  [[ -f ${2:-} ]] || fail "--plan needs a file of steps (e.g. env/gpu_plan_issue32.txt)"
  deadline=$(( $(date +%s) + ${PLAN_DEADLINE_S:-480} ))
  mkdir -p "$OUT/results"
  while read -r cap name kind rest; do
    [[ -z ${cap:-} || $cap == \#* ]] && continue
    read -r -a words <<< "$rest"
    case $kind in
      --pytest) command=("$PYTHON" -m pytest -p no:cacheprovider "${words[@]}");;
      --python) command=("$PYTHON" "${words[@]}");;
      *) command=("$PYTHON" "$kind" "${words[@]}" --tracking-uri "sqlite:///$STORE/mlflow.db"
                  --storage-path /tmp/accelsweep-ray);;
    esac
    left=$(( deadline - $(date +%s) - 20 ))     # 20 s for the last step's stop and the packing
    (( cap > left )) && cap=$left
    if (( cap < 10 )); then
      echo "$name: not run (the plan's deadline)" | tee -a "$OUT/results/steps.txt"; continue
    fi
    started=$(date +%s)
    echo "== $name (cap $cap s): ${command[*]}"
    OUT=$OUT/results timeout --signal=INT --kill-after=15 "$cap" "${command[@]}" > "$OUT/results/$name.log" 2>&1 < /dev/null
    echo "$name: exit $? in $(( $(date +%s) - started )) s (cap $cap s)" | tee -a "$OUT/results/steps.txt"
    tail -n "${PLAN_TAIL_LINES:-30}" "$OUT/results/$name.log"
  done < "$2"
  tar czf "$OUT/mlflow-store.tar.gz" -C "$(dirname "$STORE")" "$(basename "$STORE")"
  cp "$OUT/results/steps.txt" "$OUT/steps.txt" 2>/dev/null
  tar czf "$OUT/results.tar.gz" -C "$OUT" results && rm -rf "$OUT/results"
  echo "gpu_run: plan done; store $(du -h "$OUT/mlflow-store.tar.gz" | cut -f1), results $(du -h "$OUT/results.tar.gz" | cut -f1)"
  cat "$OUT/steps.txt"
  exit 0
fi
if [[ $1 == --pytest ]]; then
  shift
  "$PYTHON" -m pytest -p no:cacheprovider "$@" 2>&1 | tee "$OUT/pytest.log"
  exit "${PIPESTATUS[0]}"
fi
timeout --signal=INT --kill-after=60 "${SWEEP_TIMEOUT_S:-480}" "$PYTHON" "$@" \
  --tracking-uri "sqlite:///$STORE/mlflow.db" --storage-path /tmp/accelsweep-ray 2>&1 | tee "$OUT/sweep.log"
status=${PIPESTATUS[0]}
set -e
tar czf "$OUT/mlflow-store.tar.gz" -C "$(dirname "$STORE")" "$(basename "$STORE")"
echo "gpu_run: sweep exit status $status; store $(du -h "$OUT/mlflow-store.tar.gz" | cut -f1) in mlflow-store.tar.gz"
exit "$status"
