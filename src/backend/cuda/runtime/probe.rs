//! Which CUDA libraries this process can load, checked before any cudarc call.
//!
//! cudarc opens its libraries lazily and panics when one cannot be found, so the runtime asks
//! first and turns a missing library into an error that says what is missing, what was
//! found, and what the cuda backend needs: on a machine without a GPU, `fusebox run --backend
//! cuda` must fail with a sentence, not a backtrace.

use crate::backend::cuda::libs::{self, NvrtcSetup};
use crate::error::{Error, Result};

/// What was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Libraries {
    /// The CUDA driver library (libcuda.so.1), which only an NVIDIA driver installs.
    pub driver: bool,
    /// NVRTC and the fp16/bf16 headers: where they were found, or why they were not.
    pub nvrtc: std::result::Result<String, libs::NvrtcError>,
    /// cuBLAS (libcublas), needed only by programs with a matrix product.
    pub cublas: bool,
}

impl Libraries {
    /// Looks for every library. Loading a library this way has no effect on CUDA state.
    pub fn probe() -> Libraries {
        Libraries {
            driver: libs::driver_available(),
            nvrtc: libs::nvrtc_found()
                .map(describe_nvrtc)
                .map_err(Clone::clone),
            cublas: libs::cublas_available(),
        }
    }

    /// `Ok` when the driver and NVRTC (and cuBLAS, if `need_cublas`) are present; otherwise
    /// an error listing what is missing, then what was found.
    pub fn require(&self, need_cublas: bool) -> Result<()> {
        let mut missing = Vec::new();
        let mut found = Vec::new();
        if !self.driver {
            missing.push(
                "the CUDA driver library libcuda.so.1 was not found: the cuda backend needs an \
                 NVIDIA GPU and its driver"
                    .to_string(),
            );
        }
        match &self.nvrtc {
            Ok(description) => found.push(description.clone()),
            Err(why) => missing.push(format!("NVRTC is not usable: {why}")),
        }
        if self.cublas {
            found.push("cuBLAS: found".to_string());
        } else if need_cublas {
            missing.push(
                "cuBLAS (libcublas.so.12, or libcublas.so on LD_LIBRARY_PATH) was not found: \
                 matrix products on the GPU need it"
                    .to_string(),
            );
        } else {
            found.push("cuBLAS: not found (only matrix products need it)".to_string());
        }
        if missing.is_empty() {
            return Ok(());
        }
        Err(Error::backend(format!(
            "the cuda backend cannot run here: {} ({})",
            missing.join("; "),
            found.join("; ")
        )))
    }
}

/// NVRTC and its headers, for error messages.
pub fn describe_nvrtc(setup: &NvrtcSetup) -> String {
    let library = match &setup.library {
        Some(path) => format!("found at {}", path.display()),
        None => "found on the library path".to_string(),
    };
    format!(
        "NVRTC {}.{}: {library}, headers in {}",
        setup.version.0,
        setup.version.1,
        setup.include_dir.display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const FOUND: &str = "NVRTC 12.9: found at /opt/nvrtc/libnvrtc.so.12, headers in /opt/include";

    #[test]
    fn a_missing_driver_is_named_with_what_was_found() {
        let libs = Libraries {
            driver: false,
            nvrtc: Ok(FOUND.into()),
            cublas: false,
        };
        let message = libs.require(false).unwrap_err().to_string();
        assert_eq!(
            message,
            "backend: the cuda backend cannot run here: the CUDA driver library libcuda.so.1 was \
             not found: the cuda backend needs an NVIDIA GPU and its driver (NVRTC 12.9: found \
             at /opt/nvrtc/libnvrtc.so.12, headers in /opt/include; cuBLAS: not found (only \
             matrix products need it))"
        );
    }

    #[test]
    fn everything_missing_is_listed_together() {
        let libs = Libraries {
            driver: false,
            nvrtc: Err(libs::NvrtcError::NotReopened {
                at: "libnvrtc.so.12".into(),
            }),
            cublas: false,
        };
        let message = libs.require(true).unwrap_err().to_string();
        assert!(message.contains("libcuda.so.1 was not found"), "{message}");
        assert!(
            message
                .contains("NVRTC is not usable: NVRTC at libnvrtc.so.12 could not be opened again"),
            "{message}"
        );
        assert!(message.contains("cuBLAS (libcublas.so.12"), "{message}");
    }

    #[test]
    fn cublas_is_needed_only_for_matrix_products() {
        let libs = Libraries {
            driver: true,
            nvrtc: Ok(FOUND.into()),
            cublas: false,
        };
        assert_eq!(libs.require(false), Ok(()));
        let message = libs.require(true).unwrap_err().to_string();
        assert!(
            message.contains("matrix products on the GPU need it"),
            "{message}"
        );
    }
}
