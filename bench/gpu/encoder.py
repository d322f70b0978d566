"""A small transformer encoder for the Inductor GPU study, given as a PyTorch module and as ONNX.

`build()` is the study's `backend.options.module = "bench.gpu.encoder:build"`: it returns the module
and example inputs, with weights drawn from a fixed seed so every process builds the same network.
`export(path)` writes the same network as ONNX (legacy TorchScript exporter, opset 17): the study's
model file, from which the tuner takes input shapes and computes the fp32 reference with ONNX Runtime.
Token ids in, last hidden state out: embedding + learned positions, pre-norm blocks of multi-head
self-attention (scaled_dot_product_attention) and a GELU MLP, final LayerNorm. `build_pooled()` is the
same network as a sentence-embedding model: the hidden states mean-pooled over tokens and L2-normalised
(`embedding` [BATCH, HIDDEN]), whose small outputs a recorded landscape can keep for every route.

Usage: python -m bench.gpu.encoder OUT.onnx [--pooled]
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

VOCAB, BATCH, SEQ, HIDDEN, HEADS, LAYERS, FFN = 1000, 8, 128, 256, 4, 4, 1024
SEED = 0


class Block(nn.Module):
    """Pre-norm self-attention and MLP with residual connections."""

    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(HIDDEN), nn.LayerNorm(HIDDEN)
        self.qkv, self.proj = nn.Linear(HIDDEN, 3 * HIDDEN), nn.Linear(HIDDEN, HIDDEN)
        self.fc1, self.fc2 = nn.Linear(HIDDEN, FFN), nn.Linear(FFN, HIDDEN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, HEADS, HIDDEN // HEADS).permute(2, 0, 3, 1, 4).unbind(0)
        attn = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, s, HIDDEN)
        x = x + self.proj(attn)
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class Encoder(nn.Module):
    """Token ids [BATCH, SEQ] -> hidden states [BATCH, SEQ, HIDDEN]."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.pos = nn.Parameter(torch.zeros(SEQ, HIDDEN))
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = nn.LayerNorm(HIDDEN)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids) + self.pos
        for block in self.blocks:
            x = block(x)
        return self.norm(x)


class PooledEncoder(Encoder):
    """Token ids [BATCH, SEQ] -> L2-normalised mean of the hidden states [BATCH, HIDDEN]."""

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return F.normalize(super().forward(input_ids).mean(dim=1), dim=-1)


def build(pooled: bool = False) -> tuple[nn.Module, tuple[torch.Tensor]]:
    """The encoder with seeded weights (identical in every process) and example token ids."""
    gen = torch.Generator().manual_seed(SEED)
    model = PooledEncoder() if pooled else Encoder()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_((0.02 if name.endswith("bias") else 0.08) * torch.randn(p.shape, generator=gen))
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen)
    return model.eval(), (ids,)


def build_pooled() -> tuple[nn.Module, tuple[torch.Tensor]]:
    """The sentence-embedding encoder (`PooledEncoder`), same weights as `build()`."""
    return build(pooled=True)


def export(path: Path, pooled: bool = False) -> Path:
    """Write the encoder as ONNX (input `input_ids` int64 [BATCH, SEQ], output `hidden`, or `embedding` pooled)."""
    model, example = build(pooled)
    path.parent.mkdir(parents=True, exist_ok=True)
    output = "embedding" if pooled else "hidden"
    torch.onnx.export(
        model, example, str(path), input_names=["input_ids"], output_names=[output], opset_version=17, dynamo=False
    )
    return path


if __name__ == "__main__":
    print(export(Path(sys.argv[1]), pooled="--pooled" in sys.argv[2:]))
