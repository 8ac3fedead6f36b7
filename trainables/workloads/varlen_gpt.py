"""Seed 003's variable-length workload: a GPT-style decoder (the seed's MyDecoder) trained on
random-token documents of random length, batched padded or packed (knob ``batching``), its
throughput in real (non-pad) tokens per second and its ``padding_fraction``.

Each batching has its attention (``BATCHINGS``): padded rows run causal SDPA; packed rows
hold one sequence of all documents (positions restart at each) and keep attention inside
each document with a dense mask, a per-document loop, FlexAttention's BlockMask, a jagged
NestedTensor, PyTorch's varlen_attn or flash-attn's varlen kernel. A batch holds
batch_size documents in every layout, and the loader is not shuffled, so batch k holds the
same real tokens whichever the layout. sweeps/varlen_gpt.py is its study.
"""

from __future__ import annotations

import abc
import functools
import importlib.util
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, NamedTuple, Optional

import torch
import torch.nn.functional as F
from torch import nn

from accelsweep.trainables.errors import ConfigError, positive_int
from accelsweep.trainables.metrics import Metric
from accelsweep.trainables.workloads.base import Workload, WorkloadKnobs, knob

if TYPE_CHECKING:
    from accelsweep.trainables.config import TrialConfig

PAD_TOKEN = 0  # the seed's PAD_ID; documents' tokens are 1..VOCAB-1
IGNORE = -100  # the targets of pad slots: F.cross_entropy's ignore_index
VOCAB = 1024  # the seed's NUM_TOKENS
LENGTHS = ("uniform", "lognormal")
PRESETS = {  # (width, heads, layers)
    "gpt-micro": (64, 2, 1),  # smoke runs
    "gpt-small": (128, 4, 2),  # a 2-core CPU's
    "gpt-seed": (1024, 16, 24),  # the seed's
}
# Where it trains. XLA and Neuron are not: NOT_XLA says why.
TRAINS_ON = ("cpu", "cuda")
NOT_XLA = ("XLA and Neuron compile a graph per input shape: padding to the batch's longest and "
           "packing give a new shape nearly every batch (a recompile each), and their attention "
           "kernels here are CUDA's; only pad-max has one shape, and one row is no study")


# --- data: documents of random length, batched padded or packed ---------------------

def document_lengths(count: int, max_len: int, distribution: str, generator: torch.Generator) -> torch.Tensor:
    if distribution == "uniform":  # the seed's: torch.randint(1, MAX_SEQ_LEN)
        return torch.randint(1, max_len, (count,), generator=generator)
    normal = torch.randn(count, generator=generator, dtype=torch.float64)
    return (math.log(max_len / 8) + normal).exp().round().clamp(1, max_len).long()


class Documents(torch.utils.data.Dataset):
    """Random-token documents, seeded; item i is document i as (tokens, next tokens)."""

    def __init__(self, count: int, max_len: int, distribution: str, seed: int):
        generator = torch.Generator().manual_seed(seed)
        self.lengths = document_lengths(count, max_len, distribution, generator)
        self.starts = F.pad((self.lengths + 1).cumsum(0), (1, 0)).tolist()
        self.tokens = torch.randint(1, VOCAB, (self.starts[-1],), generator=generator)

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        document = self.tokens[self.starts[index]:self.starts[index + 1]]
        return document[:-1], document[1:]


def padded(sequences: list[torch.Tensor], width: int, value: int) -> torch.Tensor:
    batch = torch.full((len(sequences), width), value, dtype=sequences[0].dtype)
    for row, sequence in zip(batch, sequences):
        row[:len(sequence)] = sequence
    return batch


