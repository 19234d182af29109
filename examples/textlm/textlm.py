"""A character-level transformer language model: the user's own training code.

This file is a gpucampaign recipe (``recipe: "textlm:CharLM"`` in ``campaign.yaml``): it says
what to train (model, data, loss, evaluation); gpucampaign owns the loop, the checkpoints, the
restart check and the close. It runs unchanged on CPU and on a GPU.

The corpus is one text file, read as bytes (a fixed vocabulary of 256 symbols, so the model
does not depend on the corpus). Its first 80% trains, the next 10% validates, the last 10%
tests; each example is a window of ``context + 1`` bytes, windows not overlapping.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from gpucampaign import Recipe

VOCAB = 256
FRACTIONS = (0.8, 0.1)  # train, val; the rest is test


class Windows(Dataset):
    """Non-overlapping windows of ``context + 1`` bytes: inputs and next-byte targets."""

    def __init__(self, data: torch.Tensor, *, context: int, offset: int) -> None:
        self.data, self.context = data, context
        n = (len(data) - 1) // context
        self.ids = [f"byte{offset + i * context}" for i in range(n)]

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        chunk = self.data[i * self.context : (i + 1) * self.context + 1]
        return chunk[:-1], chunk[1:]


class Block(nn.Module):
    """Pre-norm causal self-attention and an MLP, each with a residual."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(c // self.heads)
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, c)
        x = x + self.proj(y)
        return x + self.mlp(self.norm2(x))


class TinyGPT(nn.Module):
    """Byte embedding + learned positions -> blocks -> norm -> next-byte logits."""

    def __init__(self, *, width: int, layers: int, heads: int, context: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, width)
        self.pos = nn.Parameter(torch.zeros(context, width))
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, VOCAB)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx) + self.pos[: idx.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


class CharLM(Recipe):
    """Next-byte prediction; the decision metric is the mean cross-entropy ``loss`` (nats)."""

    metric = "loss"

    def datasets(self, ctx):
        data = torch.frombuffer(bytearray(ctx.corpus.path.read_bytes()), dtype=torch.uint8)
        data = data.long()
        context = int(ctx.args.get("context", 64))
        a = int(len(data) * FRACTIONS[0])
        b = a + int(len(data) * FRACTIONS[1])
        return {
            "train": Windows(data[:a], context=context, offset=0),
            "val": Windows(data[a:b], context=context, offset=a),
            "test": Windows(data[b:], context=context, offset=b),
        }

    def model(self, ctx):
        args = ctx.args
        return TinyGPT(
            width=int(args.get("width", 128)),
            layers=int(args.get("layers", 2)),
            heads=int(args.get("heads", 4)),
            context=int(args.get("context", 64)),
        )

    def loss(self, model, batch):
        x, y = batch
        return F.cross_entropy(model(x).float().flatten(0, 1), y.flatten())

    def score(self, model, batch):
        # Per window: its mean next-byte cross-entropy. Every window has the same length, so
        # their mean over a split is the split's loss: the verdict's interval resamples them.
        x, y = batch
        per_byte = F.cross_entropy(model(x).float().transpose(1, 2), y, reduction="none")
        loss = per_byte.mean(dim=1)
        return {"loss": loss, "bits_per_byte": loss / math.log(2)}

    def evaluate(self, model, batches):
        total, count = 0.0, 0
        for x, y in batches:
            logits = model(x).float().flatten(0, 1)
            total += float(F.cross_entropy(logits, y.flatten(), reduction="sum"))
            count += y.numel()
        loss = total / count
        return {"loss": loss, "bits_per_byte": loss / math.log(2)}
