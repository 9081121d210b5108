#!/usr/bin/env python3
"""fusebox's CUDA backend against its reference evaluator, through the command line only.

For a machine with a GPU but no Rust toolchain: everything goes through a prebuilt `fusebox`
binary. For every example graph, and for random graphs written by graphs.py, it runs

    fusebox run G --backend reference ...      (the oracle: op by op, eager rounding)
    fusebox run G --backend cuda ...           (fused; --no-fusion; --deterministic; AMP)

on the same inputs and compares every output: NaN exactly where the reference has NaN,
infinities equal, finite values within the dtype's tolerance relative to the output's largest
magnitude (the tolerance of tests/common/random_graph.rs). Under `--amp f16|bf16` a float
output is held to the AMP dtype's tolerance, since its values went through that dtype. Outputs of
graphs with a matmul, whose f32 error grows with the contraction length and with the sums'
cancellation, may in addition differ by up to 4x the largest error that PyTorch eager makes on
the same GPU and the same inputs (against the same reference); without PyTorch they get no such
allowance. `--deterministic` runs are also
repeated and compared bit for bit. Random graphs get NaN, ±Inf and ±0 planted in their inputs
when run unfused (fused runs may use rewrites that hold only for finite values).

Exit status 1 if anything disagreed. Needs numpy.

    python3 benches/gpu/check_gpu.py --fusebox ./fusebox --random 200
    python3 benches/gpu/check_gpu.py --examples softmax,layernorm --random 0   # row kernels

`--rows 1` (the default) also checks softmax and layernorm at row lengths around each of the
CUDA row kernel's paths (registers, vectors, shared memory, re-reading), with strided rows
and NaN/Inf rows (check_rows).
"""

import argparse
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import graphs  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Relative tolerance per dtype, scaled by the output's largest finite magnitude (reductions
# cancel): tests/common/random_graph.rs's `tolerance`.
TOLERANCE = {"f64": 1e-9, "f32": 2e-5, "f16": 4e-3, "bf16": 3e-2}

# What `fusebox run` prints per output: `name: dtype[shape] -> path ...`.
OUTPUT_LINE = re.compile(r"^(\S+): (f16|bf16|f32|f64|i32|i64|bool)\[")


def run_fusebox(args, graph_path, backend, out_dir, extra):
    command = [args.fusebox, "run", graph_path, "--backend", backend, "--out", out_dir] + extra
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}: {done.stderr.strip()}")
    dtypes = {}
    for line in done.stdout.splitlines():
        m = OUTPUT_LINE.match(line)
        if m:
            dtypes[m.group(1)] = m.group(2)
    return dtypes


def same(np, name, dtype, want, got, atol=0.0):
    """None when `got` matches `want` (random_graph.rs's assert_same, plus an absolute `atol`
    for contractions), else why not."""
    if want.shape != got.shape:
        return f"{name}: shape {got.shape} vs {want.shape}"
    a = want.astype(np.float64).ravel()
    b = got.astype(np.float64).ravel()
    finite = np.concatenate([a[np.isfinite(a)], b[np.isfinite(b)]])
    scale = float(np.max(np.abs(finite))) if finite.size else 0.0
    rtol = TOLERANCE.get(dtype, 0.0)
    with np.errstate(invalid="ignore"):
        ok = (np.isnan(a) & np.isnan(b)) | (a == b)
        close = np.isfinite(a) & np.isfinite(b) & (np.abs(a - b) <= rtol * (np.abs(a) + scale) + atol)
    bad = np.flatnonzero(~(ok | close))
    if bad.size:
        i = int(bad[0])
        return f"{name}[{i}]: {b[i]!r} vs reference {a[i]!r} ({dtype}; {bad.size} differ)"
    return None


def bitwise_same(np, name, want, got):
    if want.shape != got.shape or want.dtype != got.dtype:
        return f"{name}: {got.dtype}{got.shape} vs {want.dtype}{want.shape}"
    a = np.ascontiguousarray(want).view(np.uint8)
    b = np.ascontiguousarray(got).view(np.uint8)
    if not np.array_equal(a, b):
        return f"{name}: deterministic runs differ"
    return None


