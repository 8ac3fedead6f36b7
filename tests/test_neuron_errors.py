"""A Neuron compile failure reaches the failed trial's record in the compiler's words.

The log lines are shaped like those quoted in aws-neuron-sdk issues #690 and #601; no
compiler runs here (there is no Neuron SDK or hardware on our machines)."""

import os
import time

import pytest

from accelsweep.trainables.config import TrialConfig
from accelsweep.trainables.platforms import neuron_errors
from accelsweep.trainables.platforms.neuron_errors import NeuronCompileError, compiler_message, explain

COMPILER_LOG = """\
2026-11-20T10:00:00Z INFO 4242 [neuronx-cc]: Compilation started
2026-11-20T10:00:05Z ERROR 4242 [neuronx-cc]: ***************************************************************
2026-11-20T10:00:05Z ERROR 4242 [neuronx-cc]:  An Internal Compiler Error has occurred
2026-11-20T10:00:05Z ERROR 4242 [neuronx-cc]: ***************************************************************
2026-11-20T10:00:05Z ERROR 4242 [neuronx-cc]: [NCC_EVRF009] Estimated peak HBM usage (34.2 GB) exceeds 16 GB. Reduce batch size.
2026-11-20T10:00:05Z ERROR 4242 [neuronx-cc]: Traceback (most recent call last):
2026-11-20T10:00:05Z ERROR 4242 [neuronx-cc]:   File "neuronxcc/driver/Pipeline.py", line 30, in runSingleInput
2026-11-20T10:00:05Z ERROR 4242 [neuronx-cc]: Version information:
2026-11-20T10:00:05Z ERROR 4242 [neuronx-cc]:   NeuronX Compiler version 2.21.0.0+abc
"""
TORCH_XLA_ERROR = "INTERNAL: From /job:localservice/replica:0/task:0:\n  (0) INTERNAL: neuronx-cc compilation failed."


def test_the_compiler_log_is_reduced_to_its_reasons():
    assert compiler_message(COMPILER_LOG) == [
        "[NCC_EVRF009] Estimated peak HBM usage (34.2 GB) exceeds 16 GB. Reduce batch size.",
        "An Internal Compiler Error has occurred",
    ]


def write_log(root, age_s=0.0):
    workdir = root / "9f1c-uuid"
    workdir.mkdir(parents=True)
    log = workdir / "log-neuron-cc.txt"
    log.write_text(COMPILER_LOG)
    stamp = time.time() - age_s
    os.utime(log, (stamp, stamp))
    return log


def test_a_compile_failure_is_explained_from_the_trials_own_log(tmp_path):
    since = time.time() - 1
    write_log(tmp_path)
    explained = explain(RuntimeError(TORCH_XLA_ERROR), "--target=trn1 --optlevel=3", [str(tmp_path)], since)
    assert isinstance(explained, NeuronCompileError)
    message = str(explained)
    assert message.startswith("neuronx-cc failed (NEURON_CC_FLAGS='--target=trn1 --optlevel=3'): [NCC_EVRF009]")
    assert "\n" not in message  # one line: what the failed run's error tag shows


def test_an_older_log_is_not_blamed_and_other_errors_are_left_alone(tmp_path):
    write_log(tmp_path, age_s=3600)  # another trial's compile, an hour ago
    explained = explain(RuntimeError(TORCH_XLA_ERROR), "", [str(tmp_path)], since=time.time() - 1)
    assert str(explained).endswith("(0) INTERNAL: neuronx-cc compilation failed.")
    assert explain(MemoryError("out of host memory"), "", [str(tmp_path)], since=0) is None


def test_run_training_raises_the_compilers_words(tmp_path, monkeypatch):
    import accelsweep.trainables.loop.train_loop as train_loop

    monkeypatch.setattr(neuron_errors, "compile_log_roots", lambda cache_url: [str(tmp_path)])

    def compile_fails(config, *loop_arguments):
        write_log(tmp_path)  # the trial's compile writes its log, then torch-xla raises
        raise RuntimeError(TORCH_XLA_ERROR)

    monkeypatch.setattr(train_loop, "_run_training", compile_fails)
    with pytest.raises(NeuronCompileError, match=r"NCC_EVRF009\] Estimated peak HBM usage") as raised:
        train_loop.run_training(TrialConfig.make(platform="neuron", model="vit-b16", neuron_optlevel=3))
    assert "--optlevel=3" in str(raised.value)
    assert isinstance(raised.value.__cause__, RuntimeError)  # the original stays attached
