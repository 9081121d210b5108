#!/usr/bin/env python3
"""Column sums of growing size on the GPU, against the cost model's price for them: the
measurement behind the `reductions` of a profile in rules/cost.ron (`saturating_threads`).

A kernel whose reductions are not a row kernel's runs them in three launches (`_init`, the
pass, `_finish`), and the pass gives each output one thread per 64 reduced elements, up to
TARGET_THREADS (2^18) threads in all (src/backend/cuda/abi.rs, `group_shapes`). Summing the
columns of a [rows, cols] f32 matrix therefore runs cols * min(ceil(2^18 / cols),
ceil(rows / 64)) threads. For each size this prints the thread count, the CUDA-event median of
`fusebox bench --backend cuda` (plain runs and CUDA graph replays), the time a device-to-device
copy of the same bytes took in the same call, and the modeled cost of `fusebox optimize
--profile PROFILE`. `slowdown` is (median - launches x launch_us) over the copy time: what
`saturating_threads / threads` should reproduce where it exceeds 1.

    python3 benches/gpu/reduction_sweep.py --fusebox ./fusebox --iters 100
"""

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import graphs  # noqa: E402

TARGET_THREADS = 1 << 18
PER_THREAD = 64


def column_sum_graph(rows, cols, body):
    """Column sums of [rows, cols] f32: of `x` alone (`plain`), of `tanh(x)` (`tanh`), or of
    the sum of K inputs (`inputsK`), which moves K times the bytes over the same threads, as
    a backward kernel reading several saved activations does."""
    graph = {"name": f"colsum_{body}_{rows}x{cols}", "inputs": [], "nodes": [], "outputs": []}
    count = int(body[len("inputs"):]) if body.startswith("inputs") else 1
    for k in range(count):
        graph["inputs"].append({"name": f"x{k}", "dtype": "f32", "shape": [rows, cols]})
    source = "x0"
    for k in range(1, count):
        graph["nodes"].append({"name": f"a{k}", "op": "add", "args": [source, f"x{k}"], "attrs": {}})
        source = f"a{k}"
    if body == "tanh":
        graph["nodes"].append({"name": "t", "op": "tanh", "args": [source], "attrs": {}})
        source = "t"
    elif body != "plain" and count == 1 and body != "inputs1":
        raise SystemExit(f"unknown body `{body}` (plain, tanh or inputsK)")
    graph["nodes"].append(
        {"name": "s", "op": "sum", "args": [source], "attrs": {"axes": [0], "keepdim": False}}
    )
    graph["outputs"].append("s")
    return graph


def threads(rows, cols):
    return cols * max(1, min(math.ceil(TARGET_THREADS / cols), math.ceil(rows / PER_THREAD)))


def run_json(command):
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}: {done.stderr.strip()[-300:]}")
    return json.loads(done.stdout)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fusebox", required=True)
    parser.add_argument("--rows", default="64,256,1024,4096,16384,65536")
    parser.add_argument("--cols", default="256,1024,4096")
    parser.add_argument(
        "--bodies", default="plain", help="comma-separated: plain (the sum alone), tanh (a tanh in front), inputsK (a sum of K inputs)"
    )
    parser.add_argument("--max-mib", type=float, default=256.0, help="skip larger inputs")
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--profile", default="h200")
    parser.add_argument("--launch-us", type=float, default=1.0, help="the profile's launch_us")
    parser.add_argument(
        "--rules", help="a rule directory laid over the embedded rules (e.g. another cost.ron)"
    )
    parser.add_argument("--backend", default="cuda", help="cpu checks this script without a GPU")
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args()

    rows_out = []
    work = tempfile.mkdtemp(prefix="fusebox-sweep-")
    header = (
        f"{'shape':<16} {'body':<8} {'kernels':>7} {'threads':>8} {'MiB':>8} {'median':>9} {'graph':>9} "
        f"{'copy':>9} {'slowdown':>8} {'model':>9}   (ms; model from --profile {args.profile})"
    )
    print(header)
    print("-" * len(header))
    for cols in [int(c) for c in args.cols.split(",")]:
        for rows in [int(r) for r in args.rows.split(",")]:
            for body in args.bodies.split(","):
                graph = column_sum_graph(rows, cols, body)
                if len(graph["inputs"]) * rows * cols * 4 > args.max_mib * 2**20:
                    continue
                path = os.path.join(work, graph["name"] + ".ron")
                with open(path, "w") as f:
                    f.write(graphs.to_ron(graph))
                rules = ["--rules", args.rules] if args.rules else []
                bench = [args.fusebox, "bench", path, "--backend", args.backend, "--json"] + rules
                plain = run_json(bench + ["--iters", str(args.iters)])
                replay = (
                    run_json(bench + ["--iters", str(args.iters), "--cuda-graph"])
                    if args.backend == "cuda"
                    else plain
                )
                model = run_json([args.fusebox, "optimize", path, "--profile", args.profile, "--json"] + rules)
                copy_ms = (
                    plain["bytes"] / (plain["copy_gbps"] * 1e6) if plain.get("copy_gbps") else float("nan")
                )
                launches = plain.get("launches") or 1
                slowdown = (replay["median_ms"] - launches * args.launch_us / 1000) / copy_ms
                row = {
                    "rows": rows, "cols": cols, "body": body,
                    "threads": threads(rows, cols), "kernels": plain["kernels"], "bytes": plain["bytes"], "launches": launches,
                    "median_ms": plain["median_ms"], "graph_median_ms": replay["median_ms"],
                    "copy_ms": copy_ms, "slowdown": slowdown, "model_ms": model["cost_after"] / 1000,
                    "device": plain.get("device"),
                }
                rows_out.append(row)
                print(
                    f"{f'[{rows}, {cols}]':<16} {row['body']:<8} {row['kernels']:>7} {row['threads']:>8} "
                    f"{row['bytes'] / 2**20:>8.2f} {row['median_ms']:>9.4f} {row['graph_median_ms']:>9.4f} "
                    f"{copy_ms:>9.4f} {slowdown:>8.2f} {row['model_ms']:>9.4f}"
                )
                sys.stdout.flush()
    device = next((r["device"] for r in rows_out if r.get("device")), "?")
    print(f"device: {device}; {args.iters} runs each; 'graph': CUDA graph replays; "
          f"slowdown = (graph - launches x {args.launch_us} us) / copy")
    if args.json:
        # No copy is timed off the GPU: its figures are null, not NaN (which JSON lacks).
        finite = [{k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                   for k, v in row.items()} for row in rows_out]
        with open(args.json, "w") as f:
            json.dump(finite, f, indent=2, allow_nan=False)


if __name__ == "__main__":
    main()
