"""Command-line flags every sweep script shares, what they mean for the Sweep, and the
error ending.

    parser = common_parser(__doc__.split("\n\n")[0], default_samples=24)
    args = parser.parse_args()
    platform, note = platform_from_args(args)
    sweep = Sweep(name=..., base=..., space=..., platform_note=note,
                  **sweep_options(args, default_samples=24))
    if args.dry_run:
        print(plan_sweep(sweep).describe())
    else:
        run_sweep(sweep)  # checks where it runs (preflight) before anything starts
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

from accelsweep.trainables.errors import ConfigError, SweepStopped
from accelsweep.trainables.cost import CostBasis, resolve_cost_basis
from accelsweep.trainables.platforms import PLATFORM_NAMES, get_platform, resolve_platform
from accelsweep.trainables.loop.rejection import REJECT_RATIO
from accelsweep.trainables.process_end import end_process
from accelsweep.sweeps.driver.define.store_checks import STORAGE_PATH_VARIABLE, TUNE_STORAGE_PATH
from accelsweep.sweeps.driver.record.tracking import add_tracking_uri_flag
from accelsweep.sweeps.driver.record.tracking_buffer import DEFAULT_WAIT_S

if TYPE_CHECKING:
    from accelsweep.sweeps.driver.define.sweep import SweepResult

__all__ = ["RETURNED", "SweepInterrupted", "common_parser", "cost_basis", "main_guard", "platform_from_args",
           "sweep_options"]


def checked(convert: Callable, accept: Callable, allowed: str) -> Callable[[str], object]:
    """An argparse type that refuses, at parse time, what a script would otherwise
    replace with its default (``args.num_samples or 24`` turns 0 into 24):
    "argument --num-samples: must be an integer >= 1; got '0'", exit status 2."""
    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            value = None
        if value is None or not accept(value):
            raise argparse.ArgumentTypeError(f"must be {allowed}; got {text!r}")
        return value

    return parse


at_least_one = checked(int, lambda n: n >= 1, "an integer >= 1")
at_least_zero = checked(int, lambda n: n >= 0, "an integer >= 0")
positive_seconds = checked(float, lambda s: s > 0 and math.isfinite(s), "a number of seconds > 0")
above_one = checked(float, lambda r: r > 1 and math.isfinite(r), "a number > 1")
round_count = checked(int, lambda n: n == 0 or n >= 2, "0 (no confirmation), or an integer >= 2")


def common_parser(description: str, default_samples: int, default_confirm_rounds: int = 0) -> argparse.ArgumentParser:
    """The flags every study has. ``default_confirm_rounds``: the study's confirmation
    rounds unless --confirm-rounds says otherwise (the main job confirms its verdict)."""
    parser = argparse.ArgumentParser(description=description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--platform", default="auto", choices=("auto",) + PLATFORM_NAMES,
                        help="where trials run; auto picks the best platform present (default: auto)")
    parser.add_argument("--num-samples", type=at_least_one, default=None,
                        help=f"trials to run, baseline included (default: {default_samples}; --smoke: 4)")
    parser.add_argument("--time-budget-s", type=positive_seconds, default=None,
                        help="stop starting trials after this many seconds; running ones are cut")
    add_tracking_uri_flag(parser)
    parser.add_argument("--experiment", default=None, help="MLflow experiment (default: the sweep's name)")
    parser.add_argument("--tracking-wait-s", type=positive_seconds, default=DEFAULT_WAIT_S,
                        help="when the MLflow tracking store stops answering, trials go on and their MLflow writes "
                             "are kept in order for up to this long, written when it answers; past it the sweep "
                             f"stops, the writes saved for --resume (default: {DEFAULT_WAIT_S:g})")
    parser.add_argument("--storage-path", default=None,
                        help=f"Ray Tune storage path (default: ${STORAGE_PATH_VARIABLE}, else {TUNE_STORAGE_PATH})")
    parser.add_argument("--address", default=os.environ.get("RAY_ADDRESS") or None,
                        help="Ray cluster address; auto: the cluster `ray start` started on this machine "
                             "(default: $RAY_ADDRESS, else a private local Ray instance that stops with the script)")
    parser.add_argument("--instance-type", default=None,
                        help="EC2 instance type for the price basis (default: read from EC2 metadata)")
    parser.add_argument("--price-per-hour", type=float, default=None,
                        help="USD per hour for the whole machine; overrides the price table")
    parser.add_argument("--seed", type=int, default=0, help="seed for the searcher and the models")
    parser.add_argument("--scheduler", default="asha", choices=("asha", "median", "none"),
                        help="early stopping of hopeless trials (default: asha)")
    parser.add_argument("--max-concurrent-trials", type=at_least_one, default=None,
                        help="default: as many as the cluster's resources fit")
    parser.add_argument("--smoke", action="store_true", help="tiny model and few steps (for tests)")
    parser.add_argument("--verbose", action="store_true",
                        help="also show Ray's, Tune's and MLflow's own output and every trial's output as it ends "
                             "(default: the tool's lines only; a trial's output is shown when it fails, and kept in "
                             "its MLflow run as trial-output.log either way)")
    parser.add_argument("--resume", action="store_true",
                        help="continue the newest stopped run of this sweep (same --storage-path and "
                             "--tracking-uri): finished trials are kept, interrupted ones run again")
    parser.add_argument("--retries", type=int, default=1,
                        help="restarts of a trial whose process or node was lost (default: 1); a trial's "
                             "own errors are recorded, never retried")
    parser.add_argument("--reject-ratio", type=above_one, default=REJECT_RATIO,
                        help="a trial whose first steps project the objective more than this many times worse "
                             f"than the best so far stops itself (default: {REJECT_RATIO:g})")
    parser.add_argument("--no-reject", action="store_true", help="never reject a trial by its first steps")
    parser.add_argument("--max-compile-s", type=positive_seconds, default=None,
                        help="a trial whose compile (its first step, when it compiles) runs longer fails with "
                             "cause compile (default: the study's, else no limit)")
    parser.add_argument("--trial-timeout-s", type=positive_seconds, default=None,
                        help="a trial that reports nothing for this long (from its start, or its last report) "
                             "is ended: its processes and those it started are killed, its run FAILED with cause "
                             "timeout, not retried (default: no deadline, since a legitimate compile has no known "
                             "bound; set it above the longest gap between a trial's reports, start and compile "
                             "included)")
    parser.add_argument("--repeat-configs", action="store_true",
                        help="run a config again when the searcher proposes it again (default: reuse its "
                             "result, tagged reused in MLflow)")
    parser.add_argument("--keep-emulated", action="store_true",
                        help="keep the values the hardware only emulates (bf16 on a CPU without bf16 "
                             "instructions, ...) in the search space; by default they are removed, with the reason")
    parser.add_argument("--no-first-guess", action="store_true",
                        help="do not propose the platform's first guess after the baseline (its rules of thumb "
                             "for this hardware, each printed with its reason: bf16 where the chip has bf16 "
                             "instructions, a compute thread per core, the largest batch, ...)")
    parser.add_argument("--study-storage", default=None,
                        help="SQLAlchemy URL of the database that keeps the sweep's Optuna study (default: beside a "
                             "sqlite --tracking-uri, mlflow.db -> mlflow.optuna.db; else optuna.db under "
                             "--storage-path); open it with optuna-dashboard")
    parser.add_argument("--confirm-rounds", type=round_count, default=default_confirm_rounds,
                        help="when the search ends, measure the baseline and the best configs again in this many "
                             "interleaved rounds; the verdict is theirs, or 'not decided' (0: no confirmation; "
                             f"default: {default_confirm_rounds}; with a time budget the search leaves 35%% "
                             "of it to them)")
    parser.add_argument("--local-search", type=int, default=None, metavar="N",
                        help="the search's last N proposals each step from the best config so far to an unmeasured "
                             "neighbour (one knob one choice away: batch x2 or /2, workers +-1, ...) instead of "
                             "sampling (0: none; default: a quarter of --num-samples, at most 4)")
    parser.add_argument("--stop-at-utilisation", type=float, default=None, metavar="FRACTION",
                        help="end the sweep once a trial has run at or above this share of the hardware's peak "
                             "(its utilisation, MFU: e.g. 0.4; on a CPU, of the GEMM peak measured here); "
                             "default: never")
    parser.add_argument("--warm-start", default=None, metavar="SWEEP",
                        help="start from an earlier sweep (its parent run's name or id): its best configs valid in "
                             "this space are proposed first, and the searcher is told its results when its "
                             "hardware, workload and package versions match this sweep's (else only its configs "
                             "are proposed, to be measured here); --dry-run says which (default: from nothing)")
    parser.add_argument("--warm-start-store", default=None, metavar="URI",
                        help="the MLflow tracking URI the --warm-start sweep is in (default: --tracking-uri)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the search space, resources and environment per trial, then exit")
    return parser


def sweep_options(args: argparse.Namespace, *, default_samples: int, default_time_budget_s: Optional[float] = None,
                  default_max_compile_s: Optional[float] = None, **fixed: Any) -> dict[str, Any]:
    """The Sweep options the common flags set (common_parser), for ``Sweep(**...)``.
    ``fixed``: options the study decides whatever the flags say (a grid's scheduler)."""
    options = dict(num_samples=args.num_samples or default_samples,
                   time_budget_s=args.time_budget_s or default_time_budget_s,
                   tracking_uri=args.tracking_uri, experiment=args.experiment, storage_path=args.storage_path,
                   address=args.address, seed=args.seed, scheduler=args.scheduler,
                   max_concurrent_trials=args.max_concurrent_trials, resume=args.resume, retries=args.retries,
                   # A study's own parser (or a test's namespace) may lack the budget flags.
                   keep_emulated=getattr(args, "keep_emulated", False),
                   first_guess=not getattr(args, "no_first_guess", False),
                   reject_ratio=None if getattr(args, "no_reject", False) else getattr(args, "reject_ratio", REJECT_RATIO),
                   max_compile_s=getattr(args, "max_compile_s", None) or default_max_compile_s,
                   trial_timeout_s=getattr(args, "trial_timeout_s", None),
                   tracking_wait_s=getattr(args, "tracking_wait_s", DEFAULT_WAIT_S),
                   repeats=getattr(args, "repeat_configs", False),
                   study_storage=getattr(args, "study_storage", None),
                   verbose=getattr(args, "verbose", False),
                   confirm_rounds=getattr(args, "confirm_rounds", 0),
                   local_search=getattr(args, "local_search", None),
                   stop_at_utilisation=getattr(args, "stop_at_utilisation", None),
                   warm_start=getattr(args, "warm_start", None),
                   warm_start_store=getattr(args, "warm_start_store", None))
    return {**options, **fixed}


def platform_from_args(args: argparse.Namespace, supported: Optional[Sequence[str]] = None,
                       what: str = "") -> tuple[str, str]:
    """The platform the flags ask for, and a sentence saying why (the Sweep's platform_note).
    The same in every study:

    - ``auto``: the best platform present (trainables/platforms AUTO_ORDER: neuron, tpu,
      cuda, cpu), among ``supported`` when given (a kernel study: the platforms with an
      implementation of its op; ``what`` names it in the sentence);
    - a named platform with --dry-run: as asked (a plan needs no hardware);
    - a named platform with --address: as asked, for the cluster's workers (the driver,
      e.g. a CPU head node, need not have the accelerator: the autoscaler brings them);
    - else a named platform must be present here.
    """
    name, address = args.platform, args.address
    dry_run = getattr(args, "dry_run", False)
    if name == "auto":
        platform, why = resolve_platform("auto", among=supported, what=what)
        return platform.name, f"dry run: {why}" if dry_run else why
    if dry_run:
        return name, f"dry run: {name} as asked; detection says: {get_platform(name).detect().reason}"
    if address:
        get_platform(name)  # a known name
        return name, f"{name} as asked, on the cluster at {address} (not detected on this driver)"
    platform, why = resolve_platform(name)
    return platform.name, why


def cost_basis(args: argparse.Namespace) -> tuple[Optional[CostBasis], str]:
    """The price basis the flags give (--instance-type, --price-per-hour), worded for a
    command line: the Sweep's ``cost`` and ``cost_note``."""
    return resolve_cost_basis(args.instance_type, args.price_per_hour, flags=True)


def fail(error: Exception) -> None:
    """Bad input ends the script before any trial, with the message and exit status 2."""
    print(f"error: {error}", file=sys.stderr)
    sys.exit(2)


class SweepInterrupted(KeyboardInterrupt):
    """A sweep stopped by SIGINT, SIGTERM or SIGHUP. Raised by ``run_sweep`` once the sweep
    has closed its runs and stopped the Ray instance it started (``result``: its summary,
    None when it stopped before its parent run was opened). The scripts (``cli.main_guard``)
    exit with ``exit_status``, as a shell reports a process a signal ended: 130 for SIGINT,
    143 for SIGTERM, 129 for SIGHUP."""

    def __init__(self, signum: int, result: Any = None):
        super().__init__(signum)
        self.signum, self.result = signum, result

    @property
    def exit_status(self) -> int:
        return 128 + self.signum

    def __str__(self) -> str:
        return f"interrupted by {signal.Signals(self.signum).name} (exit status {self.exit_status})"


class RETURNED:
    """What run_sweep last returned in this process, and how many it has: a script's
    main_guard judges its sweep by it when the script's main returns nothing (cli.py)."""

    count = 0
    last: Optional[SweepResult] = None


def main_guard(main) -> None:
    """Run a script's main: bad input ends it with exit status 2 and the message; a sweep
    stopped by SIGINT or SIGTERM (stop_signals.py) with 128 + the signal's number (130,
    143), after it has said how to resume; one that stopped itself (SweepStopped: its MLflow
    store did not come back) with its exit status, 75, and how to resume; a sweep that
    measured nothing (every trial failed, or none reported the objective) with
    NOTHING_MEASURED_EXIT, 1: the result main returns, else the last run_sweep returned
    while it ran.

    Called from a script run as the program (its ``__main__``), it ends the process there,
    success included, without the interpreter's teardown (``end_process``); called from
    anywhere else (a test, a notebook) it returns on success and raises SystemExit otherwise."""
    status = _guarded_status(main)
    if sys._getframe(1).f_globals.get("__name__") == "__main__":
        end_process(status)
    if status:
        sys.exit(status)


def _guarded_status(main) -> int:
    returned_before = RETURNED.count
    try:
        result = main()
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except SweepStopped as stopped:
        print(f"error: {stopped}", file=sys.stderr)
        return stopped.exit_status
    except SweepInterrupted as stop:
        print(f"stopped: {stop}", file=sys.stderr)
        return stop.exit_status
    if result is None and RETURNED.count > returned_before:  # a main that ran a sweep and returned nothing
        result = RETURNED.last
    nothing = nothing_measured(result)
    if nothing:
        print(f"error: {nothing}", file=sys.stderr)
        return NOTHING_MEASURED_EXIT
    return 0


# A sweep that ran but measured nothing (every trial failed, or none reported its
# objective) ends with this status: a script or CI job calling it must not read success.
NOTHING_MEASURED_EXIT = 1


def nothing_measured(result) -> str:
    """Why ``result`` (a study's SweepResult; anything else is not judged) measured
    nothing, or '' when a trial measured the first objective."""
    records = getattr(result, "records", None)
    if records is None or result.best is not None:
        return ""
    ran = [r for r in records if r.status != "reused"]
    failed = sum(r.status == "failed" for r in ran)
    waited_s = getattr(result, "waited_s", 0.0)
    if not ran and waited_s > 0:  # on a shared cluster a trial is created only with a seat
        return (f"no trial got a place on the cluster: the sweep waited {waited_s:.0f} s for one while other "
                "sweeps' trials held it (the waiting lines above say whose). Run it again when the cluster is "
                "freer, or on a cluster of your own: ray up cluster.yaml")
    if ran and failed == len(ran):
        return (f"every trial failed ({failed} of {failed}): no config was measured; the summary above and the "
                "trial runs' error tags say why")
    return (f"no trial measured the sweep's objective ({len(ran)} trial(s) ran, {failed} failed): nothing to rank; "
            "see the summary above")
