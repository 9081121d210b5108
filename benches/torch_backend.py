"""torch.compile(backend="fusebox") against eager PyTorch and torch.compile's default (Inductor),
side by side in one run, on the CPU: a GPT-2-style block, an MLP and an LSTM cell written in
PyTorch, inference under torch.no_grad(). Also the backend's Python glue per call: a call of a
compiled tiny module against the fusebox run it makes.

    python benches/torch_backend.py [--threads 2] [--rounds 5]

Needs PyTorch and the fusebox package (`pip install .`, or PYTHONPATH=python with the native
module built). Prints a Markdown table (median ms per call; rounds alternate the three).
"""

import argparse
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


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cases = [
        ("GPT-2 block 768, 8×128", Block(), (torch.randn(8, 128, 768),)),
        ("MLP 1024→4096→1024, batch 256", mlp(), (torch.randn(256, 1024),)),
        ("LSTM cell 1024, batch 256", Cell(), tuple(torch.randn(256, 1024) for _ in range(3))),
    ]
    print(f"torch {torch.__version__}, {args.threads} threads, {args.rounds} rounds of {args.iters}", file=sys.stderr)
    print("| module | fusebox | torch eager | torch.compile (Inductor) | fusebox / eager | fusebox / Inductor | max abs error |")
    print("|---|---|---|---|---|---|---|")
    with torch.no_grad():
        for name, module, inputs in cases:
            torch._dynamo.reset()
            fused = torch.compile(module, backend="fusebox")
            inductor = torch.compile(module)
            want = module(*inputs)
            got = fused(*inputs)
            inductor(*inputs)
            want = want if isinstance(want, tuple) else (want,)
            got = got if isinstance(got, tuple) else (got,)
            error = max((g - w).abs().max().item() for g, w in zip(got, want))
            runs = {"fusebox": [], "eager": [], "inductor": []}
            for _ in range(args.rounds):
                for key, fn in (("fusebox", fused), ("eager", module), ("inductor", inductor)):
                    runs[key].append(median_ms(fn, inputs, args.iters))
            f, e, i = (statistics.median(runs[k]) for k in ("fusebox", "eager", "inductor"))
            print(f"| {name} | {f:.2f} ms | {e:.2f} | {i:.2f} | {f / e:.2f} | {f / i:.2f} | {error:.1e} |")
    # Training steps: forward, a loss over every output, backward (parameter gradients).
    print()
    print("| training step | fusebox | torch eager | torch.compile (Inductor) | fusebox / eager | fusebox / Inductor | max abs gradient error |")
    print("|---|---|---|---|---|---|---|")
    for name, module, inputs in cases:
        torch._dynamo.reset()
        engines = {"fusebox": torch.compile(module, backend="fusebox"), "eager": module, "inductor": torch.compile(module)}

        def step(fn):
            out = fn(*inputs)
            out = out if isinstance(out, tuple) else (out,)
            sum(o.square().mean() for o in out).backward()

        grads = {}
        for key, fn in engines.items():
            module.zero_grad()
            step(fn)
            grads[key] = [p.grad.clone() for p in module.parameters()]
        error = max((f - e).abs().max().item() for f, e in zip(grads["fusebox"], grads["eager"]))
        runs = {key: [] for key in engines}
        for _ in range(args.rounds):
            for key, fn in engines.items():
                runs[key].append(median_ms(step, (fn,), max(args.iters // 4, 3)))
        f, e, i = (statistics.median(runs[k]) for k in ("fusebox", "eager", "inductor"))
        print(f"| {name} | {f:.2f} ms | {e:.2f} | {i:.2f} | {f / e:.2f} | {f / i:.2f} | {error:.1e} |")
    with torch.no_grad():
        # The glue: a compiled tiny module against the fusebox run inside it.
        torch._dynamo.reset()
        fusebox_torch.reset_report()
        tiny = torch.compile(lambda x: torch.relu(x) * 2.0, backend="fusebox")
        x = torch.randn(16)
        tiny(x)
        part = fusebox_torch._PARTS[-1]
        compiled, names, _ = next(v for v in part.compiled.values() if v)
        out = torch.empty(16)
        native = compiled._native
        run = lambda: native._run_addresses([(names[0][0], "f32", [16], x.data_ptr())], [("f32", [16], out.data_ptr())])  # noqa: E731
        whole = statistics.median(median_ms(tiny, (x,), 2000) for _ in range(args.rounds)) * 1e3
        glue = statistics.median(median_ms(part, (x,), 2000) for _ in range(args.rounds)) * 1e3
        inner = statistics.median(median_ms(run, (), 2000) for _ in range(args.rounds)) * 1e3
        eager = statistics.median(median_ms(lambda v: torch.relu(v) * 2.0, (x,), 2000) for _ in range(args.rounds)) * 1e3
        print()
        print(f"tiny module (relu(x) * 2, 16 elements), µs per call: {whole:.1f} through torch.compile(backend=\"fusebox\");")
        print(f"{glue:.1f} in fusebox's part (its Python layer and the run), {inner:.1f} in the native run alone:")
        print(f"fusebox's glue {glue - inner:.1f} µs, Dynamo's guards and AOTAutograd's wrapper {whole - glue:.1f} µs; eager {eager:.1f} µs.")


if __name__ == "__main__":
    main()
