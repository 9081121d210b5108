"""PyTorch modules the torch backend's benchmark (benches/torch_backend.py) and its tests
(python/tests) share: a GPT-2-style block and an LSTM cell."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    """A GPT-2-style block: causal attention and a tanh-GELU MLP, pre-LayerNorm."""

    def __init__(self, d=768, heads=12):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.heads = heads

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        shape = (b, t, self.heads, c // self.heads)
        q, k, v = (z.view(shape).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / (c // self.heads) ** 0.5)
        mask = torch.tril(torch.ones(t, t, device=x.device)).view(1, 1, t, t)
        att = F.softmax(att.masked_fill(mask == 0, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class Cell(nn.Module):
    """An LSTM cell written with chunk()."""

    def __init__(self, n=1024):
        super().__init__()
        self.gates = nn.Linear(2 * n, 4 * n)

    def forward(self, x, h, c):
        i, f, o, u = self.gates(torch.cat([x, h], 1)).chunk(4, 1)
        c2 = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(u)
        return torch.sigmoid(o) * torch.tanh(c2), c2
