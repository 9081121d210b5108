"""Exports the small convolutional PyTorch models of tests/onnx.rs by both of PyTorch's
exporters, and records their inputs and PyTorch's outputs (computed in float64 and rounded to
float32), and for each a cotangent and torch.autograd's gradients in float64.

Usage: python3 torch_cnn.py DIR (needs torch, onnx and onnxscript). Writes
DIR/<model>.<exporter>.onnx (`ts`: TorchScript, opset 17; `dynamo`: the default opset),
DIR/<model>.in.x.npy, DIR/<model>.out.0.npy, DIR/<model>.cot.y.npy and
DIR/<model>.grad.<x or parameter>.npy. The models are in eval mode: batch norm uses its
running statistics (set to values far from 0 and 1 here).
"""
import os
import sys

import numpy as np
import torch
from torch import nn

out = sys.argv[1]
torch.manual_seed(11)


def randomize(bn):
    """Running statistics and an affine map that make a batch norm do something."""
    with torch.no_grad():
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 2.0)
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-0.3, 0.3)
    return bn


class SmallCnn(nn.Module):
    """Conv-BN-ReLU, a 2x2 max pool, a strided conv without bias, BN-ReLU, a global average
    pool and a Linear: a small image classifier."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = randomize(nn.BatchNorm2d(8))
        self.pool = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(8, 16, 3, stride=2, padding=1, bias=False)
        self.bn2 = randomize(nn.BatchNorm2d(16))
        self.fc = nn.Linear(16, 5)

    def forward(self, x):
        x = self.pool(torch.relu(self.bn1(self.conv1(x))))
        x = torch.relu(self.bn2(self.conv2(x)))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


class ResidualBlock(nn.Module):
    """A ResNet basic block: conv3x3-BN-ReLU, conv3x3-BN, plus the input, ReLU."""

    def __init__(self, c=8):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = randomize(nn.BatchNorm2d(c))
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = randomize(nn.BatchNorm2d(c))

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + x)


class OddConvs(nn.Module):
    """A grouped, dilated conv with asymmetric strides, a depthwise conv, and an average pool
    with ceil_mode that leaves the padding out of its counts; then a 1-D conv over the
    flattened rows."""

    def __init__(self):
        super().__init__()
        self.grouped = nn.Conv2d(4, 6, (3, 2), stride=(1, 2), padding=(2, 1), dilation=2, groups=2)
        self.depthwise = nn.Conv2d(6, 6, 3, padding=1, groups=6)
        self.pool = nn.AvgPool2d(3, stride=2, padding=1, ceil_mode=True, count_include_pad=False)
        self.line = nn.Conv1d(6, 3, 5, padding=2)

    def forward(self, x):
        x = self.pool(torch.tanh(self.depthwise(self.grouped(x))))
        return self.line(torch.flatten(x, 2))


class NormsAndPads(nn.Module):
    """A conv with reflect padding (exported as Pad then Conv), InstanceNorm2d with affine
    parameters, a replicate-padded conv, GroupNorm(2 groups), and a constant F.pad."""

    def __init__(self):
        super().__init__()
        self.reflect = nn.Conv2d(4, 6, 3, padding=1, padding_mode="reflect")
        self.instance = nn.InstanceNorm2d(6, affine=True)
        self.replicate = nn.Conv2d(6, 4, 3, padding=2, padding_mode="replicate")
        self.group = nn.GroupNorm(2, 4)
        with torch.no_grad():
            self.instance.weight.uniform_(0.5, 1.5)
            self.instance.bias.uniform_(-0.3, 0.3)
            self.group.weight.uniform_(0.5, 1.5)
            self.group.bias.uniform_(-0.3, 0.3)

    def forward(self, x):
        x = torch.relu(self.instance(self.reflect(x)))
        x = self.group(self.replicate(x))
        return nn.functional.pad(x, (1, 2, 0, 1), value=0.25)


class Decoder(nn.Module):
    """Transposed convolutions as decoders use them: a 2x upsampling (kernel 4, stride 2,
    padding 1) with batch norm and ReLU, a grouped, dilated one with output_padding and
    asymmetric strides, and a 1-D one over the flattened rows."""

    def __init__(self):
        super().__init__()
        self.up = nn.ConvTranspose2d(6, 4, 4, stride=2, padding=1)
        self.bn = randomize(nn.BatchNorm2d(4))
        self.grouped = nn.ConvTranspose2d(4, 6, (3, 2), stride=(2, 3), padding=(2, 0),
                                          output_padding=(1, 2), dilation=(2, 1), groups=2)
        self.line = nn.ConvTranspose1d(6, 2, 3, stride=2, bias=False)

    def forward(self, x):
        x = torch.relu(self.bn(self.up(x)))
        x = torch.tanh(self.grouped(x))
        return self.line(torch.flatten(x, 2)[..., :40])


class Upsample(nn.Module):
    """Resizes as segmentation and detection heads use them: nearest 2x, bilinear to sizes
    with and without align_corners and by a fractional scale, bicubic; a conv between."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        f = nn.functional
        x = f.interpolate(x, scale_factor=2, mode="nearest")
        x = torch.tanh(self.conv(x))
        a = f.interpolate(x, size=(13, 9), mode="bilinear", align_corners=False)
        # align_corners with a fractional scale_factor is left out: PyTorch maps positions
        # by the rounded output size, ONNX's definition by scale times the input size.
        b = f.interpolate(a, size=(9, 6), mode="bilinear", align_corners=True)
        c = f.interpolate(b, scale_factor=0.75, mode="bilinear", align_corners=False)
        return f.interpolate(c, size=(11, 8), mode="bicubic", align_corners=False)


