#!/usr/bin/env python3
"""Convolutional networks on the CPU, side by side in one sitting.

Models (PyTorch modules in eval mode, exported by the TorchScript exporter with their batch
norms kept as `BatchNormalization` nodes):

  * `resnet_block`: a ResNet basic block, conv3x3-bn-relu, conv3x3-bn, residual add, relu, on
    [8, 64, 56, 56] (ResNet-18's first stage);
  * `downsample`: a strided block, conv3x3 stride 2 (64 -> 128 channels) + bn + relu, on
    [8, 64, 56, 56];
  * `small_cnn`: conv-bn-relu-maxpool twice (3 -> 32 -> 64 channels), global average pool and
    a Linear, on [32, 3, 64, 64].

For each, alternating rounds time:

  * fusebox: `fusebox bench MODEL.onnx --backend cpu` (median over --iters runs);
  * before: the same with another build (--before), to show what a change did;
  * torch eager: the module under `torch.no_grad()` on --threads threads (mkldnn's direct
    convolutions);
  * torch.compile: the module compiled by Inductor (its default backend), and, where the
    fusebox package is importable, by `backend="fusebox"` (the same kernels as `fusebox
    bench`, called from PyTorch: the difference is the backend's glue and its partition);
  * GEMM floor: `torch.matmul` of the products the model's convolutions are (each conv's
    weight [M, C·k·k] times a materialized im2col matrix [N, C·k·k, P]): the arithmetic the
    model cannot avoid, at the peer's GEMM rate, measured in the same run.

Before timing, fusebox's output (CPU backend) is compared with torch's in float64.

    /work/peers-venv/bin/python benches/conv.py --fusebox target/release/fusebox \
        --before /tmp/head-target/release/fusebox
"""
import argparse, json, os, statistics, subprocess, tempfile, time

import numpy as np
import torch
import torch.nn as nn


class ResnetBlock(nn.Module):
    def __init__(self, c=64):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + x)


class Downsample(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(64, 128, 3, stride=2, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(128)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


class SmallCnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2))
        self.fc = nn.Linear(64, 10)

    def forward(self, x):
        return self.fc(self.features(x).mean((2, 3)))


def randomize(model):
    """Batch-norm statistics and affine parameters away from 0 and 1, so a wrong fold shows."""
    g = torch.Generator().manual_seed(0)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.1)
            m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
            m.weight.data.copy_(torch.rand(m.num_features, generator=g) + 0.5)
            m.bias.data.copy_(torch.randn(m.num_features, generator=g) * 0.1)
    return model.eval()


# (name, module, input shape, the convs as (N, M, C·k·k, P) products)
MODELS = [
    ("resnet_block", ResnetBlock, (8, 64, 56, 56), [(8, 64, 576, 3136)] * 2),
    ("downsample", Downsample, (8, 64, 56, 56), [(8, 128, 576, 784)]),
    ("small_cnn", SmallCnn, (32, 3, 64, 64), [(32, 32, 27, 4096), (32, 64, 288, 1024)]),
]


def export(model, x, tmp, name):
    """`model` on input `x` exported to `tmp/name.onnx` (TorchScript exporter, batch norms
    kept), with `x` and the model's weights saved as .npy files: the path, x's file, and
    every input's file by name (the `--input` values of `fusebox bench`)."""
    import onnx
    from onnx import numpy_helper

    path = os.path.join(tmp, f"{name}.onnx")
    torch.onnx.export(model, (x,), path, dynamo=False, opset_version=17,
                      input_names=["x"], training=torch.onnx.TrainingMode.EVAL,
                      do_constant_folding=False)
    xfile = os.path.join(tmp, f"{name}.x.npy")
    np.save(xfile, x.numpy())
    # `fusebox bench` times seeded random values for every input it is not given, weights
    # included; the model's own weights are given, since the time depends on them (a max
    # pool's comparisons branch on the values: random weights ran the small CNN at 10.4 ms,
    # its own at 15.3).
    given = {"x": xfile}
    for k, t in enumerate(onnx.load(path).graph.initializer):
        wfile = os.path.join(tmp, f"{name}.w{k}.npy")
        np.save(wfile, numpy_helper.to_array(t))
        given[t.name] = wfile
    return path, xfile, given


