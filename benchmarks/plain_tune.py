"""What a performance engineer writes instead of accelsweep: Ray Tune + Optuna + MLflow,
as their documentation shows them. The same model, knobs (all but patch_embed), trial
resources, samples and time budget as the main job (sweeps/neuron_vit.py); no import of
accelsweep. Prints its answer as one ``RESULT {json}`` line at the end.

    python benchmarks/plain_tune.py --seed 0 --storage /tmp/plain --tracking-uri sqlite:////tmp/plain/mlflow.db
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from plain_vit import BASELINE, trainer, window  # noqa: E402

from ray import tune  # noqa: E402
from ray.air.integrations.mlflow import MLflowLoggerCallback  # noqa: E402
from ray.tune.schedulers import ASHAScheduler  # noqa: E402
from ray.tune.search.optuna import OptunaSearch  # noqa: E402

SMOKE = dict(model="vit-micro", warmup=2, min_steps=3, min_s=0.25, windows=2)
FULL = dict(model="vit-tiny", warmup=3, min_steps=5, min_s=2.0, windows=3)


def train_vit(config):
    measurement = config["measurement"]
    step = trainer({k: v for k, v in config.items() if k != "measurement"}, measurement["model"])
    for _ in range(measurement["warmup"]):
        step()
    for _ in range(measurement["windows"]):
        tune.report({"throughput": window(step, measurement["min_steps"], measurement["min_s"])})


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-samples", type=int, default=24)
    parser.add_argument("--time-budget-s", type=float, default=480)
    parser.add_argument("--storage", required=True)
    parser.add_argument("--tracking-uri", required=True)
    parser.add_argument("--smoke", action="store_true", help="the tiny model: a check of the harness")
    args = parser.parse_args()
    cpus = os.cpu_count()
    space = {
        "batch_size": tune.choice([8, 16, 32] if args.smoke else [8, 16, 32, 64]),
        "num_workers": tune.choice([0, 1, 2]),
        "precision": tune.choice(["fp32", "bf16-autocast", "bf16"]),
        "threads": tune.choice(sorted({1, max(1, cpus // 2), cpus})),
        "channels_last": tune.choice([False, True]),
        "measurement": SMOKE if args.smoke else FULL,
    }
    if not args.smoke:
        space["torch_compile"] = tune.choice(["none", "inductor"])
    baseline = {key: BASELINE[key] for key in space if key != "measurement"}
    baseline["threads"] = cpus
    searcher = OptunaSearch(points_to_evaluate=[baseline], seed=args.seed)
    scheduler = ASHAScheduler(time_attr="training_iteration", grace_period=1, max_t=3)
    tuner = tune.Tuner(
        tune.with_resources(train_vit, {"cpu": cpus}),
        param_space=space,
        tune_config=tune.TuneConfig(metric="throughput", mode="max", search_alg=searcher, scheduler=scheduler,
                                    num_samples=args.num_samples,
                                    time_budget_s=args.time_budget_s),
        run_config=tune.RunConfig(name="plain_vit", storage_path=args.storage, callbacks=[
            MLflowLoggerCallback(tracking_uri=args.tracking_uri, experiment_name="plain_vit", save_artifact=False)]),
    )
    started = time.monotonic()
    results = tuner.fit()
    wall = time.monotonic() - started
    best = results.get_best_result()
    frame = results.get_dataframe()
    baseline_rows = frame  # the baseline's trial (the first point), read back from Tune's table
    for key, value in baseline.items():
        baseline_rows = baseline_rows[baseline_rows[f"config/{key}"] == value]
    baseline_throughput = float(baseline_rows["throughput"].iloc[0]) if len(baseline_rows) else float("nan")
    winner = {k: v for k, v in best.config.items() if k != "measurement"}
    print("RESULT " + json.dumps({
        "fit_s": wall, "trials": sum(1 for r in results if r.config),  # a trial the budget cut before it began has none
        "winner": winner, "winner_throughput": best.metrics["throughput"],
        "baseline_throughput": baseline_throughput,
        "configs": [{k: v for k, v in r.config.items() if k != "measurement"} for r in results if r.config],
        "claimed_gain": best.metrics["throughput"] / baseline_throughput - 1}), flush=True)


if __name__ == "__main__":
    main()
