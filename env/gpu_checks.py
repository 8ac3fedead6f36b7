"""Checks and figures for a lent GPU machine (issue 32), in one process per section, each
within its own time budget: what a few minutes of device time can show.

    python env/gpu_checks.py capabilities        # the capability rules against this GPU
    python env/gpu_checks.py knobs --budget-s 150   # each CUDA knob does what it says, and its figures
    python env/gpu_checks.py studies --budget-s 90  # the seed studies' CUDA rows, eager

Run it there through env/gpu_run.sh (--plan), which installs the bundle first. Every row
is a config of a study, trained by the sweep's own loop (trainables/loop/train_loop.py
run_training) in this process, not through Ray: a few seconds each instead of a trial's
start-up. Windows are short (--warmup-steps, --window-steps, --window-s, --windows) and
every row's JSON says what it used. A row that would start past the budget is listed as
skipped, with that reason; a compile past --max-compile-s ends its row (CompileTimeout).
Writes $OUT/checks-SECTION.json after every row (what finished comes back even if the
device command is stopped) and prints a table last.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import time
import traceback

STARTED = time.monotonic()


def _out(section: str) -> str:
    return os.path.join(os.environ.get("OUT") or ".", f"checks-{section}.json")


class Report:
    def __init__(self, section: str, budget_s: float, args):
        import torch

        self.section, self.budget_s, self.path = section, budget_s, _out(section)
        self.data = {"section": section, "device": torch.cuda.get_device_name(0),
                     "capability": ".".join(map(str, torch.cuda.get_device_capability(0))),
                     "torch": torch.__version__, "cuda": torch.version.cuda,
                     "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "budget_s": budget_s,
                     "measurement": measurement(args), "rows": [], "checks": {}}
        self.save()

    def left_s(self) -> float:
        return self.budget_s - (time.monotonic() - STARTED)

    def row(self, row: dict) -> None:
        self.data["rows"].append(row)
        self.save()

    def check(self, name: str, passed: bool, detail) -> None:
        self.data["checks"][name] = {"passed": bool(passed), "detail": detail}
        print(f"check {'PASS' if passed else 'FAIL'} {name}: {detail}", flush=True)
        self.save()

    def save(self) -> None:
        with open(self.path, "w") as file:
            json.dump(self.data, file, indent=1, default=str)


def measurement(args) -> dict:
    return dict(warmup_steps=args.warmup_steps, window_min_steps=args.window_steps, window_min_s=args.window_s,
                windows=args.windows)


# ---------------------------------------------------------------------------------------
# capabilities: CudaPlatform's rules (bf16, TF32, fp8 by compute capability, each SDPA
# backend's minimum) against what this GPU does when asked.

def capabilities(args) -> None:
    import torch

    from accelsweep.trainables.config import TrialConfig
    from accelsweep.trainables.platforms.cuda import CudaPlatform

    report = Report("capabilities", args.budget_s, args)
    facts = CudaPlatform().capabilities(TrialConfig.make(platform="cuda")).facts
    report.data["facts"] = facts
    report.check("bf16_native", facts["bf16_native"] == torch.cuda.is_bf16_supported(including_emulation=False),
                 f"rule {facts['bf16_native']}, torch.cuda.is_bf16_supported(including_emulation=False) "
                 f"{torch.cuda.is_bf16_supported(including_emulation=False)}")
    tf32_torch = getattr(torch.cuda, "is_tf32_supported", None)
    if tf32_torch is not None:
        report.check("tf32", facts["tf32"] == tf32_torch(), f"rule {facts['tf32']}, torch.cuda.is_tf32_supported() "
                                                            f"{tf32_torch()}")
    # TF32 really used: a float32 matmul with TF32 allowed differs from the float64 result
    # by TF32's rounding (~1e-3 relative), without it by float32's (~1e-6).
    a, b = torch.randn(1024, 1024, device="cuda"), torch.randn(1024, 1024, device="cuda")
    exact = (a.double() @ b.double())
    errors = {}
    for allowed in (False, True):
        torch.backends.cuda.matmul.allow_tf32 = allowed
        errors[allowed] = float(((a @ b).double() - exact).norm() / exact.norm())
    torch.backends.cuda.matmul.allow_tf32 = False
    report.check("tf32_rounding", (errors[True] > 10 * errors[False]) == facts["tf32"],
                 f"relative error fp32 {errors[False]:.1e}, with TF32 allowed {errors[True]:.1e}")
    # fp8: torch._scaled_mm on e4m3 operands runs (sm89+) or raises.
    try:
        x = torch.randn(32, 64, device="cuda").to(torch.float8_e4m3fn)
        y = torch.randn(32, 64, device="cuda").to(torch.float8_e4m3fn).t()
        one = torch.tensor(1.0, device="cuda")
        out = torch._scaled_mm(x, y, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
        torch.cuda.synchronize()
        fp8_ran, why = True, f"torch._scaled_mm ran, output {tuple(out.shape)} {out.dtype}"
    except Exception as error:  # noqa: BLE001 - what the GPU says is the finding
        fp8_ran, why = False, f"torch._scaled_mm raised {type(error).__name__}: {str(error)[:200]}"
    report.check("fp8", fp8_ran == facts["fp8"], f"rule {facts['fp8']}; {why}")
    # Each SDPA backend, forced, on bf16 inputs: runs where the rule says it does.
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = torch.randn(2, 4, 128, 64, device="cuda", dtype=torch.bfloat16)
    for name, backend in (("sdpa_flash", SDPBackend.FLASH_ATTENTION), ("sdpa_efficient", SDPBackend.EFFICIENT_ATTENTION),
                          ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION)):
        try:
            with sdpa_kernel(backend):
                torch.nn.functional.scaled_dot_product_attention(q, q, q)
            torch.cuda.synchronize()
            ran, why = True, "ran"
        except RuntimeError as error:
            ran, why = False, str(error).splitlines()[0][:200]
        report.check(name, ran == facts[name], f"rule {facts[name]}; forced on bf16: {why}")


# ---------------------------------------------------------------------------------------
# knobs: neuron_vit's CUDA knobs on ViT-B/16 at 224, each checked in a trial built by the
# training loop, then timed by it.

def _kernel_names(step, sync, steps: int = 2) -> list[str]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        sync()
    return sorted({event.key for event in prof.key_averages()
                   if getattr(event, "device_type", None) == torch.autograd.DeviceType.CUDA})


def _fused_attention(kernel: str) -> bool:
    """A fused attention kernel's name: FlashAttention-2's (pytorch_flash::flash_fwd...),
    the memory-efficient one's (fmha_cutlass...), cuDNN's (cudnn_..._sdpa_...); not
    cuDNN's convolutions (the patch embedding's)."""
    k = kernel.lower()
    return any(word in k for word in ("flash", "fmha", "mem_eff", "efficient_attention", "sdpa", "attn"))


# What each forced SDPA backend's kernels are called: a fused attention kernel with...
ATTENTION_KERNELS = {"sdpa-flash": lambda k: "flash" in k and "cudnn" not in k,
                     "sdpa-efficient": lambda k: ("fmha" in k or "efficient" in k or "mem_eff" in k)
                     and "cudnn" not in k,
                     "sdpa-cudnn": lambda k: "cudnn" in k}


def _check_trial(report: Report, name: str, config) -> None:
    """Build the trial as the loop does (eager), run a few steps, and check the knob."""
    import torch

    from accelsweep.trainables.distributed import World
    from accelsweep.trainables.loop.train_loop import _Trial
    from accelsweep.trainables.platforms import get_platform
    from accelsweep.trainables.workloads.base import load_workload

    platform = get_platform(config.platform)
    device = platform.prepare(config)
    trial = _Trial(config, platform, load_workload(config.workload), device, World.current())
    trial.step()
    platform.sync(device)
    model = trial.model
    dtypes = sorted({str(p.dtype) for p in model.parameters()})
    if config.precision == "bf16":
        report.check(f"{name}: weights bf16", dtypes == ["torch.bfloat16"], f"parameter dtypes {dtypes}")
    elif config.precision.endswith("autocast"):
        want = torch.bfloat16 if config.precision.startswith("bf16") else torch.float16
        size = model.patch_embed.img_size
        x = torch.randn(2, 3, *size, device=device)
        with platform.autocast(config):
            out = model.patch_embed(x)
        report.check(f"{name}: fp32 weights, {want} compute", dtypes == ["torch.float32"] and out.dtype == want,
                     f"parameter dtypes {dtypes}; patch_embed output under autocast {out.dtype}; "
                     f"GradScaler {'scale %g' % trial.scaler.get_scale() if trial.scaler else 'none'}")
    if config.knobs.channels_last:
        weight = next(p for p in model.parameters() if p.dim() == 4)
        report.check(f"{name}: channels_last", weight.is_contiguous(memory_format=torch.channels_last),
                     f"first 4-d weight {tuple(weight.shape)} stride {weight.stride()}")
    kernels = _kernel_names(trial.step, lambda: platform.sync(device))
    attention = config.workload_knobs.attention
    fused = [k for k in kernels if _fused_attention(k)]
    if attention in ATTENTION_KERNELS:
        found = [k for k in fused if ATTENTION_KERNELS[attention](k.lower())]
        others = [k for k in fused if k not in found]
        report.check(f"{name}: {attention} kernel in the profile", bool(found) and not others,
                     {"its kernels": found[:4], "other fused attention kernels": others[:4]}
                     if fused else {"no fused attention kernel; kernels seen": kernels[:25]})
    elif attention == "sdpa":  # timm's own SDPA: what the dispatcher chose, for the record
        report.data.setdefault("dispatcher_choice", {})[name] = fused[:4]
    elif attention == "sdpa-math":
        found = fused
        report.check(f"{name}: no fused attention kernel", not found, found[:3] or "none (math: matmuls, softmax)")
    del trial, model
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _time_row(report: Report, name: str, config, max_compile_s: float, study: str = "neuron_vit",
              figures=("throughput_samples_per_s", "step_time_p50_s")) -> None:
    import torch

    from accelsweep.trainables.loop.rejection import TrialLimits
    from accelsweep.trainables.loop.train_loop import run_training

    row = {"study": study, "row": name, "config": {k: v for k, v in config.to_dict().items()
                                                    if k not in ("compile_cache",)}}
    started = time.monotonic()
    try:
        result = run_training(config, limits=TrialLimits(metric=figures[0], max_compile_s=max_compile_s))
        row.update({k: result.get(k) for k in (*figures, "step_time_p90_s", "first_step_s", "compile_s",
                                               "peak_memory_mb", "throughput_cv", "device", "status")
                    if k in result})
        row["status"] = result.get("status", "ok")
    except BaseException as error:  # noqa: BLE001 - CompileTimeout is a BaseException (watchdog)
        if isinstance(error, KeyboardInterrupt):
            raise
        row["status"] = f"{type(error).__name__}: {str(error)[:300]}"
        traceback.print_exc()
    row["wall_s"] = round(time.monotonic() - started, 1)
    report.row(row)
    print(f"row {study} {name}: " + ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                                              for k, v in row.items() if k not in ("config", "study", "row")),
          flush=True)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _vit_b16(args, **changes):
    from accelsweep.sweeps import neuron_vit

    base = neuron_vit.base_config("cuda", False, 1, None, 0).replace(**measurement(args))
    return base.replace(**changes)


# The knob rows: the seed's baseline (batch 16, fp32, eager), then one knob at a time on
# bf16 autocast at batch 64. Order: what a short budget must cover first (precisions,
# layout, the fused attention kernels, default compile and CUDA graphs); max-autotune,
# whose compile alone can take minutes, last.
KNOB_ROWS = [
    ("baseline fp32 b16", dict()),
    ("fp32 b64", dict(batch_size=64)),
    ("bf16-autocast b64", dict(batch_size=64, precision="bf16-autocast")),
    ("fp16-autocast b64", dict(batch_size=64, precision="fp16-autocast")),
    ("bf16 b64", dict(batch_size=64, precision="bf16")),
    ("bf16-autocast b64 channels_last", dict(batch_size=64, precision="bf16-autocast", channels_last=True)),
    ("bf16-autocast b64 sdpa-flash", dict(batch_size=64, precision="bf16-autocast", attention="sdpa-flash")),
    ("bf16-autocast b64 sdpa-efficient", dict(batch_size=64, precision="bf16-autocast", attention="sdpa-efficient")),
    ("bf16-autocast b64 sdpa-cudnn", dict(batch_size=64, precision="bf16-autocast", attention="sdpa-cudnn")),
    ("bf16-autocast b64 inductor", dict(batch_size=64, precision="bf16-autocast", torch_compile="inductor")),
    ("bf16-autocast b64 reduce-overhead", dict(batch_size=64, precision="bf16-autocast",
                                                torch_compile="reduce-overhead")),
    ("bf16-autocast b64 sdpa-math", dict(batch_size=64, precision="bf16-autocast", attention="sdpa-math")),
    ("bf16-autocast b64 workers 4", dict(batch_size=64, precision="bf16-autocast", num_workers=4)),
    # The model's own ceiling: batches kept on the GPU, no loader (the loader bound bf16 b64
    # at 922.8 samples/s with no workers and 2014 with 8).
    ("bf16 b64 resident 8", dict(batch_size=64, precision="bf16", resident_batches=8)),
    ("bf16-autocast b64 resident 8", dict(batch_size=64, precision="bf16-autocast", resident_batches=8)),
    ("bf16-autocast b128", dict(batch_size=128, precision="bf16-autocast")),
    ("bf16-autocast b64 max-autotune", dict(batch_size=64, precision="bf16-autocast", torch_compile="max-autotune")),
    # The sweep's trial 3 on the third device call: an AssertionError with no message.
    ("fp32 b128 channels_last reduce-overhead", dict(batch_size=128, channels_last=True,
                                                     torch_compile="reduce-overhead")),
]


class _GraphReplays:
    """Counts CUDA graph replays (torch.cuda.CUDAGraph.replay, which inductor's CUDA graph
    trees call) while it is entered."""

    def __enter__(self):
        import torch

        self.count, self.original = 0, torch.cuda.CUDAGraph.replay

        def replay(graph, *args, **kwargs):
            self.count += 1
            return self.original(graph, *args, **kwargs)

        torch.cuda.CUDAGraph.replay = replay
        return self

    def __exit__(self, *exc_info):
        import torch

        torch.cuda.CUDAGraph.replay = self.original


def knobs(args) -> None:
    from torch._dynamo.utils import counters

    report = Report("knobs", args.budget_s, args)
    for name, changes in KNOB_ROWS:
        if args.only and not any(word in name for word in args.only):
            continue
        if args.rows and name.replace(" ", "_") not in args.rows:
            continue
        if args.num_workers is not None and ("num_workers" in changes or "resident_batches" in changes):
            continue  # a row of its own loader, or of none
        compiles = changes.get("torch_compile", "none") != "none"
        # A compiled row needs its compile and windows; an eager one ~10 s.
        needs = (args.max_compile_s + 10) if compiles else 6
        if report.left_s() < needs:
            report.row({"study": "neuron_vit", "row": name, "status": f"skipped: {report.left_s():.0f} s of the "
                                                                      f"section's budget left, it needs ~{needs:.0f}"})
            print(f"row neuron_vit {name}: skipped (budget)", flush=True)
            continue
        if args.num_workers is not None:
            changes, name = {**changes, "num_workers": args.num_workers}, f"{name} workers {args.num_workers}"
        config = _vit_b16(args, **changes)
        if not compiles:
            if args.no_checks:
                _time_row(report, name, config, args.max_compile_s)
                continue
            try:
                _check_trial(report, name, config)
            except Exception as error:  # noqa: BLE001
                report.check(f"{name}: built and stepped", False, f"{type(error).__name__}: {str(error)[:300]}")
                traceback.print_exc()
            _time_row(report, name, config, args.max_compile_s)
            continue
        # A compiled row is checked in its timed trial: dynamo's graph count and CUDA graph
        # replays during it (building a second trial would compile again).
        graphs_before = counters["stats"]["unique_graphs"]
        skips_before = counters["inductor"]["cudagraph_skips"]
        with _GraphReplays() as replays:
            _time_row(report, name, config, args.max_compile_s)
        row = report.data["rows"][-1]
        if row.get("status") != "ok":
            continue
        graphs = counters["stats"]["unique_graphs"] - graphs_before
        detail = f"dynamo graphs compiled {graphs}, compile_s {row.get('compile_s')}, CUDA graph replays {replays.count}"
        if config.torch_compile == "reduce-overhead":
            skips = counters["inductor"]["cudagraph_skips"] - skips_before
            report.check(f"{name}: CUDA graphs replayed", graphs > 0 and replays.count > 0 and not skips,
                         f"{detail}, cudagraph_skips {skips}")
        else:
            report.check(f"{name}: compiled graph ran", graphs > 0 and replays.count == 0, detail)


# ---------------------------------------------------------------------------------------
# studies: the seed studies' CUDA rows, eager, each from the study's own base config.

def studies(args) -> None:
    report = Report("studies", args.budget_s, args)
    from accelsweep.sweeps import metric_collection, varlen_gpt, vit_attention

    def vit_rows():
        base = vit_attention.base_config("cuda", "vit-attn-196", args.vit_batch, False, 8, 0).replace(
            **measurement(args))
        for attention in ("naive", "sdpa", "sdpa-flash", "sdpa-efficient", "sdpa-cudnn", "sdpa-math"):
            yield ("vit_attention", f"{attention} eager", base.replace(attention=attention),
                   ("step_time_p50_s", "throughput_samples_per_s"))

    def metric_rows():
        # Windows hold its compute() every 100 steps: at least 100 steps each.
        base = metric_collection.base_config("cuda", False, 8, 0).replace(
            **{**measurement(args), "window_min_steps": max(100, args.window_steps)})
        for mode in ("none", "naive", "all-fixes"):
            yield ("metric_collection", mode, base.replace(metrics_mode=mode),
                   ("throughput_samples_per_s", "step_time_p50_s"))

    def varlen_rows():
        base = varlen_gpt.base_config("cuda", False, "uniform", 0).replace(**measurement(args))
        for batching in varlen_gpt.runnable_on("cuda"):
            yield ("varlen_gpt", f"{batching} eager", base.replace(batching=batching),
                   ("throughput_tokens_per_s", "step_time_p50_s"))

    makers = {"vit_attention": vit_rows, "metric_collection": metric_rows, "varlen_gpt": varlen_rows}
    rows = [row for study in args.studies for row in makers[study]()]  # in the order asked
    for study, name, config, figures in rows:
        if args.only and not any(word in f"{study} {name}" for word in args.only):
            continue
        if report.left_s() < 12:
            report.row({"study": study, "row": name, "status": f"skipped: {report.left_s():.0f} s of the section's "
                                                               "budget left"})
            continue
        _time_row(report, name, config, args.max_compile_s, study=study, figures=figures)


def table(section: str) -> None:
    with open(_out(section)) as file:
        data = json.load(file)
    print(f"\n== {section}: {data['device']} (sm {data['capability']}), torch {data['torch']}, CUDA {data['cuda']}, "
          f"{data['date_utc']} UTC; windows {data['measurement']}")
    for name, check in data["checks"].items():
        print(f"  {'PASS' if check['passed'] else 'FAIL'}  {name}")
    for row in data["rows"]:
        figures = [f"{k} {row[k]:.4g}" for k in ("throughput_samples_per_s", "throughput_tokens_per_s",
                                                  "step_time_p50_s", "compile_s")
                   if isinstance(row.get(k), (int, float)) and not math.isnan(row[k])]
        print(f"  {row['study']:<17} {row['row']:<36} {row.get('status', '?')[:60]:<12} {', '.join(figures)}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("section", choices=("capabilities", "knobs", "studies"))
    parser.add_argument("--budget-s", type=float, default=150.0,
                        help="no row starts once it would end past this many seconds from the start")
    parser.add_argument("--warmup-steps", type=int, default=3)
    parser.add_argument("--window-steps", type=int, default=5)
    parser.add_argument("--window-s", type=float, default=1.0)
    parser.add_argument("--windows", type=int, default=3)
    parser.add_argument("--max-compile-s", type=float, default=60.0)
    parser.add_argument("--only", nargs="*", default=None, help="rows whose name has one of these words")
    parser.add_argument("--rows", nargs="*", default=None, help="knobs: only the rows of exactly these names, spaces written as _ (a plan's words have none)")
    parser.add_argument("--num-workers", type=int, default=None,
                        help="knobs: every row with this many DataLoader workers (default: each row's own)")
    parser.add_argument("--no-checks", action="store_true", help="knobs: time the eager rows without checking them")
    parser.add_argument("--studies", nargs="*", default=["vit_attention", "metric_collection", "varlen_gpt"],
                        choices=("vit_attention", "metric_collection", "varlen_gpt"), help="in this order")
    parser.add_argument("--vit-batch", type=int, default=128, help="vit_attention's batch (the seed's 128)")
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("gpu_checks: needs a CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    {"capabilities": capabilities, "knobs": knobs, "studies": studies}[args.section](args)
    table(args.section)
    failed = [n for n, c in json.load(open(_out(args.section)))["checks"].items() if not c["passed"]]
    return 1 if failed else 0


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
