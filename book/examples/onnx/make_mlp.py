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

# unsupported.onnx: a model with ops fusebox does not import (a detection head: a Conv, then
# RoiAlign over given boxes and NonMaxSuppression of scored boxes), for the chapter's example
# of the one error that lists them all.
head = [
    h.make_node("Conv", ["features", "kernel"], ["mapped"], name="/head/Conv", pads=[1, 1, 1, 1]),
    h.make_node("RoiAlign", ["mapped", "rois", "batch_index"], ["pooled"], name="/head/RoiAlign",
                output_height=2, output_width=2),
    h.make_node("NonMaxSuppression", ["boxes", "scores", "keep", "iou"], ["selected"],
                name="/head/NonMaxSuppression"),
]
head_inits = [
    init("kernel", (rng.standard_normal((4, 8, 3, 3)) * 0.2).astype(np.float32)),
    init("rois", np.array([[0, 0, 4, 4], [2, 2, 7, 7]], np.float32)),
    init("batch_index", np.array([0, 0], np.int64)),
    init("keep", np.array([2], np.int64)),
    init("iou", np.array([0.5], np.float32)),
]
head_graph = h.make_graph(head, "detection_head",
                          [h.make_tensor_value_info("features", T.FLOAT, [1, 8, 8, 8]),
                           h.make_tensor_value_info("boxes", T.FLOAT, [1, 6, 4]),
                           h.make_tensor_value_info("scores", T.FLOAT, [1, 1, 6])],
                          [h.make_tensor_value_info("pooled", T.FLOAT, [2, 4, 2, 2]),
                           h.make_tensor_value_info("selected", T.INT64, ["selected", 3])], head_inits)
head_model = h.make_model(head_graph, opset_imports=[h.make_opsetid("", 17)])
onnx.checker.check_model(head_model)
onnx.save(head_model, os.path.join(os.path.dirname(os.path.abspath(__file__)), "unsupported.onnx"))
