"""CUDA tensors: `Compiled.run` on a GPU's memory in place, on PyTorch's current stream, and
`torch.compile(backend="fusebox")` with its parts on the CUDA backend. These need an NVIDIA GPU
(with NVRTC and cuBLAS where fusebox finds them, see the CUDA chapter); without one they skip,
unless FUSEBOX_REQUIRE_CUDA=1 (set by `benches/gpu/run.sh python`), where they fail."""

import os
import pathlib
import time

import numpy as np
import pytest

from conftest import need

torch = need("torch")
fusebox = need("fusebox")
fusebox_torch = need("fusebox.torch")

from test_torch_backend import Block, Cell, compare, mlp, parts_ran, small_cnn  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]

if not torch.cuda.is_available():
    if os.environ.get("FUSEBOX_REQUIRE_CUDA") == "1":
        raise RuntimeError("FUSEBOX_REQUIRE_CUDA=1 but PyTorch sees no CUDA device")
    pytest.skip("no CUDA device visible to PyTorch", allow_module_level=True)

GPU = torch.device("cuda", 0)

ROW_SOFTMAX = """Graph(name: "g",
    inputs: [Input(name: "x", dtype: "f32", shape: [64, 1000]),
             Input(name: "b", dtype: "f32", shape: [1000])],
    nodes: [Node(name: "z", op: "add", args: ["x", "b"]),
            Node(name: "y", op: "softmax", args: ["z"], attrs: {"axis": -1}),
            Node(name: "h", op: "cast", args: ["y"], attrs: {"dtype": "bf16"})],
    outputs: ["y", "h"])"""


def test_a_cuda_model_reads_and_writes_cuda_tensors_in_place():
    model = fusebox.parse(ROW_SOFTMAX)
    on_gpu, on_cpu = model.compile("cuda"), model.compile("cpu")
    x, b = torch.randn(64, 1000), torch.randn(1000)
    got = on_gpu.run(x=x.to(GPU), b=b.to(GPU))
    want = on_cpu.run(x=x, b=b)
    for name, rtol in (("y", 1e-5), ("h", 2**-8)):
        assert got[name].device == GPU, name
        assert got[name].dtype == want[name].dtype, name
        # The GPU's f32 `y` may differ from the CPU's in its last bits, and then its bf16
        # rounding by one bf16 step (2^-8 relative).
        torch.testing.assert_close(got[name].cpu(), want[name], rtol=rtol, atol=1e-6)
    # NumPy values with a CUDA tensor: all go to the GPU.
    mixed = on_gpu.run(x=x.to(GPU), b=b.numpy())
    torch.testing.assert_close(mixed["y"].cpu(), want["y"], rtol=1e-5, atol=1e-6)
    # CPU tensors alone run through host memory and come back on the CPU.
    host = on_gpu.run(x=x, b=b)
    assert host["y"].device.type == "cpu"
    torch.testing.assert_close(host["y"], want["y"], rtol=1e-5, atol=1e-6)


def test_a_run_is_queued_on_the_current_stream_without_a_host_wait():
    compiled = fusebox.parse(ROW_SOFTMAX).compile("cuda")
    b = torch.randn(1000, device=GPU)
    stream = torch.cuda.Stream()

    def sequence(sleep_cycles):
        with torch.cuda.stream(stream):
            torch.cuda._sleep(sleep_cycles)
            a = torch.randn(64, 1000, device=GPU)
            x = a * 3.0 + 1.0  # made on this stream: the run must wait for it, on the GPU
            start = time.perf_counter()
            got = compiled.run(x=x, b=b)
            seconds = time.perf_counter() - start
            busy = not stream.query()
            y = got["y"] * 2.0  # PyTorch work after the run, on the same stream
        return a, y, seconds, busy

    # Once to load every kernel on both sides (a first launch may load a module, which can
    # wait for the device), then with about half a second of GPU time queued ahead.
    sequence(1000)
    torch.cuda.synchronize()
    a, y, seconds, busy = sequence(1_000_000_000)
    assert seconds < 0.1, f"the run took {seconds:.3f} s on the host"
    assert busy, "the stream's earlier work was finished when the run returned"
    stream.synchronize()
    want = torch.softmax(a.double() * 3.0 + 1.0 + b.double(), dim=-1)
    torch.testing.assert_close(y.double(), want * 2.0, rtol=1e-5, atol=1e-7)


def test_a_run_from_another_thread_works():
    import threading

    compiled = fusebox.parse(ROW_SOFTMAX).compile("cuda")
    x, b = torch.randn(64, 1000, device=GPU), torch.randn(1000, device=GPU)
    results = {}

    def worker():
        results["y"] = compiled.run(x=x, b=b)["y"]
        torch.cuda.current_stream().synchronize()

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    want = torch.softmax((x + b).double(), dim=-1)
    torch.testing.assert_close(results["y"].double(), want, rtol=1e-5, atol=1e-7)


