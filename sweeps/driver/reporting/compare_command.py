"""Compare sweeps: each one's best config side by side, and which is cheaper per sample.

    accelsweep compare neuron_vit-20261123-170238 neuron_vit-20261124-091500   # parent run names or ids
    accelsweep compare <run id> <run id> --tracking-uri sqlite:///mlflow.db --no-log --out compare/

The seed's question "trn1.2xlarge or trn1.32xlarge, which is cheaper per sample?": run
the study on each (``sweeps/neuron_vit.py --instance-type ...``), then compare the two
sweeps. Prints the table (throughput, $ per 1M samples, step time, compile time,
instance type and price basis of each best config), the sentence naming the cheaper and
what else differs between the sweeps, and logs it all (comparison.md, .html, .png) as a
run of its own, kind=comparison, in the first sweep's MLflow experiment.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile

from accelsweep.sweeps.driver.define.cli import main_guard
from accelsweep.sweeps.driver.record.tracking import add_tracking_uri_flag
from accelsweep.sweeps.driver.reporting.comparison import compare_sweeps, log_comparison, write_comparison
from accelsweep.sweeps.driver.reporting.summary import plain


def main() -> None:
    parser = argparse.ArgumentParser(prog="accelsweep compare", description=__doc__.split("\n\n")[0])
    parser.add_argument("sweeps", nargs="+", metavar="SWEEP",
                        help="two or more sweeps: their MLflow parent run ids or run names")
    add_tracking_uri_flag(parser)
    parser.add_argument("--out", default=None, help="also write comparison.md, .html and .png into this folder")
    parser.add_argument("--no-log", action="store_true", help="do not log the comparison as an MLflow run")
    args = parser.parse_args()
    comparison = compare_sweeps(args.tracking_uri, args.sweeps)
    print(plain(comparison.blocks))
    if args.out:
        with tempfile.TemporaryDirectory(prefix="accelsweep-compare-") as out_dir:
            written = write_comparison(comparison, out_dir)
            shutil.copytree(out_dir, args.out, dirs_exist_ok=True)
        print(f"wrote {', '.join(os.path.join(args.out, os.path.basename(p)) for p in written)}")
    if not args.no_log:
        run_id = log_comparison(comparison)
        print(f"logged the comparison as MLflow run {run_id} ({comparison.run_name!r}, experiment "
              f"{comparison.entries[0].history.experiment_id})")


if __name__ == "__main__":
    main_guard(main)
