//! `.npy` files written by fusebox are read by NumPy itself, and files NumPy writes are read by
//! fusebox. Skipped, with a message, where `python3 -c "import numpy"` fails (`.ci/run`
//! installs NumPy first).

use crate::common::{numpy_available, temp_dir};
use fusebox::dtype::DType;
use fusebox::tensor::Tensor;
use std::path::Path;
use std::process::Command;

fn python(script: &str, dir: &Path) -> String {
    let out = Command::new("python3")
        .args(["-c", script])
        .current_dir(dir)
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "python failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn numpy_reads_what_fusebox_writes() {
    if !numpy_available() {
        eprintln!("skipped: NumPy is not installed (bash .ci/run installs it)");
        return;
    }
    let dir = temp_dir("np-read");
    // Values chosen to be exact in every dtype they are written in, plus the specials.
    let values = vec![1.5, -0.0, f64::INFINITY, f64::NAN, -2.0, 65504.0];
    for dtype in [DType::F16, DType::BF16, DType::F32, DType::F64] {
        Tensor::from_values(dtype, &[2, 3], values.clone())
            .unwrap()
            .write_npy(&dir.join(format!("{dtype}.npy")))
            .unwrap();
    }
    Tensor::from_values(DType::I32, &[3], vec![-7.0, 0.0, 2147483647.0])
        .unwrap()
        .write_npy(&dir.join("i32.npy"))
        .unwrap();
    Tensor::from_values(DType::I64, &[3], vec![-7.0, 0.0, 9007199254740992.0])
        .unwrap()
        .write_npy(&dir.join("i64.npy"))
        .unwrap();
    Tensor::from_values(DType::Bool, &[2], vec![1.0, 0.0])
        .unwrap()
        .write_npy(&dir.join("bool.npy"))
        .unwrap();
    Tensor::from_values(DType::F32, &[0, 4], vec![])
        .unwrap()
        .write_npy(&dir.join("empty.npy"))
        .unwrap();
    let report = python(
        r#"
import numpy as np
rows = []
for name in ["f16", "bf16", "f32", "f64", "i32", "i64", "bool", "empty"]:
    a = np.load(name + ".npy")
    rows.append(f"{name}:{a.dtype}:{list(a.shape)}:{np.signbit(a).ravel().tolist() if a.dtype.kind == 'f' else a.ravel().tolist()}")
f = np.load("f16.npy").astype(np.float64).ravel()
rows.append("f16vals:" + ",".join(repr(float(v)) for v in f))
print("\n".join(rows))
"#,
        &dir,
    );
    let lines: Vec<&str> = report.lines().collect();
    assert_eq!(
        lines[0],
        "f16:float16:[2, 3]:[False, True, False, False, True, False]"
    );
    assert!(lines[1].starts_with("bf16:float32:[2, 3]:"), "{}", lines[1]);
    assert!(lines[2].starts_with("f32:float32:[2, 3]:"));
    assert!(lines[3].starts_with("f64:float64:[2, 3]:"));
    assert_eq!(lines[4], "i32:int32:[3]:[-7, 0, 2147483647]");
    assert_eq!(lines[5], "i64:int64:[3]:[-7, 0, 9007199254740992]");
    assert_eq!(lines[6], "bool:bool:[2]:[True, False]");
    assert_eq!(lines[7], "empty:float32:[0, 4]:[]");
    assert_eq!(lines[8], "f16vals:1.5,-0.0,inf,nan,-2.0,65504.0");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn fusebox_reads_what_numpy_writes() {
    if !numpy_available() {
        eprintln!("skipped: NumPy is not installed (bash .ci/run installs it)");
        return;
    }
    let dir = temp_dir("np-write");
    python(
        r#"
import numpy as np
np.save("f16.npy", np.array([[0.1, -3.0], [np.inf, 1e-7]], dtype=np.float16))
np.save("f32be.npy", np.array([1.0, -2.5, 3.25], dtype=">f4"))
np.save("i64.npy", np.arange(6, dtype=np.int64).reshape(2, 3))
np.save("bool.npy", np.array([True, False, True]))
np.save("fortran.npy", np.asfortranarray(np.ones((2, 3), dtype=np.float32)))
np.save("u8.npy", np.array([1, 2], dtype=np.uint8))
np.save("u64.npy", np.array([1, 2], dtype=np.uint64))
"#,
        &dir,
    );
    let f16 = Tensor::read_npy(&dir.join("f16.npy")).unwrap();
    assert_eq!(f16.dtype, DType::F16);
    assert_eq!(f16.shape(), &[2, 2]);
    // 0.1 in f16 is 0.0999755859375; 1e-7 is the subnormal 1.1920928955078125e-07.
    assert_eq!(
        f16.values(),
        vec![0.0999755859375, -3.0, f64::INFINITY, 1.1920928955078125e-07]
    );
    let be = Tensor::read_npy(&dir.join("f32be.npy")).unwrap();
    assert_eq!((be.dtype, be.values()), (DType::F32, vec![1.0, -2.5, 3.25]));
    let ints = Tensor::read_npy(&dir.join("i64.npy")).unwrap();
    assert_eq!(ints.values(), vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
    assert_eq!(ints.shape(), &[2, 3]);
    let bools = Tensor::read_npy(&dir.join("bool.npy")).unwrap();
    assert_eq!(
        (bools.dtype, bools.values()),
        (DType::Bool, vec![1.0, 0.0, 1.0])
    );
    let fortran = Tensor::read_npy(&dir.join("fortran.npy"))
        .unwrap_err()
        .to_string();
    assert!(fortran.contains("Fortran"), "{fortran}");
    let bytes = Tensor::read_npy(&dir.join("u8.npy")).unwrap();
    assert_eq!((bytes.dtype, bytes.values()), (DType::U8, vec![1.0, 2.0]));
    let unsupported = Tensor::read_npy(&dir.join("u64.npy"))
        .unwrap_err()
        .to_string();
    assert!(
        unsupported.contains("unsupported .npy dtype"),
        "{unsupported}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