def bench(fusebox, path, iters, inputs):
    cmd = [fusebox, "bench", path, "--backend", "cpu", "--iters", str(iters), "--json"]
    for k, v in inputs.items():
        cmd += ["--input", f"{k}={v}"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)["median_ms"]


def median_ms(f, iters):
    times = []
    with torch.no_grad():
        for i in range(iters + 3):
            s = time.perf_counter()
            f()
            e = time.perf_counter()
            if i >= 3:  # after 3 warm-up calls
                times.append((e - s) * 1e3)
    return statistics.median(times)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--fusebox", default="target/release/fusebox")
    p.add_argument("--before", help="another fusebox build to time beside it")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--models", default=",".join(m[0] for m in MODELS))
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    tmp = tempfile.mkdtemp()
    builds = {"fusebox": args.fusebox}
    if args.before:
        builds["before"] = args.before
    print(f"threads {args.threads}, torch {torch.__version__}, load {os.getloadavg()[0]:.2f}")
    head = "".join(f"{k + ' ms':>12}" for k in builds)
    try:
        import fusebox.torch  # noqa: F401  (registers the backend)

        backends = ["inductor", "tc-fusebox"]
    except ImportError:
        backends = ["inductor"]
    compiled_head = "".join(f"{b + ' ms':>18}" for b in backends)
    print(f"model         {head}  torch ms{compiled_head}  gemm floor ms  fusebox/torch  fusebox/inductor  max abs err")
    for name, cls, shape, products in MODELS:
        if name not in args.models.split(","):
            continue
        torch.manual_seed(0)
        model = randomize(cls())
        x = torch.randn(shape)
        path, xfile, given = export(model, x, tmp, name)
        out = os.path.join(tmp, f"{name}.out")
        subprocess.run([args.fusebox, "run", path, "--backend", "cpu", "--input", f"x={xfile}",
                        "--out", out], check=True, capture_output=True)
        got = np.load(os.path.join(out, os.listdir(out)[0])).astype(np.float64)
        with torch.no_grad():
            want = model.double()(x.double()).numpy()
        model.float()
        err = np.max(np.abs(got - want))
        operands = [(torch.randn(m, k), torch.randn(n, k, q)) for n, m, k, q in products]

        def floor():
            for w, cols in operands:
                torch.matmul(w, cols)

        compiled = {}
        for b in backends:
            torch._dynamo.reset()
            compiled[b] = torch.compile(model, backend="fusebox") if b == "tc-fusebox" else torch.compile(model)
            with torch.no_grad():
                compiled[b](x)  # compile before timing
                torch.testing.assert_close(compiled[b](x), model(x), rtol=1e-4, atol=1e-4)
        rounds = {k: [] for k in list(builds) + ["torch", "floor"] + backends}
        for _ in range(args.rounds):
            for k, exe in builds.items():
                rounds[k].append(bench(exe, path, args.iters, given))
            rounds["torch"].append(median_ms(lambda: model(x), args.iters))
            for b in backends:
                rounds[b].append(median_ms(lambda: compiled[b](x), args.iters))
            rounds["floor"].append(median_ms(floor, args.iters))
        med = {k: statistics.median(r) for k, r in rounds.items()}
        cols = "".join(f"{med[k]:12.3f}" for k in builds)
        tcs = "".join(f"{med[b]:18.3f}" for b in backends)
        print(f"{name:13s}{cols} {med['torch']:9.3f}{tcs} {med['floor']:14.3f}"
              f"   {med['fusebox'] / med['torch']:12.2f}  {med['fusebox'] / med['inductor']:16.2f}  {err:.1e}")


if __name__ == "__main__":
    main()
