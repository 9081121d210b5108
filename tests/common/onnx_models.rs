//! Pieces of ONNX models built in Rust (with `onnx_protobuf`), for tests that need a hostile
//! or unusual model no exporter would write.

use onnx_protobuf::{TypeProto, ValueInfoProto};

/// A graph input or output `name` of ONNX element type `elem_type` (1 = float, 6 = int32,
/// 7 = int64, 11 = double), with dimensions `dims`, or no shape at all for `None`.
pub fn value_info(name: &str, elem_type: i32, dims: Option<&[i64]>) -> ValueInfoProto {
    let mut ty = TypeProto::new();
    let tensor = ty.mut_tensor_type();
    tensor.elem_type = elem_type;
    if let Some(dims) = dims {
        let shape = tensor.shape.mut_or_insert_default();
        for &d in dims {
            let mut dim = onnx_protobuf::tensor_shape_proto::Dimension::new();
            dim.set_dim_value(d);
            shape.dim.push(dim);
        }
    }
    let mut info = ValueInfoProto::new();
    info.name = name.into();
    info.type_ = Some(ty).into();
    info
}
