"""A causal self-attention block whose attention is spatialc's, checked against torch's on the CPU.

`spatialc.torch.attention(q, k, v, causal=True)` takes q, k and v as `torch.nn.functional.scaled_dot_product_attention`
does, (batch, heads, seq, head_dim), here with grouped-query attention (4 query heads over 2 KV heads). It is a torch
custom op over a verified spatialc program, built once per shape; on a CPU it runs spatialc's reference interpreter
(exact, not fast), on a CUDA device the kernel. The block is compiled whole and compared with the same block on
torch's SDPA in float32, within the bound spatialc states for the program. Needs torch (pip install 'spatialc[torch]').

    python examples/torch_attention.py
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

import spatialc
import spatialc.torch as sct


class SelfAttention(torch.nn.Module):
    """Causal self-attention: q, k and v from one projection (kv_heads heads of k and v), then out."""

    def __init__(self, dim: int = 64, heads: int = 4, kv_heads: int = 2, use_spatialc: bool = True):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.qkv = torch.nn.Linear(dim, (heads + 2 * kv_heads) * self.head_dim)
        self.out = torch.nn.Linear(dim, dim)
        self.use_spatialc = use_spatialc

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self.qkv(x).split([self.heads * self.head_dim, *(self.kv_heads * self.head_dim,) * 2], dim=-1)
        q = q.reshape(b, s, self.heads, self.head_dim).transpose(1, 2).to(torch.bfloat16)
        k, v = (t.reshape(b, s, self.kv_heads, self.head_dim).transpose(1, 2).to(torch.bfloat16) for t in (k, v))
        if self.use_spatialc:
            o = sct.attention(q, k, v, causal=True, out_dtype=torch.float32)
        else:  # torch's, in float32 from the same bf16 values
            o = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True, enable_gqa=True)
        return self.out(o.transpose(1, 2).reshape(b, s, -1))


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")  # each shape spatialc builds is said once
    torch.manual_seed(0)
    ours = SelfAttention()
    theirs = SelfAttention(use_spatialc=False)
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(2, 24, 64)
    with torch.no_grad():  # the op has no backward yet
        got = torch.compile(ours, fullgraph=True, backend="aot_eager")(x)  # one graph: no break at the op
        want = theirs(x)

        # The attention alone, against spatialc's own bound for its program (O within about 2^-8 of softmax·|V|).
        q, k, v = (torch.randn(2, h, 24, 16).bfloat16() for h in (4, 2, 2))
        o, lse = sct.attention(q, k, v, causal=True, out_dtype=torch.float32, return_lse=True)
        ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True, enable_gqa=True)
        op = sct.attention_op("bf16", causal=True)
        [entry] = [e for e in op.compiled() if e.sizes == (8, 24, 24, 16, 4)]
        bound = spatialc.tolerance(entry.program).bound({n: t.float().reshape(-1, 24, 16).numpy() for n, t in
                                                         (("q", q), ("k", k), ("v", v))})["o"]  # fmt: skip
    used = ((o - ref).abs() / torch.from_numpy(bound).reshape(o.shape)).max().item()
    print(f"block: max |spatialc - torch| = {(got - want).abs().max().item():.2e}")
    print(f"attention: max |O - SDPA's| is {used:.2f} of spatialc's bound; LSE {tuple(lse.shape)}")
    assert used <= 1.0 and (got - want).abs().max().item() < 2**-6
    print(op.name, [str(c) for c in op.compiled()])


if __name__ == "__main__":
    main()
