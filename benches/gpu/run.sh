#!/usr/bin/env bash
# fusebox's GPU suite: correctness of the cuda backend against the reference evaluator, and a
# benchmark table per example against PyTorch, on a machine with an NVIDIA GPU.
#
# The GPU machine needs no Rust toolchain. Build on an x86-64 glibc machine and carry the
# results over together with this checkout (examples/, benches/gpu/):
#
#   cargo build --release                                  # -> target/release/fusebox
#   cargo test --release --test cuda_gpu --no-run          # optional: prints the test binary,
#                                                          #   target/release/deps/cuda_gpu-<hash>
#
# then, on the GPU machine, from the checkout's root:
#
#   benches/gpu/run.sh                  # everything below that can run
#   benches/gpu/run.sh info             # what fusebox finds: NVRTC, headers, driver, cuBLAS
#   benches/gpu/run.sh check            # check_gpu.py: every example (fused, unfused,
#                                       #   deterministic, AMP) and random graphs, cuda against
#                                       #   reference, through the CLI (needs numpy)
#   benches/gpu/run.sh tests            # the Rust GPU tests (option 2 below)
#   benches/gpu/run.sh bench            # peers_gpu.py: the table (needs PyTorch with CUDA)
#   benches/gpu/run.sh python          # the Python package on the GPU: python/tests/test_cuda.py
#                                       #   (CUDA tensors in place on PyTorch's stream, the
#                                       #   torch.compile backend's CUDA parts, the committed
#                                       #   ONNX models), needs the native module built
#                                       #   (python/fusebox/_fusebox.abi3.so) and PyTorch
#   benches/gpu/run.sh torch [ARGS]     # benches/torch_backend.py --device cuda ARGS: the
#                                       #   torch.compile backend against eager and Inductor
#                                       #   (not part of `all`)
#   benches/gpu/run.sh sweep [ARGS]     # reduction_sweep.py: column sums of growing size
#                                       #   against the cost model (not part of `all`)
#   benches/gpu/run.sh alternate ARGS   # alternate.py ARGS: builds or rule directories
#                                       #   alternated on the same graphs (not part of `all`)
#   benches/gpu/run.sh conv [ARGS]      # conv_gpu.py ARGS: convolutional models through cuDNN
#                                       #   and as im2col GEMMs beside torch eager and
#                                       #   torch.compile, f32 and bf16 (not part of `all`)
#
# Settings (environment):
#   FUSEBOX=path          the fusebox binary (default: ./fusebox, else target/release/fusebox)
#   CUDA_GPU_TESTS=path   the carried cuda_gpu test binary, for `tests` (option 2: the same
#                         tests as `cargo test --test cuda_gpu -- --ignored`, with the poisoned
#                         outputs, CUDA graph replay and bitwise reproducibility checks that the
#                         CLI cannot do)
#   CUDA_GPU_FILTER=name  only the cuda_gpu tests whose names contain this, for `tests`
#   FUSEBOX_CUDA_DIR=dir  NVRTC and the fp16/bf16 headers: an unpacked `nvidia/` directory of the
#                         nvidia-cuda-nvrtc-cu12 and nvidia-cuda-runtime-cu12 wheels, or a CUDA
#                         toolkit root. Unset: benches/gpu/cuda/nvidia if carried there, else
#                         fusebox searches Python's site-packages/nvidia, ~/.cache/fusebox and
#                         the system (headers from CUDA_HOME or /usr/local/cuda).
#   RANDOM_GRAPHS=n       random graphs for `check` (default 200)
#   CHECK_ROWS=0|1        whether `check` also runs softmax and layernorm at the row lengths
#                         around each CUDA row path (default 1)
#   ITERS=n               timed runs per benchmark row (default 50)
#   EXAMPLES=a,b          only these examples in `check` and `bench` (default: all; an entry
#                         ending in .ron is a graph file, e.g. book/examples/layout/softmax_of_erf.ron), e.g.
#                         EXAMPLES=softmax,layernorm RANDOM_GRAPHS=0 for the row kernels alone
#                         (check_gpu.py's row-length checks run whatever EXAMPLES says)
#   COMPILE_MODES=a,b     torch.compile modes in `bench` (default: default,reduce-overhead)
#   OUT=dir               where results go (default target/gpu-suite)
#   PYTHON=python3
#
# cudarc (fusebox's CUDA binding) opens libraries by the sonames of CUDA 12 (libnvrtc.so.12,
# libcublas.so.12) or by their unversioned names. A CUDA 13 machine (CUDA 13 driver, PyTorch
# built for CUDA 13) may have only libnvrtc.so.13 / libcublas.so.13: this script then links them
# under their unversioned names in $OUT/libshim and puts that first on LD_LIBRARY_PATH. Their C
# APIs for what fusebox calls are unchanged. `info` shows what was picked.
#
# Results: $OUT/info.txt, $OUT/check.txt, $OUT/tests.txt, $OUT/bench.txt and $OUT/bench.json;
# $OUT/sweep.txt and $OUT/sweep.json; $OUT/alternate.txt and $OUT/alternate.json.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
cd "$ROOT"

