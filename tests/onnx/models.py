"""Builds the small real models of tests/onnx.rs with the onnx helper and records, for each,
its inputs and the outputs of onnx.reference.ReferenceEvaluator.

Usage: python3 models.py DIR. Writes DIR/<model>.onnx, DIR/<model>.in.<input>.npy and
DIR/<model>.out.<k>.npy (outputs in graph order); mlp_external.onnx keeps its weights in
mlp_external.data beside it.
"""
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh
from onnx.reference import ReferenceEvaluator

out = sys.argv[1]
rng = np.random.default_rng(7)


def f32(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def init(name, array):
    return nh.from_array(np.asarray(array), name)


def info(name, shape):
    return h.make_tensor_value_info(name, T.FLOAT, shape)


def save(name, graph, inputs, external=False, expected=None):
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 20)])
    onnx.checker.check_model(model)
    # Evaluated before saving: saving with external data moves the weights out of `model`.
    results = ReferenceEvaluator(model).run(None, inputs) if expected is None else expected
    path = os.path.join(out, name + ".onnx")
    if external:
        onnx.save_model(model, path, save_as_external_data=True,
                        all_tensors_to_one_file=True, location=name + ".data",
                        size_threshold=0)
    else:
        onnx.save(model, path)
    for key, value in inputs.items():
        np.save(os.path.join(out, f"{name}.in.{key}.npy"), value)
    for k, value in enumerate(results):
        np.save(os.path.join(out, f"{name}.out.{k}.npy"), value)


# An MLP as PyTorch exports it: Gemm with transB, GELU spelled with Erf, then Gemm and the
# Gelu op of opset 20.
def mlp():
    nodes = [
        h.make_node("Gemm", ["x", "w1", "b1"], ["h"], transB=1, name="fc1"),
        h.make_node("Div", ["h", "sqrt2"], ["hs"]),
        h.make_node("Erf", ["hs"], ["e"]),
        h.make_node("Add", ["e", "one"], ["e1"]),
        h.make_node("Mul", ["h", "e1"], ["he"]),
        h.make_node("Mul", ["he", "half"], ["onnx::Gemm_9"]),
        h.make_node("Gemm", ["onnx::Gemm_9", "w2", "b2"], ["g"], alpha=0.5, beta=2.0, name="fc2"),
        h.make_node("Gelu", ["g"], ["y"], approximate="tanh"),
    ]
    inits = [init("w1", f32(32, 16)), init("b1", f32(32)), init("w2", f32(32, 8)),
             init("b2", f32(8)), init("sqrt2", np.float32(np.sqrt(2))),
             init("one", np.float32(1)), init("half", np.float32(0.5))]
    graph = h.make_graph(nodes, "mlp", [info("x", [4, 16])], [info("y", [4, 8])], inits)
    return graph, {"x": f32(4, 16)}


# An LSTM cell: one product for all four gates, Split into them.
def lstm():
    hsz = 8
    nodes = [
        h.make_node("MatMul", ["x", "w"], ["xw"]),
        h.make_node("MatMul", ["h", "u"], ["hu"]),
        h.make_node("Add", ["xw", "hu"], ["s"]),
        h.make_node("Add", ["s", "b"], ["gates"]),
        h.make_node("Split", ["gates", "sizes"], ["i", "f", "g", "o"], axis=1),
        h.make_node("Sigmoid", ["i"], ["si"]),
        h.make_node("Sigmoid", ["f"], ["sf"]),
        h.make_node("Tanh", ["g"], ["tg"]),
        h.make_node("Sigmoid", ["o"], ["so"]),
        h.make_node("Mul", ["sf", "c"], ["fc"]),
        h.make_node("Mul", ["si", "tg"], ["ig"]),
        h.make_node("Add", ["fc", "ig"], ["c_next"]),
        h.make_node("Tanh", ["c_next"], ["tc"]),
        h.make_node("Mul", ["so", "tc"], ["h_next"]),
    ]
    inits = [init("w", f32(6, 4 * hsz)), init("u", f32(hsz, 4 * hsz)), init("b", f32(4 * hsz)),
             init("sizes", np.array([hsz] * 4, np.int64))]
    graph = h.make_graph(nodes, "lstm_cell",
                         [info("x", [3, 6]), info("h", [3, hsz]), info("c", [3, hsz])],
                         [info("h_next", [3, hsz]), info("c_next", [3, hsz])], inits)
    return graph, {"x": f32(3, 6), "h": f32(3, hsz), "c": f32(3, hsz)}


