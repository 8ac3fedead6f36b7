"""Model presets of the image-classification workload: the seeds' ViT-B/16, seed 003's
two attention ViTs and ResNet-50, plus ViTs sized for a CPU; and the attention a ViT
computes with (``ATTENTIONS``).

Importing this module does not import torch: presets and attention implementations are
plain data so the driver can validate configs without paying for torch. ``build_model``
imports it when called.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from accelsweep.kernels.registry import get_op
from accelsweep.trainables.errors import ConfigError
from accelsweep.trainables.precision import get_precision

if TYPE_CHECKING:
    import torch.nn as nn


@dataclass(frozen=True)
class ModelPreset:
    architecture: str  # "vit" or "resnet50"
    image_size: int
    num_classes: int
    patch_size: int = 16
    embed_dim: int = 768
    depth: int = 12
    num_heads: int = 12
    # Seed 003's attention ViTs have no class token and average-pool the patch tokens, so
    # attention runs over the patches alone (196 or 3136 tokens).
    class_token: bool = True
    global_pool: str = "token"
    description: str = ""

    @property
    def is_vit(self) -> bool:
        return self.architecture == "vit"


MODEL_PRESETS: dict[str, ModelPreset] = {
    # Seeds 000/001: timm's default VisionTransformer (ViT-B/16) at 224x224, 1000 classes.
    "vit-b16": ModelPreset("vit", 224, 1000, description="ViT-B/16 at 224 (seeds 000, 001)"),
    # Trains at tens to hundreds of samples/s on 2 CPU cores: the local default.
    "vit-tiny": ModelPreset("vit", 64, 100, patch_size=8, embed_dim=192, depth=4, num_heads=3,
                            description="ViT, 64x64 input, patch 8, dim 192, depth 4"),
    # Milliseconds per step: for tests and --smoke.
    "vit-micro": ModelPreset("vit", 32, 10, patch_size=8, embed_dim=64, depth=2, num_heads=2,
                             description="ViT, 32x32 input, patch 8, dim 64, depth 2"),
    # Seed 003's attention post: its first ViT (224, patch 16: 196 tokens; 16 heads of 64,
    # depth 24, batch 128 there) and its long-sequence one (patch 4: 3136 tokens; 12 heads
    # of 64, depth 6, batch 8 there).
    "vit-attn-196": ModelPreset("vit", 224, 1000, embed_dim=1024, depth=24, num_heads=16, class_token=False,
                                global_pool="avg", description="ViT, 224, patch 16 (196 tokens), 16 heads of 64, "
                                                               "depth 24 (seed 003's attention ViT)"),
    "vit-attn-3136": ModelPreset("vit", 224, 1000, patch_size=4, embed_dim=768, depth=6, num_heads=12,
                                 class_token=False, global_pool="avg",
                                 description="ViT, 224, patch 4 (3136 tokens), 12 heads of 64, depth 6 "
                                             "(seed 003's long-sequence ViT)"),
    # Attention at a CPU's scale: 256 tokens, 2 heads of 64. Attention's share of a block's
    # FLOPs, tokens / (6 * dim + tokens), is 25% here (seed 003's ViTs: 3% at 196 tokens,
    # 40% at 3136), and its hand-written form moves tokens^2 scores through memory.
    "vit-attn-cpu": ModelPreset("vit", 64, 100, patch_size=4, embed_dim=128, depth=2, num_heads=2,
                                class_token=False, global_pool="avg",
                                description="ViT, 64x64, patch 4 (256 tokens), 2 heads of 64, depth 2"),
    # The CPU post (seed 003): torchvision ResNet-50 at 224x224.
    "resnet50": ModelPreset("resnet50", 224, 1000, description="torchvision ResNet-50 at 224"),
}


# The attention a ViT's blocks compute with (knob ``attention``). "sdpa" is timm's own
# Attention module, unchanged; every other one swaps the attention computation inside it
# (same qkv and output projections, same weights) for the implementation of the same
# name in kernels/attention (registry op "attention"), which the kernel study times alone.
# A forced SDPA backend raises when it cannot run the inputs; nothing falls back.
ATTENTIONS: dict[str, str] = {
    "sdpa": "timm's own: F.scaled_dot_product_attention, PyTorch's dispatcher picks the backend (none forced)",
    "naive": "the seed's hand-written attention: (q * scale) @ k^T, softmax, @ v",
    "sdpa-math": "SDPA with only its MATH backend allowed (sdpa_kernel)",
    "sdpa-flash": "SDPA with only FLASH_ATTENTION allowed: FlashAttention-2 on CUDA, ATen's CPU flash kernel on a CPU",
    "sdpa-efficient": "SDPA with only EFFICIENT_ATTENTION allowed (xFormers' memory-efficient kernel, CUDA)",
    "sdpa-cudnn": "SDPA with only CUDNN_ATTENTION allowed (CUDA)",
    "flex": "FlexAttention, the kernel compiled (torch.compile(flex_attention)), no score_mod or mask",
    "flash-attn": "flash-attn's flash_attn_func (FlashAttention-2; the seed ran the FlashAttention-3 beta)",
    "xformers": "xFormers memory_efficient_attention (its dispatcher picks among its kernels)",
    "transformer-engine": "Transformer Engine's DotProductAttention, its fused (cuDNN) backend forced",
}
DEFAULT_ATTENTION = "sdpa"
# What each platform lacks that the kernel registry does not say (it registers forward
# kernels): torch 2.14.1 here raises "FlexAttention does not support backward on CPU".
NO_TRAINING = {("flex", "cpu"): "FlexAttention has no backward pass on a CPU (torch raises \"FlexAttention does "
                                "not support backward on CPU\"): it cannot train there"}


def attention_dtype(precision: str) -> str:
    """The dtype q, k and v have under ``precision``: autocast's, else the weights'."""
    chosen = get_precision(precision)
    return chosen.autocast or chosen.parameters


def attention_refusal(attention: str, platform: str, precision: str) -> Optional[str]:
    """Why ``attention`` cannot train on ``platform`` at ``precision``, or None when it can.
    Read from the kernel registry's declarations (platforms, dtypes, checks) without
    importing any implementation's stack, so the driver can say it before any trial."""
    if attention == DEFAULT_ATTENTION:
        return None  # timm's own module runs wherever the model does
    if (attention, platform) in NO_TRAINING:
        return NO_TRAINING[attention, platform]
    op = get_op("attention")
    kernel = op.impl(attention)
    if platform not in kernel.platforms:
        return f"{attention} runs on {', '.join(kernel.platforms)} only"
    dtype = attention_dtype(precision)
    if kernel.dtypes is not None and dtype not in kernel.dtypes:
        return (f"{attention} takes {', '.join(kernel.dtypes)} only, and precision {precision} gives it {dtype}: "
                "use precision bf16-autocast or bf16")
    if kernel.check is not None:
        try:
            # Its check reads dtype and platform; the shape and options are the op's defaults.
            kernel.check(dict(op.shape), dict(op.options), dict(kernel.tuning), dtype, platform)
        except ConfigError as error:
            return f"{attention} gets {dtype} under precision {precision}, and its kernel says: {error}"
    return None


