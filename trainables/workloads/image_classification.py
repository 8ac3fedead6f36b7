"""The seeds' workload: an image classifier (a ViT or ResNet-50 preset) trained with
AdamW and cross-entropy on random images. Written against the public ``Workload``
interface, like a user's own."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from accelsweep.trainables.errors import ConfigError
from accelsweep.trainables.workloads import vision_models
from accelsweep.trainables.workloads.base import Workload, WorkloadKnobs, knob
from accelsweep.trainables.workloads.vision_models import (ATTENTIONS, DEFAULT_ATTENTION, MODEL_PRESETS,
                                                           attention_refusal, trainable_attentions)

if TYPE_CHECKING:
    from accelsweep.trainables.config import TrialConfig

PATCH_EMBEDS = ("conv", "linear")


@dataclass(frozen=True)
class ImageClassificationKnobs(WorkloadKnobs):
    # The architecture and its size (trainables/workloads/vision_models.py).
    model: str = knob("vit-tiny", choices=tuple(MODEL_PRESETS))
    # "linear": seed 001's conv-free patch embedding (ViTs only).
    patch_embed: str = knob("conv", choices=PATCH_EMBEDS)
    # What a ViT's attention computes with (vision_models.ATTENTIONS, seed 003's attention
    # post): "sdpa" is timm's own module; the others force one implementation.
    attention: str = knob(DEFAULT_ATTENTION, choices=tuple(ATTENTIONS))


class ImageClassification(Workload):
    Knobs = ImageClassificationKnobs
    imports = ("timm", "torchvision")

    def validate(self, config: "TrialConfig") -> None:
        knobs = config.workload_knobs
        preset = MODEL_PRESETS[knobs.model]
        if knobs.patch_embed == "linear" and not preset.is_vit:
            raise ConfigError("patch_embed", "'conv' for a non-ViT model", knobs.patch_embed,
                              f"model {knobs.model!r} has no patch embedding.")
        if knobs.attention != DEFAULT_ATTENTION and not preset.is_vit:
            raise ConfigError("attention", f"{DEFAULT_ATTENTION!r} for a non-ViT model", knobs.attention,
                              f"model {knobs.model!r} has no attention.")
        refusal = attention_refusal(knobs.attention, config.platform, config.precision)
        if refusal:
            allowed = ", ".join(trainable_attentions(config.platform, config.precision))
            raise ConfigError("attention", f"one of {allowed} on platform {config.platform} with precision "
                                           f"{config.precision}", knobs.attention, refusal + ".")

    def build_model(self, config: "TrialConfig"):
        knobs = config.workload_knobs
        return vision_models.build_model(knobs.model, knobs.patch_embed, knobs.attention)

    def dataset(self, config: "TrialConfig", rank: int, world_size: int):
        # Looked up on the module when called: tests swap in slow or poisoned datasets.
        from accelsweep.trainables.workloads import random_images

        preset = MODEL_PRESETS[config.workload_knobs.model]
        return random_images.RandomImageDataset(preset.image_size, preset.num_classes, seed=config.seed,
                                                rank=rank, world_size=world_size)

    def describe(self, config: "TrialConfig") -> str:
        knobs = config.workload_knobs
        description = MODEL_PRESETS[knobs.model].description or knobs.model
        return description if knobs.attention == DEFAULT_ATTENTION else f"{description}, attention {knobs.attention}"
