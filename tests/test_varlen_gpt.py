"""sweeps/varlen_gpt.py and its workload (seed 003, variable-length sequences): what its knobs change.
Packed batches carry no pads and the same real tokens as padded ones; the document mask
keeps documents apart (a packed document's output is that document's run alone); the
loop batches with the workload's collate and counts real tokens; layouts a platform
cannot train are refused with the reason; and the study runs as a smoke sweep."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from accelsweep.sweeps import varlen_gpt as study
from accelsweep.trainables.workloads import varlen_gpt as gpt
from accelsweep.trainables.config import TrialConfig
from accelsweep.trainables.errors import ConfigError
from accelsweep.trainables.loop.train_loop import run_training
from accelsweep.trainables.workloads.base import Workload, import_path
from tests.test_examples import run_smoke
from tests.test_platform_knowledge import assert_study_imports

SCRIPT = Path(study.__file__)
WORKLOAD = import_path(gpt.VarlenGPT)
LAYOUTS = ("pad-max", "pad-longest", "packed-dense", "packed-loop")


def batch_of(documents: int = 6, max_len: int = 32, lengths: str = "uniform", seed: int = 1) -> list:
    dataset = gpt.Documents(64, max_len, lengths, seed)
    return [dataset[i] for i in range(documents)]


def test_the_script_composes_the_public_api_its_platform_and_its_workload():
    assert_study_imports(SCRIPT, gpt.__name__)


def test_the_docstring_opens_with_the_seeds_table():
    assert "The seed's table" in study.__doc__ and "H100" in study.__doc__
    for row, figures in {"pad-max": "132    130      342    299", "pad-longest": "129    116      337    294",
                         "packed-flash-attn": "51     -        160    -"}.items():
        assert f"batching={row}" in study.__doc__ and figures in study.__doc__


@pytest.mark.parametrize("lengths", gpt.LENGTHS)
def test_documents_are_seeded_and_within_max_len(lengths):
    first, again = gpt.Documents(200, 64, lengths, seed=3), gpt.Documents(200, 64, lengths, seed=3)
    assert torch.equal(first.lengths, again.lengths) and torch.equal(first.tokens, again.tokens)
    assert not torch.equal(first.lengths, gpt.Documents(200, 64, lengths, seed=4).lengths)
    assert int(first.lengths.min()) >= 1 and int(first.lengths.max()) <= 64
    tokens, targets = first[5]
    assert len(tokens) == len(targets) == int(first.lengths[5]) and torch.equal(tokens[1:], targets[:-1])
    assert int(first.tokens.min()) >= 1  # 0 is the pad token


def test_packed_batches_carry_no_pads_and_the_same_real_tokens_as_padded_ones():
    items = batch_of()
    lengths = [len(x) for x, _ in items]
    real = {}
    for layout in LAYOUTS:
        inputs, targets = gpt.collate(items, layout, max_len=32)
        tokens = inputs["tokens"]
        real_slots = targets != gpt.IGNORE
        # The real tokens, document by document, in order: the same in every layout.
        real[layout] = (tokens[real_slots], targets[real_slots])
        assert int(real_slots.sum()) == sum(lengths)
        if layout.startswith("packed"):
            assert tokens.shape == targets.shape == (1, sum(lengths))
            assert bool(real_slots.all()) and bool((tokens != gpt.PAD_TOKEN).all())  # no pads at all
            assert inputs["cu_seqlens"].tolist() == [0, *torch.tensor(lengths).cumsum(0).tolist()]
            assert inputs["cu_seqlens"].dtype == torch.int32
            assert inputs["documents"][0].tolist() == [d for d, n in enumerate(lengths) for _ in range(n)]
            assert inputs["positions"][0].tolist() == [p for n in lengths for p in range(n)]
        else:
            width = 32 if layout == "pad-max" else max(lengths)
            assert tokens.shape == targets.shape == (len(items), width)
            assert bool((tokens[~real_slots] == gpt.PAD_TOKEN).all())
            assert not bool(real_slots.all())  # these lengths leave pads in both padded layouts
    for layout in LAYOUTS[1:]:
        assert all(torch.equal(a, b) for a, b in zip(real[layout], real["pad-max"])), layout
    # The workload's counts: real tokens the same, token slots (hence padding) not.
    workload = gpt.VarlenGPT()
    counts = {layout: workload.count(*gpt.collate(items, layout, max_len=32)) for layout in LAYOUTS}
    assert {c["real_tokens"] for c in counts.values()} == {sum(lengths)}
    padding = {layout: workload.figures(c)["padding_fraction"] for layout, c in counts.items()}
    assert padding["packed-dense"] == padding["packed-loop"] == 0
    assert padding["pad-max"] > padding["pad-longest"] > 0
    assert padding["pad-max"] == pytest.approx(1 - sum(lengths) / (32 * len(items)))


def model_with(attention: gpt.Attention, max_len: int = 32) -> gpt.Decoder:
    torch.manual_seed(0)
    return gpt.Decoder("gpt-micro", max_len, attention).eval()


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("layout", ["pad-max", "pad-longest", "packed-dense", "packed-loop", "packed-flex"])
def test_a_documents_output_is_that_document_run_alone(layout):
    """The document mask (and, padded, the causal mask over right padding) keeps every
    token from attending outside its document. FlexAttention's forward runs on a CPU
    (its backward does not), eager: its mask, not its kernel, is what is checked."""
    items = batch_of()
    attention = gpt.FlexDocumentMask(compiled=False) if layout == "packed-flex" else \
        gpt.BATCHINGS[layout].attention()
    model, alone = model_with(attention), model_with(gpt.CausalSDPA())
    inputs, targets = gpt.collate(items, layout, max_len=32)
    with torch.no_grad():
        outputs = model(inputs)
        real = outputs[targets != gpt.IGNORE]  # (real tokens, vocab), documents in order
        expected = torch.cat([alone({"tokens": tokens[None]})[0] for tokens, _ in items])
    torch.testing.assert_close(real, expected, atol=1e-5, rtol=1e-4)


def test_without_the_document_mask_the_check_fails():
    """The test above can fail: causal attention over the packed row, no document mask,
    lets later documents attend to earlier ones."""
    items = batch_of()
    model, alone = model_with(gpt.CausalSDPA()), model_with(gpt.CausalSDPA())
    inputs, _ = gpt.collate(items, "packed-dense", max_len=32)
    with torch.no_grad():
        leaky = model(inputs)[0]
        expected = torch.cat([alone({"tokens": tokens[None]})[0] for tokens, _ in items])
    first = len(items[0][0])
    torch.testing.assert_close(leaky[:first], expected[:first], atol=1e-5, rtol=1e-4)  # the first has no past
    assert not torch.allclose(leaky[first:], expected[first:], atol=1e-3)


def test_the_packed_layouts_train_to_the_same_gradients():
    """Packed (dense mask, per-document loop) and padded batches of the same documents
    give the same loss and gradients: the same real tokens, nothing more."""
    items = batch_of()
    grads = {}
    for layout in LAYOUTS:
        model = model_with(gpt.BATCHINGS[layout].attention()).train()
        inputs, targets = gpt.collate(items, layout, max_len=32)
        loss = gpt.VarlenGPT().loss(model(inputs), targets)
        loss.backward()
        grads[layout] = (loss.detach(), [p.grad for p in model.parameters()])
    for layout in LAYOUTS[1:]:
        torch.testing.assert_close(grads[layout][0], grads["pad-max"][0])
        for got, want in zip(grads[layout][1], grads["pad-max"][1]):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


def smoke_config(layout: str, **changes) -> TrialConfig:
    return study.base_config("cpu", smoke=True, lengths="uniform", seed=0).replace(
        batching=layout, window_min_s=0.0, window_min_steps=3, windows=1, **changes)


@pytest.mark.slow
def test_the_loop_batches_with_the_workloads_collate_and_counts_real_tokens():
    """Without the collate hook the loader could not stack documents of unequal length.
    With a fixed step count every layout trains on the same documents: the same real
    tokens per document (tokens/s over samples/s), and padding only where it pads."""
    assert Workload.collate_fn(None, smoke_config("pad-max")) is None  # the default: torch's collate
    results = {layout: run_training(smoke_config(layout)) for layout in ("pad-max", "packed-loop")}
    per_document = {layout: r["throughput_tokens_per_s"] / r["throughput_samples_per_s"]
                    for layout, r in results.items()}
    assert per_document["pad-max"] == pytest.approx(per_document["packed-loop"])
    assert 1 <= per_document["pad-max"] < 64
    assert results["packed-loop"]["padding_fraction"] == 0
    assert 0.2 < results["pad-max"]["padding_fraction"] < 0.8  # uniform lengths: about half pads
    assert results["pad-max"]["unit"] == "tokens"


def test_layouts_a_platform_cannot_train_are_refused_with_the_reason():
    with pytest.raises(ConfigError, match="batching must be one of pad-max.*backward on a CPU"):
        smoke_config("packed-flex")
    with pytest.raises(ConfigError, match="refuses is_causal"):
        smoke_config("packed-nested")
    cuda = dict(platform="cuda", workload=WORKLOAD, cpus_per_worker=1)
    with pytest.raises(ConfigError, match="precision must be bf16-autocast or bf16"):
        TrialConfig.make(**cuda, batching="packed-varlen", precision="fp32")
    TrialConfig.make(**cuda, batching="packed-varlen", precision="bf16-autocast")
    TrialConfig.make(**cuda, batching="packed-flex", precision="fp32")
    with pytest.raises(ConfigError, match="platform must be cpu or cuda for this workload"):
        TrialConfig.make(platform="xla", workload=WORKLOAD)


def test_each_platforms_space_says_what_it_leaves_out(monkeypatch):
    rows, left_out = gpt.space_for("cpu")
    assert rows == list(LAYOUTS)
    assert len(left_out) == 4 and all(": " in line for line in left_out)
    monkeypatch.setattr(gpt, "_has_module", lambda name: name != "flash_attn")
    rows, left_out = gpt.space_for("cuda")
    assert rows == [r for r in gpt.BATCHINGS if r != "packed-flash-attn"]
    assert left_out == ["packed-flash-attn: flash_attn is not installed here (pip install flash-attn)"]


@pytest.mark.slow
@pytest.mark.parametrize("platform", ["cpu", "cuda"])
def test_dry_run_shows_the_space(platform):
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "MLFLOW_DISABLE_TELEMETRY": "true"}
    run = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--platform", platform],
                         env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "batching: one of 'pad-max', 'pad-longest', 'packed-dense', 'packed-loop'" in run.stdout
    assert ("torch_compile: one of 'none', 'inductor'" in run.stdout) == (platform == "cuda")
    assert "left out packed-flex" in run.stdout if platform == "cpu" else "packed-flex'" in run.stdout


@pytest.mark.slow
def test_xla_and_neuron_say_why_not():
    run = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--platform", "neuron"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "compile a graph per input shape" in run.stderr


@pytest.mark.slow
def test_the_smoke_sweep_runs_and_logs_to_mlflow(tmp_path, shared_ray):
    from mlflow.tracking import MlflowClient

    run, uri = run_smoke(SCRIPT, tmp_path, *shared_ray.flags)
    client = MlflowClient(uri)
    [experiment] = [e for e in client.search_experiments() if e.name == "varlen_gpt"]
    runs = client.search_runs([experiment.experiment_id])
    [parent] = [r for r in runs if r.data.tags.get("kind") == "sweep"]
    trials = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert parent.info.status == "FINISHED"
    assert sorted(t.data.params["batching"] for t in trials) == sorted(LAYOUTS)
    for trial in trials:
        assert trial.info.status == "FINISHED", trial.data.tags.get("error")
        assert trial.data.metrics["throughput_tokens_per_s"] > 0
        packed = trial.data.params["batching"].startswith("packed")
        assert (trial.data.metrics["padding_fraction"] == 0) == packed
