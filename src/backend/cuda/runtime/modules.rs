//! Loaded CUDA modules, cached in memory per device by the source they were compiled from.
//!
//! The emitted source is the kernels' identity (it depends only on their IR, never on
//! sizes), so it is the key: a second executable with the same kernels — the same graph at
//! another batch size, or the same program built twice — loads nothing and compiles nothing.
//! Below this cache, NVRTC's own caches (memory and disk, keyed by source, target and NVRTC
//! version) make a new process skip compilation too; loading PTX into a context is the only
//! per-process cost left.

use super::device::Device;
use crate::backend::cache::{lock, sha256_hex};
use crate::error::{Error, Result};
use cudarc::driver::sys::CUresult;
use cudarc::driver::{CudaFunction, CudaModule};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// One module in a context, and its functions looked up so far.
pub struct LoadedModule {
    module: Arc<CudaModule>,
    functions: Mutex<HashMap<String, CudaFunction>>,
}

impl LoadedModule {
    /// The entry point `name`.
    pub fn function(&self, name: &str) -> Result<CudaFunction> {
        let mut functions = lock(&self.functions);
        if let Some(f) = functions.get(name) {
            return Ok(f.clone());
        }
        if name.contains('\0') {
            return Err(Error::backend(format!(
                "entry point name {name:?} contains NUL"
            )));
        }
        let f = self.module.load_function(name).map_err(|e| {
            Error::backend(format!("entry point `{name}` is not in the module: {e:?}"))
        })?;
        functions.insert(name.to_string(), f.clone());
        Ok(f)
    }
}

/// Modules by (source hash, target).
#[derive(Default)]
pub struct ModuleCache {
    modules: Mutex<HashMap<String, Arc<LoadedModule>>>,
    loaded: AtomicUsize,
    hits: AtomicUsize,
}

impl ModuleCache {
    /// Modules loaded into the context, and requests served from memory.
    pub fn counts(&self) -> (usize, usize) {
        (
            self.loaded.load(Ordering::Relaxed),
            self.hits.load(Ordering::Relaxed),
        )
    }
}

fn key(source: &str, arch: &str) -> String {
    format!("{}-{arch}", sha256_hex(source.as_bytes()))
}

impl Device {
    /// The module for `source` on this device: from memory, or compiled by NVRTC (which has
    /// its own disk cache) and loaded. The lock is held while compiling so that two threads
    /// asking for the same module compile it once.
    pub(super) fn module(&self, source: &str) -> Result<Arc<LoadedModule>> {
        let arch = self.target_arch()?;
        let key = key(source, &arch);
        let mut modules = lock(&self.modules.modules);
        if let Some(m) = modules.get(&key) {
            self.modules.hits.fetch_add(1, Ordering::Relaxed);
            return Ok(m.clone());
        }
        let ptx = self.compiler.compile(source, &arch)?;
        if ptx.ptx.contains('\0') {
            return Err(Error::backend("NVRTC returned PTX containing a NUL byte"));
        }
        self.bind()?;
        let module = self.context().load_module(ptx.to_cudarc()).map_err(|e| {
            let hint = match e.0 {
                CUresult::CUDA_ERROR_UNSUPPORTED_PTX_VERSION => {
                    " (NVRTC is newer than the driver: use an NVRTC no newer than the CUDA \
                         version nvidia-smi reports)"
                }
                CUresult::CUDA_ERROR_INVALID_PTX | CUresult::CUDA_ERROR_NO_BINARY_FOR_GPU => {
                    " (the PTX does not suit this GPU)"
                }
                _ => "",
            };
            Error::backend(format!(
                "loading the PTX compiled for {arch} into the context: {e:?}{hint}"
            ))
        })?;
        let loaded = Arc::new(LoadedModule {
            module,
            functions: Mutex::new(HashMap::new()),
        });
        modules.insert(key, loaded.clone());
        self.modules.loaded.fetch_add(1, Ordering::Relaxed);
        Ok(loaded)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_depends_on_source_and_target() {
        let a = key("__global__ void k() {}", "sm_90");
        assert_eq!(a, key("__global__ void k() {}", "sm_90"));
        assert_ne!(a, key("__global__ void k() {}", "sm_80"));
        assert_ne!(a, key("__global__ void j() {}", "sm_90"));
        assert!(a.ends_with("-sm_90"));
        assert_eq!(a.len(), 64 + "-sm_90".len());
    }
}
