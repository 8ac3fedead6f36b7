"""One's own model, public API only: a tiny causal LM's training throughput in tokens/s."""
from dataclasses import dataclass

import torch
from torch import nn

from accelsweep.sweeps.driver.api import Objective, Sweep, plan_sweep, run_sweep
from accelsweep.sweeps.driver.cli import common_parser, main_guard, platform_from_args, sweep_options
from accelsweep.trainables.config import TrialConfig
from accelsweep.trainables.trainable import train_trainable
from accelsweep.trainables.workloads.base import Workload, WorkloadKnobs, import_path, knob

VOCAB = 512


class CausalLM(nn.Module):
    def __init__(self, width: int, layers: int):
        super().__init__()
        self.embed, self.head = nn.Embedding(VOCAB, width), nn.Linear(width, VOCAB)
        self.blocks = nn.TransformerEncoder(nn.TransformerEncoderLayer(width, 4, 4 * width, batch_first=True), layers)

    def forward(self, tokens):
        mask = nn.Transformer.generate_square_subsequent_mask(tokens.shape[1], device=tokens.device)
        return self.head(self.blocks(self.embed(tokens), mask=mask, is_causal=True))


class TinyLM(Workload):
    unit = "tokens"  # each input element is a token: throughput_tokens_per_s, usd_per_1m_tokens

    @dataclass(frozen=True)
    class Knobs(WorkloadKnobs):  # searched and validated like the built-in knobs
        seq_len: int = knob(64, choices=(32, 64, 128))
        layers: int = knob(2, choices=(1, 2, 4))

    def build_model(self, config):
        return CausalLM(width=128, layers=config.workload_knobs.layers)

    def dataset(self, config, rank, world_size):  # next-token prediction on random tokens
        generator = torch.Generator().manual_seed(config.seed * 1000 + rank)
        tokens = torch.randint(VOCAB, (1024, config.workload_knobs.seq_len + 1), generator=generator)
        return torch.utils.data.TensorDataset(tokens[:, :-1], tokens[:, 1:])


def main():
    args = common_parser("A tiny causal LM's training throughput in tokens/s", default_samples=6).parse_args()
    platform, note = platform_from_args(args)
    measure = dict(warmup_steps=1, window_min_steps=2, window_min_s=0.2, windows=2, layers=1) if args.smoke else {}
    base = TrialConfig.make(platform=platform, workload=import_path(TinyLM), batch_size=8, seed=args.seed, **measure)
    space = {"batch_size": [4, 8, 16], "seq_len": [32, 64, 128], "layers": [1, 2]}
    sweep = Sweep(name="user_tiny_lm", trainable=train_trainable, base=base, platform_note=note,
                  space=lambda trial: {k: trial.suggest_categorical(k, v) for k, v in space.items()},
                  objectives=[Objective("throughput_tokens_per_s", "max")],
                  **sweep_options(args, default_samples=2 if args.smoke else 6))
    print(plan_sweep(sweep).describe()) if args.dry_run else run_sweep(sweep)


if __name__ == "__main__":
    main_guard(main)
