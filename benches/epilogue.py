#!/usr/bin/env python3
"""GEMM epilogues on the CPU, side by side in one sitting.

For a `Linear` (`x @ w.T`, the weight stored [out, in] as PyTorch stores it) followed by a
tail, this script times, alternating rounds so that the shared machine's noise falls on all
of them alike:

  * floor:        `fusebox bench` of the product alone (`x @ w.T`, no tail): what the tail
                  costs on top of it is what an epilogue can save;
  * epilogue:     the product and its tail with the default rules (the tail runs on each tile
                  of the product inside the GEMM);
  * separate:     the same with `library_epilogues: false` (the tail is a kernel of its own
                  that reads the product back);
  * torch eager:  the same module in PyTorch on --threads threads (`F.linear`, then the tail).

Each entry is the median over --rounds rounds of each tool's own median over --iters runs.
Tails: `gelu` (bias + GELU + residual add, as in a transformer MLP) and `relu` (bias + ReLU).

    /work/peers-venv/bin/python benches/epilogue.py --fusebox target/release/fusebox
"""
import argparse, json, os, statistics, subprocess, sys, tempfile, time

import numpy as np

SHAPES = [(512, 768, 3072), (2048, 1024, 1024), (128, 4096, 4096)]
TAILS = {
    "gelu": ['Node(name: "yb", op: "add", args: ["y", "b"])',
             'Node(name: "g", op: "gelu", args: ["yb"])',
             'Node(name: "out", op: "add", args: ["g", "r"])'],
    "relu": ['Node(name: "yb", op: "add", args: ["y", "b"])',
             'Node(name: "out", op: "relu", args: ["yb"])'],
}


def graph(m, k, n, tail):
    inputs = [f'Input(name: "x", dtype: "f32", shape: [{m}, {k}])',
              f'Input(name: "w", dtype: "f32", shape: [{n}, {k}])']
    nodes = ['Node(name: "wt", op: "transpose", args: ["w"], attrs: {"perm": [1, 0]})',
             'Node(name: "y", op: "matmul", args: ["x", "wt"])']
    out = "y"
    if tail:
        inputs.append(f'Input(name: "b", dtype: "f32", shape: [{n}])')
        if tail == "gelu":
            inputs.append(f'Input(name: "r", dtype: "f32", shape: [{m}, {n}])')
        nodes += TAILS[tail]
        out = "out"
    return (f'Graph(name: "linear", inputs: [{", ".join(inputs)}], '
            f'nodes: [{", ".join(nodes)}], outputs: ["{out}"])')


def fusebox_ms(fusebox, path, iters, rules=None):
    cmd = [fusebox, "bench", path, "--backend", "cpu", "--iters", str(iters), "--json"]
    if rules:
        cmd += ["--rules", rules]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)["median_ms"]


def torch_ms(m, k, n, tail, iters, threads):
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(threads)
    x, w, b, r = (torch.randn(m, k), torch.randn(n, k), torch.randn(n), torch.randn(m, n))
    def run():
        y = F.linear(x, w, b)
        return F.gelu(y) + r if tail == "gelu" else torch.relu(y)
    times = []
    with torch.no_grad():
        for _ in range(3):
            run()
        for _ in range(iters):
            t = time.perf_counter()
            run()
            times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--fusebox", default="target/release/fusebox")
    p.add_argument("--rules-off", default="book/examples/gemm/no_epilogues",
                   help="rules directory with library_epilogues: false")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--no-torch", action="store_true")
    args = p.parse_args()
    print(f"threads {args.threads}, load {os.getloadavg()[0]:.2f}")
    print(f"{'m x k x n':<18} {'tail':<5} {'floor':>7} {'epilogue':>9} {'separate':>9} {'torch':>7}"
          f"  {'tail cost: epilogue':>19} {'separate':>9}")
    with tempfile.TemporaryDirectory() as tmp:
        for (m, k, n) in SHAPES:
            floor_path = os.path.join(tmp, f"mm_{m}_{k}_{n}.ron")
            open(floor_path, "w").write(graph(m, k, n, None))
            for tail in TAILS:
                path = os.path.join(tmp, f"{tail}_{m}_{k}_{n}.ron")
                open(path, "w").write(graph(m, k, n, tail))
                runs = {"floor": [], "epilogue": [], "separate": [], "torch": []}
                for _ in range(args.rounds):
                    runs["floor"].append(fusebox_ms(args.fusebox, floor_path, args.iters))
                    runs["epilogue"].append(fusebox_ms(args.fusebox, path, args.iters))
                    runs["separate"].append(fusebox_ms(args.fusebox, path, args.iters, args.rules_off))
                    if not args.no_torch:
                        runs["torch"].append(torch_ms(m, k, n, tail, args.iters, args.threads))
                med = {key: statistics.median(v) if v else float("nan") for key, v in runs.items()}
                print(f"{f'{m}x{k}x{n}':<18} {tail:<5} {med['floor']:7.3f} {med['epilogue']:9.3f} "
                      f"{med['separate']:9.3f} {med['torch']:7.3f}  "
                      f"{med['epilogue'] - med['floor']:19.3f} {med['separate'] - med['floor']:9.3f}")


if __name__ == "__main__":
    sys.exit(main())
