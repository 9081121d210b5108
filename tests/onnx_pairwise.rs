//! The importer's pairwise ops, `TopK`, `CumSum` and `ScatterElements`, in every mode (both
//! orders and every axis of TopK with ties and NaN, each CumSum direction with the i32 edges,
//! each ScatterElements reduction with negative and repeated indices, and the sum with indices
//! smaller than data), GatherND (negative coordinates, batch axes), Slice with negative
//! steps (imported as a gather of the positions it visits), and the products (`ReduceProd`
//! over some, all or empty axes, with ±inf, -0 and wrapping i32; `CumProd` each way), and
//! `Resize` (nearest, linear and cubic under each coordinate transformation, each nearest
//! rounding, by scales up and down and by sizes, keep_aspect_ratio_policy, axes, cubic's
//! `exclude_outside` and coefficient, `tf_crop_and_resize` reaching past the input, linear
//! and cubic `antialias` shrinking and growing, with `exclude_outside`), built by
//! `tests/onnx/pairwise_models.py` and run on the reference and CPU backends against
//! `onnx.reference.ReferenceEvaluator`. Skipped, with a message, where python3 cannot import
//! onnx, unless `FUSEBOX_REQUIRE_ONNX` is set.

use fusebox::tensor::Tensor;
use std::path::{Path, PathBuf};
use std::process::Command;

fn cases_dir() -> Option<PathBuf> {
    let dir = std::env::temp_dir().join(format!("fusebox-pairwise-{}", std::process::id()));
    crate::common::onnx_models::built_by("pairwise_models.py", &dir)
}

/// The files of `dir` named `<case>.<kind>.<name>.npy`, as (name, path).
fn arrays(dir: &Path, case: &str, kind: &str) -> Vec<(String, PathBuf)> {
    let prefix = format!("{case}.{kind}.");
    let mut found: Vec<(String, PathBuf)> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|entry| {
            let path = entry.unwrap().path();
            let file = path.file_name()?.to_str()?.to_string();
            let name = file
                .strip_prefix(&prefix)?
                .strip_suffix(".npy")?
                .to_string();
            Some((name, path))
        })
        .collect();
    found.sort();
    found
}

#[test]
fn pairwise_ops_match_the_onnx_reference_evaluator() {
    let Some(dir) = cases_dir() else { return };
    let mut cases: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| {
            let file = e.unwrap().file_name().to_string_lossy().to_string();
            file.strip_suffix(".onnx").map(str::to_string)
        })
        .collect();
    cases.sort();
    assert!(cases.len() >= 20, "{cases:?}");
    for case in &cases {
        for backend in ["reference", "cpu"] {
            let out = dir.join(format!("out-{case}-{backend}"));
            let mut args = vec![
                "run".to_string(),
                dir.join(format!("{case}.onnx")).display().to_string(),
                "--backend".into(),
                backend.into(),
                "--out".into(),
                out.display().to_string(),
            ];
            for (name, path) in arrays(&dir, case, "in") {
                args.push("--input".into());
                args.push(format!("{name}={}", path.display()));
            }
            let result = Command::new(env!("CARGO_BIN_EXE_fusebox"))
                .args(&args)
                .output()
                .unwrap();
            assert!(
                result.status.success(),
                "{case} on {backend}: {}",
                String::from_utf8_lossy(&result.stderr)
            );
            for (name, path) in arrays(&dir, case, "out") {
                let want = Tensor::read_npy(&path).unwrap();
                let got = Tensor::read_npy(&out.join(format!("{name}.npy"))).unwrap();
                let what = format!("{case} `{name}` on {backend}");
                assert_eq!(got.dtype, want.dtype, "{what}");
                assert_eq!(got.shape(), want.shape(), "{what}");
                for (i, (g, w)) in got.values().iter().zip(want.values()).enumerate() {
                    let same = *g == w
                        || (g.is_nan() && w.is_nan())
                        || (g - w).abs() <= 1e-5 + 1e-5 * w.abs();
                    assert!(same, "{what}: element {i} is {g}, the evaluator gives {w}");
                }
            }
        }
    }
}
