"""Exports small PyTorch models with dynamic axes (a batch, and a sequence where the model has
one) by both of PyTorch's exporters, and records PyTorch's outputs at two sizes of those axes
(computed in float64, rounded to float32), for tests/onnx.rs's symbolic-shape tests.

Usage: python3 torch_dynamic.py DIR (needs torch, onnx and onnxscript; reuses the modules of
torch_models.py). Writes DIR/<model>.<exporter>.onnx and, for each size k of the two,
DIR/<model>.<k>.in.<input>.npy and DIR/<model>.<k>.out.0.npy.
"""
import os
import sys

import numpy as np
import torch

sys.argv, out = sys.argv[:1] + ["/dev/null"], sys.argv[1]
# torch_models.py exports when run as a script; only its modules are wanted here.
import importlib.util

spec = importlib.util.spec_from_file_location(
    "torch_models_modules", os.path.join(os.path.dirname(__file__), "torch_models.py"))
source = open(spec.origin).read().split("\nfor name, model, inputs in models():")[0]
modules = {}
exec(compile(source, spec.origin, "exec"), modules)
torch.manual_seed(11)


class Mlp(torch.nn.Module):
    """Two Linear layers with a GELU between: every PyTorch MLP's shape."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(12, 32), torch.nn.Linear(32, 5)

    def forward(self, x):
        return self.fc2(torch.nn.functional.gelu(self.fc1(x)))


class RmsNorm(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(d) + 0.5)

    def forward(self, x):
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * self.weight


class LlamaBlock(torch.nn.Module):
    """A Llama-style block: RMSNorm, causal self-attention without biases, RMSNorm, SwiGLU."""

    def __init__(self, d=16, heads=2, hidden=40):
        super().__init__()
        self.heads = heads
        self.n1, self.n2 = RmsNorm(d), RmsNorm(d)
        self.qkv = torch.nn.Linear(d, 3 * d, bias=False)
        self.o = torch.nn.Linear(d, d, bias=False)
        self.gate = torch.nn.Linear(d, hidden, bias=False)
        self.up = torch.nn.Linear(d, hidden, bias=False)
        self.down = torch.nn.Linear(hidden, d, bias=False)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.n1(x)).split(d, dim=-1)
        split = lambda y: y.reshape(b, t, self.heads, d // self.heads).transpose(1, 2)
        q, k, v = split(q), split(k), split(v)
        s = q @ k.transpose(-2, -1) / (d // self.heads) ** 0.5
        causal = torch.ones(t, t, dtype=torch.bool).triu(1)
        a = torch.softmax(s.masked_fill(causal, float("-inf")), dim=-1) @ v
        x = x + self.o(a.transpose(1, 2).reshape(b, t, d))
        h = self.n2(x)
        return x + self.down(torch.nn.functional.silu(self.gate(h)) * self.up(h))


def models():
    """(name, module, inputs at each of two sizes, dynamic axes by input name)."""
    mlp = Mlp()
    yield "mlp", mlp, [{"x": torch.randn(3, 12)}, {"x": torch.randn(7, 12)}], {"x": {0: "batch"}}
    pool = modules["EmbeddingMeanPool"]()
    yield ("embedding_pool", pool,
           [{"ids": torch.randint(0, 50, (2, 5))}, {"ids": torch.randint(0, 50, (4, 9))}],
           {"ids": {0: "batch", 1: "seq"}})
    lm = modules["TinyLm"]()
    yield ("tiny_lm", lm,
           [{"ids": torch.randint(0, 64, (2, 5))}, {"ids": torch.randint(0, 64, (3, 7))}],
           {"ids": {0: "batch", 1: "seq"}})
    gru = modules["Gru"]()
    yield "gru", gru, [{"x": torch.randn(4, 2, 8)}, {"x": torch.randn(6, 3, 8)}], {"x": {0: "seq", 1: "batch"}}
    llama = LlamaBlock()
    yield ("llama_block", llama,
           [{"x": torch.randn(2, 5, 16)}, {"x": torch.randn(3, 9, 16)}],
           {"x": {0: "batch", 1: "seq"}})


def reference(model, inputs):
    model64 = model.double()
    args = [v.double() if v.is_floating_point() else v for v in inputs.values()]
    with torch.no_grad():
        y = model64(*args)
    model.float()
    return y.float().numpy()


for name, model, sizes, axes in models():
    model.eval()
    for k, inputs in enumerate(sizes):
        for key, value in inputs.items():
            np.save(os.path.join(out, f"{name}.{k}.in.{key}.npy"), value.numpy())
        np.save(os.path.join(out, f"{name}.{k}.out.0.npy"), reference(model, inputs))
    args = tuple(sizes[0].values())
    names = list(sizes[0])
    torch.onnx.export(model, args, os.path.join(out, f"{name}.ts.onnx"), dynamo=False,
                      opset_version=17, input_names=names, output_names=["y"],
                      dynamic_axes=axes)
    dims = {}
    shapes = {}
    for input_name, by_axis in axes.items():
        shapes[input_name] = {}
        for axis, dim in by_axis.items():
            if dim not in dims:
                dims[dim] = torch.export.Dim(dim, min=2, max=64)
            shapes[input_name][axis] = dims[dim]
    torch.onnx.export(model, args, os.path.join(out, f"{name}.dynamo.onnx"), dynamo=True,
                      input_names=names, output_names=["y"], external_data=False,
                      dynamic_shapes=shapes)
