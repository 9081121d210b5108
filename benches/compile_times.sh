#!/usr/bin/env bash
# How long the C compiler takes to build the CLI's fused kernels, with and without the
# precompiled header the kernel cache keeps (book: lowering chapter, "The kernel cache").
#
#   benches/compile_times.sh [FUSEBOX_BINARY [GRAPH ...]]
#
# Defaults: target/release/fusebox and examples/{lstm_cell,layernorm,softmax,lstm_cell_backward}.
# For each graph, the module `fusebox optimize --emit c` writes is built the way
# src/backend/cpu/compiler.rs builds it (DEFAULT_FLAGS, then LINK_LIBS), three times without
# the header and three times with `-include` of it; the fastest of each is printed, and the two
# libraries are compared byte for byte. The header is made the way the compiler makes it: the
# system headers the modules include (tests/cpu_emit.rs checks that PRECOMPILED_HEADER is
# exactly those), the AVX-512 one under its guard, compiled with the same flags. FUSEBOX_CC
# picks the compiler, as it does for fusebox.
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${1:-target/release/fusebox}"
shift || true
graphs=("$@")
if [ ${#graphs[@]} -eq 0 ]; then
    graphs=(examples/lstm_cell.ron examples/layernorm.ron examples/softmax.ron examples/lstm_cell_backward.ron)
fi
cc="${FUSEBOX_CC:-cc}"
flags=(-O3 -march=native -fopenmp -fPIC -shared -fno-math-errno -ffp-contract=off)
libs=(-lmvec -lm)
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

for graph in "${graphs[@]}"; do
    "$bin" optimize "$graph" --emit c --out "$work/$(basename "$graph" .ron).c" >/dev/null
done
{
    echo "/* The system headers of the modules below. */"
    grep -h '^#include' "$work"/*.c | grep -v immintrin | sort -u
    printf '#if defined(__AVX512F__)\n#include <immintrin.h>\n#endif\n'
} >"$work/header.h"
"$cc" "${flags[@]}" -x c-header "$work/header.h" -o "$work/header.h.gch"

# The fastest of three builds, in seconds (bash's own `time`, wall clock).
fastest() {
    local best="" took
    for _ in 1 2 3; do
        took=$( { TIMEFORMAT=%R; time "$@" >/dev/null 2>&1; } 2>&1 )
        if [ -z "$best" ] || awk "BEGIN { exit !($took < $best) }"; then best=$took; fi
    done
    echo "$best"
}

printf '%-24s %12s %12s  %s\n' graph "without (s)" "with (s)" "libraries"
for graph in "${graphs[@]}"; do
    name="$(basename "$graph" .ron)"
    src="$work/$name.c"
    plain=$(fastest "$cc" "${flags[@]}" -o "$work/$name.plain.so" "$src" "${libs[@]}")
    with=$(fastest "$cc" "${flags[@]}" -include "$work/header.h" -o "$work/$name.pch.so" "$src" "${libs[@]}")
    if cmp -s "$work/$name.plain.so" "$work/$name.pch.so"; then same="identical"; else same="DIFFER"; fi
    printf '%-24s %12s %12s  %s\n' "$name" "$plain" "$with" "$same"
done
