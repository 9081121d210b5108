"""The pairwise ops of the importer (TopK, CumSum, ScatterElements, ScatterND) in every mode, GatherND, Resize, Slice with
negative steps (a gather), and the products (ReduceProd, CumProd) built with the onnx helper, with inputs and the outputs
of onnx.reference.ReferenceEvaluator, for tests/onnx_pairwise.rs.

Usage: python3 pairwise_models.py DIR. Writes DIR/<case>.onnx, DIR/<case>.in.<input>.npy and
DIR/<case>.out.<output>.npy. The inputs hold ties, NaN (TopK), the i32 edges (CumSum wraps) and
negative and repeated indices (ScatterElements with a reduction).
"""
import sys

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh
from onnx.reference import ReferenceEvaluator

out = sys.argv[1]
rng = np.random.default_rng(3)


def save(name, nodes, inputs, outputs, inits, feeds, expected=None, opset=18):
    """Writes the model, its inputs and its outputs: the reference evaluator's, or `expected`."""
    g = h.make_graph(nodes, name, inputs, outputs, inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)])
    m.ir_version = 8
    onnx.save(m, f"{out}/{name}.onnx")
    res = expected if expected is not None else ReferenceEvaluator(m).run(None, feeds)
    for k,v in feeds.items(): np.save(f"{out}/{name}.in.{k}.npy", v)
    for o,r in zip(outputs,res): np.save(f"{out}/{name}.out.{o.name}.npy", r)
x=rng.integers(-3,4,(3,7)).astype(np.float32); x[0,2]=np.nan; x[1,1]=np.nan; x[1,5]=np.nan
for largest in [1,0]:
  for axis in [1,0,-1]:
    k=3 if axis!=0 else 2
    save(f"topk_l{largest}_a{axis+1}", [h.make_node("TopK",["x","k"],["v","i"],axis=axis,largest=largest)],
         [h.make_tensor_value_info("x",T.FLOAT,[3,7])],
         [h.make_tensor_value_info("v",T.FLOAT,None),h.make_tensor_value_info("i",T.INT64,None)],
         [nh.from_array(np.array([k],np.int64),"k")], {"x":x if largest==1 and axis==1 else np.nan_to_num(x, nan=1.5)})
xi=rng.integers(-5,5,(4,6)).astype(np.int32)
save("topk_int", [h.make_node("TopK",["x","k"],["v","i"],axis=1)], [h.make_tensor_value_info("x",T.INT32,[4,6])],
     [h.make_tensor_value_info("v",T.INT32,None),h.make_tensor_value_info("i",T.INT64,None)], [nh.from_array(np.array([4],np.int64),"k")], {"x":xi})
for ex in [0,1]:
  for rev in [0,1]:
    for axis in [0,1]:
      save(f"cumsum_e{ex}_r{rev}_a{axis}", [h.make_node("CumSum",["x","axis"],["y"],exclusive=ex,reverse=rev)],
         [h.make_tensor_value_info("x",T.FLOAT,[5,4])],[h.make_tensor_value_info("y",T.FLOAT,None)],
         [nh.from_array(np.array(axis,np.int64),"axis")], {"x":rng.standard_normal((5,4)).astype(np.float32)})
save("cumsum_i32", [h.make_node("CumSum",["x","axis"],["y"])], [h.make_tensor_value_info("x",T.INT32,[6])],[h.make_tensor_value_info("y",T.INT32,None)],
     [nh.from_array(np.array(0,np.int32),"axis")], {"x":np.array([2**31-1,1,-5,7,2**31-1,3],np.int32)})
for red in ["none","add","mul","max","min"]:
  for axis in [0,1]:
    data=rng.standard_normal((4,5)).astype(np.float32)
    shape=(3,5) if axis==0 else (4,3)
    n=data.shape[axis]
    idx=rng.integers(-n,n,shape).astype(np.int64)
    if red=="none":
        # no duplicates along the axis (the spec leaves their order to the implementation)
        idx=np.stack([rng.permutation(n)[:shape[axis]] for _ in range(shape[1-axis])], axis=1-axis).astype(np.int64)
    upd=rng.standard_normal(shape).astype(np.float32)
    save(f"scatter_{red}_a{axis}", [h.make_node("ScatterElements",["data","idx","upd"],["y"],axis=axis,reduction=red)],
       [h.make_tensor_value_info("data",T.FLOAT,[4,5]),h.make_tensor_value_info("idx",T.INT64,list(shape)),h.make_tensor_value_info("upd",T.FLOAT,list(shape))],
       [h.make_tensor_value_info("y",T.FLOAT,None)], [], {"data":data,"idx":idx,"upd":upd})