def amp_dtype(extra):
    """The AMP dtype a run's flags ask for, or None."""
    return extra[extra.index("--amp") + 1] if "--amp" in extra else None


def output_tolerance_dtype(dtype, amp):
    """The dtype whose tolerance an output is held to: a float output of an AMP run carries
    the rounding of the AMP dtype even when it is stored wider."""
    if amp and dtype in ("f32", "f64") and TOLERANCE[amp] > TOLERANCE[dtype]:
        return amp
    return dtype


def torch_errors(np, graph, input_paths, ref_dir, amp):
    """{output: max |PyTorch eager - reference|} on the GPU for a graph with a matmul, the
    yardstick for errors that grow with contraction length; {} without PyTorch or CUDA."""
    if not any(n["op"] == "matmul" for n in graph["nodes"]):
        return {}
    try:
        import torch
    except ImportError:
        return {}
    if not torch.cuda.is_available():
        return {}
    try:
        fn = graphs.torch_function(graph, torch, "cuda")
        inputs = [
            torch.from_numpy(np.load(input_paths[i["name"]]))
            .to(graphs.torch_dtype(torch, i["dtype"]))
            .cuda()
            for i in graph["inputs"]
        ]
        cast = {"f16": torch.float16, "bf16": torch.bfloat16}.get(amp)
        with torch.autocast("cuda", dtype=cast or torch.float16, enabled=cast is not None):
            results = fn(*inputs)
    except (NotImplementedError, RuntimeError, KeyError):
        return {}
    errors = {}
    for name, value in zip(graph["outputs"], results):
        want = np.load(os.path.join(ref_dir, name + ".npy")).astype(np.float64)
        got = value.double().cpu().numpy()
        finite = np.isfinite(want) & np.isfinite(got)
        errors[name] = float(np.max(np.abs(want - got)[finite])) if finite.any() else 0.0
    return errors


def compare(args, np, graph_path, outputs, reference_extra, cuda_extra, deterministic_twice,
            graph=None, input_paths=None):
    """Runs the reference and the cuda backend; a list of problems (empty when they agree).
    With `graph` and the `input_paths` both runs read, a graph with a matmul gets the PyTorch
    allowance (see the module doc)."""
    work = tempfile.mkdtemp(prefix="fusebox-gpu-check-")
    try:
        ref_dir, cuda_dir, again_dir = (os.path.join(work, d) for d in ("ref", "cuda", "again"))
        dtypes = run_fusebox(args, graph_path, "reference", ref_dir, reference_extra)
        run_fusebox(args, graph_path, args.backend, cuda_dir, cuda_extra)
        amp = amp_dtype(cuda_extra)
        allowance = {}
        if graph is not None and input_paths is not None and args.backend == "cuda":
            allowance = torch_errors(np, graph, input_paths, ref_dir, amp)
        problems = []
        for name in outputs:
            want = np.load(os.path.join(ref_dir, name + ".npy"))
            got = np.load(os.path.join(cuda_dir, name + ".npy"))
            dtype = output_tolerance_dtype(dtypes.get(name, "f32"), amp)
            atol = 4.0 * allowance.get(name, 0.0)
            problem = same(np, name, dtype, want, got, atol)
            if problem:
                problems.append(problem + (f" (PyTorch eager's error: {atol / 4:.3g})" if atol else ""))
        if deterministic_twice:
            run_fusebox(args, graph_path, args.backend, again_dir, cuda_extra)
            for name in outputs:
                first = np.load(os.path.join(cuda_dir, name + ".npy"))
                second = np.load(os.path.join(again_dir, name + ".npy"))
                problem = bitwise_same(np, name, first, second)
                if problem:
                    problems.append(problem)
        return problems
    finally:
        shutil.rmtree(work, ignore_errors=True)


