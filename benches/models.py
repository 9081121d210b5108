#!/usr/bin/env python3
"""Models people bring, exported from PyTorch, timed by fusebox beside torch eager in one run.

For each model (an MLP of Linear layers, a GPT-2-style block, a BERT-style encoder layer,
`nn.TransformerEncoderLayer`, a Llama-style block with RMSNorm and SwiGLU, `nn.LSTM` and
`nn.GRU` over 32 steps, a small GPT-style language model from token ids), this script exports it to ONNX with the TorchScript exporter (and, with
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


class BertLayer(nn.Module):
    """A BERT encoder layer written out (post-norm: attention, add and LayerNorm, then a GELU
    MLP, add and LayerNorm), as Hugging Face's BertLayer computes it without a mask."""

    def __init__(self, d=768, heads=12):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.ln1, self.ln2, self.mlp, self.heads = nn.LayerNorm(d), nn.LayerNorm(d), MLP(d), heads

    def forward(self, x):
        b, t, d = x.shape
        split = lambda y: y.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        a = torch.softmax(q @ k.transpose(-2, -1) / (d // self.heads) ** 0.5, dim=-1) @ v
        x = self.ln1(x + self.o(a.transpose(1, 2).reshape(b, t, d)))
        return self.ln2(x + self.mlp(x))


def encoder_layer():
    """`nn.TransformerEncoderLayer` (post-norm, ReLU, batch first), exported with PyTorch's
    fused fast path off: in eval mode torch would otherwise call
    `aten::_transformer_encoder_layer_fwd`, which the TorchScript exporter refuses."""
    torch.backends.mha.set_fastpath_enabled(False)
    return nn.TransformerEncoderLayer(768, 12, 3072, dropout=0.0, batch_first=True)


class Recurrent(nn.Module):
    """`nn.LSTM` or `nn.GRU` over a batch of sequences (batch first): its outputs."""

    def __init__(self, kind, d=256):
        super().__init__()
        self.rnn = kind(d, d, batch_first=True)

    def forward(self, x):
        return self.rnn(x)[0]


class GptLm(nn.Module):
    """A small GPT-style language model from token ids: token and position embeddings, two
    pre-norm `nn.MultiheadAttention` blocks with causal masks, the vocabulary head."""

    def __init__(self, vocab=8192, d=256, context=128, heads=4):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(context, d)
        self.ln1 = nn.ModuleList([nn.LayerNorm(d) for _ in range(2)])
        self.ln2 = nn.ModuleList([nn.LayerNorm(d) for _ in range(2)])
        self.attn = nn.ModuleList([nn.MultiheadAttention(d, heads, batch_first=True) for _ in range(2)])
        self.mlp = nn.ModuleList([MLP(d, 4 * d) for _ in range(2)])
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)
        self.register_buffer("mask", torch.triu(torch.full((context, context), float("-inf")), 1))

    def forward(self, ids):
        t = ids.shape[1]
        x = self.tok(ids) + self.pos(torch.arange(t))
        for ln1, attn, ln2, mlp in zip(self.ln1, self.attn, self.ln2, self.mlp):
            a = ln1(x)
            x = x + attn(a, a, a, attn_mask=self.mask[:t, :t], need_weights=False)[0]
            x = x + mlp(ln2(x))
        return self.head(self.ln(x))


MODELS = {
    "mlp": (MLP, (256, 768)),
    "gpt2_block": (Gpt2Block, (1, 128, 768)),
    "bert_layer": (BertLayer, (1, 128, 768)),
    "encoder_layer": (encoder_layer, (1, 128, 768)),
    "llama_mlp": (LlamaMlp, (1, 128, 768)),
    "lstm": (lambda: Recurrent(nn.LSTM), (8, 32, 256)),
    "gru": (lambda: Recurrent(nn.GRU), (8, 32, 256)),
    "gpt_lm": (GptLm, lambda: torch.randint(0, 8192, (1, 128))),
}


def export(model, x, path, dynamo):
    with torch.no_grad():
        torch.onnx.export(model, (x,), path, dynamo=dynamo, input_names=["x"], output_names=["y"])


class busy_loop:
    """A competing process for the time of a `with` block: one Python interpreter spinning,
    which takes one core of the two, as another tenant of a shared machine would."""

    def __enter__(self):
        self.proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        time.sleep(0.5)
        return self

    def __exit__(self, *exc):
        self.proc.kill()
        self.proc.wait()


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
    p.add_argument("--busy", action="store_true",
                   help="time each model on a quiet machine and again beside a competing process "
                        "(a busy loop this script starts), and print how much each slows down")
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
            x = shape() if callable(shape) else torch.randn(*shape)
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
                if args.busy:
                    with busy_loop():
                        fb_busy, _ = fusebox_median(args.fusebox, path, args.iters)
                        th_busy = torch_median(model, x, args.iters)
                    print(f"{name:<12} {exporter:<12} quiet: torch {th:8.3f} fusebox {fb:8.3f}   "
                          f"busy: torch {th_busy:8.3f} ({th_busy / th:4.2f}x) "
                          f"fusebox {fb_busy:8.3f} ({fb_busy / fb:4.2f}x)   fusebox / torch busy {fb_busy / th_busy:4.2f}")
                    continue
                base = ""
                if args.baseline:
                    bl, _ = fusebox_median(args.baseline, path, args.iters)
                    base = f" {bl:11.3f} {bl / th:6.2f}"
                print(f"{name:<12} {exporter:<12} {th:9.3f} {fb:11.3f} {fb / th:6.2f}{base}  {kernels!s:>7}  {err:.2e}")


if __name__ == "__main__":
    sys.exit(main())