def models():
    yield "cnn", SmallCnn(), torch.randn(2, 3, 16, 16), ["conv1.weight", "bn2.weight", "fc.weight"]
    yield "resnet_block", ResidualBlock(), torch.randn(2, 8, 12, 12), ["conv1.weight", "bn1.bias", "conv2.weight"]
    yield "odd_convs", OddConvs(), torch.randn(2, 4, 11, 9), ["grouped.weight", "depthwise.bias", "line.weight"]
    yield "norms_pads", NormsAndPads(), torch.randn(2, 4, 7, 6), ["reflect.weight", "instance.weight", "group.bias"]
    yield "decoder", Decoder(), torch.randn(2, 6, 5, 4), ["up.weight", "grouped.weight", "grouped.bias", "line.weight"]
    yield "upsample", Upsample(), torch.randn(2, 3, 5, 4), ["conv.weight", "conv.bias"]


for name, model, x, parameters in models():
    model.eval()
    model64 = model.double()
    x64 = x.double().requires_grad_()
    y = model64(x64)
    cot = torch.randn(y.shape, dtype=torch.float64).float().double()
    (y * cot).sum().backward()
    np.save(os.path.join(out, f"{name}.in.x.npy"), x.numpy())
    np.save(os.path.join(out, f"{name}.out.0.npy"), y.detach().float().numpy())
    np.save(os.path.join(out, f"{name}.cot.y.npy"), cot.float().numpy())
    np.save(os.path.join(out, f"{name}.grad.x.npy"), x64.grad.float().numpy())
    named = dict(model64.named_parameters())
    for key in parameters:
        np.save(os.path.join(out, f"{name}.grad.{key}.npy"), named[key].grad.float().numpy())
    model.float()
    for p in model.parameters():
        p.grad = None
    # Batch norm kept as its own op: the TorchScript exporter would otherwise fold it into
    # the conv's weights (and rename them), which fusebox's rules should do, not the exporter.
    torch.onnx.export(model, (x,), os.path.join(out, f"{name}.ts.onnx"), dynamo=False,
                      opset_version=17, input_names=["x"], output_names=["y"],
                      training=torch.onnx.TrainingMode.PRESERVE, do_constant_folding=False)
    torch.onnx.export(model, (x,), os.path.join(out, f"{name}.dynamo.onnx"), dynamo=True,
                      input_names=["x"], output_names=["y"], external_data=False)
