"""Random-image datasets, as in the seeds, but learnable and reproducible.

Each item is generated in ``__getitem__`` (fresh ``randn`` per image, like the seeds'
FakeDataset), so DataLoader workers have real per-sample work to overlap: that is what
the ``num_workers`` knob trades against compute threads. A fixed per-class template is
added to the noise so the loss can actually fall, which lets tests check that training
trains. Item ``i`` is the same image in every trial (seeded by index).
"""

from __future__ import annotations

import torch
from torch.utils.data import Dataset

TEMPLATE_SCALE = 1.0


class RandomImageDataset(Dataset):
    def __init__(self, image_size: int, num_classes: int, seed: int = 0, length: int = 1 << 30,
                 rank: int = 0, world_size: int = 1):
        # Worker ``rank`` of ``world_size`` sees every world_size-th item: disjoint shards.
        self.rank, self.world_size = rank, world_size
        self.image_size = image_size
        self.num_classes = num_classes
        self.seed = seed
        self.length = length
        generator = torch.Generator().manual_seed(seed)
        self.templates = TEMPLATE_SCALE * torch.randn(
            num_classes, 3, image_size, image_size, generator=generator
        )

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        index = index * self.world_size + self.rank
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        label = index % self.num_classes
        image = torch.randn(3, self.image_size, self.image_size, generator=generator)
        return image + self.templates[label], label
