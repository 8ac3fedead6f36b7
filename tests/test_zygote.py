"""The commands tests start from the session's zygote (tests/zygote.py) behave as python
started them would: argv, __main__, sys.path[0], folder, environment, output, exit status,
signals, sessions; and the commands it must not run are plain subprocesses."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests import zygote

SCRIPT = r"""
import json, os, sys, time
print(json.dumps({"argv": sys.argv, "name": __name__, "path0": sys.path[0], "cwd": os.getcwd(),
                  "x": os.environ.get("ZYGOTE_X"), "pid": os.getpid(), "sid": os.getsid(0),
                  "preloaded": "ray.tune" in sys.modules}), flush=True)
action = sys.argv[1] if len(sys.argv) > 1 else ""
if action == "ray":
    from ray._private import ray_constants
    print(ray_constants.ENABLE_RAY_CLUSTER)
if action == "auth":
    from ray._raylet import get_authentication_mode
    print(int(get_authentication_mode()))
if action == "sleep":
    time.sleep(60)
if action == "raise":
    raise ValueError("boom")
if action == "message":
    sys.exit("a message")
sys.stderr.write("to stderr\n")
sys.exit(3)
"""


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "probe.py"
    path.write_text(SCRIPT)
    return path


def _seen(done) -> dict:
    import json

    return json.loads(done.stdout.splitlines()[0])


def test_a_routed_script_runs_as_python_runs_it(script, tmp_path):
    done = subprocess.run([sys.executable, str(script), "plain"], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, "ZYGOTE_X": "given"}, timeout=120)
    seen = _seen(done)
    assert seen["preloaded"], f"not forked from the zygote: {zygote.Zygote.why_plain}"
    assert seen["argv"] == [str(script), "plain"] and seen["name"] == "__main__"
    assert seen["path0"] == str(tmp_path) and seen["cwd"] == str(tmp_path) and seen["x"] == "given"
    assert done.returncode == 3 and done.stderr == "to stderr\n"
    assert "ZYGOTE_X" not in open(f"/proc/{os.getpid()}/environ").read()  # only the child's


def test_an_error_and_an_exit_message_end_as_pythons_do(script):
    raised = subprocess.run([sys.executable, str(script), "raise"], capture_output=True, text=True, timeout=120)
    assert raised.returncode == 1 and raised.stderr.startswith("Traceback (most recent call last):\n  File "
                                                                f'"{script}"')
    assert raised.stderr.rstrip().endswith("ValueError: boom") and "zygote" not in raised.stderr
    message = subprocess.run([sys.executable, str(script), "message"], capture_output=True, text=True, timeout=120)
    assert message.returncode == 1 and message.stderr == "a message\n"


@pytest.mark.parametrize("signum, status", [(signal.SIGINT, -signal.SIGINT), (signal.SIGTERM, -signal.SIGTERM)])
def test_a_signal_reaches_the_command_in_its_own_session(script, signum, status):
    child = subprocess.Popen([sys.executable, str(script), "sleep"], stdout=subprocess.PIPE, text=True,
                             start_new_session=True)
    seen = __import__("json").loads(child.stdout.readline())
    assert seen["pid"] == child.pid and seen["sid"] == child.pid
    assert seen["preloaded"], f"not forked from the zygote: {zygote.Zygote.why_plain}"
    assert child.poll() is None
    os.kill(child.pid, signum)
    assert child.wait(timeout=30) == status
    child.stdout.close()


def test_a_timeout_kills_the_command(script):
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        subprocess.run([sys.executable, str(script), "sleep"], capture_output=True, timeout=3)
    assert time.monotonic() - started < 30


def test_a_client_gone_mid_request_leaves_the_zygote_serving(script, tmp_path):
    """A raylet kills a worker it is still starting when the worker's job ends: its client
    goes before its request is whole, or before it reads the fork's pid. The zygote drops
    that request and forks the next command (it used to end, and every later one ran plainly)."""
    import socket

    first = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert _seen(first)["preloaded"], zygote.Zygote.why_plain
    served = zygote.Zygote.get()
    body = b'{"argv": ["%s"], "env": {}, "cwd": "/", "new_session": true, "process_group": null}' % str(
        script).encode()
    for request in (b"00", f"{len(body):0{zygote.HEADER_BYTES}d}".encode() + body[:10],
                    f"{len(body):0{zygote.HEADER_BYTES}d}".encode() + body):
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        client.connect(served.socket_path)
        client.sendall(request)
        client.close()  # gone: before the rest of its request, or before the pid of its fork
    after = subprocess.run([sys.executable, str(script), "plain"], cwd=tmp_path, capture_output=True, text=True,
                           timeout=120)
    assert zygote.Zygote.get() is served and served.process.poll() is None
    assert _seen(after)["preloaded"] and after.returncode == 3, zygote.Zygote.why_plain


def test_a_child_and_its_client_ending_together_leave_the_zygote_serving(tmp_path):
    """A child's end and its client's seen in one wake of the zygote (a worker that exits as
    its raylet-side client goes): each handled once. Acting on the second ended the zygote,
    and every later worker of its instance started plainly (seen in a full run)."""
    import socket

    served = zygote.Zygote.get()
    brief = tmp_path / "brief.py"
    brief.write_text("import time\ntime.sleep(1)\n")
    devnull = os.open(os.devnull, os.O_RDWR)
    body = json.dumps({"argv": [str(brief)], "env": dict(os.environ), "cwd": str(tmp_path), "new_session": False,
                       "process_group": 0, "end_with_client": True}).encode()
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.connect(served.socket_path)
    socket.send_fds(client, [f"{len(body):0{zygote.HEADER_BYTES}d}".encode()], [devnull] * 3)
    client.sendall(body)
    assert int(client.makefile("rb").readline())  # forked
    os.close(devnull)
    # The zygote held in another client's unfinished request while the child ends and its client goes.
    holder = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    holder.connect(served.socket_path)
    holder.sendall(b"0000")
    time.sleep(2.5)
    client.close()
    time.sleep(0.5)
    holder.close()  # now both ends are there at once
    time.sleep(1.5)
    assert served.process.poll() is None, open(served.log_path).read()[-2000:]


def test_what_the_zygote_must_not_run_starts_plainly(script, monkeypatch):
    """-c and interpreter flags, other programs, and a variable the preloaded libraries read
    when imported that differs from the zygote's."""
    assert zygote.routed_argv([sys.executable, "-c", "pass"], None, False) is None
    assert zygote.routed_argv([sys.executable, "-W", "error", str(script)], None, False) is None
    assert zygote.routed_argv([sys.executable, "-m", "mlflow", "server"], None, False) is None
    assert zygote.routed_argv(["bash", str(script)], None, False) is None
    assert zygote.routed_argv([sys.executable, "-m", "accelsweep.sweeps.neuron_vit", "--smoke"], None, False) == [
        "-m", "accelsweep.sweeps.neuron_vit", "--smoke"]
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "RAY_DEDUP_LOGS": "0"})
    assert not _seen(done)["preloaded"] and done.returncode == 3



