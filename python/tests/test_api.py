"""The Python API end to end: load, optimize, compile and run, against values computed here
with NumPy and against the reference backend."""

import math
import pathlib

import numpy as np
import pytest

from conftest import errors_in_threads, need

ROOT = pathlib.Path(__file__).resolve().parents[2]

GELU_BIAS = """Graph(
    name: "gelu_bias",
    inputs: [
        Input(name: "x", dtype: "f32", shape: [4, 3]),
        Input(name: "bias", dtype: "f32", shape: [3]),
    ],
    nodes: [
        Node(name: "biased", op: "add", args: ["x", "bias"]),
        Node(name: "y", op: "gelu", args: ["biased"]),
        Node(name: "total", op: "sum", args: ["y"], attrs: {"axes": [1]}),
    ],
    outputs: ["y", "total"],
)"""


def gelu(v):
    return 0.5 * v * (1.0 + np.vectorize(math.erf)(v / math.sqrt(2.0)))


def test_a_parsed_graph_runs_on_every_backend_and_matches_numpy():
    fusebox = need("fusebox")
    model = fusebox.parse(GELU_BIAS, "gelu_bias.ron")
    assert [(t.name, t.dtype, t.shape) for t in model.inputs] == [("x", "f32", (4, 3)), ("bias", "f32", (3,))]
    assert [(t.name, t.shape) for t in model.outputs] == [("y", (4, 3)), ("total", (4,))]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 3)).astype(np.float32)
    bias = rng.standard_normal(3).astype(np.float32)
    want = gelu((x + bias).astype(np.float64))
    for backend in ("cpu", "reference"):
        got = model.compile(backend).run(x=x, bias=bias)
        assert got["y"].dtype == np.float32 and got["y"].shape == (4, 3)
        np.testing.assert_allclose(got["y"], want, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got["total"], want.sum(axis=1), rtol=1e-5, atol=1e-5)


def test_the_cpu_backend_fuses_and_reports_it():
    fusebox = need("fusebox")
    model = fusebox.parse(GELU_BIAS)
    optimization = model.optimize("cpu")
    assert optimization.report["kernels_before"] == 3
    assert optimization.report["kernels_after"] == 1
    assert "optimized and fused" in optimization.explanation
    compiled = model.compile("cpu")
    assert compiled.kernels == (1, 0)
    assert compiled.report["kernels_after"] == 1
    assert compiled.kernel_builds["compiled"] + compiled.kernel_builds["memory_hits"] + compiled.kernel_builds["disk_hits"] >= 1
    assert model.compile("reference").report is None
    unfused = model.compile("cpu", fusion=False)
    assert unfused.kernels[0] == 3


def test_an_onnx_model_brings_its_weights_and_matches_the_reference():
    fusebox = need("fusebox")
    model = fusebox.load(ROOT / "book/examples/onnx/mlp.onnx")
    stored = {t.name for t in model.inputs if t.stored}
    assert "fc1.weight" in stored and "input0" not in stored
    x = np.random.default_rng(1).standard_normal((8, 32)).astype(np.float32)
    got = model.compile("cpu").run({"input0": x})
    want = model.compile("reference").run({"input0": x})
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-5)


def test_inputs_are_converted_to_their_declared_dtype_and_layout():
    fusebox = need("fusebox")
    model = fusebox.parse(GELU_BIAS)
    compiled = model.compile("cpu")
    x = np.arange(12, dtype=np.float64).reshape(3, 4).T  # f64, not C-contiguous
    got = compiled.run(x=x, bias=[0.5, -0.5, 0.0])
    np.testing.assert_allclose(got["y"], gelu(x + np.array([0.5, -0.5, 0.0])), rtol=1e-5, atol=1e-6)


def test_half_and_bfloat16_graphs_take_and_return_floats():
    fusebox = need("fusebox")
    for dtype in ("f16", "bf16"):
        model = fusebox.parse(
            f"""Graph(name: "h", inputs: [Input(name: "x", dtype: "{dtype}", shape: [5])],
            nodes: [Node(name: "y", op: "mul", args: ["x", "x"])], outputs: ["y"])"""
        )
        x = np.array([0.5, -1.5, 2.0, float("nan"), 3.0], np.float32)
        for backend in ("cpu", "reference"):
            y = model.compile(backend).run(x=x)["y"]
            assert y.dtype == (np.float16 if dtype == "f16" else np.float32)
            np.testing.assert_array_equal(y[[0, 1, 2, 4]], [0.25, 2.25, 4.0, 9.0])
            assert np.isnan(y[3])


def test_errors_carry_fuseboxs_location():
    fusebox = need("fusebox")
    with pytest.raises(fusebox.FuseboxError, match=r"bad\.ron:1:\d+"):
        fusebox.parse("Graph(name: 1)", "bad.ron")
    bad_op = GELU_BIAS.replace('op: "gelu"', 'op: "gelu_fast"')
    with pytest.raises(fusebox.FuseboxError, match="gelu_fast"):
        fusebox.parse(bad_op, "ops.ron")
    compiled = fusebox.parse(GELU_BIAS).compile("cpu")
    with pytest.raises(fusebox.FuseboxError, match="no input `z`"):
        compiled.run(z=np.zeros(3))
    with pytest.raises(fusebox.FuseboxError, match="bias"):
        compiled.run(x=np.zeros((4, 3), np.float32))
    with pytest.raises(fusebox.FuseboxError, match=r"\[4, 3\]"):
        compiled.run(x=np.zeros((3, 4), np.float32), bias=np.zeros(3, np.float32))
    with pytest.raises(fusebox.FuseboxError, match="not one of cpu, cuda, reference"):
        fusebox.parse(GELU_BIAS).compile("tpu")
    with pytest.raises(fusebox.FuseboxError, match="CUDA options apply to Backend::Cuda"):
        fusebox.parse(GELU_BIAS).compile("cpu", lt_epilogues=True)
    with pytest.raises(fusebox.FuseboxError):
        fusebox.load(ROOT / "no/such/model.onnx")


def test_torch_cpu_tensors_in_give_tensors_out_without_copies():
    fusebox = need("fusebox")
    torch = need("torch")
    compiled = fusebox.parse(GELU_BIAS).compile("cpu")
    x = torch.randn(4, 3)
    bias = torch.randn(3)
    got = compiled.run(x=x, bias=bias)
    assert isinstance(got["y"], torch.Tensor) and got["y"].dtype == torch.float32
    torch.testing.assert_close(got["y"], torch.nn.functional.gelu(x + bias), rtol=1e-5, atol=1e-6)


def test_a_compiled_model_runs_from_other_threads():
    fusebox = need("fusebox")
    compiled = fusebox.parse(GELU_BIAS).compile("cpu")
    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3)
    want = compiled.run(x=x, bias=np.zeros(3, np.float32))["y"]
    results = []

    def use():
        for _ in range(20):
            results.append(compiled.run(x=x, bias=np.zeros(3, np.float32))["y"])

    errors = errors_in_threads(use, 3)
    assert not errors, errors
    assert len(results) == 60 and all(np.array_equal(r, want) for r in results)
