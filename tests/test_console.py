"""The one command (accelsweep: run, studies, report, compare), the study parsers the docs'
reference is built from, and what a trial tells the driver (its phases, its output)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

import pytest

from accelsweep.sweeps.driver.define.cli import common_parser
from accelsweep.sweeps.driver.define.studies import STUDIES, flags_of, study_parser
from accelsweep.trainables import trial_progress
from accelsweep.trainables.trial_progress import OUTPUT_LIMIT_BYTES, TAIL_BYTES, TrialProgress, captured_output

ACCELSWEEP = os.path.join(os.path.dirname(sys.executable), "accelsweep")


def accelsweep(*args, cwd):
    return subprocess.run([ACCELSWEEP, *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_help_lists_the_subcommands(tmp_path):
    done = accelsweep("--help", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    for command in ("run STUDY|SCRIPT.py", "studies", "report", "compare"):
        assert command in done.stdout


def test_studies_lists_every_study_with_what_it_is_and_where_it_runs(tmp_path):
    done = accelsweep("studies", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    for study in STUDIES.values():
        line = next(line for line in done.stdout.splitlines() if line.startswith(study.name + " "))
        assert study.runs_on in line and study.summary[:40] in line


def test_an_unknown_study_or_command_is_refused_naming_the_choices(tmp_path):
    done = accelsweep("run", "neuron_vitt", cwd=tmp_path)
    assert done.returncode == 2
    assert "study must be one of neuron_vit, cpu_resnet" in done.stderr and "'neuron_vitt'" in done.stderr
    done = accelsweep("sweep", cwd=tmp_path)
    assert done.returncode == 2 and "command must be one of run, studies, report, compare" in done.stderr
    done = accelsweep("run", "--detach", "neuron_vitt", cwd=tmp_path)  # refused here, not in a detached log
    assert done.returncode == 2 and "'neuron_vitt'" in done.stderr and not os.listdir(tmp_path)


@pytest.mark.real_process
def test_a_tool_ends_with_its_own_exit_status_and_output(tmp_path):
    """A tool (report, compare, cluster, hosts, team-store) ends its process through
    end_process: the status and the message are the tool's own."""
    done = accelsweep("compare", cwd=tmp_path)
    assert done.returncode == 2 and "the following arguments are required: SWEEP" in done.stderr
    done = accelsweep("report", "--help", cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.startswith("usage: accelsweep report")


def test_a_tools_exit_is_read_as_the_interpreter_reads_it(capsys):
    from accelsweep.sweeps.driver.console import exit_status

    assert [exit_status(SystemExit(code)) for code in (None, 0, 3)] == [0, 0, 3]
    assert exit_status(SystemExit("no cluster here")) == 1 and capsys.readouterr().err == "no cluster here\n"


def test_a_detached_run_says_where_its_output_is_and_writes_it_there(tmp_path):
    done = accelsweep("run", "--detach", "neuron_vit", "--smoke", "--dry-run", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    log = next(line.split("output in ")[1] for line in done.stdout.splitlines() if "output in " in line)
    assert os.path.dirname(log) == str(tmp_path) and "--resume" in done.stdout
    pid = int(done.stdout.split("pid ")[1].split(";")[0])
    deadline = time.monotonic() + 120
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.5)
    assert "sweep 'neuron_vit' on platform 'cpu'" in open(log).read()  # the dry run's plan, from the detached driver


@pytest.mark.slow
def test_run_takes_a_study_by_name_from_any_folder_with_its_own_flags(tmp_path):
    done = accelsweep("run", "neuron_vit", "--dry-run", "--platform", "neuron", "--instance-type", "trn1.2xlarge",
                      cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "sweep 'neuron_vit' on platform 'neuron'" in done.stdout and "NEURON_CC_FLAGS" in done.stdout
    bad = accelsweep("run", "neuron_vit", "--num-samples", "0", cwd=tmp_path)  # the study's own refusal
    assert bad.returncode == 2 and "--num-samples" in bad.stderr


def test_run_takes_a_users_script_by_path(tmp_path):
    script = tmp_path / "mine.py"
    script.write_text("import sys\nprint('my sweep got', sys.argv[1:])\n")
    done = accelsweep("run", str(script), "--num-samples", "3", cwd=tmp_path)
    assert done.returncode == 0 and "my sweep got ['--num-samples', '3']" in done.stdout


@pytest.mark.parametrize("name", list(STUDIES))
def test_every_study_parser_has_the_common_flags_and_is_built_without_running(name):
    common = {option for action in flags_of(common_parser("x", 1)) for option in action.option_strings}
    parser = study_parser(name)
    options = {option for action in flags_of(parser) for option in action.option_strings}
    assert common <= options, f"{name} lacks {sorted(common - options)}"
    assert parser.prog == f"accelsweep run {name}"
    assert sys.argv[0] != name  # the caller's command line is put back


# ---- what a trial tells the driver (trainables/trial_progress.py) --------------------------


class FakeReporter:
    """Keeps what captured_output sends, as the actor would."""

    def __init__(self):
        self.sent = []

    def send(self, chunk, wait=False):
        if chunk:
            self.sent.append(chunk)

    def phase(self, text):
        self.sent.append(("phase", text))


def test_captured_output_takes_python_and_c_level_writes_and_puts_the_descriptors_back(capfd):
    reporter = FakeReporter()
    with captured_output(reporter):
        print("from print", flush=True)
        print("to stderr", file=sys.stderr, flush=True)
        os.write(1, b"from os.write\n")
        subprocess.run(["echo", "from a child process"], check=True)
    print("after the trial", flush=True)
    sent = b"".join(chunk for chunk in reporter.sent if isinstance(chunk, bytes)).decode()
    for line in ("from print", "to stderr", "from os.write", "from a child process"):
        assert line in sent
    assert "after the trial" not in sent
    assert "after the trial" in capfd.readouterr().out  # the process's own output again


def test_a_trial_killed_mid_capture_leaves_no_file_in_the_temporary_folder(tmp_path, monkeypatch):
    """A trial ended by SIGKILL never reaches its cleanup: the capture's file must already
    be nameless while the trial runs."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    reporter = FakeReporter()
    with captured_output(reporter):
        print("while it runs", flush=True)
        during = list(tmp_path.iterdir())
    assert during == []
    assert b"while it runs" in b"".join(chunk for chunk in reporter.sent if isinstance(chunk, bytes))


def test_the_output_before_a_trial_comes_first_without_rays_log_markers(tmp_path, monkeypatch):
    log = tmp_path / "worker.err"
    log.write_bytes(b":job_id:01000000\n:actor_name:ImplicitFunc\nUserWarning: an import's warning\n")
    monkeypatch.setattr(trial_progress, "_process_logs", lambda: [str(log)])
    monkeypatch.setattr(trial_progress, "_read_up_to", {})
    first = trial_progress._unread_process_output().decode()
    assert "an import's warning" in first and ":job_id:" not in first and ":actor_name:" not in first
    assert trial_progress._unread_process_output() == b""  # read once
    log.write_bytes(log.read_bytes() + b":task_name:x\n")
    assert trial_progress._unread_process_output() == b""  # markers only: nothing


def test_the_actor_keeps_a_long_output_s_end_and_says_how_much_it_left_out():
    progress = TrialProgress()
    progress.set_phase("t1", "window 1 of 3", 5.0)
    assert progress.phases() == {"t1": ("window 1 of 3", 5.0)}
    chunk = b"x" * (OUTPUT_LIMIT_BYTES // 2) + b"\n"
    for _ in range(3):
        progress.append_output("t1", chunk)
    progress.append_output("t1", b"the last line\n")
    text = progress.take_output("t1")
    head, kept = text.split("\n", 1)
    assert kept.endswith("the last line\n") and TAIL_BYTES <= len(kept) <= OUTPUT_LIMIT_BYTES
    left_out = 3 * len(chunk) + len(b"the last line\n") - len(kept)
    assert head == f"[... {left_out} bytes of this trial's output left out: only its last part is kept ...]"
    assert progress.take_output("t1") == "" and progress.phases() == {}  # taken: forgotten


def test_phase_outside_a_sweep_does_nothing():
    trial_progress.phase("compiling")  # no actor: no error, nothing sent
    with trial_progress.trial_progress(None):
        trial_progress.phase("window 1 of 2")