# Self-attention: heads split by Reshape/Transpose, a batched MatMul, Softmax, and the merge
# back through a Shape -> Gather -> Concat -> Reshape chain that folds at import.
def attention():
    b, s, d, heads = 2, 5, 8, 2
    dh = d // heads
    nodes = [
        h.make_node("MatMul", ["x", "wq"], ["q"]),
        h.make_node("MatMul", ["x", "wk"], ["k"]),
        h.make_node("MatMul", ["x", "wv"], ["v"]),
        h.make_node("Reshape", ["q", "split_shape"], ["q4"]),
        h.make_node("Reshape", ["k", "split_shape"], ["k4"]),
        h.make_node("Reshape", ["v", "split_shape"], ["v4"]),
        h.make_node("Transpose", ["q4"], ["qh"], perm=[0, 2, 1, 3]),
        h.make_node("Transpose", ["k4"], ["kt"], perm=[0, 2, 3, 1]),
        h.make_node("Transpose", ["v4"], ["vh"], perm=[0, 2, 1, 3]),
        h.make_node("MatMul", ["qh", "kt"], ["scores"]),
        h.make_node("Mul", ["scores", "scale"], ["scaled"]),
        h.make_node("Softmax", ["scaled"], ["p"], axis=-1),
        h.make_node("MatMul", ["p", "vh"], ["ctx"]),
        h.make_node("Transpose", ["ctx"], ["ctx_t"], perm=[0, 2, 1, 3]),
        h.make_node("Shape", ["x"], ["xs"]),
        h.make_node("Gather", ["xs", "first_two"], ["bs"], axis=0),
        h.make_node("Constant", [], ["minus_one"], value=init("m1", np.array([-1], np.int64))),
        h.make_node("Concat", ["bs", "minus_one"], ["merge_shape"], axis=0),
        h.make_node("Reshape", ["ctx_t", "merge_shape"], ["merged"]),
        h.make_node("MatMul", ["merged", "wo"], ["y"]),
    ]
    inits = [init("wq", f32(d, d)), init("wk", f32(d, d)), init("wv", f32(d, d)),
             init("wo", f32(d, d)), init("split_shape", np.array([0, 0, heads, dh], np.int64)),
             init("scale", np.float32(1 / np.sqrt(dh))),
             init("first_two", np.array([0, 1], np.int64))]
    graph = h.make_graph(nodes, "attention", [info("x", [b, s, d])], [info("y", [b, s, d])],
                         inits)
    return graph, {"x": f32(b, s, d)}


# A pre-norm block: LayerNormalization, a projection with Relu, the residual and a mean.
def layernorm():
    nodes = [
        h.make_node("LayerNormalization", ["x", "gamma", "beta"], ["n"], axis=-1, epsilon=1e-5),
        h.make_node("MatMul", ["n", "w"], ["p"]),
        h.make_node("Relu", ["p"], ["r"]),
        h.make_node("Add", ["x", "r"], ["y"]),
        h.make_node("ReduceMean", ["y", "axes"], ["m"], keepdims=0),
    ]
    inits = [init("gamma", f32(12)), init("beta", f32(12)), init("w", f32(12, 12)),
             init("axes", np.array([-1], np.int64))]
    graph = h.make_graph(nodes, "layernorm_block", [info("x", [4, 6, 12])],
                         [info("y", [4, 6, 12]), info("m", [4, 6])], inits)
    return graph, {"x": f32(4, 6, 12)}


# LayerNormalization on f16. The operator's function body normalizes in its stash type (f32 by
# default), casts back, then scales and shifts in f16, as onnxruntime does; the reference
# evaluator instead computes every step in f16. So the expected output is the function body,
# computed here in NumPy.
def layernorm_f16():
    nodes = [h.make_node("LayerNormalization", ["x", "gamma", "beta"], ["y"], axis=-1,
                         epsilon=1e-5)]
    inits = [init("gamma", f32(12).astype(np.float16)), init("beta", f32(12).astype(np.float16))]
    graph = h.make_graph(nodes, "layernorm_f16",
                         [h.make_tensor_value_info("x", T.FLOAT16, [4, 12])],
                         [h.make_tensor_value_info("y", T.FLOAT16, [4, 12])], inits)
    # Rows around 1000 with a spread of about 2: in f16 (a spacing of 0.5 there) a mean
    # rounded to f16 would be off by up to 0.25, a tenth of the spread, so only a normalization
    # in f32 matches the evaluator.
    return graph, {"x": (f32(4, 12) * 2 + 1000).astype(np.float16)}


def layernorm_f16_body(graph, inputs):
    gamma, beta = (nh.to_array(t) for t in graph.initializer)
    x = inputs["x"].astype(np.float32)
    d = x - x.mean(-1, keepdims=True)
    normalized = d / np.sqrt((d * d).mean(-1, keepdims=True) + np.float32(1e-5))
    return [normalized.astype(np.float16) * gamma + beta]


for name, build in [("mlp", mlp), ("lstm", lstm), ("attention", attention),
                    ("layernorm", layernorm), ("layernorm_f16", layernorm_f16)]:
    graph, inputs = build()
    expected = layernorm_f16_body(graph, inputs) if name == "layernorm_f16" else None
    save(name, graph, inputs, expected=expected)
rng = np.random.default_rng(7)
graph, inputs = mlp()
save("mlp_external", graph, inputs, external=True)
