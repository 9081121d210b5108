//! Pieces of ONNX models built in Rust (with `onnx_protobuf`), for tests that need a hostile
//! or unusual model no exporter would write; and models built by the Python scripts of
//! `tests/onnx/` with the onnx wheel.

use onnx_protobuf::{GraphProto, ModelProto, OperatorSetIdProto, TypeProto, ValueInfoProto};

/// A model (IR version 8) of `graph` importing the default domain at `opset`.
pub fn model_of(graph: GraphProto, opset: i64) -> ModelProto {
    let mut model = ModelProto::new();
    model.ir_version = 8;
    let mut domain = OperatorSetIdProto::new();
    domain.version = opset;
    model.opset_import.push(domain);
    model.graph = Some(graph).into();
    model
}

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

/// Runs `tests/onnx/<script> DIR` into `dir` (made fresh), or returns `None` (after checking
/// that this is allowed: not where `FUSEBOX_REQUIRE_ONNX` is set) where python3 cannot import
/// onnx.
pub fn built_by(script: &str, dir: &std::path::Path) -> Option<std::path::PathBuf> {
    use std::process::Command;
    let have = Command::new("python3")
        .args(["-c", "import onnx"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !have {
        assert!(
            std::env::var_os("FUSEBOX_REQUIRE_ONNX").is_none(),
            "FUSEBOX_REQUIRE_ONNX is set but python3 cannot import onnx"
        );
        eprintln!("skipped: python3 cannot import onnx (pip install onnx==1.22.0)");
        return None;
    }
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).unwrap();
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/onnx")
        .join(script);
    let out = Command::new("python3").arg(path).arg(dir).output().unwrap();
    assert!(
        out.status.success(),
        "{script} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(dir.to_path_buf())
}
