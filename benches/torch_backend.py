"""torch.compile(backend="fusebox") against eager PyTorch and torch.compile's default (Inductor),
side by side in one run: a GPT-2-style block, an MLP and an LSTM cell written in PyTorch,
inference under torch.no_grad() and training steps. Also the backend's Python glue per call: a
call of a compiled tiny module against the fusebox run it makes.

    python benches/torch_backend.py [--threads 2] [--rounds 5]            # the CPU
    python benches/torch_backend.py --device cuda [--amp bf16]            # a GPU

On a GPU the modules are larger (batch 8192 tokens for the block and the MLP, 4096 for the
cell), each time is the mean of --iters calls queued back to back between two CUDA events
(what a call costs when the host keeps the GPU fed), and --amp bf16 runs every engine under
torch.autocast(bfloat16).

Needs PyTorch and the fusebox package (`pip install .`, or PYTHONPATH=python with the native
module built). Prints a Markdown table (median ms per call; rounds alternate the three).
"""

import argparse
import contextlib
import statistics
import sys
import time

import torch
import torch.nn as nn

import fusebox.torch as fusebox_torch
from torch_modules import Block, Cell  # benches/, beside this script


def mlp():
    return nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024), nn.ReLU())


def median_ms(fn, args, iters):
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        fn(*args)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def in_fusebox(report) -> str:
    """How many of the graphs' ATen ops ran in fusebox parts, of all ops: proof that a row's
    fusebox column timed fusebox and not PyTorch's fallback."""
    total = sum(graph["nodes"] for graph in report)
    ran = sum(len(p["nodes"]) for graph in report for p in graph["parts"] if any(c["kernels"] for c in p["compiled"]))
    return f"{ran}/{total}"


