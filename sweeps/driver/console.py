"""The ``accelsweep`` command: every study, and the tools around them, under one name.

    accelsweep studies                          # the built-in studies, and where each runs
    accelsweep run neuron_vit --smoke           # a study by name, with its own flags
    accelsweep run my_sweep.py --num-samples 8  # your own sweep script, the same way
    accelsweep run neuron_vit --help            # a study's flags
    accelsweep report SWEEP                     # rebuild a sweep's report from MLflow
    accelsweep compare SWEEP SWEEP ...          # sweeps' best configs side by side
    accelsweep cluster up|down|status           # try the cluster path on this machine
    accelsweep hosts up|down|status             # several hosts on this machine (namespaces)
    accelsweep team-store up|down|status        # a team's record on PostgreSQL

``accelsweep run NAME ARGS`` is ``python sweeps/NAME.py ARGS`` from any directory: the study
runs as its own ``__main__``, so its flags, output and exit status are the script's.
"""

from __future__ import annotations

import sys
from typing import Optional, Sequence

from accelsweep.sweeps.driver.define.cli import fail
from accelsweep.sweeps.driver.run.detach import detach
from accelsweep.sweeps.driver.define.studies import STUDIES, run_study, study_target
from accelsweep.trainables.errors import ConfigError
from accelsweep.trainables.process_end import end_process

# name -> (what it does, the module it runs); run is handled apart (it takes a study)
TOOLS = {
    "report": ("rebuild a sweep's report (tables, plots) from its MLflow record",
               "accelsweep.sweeps.driver.reporting.report_command"),
    "compare": ("two or more sweeps' best configs side by side, the cheaper per sample named",
                "accelsweep.sweeps.driver.reporting.compare_command"),
    "cluster": ("up|down|status: a local cluster of cluster.yaml's node types, launched on demand by Ray's "
                "autoscaler", "accelsweep.sweeps.driver.ops.local_cluster"),
    "hosts": ("up|down|status: a Ray cluster across network namespaces on this machine (root)",
              "accelsweep.sweeps.driver.ops.cluster_hosts"),
    "team-store": ("up|down|status: a team's record: PostgreSQL, an MLflow server on it, the studies' database",
                   "accelsweep.sweeps.driver.ops.team_store"),
}

USAGE = f"""usage: accelsweep <command> [args]

commands:
  run STUDY|SCRIPT.py [flags]   run a study by name, or your own sweep script
                                (flags: accelsweep run STUDY --help; --detach first: a driver
                                that outlives the terminal, its output in a log file)
  studies                       list the built-in studies and where each runs
{chr(10).join(f"  {name:<28}  {what}" for name, (what, _) in TOOLS.items())}
                                (args: accelsweep {'|'.join(TOOLS)} --help)

Docs: the README and docs/ (mkdocs serve) in the repository.
"""


RUN_USAGE = """usage: accelsweep run [--detach] STUDY|SCRIPT.py [flags]

  --detach   run the sweep's driver as a process of its own, its output in a log file: closing the
             terminal (an SSH session to a cluster's head) does not end it; --resume continues it if killed

"""


def list_studies() -> str:
    width = max(map(len, STUDIES))
    lines = [f"{'study':<{width}}  {'kind':<8}  {'runs on':<28}  what it is"]
    for study in STUDIES.values():
        lines.append(f"{study.name:<{width}}  {study.kind:<8}  {study.runs_on:<28}  {study.summary}")
    lines.append("\nrun one: accelsweep run NAME [flags]; its flags: accelsweep run NAME --help")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(USAGE, end="")
        return
    command, rest = args[0], args[1:]
    if command == "studies":
        print(list_studies())
    elif command == "run":
        detached = bool(rest) and rest[0] == "--detach"
        if detached:
            rest = rest[1:]
        if not rest or rest[0] in ("-h", "--help"):
            print(RUN_USAGE + list_studies())
            return
        try:
            if detached:
                study_target(rest[0])  # an unknown study is refused here, not in a log file
                detach(rest)
                return
            run_study(rest[0], rest[1:])
        except ConfigError as error:  # the study's name; its own flags are its own script's to refuse
            fail(error)
    elif command in TOOLS:
        import runpy

        sys.argv = [f"accelsweep {command}", *rest]
        try:
            runpy.run_module(TOOLS[command][1], run_name="__main__", alter_sys=True)
        except SystemExit as ended:
            status = exit_status(ended)
        else:
            status = 0
        if argv is None:  # the command itself, not a caller's main([...]): its process ends here
            end_process(status)
        if status:
            sys.exit(status)
    else:
        fail(ConfigError("command", f"one of run, studies, {', '.join(TOOLS)}", command))


def exit_status(ended: SystemExit) -> int:
    """The status the interpreter would give ``ended``: a message is printed and is 1."""
    if ended.code is None or isinstance(ended.code, int):
        return ended.code or 0
    print(ended.code, file=sys.stderr)
    return 1


if __name__ == "__main__":
    main()
