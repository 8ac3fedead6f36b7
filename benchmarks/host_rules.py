"""The search's and the confirmation's rules against the records of the host kinds they
were measured on: whether each constant still holds there, from the records alone.

    .venv/bin/python benchmarks/host_rules.py > benchmarks/results/host_rules.md
    .venv/bin/python benchmarks/host_rules.py --save-quiet sqlite:///mlflow.db benchmarks/results/quiet_sweep_<cpu>.json

Per rule, per record (its CPU named): the near-best margin each main job derived from its
own noise (sweeps/driver/reporting/noise.py) against the 10% it replaced; the time budget
and the confirmation's share, by the peer benchmark's checks on that host
(benchmarks/vs_plain_tune.py); CONTENDED_CPUS between what a quiet machine's meter reads
and the competitor that slows a training step by a quarter in every round
(benchmarks/contention.py),
and above what a quiet main job's own neighbours read (--save-quiet);
REJECT_RATIO above the smallest ratio that never rejects a config within 5% of the best and
below the slowest config's ratio (benchmarks/search_efficiency.py's recorded grids).
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import re
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from benchmarks.plain_vit import BASELINE  # noqa: E402
from benchmarks.recorded_grid import Table  # noqa: E402
from benchmarks.search_efficiency import rejection_evidence  # noqa: E402
from benchmarks.vs_plain_tune import block_noise, block_spreads, share_interval  # noqa: E402

from accelsweep.sweeps.driver.record.tracking import mlflow_client  # noqa: E402
from accelsweep.sweeps.driver.reporting.noise import PRIOR_MARGIN  # noqa: E402
from accelsweep.sweeps.driver.reporting.verdict import SITTING_NOISE, TIE_MARGIN, t95  # noqa: E402
from accelsweep.sweeps.driver.run.confirm import CLAIM_ROUNDS, ROUND_NOISE, THIRD_ROUNDS  # noqa: E402
from accelsweep.sweeps.neuron_vit import CPU_TIME_BUDGET_S  # noqa: E402
from accelsweep.trainables.contention import CONTENDED_CPUS  # noqa: E402
from accelsweep.trainables.loop.rejection import REJECT_RATIO  # noqa: E402
from accelsweep.trainables.platforms.cpu import CpuPlatform  # noqa: E402

RESULTS, DATA = os.path.join(HERE, "results"), os.path.join(HERE, "data")
SLOWED_BY = 0.25  # a competitor that slows a step by this much must read as contended
CHECKS = {"wall_at_most_75pct": "wall <= 0.75x", "winner_within_3pct_of_best": "the winner within 3% of the best",
          "claim_inside_confirmed_interval": "the claim inside the judge's interval"}


def near_best_and_budget(path: str) -> list[str]:
    record = _load(path)
    lines = [f"### `{os.path.relpath(path, HERE)}`: {record['machine']}, {record['date']}", "",
             "| seed | near-best margin (derived) | wall / plain's | winner of the judge's best [95%] | claim inside |",
             "|---|---|---|---|---|"]
    for pair in record["pairs"]:
        accel, plain = pair["accelsweep"], pair["plain"]
        margin = accel.get("near_best_margin", math.nan)
        lines.append(f"| {pair['seed']} | {'not recorded' if not math.isfinite(margin) else f'{margin:.1%}'} | "
                     f"{accel['wall_s'] / plain['wall_s']:.2f} | "
                     f"{accel['of_best']:.1%}{share_interval(accel.get('of_best_interval'))} | "
                     f"{pair['checks']['claim_inside_confirmed_interval']} |")
    pairs = record["pairs"]
    held = {check: sum(pair["checks"][check] for pair in pairs) for check in CHECKS}
    said = ", ".join(f"{words} in {held[check]} of {len(pairs)}" for check, words in CHECKS.items())
    shortest = min(pair["plain"]["wall_s"] for pair in pairs)
    lines += ["", f"The shortest plain wall: {shortest:.0f} s (0.75x: {0.75 * shortest:.0f} s; the main job's "
                  f"budget now: CPU_TIME_BUDGET_S = {CPU_TIME_BUDGET_S} s).",
              "", f"Budget {record['time_budget_s']:g} s and confirmation share {record['confirm_share']:.0%}: "
                  f"{'every check held' if all(v == len(pairs) for v in held.values()) else said}; the judge's "
                  f"best config: {record['best_config']}; configs past the space's edges judged: "
                  f"{len(record.get('beyond_edges', []))}.", ""]
    return lines


def _judged_baseline(judged: dict) -> str:
    return next(key for key, one in judged.items() if all(one["config"].get(k) == v for k, v in BASELINE.items()))


def _round_noises(judged: dict) -> list[float]:
    """Each judged config's sd of one round's paired log ratio over the baseline."""
    base, noise = _judged_baseline(judged), []
    for key, one in judged.items():
        pairs = [math.log(a / b) for a, b in zip(one["figures"], judged[base]["figures"]) if a > 0 and b > 0]
        if key != base and len(pairs) >= 3:
            noise.append(statistics.stdev(pairs))
    return noise


def round_noise_over(paths: list[str]) -> list[str]:
    """ROUND_NOISE's and CLAIM_ROUNDS' derivation: one round's sd in turns, the median over
    the records' claims (read back from their intervals), against SITTING_NOISE."""
    spreads = _claims_round_spreads(paths)
    if not spreads:
        return []
    derived = statistics.median(sd for sd, _ in spreads)
    rounds = math.ceil((derived / SITTING_NOISE) ** 2)
    return [f"One round in turns, over these records' {len(spreads)} claims: median sd {derived:.3f} "
            f"(ROUND_NOISE = {ROUND_NOISE}); past ({derived:.3f} / SITTING_NOISE {SITTING_NOISE})^2 = {rounds} "
            f"rounds a claim is as precise as its sitting lets it be (CLAIM_ROUNDS = {CLAIM_ROUNDS}; a third "
            f"candidate takes turns while every candidate gets THIRD_ROUNDS = {THIRD_ROUNDS}). The judge's own "
            f"rounds, in fresh processes, spread more (above, record by record).", ""]


