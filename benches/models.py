#!/usr/bin/env python3
"""Models people bring, exported from PyTorch, timed by fusebox beside torch eager in one run.

For each model (an MLP of Linear layers, a GPT-2-style block, a Llama-style block with RMSNorm
and SwiGLU), this script exports it to ONNX with the TorchScript exporter (and, with
--dynamo, the dynamo exporter as well), then in one sitting, alternating:

  * torch eager under torch.no_grad() on --threads threads: median of --iters timed calls after
    warm-up;
  * `fusebox bench MODEL.onnx --backend cpu --json` (its median per run, excluding compilation);

and prints the medians and fusebox / torch (issue 42's target: at most 0.8); with --baseline,
an older fusebox binary is timed on the same files in the same sitting. Before timing, the
model is run once by `fusebox run --backend cpu` on the same input and compared with torch's
output, so no wrong answer is timed. Needs torch (and onnxscript for --dynamo):

    /work/peers-venv/bin/python benches/models.py --fusebox target/release/fusebox
"""
import argparse, json, os, statistics, subprocess, sys, tempfile, time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
    def __init__(self, d=768, hidden=3072):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, hidden), nn.Linear(hidden, d)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class Gpt2Block(nn.Module):
    def __init__(self, d=768, heads=12):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj, self.mlp, self.heads = nn.Linear(d, 3 * d), nn.Linear(d, d), MLP(d), heads

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        split = lambda y: y.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        q, k, v = split(q), split(k), split(v)
        a = torch.softmax(q @ k.transpose(-2, -1) / (d // self.heads) ** 0.5, dim=-1) @ v
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class RmsNorm(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * self.weight


class LlamaMlp(nn.Module):
    def __init__(self, d=768, hidden=2048):
        super().__init__()
        self.norm = RmsNorm(d)
        self.gate, self.up, self.down = nn.Linear(d, hidden, bias=False), nn.Linear(d, hidden, bias=False), nn.Linear(hidden, d, bias=False)

    def forward(self, x):
        h = self.norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


MODELS = {
    "mlp": (MLP, (256, 768)),
    "gpt2_block": (Gpt2Block, (1, 128, 768)),
    "llama_mlp": (LlamaMlp, (1, 128, 768)),
}


def export(model, x, path, dynamo):
    with torch.no_grad():
        torch.onnx.export(model, (x,), path, dynamo=dynamo, input_names=["x"], output_names=["y"])


def torch_median(model, x, iters):
    with torch.no_grad():
        for _ in range(3):
            model(x)
        times = []
        for _ in range(iters):
            t = time.perf_counter()
            model(x)
            times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def fusebox_median(fusebox, path, iters):
    out = subprocess.run([fusebox, "bench", path, "--backend", "cpu", "--iters", str(iters), "--json"],
                         check=True, capture_output=True, text=True).stdout
    report = json.loads(out)
    return report["median_ms"], report.get("kernels")


def fusebox_agrees(fusebox, path, x, want, tmp):
    np.save(os.path.join(tmp, "x.npy"), x.numpy())
    out_dir = os.path.join(tmp, "out")
    subprocess.run([fusebox, "run", path, "--backend", "cpu", "--input", f"x={tmp}/x.npy", "--out", out_dir],
                   check=True, capture_output=True, text=True)
    got = np.load(os.path.join(out_dir, "y.npy"))
    return float(np.max(np.abs(got - want.numpy())) / (np.max(np.abs(want.numpy())) + 1e-30))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--fusebox", default="target/release/fusebox")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--dynamo", action="store_true", help="also export with the dynamo exporter")
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--baseline", help="another fusebox binary (an older build) timed in the same sitting")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    exporters = [("torchscript", False)] + ([("dynamo", True)] if args.dynamo else [])
    print(f"threads {args.threads}, torch {torch.__version__}, load {os.getloadavg()[0]:.2f}")
    base_head = f" {'baseline ms':>11} {'ratio':>6}" if args.baseline else ""
    print(f"{'model':<12} {'exporter':<12} {'torch ms':>9} {'fusebox ms':>11} {'ratio':>6}{base_head}  kernels  max rel err")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            cls, shape = MODELS[name]
            model = cls().eval()
            x = torch.randn(*shape)
            with torch.no_grad():
                want = model(x)
            for exporter, dynamo in exporters:
                path = os.path.join(tmp, f"{name}_{exporter}.onnx")
                try:
                    export(model, x, path, dynamo)
                    err = fusebox_agrees(args.fusebox, path, x, want, tmp)
                    fb, kernels = fusebox_median(args.fusebox, path, args.iters)
                except Exception as e:  # noqa: BLE001 - a failure is a row of the table
                    msg = getattr(e, "stderr", None) or str(e)
                    print(f"{name:<12} {exporter:<12} failed: {msg.strip().splitlines()[-1][:100]}")
                    continue
                th = torch_median(model, x, args.iters)
                base = ""
                if args.baseline:
                    bl, _ = fusebox_median(args.baseline, path, args.iters)
                    base = f" {bl:11.3f} {bl / th:6.2f}"
                print(f"{name:<12} {exporter:<12} {th:9.3f} {fb:11.3f} {fb / th:6.2f}{base}  {kernels!s:>7}  {err:.2e}")


if __name__ == "__main__":
    sys.exit(main())