def collate(items: list, batching: str, max_len: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """A batch of documents as the layout wants it. Padded: tokens (B, width), pads in the
    inputs are PAD_TOKEN and in the targets IGNORE. Packed: one row of all documents'
    tokens (1, N), with each token's position in its document, its document's index, and
    the documents' cumulative lengths (cu_seqlens, B + 1, int32 as flash-attention wants)."""
    inputs, targets = [x for x, _ in items], [y for _, y in items]
    if batching.startswith("packed"):
        lengths = torch.tensor([len(x) for x in inputs])
        return ({"tokens": torch.cat(inputs)[None],
                 "positions": torch.cat([torch.arange(n) for n in lengths.tolist()])[None],
                 "documents": torch.repeat_interleave(torch.arange(len(inputs)), lengths)[None],
                 "cu_seqlens": F.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)},
                torch.cat(targets)[None])
    width = max_len if batching == "pad-max" else max(len(x) for x in inputs)
    return {"tokens": padded(inputs, width, PAD_TOKEN)}, padded(targets, width, IGNORE)


# --- attention: q, k, v of (batch, tokens, heads, head_dim); packed: batch 1 ---------

def _heads_first(*tensors: torch.Tensor) -> list[torch.Tensor]:
    return [t.transpose(1, 2) for t in tensors]


class Attention(abc.ABC):
    """One layout's attention: ``prepare`` once per forward (masks, lengths), then
    ``__call__`` in every layer."""

    def prepare(self, inputs: dict[str, torch.Tensor], max_len: int) -> Any:
        return None

    @abc.abstractmethod
    def __call__(self, q, k, v, context) -> torch.Tensor:
        """The attention output, (batch, tokens, heads, head_dim)."""


class CausalSDPA(Attention):
    def __call__(self, q, k, v, context):
        return F.scaled_dot_product_attention(*_heads_first(q, k, v), is_causal=True).transpose(1, 2)


class DenseDocumentMask(Attention):
    def prepare(self, inputs, max_len):
        documents = inputs["documents"][0]
        causal = torch.ones(len(documents), len(documents), dtype=torch.bool, device=documents.device).tril()
        return (documents[:, None] == documents[None, :]) & causal

    def __call__(self, q, k, v, mask):
        return F.scaled_dot_product_attention(*_heads_first(q, k, v), attn_mask=mask).transpose(1, 2)


class PerDocument(Attention):
    def __init__(self):
        # The documents' lengths as Python ints (a host read) and a loop: not for
        # torch.compile to trace (a compiled model runs this part eagerly). Wrapped here,
        # not at the class: torch.compiler.disable imports torch's compiler (seconds),
        # which importing this module (every test process collects it) need not pay.
        self.attend = torch.compiler.disable(self.attend_eagerly)

    def prepare(self, inputs, max_len):
        return inputs["cu_seqlens"]

    def __call__(self, q, k, v, cu_seqlens):
        return self.attend(q, k, v, cu_seqlens)

    def attend_eagerly(self, q, k, v, cu_seqlens):
        lengths = cu_seqlens.diff().tolist()
        parts = zip(*(t.split(lengths, dim=1) for t in (q, k, v)))
        return torch.cat([CausalSDPA()(*part, None) for part in parts], dim=1)


class FlexDocumentMask(Attention):
    def __init__(self, compiled: bool = True):
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        self.create_block_mask = create_block_mask
        # Compiled is the kernel; eager FlexAttention is its unfused reference (tests).
        self.flex_attention = torch.compile(flex_attention) if compiled else flex_attention

    def prepare(self, inputs, max_len):
        documents = inputs["documents"][0]

        def causal_document(batch, head, q_index, kv_index):
            return (documents[q_index] == documents[kv_index]) & (q_index >= kv_index)

        return self.create_block_mask(causal_document, None, None, len(documents), len(documents),
                                      device=documents.device)

    def __call__(self, q, k, v, block_mask):
        return self.flex_attention(*_heads_first(q, k, v), block_mask=block_mask).transpose(1, 2)


class NestedSDPA(Attention):
    def prepare(self, inputs, max_len):
        return inputs["cu_seqlens"].long()

    def __call__(self, q, k, v, offsets):
        # (N, H, D) values -> jagged (B, j, H, D) -> (B, H, j, D) for SDPA, and back.
        jagged = [torch.nested.nested_tensor_from_jagged(t[0].contiguous(), offsets).transpose(1, 2)
                  for t in (q, k, v)]
        return F.scaled_dot_product_attention(*jagged, is_causal=True).transpose(1, 2).values()[None]