def _judged_blocks(record: dict) -> tuple[dict[str, list[float]], str, int]:
    """A record's judged figures by config key, its baseline's key and its judge's blocks
    (0 where its judge took none: fresh processes per measurement)."""
    judged = record["judged"]
    blocks = (record.get("blocks") or 0) if record.get("judge") == "windows" else 0
    return {key: one["figures"] for key, one in judged.items()}, _judged_baseline(judged), blocks


def _block_spreads(record: dict) -> list[tuple[float, float]]:
    """Per judged config of a record but the baseline: its blocks' spread and its rounds'
    share of it (vs_plain_tune.block_spreads)."""
    figures, baseline, blocks = _judged_blocks(record)
    return block_spreads(figures, baseline, blocks) if blocks >= 2 else []


def sitting_noise(paths: list[str]) -> list[str]:
    """SITTING_NOISE's derivation: how far one block's gain is from the gain over blocks,
    beyond what its rounds' noise explains (the blocks' spread less the rounds' share), per
    record and pooled over every judged config of every record; and what it predicts for a
    claim's error against what the claims measured."""
    lines, pooled = [], []
    for path in paths:
        spreads = _block_spreads(_load(path))
        if not spreads:
            continue
        pooled += spreads
        between, rounds = statistics.fmean(s[0] for s in spreads), statistics.fmean(s[1] for s in spreads)
        lines.append(f"- `{os.path.relpath(path, HERE)}`: {len(spreads)} configs; a block's mean spreads by sd "
                     f"{math.sqrt(between):.3f}, its rounds alone explain {math.sqrt(rounds):.3f}: "
                     f"{_excess_words(between, rounds)}")
    if not pooled:
        return []
    between, rounds = statistics.fmean(s[0] for s in pooled), statistics.fmean(s[1] for s in pooled)
    derived = math.sqrt(max(0.0, between - rounds))
    errors = [error for path in paths for error in claim_errors(path)]
    spreads = _claims_round_spreads(paths)  # (sd of one round, rounds) per claim, from its interval
    rms = math.sqrt(statistics.fmean(e * e for e in errors)) if errors else math.nan
    alone = math.sqrt(statistics.fmean(sd * sd / n for sd, n in spreads)) if spreads else math.nan
    round_sd = statistics.median(sd for sd, _ in spreads) if spreads else math.nan
    held, held_with, claims = _intervals_holding_the_judge(paths, derived)
    inside = claims_inside_the_judge(paths)
    return lines + ["", f"Pooled over {len(pooled)} judged configs: one sitting's gain is off the gain over sittings "
                        f"by sd {derived:.3f} beyond its rounds' noise (SITTING_NOISE = {SITTING_NOISE}). The "
                        f"claims' own rounds (one round's sd {round_sd:.3f}, the median over {len(spreads)} claims, "
                        f"read from their intervals) predict an error against the judge of rms {alone:.3f} alone, "
                        f"{math.hypot(alone, derived):.3f} with the sitting; the claims measured {rms:.3f} over "
                        f"{len(errors)} pairs (the judge's own error is in that too). The claims' 95% intervals held the "
                        f"judge's gain in {held} of {claims} pairs from their rounds alone, in {held_with} with "
                        f"{derived:.3f} beside them.", "",
                    "The judge's own interval: its rounds fall in blocks (3 by default), and a block's level is shared by "
                    "its rounds, so the judge counts its blocks' spread beyond their rounds (pooled over the "
                    "record's configs, over the square root of the blocks) beside the rounds' t interval. "
                    f"The claims inside it: {inside[0]} of {inside[2]} from the rounds alone, {inside[1]} with "
                    f"the blocks' spread.", ""]