PYTHON="${PYTHON:-python3}"
OUT="${OUT:-$ROOT/target/gpu-suite}"
RANDOM_GRAPHS="${RANDOM_GRAPHS:-200}"
ITERS="${ITERS:-50}"
EXAMPLE_ARGS=()
[ -n "${EXAMPLES:-}" ] && EXAMPLE_ARGS=(--examples "$EXAMPLES")
if [ -z "${FUSEBOX:-}" ]; then
    if [ -x "$ROOT/fusebox" ]; then FUSEBOX="$ROOT/fusebox"; else FUSEBOX="$ROOT/target/release/fusebox"; fi
fi
mkdir -p "$OUT"

die() { echo "run.sh: $*" >&2; exit 1; }
[ -x "$FUSEBOX" ] || die "no fusebox binary at $FUSEBOX (set FUSEBOX=path; build it with cargo build --release)"
FUSEBOX="$(cd "$(dirname "$FUSEBOX")" && pwd)/$(basename "$FUSEBOX")"
export FUSEBOX_BIN="$FUSEBOX"

# Directories that may hold CUDA libraries: the toolkit, and every Python nvidia wheel.
library_dirs() {
    for d in "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda; do
        [ -n "$d" ] && [ -d "$d/lib64" ] && echo "$d/lib64"
    done
    "$PYTHON" - <<'EOF' 2>/dev/null || true
import glob, site, sys
roots = site.getsitepackages() + [site.getusersitepackages()]
for root in roots:
    for d in sorted(glob.glob(root + "/nvidia/*/lib")) + sorted(glob.glob(root + "/nvidia/cu*/lib*")):
        print(d)
EOF
}

# For each library cudarc opens, keep a CUDA 12 soname if one is reachable; otherwise link the
# newest major version found under the unversioned name cudarc also tries.
setup_libraries() {
    if [ -z "${FUSEBOX_CUDA_DIR:-}" ] && [ -d "$HERE/cuda/nvidia/cuda_nvrtc" ]; then
        export FUSEBOX_CUDA_DIR="$HERE/cuda/nvidia"
    fi
    local shim="$OUT/libshim" dirs extra="" lib found
    rm -rf "$shim" && mkdir -p "$shim"
    dirs="$(library_dirs | awk '!seen[$0]++')"
    for lib in nvrtc cublas cublasLt; do
        found=""
        # (grep reads everything: with -q it could stop early and fail the pipe under pipefail)
        if ldconfig -p 2>/dev/null | grep "lib$lib.so.12 " >/dev/null; then continue; fi
        for d in $dirs; do
            if [ -e "$d/lib$lib.so.12" ]; then found="$d/lib$lib.so.12"; break; fi
        done
        if [ -z "$found" ]; then
            for d in $dirs; do
                found="$(ls "$d"/lib"$lib".so.1[3-9] 2>/dev/null | sort -V | tail -n 1 || true)"
                [ -n "$found" ] && break
            done
        fi
        if [ -n "$found" ]; then
            ln -sf "$found" "$shim/lib$lib.so"
            case ":$extra:" in
                *":$(dirname "$found"):"*) ;;
                *) extra="$extra:$(dirname "$found")" ;;
            esac
            echo "run.sh: $lib: using $found" >&2
        else
            echo "run.sh: $lib: no CUDA 12 or later copy found outside the system path" >&2
        fi
    done
    # cuDNN 9 (convolutions) keeps its soname, which cudarc tries: its directory is enough
    # (libcudnn.so.9 opens its engine libraries by name from there).
    if ! ldconfig -p 2>/dev/null | grep "libcudnn.so.9 " >/dev/null; then
        for d in $dirs; do
            if [ -e "$d/libcudnn.so.9" ]; then
                extra="$extra:$d"
                echo "run.sh: cudnn: using $d/libcudnn.so.9" >&2
                break
            fi
        done
    fi
    # The shim first (unversioned names), then the libraries' own directories (NVRTC loads its
    # builtins library, cuBLAS its Lt library, from there).
    export LD_LIBRARY_PATH="$shim$extra${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
}