def test_a_command_naming_its_cluster_in_ray_address_is_forked(script):
    """RAY_ADDRESS is read by ray.init, not when Ray is imported: a `RAY_*` variable that
    does not send the command to a plain subprocess (a test's sweep joining its cluster)."""
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "RAY_ADDRESS": "127.0.0.1:6390"})
    assert _seen(done)["preloaded"] and done.returncode == 3, zygote.Zygote.why_plain

@pytest.mark.real_process
def test_a_test_marked_real_process_gets_plain_subprocesses(script):
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert not _seen(done)["preloaded"] and done.returncode == 3


@pytest.mark.slow  # 5 s or more in the quick lane
def test_a_zygote_started_inside_a_test_that_changed_the_environment_serves_the_tests_after_it(script, monkeypatch,
                                                                                               tmp_path):
    """The zygote takes the session's import-time variables, not those of the test that
    happens to start it: that test's commands are plain, the later tests' are forked."""
    zygote.Zygote.stop()
    monkeypatch.setenv("HOME", str(tmp_path))  # as a test of ~/.ray or ~/.cache does
    inside = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert not _seen(inside)["preloaded"] and "['HOME']" in zygote.Zygote.why_plain
    monkeypatch.undo()
    after = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert _seen(after)["preloaded"], zygote.Zygote.why_plain


def test_rays_loopback_switch_is_read_again_in_the_child_from_its_own_environment(script):
    """A test process that joined a loopback cluster has RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0
    (ray_adapter.keep_loopback); a command given it sees what Ray's import would compute."""
    for given, expected in (("0", "False"), (None, "True")):
        env = {k: v for k, v in os.environ.items() if k != "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"}
        env.update({"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": given} if given else {})
        done = subprocess.run([sys.executable, str(script), "ray"], capture_output=True, text=True, timeout=120,
                              env=env)
        assert _seen(done)["preloaded"], zygote.Zygote.why_plain
        assert done.stdout.splitlines()[1] == expected


def test_rays_authentication_mode_is_read_again_in_the_child_from_its_own_environment(script):
    """The session runs with RAY_AUTH_MODE=disabled; a command run as a user runs it (the
    main job: no RAY_AUTH_MODE) or with token auth gets Ray's config as its import computes it."""
    from ray._raylet import AuthenticationMode

    for given, expected in (("token", AuthenticationMode.TOKEN), ("disabled", AuthenticationMode.DISABLED)):
        env = {**{k: v for k, v in os.environ.items() if k != "RAY_AUTH_MODE"}, "RAY_AUTH_MODE": given}
        done = subprocess.run([sys.executable, str(script), "auth"], capture_output=True, text=True, timeout=120,
                              env=env)
        assert _seen(done)["preloaded"], zygote.Zygote.why_plain
        assert done.stdout.splitlines()[1] == str(int(expected)), given
    assert os.environ["RAY_AUTH_MODE"] == "disabled"  # and the next command's is the session's again
    done = subprocess.run([sys.executable, str(script), "auth"], capture_output=True, text=True, timeout=120)
    assert done.stdout.splitlines()[1] == str(int(AuthenticationMode.DISABLED))
