#!/usr/bin/env python3
"""Embedding lookups read where they are reduced, on the CPU, side by side in one sitting:

  * `layernorm`: a BERT-style embedding layer, token rows looked up by id, the position rows
    added, then LayerNorm. fusebox reads the table at the ids inside the LayerNorm's row kernel
    (a gather in a row kernel), so the summed embedding is never written;
  * `pool`: token rows looked up and averaged over the sequence (a bag-of-words encoder),
    the lookup read inside the mean's reduction kernel.

For a table [V, D], ids [B, T] and positions [T, D], this script times, alternating rounds:

  * fusebox: `fusebox bench` of the graph below (median over --iters runs);
  * fusebox before: the same with another build (--before), to show what fusing the gather
    into the row kernel changed (that build writes the sum and reads it back);
  * torch eager: `F.layer_norm(F.embedding(ids, table) + pos, (D,), w, b)`, or
    `F.embedding(ids, table).mean(1)`, on --threads threads under `torch.no_grad()`;
  * floor (layernorm only): `fusebox bench` of a copy of a [B, T, D] f32 tensor: the bytes the
    layer must at least move (its output written, a row of the table read per token).

Before timing, fusebox's output (CPU backend) is compared with torch's in float64.

    /work/peers-venv/bin/python benches/embedding_layernorm.py --fusebox target/release/fusebox \
        --before /tmp/head-target/release/fusebox
"""
import argparse, json, os, statistics, subprocess, tempfile, time

import numpy as np
import torch
import torch.nn.functional as F

SHAPES = [(30522, 768, 32, 128), (50257, 768, 8, 512), (8192, 256, 64, 64)]


def write_graph(path, v, d, b, t):
    with open(path, "w") as f:
        f.write(f"""Graph(
    name: "embedding_layernorm",
    inputs: [
        Input(name: "table", dtype: "f32", shape: [{v}, {d}]),
        Input(name: "ids", dtype: "i64", shape: [{b}, {t}]),
        Input(name: "pos", dtype: "f32", shape: [{t}, {d}]),
        Input(name: "w", dtype: "f32", shape: [{d}]),
        Input(name: "bias", dtype: "f32", shape: [{d}]),
    ],
    nodes: [
        Node(name: "rows", op: "gather", args: ["table", "ids"]),
        Node(name: "x", op: "add", args: ["rows", "pos"]),
        Node(name: "y", op: "layer_norm", args: ["x", "w", "bias"], attrs: {{"epsilon": 1e-12}}),
    ],
    outputs: ["y"],
)
""")


def write_pool(path, v, d, b, t):
    with open(path, "w") as f:
        f.write(f"""Graph(
    name: "embedding_pool",
    inputs: [
        Input(name: "table", dtype: "f32", shape: [{v}, {d}]),
        Input(name: "ids", dtype: "i64", shape: [{b}, {t}]),
    ],
    nodes: [
        Node(name: "rows", op: "gather", args: ["table", "ids"]),
        Node(name: "y", op: "mean", args: ["rows"], attrs: {{"axes": [1]}}),
    ],
    outputs: ["y"],
)
""")


def write_floor(path, b, t, d):
    with open(path, "w") as f:
        f.write(f"""Graph(
    name: "copy",
    inputs: [Input(name: "x", dtype: "f32", shape: [{b}, {t}, {d}])],
    nodes: [Node(name: "y", op: "neg", args: ["x"])],
    outputs: ["y"],
)
""")


def bench(fusebox, path, iters, inputs):
    cmd = [fusebox, "bench", path, "--backend", "cpu", "--iters", str(iters), "--json"]
    for k, v in inputs.items():
        cmd += ["--input", f"{k}={v}"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)["median_ms"]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--fusebox", default="target/release/fusebox")
    p.add_argument("--before", help="another fusebox build to time beside it")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    rng = np.random.default_rng(0)
    tmp = tempfile.mkdtemp()
    builds = {"fusebox": args.fusebox}
    if args.before:
        builds["before"] = args.before
    print(f"threads {args.threads}, torch {torch.__version__}, load {os.getloadavg()[0]:.2f}")
    head = "".join(f"{k + ' ms':>12}" for k in builds)
    print(f"graph         V      D   B    T  {head}  torch ms  floor ms  fusebox/torch  max abs err")
    for v, d, b, t in SHAPES:
        arrays = {
            "table": rng.standard_normal((v, d)).astype(np.float32),
            "ids": rng.integers(0, v, size=(b, t)).astype(np.int64),
            "pos": rng.standard_normal((t, d)).astype(np.float32),
            "w": rng.standard_normal(d).astype(np.float32),
            "bias": rng.standard_normal(d).astype(np.float32),
        }
        files = {}
        for name, arr in arrays.items():
            files[name] = os.path.join(tmp, f"{name}.npy")
            np.save(files[name], arr)
        np.save(os.path.join(tmp, "x.npy"), rng.standard_normal((b, t, d)).astype(np.float32))
        floor = os.path.join(tmp, "floor.ron")
        write_floor(floor, b, t, d)
        t64 = {k: torch.tensor(a.astype(np.float64) if a.dtype == np.float32 else a)
               for k, a in arrays.items()}
        t32 = {k: torch.tensor(a) for k, a in arrays.items()}
        cases = {
            "layernorm": (write_graph, ["table", "ids", "pos", "w", "bias"],
                          lambda x: F.layer_norm(F.embedding(x["ids"], x["table"]) + x["pos"],
                                                 (d,), x["w"], x["bias"], eps=1e-12)),
            "pool": (write_pool, ["table", "ids"],
                     lambda x: F.embedding(x["ids"], x["table"]).mean(1)),
        }
        for name, (write, inputs, model) in cases.items():
            graph = os.path.join(tmp, f"{name}.ron")
            write(graph, v, d, b, t)
            used = {k: files[k] for k in inputs}
            out = os.path.join(tmp, "out")
            cmd = [args.fusebox, "run", graph, "--backend", "cpu", "--out", out]
            for k, f in used.items():
                cmd += ["--input", f"{k}={f}"]
            subprocess.run(cmd, check=True, capture_output=True)
            got = np.load(os.path.join(out, "y.npy")).astype(np.float64)
            err = np.max(np.abs(got - model(t64).numpy()))

            def torch_ms():
                times = []
                with torch.no_grad():
                    for i in range(args.iters + 3):
                        s = time.perf_counter()
                        model(t32)
                        e = time.perf_counter()
                        if i >= 3:  # after 3 warm-up calls
                            times.append((e - s) * 1e3)
                return statistics.median(times)

            rounds = {k: [] for k in list(builds) + ["torch", "floor"]}
            for _ in range(args.rounds):
                for k, exe in builds.items():
                    rounds[k].append(bench(exe, graph, args.iters, used))
                rounds["torch"].append(torch_ms())
                if name == "layernorm":
                    rounds["floor"].append(bench(args.fusebox, floor, args.iters,
                                                 {"x": os.path.join(tmp, "x.npy")}))
            med = {k: statistics.median(r) if r else float("nan") for k, r in rounds.items()}
            cols = "".join(f"{med[k]:12.3f}" for k in builds)
            print(f"{name:10s} {v:6d} {d:4d} {b:3d} {t:4d}{cols} {med['torch']:9.3f} "
                  f"{med['floor']:9.3f}   {med['fusebox'] / med['torch']:12.2f}  {err:.1e}")


if __name__ == "__main__":
    main()