def trainable_attentions(platform: str, precision: str) -> tuple[str, ...]:
    return tuple(name for name in ATTENTIONS if attention_refusal(name, platform, precision) is None)


@functools.lru_cache(maxsize=None)
def _swept_attention_class():
    from timm.layers import Attention

    class SweptAttention(Attention):
        """timm's Attention with its attention computation swapped: ``attend(q, k, v)`` on
        (batch, heads, tokens, head_dim), set by ``build_model``. Projections, norms and
        weights are timm's; what timm would do with a mask or dropout is refused, not dropped."""

        attend = None

        def forward(self, x, attn_mask=None, is_causal=False):
            if attn_mask is not None or is_causal or (self.training and self.attn_drop.p):
                raise NotImplementedError("the swapped attention takes no mask, causal flag or attention dropout")
            batch, tokens, _ = x.shape
            gate = self.gate(x).sigmoid() if self.gate is not None else None
            qkv = self.qkv(x).reshape(batch, tokens, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
            q, k, v = qkv.unbind(0)
            x = self.attend(self.q_norm(q), self.k_norm(k), v)
            x = self.norm(x.transpose(1, 2).reshape(batch, tokens, self.attn_dim))
            if gate is not None:
                x = x * gate
            return self.proj_drop(self.proj(x))

    return SweptAttention


def _linear_patch_embed_class():
    import torch.nn as nn

    class LinearPatchEmbed(nn.Module):
        """Seed 001's conv-free patch embedding: cut the image into patches with a
        reshape and project them with one nn.Linear. Same maths as the stride-p conv,
        but it lowers to a plain matmul, which the Neuron compiler handles better.
        Accepts timm's embed_layer keyword arguments."""

        def __init__(self, img_size=224, patch_size=16, in_chans=3, embed_dim=768, bias=True,
                     norm_layer=None, **_unused):
            super().__init__()
            self.patch_size = patch_size
            self.grid_size = (img_size // patch_size, img_size // patch_size)
            self.num_patches = self.grid_size[0] * self.grid_size[1]
            self.proj = nn.Linear(patch_size * patch_size * in_chans, embed_dim, bias=bias)
            self.norm = norm_layer(embed_dim) if norm_layer else nn.Identity()

        def forward(self, x):
            batch, channels, height, width = x.shape
            p = self.patch_size
            x = x.reshape(batch, channels, height // p, p, width // p, p)
            # (B, C, NH, p, NW, p) -> (B, NH, NW, p, p, C) -> (B, NH*NW, p*p*C)
            x = x.permute(0, 2, 4, 3, 5, 1).reshape(batch, self.num_patches, p * p * channels)
            return self.norm(self.proj(x))

    return LinearPatchEmbed


def build_model(model: str, patch_embed: str = "conv", attention: str = DEFAULT_ATTENTION) -> "nn.Module":
    preset = MODEL_PRESETS[model]
    if preset.architecture == "resnet50":
        import torchvision

        return torchvision.models.resnet50(weights=None, num_classes=preset.num_classes)

    from timm.layers import Attention
    from timm.models.vision_transformer import VisionTransformer

    extra = {"embed_layer": _linear_patch_embed_class()} if patch_embed == "linear" else {}
    if attention != DEFAULT_ATTENTION:
        # KernelUnavailable, with what to install, when its stack is missing here.
        attend = get_op("attention").impl(attention).load()
        extra["attn_layer"] = _swept_attention_class()
    vit = VisionTransformer(
        img_size=preset.image_size,
        patch_size=preset.patch_size,
        num_classes=preset.num_classes,
        embed_dim=preset.embed_dim,
        depth=preset.depth,
        num_heads=preset.num_heads,
        class_token=preset.class_token,
        global_pool=preset.global_pool,
        **extra,
    )
    for module in vit.modules():
        if isinstance(module, Attention):
            if attention == DEFAULT_ATTENTION:
                # timm turns SDPA off under TIMM_FUSED_ATTN=0; "sdpa" means SDPA.
                module.fused_attn = True
            else:
                module.attend = attend
    return vit