def _claims_round_spreads(paths: list[str]) -> list[tuple[float, int]]:
    """Per recorded claim: (the sd of one of its rounds' log ratios, its rounds), read back
    from its Student's t interval, less the sitting's share where the record's claims held
    one (``claim_sitting_noise``)."""
    spreads = []
    for path in paths:
        record = _load(path)
        sitting_half = 1.96 * record.get("claim_sitting_noise", 0.0)
        for pair in record["pairs"]:
            said = re.search(r"interval ([-+][\d.]+)% to ([-+][\d.]+)%, (\d+) interleaved rounds",
                             pair["accelsweep"].get("verdict", ""))
            if said and int(said.group(3)) >= 2:
                low, high, rounds = math.log1p(float(said.group(1)) / 100), math.log1p(float(said.group(2)) / 100), \
                    int(said.group(3))
                half = math.sqrt(max(0.0, ((high - low) / 2) ** 2 - sitting_half ** 2))
                spreads.append((half / t95(rounds - 1) * math.sqrt(rounds), rounds))
    return spreads


def _intervals_holding_the_judge(paths: list[str], sitting: float) -> tuple[int, int, int]:
    """(claims whose interval held the judge's gain, held it widened by ``sitting``, claims)."""
    held = held_with = claims = 0
    for path in paths:
        record = _load(path)
        recorded_half = 1.96 * record.get("claim_sitting_noise", 0.0)  # already in the record's intervals
        for pair in record["pairs"]:
            accel = pair["accelsweep"]
            said = re.search(r"interval ([-+][\d.]+)% to ([-+][\d.]+)%", accel.get("verdict", ""))
            if not said:
                continue
            low, high = (math.log1p(float(x) / 100) for x in said.groups())
            claim, judged = math.log1p(accel["claimed_gain"]), math.log1p(accel["confirmed_gain"]["gain"])
            rounds_half = math.sqrt(max(0.0, ((high - low) / 2) ** 2 - recorded_half ** 2))
            claims += 1
            held += abs(judged - claim) <= rounds_half
            held_with += abs(judged - claim) <= math.hypot(rounds_half, 1.96 * sitting)
    return held, held_with, claims


def claims_inside_the_judge(paths: list[str]) -> tuple[int, int, int]:
    """(claims inside the judge's interval from its rounds alone, inside it with its blocks'
    spread beside them (vs_plain_tune.block_noise), claims). A record written since the
    judge counts its blocks has them in its interval already."""
    rounds_only = with_blocks = claims = 0
    for path in paths:
        record = _load(path)
        figures, baseline, blocks = _judged_blocks(record)
        block_half = 1.96 * block_noise(figures, baseline, blocks) / math.sqrt(max(1, blocks))
        for pair in record["pairs"]:
            accel = pair["accelsweep"]
            if not math.isfinite(accel.get("claimed_gain", math.nan)):
                continue
            gain = accel["confirmed_gain"]
            centre, half = math.log1p(gain["gain"]), (math.log1p(gain["high"]) - math.log1p(gain["low"])) / 2
            if "block_noise" in record:
                half = math.sqrt(max(0.0, half ** 2 - block_half ** 2))
            error = abs(math.log1p(accel["claimed_gain"]) - centre)
            claims += 1
            rounds_only += error <= half
            with_blocks += error <= math.hypot(half, block_half)
    return rounds_only, with_blocks, claims


def _excess_words(between: float, rounds: float) -> str:
    if between <= rounds:
        return "nothing beyond them"
    return f"a sitting adds sd {math.sqrt(between - rounds):.3f}"


