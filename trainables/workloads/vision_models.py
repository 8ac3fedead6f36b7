"""Model presets of the image-classification workload: the seeds' ViT-B/16 and
ResNet-50, plus ViTs sized for a CPU.

Importing this module does not import torch: presets are plain data so the driver can
validate configs without paying for torch. ``build_model`` imports it when called.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

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
    # The CPU post (seed 003): torchvision ResNet-50 at 224x224.
    "resnet50": ModelPreset("resnet50", 224, 1000, description="torchvision ResNet-50 at 224"),
}


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


def build_model(model: str, patch_embed: str = "conv") -> "nn.Module":
    preset = MODEL_PRESETS[model]
    if preset.architecture == "resnet50":
        import torchvision

        return torchvision.models.resnet50(weights=None, num_classes=preset.num_classes)

    from timm.models.vision_transformer import VisionTransformer

    extra = {"embed_layer": _linear_patch_embed_class()} if patch_embed == "linear" else {}
    return VisionTransformer(
        img_size=preset.image_size,
        patch_size=preset.patch_size,
        num_classes=preset.num_classes,
        embed_dim=preset.embed_dim,
        depth=preset.depth,
        num_heads=preset.num_heads,
        **extra,
    )
