#!/usr/bin/env python3
"""fusebox's compiled CPU kernels next to the frameworks people would otherwise use.

For one example graph (default: examples/lstm_cell.ron, 1024 x 4096 f32), this script runs,
in one process and one sitting so they share the machine's state:

  * a measured copy bandwidth (the best of NumPy `np.copyto` on one thread and on one thread
    per core, a C copy with streaming stores on every core (`benches/stream_copy.c`, built
    with fusebox's C compiler) and, when importable, torch's multi-threaded `Tensor.copy_`,
    on 256 MiB arrays, read + write bytes counted), which turns the graph's compulsory
    traffic into a memory floor;
  * `fusebox bench --json`, fused and `--no-fusion` (the same code generator, one kernel per op);
  * NumPy, PyTorch eager, torch.compile (inductor on CPU) and jax.jit, each skipped with a note
    when it cannot be imported, and reported as "failed: reason" when it breaks.

Everyone gets the same shapes, the same dtype and the same random inputs (uniform in [-3, 3],
never zeros). Every peer, fusebox included (through `fusebox run --input` on those inputs), is
checked against NumPy in float64 before it is timed, so no wrong answer is ever timed.
(`fusebox bench` times on its own seeded inputs, drawn from the same uniform [-3, 3].) Each timed peer gets
warm-up runs and then `--iters` timed runs; the median is reported.

GB/s for every row is the graph's compulsory bytes (every input read once, every output written
once: 117,440,512 bytes for lstm_cell) over the median time, so the rows are comparable whatever
each peer does internally. fusebox's own byte count (kernel-boundary traffic of its partition) is
printed alongside.

Only the standard library is required; numpy is needed for anything but the fusebox rows.
Threads are left at each library's default; the counts are printed.

    python3 benches/peers.py                                  # lstm_cell
    python3 benches/peers.py --graph lstm_cell_backward --iters 50
    python3 benches/peers.py --graph softmax                  # also: layernorm
    python3 benches/peers.py --graph book/examples/layout/softmax_of_features.ron
    python3 benches/peers.py --json > peers.json
"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

os.environ.setdefault("JAX_PLATFORMS", "cpu")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A peer is checked against float64 NumPy with a normwise relative error: per output,
#     max |y - ref| / max |ref|
# and the worst output counts. An elementwise relative error would blame float32 for doing its
# job wherever values cancel to nearly zero (cy = f*cx + i*g, the batch sums of grad_bias);
# measured against the output's own scale, float32 peers land near 1e-7 and a wrong formula
# lands near 1.
TOLERANCE = 1e-5


# --- The graphs' math, written once over a small set of primitives -------------------------
#
# `m` supplies sigmoid, tanh, exp, rsqrt, concat (along axis 1), sum0 (over axis 0) and the
# row reductions rowmax, rowsum, rowmean (over the last axis, keeping it); the arithmetic
# operators are the array type's own. Each peer runs exactly this function, so nobody gets a
# different algorithm.


def lstm_cell(m, ingate, forgetgate, cellgate, outgate, cx):
    i = m.sigmoid(ingate)
    f = m.sigmoid(forgetgate)
    g = m.tanh(cellgate)
    o = m.sigmoid(outgate)
    cy = f * cx + i * g
    hy = o * m.tanh(cy)
    return hy, cy


def lstm_cell_backward(m, i, f, g, o, cx, cy, grad_hy, grad_cy):
    tanh_cy = m.tanh(cy)
    gcy = grad_hy * o * (1.0 - tanh_cy * tanh_cy) + grad_cy
    grad_ingate = gcy * g * (i * (1.0 - i))
    grad_forgetgate = gcy * cx * (f * (1.0 - f))
    grad_cellgate = gcy * i * (1.0 - g * g)
    grad_outgate = grad_hy * tanh_cy * (o * (1.0 - o))
    grad_cx = gcy * f
    # PyTorch's _thnn_fused_lstm_cell_backward returns the gate gradients as one [B, 4H]
    # tensor, which the gate matmuls' backward reads.
    grad_gates = m.concat([grad_ingate, grad_forgetgate, grad_cellgate, grad_outgate])
    grad_bias = m.sum0(grad_gates)
    return grad_gates, grad_cx, grad_bias


def lstm_cell_full(m, x, h, cx, W_ih, W_hh, b):
    # PyTorch's LSTMCell: the gate matmuls, the bias, the chunk into four, then the cell.
    gates = x @ W_ih + h @ W_hh + b
    hidden = cx.shape[1]
    ingate, forgetgate, cellgate, outgate = (
        gates[:, k * hidden:(k + 1) * hidden] for k in range(4)
    )
    return lstm_cell(m, ingate, forgetgate, cellgate, outgate, cx)


def softmax(m, x):
    e = m.exp(x - m.rowmax(x))
    return (e / m.rowsum(e),)


def softmax_of_features(m, a, c, bias):
    return softmax(m, m.concat([a, c + bias]))


def layernorm(m, x, weight, bias):
    mean = m.rowmean(x)
    centered = x - mean
    var = m.rowmean(centered * centered)
    return (centered * m.rsqrt(var + 1e-5) * weight + bias,)


MATH = {
    "softmax": (softmax, ["x"], ["y"]),
    "layernorm": (layernorm, ["x", "weight", "bias"], ["y"]),
    # book/examples/layout/softmax_of_features.ron: a softmax over two joined feature blocks.
    "softmax_of_features": (softmax_of_features, ["a", "c", "bias"], ["s"]),
    "lstm_cell": (
        lstm_cell,
        ["ingate", "forgetgate", "cellgate", "outgate", "cx"],
        ["hy", "cy"],
    ),
    # Matmuls over 1536 products of [-3, 3] values accumulate f32 rounding in every peer
    # (NumPy's own f32 result is about 2e-4 off the f64 reference), so the check is looser.
    "lstm_cell_full": (
        lstm_cell_full,
        ["x", "h", "cx", "W_ih", "W_hh", "b"],
        ["hy", "cy"],
        1e-3,
    ),
    "lstm_cell_backward": (
        lstm_cell_backward,
        ["i", "f", "g", "o", "cx", "cy", "grad_hy", "grad_cy"],
        ["grad_gates", "grad_cx", "grad_bias"],
    ),
}


class NumpyOps:
    def __init__(self, np):
        self.np = np

    def sigmoid(self, x):
        return 1.0 / (1.0 + self.np.exp(-x))

    def tanh(self, x):
        return self.np.tanh(x)

    def concat(self, xs):
        return self.np.concatenate(xs, axis=1)

    def sum0(self, x):
        return x.sum(axis=0)

    def exp(self, x):
        return self.np.exp(x)

    def rsqrt(self, x):
        return 1.0 / self.np.sqrt(x)

    def rowmax(self, x):
        return x.max(axis=-1, keepdims=True)

    def rowsum(self, x):
        return x.sum(axis=-1, keepdims=True)

    def rowmean(self, x):
        return x.mean(axis=-1, keepdims=True)


class TorchOps:
    def __init__(self, torch):
        self.torch = torch

    def sigmoid(self, x):
        return self.torch.sigmoid(x)

    def tanh(self, x):
        return self.torch.tanh(x)

    def concat(self, xs):
        return self.torch.cat(xs, dim=1)

    def sum0(self, x):
        return x.sum(dim=0)

    def exp(self, x):
        return self.torch.exp(x)

    def rsqrt(self, x):
        return 1.0 / self.torch.sqrt(x)

    def rowmax(self, x):
        return x.amax(dim=-1, keepdim=True)

    def rowsum(self, x):
        return x.sum(dim=-1, keepdim=True)

    def rowmean(self, x):
        return x.mean(dim=-1, keepdim=True)


class JaxOps:
    def __init__(self, jax, jnp):
        self.jax = jax
        self.jnp = jnp

    def sigmoid(self, x):
        return self.jax.nn.sigmoid(x)

    def tanh(self, x):
        return self.jnp.tanh(x)

    def concat(self, xs):
        return self.jnp.concatenate(xs, axis=1)

    def sum0(self, x):
        return x.sum(axis=0)

    def exp(self, x):
        return self.jnp.exp(x)

    def rsqrt(self, x):
        return 1.0 / self.jnp.sqrt(x)

    def rowmax(self, x):
        return x.max(axis=-1, keepdims=True)

    def rowsum(self, x):
        return x.sum(axis=-1, keepdims=True)

    def rowmean(self, x):
        return x.mean(axis=-1, keepdims=True)


# --- The graph file --------------------------------------------------------------------------


def graph_path(arg):
    """`--graph` is an example name or a path to a .ron file."""
    if os.path.exists(arg):
        return arg
    candidate = os.path.join(ROOT, "examples", arg + ".ron")
    if os.path.exists(candidate):
        return candidate
    sys.exit(f"peers.py: no graph file {arg!r} (nor {candidate})")


def read_graph(path):
    """The name, inputs (name, dtype, shape) and outputs of a graph file.

    Only the parts this script needs are read, with regular expressions; fusebox itself checks
    the file properly when it runs it.
    """
    with open(path) as f:
        text = re.sub(r"//[^\n]*", "", f.read())
    name = re.search(r'Graph\s*\(\s*name\s*:\s*"([^"]+)"', text)
    inputs = re.findall(
        r'Input\s*\(\s*name\s*:\s*"([^"]+)"\s*,\s*dtype\s*:\s*"([^"]+)"\s*,\s*shape\s*:\s*\[([^\]]*)\]',
        text,
    )
    outputs = re.search(r"outputs\s*:\s*\[([^\]]*)\]", text)
    if not name or not inputs or not outputs:
        sys.exit(f"peers.py: could not read the graph's name, inputs and outputs from {path}")
    return (
        name.group(1),
        [(n, d, [int(s) for s in shape.split(",") if s.strip()]) for n, d, shape in inputs],
        re.findall(r'"([^"]+)"', outputs.group(1)),
    )


# --- Timing ----------------------------------------------------------------------------------


def time_calls(run, warmup, iters):
    for _ in range(warmup):
        run()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        run()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times), min(times)


def copy_bandwidth(np, torch, mib, iters, notes):
    """Read + write bytes per second of a plain copy: the best this machine's memory did."""
    results = {}
    n = mib * (1 << 20) // 4
    src = np.random.default_rng(1).uniform(-3, 3, n).astype(np.float32)
    dst = np.empty_like(src)
    moved = 2 * src.nbytes
    median, _ = time_calls(lambda: np.copyto(dst, src), 2, iters)
    results["numpy.copyto"] = moved / (median * 1e6)
    # The same memcpy (glibc streams stores this large, so no read for ownership) on one
    # thread per core, each copying its own slice: NumPy releases the GIL while it copies.
    # fusebox's kernels run on every core and stream their stores too, so this is the copy
    # they should be held to.
    workers = os.cpu_count() or 1
    if workers > 1:
        bounds = [n * k // workers for k in range(workers + 1)]
        pool = ThreadPoolExecutor(workers)

        def threaded_copy():
            jobs = [
                pool.submit(np.copyto, dst[lo:hi], src[lo:hi])
                for lo, hi in zip(bounds, bounds[1:])
            ]
            for job in jobs:
                job.result()

        median, _ = time_calls(threaded_copy, 2, iters)
        pool.shutdown()
        results[f"numpy.copyto x{workers} threads"] = moved / (median * 1e6)
    streamed = stream_copy(src, dst)
    if isinstance(streamed, str):
        notes.append(streamed)
    else:
        median, _ = time_calls(streamed, 2, iters)
        results[f"C stream copy x{workers} threads"] = moved / (median * 1e6)
    if torch is not None:
        tsrc = torch.from_numpy(src)
        tdst = torch.empty_like(tsrc)
        median, _ = time_calls(lambda: tdst.copy_(tsrc), 2, iters)
        results["torch.copy_"] = moved / (median * 1e6)
    return results


def stream_copy(src, dst):
    """A call that copies src into dst with benches/stream_copy.c (every core, streaming
    stores), built here with fusebox's C compiler; or, when it cannot be built, why not."""
    import ctypes

    cc = os.environ.get("FUSEBOX_CC", "cc")
    source = os.path.join(ROOT, "benches", "stream_copy.c")
    out = tempfile.mkdtemp(prefix="peers-copy-")
    lib = os.path.join(out, "stream_copy.so")
    try:
        built = subprocess.run(
            [cc, "-O2", "-march=native", "-fopenmp", "-shared", "-fPIC", "-o", lib, source],
            capture_output=True, text=True,
        )
        if built.returncode != 0:
            return f"C stream copy not measured: {cc} failed: {first_line(built.stderr)}"
        copy = ctypes.CDLL(lib).fb_stream_copy
    except OSError as exc:
        return f"C stream copy not measured: {exc}"
    finally:
        shutil.rmtree(out, ignore_errors=True)
    copy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    copy.restype = None
    d, s, n = dst.ctypes.data, src.ctypes.data, src.size
    return lambda: copy(d, s, n)


def max_rel_error(np, outputs, reference):
    worst = 0.0
    for y, ref in zip(outputs, reference):
        y = np.asarray(y, dtype=np.float64)
        if y.shape != ref.shape or not np.all(np.isfinite(y)):
            return float("inf")
        if y.size:
            scale = max(float(np.max(np.abs(ref))), np.finfo(np.float64).tiny)
            worst = max(worst, float(np.max(np.abs(y - ref))) / scale)
    return worst


def first_line(exc):
    text = f"{type(exc).__name__}: {exc}".strip()
    return text.splitlines()[0][:160]


# --- Peers -----------------------------------------------------------------------------------


def row(name, **fields):
    base = {
        "name": name,
        "status": "ok",
        "median_ms": None,
        "min_ms": None,
        "max_rel_err": None,
        "note": "",
    }
    base.update(fields)
    return base


def checked_and_timed(name, run, to_numpy, reference, np, args, note=""):
    """Warm up, check against the float64 reference, and time only if the check passed."""
    try:
        for _ in range(args.warmup):
            outputs = run()
        err = max_rel_error(np, [to_numpy(y) for y in outputs], reference)
    except Exception as exc:  # a peer's failure is a result, not a crash
        return row(name, status=f"failed: {first_line(exc)}", note=note)
    if not err <= TOLERANCE:
        return row(name, status=f"wrong: max rel err {err:.3g} > {TOLERANCE:g}", max_rel_err=err)
    median, minimum = time_calls(run, 0, args.iters)
    return row(name, median_ms=median, min_ms=minimum, max_rel_err=err, note=note)


def run_fusebox(args, ron, fusion, reference, inputs_dir, input_names, output_names, np):
    name = "fusebox fused" if fusion else "fusebox unfused"
    if not (os.path.isfile(args.fusebox) and os.access(args.fusebox, os.X_OK)):
        return row(name, status=f"skipped: no fusebox binary at {args.fusebox}")
    flags = [] if fusion else ["--no-fusion"]
    err = None
    if np is not None and inputs_dir is not None:
        out_dir = tempfile.mkdtemp(prefix="peers-fusebox-out-")
        try:
            command = [args.fusebox, "run", ron, "--backend", "cpu", "--out", out_dir] + flags
            for n in input_names:
                command += ["--input", f"{n}={os.path.join(inputs_dir, n + '.npy')}"]
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode != 0:
                return row(name, status=f"failed: fusebox run: {done.stderr.strip()[:160]}")
            outputs = [np.load(os.path.join(out_dir, o + ".npy")) for o in output_names]
            err = max_rel_error(np, outputs, reference)
        finally:
            shutil.rmtree(out_dir, ignore_errors=True)
        if not err <= TOLERANCE:
            return row(name, status=f"wrong: max rel err {err:.3g} > {TOLERANCE:g}", max_rel_err=err)
    command = [args.fusebox, "bench", ron, "--backend", "cpu", "--json", "--iters", str(args.iters)]
    done = subprocess.run(command + flags, capture_output=True, text=True)
    if done.returncode != 0:
        return row(name, status=f"failed: fusebox bench: {done.stderr.strip()[:160]}")
    report = json.loads(done.stdout)
    return row(
        name,
        median_ms=report["median_ms"],
        min_ms=report["min_ms"],
        max_rel_err=err,
        note=f"{report['kernels']} kernel(s), {report.get('library_calls', 0)} library call(s), "
        f"{report['bytes']:,} B at kernel boundaries, "
        f"{report['threads']} threads, compile {report['compile_ms']:.0f} ms",
        fusebox=report,
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--graph", default="lstm_cell", help="example name or .ron path")
    parser.add_argument("--fusebox", default=os.path.join(ROOT, "target", "release", "fusebox"))
    parser.add_argument("--iters", type=int, default=20, help="timed runs per peer")
    parser.add_argument("--warmup", type=int, default=3, help="untimed runs before timing")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--copy-mib", type=int, default=256, help="size of the copy test")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    args.iters = max(args.iters, 1)
    args.warmup = max(args.warmup, 1)

    ron = graph_path(args.graph)
    graph_name, graph_inputs, graph_outputs = read_graph(ron)
    if graph_name not in MATH:
        sys.exit(f"peers.py: no peer implementation of {graph_name!r}; known: {sorted(MATH)}")
    math, input_names, output_names = MATH[graph_name][:3]
    global TOLERANCE
    TOLERANCE = MATH[graph_name][3] if len(MATH[graph_name]) > 3 else TOLERANCE
    if [i[0] for i in graph_inputs] != input_names or graph_outputs != output_names:
        sys.exit(f"peers.py: {ron} does not have the inputs and outputs this script's "
                 f"{graph_name} expects ({input_names} -> {output_names})")
    if any(dtype != "f32" for _, dtype, _ in graph_inputs):
        sys.exit("peers.py: only f32 graphs are supported")

    notes = []
    try:
        import numpy as np
    except Exception as exc:
        np = None
        notes.append(f"numpy not importable ({first_line(exc)}): only fusebox is timed, unchecked")
    try:
        import torch
    except Exception as exc:
        torch = None
        notes.append(f"torch not importable: {first_line(exc)}")
    try:
        import jax
        import jax.numpy as jnp
    except Exception as exc:
        jax = None
        notes.append(f"jax not importable: {first_line(exc)}")

    results = []
    machine = {"cpu_count": os.cpu_count()}
    if torch is not None:
        machine["torch_threads"] = torch.get_num_threads()
        machine["torch"] = torch.__version__
    if np is not None:
        machine["numpy"] = np.__version__
    if jax is not None:
        machine["jax"] = jax.__version__

    reference = inputs = inputs_dir = None
    floor_bytes = None
    copy = {}
    if np is not None:
        rng = np.random.default_rng(args.seed)
        inputs = [rng.uniform(-3.0, 3.0, shape).astype(np.float32) for _, _, shape in graph_inputs]
        reference = [np.asarray(y) for y in math(NumpyOps(np), *[x.astype(np.float64) for x in inputs])]
        floor_bytes = sum(x.nbytes for x in inputs) + sum(y.size * 4 for y in reference)
        copy = copy_bandwidth(np, torch, args.copy_mib, max(5, args.iters // 2), notes)
        inputs_dir = tempfile.mkdtemp(prefix="peers-inputs-")
        for n, x in zip(input_names, inputs):
            np.save(os.path.join(inputs_dir, n + ".npy"), x)

    try:
        for fusion in (True, False):
            results.append(
                run_fusebox(args, ron, fusion, reference, inputs_dir, input_names, output_names, np)
            )
    finally:
        if inputs_dir:
            shutil.rmtree(inputs_dir, ignore_errors=True)

    if np is not None:
        ops = NumpyOps(np)
        results.append(
            checked_and_timed("numpy", lambda: math(ops, *inputs), lambda y: y, reference, np, args)
        )
    else:
        results.append(row("numpy", status="skipped: numpy not importable"))

    if torch is not None:
        tops = TorchOps(torch)
        tinputs = [torch.from_numpy(x) for x in inputs]

        def eager():
            with torch.no_grad():
                return math(tops, *tinputs)

        results.append(
            checked_and_timed("torch eager", eager, lambda y: y.numpy(), reference, np, args)
        )
        start = time.perf_counter()
        try:
            compiled = torch.compile(lambda *xs: math(tops, *xs))
            with torch.no_grad():
                compiled(*tinputs)
            compile_note = f"compile {(time.perf_counter() - start) * 1e3:.0f} ms (inductor)"
        except Exception as exc:
            results.append(row("torch.compile", status=f"failed: {first_line(exc)}"))
        else:

            def run_compiled():
                with torch.no_grad():
                    return compiled(*tinputs)

            results.append(
                checked_and_timed(
                    "torch.compile", run_compiled, lambda y: y.numpy(), reference, np, args,
                    note=compile_note,
                )
            )
    else:
        for name in ("torch eager", "torch.compile"):
            results.append(row(name, status="skipped: torch not importable"))

    if jax is not None and np is not None:
        jops = JaxOps(jax, jnp)
        jinputs = [jax.device_put(jnp.asarray(x)) for x in inputs]
        start = time.perf_counter()
        try:
            jitted = jax.jit(lambda *xs: math(jops, *xs))
            jax.block_until_ready(jitted(*jinputs))
            jit_note = f"compile {(time.perf_counter() - start) * 1e3:.0f} ms (XLA)"
        except Exception as exc:
            results.append(row("jax.jit", status=f"failed: {first_line(exc)}"))
        else:
            results.append(
                checked_and_timed(
                    "jax.jit",
                    lambda: jax.block_until_ready(jitted(*jinputs)),
                    np.asarray, reference, np, args, note=jit_note,
                )
            )
    else:
        results.append(row("jax.jit", status="skipped: jax (or numpy) not importable"))

    fused = next((r for r in results if r["name"] == "fusebox fused" and r["median_ms"]), None)
    fusebox_bytes = fused["fusebox"]["bytes"] if fused else None
    bytes_source = "inputs read + outputs written once"
    if floor_bytes is None and fusebox_bytes is not None:
        floor_bytes = fusebox_bytes
        bytes_source = "fusebox's kernel-boundary count; numpy was not there to size the outputs"
    for r in results:
        if r["median_ms"]:
            r["gbps"] = floor_bytes / (r["median_ms"] * 1e6) if floor_bytes else None
            r["vs_fused"] = r["median_ms"] / fused["median_ms"] if fused else None
    best_copy = max(copy.values()) if copy else None
    floor_ms = floor_bytes / (best_copy * 1e6) if best_copy and floor_bytes else None
    summary = {
        "graph": graph_name,
        "file": os.path.relpath(ron, os.getcwd()),
        "shapes": {n: s for n, _, s in graph_inputs},
        "dtype": "f32",
        "iters": args.iters,
        "warmup": args.warmup,
        "seed": args.seed,
        "compulsory_bytes": floor_bytes,
        "compulsory_bytes_source": bytes_source,
        "copy_gbps": copy,
        "floor_ms": floor_ms,
        "fused_vs_floor": fused["median_ms"] / floor_ms if fused and floor_ms else None,
        "machine": machine,
        "notes": notes,
        "results": results,
    }
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print_table(summary)


def fmt(value, spec, missing="-"):
    return missing if value is None else format(value, spec)


def print_table(s):
    m = s["machine"]
    shapes = ", ".join(f"{n} {'x'.join(map(str, v))}" for n, v in s["shapes"].items())
    print(f"{s['graph']} ({s['file']}), {s['dtype']}: {shapes}")
    print(
        f"cpu_count {m['cpu_count']}, torch threads {m.get('torch_threads', '-')}; "
        f"{s['warmup']} warm-up + {s['iters']} timed runs each, median; seed {s['seed']}"
    )
    versions = ", ".join(f"{k} {m[k]}" for k in ("numpy", "torch", "jax") if k in m)
    if versions:
        print(versions)
    for note in s["notes"]:
        print(f"note: {note}")
    if s["copy_gbps"]:
        copies = ", ".join(f"{k} {v:.2f} GB/s" for k, v in s["copy_gbps"].items())
        print(f"copy bandwidth (read + write): {copies}")
    if s["compulsory_bytes"]:
        print(f"compulsory bytes ({s['compulsory_bytes_source']}): {s['compulsory_bytes']:,}")
    print()
    header = f"{'peer':<16} {'median ms':>10} {'min ms':>9} {'GB/s':>7} {'x fused':>8} {'max rel err':>12}  note"
    print(header)
    print("-" * len(header))
    for r in s["results"]:
        if r["median_ms"] is None:
            print(f"{r['name']:<16} {r['status']}")
            continue
        print(
            f"{r['name']:<16} {r['median_ms']:>10.3f} {r['min_ms']:>9.3f} "
            f"{fmt(r.get('gbps'), '.2f'):>7} {fmt(r.get('vs_fused'), '.2f'):>8} "
            f"{fmt(r['max_rel_err'], '.2e', 'unchecked'):>12}  {r['note']}"
        )
    if s["floor_ms"]:
        print("-" * len(header))
        print(f"{'memory floor':<16} {s['floor_ms']:>10.3f} {'':>9} "
              f"{max(s['copy_gbps'].values()):>7.2f}  compulsory bytes / best copy bandwidth")
        if s["fused_vs_floor"]:
            print(f"fusebox fused takes {s['fused_vs_floor']:.2f}x the memory floor")
    print(f"(x fused: median time over fusebox fused's; max rel err: max |y - ref| / max |ref| "
          f"per output against float64 NumPy, worst output, tolerance {TOLERANCE:g})")


if __name__ == "__main__":
    main()