run_info() {
    {
        echo "== nvidia-smi"; nvidia-smi 2>&1 || true
        echo "== fusebox info"; "$FUSEBOX" info
        echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
        echo "FUSEBOX_CUDA_DIR=${FUSEBOX_CUDA_DIR:-}"
    } 2>&1 | tee "$OUT/info.txt"
}

run_check() {
    "$PYTHON" -c "import numpy" 2>/dev/null || die "check needs numpy for $PYTHON"
    "$PYTHON" "$HERE/check_gpu.py" --fusebox "$FUSEBOX" --random "$RANDOM_GRAPHS" --rows "${CHECK_ROWS:-1}" \
        ${EXAMPLE_ARGS[@]+"${EXAMPLE_ARGS[@]}"} --keep "$OUT/failing-graphs" 2>&1 | tee "$OUT/check.txt"
    return "${PIPESTATUS[0]}"
}

run_tests() {
    if [ -z "${CUDA_GPU_TESTS:-}" ]; then
        echo "run.sh: tests skipped: set CUDA_GPU_TESTS to a cuda_gpu test binary (cargo test --release --test cuda_gpu --no-run)" >&2
        return 0
    fi
    [ -x "$CUDA_GPU_TESTS" ] || die "CUDA_GPU_TESTS=$CUDA_GPU_TESTS is not executable"
    # One test thread: the tests share one GPU and time nothing, but a CUDA graph capture
    # and many NVRTC compiles at once only make failures harder to read.
    "$CUDA_GPU_TESTS" --ignored --test-threads 1 ${CUDA_GPU_FILTER:-} 2>&1 | tee "$OUT/tests.txt"
    return "${PIPESTATUS[0]}"
}

run_bench() {
    "$PYTHON" -c "import torch; assert torch.cuda.is_available()" 2>/dev/null \
        || die "bench needs PyTorch with CUDA for $PYTHON"
    "$PYTHON" "$HERE/peers_gpu.py" --fusebox "$FUSEBOX" --iters "$ITERS" --json "$OUT/bench.json" \
        --compile-modes "${COMPILE_MODES:-default,reduce-overhead}" \
        ${EXAMPLE_ARGS[@]+"${EXAMPLE_ARGS[@]}"} 2>&1 | tee "$OUT/bench.txt"
    return "${PIPESTATUS[0]}"
}

# The package from this checkout: python/ first on the path (the native module built and
# copied beside it, see book/src/python.md).
run_python() {
    FUSEBOX_REQUIRE_CUDA=1 FUSEBOX_REQUIRE_PYTHON=1 PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}" \
        "$PYTHON" -m pytest -q -p no:cacheprovider "$ROOT/python/tests/test_cuda.py" 2>&1 | tee "$OUT/python.txt"
    return "${PIPESTATUS[0]}"
}

run_torch() {
    (cd "$ROOT/benches" && PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}" \
        "$PYTHON" torch_backend.py --device cuda "$@") 2>&1 | tee -a "$OUT/torch_backend.txt"
    return "${PIPESTATUS[0]}"
}

run_sweep() {
    "$PYTHON" "$HERE/reduction_sweep.py" --fusebox "$FUSEBOX" --iters "$ITERS" --json "$OUT/sweep.json" \
        "$@" 2>&1 | tee "$OUT/sweep.txt"
    return "${PIPESTATUS[0]}"
}

run_conv() {
    "$PYTHON" "$HERE/conv_gpu.py" --fusebox "$FUSEBOX" --json "$OUT/conv.json" "$@" 2>&1 | tee "$OUT/conv.txt"
    return "${PIPESTATUS[0]}"
}

run_alternate() {
    "$PYTHON" "$HERE/alternate.py" --json "$OUT/alternate.json" "$@" 2>&1 | tee "$OUT/alternate.txt"
    return "${PIPESTATUS[0]}"
}

setup_libraries
status=0
case "${1:-all}" in
    info) run_info ;;
    check) run_info >/dev/null; run_check || status=1 ;;
    tests) run_tests || status=1 ;;
    bench) run_bench || status=1 ;;
    python) run_python || status=1 ;;
    torch) shift; run_torch "$@" || status=1 ;;
    sweep) shift; run_sweep "$@" || status=1 ;;
    alternate) shift; run_alternate "$@" || status=1 ;;
    conv) shift; run_conv "$@" || status=1 ;;
    all)
        run_info
        run_check || status=1
        run_tests || status=1
        run_bench || status=1
        run_python || status=1
        ;;
    *) die "unknown step '$1' (info, check, tests, bench, python, torch, sweep, alternate, conv or all)" ;;
esac
echo "run.sh: results in $OUT" >&2
exit "$status"