def gpu_ms(fn, args, iters):
    """Mean ms per call of `iters` calls queued between two CUDA events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn(*args)
    start.record()
    for _ in range(iters):
        fn(*args)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters


def cases_for(device: str):
    if device == "cpu":
        return [
            ("GPT-2 block 768, 8×128", Block(), (torch.randn(8, 128, 768),)),
            ("MLP 1024→4096→1024, batch 256", mlp(), (torch.randn(256, 1024),)),
            ("LSTM cell 1024, batch 256", Cell(), tuple(torch.randn(256, 1024) for _ in range(3))),
        ]
    gpu = torch.device(device)
    return [
        ("GPT-2 block 768, 16×512", Block().to(gpu), (torch.randn(16, 512, 768, device=gpu),)),
        ("MLP 1024→4096→1024, batch 8192", mlp().to(gpu), (torch.randn(8192, 1024, device=gpu),)),
        ("LSTM cell 1024, batch 4096", Cell().to(gpu), tuple(torch.randn(4096, 1024, device=gpu) for _ in range(3))),
    ]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--device", default="cpu", help="cpu, or cuda (cuda:N)")
    parser.add_argument("--amp", choices=["bf16", "f16"], help="run every engine under torch.autocast")
    parser.add_argument("--no-training", action="store_true", help="time inference only")
    parser.add_argument("--no-glue", action="store_true", help="skip the glue measurement")
    parser.add_argument("--glue-only", action="store_true", help="only the glue measurement")
    parser.add_argument("--lt-epilogues", action="store_true",
                        help="also time fusebox with options={'lt_epilogues': True} (CUDA: epilogues in cuBLASLt), "
                             "inference only, in the same rounds")
    args = parser.parse_args()
    if args.glue_only:
        glue(args)
        return
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cases = cases_for(args.device)
    on_gpu = args.device != "cpu"
    timed = gpu_ms if on_gpu else median_ms
    if args.amp:
        dtype = torch.bfloat16 if args.amp == "bf16" else torch.float16
        autocast = lambda: torch.autocast(torch.device(args.device).type, dtype=dtype)  # noqa: E731
    else:
        autocast = contextlib.nullcontext
    where = torch.cuda.get_device_name(torch.device(args.device)) if on_gpu else f"{args.threads} threads"
    print(f"torch {torch.__version__}, {where}, amp {args.amp or 'off'}, {args.rounds} rounds of {args.iters}", file=sys.stderr)
    lt = " | fusebox lt_epilogues | lt / fusebox | lt max abs error" if args.lt_epilogues else ""
    print(f"| module | fusebox | torch eager | torch.compile (Inductor) | fusebox / eager | fusebox / Inductor | max abs error | ops in fusebox{lt} |")
    print("|---|---|---|---|---|---|---|---|" + ("---|---|---|" if lt else ""))
    with torch.no_grad(), autocast():
        for name, module, inputs in cases:
            torch._dynamo.reset()
            fusebox_torch.reset_report()
            fused = torch.compile(module, backend="fusebox")
            inductor = torch.compile(module)
            want = module(*inputs)
            got = fused(*inputs)
            inductor(*inputs)
            ran = in_fusebox(fusebox_torch.last_report())
            want = want if isinstance(want, tuple) else (want,)
            got = got if isinstance(got, tuple) else (got,)
            error = max((g.float() - w.float()).abs().max().item() for g, w in zip(got, want))
            engines = [("fusebox", fused), ("eager", module), ("inductor", inductor)]
            if args.lt_epilogues:
                with_lt = torch.compile(module, backend="fusebox", options={"lt_epilogues": True})
                got_lt = with_lt(*inputs)
                got_lt = got_lt if isinstance(got_lt, tuple) else (got_lt,)
                lt_error = max((g.float() - w.float()).abs().max().item() for g, w in zip(got_lt, want))
                engines.append(("lt", with_lt))
            runs = {key: [] for key, _ in engines}
            for _ in range(args.rounds):
                for key, fn in engines:
                    runs[key].append(timed(fn, inputs, args.iters))
            f, e, i = (statistics.median(runs[k]) for k in ("fusebox", "eager", "inductor"))
            row = f"| {name} | {f:.2f} ms | {e:.2f} | {i:.2f} | {f / e:.2f} | {f / i:.2f} | {error:.1e} | {ran} |"
            if args.lt_epilogues:
                t = statistics.median(runs["lt"])
                row += f" {t:.2f} ms | {t / f:.2f} | {lt_error:.1e} |"
            print(row)
    if not args.no_training:
        training(cases, timed, autocast, args)
    if not args.no_glue:
        glue(args)


def training(cases, timed, autocast, args):
    """Training steps: forward, a loss over every output, backward (parameter gradients)."""
    print()
    print("| training step | fusebox | torch eager | torch.compile (Inductor) | fusebox / eager | fusebox / Inductor | max abs gradient error | ops in fusebox |")
    print("|---|---|---|---|---|---|---|---|")
    for name, module, inputs in cases:
        torch._dynamo.reset()
        fusebox_torch.reset_report()
        engines = {"fusebox": torch.compile(module, backend="fusebox"), "eager": module, "inductor": torch.compile(module)}

        def step(fn):
            with autocast():
                out = fn(*inputs)
                out = out if isinstance(out, tuple) else (out,)
                loss = sum(o.float().square().mean() for o in out)
            loss.backward()

        grads = {}
        for key, fn in engines.items():
            module.zero_grad()
            step(fn)
            grads[key] = [p.grad.clone() for p in module.parameters()]
        error = max((f - e).abs().max().item() for f, e in zip(grads["fusebox"], grads["eager"]))
        ran = in_fusebox(fusebox_torch.last_report())
        runs = {key: [] for key in engines}
        for _ in range(args.rounds):
            for key, fn in engines.items():
                runs[key].append(timed(step, (fn,), max(args.iters // 4, 3)))
        f, e, i = (statistics.median(runs[k]) for k in ("fusebox", "eager", "inductor"))
        print(f"| {name} | {f:.2f} ms | {e:.2f} | {i:.2f} | {f / e:.2f} | {f / i:.2f} | {error:.1e} | {ran} |")


def glue(args):
    with torch.no_grad():
        # The glue: a compiled tiny module against the fusebox run inside it.
        torch._dynamo.reset()
        fusebox_torch.reset_report()
        tiny = torch.compile(lambda x: torch.relu(x) * 2.0, backend="fusebox")
        x = torch.randn(16, device=args.device)
        tiny(x)
        part = fusebox_torch._PARTS[-1]
        compiled = next(v for v in part.compiled.values() if v)[0]
        name = next(n.name for n in part.gm.graph.nodes if n.op == "placeholder")
        out = torch.empty(16, device=args.device)
        native = compiled._native
        ins, outs = [(name, "f32", [16], x.data_ptr())], [("f32", [16], out.data_ptr())]
        if x.device.type == "cuda":
            stream = torch.cuda.current_stream().cuda_stream
            run = lambda: native._run_device(ins, outs, stream)  # noqa: E731
        else:
            run = lambda: native._run_addresses(ins, outs)  # noqa: E731
        whole = statistics.median(median_ms(tiny, (x,), 2000) for _ in range(args.rounds)) * 1e3
        glue = statistics.median(median_ms(part, (x,), 2000) for _ in range(args.rounds)) * 1e3
        inner = statistics.median(median_ms(run, (), 2000) for _ in range(args.rounds)) * 1e3
        eager = statistics.median(median_ms(lambda v: torch.relu(v) * 2.0, (x,), 2000) for _ in range(args.rounds)) * 1e3
        print()
        if x.device.type == "cuda":
            torch.cuda.synchronize()
        print(f"tiny module (relu(x) * 2, 16 elements, {args.device}), host µs per call: {whole:.1f} through torch.compile(backend=\"fusebox\");")
        print(f"{glue:.1f} in fusebox's part (its Python layer and the run), {inner:.1f} in the native run alone:")
        print(f"fusebox's glue {glue - inner:.1f} µs, Dynamo's guards and AOTAutograd's wrapper {whole - glue:.1f} µs; eager {eager:.1f} µs.")


if __name__ == "__main__":
    main()
