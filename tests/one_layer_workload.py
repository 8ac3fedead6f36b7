"""The micro ViT's images and classes through one linear layer: for the tests on torch-xla's
CPU client that count graphs or capture a step, not a model's speed. XLA's CPU compiler took
about 5.5 s for each graph of the micro ViT's training step on 2 cores, a fraction of a second
for this one's. Importable as tests.one_layer_workload (a replay command loads it by name)."""

import torch

from accelsweep.trainables.workloads.image_classification import ImageClassification
from accelsweep.trainables.workloads.vision_models import MODEL_PRESETS


class OneLayerImages(ImageClassification):
    def build_model(self, config):
        preset = MODEL_PRESETS[config.workload_knobs.model]
        pixels = 3 * preset.image_size * preset.image_size
        return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(pixels, preset.num_classes))