def write_inputs(np, graph, directory, seed, specials, paths=None):
    """Inputs as .npy files (bf16 written as f32: fusebox converts on reading); the `--input`
    flags, and each input's file in `paths` when given."""
    rng = np.random.default_rng(seed)
    flags = []
    storage = {"f16": np.float16, "bf16": np.float32, "f32": np.float32, "f64": np.float64}
    for i in graph["inputs"]:
        x = rng.uniform(-3.0, 3.0, i["shape"])
        if specials:
            mask = rng.integers(0, 8, i["shape"]) == 0
            picks = rng.choice([np.nan, np.inf, -np.inf, 0.0, -0.0], size=i["shape"])
            x = np.where(mask, picks, x)
        path = os.path.join(directory, i["name"] + ".npy")
        np.save(path, np.asarray(x).astype(storage[i["dtype"]]))
        flags += ["--input", f"{i['name']}={path}"]
        if paths is not None:
            paths[i["name"]] = path
    return flags


def check_examples(args, np, report):
    examples = graphs.example_paths(ROOT, args.examples)
    variants = [
        ("fused", [], []),
        ("unfused", [], ["--no-fusion"]),
        ("deterministic", [], ["--deterministic"]),
        ("unfused deterministic", [], ["--no-fusion", "--deterministic"]),
        ("amp f16", ["--amp", "f16"], ["--amp", "f16"]),
        ("amp bf16", ["--amp", "bf16"], ["--amp", "bf16"]),
        ("amp f16 unfused", ["--amp", "f16"], ["--amp", "f16", "--no-fusion"]),
    ]
    if args.backend != "cuda":
        variants = [v for v in variants if "--deterministic" not in v[2]]
    for name, path in examples:
        graph = graphs.read(path)
        for label, ref_extra, cuda_extra in variants:
            input_dir = tempfile.mkdtemp(prefix="fusebox-gpu-inputs-")
            try:
                # Inputs written here (uniform in [-3, 3], as `--random-inputs`) so that
                # PyTorch can read the same ones for a graph with a matmul.
                input_paths = {}
                flags = write_inputs(np, graph, input_dir, args.seed, False, input_paths)
                problems = compare(
                    args, np, path, graph["outputs"], ref_extra + flags, cuda_extra + flags,
                    "--deterministic" in cuda_extra, graph, input_paths,
                )
            except (RuntimeError, KeyError) as exc:
                problems = [str(exc)]
            finally:
                shutil.rmtree(input_dir, ignore_errors=True)
            report(f"{name} ({label})", problems)


# Row lengths around the CUDA row kernel's path limits (src/backend/cuda/abi.rs, row_path):
# odd lengths run the register cache element by element, multiples of the vector width with
# 16-byte vectors (1000: 64 threads, 4096: the full block of 256 x 16 floats), 4097 the
# shared-memory cache, up to 48 KiB less the combination's 128 static bytes (12256 f32,
# 24512 f16/bf16), then the re-reading path (12288 f32 and 24576 f16/bf16: 48 KiB exactly,
# whose launch failed while the cache could ask for all of it).
ROW_LENGTHS = [1, 31, 33, 1000, 1023, 4096, 4097, 12256, 12288, 24512, 24576]