def committed_models():
    """The ONNX models committed under tests/onnx with their recorded inputs and outputs."""
    found = []
    for folder in ("torch", "cnn"):
        for onnx in sorted((ROOT / "tests" / "onnx" / folder).glob("*.onnx")):
            stem = onnx.name.split(".")[0]
            if (onnx.parent / f"{stem}.out.0.npy").exists():
                found.append(pytest.param(onnx, id=f"{folder}/{onnx.name}"))
    return found


@pytest.mark.parametrize("onnx", committed_models())
def test_committed_models_match_their_recorded_outputs_on_the_gpu(onnx):
    """Each model exported from PyTorch (both exporters) and committed with PyTorch's outputs:
    convolutions, pools, embeddings, recurrent layers, top-k, losses, on the GPU."""
    stem = onnx.name.split(".")[0]
    model = fusebox.load(onnx)
    compiled = model.compile("cuda")
    given = {}
    for t in model.inputs:
        path = onnx.parent / f"{stem}.in.{t.name}.npy"
        if path.exists():
            given[t.name] = torch.from_numpy(np.load(path)).to(GPU)
    got = compiled.run(given)
    for k, out in enumerate(model.outputs):
        want = np.load(onnx.parent / f"{stem}.out.{k}.npy")
        value = got[out.name]
        assert value.device == GPU
        np.testing.assert_allclose(value.cpu().double().numpy(), want, rtol=1e-4, atol=1e-4, err_msg=f"{onnx.name} {out.name}")


def on_gpu(module, *inputs):
    return module.to(GPU), [x.to(GPU) for x in inputs]


def gpu_parts(report):
    ran = parts_ran(report)
    assert ran, "no part ran in fusebox"
    return ran


def test_torch_compile_runs_an_mlp_forward_and_backward_on_the_gpu():
    torch.manual_seed(0)
    module, inputs = on_gpu(mlp(), torch.randn(8, 32))
    report = compare(module, *inputs, rtol=1e-4, atol=1e-4)
    assert len(report) == 2
    for graph in report:
        assert graph["left_in_pytorch"] == {}, graph["left_in_pytorch"]
    assert len(gpu_parts(report)) == 2


def test_torch_compile_runs_a_gpt2_block_and_an_lstm_cell_on_the_gpu():
    torch.manual_seed(2)
    module, inputs = on_gpu(Block(), torch.randn(2, 8, 64))
    report = compare(module, *inputs, rtol=1e-4, atol=1e-4)
    assert report[0]["left_in_pytorch"] == {}, report[0]["left_in_pytorch"]
    gpu_parts(report)
    module, inputs = on_gpu(Cell(), *(torch.randn(4, 32) for _ in range(3)))
    assert len(gpu_parts(compare(module, *inputs, rtol=1e-4, atol=1e-4))) == 2


def test_torch_compile_under_bf16_autocast_on_the_gpu():
    torch.manual_seed(4)
    module, (x,) = on_gpu(mlp(), torch.randn(16, 32))
    torch._dynamo.reset()
    fusebox_torch.reset_report()
    compiled = torch.compile(module, backend="fusebox")
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        want = module(x)
        got = compiled(x)
    assert got.dtype == want.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want.float(), rtol=3e-2, atol=3e-2)
    gpu_parts(fusebox_torch.last_report())


def test_torch_compile_runs_a_cnn_on_the_gpu():
    torch.manual_seed(7)
    cnn, (x,) = on_gpu(small_cnn().eval(), torch.randn(2, 3, 16, 16))
    torch._dynamo.reset()
    fusebox_torch.reset_report()
    with torch.no_grad():
        want = cnn(x)
        got = torch.compile(cnn, backend="fusebox")(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    report = fusebox_torch.last_report()
    assert report[0]["left_in_pytorch"] == {}, report[0]["left_in_pytorch"]
    gpu_parts(report)


def test_the_cpu_engine_leaves_cuda_tensors_in_pytorch():
    torch.manual_seed(5)
    module, (x,) = on_gpu(mlp(), torch.randn(4, 32))
    torch._dynamo.reset()
    fusebox_torch.reset_report()
    compiled = torch.compile(module, backend="fusebox", options={"engine": "cpu"})
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), module(x))
    parts = fusebox_torch.last_report()[0]["parts"]
    refused = [c["refused"] for p in parts for c in p["compiled"]]
    assert refused and all("does not run tensors on cuda:0" in r for r in refused), refused
