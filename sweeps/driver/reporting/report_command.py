"""Rebuild a sweep's report (tables and plots) from its MLflow record alone.

    accelsweep report neuron_vit-20261123-170102             # by parent run name, or run id
    accelsweep report <run id> --tracking-uri sqlite:///mlflow.db --out report/

Every sweep logs its report on its parent run when it ends; this builds it again (after
a sweep that was killed, or with a newer version of this tool) and logs it over the old
one, and with ``--out`` also writes it to a folder.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile

from accelsweep.sweeps.driver.define.cli import main_guard
from accelsweep.sweeps.driver.record.history import load_sweep
from accelsweep.sweeps.driver.record.tracking import add_tracking_uri_flag, mlflow_client
from accelsweep.sweeps.driver.reporting.report_artifacts import build_report


def main() -> None:
    parser = argparse.ArgumentParser(prog="accelsweep report", description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep", help="the sweep's MLflow parent run id or run name")
    add_tracking_uri_flag(parser)
    parser.add_argument("--study-storage", default=None,
                        help="the database of the sweep's Optuna study, when the parent run's record of it has "
                             "a password redacted (default: as recorded)")
    parser.add_argument("--out", default=None, help="also write the report into this folder")
    parser.add_argument("--no-log", action="store_true", help="do not log the report on the parent run")
    args = parser.parse_args()
    history = load_sweep(args.tracking_uri, args.sweep)
    with tempfile.TemporaryDirectory(prefix="accelsweep-report-") as out_dir:
        paths = build_report(history, out_dir, study_url=args.study_storage)
        if not args.no_log:
            client = mlflow_client(args.tracking_uri)
            for path in paths:
                folder = os.path.relpath(os.path.dirname(path), out_dir)
                client.log_artifact(history.parent_run_id, path, None if folder == "." else folder)
            print(f"logged {len(paths)} files on the parent run {history.parent_run_id} ({history.name})")
        if args.out:
            shutil.copytree(out_dir, args.out, dirs_exist_ok=True)
            print(f"wrote {os.path.join(args.out, 'report.html')} and {len(paths) - 1} other files")
        with open(os.path.join(out_dir, "report.md")) as report:
            print(report.read())


if __name__ == "__main__":
    main_guard(main)