def check_rows(args, np, report):
    """Softmax and layernorm at every ROW_LENGTHS, in f32, f16 and bf16, and with a transposed
    (strided) input, fused into one row kernel each, against the reference evaluator (f64
    accumulation, eager rounding); softmax f32 also with NaN, ±Inf and ±0 in its rows."""
    work = tempfile.mkdtemp(prefix="fusebox-gpu-rows-")
    cases = []
    for kind in ["softmax", "layernorm"]:
        for dtype in ["f32", "f16", "bf16"]:
            for length in ROW_LENGTHS:
                cases.append((kind, dtype, length, False, False))
        for length in [33, 1000, 4097]:
            cases.append((kind, "f32", length, True, False))
    for length in [33, 1000, 4097, 12288]:
        cases.append(("softmax", "f32", length, False, True))
    try:
        for index, (kind, dtype, length, transposed, specials) in enumerate(cases):
            rows = 5 if length < 4096 else 3
            graph = graphs.row_graph(kind, dtype, rows, length, transposed)
            path = os.path.join(work, f"row_{index}.ron")
            with open(path, "w") as f:
                f.write(graphs.to_ron(graph))
            input_dir = os.path.join(work, f"inputs_{index}")
            os.makedirs(input_dir)
            flags = write_inputs(np, graph, input_dir, args.seed + index, specials)
            label = f"{kind} {dtype} [{rows}, {length}]"
            if transposed:
                label += " transposed"
            if specials:
                label += " NaN/Inf"
            try:
                problems = compare(args, np, path, graph["outputs"], flags, flags, False)
            except RuntimeError as exc:
                problems = [str(exc)]
            report(label, problems)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def check_random(args, np, report):
    rng = random.Random(args.seed)
    work = tempfile.mkdtemp(prefix="fusebox-gpu-random-")
    checked = skipped = 0
    try:
        index = 0
        while checked < args.random and index < args.random * 20:
            index += 1
            graph = graphs.random_graph(rng, index)
            if graph is None:
                continue
            path = os.path.join(work, f"random_{index}.ron")
            with open(path, "w") as f:
                f.write(graphs.to_ron(graph))
            done = subprocess.run([args.fusebox, "check", path], capture_output=True, text=True)
            if done.returncode != 0:
                skipped += 1
                continue
            checked += 1
            fused = index % 4 != 0
            input_dir = os.path.join(work, f"inputs_{index}")
            os.makedirs(input_dir)
            input_paths = {}
            flags = write_inputs(np, graph, input_dir, index, not fused, input_paths)
            cuda_extra = list(flags) + ([] if fused else ["--no-fusion"])
            if index % 3 == 0 and args.backend == "cuda":
                cuda_extra.append("--deterministic")
            try:
                problems = compare(
                    args, np, path, graph["outputs"], flags, cuda_extra,
                    "--deterministic" in cuda_extra, graph, input_paths,
                )
            except RuntimeError as exc:
                problems = [str(exc)]
            if problems and args.keep:
                os.makedirs(args.keep, exist_ok=True)
                shutil.copy(path, args.keep)
            report(f"random_{index} ({'fused' if fused else 'unfused, NaN/Inf inputs'})", problems)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"random graphs: {checked} checked ({skipped} generated graphs rejected by `fusebox check`)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fusebox", default=os.path.join(ROOT, "target", "release", "fusebox"))
    parser.add_argument("--random", type=int, default=100, help="random graphs to check")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--examples", help="comma-separated example names or .ron graph files (default: every examples/*.ron)")
    parser.add_argument("--keep", help="copy failing random graphs into this directory")
    parser.add_argument(
        "--rows", type=int, default=1, help="1: check softmax/layernorm at row lengths around each CUDA row path"
    )
    parser.add_argument(
        "--backend", default="cuda", help="the backend checked (cpu tests this script without a GPU)"
    )
    args = parser.parse_args()
    try:
        import numpy as np
    except ImportError:
        sys.exit("check_gpu.py needs numpy")

    failures = []
    passed = 0

    def report(what, problems):
        nonlocal passed
        if problems:
            failures.append(what)
            print(f"FAIL {what}")
            for p in problems[:5]:
                print(f"     {p}")
        else:
            passed += 1
            print(f"ok   {what}")
        sys.stdout.flush()

    check_examples(args, np, report)
    if args.rows:
        check_rows(args, np, report)
    if args.random > 0:
        check_random(args, np, report)
    print(f"\n{passed} passed, {len(failures)} failed")
    if failures:
        print("failed: " + ", ".join(failures))
        sys.exit(1)


if __name__ == "__main__":
    main()
