#!/usr/bin/env python3
"""fusebox's CUDA backend next to PyTorch on the same GPU: one table row per example and way of
running it.

For each example graph, in one process and one sitting (so every row sees the same GPU state):

  * fusebox, fused, through `fusebox bench --backend cuda --json` (plain runs, and replays of a
    captured CUDA graph with --cuda-graph), and `--no-fusion` (one kernel per op, same code
    generator);
  * PyTorch eager and torch.compile (inductor; and mode="reduce-overhead", which adds CUDA
    graphs), running the graph node by node through graphs.torch_function, the same math on
    the same shapes and dtypes;
  * a device-to-device copy (`Tensor.copy_` of --copy-mib MiB) measured at the start: the
    bandwidth every row is compared with.

Every time is device time from CUDA events, taken between back-to-back runs after warm-up runs,
the median of --iters. "bytes" is each graph's compulsory traffic — every input read once, every
output written once — so the GB/s column compares the rows fairly whatever each one moves
internally; fusebox's own count (bytes at its kernel boundaries) is in the notes. "% copy" is
GB/s over the copy's GB/s. torch.compile rows are checked against eager (normwise relative
error, per output) and marked when they disagree.

    python3 benches/gpu/peers_gpu.py --fusebox ./fusebox
    python3 benches/gpu/peers_gpu.py --examples lstm_cell,layernorm_tail --iters 100 --json t.json
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import graphs  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# torch.compile against eager, normwise per output (max |y - eager| / max |eager|): the two
# round differently (inductor fuses and may reorder), so this catches a wrong graph, not ulps.
COMPILE_TOLERANCE = {"f32": 1e-4, "f64": 1e-9, "f16": 1e-2, "bf16": 5e-2}


def first_line(exc):
    return f"{type(exc).__name__}: {exc}".strip().splitlines()[0][:160]


def time_cuda(torch, fn, warmup, iters):
    """Median and minimum milliseconds per call, from CUDA events between back-to-back calls."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    events = [torch.cuda.Event(enable_timing=True) for _ in range(iters + 1)]
    events[0].record()
    for event in events[1:]:
        fn()
        event.record()
    torch.cuda.synchronize()
    times = sorted(a.elapsed_time(b) for a, b in zip(events, events[1:]))
    return statistics.median(times), times[0]


def copy_gbps(torch, mib, iters):
    n = mib * (1 << 20) // 4
    src = torch.rand(n, device="cuda")
    dst = torch.empty_like(src)
    median, _ = time_cuda(torch, lambda: dst.copy_(src), 3, iters)
    return 2 * src.numel() * 4 / (median * 1e6)


def fusebox_row(args, path, label, flags):
    command = [args.fusebox, "bench", path, "--backend", "cuda", "--json", "--iters", str(args.iters)]
    done = subprocess.run(command + flags, capture_output=True, text=True)
    if done.returncode != 0:
        return {"variant": label, "status": "failed: " + done.stderr.strip()[:200]}
    report = json.loads(done.stdout)
    return {
        "variant": label,
        "status": "ok",
        "median_ms": report["median_ms"],
        "min_ms": report["min_ms"],
        "note": f"{report['kernels']} kernel(s), {report['launches']} launch(es), "
        f"{report['bytes']:,} B at kernel boundaries, same-bytes copy "
        f"{report['copy_gbps']:.0f} GB/s, compile {report['compile_ms']:.0f} ms",
        "fusebox": report,
    }


def worst_error(torch, outputs, reference):
    worst = 0.0
    for y, ref in zip(outputs, reference):
        y, ref = y.double(), ref.double()
        finite = torch.isfinite(ref)
        if y.shape != ref.shape or not torch.equal(torch.isnan(y), torch.isnan(ref)):
            return float("inf")
        if finite.any():
            scale = ref[finite].abs().max().clamp_min(1e-300)
            worst = max(worst, float(((y - ref)[finite]).abs().max() / scale))
    return worst