# Slice with negative steps (torch.flip exports as one), imported as a gather of the positions:
# from the end, from past either end, two axes at once, an empty axis, an empty result.
slices = [
    ([5, 4], [-1], [-6], [0], [-1]),
    ([5, 4], [3], [0], [0], [-2]),
    ([5, 4], [10], [-10], [1], [-1]),
    ([5, 4], [-1, 2], [-100, 0], [0, 1], [-1, -1]),
    ([0, 3], [-1], [-10], [0], [-1]),
    ([5, 4], [2], [4], [0], [-1]),
]
for k, (shape, starts, ends, axes, steps) in enumerate(slices):
    consts = [nh.from_array(np.array(v, np.int64), n)
              for n, v in zip(["starts", "ends", "axes", "steps"], [starts, ends, axes, steps])]
    save(f"slice_backward_{k}", [h.make_node("Slice", ["x", "starts", "ends", "axes", "steps"], ["y"])],
         [h.make_tensor_value_info("x", T.FLOAT, shape)], [h.make_tensor_value_info("y", T.FLOAT, None)],
         consts, {"x": rng.standard_normal(shape).astype(np.float32)})

# ScatterND: whole rows and single elements, negative coordinates, each reduction (repeated
# tuples only where a reduction combines them). The outputs are computed here, by the
# specification's loop over the tuples: onnx.reference 1.22 indexes a tuple as a list of rows
# (output[indices[i]]) where it reduces, which reads another slice than the tuple names.


def scatter_nd(data, idx, upd, red):
    y = data.copy()
    for i in np.ndindex(idx.shape[:-1]):
        at = tuple(idx[i])
        if red == "none":
            y[at] = upd[i]
        elif red == "add":
            y[at] = y[at] + upd[i]
        elif red == "mul":
            y[at] = y[at] * upd[i]
        elif red == "max":
            y[at] = np.maximum(y[at], upd[i])
        else:
            y[at] = np.minimum(y[at], upd[i])
    return y

nd_cases = [
    ("rows", [4, 3], [[1], [-1]], [2, 3]),
    ("elements", [4, 3], [[0, 2], [3, -1], [1, 0]], [3]),
    ("blocks", [2, 3, 2], [[1, 0], [0, 2]], [2, 2]),
]
for label, shape, tuples, upd_shape in nd_cases:
    for red in ["none", "add", "mul", "max", "min"]:
        idx = np.array(tuples, np.int64)
        if red != "none":
            idx = np.concatenate([idx, idx[:1]])
            upd_shape_r = [upd_shape[0] + 1] + upd_shape[1:]
        else:
            upd_shape_r = upd_shape
        data = rng.standard_normal(shape).astype(np.float32)
        upd = rng.standard_normal(upd_shape_r).astype(np.float32)
        save(f"scatternd_{label}_{red}", [h.make_node("ScatterND", ["data", "idx", "upd"], ["y"], reduction=red)],
             [h.make_tensor_value_info("data", T.FLOAT, shape), h.make_tensor_value_info("idx", T.INT64, list(idx.shape)),
              h.make_tensor_value_info("upd", T.FLOAT, upd_shape_r)],
             [h.make_tensor_value_info("y", T.FLOAT, None)], [], {"data": data, "idx": idx, "upd": upd},
             expected=[scatter_nd(data, idx, upd, red)])

# GatherND: whole rows, single elements and blocks, negative coordinates, batch_dims 0 and 1,
# i32 and i64 tuples, against the reference evaluator.
gather_nd_cases = [
    ("rows", [4, 3], [[1], [-1], [0]], 0, np.int64),
    ("elements", [4, 3], [[[0, 2], [3, -1]], [[1, 0], [-4, -3]]], 0, np.int32),
    ("blocks", [2, 3, 2], [[1, 0], [0, 2]], 0, np.int64),
    ("batch", [2, 3, 4], [[[2], [0]], [[-1], [1]]], 1, np.int64),
    ("batch_elements", [2, 3, 4], [[1, 3], [0, -1]], 1, np.int32),
]
for label, shape, tuples, batch, itype in gather_nd_cases:
    idx = np.array(tuples, itype)
    data = rng.standard_normal(shape).astype(np.float32)
    code = T.INT64 if itype == np.int64 else T.INT32
    save(f"gathernd_{label}", [h.make_node("GatherND", ["data", "idx"], ["y"], batch_dims=batch)],
         [h.make_tensor_value_info("data", T.FLOAT, shape), h.make_tensor_value_info("idx", code, list(idx.shape))],
         [h.make_tensor_value_info("y", T.FLOAT, None)], [], {"data": data, "idx": idx})