def claim_precision(path: str) -> list[str]:
    """A peer record's judge: the sd of one round's paired log ratio
    (each judged config's window over the baseline's in the same round), and each pair's
    claim against the judged gain, beside the error its rounds alone explain."""
    record = _load(path)
    judged = record["judged"]
    base = _judged_baseline(judged)
    noise = _round_noises(judged)
    round_noise = statistics.median(noise)
    lines = [f"### `{os.path.relpath(path, HERE)}`: {record['machine']}, {record['date']}", "",
             f"One round's paired noise in the judge: median {round_noise:.3f} (configs {min(noise):.3f}-"
             f"{max(noise):.3f}, {len(judged[base]['figures'])} rounds each).", "",
             "| seed | claim | judged [95%] | claim's rounds | error (log) | its rounds' noise alone (sd) |",
             "|---|---|---|---|---|---|"]
    for pair in record["pairs"]:
        accel = pair["accelsweep"]
        said = re.search(r"(\d+) interleaved rounds", accel.get("verdict", ""))
        gain, claim = accel["confirmed_gain"], accel["claimed_gain"]
        rounds = int(said.group(1)) if said else 0
        error = math.log1p(claim) - math.log1p(gain["gain"])
        alone = round_noise / math.sqrt(rounds) if rounds else math.nan
        lines.append(f"| {pair['seed']} | {claim:+.1%} | {gain['gain']:+.1%} [{gain['low']:+.1%}, {gain['high']:+.1%}] | "
                     f"{rounds or '?'} | {error:+.3f} | {alone:.3f} |")
    return lines + [""]


def claim_errors(path: str) -> list[float]:
    """Each pair's claim against the judge's gain: log(1 + claim) - log(1 + judged)."""
    pairs = _load(path)["pairs"]
    return [math.log1p(p["accelsweep"]["claimed_gain"]) - math.log1p(p["accelsweep"]["confirmed_gain"]["gain"])
            for p in pairs if math.isfinite(p["accelsweep"].get("claimed_gain", math.nan))]


def tie_margin(paths: list[str]) -> list[str]:
    """TIE_MARGIN against every record: how far one candidate's confirmed lead over another
    can be from the judge's, sqrt(2) x the rms of the claims' errors."""
    errors = [error for path in paths for error in claim_errors(path)]
    if not errors:
        return []
    rms = math.sqrt(statistics.fmean(e * e for e in errors))
    return [f"Every record's claims against the judge: {len(errors)} pairs, errors {min(errors):+.3f} to "
            f"{max(errors):+.3f} (log), rms {rms:.3f}; a lead of one candidate over another, the difference of "
            f"two such: sqrt(2) x {rms:.3f} = {math.sqrt(2) * rms:.3f} (TIE_MARGIN = {TIE_MARGIN}).", ""]


def contention(path: str) -> list[str]:
    record = _load(path)
    rows = sorted(record["rows"], key=lambda row: row["competitor_cpus"])
    quiet = rows[0]["other_cpus_median"]
    # Slowed in every round: a competitor whose cost a window's noise cannot hide.
    slowing = next((row for row in rows if row.get("slowdown_min", row["slowdown_median"]) >= SLOWED_BY), None)
    lines = [f"### `{os.path.relpath(path, HERE)}`: {record['machine']}, {record['date']}", "",
             "| competitor (cores) | meter reads (median) | slowdown (median) | slowdown (least) |",
             "|---|---|---|---|"]
    lines += [f"| {row['competitor_cpus']:g} | {row['other_cpus_median']:.3f} | {row['slowdown_median']:.1%} | "
              f"{row.get('slowdown_min', math.nan):.1%} |" for row in rows]
    if slowing is None:
        verdict = f"no competitor slowed the step by {SLOWED_BY:.0%} in every round"
    else:
        holds = quiet < CONTENDED_CPUS <= slowing["other_cpus_median"]
        verdict = (f"quiet reads {quiet:.3f}; the first competitor slowing the step by {SLOWED_BY:.0%} or more in "
                   f"every round reads {slowing['other_cpus_median']:.3f}: CONTENDED_CPUS = {CONTENDED_CPUS} "
                   f"{'lies between' if holds else 'does NOT lie between'}")
    return lines + ["", verdict + ".", ""]


def quiet_sweep_windows(tracking_uri: str, experiment: str = "neuron_vit") -> list[float]:
    """``contention_cpus`` (other processes' CPU beyond the cores a trial left free) of
    every window of every trial of the sweeps in ``tracking_uri``: what a sweep's own
    neighbours (Ray, Tune's loop, MLflow's writes) read on a machine with nothing else on it."""
    client = mlflow_client(tracking_uri)
    found = client.get_experiment_by_name(experiment)
    runs = client.search_runs([found.experiment_id], max_results=1000) if found else []
    return [point.value for run in runs if run.data.tags.get("kind") != "sweep"
            for point in client.get_metric_history(run.info.run_id, "contention_cpus") if math.isfinite(point.value)]