class TorchVarlen(Attention):
    def __init__(self):
        from torch.nn.attention.varlen import varlen_attn

        self.varlen_attn = varlen_attn

    def prepare(self, inputs, max_len):
        # max_len bounds every document: no host read of the batch's longest.
        return inputs["cu_seqlens"], max_len

    def __call__(self, q, k, v, context):
        cu_seqlens, max_len = context
        return self.varlen_attn(q[0], k[0], v[0], cu_seqlens, cu_seqlens, max_len, max_len,
                                window_size=(-1, 0))[None]  # (-1, 0): causal


class FlashAttnVarlen(Attention):
    def __init__(self):
        try:
            from flash_attn import flash_attn_varlen_func
        except ImportError as error:
            raise ImportError(f"batching packed-flash-attn needs flash-attn (pip install flash-attn): {error}") \
                from error
        self.flash = torch.compiler.disable(flash_attn_varlen_func)  # not traceable (the seed: 2.7.0)

    def prepare(self, inputs, max_len):
        return inputs["cu_seqlens"], max_len

    def __call__(self, q, k, v, context):
        cu_seqlens, max_len = context
        return self.flash(q[0], k[0], v[0], cu_seqlens, cu_seqlens, max_len, max_len, causal=True)[None]


class Batching(NamedTuple):
    attention: Callable[[], Attention]
    # Why it cannot train on a platform (absent: it can).
    not_on: dict[str, str]
    # A module it needs, and where it comes from: looked up in the driver for the space
    # (a trial imports it, and says so if it cannot).
    needs: Optional[tuple[str, str]] = None
    half_precision_only: bool = False


BATCHINGS = {
    "pad-max": Batching(CausalSDPA, {}),
    "pad-longest": Batching(CausalSDPA, {}),
    "packed-dense": Batching(DenseDocumentMask, {}),
    "packed-loop": Batching(PerDocument, {}),
    "packed-flex": Batching(FlexDocumentMask, {"cpu": "FlexAttention has no backward on a CPU in torch 2.14 "
                                                      "('FlexAttention does not support backward on CPU')"}),
    "packed-nested": Batching(NestedSDPA, {"cpu": "NestedTensor SDPA's CPU path (math) refuses is_causal=True "
                                                  "in torch 2.14, and a decoder is causal"}),
    "packed-varlen": Batching(TorchVarlen, {"cpu": "varlen_attn is flash attention: CUDA only"},
                              needs=("torch.nn.attention.varlen", f"not in torch {torch.__version__}"),
                              half_precision_only=True),
    "packed-flash-attn": Batching(FlashAttnVarlen, {"cpu": "flash-attn is CUDA only"},
                                  needs=("flash_attn", "not installed here (pip install flash-attn)"),
                                  half_precision_only=True),
}


# --- the model: the seed's MyDecoder, its blocks' attention from the layout ----------

class Block(nn.Module):
    """The seed's MyAttentionBlock: pre-norm, one qkv projection, GELU MLP."""

    def __init__(self, width: int, heads: int, attention: Attention):
        super().__init__()
        self.heads, self.attention = heads, attention
        self.norm1, self.norm2 = nn.LayerNorm(width, bias=False), nn.LayerNorm(width, bias=False)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.fc1, self.fc2 = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor, context: Any) -> torch.Tensor:
        batch, tokens, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(batch, tokens, 3, self.heads, -1).unbind(2)
        x = x + self.proj(self.attention(q, k, v, context).reshape(batch, tokens, width))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class Decoder(nn.Module):
    def __init__(self, preset: str, max_len: int, attention: Attention):
        super().__init__()
        width, heads, layers = PRESETS[preset]
        self.attention, self.max_len = attention, max_len
        self.embedding = nn.Embedding(VOCAB, width, padding_idx=PAD_TOKEN)
        self.positional_embedding = nn.Embedding(max_len, width)
        self.blocks = nn.ModuleList(Block(width, heads, attention) for _ in range(layers))
        self.output = nn.Linear(width, VOCAB)

    def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        tokens = inputs["tokens"]
        positions = inputs.get("positions")
        if positions is None:
            positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.embedding(tokens) + self.positional_embedding(positions)
        context = self.attention.prepare(inputs, self.max_len)
        for block in self.blocks:
            x = block(x, context)
        return self.output(x)


