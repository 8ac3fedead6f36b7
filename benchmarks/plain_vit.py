"""The ViT training step as a user writes it without this project: timm's ViT, AdamW,
cross-entropy on random images, the knobs applied by hand. No import of accelsweep, so
the plain Tune script (plain_tune.py) and the neutral judge (``measure``) time the
same step the main job's trials run, by code that owes nothing to the tool under test.

    python benchmarks/plain_vit.py '{"batch_size": 64, "precision": "fp32"}'   # the judge: one JSON line
    python benchmarks/plain_vit.py --serve '{"batch_size": 64}'   # a window per line read on stdin

The models and the data match trainables/workloads (vit-tiny, vit-micro; a fresh randn
image per item plus a per-class template, so DataLoader workers have real work).
"""

from __future__ import annotations

import contextlib
import json
import sys
import time

MODELS = {  # image size, classes, patch, dim, depth, heads
    "vit-tiny": (64, 100, 8, 192, 4, 3),
    "vit-micro": (32, 10, 8, 64, 2, 2),
}
BASELINE = {"batch_size": 16, "num_workers": 0, "precision": "fp32", "threads": 2, "channels_last": False,
            "torch_compile": "none", "patch_embed": "conv"}


def linear_patch_embed():
    import torch.nn as nn

    class LinearPatchEmbed(nn.Module):
        """Patches cut by a reshape and projected by one Linear (seed 001's patch embed)."""

        def __init__(self, img_size=224, patch_size=16, in_chans=3, embed_dim=768, bias=True, norm_layer=None,
                     **_):
            super().__init__()
            self.patch_size, self.num_patches = patch_size, (img_size // patch_size) ** 2
            self.grid_size = (img_size // patch_size,) * 2
            self.proj = nn.Linear(patch_size * patch_size * in_chans, embed_dim, bias=bias)
            self.norm = norm_layer(embed_dim) if norm_layer else nn.Identity()

        def forward(self, x):
            b, c, h, w = x.shape
            p = self.patch_size
            x = x.reshape(b, c, h // p, p, w // p, p).permute(0, 2, 4, 3, 5, 1)
            return self.norm(self.proj(x.reshape(b, self.num_patches, p * p * c)))

    return LinearPatchEmbed


class RandomImages:
    def __init__(self, size: int, classes: int, seed: int = 0):
        import torch

        self.size, self.classes, self.seed = size, classes, seed
        self.templates = torch.randn(classes, 3, size, size, generator=torch.Generator().manual_seed(seed))

    def __len__(self):
        return 1 << 30

    def __getitem__(self, index):
        import torch

        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        label = index % self.classes
        return torch.randn(3, self.size, self.size, generator=generator) + self.templates[label], label


def trainer(config: dict, model_name: str = "vit-tiny"):
    """A ``step()`` that trains one batch (synchronous on a CPU), built from ``config``."""
    import torch
    from timm.models.vision_transformer import VisionTransformer
    from torch.utils.data import DataLoader

    config = {**BASELINE, **config}
    torch.set_num_threads(config["threads"])
    size, classes, patch, dim, depth, heads = MODELS[model_name]
    extra = {"embed_layer": linear_patch_embed()} if config["patch_embed"] == "linear" else {}
    model = VisionTransformer(img_size=size, patch_size=patch, num_classes=classes, embed_dim=dim, depth=depth,
                              num_heads=heads, **extra)
    layout = torch.channels_last if config["channels_last"] else torch.contiguous_format
    dtype = torch.bfloat16 if config["precision"] == "bf16" else torch.float32
    model = model.to(dtype=dtype, memory_format=layout).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    forward = torch.compile(model, backend="inductor") if config["torch_compile"] == "inductor" else model
    autocast = (torch.autocast("cpu", dtype=torch.bfloat16) if config["precision"] == "bf16-autocast"
                else contextlib.nullcontext())
    workers = config["num_workers"]
    batches = iter(DataLoader(RandomImages(size, classes), batch_size=config["batch_size"], num_workers=workers,
                              persistent_workers=workers > 0, prefetch_factor=2 if workers else None))
    loss_function = torch.nn.CrossEntropyLoss()

    def step() -> int:
        images, labels = next(batches)
        images = images.to(dtype=dtype, memory_format=layout)
        optimizer.zero_grad(set_to_none=True)
        with autocast:
            loss = loss_function(forward(images), labels)
        loss.backward()
        optimizer.step()
        return len(labels)

    return step


def window(step, min_steps: int, min_s: float) -> float:
    """Samples per second over at least ``min_steps`` steps and ``min_s`` seconds."""
    started, samples, steps = time.perf_counter(), 0, 0
    while steps < min_steps or time.perf_counter() - started < min_s:
        samples += step()
        steps += 1
    return samples / (time.perf_counter() - started)


def measure(config: dict, model_name: str = "vit-tiny", warmup: int = 5, windows: int = 3,
            window_s: float = 3.0) -> dict:
    """The judge's plain loop: build, ``warmup`` steps (the compile, if any, among them),
    then ``windows`` windows of ``window_s``; the mean of the windows."""
    started = time.perf_counter()
    step = trainer(config, model_name)
    for _ in range(warmup):
        step()
    warm_s = time.perf_counter() - started
    figures = [window(step, 5, window_s) for _ in range(windows)]
    return {"throughput": sum(figures) / len(figures), "windows": figures, "warmup_s": warm_s}


def serve(config: dict, model_name: str = "vit-tiny", warmup: int = 5, window_s: float = 3.0) -> None:
    """The judge's plain loop, one window per request: build, ``warmup`` steps, say
    ``ready``; then for each line read on stdin, one window, its figure on stdout. Several
    such processes, one per config, take turns window by window (vs_plain_tune's judge):
    each turn starts with untimed steps that drain what the process's loader workers
    prefetched while it waited, and let its threads wake."""
    step = trainer(config, model_name)
    started = time.perf_counter()
    for _ in range(warmup):
        step()
    print(json.dumps({"ready": True, "warmup_s": time.perf_counter() - started}), flush=True)
    drain = 2 + 2 * config.get("num_workers", 0)  # prefetch_factor 2 per worker, and two more
    for _ in sys.stdin:
        for _ in range(drain):
            step()
        print(json.dumps({"throughput": window(step, 5, window_s)}), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "--serve":
        request = json.loads(sys.argv[2])
        model_name = request.pop("model", "vit-tiny")
        serve(request, model_name, **{key: request.pop(key) for key in ("warmup", "window_s") if key in request})
        sys.exit(0)
    request = json.loads(sys.argv[1])
    model_name = request.pop("model", "vit-tiny")
    timing = {key: request.pop(key) for key in ("warmup", "windows", "window_s") if key in request}
    print(json.dumps(measure(request, model_name, **timing)), flush=True)
