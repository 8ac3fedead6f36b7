"""The reference pages, written from the code at every build (mkdocs.yml, ``hooks:``).

``docs/reference/flags.md`` and ``docs/reference/metrics.md`` hold prose and a marker;
this hook replaces each marker with tables built from what the scripts and the sweep
driver themselves read:

- ``<!-- reference:flags -->``: a section per study of ``STUDIES``
  (``accelsweep.sweeps.driver.define.studies``), its flags as ``study_parser(name)`` builds them,
  the same parser ``accelsweep run NAME --help`` prints;
- ``<!-- reference:metrics -->``: every metric set of ``accelsweep.trainables.metrics``.

A flag or metric added in the code is on the page at the next build, so the pages
cannot drift (``tests/test_docs.py`` checks every flag is there). A module that cannot
be imported, or a study whose parser cannot be built, ends the build with the reason.
The modules are imported here, lazily, not when mkdocs loads the hook.

    .venv/bin/mkdocs build --strict      # the site, into site/
    .venv/bin/mkdocs serve               # http://127.0.0.1:8000, rebuilt on every change
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import os
import re
from typing import Any, Iterator

from mkdocs.exceptions import PluginError

log = logging.getLogger("mkdocs.hooks.reference")  # under "mkdocs": --strict counts its warnings

FLAGS_MARKER = "<!-- reference:flags -->"
METRICS_MARKER = "<!-- reference:metrics -->"
SECTION_ORDER = ("TRAINING_METRICS", "training_metrics", "KERNEL_METRICS", "DRIVER_METRICS")

# Flag defaults that the parsers read from the environment when they are built
# ($MLFLOW_TRACKING_URI, $RAY_ADDRESS, ...): the page shows those of a clean shell,
# never the builder's (a tracking URI may hold a password).
ENVIRONMENT_PREFIXES = ("MLFLOW_", "RAY_", "ACCELSWEEP_", "AWS_")

# What each metric means, by name, where the Metric itself does not say (a Metric with a
# ``description`` is read first). A metric with neither is a build warning, which
# --strict makes an error: a new metric must say what it is. A workload's own unit is
# written <unit> (training_metrics("tokens") reports throughput_tokens_per_s).
DESCRIPTIONS = {
    "throughput_samples_per_s": "samples (dataset items) / second over all measured windows (warm-up excluded)",
    "window_throughput_samples_per_s": "each window's throughput alone (an MLflow curve, one point per window; "
                                       "`throughput_samples_per_s` is over all windows, logged at the last)",
    "step_time_p50_s": "median step time: per step on the CPU (synchronous); per window mean on asynchronous "
                       "devices, where a host clock per step would time only the enqueue (tag `step_time_source`)",
    "step_time_p90_s": "90th percentile step time, measured as `step_time_p50_s` is",
    "first_step_s": "the first step alone (graph compilation, first-touch allocation), synced",
    "compile_s": "compiler seconds in the trial: torch.compile's own timers, torch-xla's `CompileTime`; 0 for "
                 "eager. Kernel trials: the first (compiling) call, timed apart (torch.compile, jit and XLA "
                 "compile there)",
    "memory_capacity_mb": "what `peak_memory_mb` is measured against: CPU, the host's memory (or a lower cgroup "
                          "limit); CUDA, the GPU's; how far a batch may grow past the space's edge",
    "intra_op_threads": "CPU: the intra-op threads the trial ran with: one fewer than asked for each core other "
                        "processes kept busy as it started (trainables/platforms/cpu_threads.py)",
    "threads_asked": "CPU: the intra-op threads the config asked for (the `threads` knob, else the CPUs it holds)",
    "other_cpus_at_start": "CPU: cores other processes kept busy while the trial started (the lower of its "
                           "readings), which set `intra_op_threads`",
    "niceness": "CPU: the trial's niceness after lowering it from Ray's 15 (0 where the process may)",
    "limit_compute_share": "share of a profiled step (3 steps after the last window) in compute kernels' own time: "
                           "matmul, convolution, attention (trainables/timing/limiter.py; tag `limiter`)",
    "limit_ops_share": "share of a profiled step in other operators' own time (elementwise, norms, copies; "
                       "a compiled region's fused kernels)",
    "limit_optimizer_share": "share of a profiled step in the optimizer's operators' work",
    "limit_data_share": "share of a profiled step spent waiting for the next batch (the loader, the copy)",
    "limit_host_share": "share of a profiled step in the host's dispatch: Python and the framework between "
                        "operators, plus each operator call's fixed cost (measured in the trial's process)",
    "limit_profile_s": "seconds the limiter's profiled steps took after the last window (a confirmation's trial in "
                       "turns profiles none, so its start is planned without them)",
    "peak_memory_mb": "CPU: peak RSS of the trial process (reset per trial: torch, Ray and the interpreter "
                      "included, about 700 MB); CUDA: `max_memory_allocated`",
    "workload_memory_mb": "what the workload allocates: the peak over what the process held before the model was "
                          "built (CPU: RSS, DataLoader worker processes not included; CUDA: allocated memory); "
                          "NaN on XLA devices, whose peak cannot be reset",
    "fxgraph_cache_hits": "inductor FX graphs loaded from the compile cache in the trial",
    "fxgraph_cache_misses": "inductor FX graphs compiled and stored in the compile cache",
    "fxgraph_cache_bypasses": "inductor FX graphs that could not be cached",
    "aotautograd_cache_hits": "AOTAutograd graphs loaded from the compile cache",
    "aotautograd_cache_misses": "AOTAutograd graphs compiled and stored in the compile cache",
    "aotautograd_cache_bypasses": "AOTAutograd graphs that could not be cached",
    "xla_cache_hits": "(xla, neuron) graphs loaded from torch-xla's persistent cache (`PersistentCacheHit`)",
    "final_loss": "loss at the end of the last window (read after the window's sync); a curve, one point per window",
    "usd_per_1m_samples": "steady-state price of a million samples: hourly rate of the trial's share / throughput "
                          "(NaN with no price basis)",
    "trial_cost_usd": "hourly rate of the trial's share x its wall time (start-up and compile included); measured "
                      "by the sweep driver",
    "overhead_s": "the trial's wall time outside its compile, warm-up and measured windows (actor start, imports, "
                  "model and data build, reporting); the same definition for kernel trials, whose first "
                  "(compiling) call counts as compile; measured by the sweep driver",
    "throughput_<unit>_per_s": "for a workload counting another unit (`Workload.unit`, e.g. `tokens`): throughput "
                               "in that unit, counted per batch by the workload (tag `unit`); it leads the "
                               "progress line",
    "window_throughput_<unit>_per_s": "each window's throughput in the workload's unit (a curve)",
    "usd_per_1m_<unit>": "price of a million of the workload's units",
    "model_tflops": "the model's useful TFLOP/s: `model_flops_per_item` x throughput ([how far from the "
                    "hardware's limit](../utilisation.md))",
    "mfu": "model FLOPs utilisation: `model_tflops` over the peak of what the trial holds for its precision "
           "(`peak_tflops`: on a CPU measured here, elsewhere the datasheet's); on the progress line",
    "mfu_theoretical": "on a CPU, `model_tflops` over the theoretical peak (cores x clock x FLOPs per cycle)",
    "model_flops_per_item": "forward + backward FLOPs of one dataset item, counted once per workload and knobs "
                            "(tag `flops_method` says how)",
    "peak_tflops_theoretical": "on a CPU, cores x clock x FLOPs per cycle for the dtype (tag "
                               "`peak_theoretical_basis` names each factor); elsewhere the datasheet's",
    "latency_p50_s": "median per-call latency over the measured windows",
    "latency_p10_s": "10th percentile per-call latency",
    "latency_p90_s": "90th percentile per-call latency",
    "latency_cv": "spread of the window medians (window-to-window cv); above 5% the trial is marked noisy",
    "items_per_s": "items (the op's unit of work, e.g. boxes) per second",
    "max_abs_error": "largest absolute difference from the op's numpy float64 reference (checked before timing)",
    "tflops": "TFLOP/s where the op has a FLOP count (NaN otherwise); attention counts only visible "
              "(query, key) pairs",
    "gbytes_per_s": "GB/s at the p50 latency, counting the least a call must move (`OpSpec.bytes_moved`: inputs "
                    "read once, outputs written once); NaN where the op declares no bytes moved",
    "arithmetic_intensity": "FLOPs per byte moved: where the kernel sits on the roofline's x axis",
    "roofline_fraction": "`tflops` over the roofline bound at its intensity (`roofline_tflops`): how close to "
                         "what the hardware allows ([the roofline](../kernels.md#the-roofline))",
    "roofline_tflops": "the roofline bound: min(peak compute, intensity x peak bandwidth)",
    "compute_fraction": "`tflops` over the peak compute (`peak_tflops`)",
    "bandwidth_fraction": "`gbytes_per_s` over the peak bandwidth (`peak_gbytes_per_s`)",
    "peak_tflops": "the peak compute the trial is held against, for its dtype or precision: on a CPU a GEMM "
                   "measured here on the cores it holds (cached per machine), elsewhere the datasheet's (tag "
                   "`peak_basis` says which); NaN for a kernel in an integer dtype (no FLOP peak)",
    "peak_gbytes_per_s": "the peak memory bandwidth: on a CPU the best of STREAM-style read, copy and add measured "
                         "here, elsewhere the datasheet's (tag `bandwidth_basis`)",
    "host_cv": "the machine's own steadiness: window-to-window cv of a fixed pure-Python loop timed between "
               "windows",
    "host_probe_s": "the median time of that fixed loop: a host slower than the sweep's typical was loaded",
    "speed_probe_gflops": "on a CPU, the host's speed at the trial's math between its windows: a 512x512 matmul in "
                          "the precision's compute dtype on the trial's threads (which: the speed_probe_kind tag); "
                          "the confirmation ranks its candidates by throughput at the typical probe of their kind",
    "other_cpus": "cores other processes (and a VM's steal) kept busy during the window, from /proc/stat less the "
                  "trial's own process tree ([contention](../budget.md#verdicts-that-hold-on-a-shared-machine))",
    "contention_cpus": "the part of `other_cpus` beyond the cores the trial left free (the machine's less those it "
                       "holds); above 0.15 the window is contended",
    "window_contended": "1 where this window was contended: it is left out of the trial's figures while the trial "
                        "has a quiet window, and early stopping does not judge it",
    "contended_windows": "the trial's windows so far that were contended (tag `contended` when any was)",
    "host_enqueue_s": "on a GPU, the host's enqueue time per call, beside the device's time; NaN where the timer "
                      "waits for each call",
    "launch_bound": "1 where the host's enqueue time is larger than the device's (launch-bound), else 0",
    "threads": "torch's intra-op threads the trial ran with (`KernelConfig.threads`, the kernel studies' "
               "`--threads`; default every CPU the trial holds); NaN for numpy and JAX implementations, whose "
               "threads the harness does not set",
}


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if FLAGS_MARKER in markdown:
        markdown = markdown.replace(FLAGS_MARKER, flags_reference())
    if METRICS_MARKER in markdown:
        markdown = markdown.replace(METRICS_MARKER, metrics_reference())
    return markdown


def _import(module: str):
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise PluginError(f"docs/hooks/reference.py: the reference pages are built from {module}, which does not "
                          f"import: {error}. Install accelsweep (./env/setup.sh) and build with .venv/bin/mkdocs.")


# ---- flags ----

def flags_reference() -> str:
    studies = _import("accelsweep.sweeps.driver.define.studies")
    cli = _import("accelsweep.sweeps.driver.define.cli")
    with _clean_environment():
        common = {flag for action in cli.common_parser("", default_samples=1)._actions
                  for flag in action.option_strings}
        sections = [_study_section(name, study, studies.study_parser, common)
                    for name, study in studies.STUDIES.items()]
    return "\n\n".join(sections)


def _study_section(name: str, study: Any, study_parser, common: set) -> str:
    try:
        parser = study_parser(name)
    except (Exception, SystemExit) as error:  # a study's own bug: name the study, keep the reason
        raise PluginError(f"docs/hooks/reference.py: the parser of study {name} ({study.module}) could not be "
                          f"built: {type(error).__name__}: {error}")
    script = study.module.rsplit(".", 1)[-1]
    lines = [f"## {name}", "", _escape(study.summary), ""]
    runs_on = getattr(study, "runs_on", None)
    if runs_on:
        lines += [f"Runs on: {_escape(runs_on)}.", ""]
    lines += ["```bash", f"accelsweep run {name} [flags]        # or: python sweeps/{script}.py [flags]",
              "```", ""]
    actions = [a for a in parser._actions if a.option_strings]
    own = [a for a in actions if not set(a.option_strings) & common]
    shared = [a for a in actions if set(a.option_strings) & common]
    if own:
        lines += ["Its own flags:", "", *_flag_table(own, parser), ""]
    lines += ["The flags every study takes:" if own else "Its flags (those every study takes):", "",
              *_flag_table(shared, parser)]
    return "\n".join(lines)


def _flag_table(actions: list, parser: argparse.ArgumentParser) -> list[str]:
    rows = ["| flag | default | what it does |", "|---|---|---|"]
    for action in actions:
        rows.append(f"| {_code(_invocation(action))} | {_default(action)} | {_escape(_help(action, parser))} |")
    return rows


def _invocation(action: argparse.Action) -> str:
    """The flag as --help shows it: ``-h, --help``, ``--platform {auto,cpu}``, ``--seed SEED``."""
    if action.nargs == 0:
        return ", ".join(action.option_strings)
    if action.choices is not None and action.metavar is None:
        argument = "{" + ",".join(str(c) for c in action.choices) + "}"
    else:
        argument = action.metavar if isinstance(action.metavar, str) else action.dest.upper()
    if action.nargs in ("*", "+", "?") or isinstance(action.nargs, int):
        argument = {"*": f"[{argument} ...]", "+": f"{argument} [{argument} ...]", "?": f"[{argument}]"}.get(
            action.nargs, " ".join([argument] * action.nargs) if isinstance(action.nargs, int) else argument)
    return ", ".join(f"{flag} {argument}" for flag in action.option_strings)


def _default(action: argparse.Action) -> str:
    default = action.default
    if default is None or default is argparse.SUPPRESS:
        return ""
    if action.nargs == 0 and isinstance(default, bool):
        return "on" if default else "off"
    if isinstance(default, (list, tuple)):
        default = " ".join(str(d) for d in default)
    text = str(default)
    home = os.path.expanduser("~")
    if home not in ("", "/") and text.startswith(home):
        text = "~" + text[len(home):]
    return _code(text)


def _help(action: argparse.Action, parser: argparse.ArgumentParser) -> str:
    """The help as argparse expands it (``%(default)s``, ``%(choices)s``)."""
    text = action.help or ""
    if "%" not in text:
        return text
    params = {k: v for k, v in vars(action).items() if v is not argparse.SUPPRESS}
    params["prog"] = parser.prog
    if params.get("choices") is not None:
        params["choices"] = ", ".join(str(c) for c in params["choices"])
    try:
        return text % params
    except (KeyError, TypeError, ValueError):
        return text


@contextlib.contextmanager
def _clean_environment() -> Iterator[None]:
    saved = {k: v for k, v in os.environ.items() if k.startswith(ENVIRONMENT_PREFIXES)}
    for key in saved:
        del os.environ[key]
    try:
        yield
    finally:
        os.environ.update(saved)


# ---- metrics ----

def metrics_reference() -> str:
    metrics = _import("accelsweep.trainables.metrics")
    used: set[str] = set()
    sections = []
    # The training loop's first, then what a workload's own unit adds, then the rest as
    # the module lists them.
    names = sorted(metrics.__all__, key=lambda n: SECTION_ORDER.index(n) if n in SECTION_ORDER else len(SECTION_ORDER))
    for name in names:
        value = getattr(metrics, name)
        if isinstance(value, metrics.MetricSet):
            sections.append(_metric_section(name, value.metrics, value.headline, used))
        elif isinstance(value, tuple) and value and all(isinstance(m, metrics.Metric) for m in value):
            sections.append(_metric_section(name, value, (), used))
        elif name == "training_metrics":  # a workload's own unit: what it adds to TRAINING_METRICS
            tokens = value("tokens")
            extra = tuple(m for m in tokens if m.name not in metrics.TRAINING_METRICS.names)
            sections.append(_metric_section('training_metrics("tokens")', extra, tokens.headline, used,
                                            unit="tokens"))
    for stale in sorted(set(DESCRIPTIONS) - used):
        log.warning("docs/hooks/reference.py: DESCRIPTIONS names %s, which no metric set of "
                    "accelsweep.trainables.metrics declares: remove it", stale)
    return "\n\n".join(sections)


def _metric_section(name: str, declared: tuple, headline: tuple, used: set, unit: str = "") -> str:
    rows = [f"## `{name}`", "",
            "| metric | unit | better | summary row | curve | what it is |", "|---|---|---|---|---|---|"]
    for metric in declared:
        key = metric.name.replace(f"_{unit}_", "_<unit>_").replace(f"_{unit}", "_<unit>") if unit else metric.name
        description = getattr(metric, "description", None) or DESCRIPTIONS.get(key)
        used.add(key)
        if not description:
            log.warning("docs/hooks/reference.py: metric %s (%s) says nothing of what it is: give its Metric a "
                        "description, or add it to DESCRIPTIONS", metric.name, name)
            description = ""
        shown = _code(metric.name) + (" (headline)" if metric.name in headline else "")
        rows.append(f"| {shown} | {_escape(metric.unit)} | {metric.better or ''} | {_escape(metric.label or '')} "
                    f"| {'yes' if metric.curve else ''} | {_escape(description)} |")
    return "\n".join(rows)


# ---- markdown ----

def _code(text: str) -> str:
    fence = "``" if "`" in text else "`"
    return f"{fence}{text.replace('|', chr(92) + '|')}{fence}"


_PLAIN_SPECIALS = re.compile(r"([\\*_\[\]>|])")


def _escape(text: str) -> str:
    """Plain text for a table cell: markdown's specials escaped outside `code spans`
    (kept as code), ``<`` as an entity, ``|`` escaped everywhere (a cell ends at one)."""
    parts = text.split("`")
    if len(parts) % 2 == 0:  # an unpaired backtick: all of it is plain text
        parts = [text.replace("`", "'")]
    out = []
    for i, part in enumerate(parts):
        if i % 2:
            out.append("`" + part.replace("|", "\\|") + "`")
        else:
            out.append(_PLAIN_SPECIALS.sub(r"\\\1", part).replace("<", "&lt;"))
    return " ".join("".join(out).split())
