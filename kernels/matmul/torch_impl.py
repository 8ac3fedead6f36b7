"""The library matmul in PyTorch: torch._int_mm for int8 (int32 out), torch.matmul for
float32.

No bfloat16: this op's contract is bfloat16 in, float32 out (float32 accumulation), and
torch 2.14 has no such call on a CPU (``torch.mm(..., out_dtype=torch.float32)`` raises
NotImplementedError there, aten::mm.dtype has no CPU kernel); torch.matmul on bfloat16
rounds its output to bfloat16, a different result."""

import torch


def matmul_torch(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if a.dtype == torch.int8:
        return torch._int_mm(a, b)
    return torch.matmul(a, b)
