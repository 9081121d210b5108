#!/usr/bin/env python3
"""Two or more builds (or rule directories) of fusebox on the same graphs, alternated in one
sitting on one GPU: the side-by-side comparison a change to the CUDA kernels or to the cost
model needs, since a GPU's clocks and neighbours move between sittings.

Each variant is `LABEL=BINARY` or `LABEL=BINARY@RULES_DIR` (the rule directory is laid over
the embedded rules, as `--rules` does), optionally followed by `+FLAG`s that only this variant
passes to `bench` (`lt=./fusebox+--lt-epilogues` beside `plain=./fusebox`). For every round, every graph and every variant in turn
it runs `fusebox bench G --backend cuda --json --iters N` and records the CUDA-event median,
the kernels, launches and bytes at kernel boundaries, and the device-to-device copy of those
bytes that the same call measured. The table gives each variant's medians per round and the
copy floor of the smallest byte count any variant moves for that graph.

    python3 benches/gpu/alternate.py --variant new=./fusebox --variant old=./fusebox-old \\
        --graphs book/examples/layout/softmax_of_erf.ron,examples/softmax.ron --rounds 3
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def parse_variant(text):
    label, sep, rest = text.partition("=")
    if not sep or not label or not rest:
        raise argparse.ArgumentTypeError(f"variant `{text}`: expected LABEL=BINARY[@RULES_DIR][+FLAG...]")
    head, *flags = rest.split("+")
    binary, _, rules = head.partition("@")
    return {"label": label, "binary": binary, "rules": rules or None, "flags": flags}


def bench(variant, graph, iters, extra, backend):
    command = [variant["binary"], "bench", graph, "--backend", backend, "--json", "--iters", str(iters)]
    if variant["rules"]:
        command += ["--rules", variant["rules"]]
    command += variant.get("flags", [])
    done = subprocess.run(command + extra, capture_output=True, text=True)
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1][:200] if done.stderr.strip() else "failed"}
    return json.loads(done.stdout)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", action="append", type=parse_variant, required=True)
    parser.add_argument("--graphs", required=True, help="comma-separated graph files")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--backend", default="cuda", help="cpu checks this script without a GPU")
    parser.add_argument("--cuda-graph", action="store_true", help="time CUDA graph replays")
    parser.add_argument("--json", help="also write every measurement to this file")
    args = parser.parse_args()
    extra = ["--cuda-graph"] if args.cuda_graph else []
    graphs = [g if os.path.isabs(g) else os.path.join(ROOT, g) for g in args.graphs.split(",")]

    runs = {}  # (graph, label) -> list of reports
    for round_index in range(args.rounds):
        for graph in graphs:
            for variant in args.variant:
                report = bench(variant, graph, args.iters, extra, args.backend)
                runs.setdefault((graph, variant["label"]), []).append(report)
        print(f"round {round_index + 1} done", file=sys.stderr)

    device = next((r.get("device") for rs in runs.values() for r in rs if r.get("device")), "?")
    print(f"device: {device}; {args.rounds} rounds of {args.iters} runs (CUDA-event medians, ms)")
    header = f"{'graph':<24} {'variant':<14} {'kernels':>7} {'launches':>8} {'MiB':>7}  medians (ms) per round"
    print(header)
    print("-" * len(header))
    for graph in graphs:
        name = os.path.basename(graph)[:-4]
        floor = None
        for variant in args.variant:
            reports = runs[(graph, variant["label"])]
            good = [r for r in reports if "error" not in r]
            if not good:
                print(f"{name:<24} {variant['label']:<14} failed: {reports[0]['error']}")
                continue
            first = good[0]
            medians = [r["median_ms"] for r in good]
            copy_ms = [r["bytes"] / (r["copy_gbps"] * 1e6) for r in good if r.get("copy_gbps")]
            if copy_ms and (floor is None or first["bytes"] < floor[0]):
                floor = (first["bytes"], statistics.median(copy_ms))
            print(
                f"{name:<24} {variant['label']:<14} {first['kernels']:>7} {first.get('launches') or 0:>8} "
                f"{first['bytes'] / 2**20:>7.1f}  " + ", ".join(f"{m:.4f}" for m in medians)
            )
        if floor:
            print(f"{'':<24} copy of {floor[0] / 2**20:.1f} MiB (the fewest bytes): {floor[1]:.4f} ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                [{"graph": g, "variant": l, "reports": r} for (g, l), r in runs.items()], f, indent=2
            )


if __name__ == "__main__":
    main()
