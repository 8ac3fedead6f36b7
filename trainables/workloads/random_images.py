"""Random-image datasets, as in the seeds' FakeDataset, reproducible by index.

Each item is generated in ``__getitem__`` (a fresh ``randn`` per image, seeded by its
index), so DataLoader workers have real per-sample work to overlap: that is what the
``num_workers`` knob trades against compute threads. Two variations: a fixed per-class
template added to the noise (``learnable``) lets the loss fall, so tests can check that
training trains; a ``pool`` of images drawn once makes every batch cost the same little,
for a study that times per-step work other than the data's.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch.utils.data import Dataset

TEMPLATE_SCALE = 1.0


class RandomImageDataset(Dataset):
    """Item ``i``: a 3 x ``image_size`` x ``image_size`` image and label ``i % num_classes``."""

    def __init__(self, image_size: int, num_classes: int, seed: int = 0, length: int = 1 << 30,
                 rank: int = 0, world_size: int = 1, learnable: bool = True, pool: Optional[int] = None):
        # Worker ``rank`` of ``world_size`` sees every world_size-th item: disjoint shards.
        self.rank, self.world_size = rank, world_size
        self.image_size = image_size
        self.num_classes = num_classes
        self.seed = seed
        self.length = length
        generator = torch.Generator().manual_seed(seed)
        self.templates = TEMPLATE_SCALE * torch.randn(
            num_classes, 3, image_size, image_size, generator=generator
        ) if learnable else None
        self.pool = torch.randn(pool, 3, image_size, image_size, generator=generator) if pool else None

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        index = index * self.world_size + self.rank
        label = index % self.num_classes
        if self.pool is not None:
            image = self.pool[index % len(self.pool)]
        else:
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
            image = torch.randn(3, self.image_size, self.image_size, generator=generator)
        return (image if self.templates is None else image + self.templates[label]), label