# ScatterElements with reduction add (the catalogue's scatter_add): indices smaller than data
# off the axis, negative and repeated, i32.
data = rng.standard_normal([4, 5]).astype(np.float32)
idx = np.array([[0, -1, 3], [0, 2, -4], [3, 3, 1]], np.int32)
upd = rng.standard_normal([3, 3]).astype(np.float32)
save("scatter_add_narrow", [h.make_node("ScatterElements", ["data", "idx", "upd"], ["y"], axis=0, reduction="add")],
     [h.make_tensor_value_info("data", T.FLOAT, [4, 5]), h.make_tensor_value_info("idx", T.INT32, [3, 3]),
      h.make_tensor_value_info("upd", T.FLOAT, [3, 3])],
     [h.make_tensor_value_info("y", T.FLOAT, None)], [], {"data": data, "idx": idx, "upd": upd})

# Products: ReduceProd over one axis, several, every axis (none given), an empty axis (1), with
# noop_with_empty_axes, and in int32 where the product wraps; CumProd in each direction, odd
# and power-of-two lengths, and int32 wrapping.
prod_x = rng.uniform(0.5, 1.5, (3, 5, 4)).astype(np.float32) * np.where(rng.random((3, 5, 4)) < 0.3, -1, 1).astype(np.float32)
prod_x[0, 0, 0] = -0.0
prod_x[2, 3, 1] = np.inf
prod_cases = [
    ("one_axis", prod_x, [1], 0, 0),
    ("two_axes", prod_x, [0, -1], 1, 0),
    ("all_axes", prod_x, None, 1, 0),
    ("noop", prod_x, None, 1, 1),
    ("empty_axis", np.zeros((2, 0, 3), np.float32), [1], 0, 0),
    ("int32_wraps", np.array([[65536, 65536, 3, -1, 7], [2**31 - 1, 2, 2, 1, -3]], np.int32), [1], 1, 0),
]
for label, x, axes, keep, noop in prod_cases:
    ty = T.INT32 if x.dtype == np.int32 else T.FLOAT
    ins = ["x"] + (["axes"] if axes is not None else [])
    inits = [nh.from_array(np.array(axes, np.int64), "axes")] if axes is not None else []
    save(f"reduce_prod_{label}", [h.make_node("ReduceProd", ins, ["y"], keepdims=keep, noop_with_empty_axes=noop)],
         [h.make_tensor_value_info("x", ty, list(x.shape))], [h.make_tensor_value_info("y", ty, None)],
         inits, {"x": x})
for ex in [0, 1]:
    for rev in [0, 1]:
        for n in [7, 8]:
            x = rng.uniform(0.5, 1.5, (n, 3)).astype(np.float32)
            save(f"cumprod_e{ex}_r{rev}_n{n}", [h.make_node("CumProd", ["x", "axis"], ["y"], exclusive=ex, reverse=rev)],
                 [h.make_tensor_value_info("x", T.FLOAT, [n, 3])], [h.make_tensor_value_info("y", T.FLOAT, None)],
                 [nh.from_array(np.array(0, np.int64), "axis")], {"x": x}, opset=26)
save("cumprod_i32", [h.make_node("CumProd", ["x", "axis"], ["y"])], [h.make_tensor_value_info("x", T.INT32, [2, 6])],
     [h.make_tensor_value_info("y", T.INT32, None)], [nh.from_array(np.array(-1, np.int32), "axis")],
     {"x": np.array([[65536, 3, 65536, -7, 5, 2**31 - 1], [1, -1, 2, -2, 3, -3]], np.int32)}, opset=26)
