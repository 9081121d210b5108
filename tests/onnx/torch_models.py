"""Exports the small PyTorch models of tests/onnx.rs that use run-time indices, by both of
PyTorch's exporters, and records their inputs and PyTorch's outputs (computed in float64 and
rounded to float32, so the reference is more accurate than either side).

Usage: python3 torch_models.py DIR (needs torch, onnx and onnxscript). Writes
DIR/<model>.<exporter>.onnx, DIR/<model>.in.<input>.npy and DIR/<model>.out.0.npy, for the
exporters `ts` (TorchScript, opset 17) and `dynamo` (the default opset); and for the models in
DIFFERENTIATED a cotangent DIR/<model>.cot.y.npy and torch.autograd's gradients with respect to
the float inputs and the listed parameters, DIR/<model>.grad.<name>.npy.
"""
import os
import sys

import numpy as np
import torch

out = sys.argv[1]
torch.manual_seed(7)


class EmbeddingMeanPool(torch.nn.Module):
    """An embedding lookup, a mean over the sequence and a Linear: a bag-of-words classifier."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(50, 16)
        self.fc = torch.nn.Linear(16, 4)

    def forward(self, ids):
        return self.fc(self.emb(ids).mean(dim=1))


class TargetLogProb(torch.nn.Module):
    """log_softmax, then each row's target log-probability by torch.gather (GatherElements),
    negated and averaged: cross-entropy written out."""

    def forward(self, logits, target):
        logp = torch.log_softmax(logits, dim=-1)
        return -logp.gather(1, target.unsqueeze(1)).mean()


class CrossEntropy(torch.nn.Module):
    """F.cross_entropy with class weights, an ignored class and the default mean, over a
    [N, C, L] batch of sequences (ONNX SoftmaxCrossEntropyLoss from the TorchScript
    exporter)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("weight", torch.rand(6) + 0.5)

    def forward(self, logits, target):
        return torch.nn.functional.cross_entropy(logits, target, weight=self.weight,
                                                 ignore_index=2)


class Lstm(torch.nn.Module):
    """nn.LSTM: two layers, both directions, batch first, from initial states."""

    def __init__(self):
        super().__init__()
        self.lstm = torch.nn.LSTM(8, 16, num_layers=2, bidirectional=True, batch_first=True)

    def forward(self, x, h0, c0):
        return self.lstm(x, (h0, c0))[0]


class Gru(torch.nn.Module):
    """nn.GRU (one layer, sequence first, zero initial state): its last hidden state."""

    def __init__(self):
        super().__init__()
        self.gru = torch.nn.GRU(8, 12)

    def forward(self, x):
        return self.gru(x)[1]


class Block(torch.nn.Module):
    """A pre-norm transformer block: causal nn.MultiheadAttention and a GELU MLP."""

    def __init__(self, d=16, heads=2):
        super().__init__()
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.attn = torch.nn.MultiheadAttention(d, heads, batch_first=True)
        self.fc1, self.fc2 = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

    def forward(self, x, mask):
        a = self.ln1(x)
        x = x + self.attn(a, a, a, attn_mask=mask, need_weights=False)[0]
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln2(x))))


class TinyLm(torch.nn.Module):
    """A GPT-style language model: token and position embeddings, two blocks, a final norm
    and the vocabulary head."""

    def __init__(self, vocab=64, d=16, context=8):
        super().__init__()
        self.tok, self.pos = torch.nn.Embedding(vocab, d), torch.nn.Embedding(context, d)
        self.blocks = torch.nn.ModuleList([Block(d) for _ in range(2)])
        self.ln, self.head = torch.nn.LayerNorm(d), torch.nn.Linear(d, vocab, bias=False)
        mask = torch.triu(torch.full((context, context), float("-inf")), 1)
        self.register_buffer("mask", mask)

    def forward(self, ids):
        t = ids.shape[1]
        x = self.tok(ids) + self.pos(torch.arange(t))
        for block in self.blocks:
            x = block(x, self.mask[:t, :t])
        return self.head(self.ln(x))


class MoeTop2(torch.nn.Module):
    """A top-2 mixture-of-experts layer: a router picks each token's 2 best of 4 experts
    (torch.topk), renormalizes their weights, scatters them into a dense gate (torch.scatter:
    ScatterElements) and mixes the experts' outputs by it; and a running sum of the gates
    (torch.cumsum), the load each expert has taken so far."""

    def __init__(self, d=8, experts=4):
        super().__init__()
        self.router = torch.nn.Linear(d, experts)
        self.experts = torch.nn.ModuleList([torch.nn.Linear(d, d) for _ in range(experts)])

    def forward(self, x):
        logits = self.router(x)
        top, idx = torch.topk(logits, 2, dim=-1)
        weights = torch.softmax(top, dim=-1)
        gate = torch.zeros_like(logits).scatter(-1, idx, weights)
        outs = torch.stack([e(x) for e in self.experts], dim=-1)
        load = torch.cumsum(gate, dim=0)
        return (outs * gate.unsqueeze(-2)).sum(-1) + load.sum(-1, keepdim=True)