def save_quiet_sweep(tracking_uri: str, path: str) -> None:
    values = quiet_sweep_windows(tracking_uri)
    with open(path, "w") as out:
        json.dump({"machine": CpuPlatform().capabilities(None).hardware, "date": time.strftime("%Y-%m-%d %H:%M"),
                   "contention_cpus": values}, out, indent=1)


def quiet_sweep(path: str) -> list[str]:
    record = _load(path)
    values = sorted(record["contention_cpus"])
    if not values:
        return [f"`{os.path.relpath(path, HERE)}`: no window recorded", ""]
    above = sum(value > CONTENDED_CPUS for value in values)
    return [f"A quiet main job's own neighbours, `{os.path.relpath(path, HERE)}` ({record['machine']}, "
            f"{record['date']}): {len(values)} windows read median {statistics.median(values):.3f}, "
            f"90th percentile {values[int(0.9 * (len(values) - 1))]:.3f}, most {values[-1]:.3f} cores beyond "
            f"the cores left free; {above} above CONTENDED_CPUS ({CONTENDED_CPUS}).", ""]


def rejection(path: str) -> list[str]:
    table = Table.load(path)
    evidence = rejection_evidence(table)
    slowest = max(table.best / row.throughput for row in table.rows.values() if row.throughput)
    machine = table.machine
    flags = " ".join(flag for flag in machine.get("cpu_flags", []) if flag.startswith(("avx", "amx")))
    holds = evidence["smallest_safe_ratio"] < REJECT_RATIO
    return [f"### `{os.path.relpath(path, HERE)}`: {machine.get('cpu_model', '?')} ({flags}), "
            f"{machine.get('date_utc', '?')} UTC", "",
            f"{table.size} configs; projection over the full run {evidence['projection_over_final_min']:.2f}-"
            f"{evidence['projection_over_final_max']:.2f}; the smallest ratio that never rejects a config within 5% "
            f"of the best: {evidence['smallest_safe_ratio']:.2f}; the slowest config {slowest:.1f}x below the best; "
            f"configs >= 3x below: {evidence['slower_3x']}, >= 5x: {evidence['slower_5x']}. REJECT_RATIO = "
            f"{REJECT_RATIO:g} {'is above the safe ratio' if holds else 'is NOT above the safe ratio'}.", ""]


def _load(path: str) -> dict:
    with open(path) as record:
        return json.load(record)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peer", nargs="*", default=sorted(glob.glob(os.path.join(RESULTS, "vs_plain_tune*.json"))))
    parser.add_argument("--contention", nargs="*",
                        default=sorted(glob.glob(os.path.join(RESULTS, "contention_*.json")))
                        + sorted(glob.glob(os.path.join(DATA, "contention_*.json"))))
    parser.add_argument("--quiet", nargs="*", default=sorted(glob.glob(os.path.join(RESULTS, "quiet_sweep_*.json"))))
    parser.add_argument("--grids", nargs="*", default=sorted(glob.glob(os.path.join(DATA, "cpu_vit_tiny_*.json"))))
    parser.add_argument("--save-quiet", nargs=2, metavar=("TRACKING_URI", "JSON"),
                        help="no table: save the windows' contention_cpus of a main job run on a machine with "
                             "nothing else on it (its MLflow store) to JSON, for the CONTENDED_CPUS section")
    args = parser.parse_args(argv)
    if args.save_quiet:
        save_quiet_sweep(*args.save_quiet)
        return 0
    lines = ["# The rules against each host kind's records", "",
             "Written by `benchmarks/host_rules.py` from the records below; each names its CPU.", "",
             f"## Near-best margin (derived per run; {PRIOR_MARGIN:.0%} before), time budget, confirmation share",
             ""]
    for path in args.peer:
        lines += near_best_and_budget(path)
    lines += ["## The claims against the judge, per record", ""]
    for path in args.peer:
        lines += claim_precision(path)
    lines += tie_margin(args.peer)
    lines += ["## SITTING_NOISE, ROUND_NOISE and CLAIM_ROUNDS (what one sitting's claim can and cannot average away)",
              ""]
    lines += sitting_noise(args.peer)
    lines += round_noise_over(args.peer)
    lines += ["## CONTENDED_CPUS", ""]
    for path in args.contention:
        lines += contention(path)
    for path in args.quiet:
        lines += quiet_sweep(path)
    lines += ["## REJECT_RATIO", ""]
    for path in args.grids:
        lines += rejection(path)
    print("\n".join(lines).rstrip())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
