"""Writes mlp.onnx and unsupported.onnx, the models of the book's chapter "Importing ONNX
models".

A two-layer MLP as PyTorch's exporter writes it: Gemm with transB, GELU spelled out with Erf,
a second Gemm, Softmax. The weights are seeded, so the file is reproducible:
python3 book/examples/onnx/make_mlp.py (needs the onnx wheel).
"""
import os

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

rng = np.random.default_rng(2024)


def init(name, array):
    return nh.from_array(np.asarray(array), name)


nodes = [
    h.make_node("Gemm", ["input0", "fc1.weight", "fc1.bias"], ["/fc1/Gemm_output_0"], transB=1,
                name="/fc1/Gemm"),
    h.make_node("Div", ["/fc1/Gemm_output_0", "sqrt2"], ["/act/Div_output_0"], name="/act/Div"),
    h.make_node("Erf", ["/act/Div_output_0"], ["/act/Erf_output_0"], name="/act/Erf"),
    h.make_node("Add", ["/act/Erf_output_0", "one"], ["/act/Add_output_0"], name="/act/Add"),
    h.make_node("Mul", ["/fc1/Gemm_output_0", "/act/Add_output_0"], ["/act/Mul_output_0"],
                name="/act/Mul"),
    h.make_node("Mul", ["/act/Mul_output_0", "half"], ["onnx::Gemm_9"], name="/act/Mul_1"),
    h.make_node("Gemm", ["onnx::Gemm_9", "fc2.weight", "fc2.bias"], ["logits"], transB=1,
                name="/fc2/Gemm"),
    h.make_node("Softmax", ["logits"], ["probs"], axis=-1, name="/Softmax"),
]
inits = [
    init("fc1.weight", (rng.standard_normal((64, 32)) * 0.2).astype(np.float32)),
    init("fc1.bias", (rng.standard_normal(64) * 0.1).astype(np.float32)),
    init("fc2.weight", (rng.standard_normal((10, 64)) * 0.2).astype(np.float32)),
    init("fc2.bias", (rng.standard_normal(10) * 0.1).astype(np.float32)),
    init("sqrt2", np.float32(np.sqrt(2))),
    init("one", np.float32(1)),
    init("half", np.float32(0.5)),
]
graph = h.make_graph(nodes, "main_graph",
                     [h.make_tensor_value_info("input0", T.FLOAT, [8, 32])],
                     [h.make_tensor_value_info("probs", T.FLOAT, [8, 10])], inits)
model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], producer_name="pytorch")
onnx.checker.check_model(model)
onnx.save(model, os.path.join(os.path.dirname(os.path.abspath(__file__)), "mlp.onnx"))

# unsupported.onnx: a model with ops fusebox does not import (two ConvTranspose nodes and a
# Resize: a small decoder), for the chapter's example of the one error that lists them all.
decoder = [
    h.make_node("ConvTranspose", ["code", "kernel"], ["u1"], name="/up1/ConvTranspose", strides=[2, 2]),
    h.make_node("Relu", ["u1"], ["r1"], name="/up1/Relu"),
    h.make_node("ConvTranspose", ["r1", "kernel2"], ["u2"], name="/up2/ConvTranspose", strides=[2, 2]),
    h.make_node("Resize", ["u2", "", "scales"], ["image"], name="/Resize", mode="nearest"),
]
decoder_inits = [
    init("kernel", (rng.standard_normal((8, 4, 2, 2)) * 0.2).astype(np.float32)),
    init("kernel2", (rng.standard_normal((4, 3, 2, 2)) * 0.2).astype(np.float32)),
    init("scales", np.array([1, 1, 2, 2], np.float32)),
]
decoder_graph = h.make_graph(decoder, "decoder",
                             [h.make_tensor_value_info("code", T.FLOAT, [1, 8, 4, 4])],
                             [h.make_tensor_value_info("image", T.FLOAT, [1, 3, 32, 32])], decoder_inits)
decoder_model = h.make_model(decoder_graph, opset_imports=[h.make_opsetid("", 17)])
onnx.save(decoder_model, os.path.join(os.path.dirname(os.path.abspath(__file__)), "unsupported.onnx"))
