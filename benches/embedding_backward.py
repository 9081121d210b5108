#!/usr/bin/env python3
"""An embedding's training step on the CPU, side by side in one sitting: the gradient of a
table through its lookup, which fusebox computes with a scatter kernel (`scatter_add`, one row
of updates per thread, in order).

For a table [V, D], ids [B, T] (repeats drawn from a Zipf-like law, as text has) and the loss
`sum(mean(table[ids], axis=1) * g)`, this script times, alternating rounds:

  * fusebox: `fusebox bench` of the joint graph `fusebox grad` writes (forward and backward:
    the lookup, the mean, the gradient of the table), median over --iters runs;
  * torch eager: the same forward and `backward()` of `F.embedding` in PyTorch on --threads
    threads (dense gradient, as `nn.Embedding` gives by default);
  * floor: `fusebox bench` of a graph that only writes a zero [V, D] table: the bytes any
    dense table gradient must write.

Before timing, fusebox's gradient (on the CPU backend) is compared with torch's in float64.

    /work/peers-venv/bin/python benches/embedding_backward.py --fusebox target/release/fusebox
"""
import argparse, json, os, statistics, subprocess, tempfile, time

import numpy as np
import torch
import torch.nn.functional as F

SHAPES = [(50257, 768, 8, 512), (30522, 768, 32, 128), (8192, 256, 64, 64)]


def write_graph(path, v, d, b, t):
    with open(path, "w") as f:
        f.write(f"""Graph(
    name: "embedding_step",
    inputs: [
        Input(name: "table", dtype: "f32", shape: [{v}, {d}]),
        Input(name: "ids", dtype: "i64", shape: [{b}, {t}]),
        Input(name: "g", dtype: "f32", shape: [{b}, {d}]),
    ],
    nodes: [
        Node(name: "rows", op: "gather", args: ["table", "ids"]),
        Node(name: "pooled", op: "mean", args: ["rows"], attrs: {{"axes": [1]}}),
        Node(name: "y", op: "mul", args: ["pooled", "g"]),
    ],
    outputs: ["y"],
)
""")


def write_floor(path, v, d):
    with open(path, "w") as f:
        f.write(f"""Graph(
    name: "zero_table",
    inputs: [Input(name: "s", dtype: "f32", shape: [])],
    nodes: [
        Node(name: "z", op: "mul", args: ["s", "s"]),
        Node(name: "y", op: "broadcast_to", args: ["z"], attrs: {{"shape": [{v}, {d}]}}),
        Node(name: "out", op: "add", args: ["y", "y"]),
    ],
    outputs: ["out"],
)
""")


def bench(fusebox, path, iters, inputs):
    cmd = [fusebox, "bench", path, "--backend", "cpu", "--iters", str(iters), "--json"]
    for k, v in inputs.items():
        cmd += ["--input", f"{k}={v}"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)["median_ms"]


def ids_of(v, b, t, rng):
    # Zipf-like: a few ids repeat often, as tokens do.
    return np.minimum(rng.zipf(1.2, size=(b, t)) - 1, v - 1).astype(np.int64)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--fusebox", default="target/release/fusebox")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    rng = np.random.default_rng(0)
    tmp = tempfile.mkdtemp()
    print(f"threads {args.threads}, torch {torch.__version__}, load {os.getloadavg()[0]:.2f}")
    print("  V      D   B    T    fusebox ms  torch ms  floor ms  fusebox/torch  max rel err")
    for v, d, b, t in SHAPES:
        graph = os.path.join(tmp, "step.ron")
        write_graph(graph, v, d, b, t)
        joint = os.path.join(tmp, "joint.ron")
        subprocess.run([args.fusebox, "grad", graph, "--wrt", "table", "--out", joint],
                       check=True, capture_output=True)
        floor = os.path.join(tmp, "floor.ron")
        write_floor(floor, v, d)
        table = rng.standard_normal((v, d)).astype(np.float32)
        ids = ids_of(v, b, t, rng)
        cot = rng.standard_normal((b, d)).astype(np.float32)
        files = {}
        for name, arr in [("table", table), ("ids", ids), ("g", cot), ("grad_y", cot)]:
            files[name] = os.path.join(tmp, f"{name}.npy")
            np.save(files[name], arr)
        joint_inputs = {k: files[k] for k in ["table", "ids", "g", "grad_y"]}
        out = os.path.join(tmp, "out")
        cmd = [args.fusebox, "run", joint, "--backend", "cpu", "--out", out]
        for k, f in joint_inputs.items():
            cmd += ["--input", f"{k}={f}"]
        subprocess.run(cmd, check=True, capture_output=True)
        got = np.load(os.path.join(out, "grad_table.npy")).astype(np.float64)
        w = torch.tensor(table, dtype=torch.float64, requires_grad=True)
        y = F.embedding(torch.tensor(ids), w).mean(1) * torch.tensor(cot, dtype=torch.float64)
        (y * torch.tensor(cot, dtype=torch.float64)).sum().backward()
        want = w.grad.numpy()
        err = np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-30)
        wt = torch.tensor(table, requires_grad=True)
        ti, tg = torch.tensor(ids), torch.tensor(cot)

        def torch_ms():
            times = []
            for i in range(args.iters + 3):
                wt.grad = None
                s = time.perf_counter()
                yy = F.embedding(ti, wt).mean(1) * tg
                (yy * tg).sum().backward()
                e = time.perf_counter()
                if i >= 3:  # after 3 warm-up calls
                    times.append((e - s) * 1e3)
            return statistics.median(times)

        rounds = {"fusebox": [], "torch": [], "floor": []}
        for _ in range(args.rounds):
            rounds["fusebox"].append(bench(args.fusebox, joint, args.iters, joint_inputs))
            rounds["torch"].append(torch_ms())
            rounds["floor"].append(bench(args.fusebox, floor, args.iters, {}))
        fb, th, fl = (statistics.median(rounds[k]) for k in ["fusebox", "torch", "floor"])
        print(f"{v:6d} {d:4d} {b:3d} {t:4d}   {fb:9.3f} {th:9.3f} {fl:9.3f}   {fb / th:12.2f}  {err:.1e}")


if __name__ == "__main__":
    main()
