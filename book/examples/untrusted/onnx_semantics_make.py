"""Makes the ONNX models of the untrusted-input chapter's ONNX section (onnx 1.22.0):

- onnx_semantics_big_constant.onnx: ConstantOfShape [16384, 16384] -> Exp -> ReduceSum, a
  model of 200 bytes whose constant would be 1 GiB as f32 if import folded it;
- onnx_semantics_int_div.onnx: Div of two int64 graph inputs, which fusebox cannot compute
  exactly at run time;
- onnx_semantics_twice.onnx: two nodes writing the same value `y`.

Run: python3 book/examples/untrusted/onnx_semantics_make.py
"""
import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

here = os.path.dirname(os.path.abspath(__file__))


def save(graph, name, check=True):
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    if check:  # the checker refuses the model that defines `y` twice, as fusebox does
        onnx.checker.check_model(model)
    onnx.save(model, os.path.join(here, name))


shape = numpy_helper.from_array(np.array([16384, 16384], dtype=np.int64), "shape")
save(
    helper.make_graph(
        [
            helper.make_node("ConstantOfShape", ["shape"], ["zeros"]),
            helper.make_node("Exp", ["zeros"], ["ones"]),
            helper.make_node("ReduceSum", ["ones"], ["total"], keepdims=0),
        ],
        "big_constant",
        [],
        [helper.make_tensor_value_info("total", TensorProto.FLOAT, [])],
        [shape],
    ),
    "onnx_semantics_big_constant.onnx",
)
save(
    helper.make_graph(
        [helper.make_node("Div", ["rows", "parts"], ["chunk"], name="/chunk/Div")],
        "int_div",
        [
            helper.make_tensor_value_info("rows", TensorProto.INT64, [4]),
            helper.make_tensor_value_info("parts", TensorProto.INT64, [4]),
        ],
        [helper.make_tensor_value_info("chunk", TensorProto.INT64, [4])],
    ),
    "onnx_semantics_int_div.onnx",
)
save(
    helper.make_graph(
        [
            helper.make_node("Relu", ["x"], ["y"], name="/relu"),
            helper.make_node("Neg", ["x"], ["y"], name="/neg"),
        ],
        "twice",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
    ),
    "onnx_semantics_twice.onnx",
    check=False,
)