def models():
    ids = torch.randint(-50, 50, (3, 7))  # negative ids count from the end, as in ONNX
    yield "embedding_pool", EmbeddingMeanPool(), {"ids": ids}
    logits = torch.randn(5, 10)
    target = torch.randint(0, 10, (5,))
    yield "target_log_prob", TargetLogProb(), {"logits": logits, "target": target}
    logits = torch.randn(4, 6, 3)
    target = torch.randint(0, 6, (4, 3))
    target[0, 0] = 2  # the ignored class
    yield "cross_entropy", CrossEntropy(), {"logits": logits, "target": target}
    x = torch.randn(3, 5, 8)
    h0 = torch.randn(4, 3, 16)
    c0 = torch.randn(4, 3, 16)
    yield "lstm", Lstm(), {"x": x, "h0": h0, "c0": c0}
    yield "gru", Gru(), {"x": torch.randn(6, 2, 8)}
    yield "tiny_lm", TinyLm(), {"ids": torch.randint(0, 64, (2, 8))}
    yield "moe", MoeTop2(), {"x": torch.randn(6, 8)}


def reference(model, inputs):
    """PyTorch's outputs in float64 (negative ids wrapped, which torch's own embedding
    refuses)."""
    model64 = model.double()
    args = [v.double() if v.is_floating_point() else v for v in inputs.values()]
    if isinstance(model, EmbeddingMeanPool):
        args = [torch.where(args[0] < 0, args[0] + 50, args[0])]
    with torch.no_grad():
        y = model64(*args)
    model.float()
    return y.float().numpy()


# The models whose gradients tests/onnx.rs checks against torch.autograd: with respect to every
# float input, and to the named parameters (ONNX initializers of the same names).
DIFFERENTIATED = {
    "lstm": [],
    "gru": [],
    "embedding_pool": ["emb.weight", "fc.weight", "fc.bias"],
    "target_log_prob": [],
    "cross_entropy": [],
    "moe": ["router.weight", "experts.1.weight"],
    "tiny_lm": ["tok.weight", "blocks.0.attn.out_proj.weight", "blocks.0.fc1.bias"],
}


def gradients(name, model, inputs, parameters):
    """d(sum(y * cotangent))/d(value) in float64 for every float input and every parameter in
    `parameters`, with the cotangent saved as <name>.cot.y.npy and each gradient as
    <name>.grad.<input or parameter>.npy."""
    model64 = model.double()
    args = [v.double().requires_grad_() if v.is_floating_point() else v for v in inputs.values()]
    if isinstance(model, EmbeddingMeanPool):
        args = [torch.where(args[0] < 0, args[0] + 50, args[0])]
    named = dict(model64.named_parameters())
    for p in named.values():
        p.grad = None
    y = model64(*args)
    cot = torch.randn(y.shape, dtype=torch.float64)
    np.save(os.path.join(out, f"{name}.cot.y.npy"), cot.float().numpy())
    (y * cot.float().double()).sum().backward()
    for key, arg in zip(inputs, args):
        if arg.is_floating_point():
            np.save(os.path.join(out, f"{name}.grad.{key}.npy"), arg.grad.float().numpy())
    for key in parameters:
        np.save(os.path.join(out, f"{name}.grad.{key}.npy"), named[key].grad.float().numpy())
    model.float()


for name, model, inputs in models():
    model.eval()
    want = reference(model, inputs)
    if name in DIFFERENTIATED:
        gradients(name, model, inputs, DIFFERENTIATED[name])
    for key, value in inputs.items():
        np.save(os.path.join(out, f"{name}.in.{key}.npy"), value.numpy())
    np.save(os.path.join(out, f"{name}.out.0.npy"), want)
    args = tuple(inputs.values())
    names = list(inputs)
    # Exported on non-negative ids: torch's own embedding refuses negative ones while tracing.
    traced = tuple(torch.where(a < 0, a + 50, a) if a.dtype == torch.int64 and name == "embedding_pool" else a for a in args)
    torch.onnx.export(model, traced, os.path.join(out, f"{name}.ts.onnx"), dynamo=False,
                      opset_version=17, input_names=names, output_names=["y"])
    torch.onnx.export(model, traced, os.path.join(out, f"{name}.dynamo.onnx"), dynamo=True,
                      input_names=names, output_names=["y"], external_data=False)