def torch_rows(args, torch, graph):
    rows = []
    try:
        fn = graphs.torch_function(graph, torch, "cuda")
    except NotImplementedError as exc:
        return [{"variant": "torch", "status": f"skipped: {exc}"}], None
    inputs = graphs.torch_inputs(graph, torch, "cuda", args.seed)
    with torch.inference_mode():
        eager_out = fn(*inputs)
    compulsory = sum(x.numel() * x.element_size() for x in inputs) + sum(
        y.numel() * y.element_size() for y in eager_out
    )
    names = {torch.float32: "f32", torch.float64: "f64", torch.float16: "f16", torch.bfloat16: "bf16"}
    tol = max((COMPILE_TOLERANCE.get(names.get(y.dtype), 0.0) for y in eager_out), default=0.0)

    def timed(label, run, note=""):
        try:
            with torch.inference_mode():
                median, minimum = time_cuda(torch, run, args.warmup, args.iters)
            rows.append({"variant": label, "status": "ok", "median_ms": median,
                         "min_ms": minimum, "note": note})
        except Exception as exc:  # a peer's failure is a result, not a crash
            rows.append({"variant": label, "status": f"failed: {first_line(exc)}"})

    timed("torch eager", lambda: fn(*inputs))
    modes = [("torch.compile", None), ("torch.compile reduce-overhead", "reduce-overhead")]
    modes = [(label, mode) for label, mode in modes if (mode or "default") in args.compile_modes.split(",")]
    for label, mode in modes:
        try:
            torch._dynamo.reset()
            compiled = torch.compile(fn, mode=mode) if mode else torch.compile(fn)
            start = time.perf_counter()
            with torch.inference_mode():
                out = compiled(*inputs)
                torch.cuda.synchronize()
            compile_s = time.perf_counter() - start
            err = worst_error(torch, out, eager_out)
        except Exception as exc:
            rows.append({"variant": label, "status": f"failed: {first_line(exc)}"})
            continue
        if not err <= tol:
            rows.append({"variant": label, "status": f"wrong: max rel err vs eager {err:.3g}"})
            continue
        timed(label, lambda: compiled(*inputs), f"compile {compile_s:.1f} s, max rel err {err:.1e}")
    return rows, compulsory


def table(results, copy):
    header = f"{'example':<20} {'variant':<30} {'median ms':>10} {'GB/s':>9} {'% copy':>7}  notes"
    lines = [f"device-to-device copy: {copy:.0f} GB/s", "", header, "-" * len(header)]
    for ex in results:
        for r in ex["rows"]:
            if r.get("status") != "ok":
                lines.append(f"{ex['example']:<20} {r['variant']:<30} {r['status']}")
                continue
            gbps = ex["bytes"] / (r["median_ms"] * 1e6) if ex["bytes"] else float("nan")
            lines.append(
                f"{ex['example']:<20} {r['variant']:<30} {r['median_ms']:>10.4f} {gbps:>9.1f} "
                f"{100 * gbps / copy:>6.1f}%  {r.get('note', '')}"
            )
        lines.append(f"{'':<20} ({ex['bytes']:,} compulsory bytes)")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fusebox", default=os.path.join(ROOT, "target", "release", "fusebox"))
    parser.add_argument("--examples", help="comma-separated example names or .ron graph files (default: every examples/*.ron)")
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--copy-mib", type=int, default=1024)
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument(
        "--compile-modes", default="default,reduce-overhead",
        help="torch.compile modes to time (default, reduce-overhead; empty for eager alone)",
    )
    args = parser.parse_args()
    args.iters = max(args.iters, 1)

    try:
        import torch
    except Exception as exc:
        sys.exit(f"peers_gpu.py needs PyTorch: {first_line(exc)}")
    if not torch.cuda.is_available():
        sys.exit("peers_gpu.py: torch.cuda.is_available() is false")

    examples = graphs.example_paths(ROOT, args.examples)
    copy = copy_gbps(torch, args.copy_mib, args.iters)
    results = []
    for name, path in examples:
        graph = graphs.read(path)
        rows = [
            fusebox_row(args, path, "fusebox fused", []),
            fusebox_row(args, path, "fusebox fused, CUDA graph", ["--cuda-graph"]),
            fusebox_row(args, path, "fusebox unfused", ["--no-fusion"]),
        ]
        peer_rows, compulsory = torch_rows(args, torch, graph)
        rows += peer_rows
        if compulsory is None:
            compulsory = next((r["fusebox"]["bytes"] for r in rows if "fusebox" in r), 0)
        results.append({"example": name, "bytes": compulsory, "rows": rows})
        print(f"{name}: done", file=sys.stderr)
    machine = {
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "copy_gbps": copy,
    }
    print(f"{machine['device']}, torch {machine['torch']} (CUDA {machine['cuda']})")
    print(table(results, copy))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine, "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
