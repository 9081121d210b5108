#!/usr/bin/env python3
"""Convolutional networks on an NVIDIA GPU, side by side in one sitting.

The models of `benches/conv.py` (a ResNet basic block, a strided conv-bn-relu, a small CNN
classifier; PyTorch modules in eval mode exported by the TorchScript exporter with their batch
norms kept), at --batch images. For each, in f32 and under bf16 autocast / `--amp bf16`:

  * fusebox: `fusebox bench MODEL.onnx --backend cuda` (convolutions through cuDNN), with and
    without `--cuda-graph`;
  * im2col: the same with `--gemm-convolutions` (the im2col matrix gathered, then cuBLAS);
  * torch eager and torch.compile (Inductor, default mode) on the same module and input, both
    with TF32 off in f32 (`torch.backends.cudnn.allow_tf32 = False`, as fusebox runs f32 on
    FMA units), under `torch.autocast(dtype=torch.bfloat16)` in bf16, and the compiled
    module captured in a CUDA graph and replayed (`torch.cuda.CUDAGraph`: what
    `mode="reduce-overhead"` does, without its compile time), beside fusebox's `--cuda-graph`;

each time a median of CUDA-event-timed calls (fusebox's own `bench`, events around each run),
--rounds alternating rounds, the median of those. Before timing, fusebox's output on the GPU
(both convolution paths) is compared with PyTorch's in float64 on the CPU.

    python3 benches/gpu/conv_gpu.py --fusebox target/release/fusebox --batch 32

`--backend cpu` runs the same steps on the CPU (fusebox's CPU backend, torch on the CPU, the
CUDA-only variants left out), which is how the script is checked where no GPU is;
`--no-compile` leaves torch.compile out.
"""
import argparse, json, os, statistics, subprocess, sys, tempfile, time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from conv import MODELS, export, randomize  # noqa: E402


def bench(fusebox, backend, path, iters, given, extra):
    cmd = [fusebox, "bench", path, "--backend", backend, "--iters", str(iters), "--json"] + extra
    for k, v in given.items():
        cmd += ["--input", f"{k}={v}"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)["median_ms"]


def median_ms(f, iters, cuda):
    """Median of per-call times after warm-up: CUDA events on the GPU, the host clock else."""
    with torch.no_grad():
        for _ in range(3):
            f()
        if cuda:
            torch.cuda.synchronize()
        times = []
        for _ in range(iters):
            if not cuda:
                start = time.perf_counter()
                f()
                times.append((time.perf_counter() - start) * 1e3)
                continue
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            f()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    return statistics.median(times)


def graphed(f, ctx):
    """`f` captured in a CUDA graph under `ctx`, after warm-up on a side stream: its replay."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), ctx(), torch.no_grad():
        for _ in range(3):
            f()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), ctx(), torch.no_grad():
        f()
    return graph.replay


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--fusebox", default="target/release/fusebox")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--models", default=",".join(m[0] for m in MODELS))
    p.add_argument("--json", help="write the table here too")
    p.add_argument("--backend", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--no-compile", action="store_true")
    args = p.parse_args()
    cuda = args.backend == "cuda"
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.cuda.get_device_name() if cuda else "cpu"
    print(f"{dev}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, batch {args.batch}")
    tmp = tempfile.mkdtemp()
    rows = []
    print(f"{'model':13s} {'dtype':5s} {'fusebox':>9s} {'graph':>9s} {'im2col':>9s} {'eager':>9s} "
          f"{'compile':>9s} {'fb/eager':>9s} {'fb/compile':>10s} {'err cudnn':>10s} {'err im2col':>10s} "
          f"{'c+graph':>9s} {'graph/c+graph':>13s}")
    for name, cls, shape, _ in MODELS:
        if name not in args.models.split(","):
            continue
        torch.manual_seed(0)
        model = randomize(cls())
        shape = (args.batch,) + tuple(shape[1:])
        x = torch.randn(shape)
        path, xfile, given = export(model, x, tmp, name)
        with torch.no_grad():
            want = model.double()(x.double()).numpy()
        model.float()
        errs = {}
        for amp in [None, "bf16"]:
            for path_flag in [[], ["--gemm-convolutions"]]:
                out = os.path.join(tmp, f"{name}.{amp}.{len(path_flag)}.out")
                extra = (["--amp", amp] if amp else []) + path_flag
                if path_flag and not cuda:
                    continue
                subprocess.run([args.fusebox, "run", path, "--backend", args.backend, "--input",
                                f"x={xfile}", "--out", out] + extra, check=True, capture_output=True)
                got = np.load(os.path.join(out, os.listdir(out)[0])).astype(np.float64)
                errs[(amp, bool(path_flag))] = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
        errs.setdefault((None, True), float("nan"))
        errs.setdefault(("bf16", True), float("nan"))
        mc, xc = (model.cuda(), x.cuda()) if cuda else (model, x)
        compiled = mc if args.no_compile else torch.compile(mc)
        for amp in [None, "bf16"]:
            extra = ["--amp", amp] if amp else []
            ctx = (lambda: torch.autocast(args.backend, dtype=torch.bfloat16)) if amp else torch.no_grad
            with ctx(), torch.no_grad():
                compiled(xc)
            replay = graphed(lambda: compiled(xc), ctx) if cuda else None
            times = {k: [] for k in ["fusebox", "graph", "im2col", "eager", "compile", "c+graph"]}
            for _ in range(args.rounds):
                run = lambda more: bench(args.fusebox, args.backend, path, args.iters, given, extra + more)
                times["fusebox"].append(run([]))
                times["graph"].append(run(["--cuda-graph"]) if cuda else times["fusebox"][-1])
                times["im2col"].append(run(["--gemm-convolutions"]) if cuda else times["fusebox"][-1])
                with ctx():
                    times["eager"].append(median_ms(lambda: mc(xc), args.iters, cuda))
                    times["compile"].append(median_ms(lambda: compiled(xc), args.iters, cuda))
                times["c+graph"].append(median_ms(replay, args.iters, cuda) if cuda else times["compile"][-1])
            med = {k: statistics.median(v) for k, v in times.items()}
            dtype = amp or "f32"
            best = min(med["fusebox"], med["graph"])
            print(f"{name:13s} {dtype:5s} {med['fusebox']:9.4f} {med['graph']:9.4f} {med['im2col']:9.4f} "
                  f"{med['eager']:9.4f} {med['compile']:9.4f} {best / med['eager']:9.2f} "
                  f"{best / med['compile']:10.2f} {errs[(amp, False)]:10.1e} {errs[(amp, True)]:10.1e} "
                  f"{med['c+graph']:9.4f} {med['graph'] / med['c+graph']:13.2f}", flush=True)
            rows.append({"model": name, "dtype": dtype, "batch": args.batch, "median_ms": med,
                         "rounds": times, "rel_err_cudnn": errs[(amp, False)],
                         "rel_err_im2col": errs[(amp, True)]})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": dev, "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