class VarlenGPT(Workload):
    """The decoder on random documents; throughput in real tokens (pads not counted)."""

    unit = "tokens"
    metrics = (Metric("padding_fraction", "", "min", label="padding fraction", fmt="{:.1%}"),)

    @dataclass(frozen=True)
    class Knobs(WorkloadKnobs):
        batching: str = knob("pad-max", choices=BATCHINGS)
        model: str = knob("gpt-small", choices=PRESETS)
        max_len: int = knob(256, check=lambda name, value: positive_int(name, value, minimum=2))
        lengths: str = knob("uniform", choices=LENGTHS)
        documents: int = knob(2048, check=positive_int)  # per worker; epochs repeat them

    def validate(self, config: TrialConfig) -> None:
        knobs = config.workload_knobs
        batching = BATCHINGS[knobs.batching]
        if config.platform not in TRAINS_ON:
            raise ConfigError("platform", f"{' or '.join(TRAINS_ON)} for this workload", config.platform,
                              NOT_XLA + ".")
        if config.platform in batching.not_on:
            raise ConfigError("batching", f"one of {', '.join(runnable_on(config.platform))} on platform "
                                          f"{config.platform}", knobs.batching, batching.not_on[config.platform])
        if batching.half_precision_only and config.precision == "fp32":
            raise ConfigError("precision", "bf16-autocast or bf16 (flash attention has no fp32)", config.precision,
                              f"batching {knobs.batching} needs it.")
        width, heads, _ = PRESETS[knobs.model]
        if width % heads:
            raise ConfigError("model", "a width that its heads divide", knobs.model)

    def build_model(self, config: TrialConfig) -> nn.Module:
        knobs = config.workload_knobs
        return Decoder(knobs.model, knobs.max_len, BATCHINGS[knobs.batching].attention())

    def dataset(self, config: TrialConfig, rank: int, world_size: int) -> torch.utils.data.Dataset:
        knobs = config.workload_knobs
        return Documents(knobs.documents, knobs.max_len, knobs.lengths, seed=config.seed * 1000 + rank)

    def collate_fn(self, config: TrialConfig) -> Callable:
        return functools.partial(collate, batching=config.workload_knobs.batching,
                                 max_len=config.workload_knobs.max_len)

    def units(self, inputs, targets) -> int:
        return int((targets != IGNORE).sum())

    def count(self, inputs, targets) -> dict[str, float]:
        return {"real_tokens": self.units(inputs, targets), "token_slots": targets.numel()}

    def figures(self, totals) -> dict[str, float]:
        slots = totals.get("token_slots", 0)
        return {"padding_fraction": 1 - totals["real_tokens"] / slots if slots else float("nan")}


def runnable_on(platform: str) -> list[str]:
    """The batchings that train on ``platform``."""
    return [name for name, batching in BATCHINGS.items() if platform not in batching.not_on]


def space_for(platform: str) -> tuple[list[str], list[str]]:
    """The rows a platform trains, and the others with the reason each is left out. A
    module a row needs is looked up here, in the driver (a cluster's workers may differ)."""
    rows, left_out = [], []
    for name, batching in BATCHINGS.items():
        if platform in batching.not_on:
            left_out.append(f"{name}: {batching.not_on[platform]}")
        elif batching.needs and not _has_module(batching.needs[0]):
            left_out.append(f"{name}: {batching.needs[0]} is {batching.needs[1]}")
        else:
            rows.append(name)
    return rows, left_out


def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False
