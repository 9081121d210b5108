#!/usr/bin/env python3
"""Side-by-side GEMM throughput: torch.matmul, NumPy and fusebox's CPU backend, in one run.

For each shape of the model benchmarks (M tokens x K inputs x N outputs) and each input dtype
(f32, and bf16/f16 with f32 accumulation, the result rounded to the input dtype as torch does),
this times:

- torch:    torch.matmul on CPU with torch.set_num_threads(THREADS);
- numpy:    numpy.matmul (f32 only: NumPy has no bf16, and its f16 matmul is a scalar loop),
            its BLAS limited to the same thread count;
- fusebox:  `fusebox bench --backend cpu` of a one-matmul graph (the CPU backend's library
            matmul as a model runs it, compile excluded), OMP_NUM_THREADS=THREADS;
- baseline: the same with another fusebox binary (--baseline, e.g. one built before the emitted
            GEMM, whose library matmul is the `matrixmultiply` crate, MATMUL_NUM_THREADS=THREADS),
            when given.

Every figure is the median over --rounds rounds (the engines of a shape timed in turn, so a burst
of machine load hits them alike) of the median of --iters timed runs after warm-up runs;
GFLOP/s counts 2*M*N*K. On a busy machine run the whole script a few times and keep the median
run.

Usage (from the repository root, after `cargo build`):

    /work/peers-venv/bin/python benches/gemm.py [--fusebox target/debug/fusebox]
        [--baseline BIN] [--iters 15] [--rounds 3] [--threads 2] [--dtypes f32,bf16,f16]
        [--m 64,256,1024] [--kn 768:768,4096:1024]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

# NumPy's BLAS threads are fixed when it is imported: the same count as everyone else's.
for _var in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS"):
    os.environ.setdefault(_var, sys.argv[sys.argv.index("--threads") + 1] if "--threads" in sys.argv else "2")

SHAPES_KN = [(768, 768), (768, 3072), (3072, 768), (1024, 1024), (4096, 1024)]


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def time_call(fn, iters, warmup=3):
    start = time.perf_counter()
    fn()
    if time.perf_counter() - start > 0.2:
        # A slow path (torch's f16 matmul on a CPU without AVX-512 FP16): fewer runs.
        warmup, iters = 0, min(iters, 3)
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return median(times)


def graph_source(m, k, n, dtype):
    return f"""Graph(
    name: "gemm_{m}x{k}x{n}_{dtype}",
    inputs: [
        Input(name: "a", dtype: "{dtype}", shape: [{m}, {k}]),
        Input(name: "b", dtype: "{dtype}", shape: [{k}, {n}]),
    ],
    nodes: [Node(name: "c", op: "matmul", args: ["a", "b"])],
    outputs: ["c"],
)
"""


def fusebox_ms(binary, path, iters, threads):
    # OpenMP's threads for the emitted GEMM, matrixmultiply's own for the baseline binary.
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MATMUL_NUM_THREADS=str(threads))
    out = subprocess.run(
        [binary, "bench", "--backend", "cpu", "--json", "--iters", str(iters), path],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    )
    return json.loads(out.stdout)["median_ms"]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--fusebox", default="target/debug/fusebox")
    p.add_argument("--baseline", default=None, help="another fusebox binary to time alongside")
    p.add_argument("--iters", type=int, default=15)
    p.add_argument("--rounds", type=int, default=3, help="engines timed in turn this many times")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--dtypes", default="f32,bf16,f16")
    p.add_argument("--m", default="64,256,1024")
    p.add_argument("--kn", default=None, help="K:N pairs, e.g. 768:768,4096:1024")
    p.add_argument("--no-numpy", action="store_true")
    args = p.parse_args()

    import numpy as np
    import torch

    torch.set_num_threads(args.threads)
    tdtype = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
    shapes_kn = (
        [tuple(int(x) for x in s.split(":")) for s in args.kn.split(",")] if args.kn else SHAPES_KN
    )
    ms = [int(x) for x in args.m.split(",")]
    dtypes = args.dtypes.split(",")

    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    print(f"# torch {torch.__version__}, numpy {np.__version__}, threads {args.threads}, "
          f"iters {args.iters}, rounds {args.rounds}, load average {' '.join(load)}")
    cols = ["dtype", "M", "K", "N", "torch", "numpy", "baseline", "fusebox", "fusebox/torch"]
    if args.baseline:
        cols.insert(-1, "baseline/torch")
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    ratios = {d: [] for d in dtypes}
    with tempfile.TemporaryDirectory() as tmp:
        for dtype in dtypes:
            for m in ms:
                for k, n in shapes_kn:
                    flops = 2.0 * m * n * k
                    gf = lambda t_ms: flops / (t_ms * 1e-3) / 1e9  # noqa: E731
                    a = torch.randn(m, k).to(tdtype[dtype])
                    b = torch.randn(k, n).to(tdtype[dtype])
                    an, bn = a.float().numpy(), b.float().numpy()
                    path = os.path.join(tmp, f"g_{m}_{k}_{n}_{dtype}.ron")
                    with open(path, "w") as f:
                        f.write(graph_source(m, k, n, dtype))
                    # Rounds of every engine in turn, each round's medians kept: a burst of
                    # load on the machine then hits all engines, not one.
                    runs = {"torch": [], "numpy": [], "base": [], "fb": []}
                    for _ in range(args.rounds):
                        runs["torch"].append(time_call(lambda: torch.matmul(a, b), args.iters))
                        if dtype == "f32" and not args.no_numpy:
                            runs["numpy"].append(time_call(lambda: np.matmul(an, bn), args.iters))
                        if args.baseline:
                            runs["base"].append(fusebox_ms(args.baseline, path, args.iters, args.threads))
                        runs["fb"].append(fusebox_ms(args.fusebox, path, args.iters, args.threads))
                    pick = lambda xs: median(xs) if xs else None  # noqa: E731
                    t_torch, t_numpy, t_base, t_fb = (pick(runs[e]) for e in ("torch", "numpy", "base", "fb"))
                    fmt = lambda t: f"{gf(t):.1f}" if t else "-"  # noqa: E731
                    row = [dtype, m, k, n, fmt(t_torch), fmt(t_numpy), fmt(t_base), fmt(t_fb)]
                    if args.baseline:
                        row.append(f"{t_torch / t_base:.2f}")
                    row.append(f"{t_torch / t_fb:.2f}")
                    ratios[dtype].append(t_torch / t_fb)
                    print("| " + " | ".join(str(x) for x in row) + " |", flush=True)
    for dtype, rs in ratios.items():
        if rs:
            geo = 1.0
            for r in rs:
                geo *= r
            geo **= 1.0 / len(rs)
            print(f"# {dtype}: fusebox/torch throughput, geometric mean {geo:.2f}, "
                  f"min {min(rs):.2f}, max {max(rs):.2f}")
    print("# figures: GFLOP/s (2*M*N*K / median time); ratios: torch time / fusebox time")


if __name__ == "__main__":
    sys.exit(main())