# Resize: every mode with each coordinate transformation (but tf_crop_and_resize), nearest
# rounding modes, up- and downsampling by scales (fractional ones, whose output size rounds
# down) and by sizes, keep_aspect_ratio_policy, axes in either order, exclude_outside and a
# cubic_coeff_a of its own; on [1, 2, 5, 7] inputs of random values.
resize_x = rng.standard_normal((1, 2, 5, 7)).astype(np.float32)
transforms = ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "half_pixel_symmetric"]
resize_cases = []
for mode in ["nearest", "linear", "cubic"]:
    for t in transforms:
        for label, by, values, extra in [
            # (A scale of 1.5 across 7 puts a half_pixel_symmetric coordinate at
            # 2.0000000000000004, where the reference evaluator's neighbors, found after
            # adding its padding and rounding to 4.0, disagree with its weights.)
            ("up", "scales", [1, 1, 2.0, 1.6], {}),
            ("down", "scales", [1, 1, 0.6, 0.45], {}),
            ("sizes", "sizes", [1, 2, 8, 3], {}),
        ]:
            resize_cases.append((f"{mode}_{t}_{label}", by, values, dict(mode=mode, coordinate_transformation_mode=t, **extra)))
for nearest in ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]:
    resize_cases.append((f"nearest_{nearest}", "scales", [1, 1, 1.7, 0.8], dict(mode="nearest", nearest_mode=nearest)))
resize_cases += [
    ("cubic_exclude_outside", "scales", [1, 1, 1.8, 0.7], dict(mode="cubic", exclude_outside=1, cubic_coeff_a=-0.5)),
    ("linear_not_larger", "sizes", [1, 2, 9, 9], dict(mode="linear", keep_aspect_ratio_policy="not_larger")),
    ("linear_not_smaller", "sizes", [1, 2, 9, 9], dict(mode="linear", keep_aspect_ratio_policy="not_smaller")),
    ("cubic_axes_3_2", "sizes", [10, 3], dict(mode="cubic", axes=[3, 2])),
    ("nearest_one_axis", "scales", [2.5], dict(mode="nearest", axes=[3])),
]
# antialias: linear and cubic filters stretched by 1/scale when an axis shrinks (to 8 and 14
# taps at 0.3), under several coordinate transformations, by scales and by sizes, with
# exclude_outside, and upsampling (where the filter is not stretched).
for mode in ["linear", "cubic"]:
    for t in ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"]:
        resize_cases.append((f"antialias_{mode}_{t}", "scales", [1, 1, 0.6, 0.3], dict(mode=mode, coordinate_transformation_mode=t, antialias=1)))
    resize_cases += [
        (f"antialias_{mode}_sizes", "sizes", [1, 2, 3, 4], dict(mode=mode, antialias=1)),
        (f"antialias_{mode}_exclude_outside", "scales", [1, 1, 0.5, 0.45], dict(mode=mode, antialias=1, exclude_outside=1)),
        (f"antialias_{mode}_up", "scales", [1, 1, 1.8, 0.9], dict(mode=mode, antialias=1)),
    ]
for label, by, values, attrs in resize_cases:
    dtype = np.int64 if by == "sizes" else np.float32
    inputs = ["x", "", "values"] if by == "scales" else ["x", "", "", "values"]
    save(f"resize_{label}", [h.make_node("Resize", inputs, ["y"], **attrs)],
         [h.make_tensor_value_info("x", T.FLOAT, list(resize_x.shape))], [h.make_tensor_value_info("y", T.FLOAT, None)],
         [nh.from_array(np.array(values, dtype), "values")], {"x": resize_x}, opset=19)
# tf_crop_and_resize: a region of interest reaching past the input on one axis (those positions
# take extrapolation_value), inside it on the other, by sizes and by scales, in each mode.
for mode in ["nearest", "linear", "cubic"]:
    for label, by, values in [("sizes", "sizes", [1, 2, 6, 8]), ("scales", "scales", [1, 1, 1.4, 1.3])]:
        dtype = np.int64 if by == "sizes" else np.float32
        inputs = ["x", "roi", "values"] if by == "scales" else ["x", "roi", "", "values"]
        save(f"resize_crop_{mode}_{label}", [h.make_node("Resize", inputs, ["y"], mode=mode, coordinate_transformation_mode="tf_crop_and_resize", extrapolation_value=7.5)],
             [h.make_tensor_value_info("x", T.FLOAT, list(resize_x.shape))], [h.make_tensor_value_info("y", T.FLOAT, None)],
             [nh.from_array(np.array([0, 0, 0.2, -0.1, 1, 1, 0.9, 1.2], np.float32), "roi"),
              nh.from_array(np.array(values, dtype), "values")], {"x": resize_x}, opset=19)
