//! CUDA C to PTX with NVRTC (through cudarc), cached in memory and on disk.
//!
//! [`NvrtcCompiler::compile`] mirrors the CPU backend's
//! [`Compiler::compile`](crate::backend::cpu::compiler::Compiler::compile): the same
//! content-addressed store ([`crate::backend::cache`]) keeps `<key>.ptx` with its digest, the
//! `<key>.cu` it came from and NVRTC's log `<key>.log` when there was one. The key is the hex
//! SHA-256 of the source, the NVRTC version, the options (the target architecture among them)
//! and the contents of the fp16/bf16 headers, so a new NVRTC, another GPU generation or a
//! header update names another entry.
//!
//! PTX is produced for a virtual architecture (`compute_90`), not for a real one: the driver
//! compiles PTX for the device when the module is loaded (and caches that itself), and PTX for
//! `compute_80` also runs on every later GPU. Nothing here needs a GPU; NVRTC is a library.
//!
//! The options keep IEEE semantics, as the CPU backend's flags do: no fast math, no
//! flush-to-zero, correctly rounded division and square root, and no contraction of `a * b + c`
//! into a fused multiply-add, whose single rounding would differ from the unfused graph.

pub use crate::backend::cache::CompileStats;
use crate::backend::cache::trim_diagnostics;
use crate::backend::cache::{KernelCache, Staging, env_nonempty, sha256_hex, user_cache_dir};
use crate::backend::cuda::libs::{self, NvrtcSetup};
use crate::error::{Error, Result};
use std::ffi::{CStr, CString};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// How to compile CUDA C.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompileOptions {
    /// Fail when NVRTC's log has a warning. Generated code should compile cleanly, and the
    /// compile tests set this; the runtime may leave it off so that a new NVRTC's new
    /// warning does not stop a user's graph.
    pub warnings_as_errors: bool,
    /// `--use_fast_math`: approximate transcendentals, flush-to-zero, FMA contraction. Off by
    /// default: results would no longer match the reference evaluator.
    pub fast_math: bool,
    /// Let NVRTC contract `a * b + c` into one FMA (`--fmad=true`). Off by default.
    pub fmad: bool,
    /// More NVRTC options, after fusebox's own (part of the cache key).
    pub extra: Vec<String>,
    /// Where PTX is cached. Default: `$FUSEBOX_CACHE_DIR/cuda`, else
    /// `$XDG_CACHE_HOME/fusebox/cuda`, else `$HOME/.cache/fusebox/cuda`, else
    /// `<temp dir>/fusebox-cache/cuda`.
    pub cache_dir: PathBuf,
}

impl CompileOptions {
    /// The defaults, caching where the environment says.
    pub fn from_env() -> CompileOptions {
        CompileOptions {
            warnings_as_errors: false,
            fast_math: false,
            fmad: false,
            extra: Vec::new(),
            cache_dir: default_cache_dir(),
        }
    }

    /// The same options caching in `dir` instead.
    pub fn with_cache_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.cache_dir = dir.into();
        self
    }
}

impl Default for CompileOptions {
    fn default() -> Self {
        CompileOptions::from_env()
    }
}

fn default_cache_dir() -> PathBuf {
    match env_nonempty("FUSEBOX_CACHE_DIR") {
        Some(dir) => Path::new(&dir).join("cuda"),
        None => user_cache_dir("cuda"),
    }
}

/// PTX for one translation unit, ready for the driver to load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PtxModule {
    /// The PTX text (no trailing NUL).
    pub ptx: String,
    /// The architecture it was compiled for, in the form `sm_90` whatever form was asked.
    pub arch: String,
    /// The cache key: the hex SHA-256 naming this module's entry.
    pub key: String,
    /// NVRTC's log (empty when it had nothing to say).
    pub log: String,
    /// The PTX file, `<cache_dir>/<key>.ptx`; its source is beside it as `<key>.cu`.
    pub path: PathBuf,
}

impl PtxModule {
    /// The PTX as cudarc's type, for `CudaContext::load_module`.
    pub fn to_cudarc(&self) -> cudarc::nvrtc::Ptx {
        cudarc::nvrtc::Ptx::from_src(self.ptx.clone())
    }
}

/// `sm_90` for a device of compute capability 9.0.
pub fn arch_for_capability(major: i32, minor: i32) -> String {
    format!("sm_{major}{minor}")
}

/// Compiles CUDA C to PTX through a memory cache and a disk cache.
///
/// `Send + Sync`: share one through an `Arc`. Separate compilers may share a cache directory.
pub struct NvrtcCompiler {
    options: CompileOptions,
    cache: KernelCache<PtxModule>,
}

impl std::fmt::Debug for NvrtcCompiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvrtcCompiler")
            .field("options", &self.options)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl NvrtcCompiler {
    /// A compiler with an empty memory cache. Nothing is loaded until the first compile.
    pub fn new(options: CompileOptions) -> NvrtcCompiler {
        NvrtcCompiler {
            cache: KernelCache::new(options.cache_dir.clone(), "ptx", "cu"),
            options,
        }
    }

    pub fn options(&self) -> &CompileOptions {
        &self.options
    }

    /// Counters since creation.
    pub fn stats(&self) -> CompileStats {
        self.cache.stats()
    }

    /// The NVRTC options for `arch` (`sm_90`, `sm_90a`, `compute_80` or `80`), without the
    /// include directory: this list is what the cache key covers.
    pub fn flags(&self, arch: &str) -> Result<Vec<String>> {
        let setup = libs::nvrtc_setup()?;
        let (number, suffix) = parse_arch(arch)?;
        if !setup.archs.contains(&number) {
            return Err(Error::backend(format!(
                "NVRTC {}.{} cannot compile for `{arch}`; it supports sm_{}",
                setup.version.0,
                setup.version.1,
                setup
                    .archs
                    .iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(", sm_")
            )));
        }
        let mut flags = vec![
            format!("--gpu-architecture=compute_{number}{suffix}"),
            "--std=c++17".to_string(),
        ];
        if self.options.fast_math {
            flags.push("--use_fast_math".into());
        } else {
            flags.extend(["--ftz=false", "--prec-div=true", "--prec-sqrt=true"].map(String::from));
        }
        if !self.options.fmad {
            flags.push("--fmad=false".into());
        }
        flags.extend(self.options.extra.iter().cloned());
        if let Some(bad) = flags.iter().find(|f| f.contains('\0')) {
            return Err(Error::backend(format!(
                "NVRTC option {bad:?} contains a NUL byte"
            )));
        }
        Ok(flags)
    }

    /// The cache key of `source` for `arch`: the hex SHA-256 of `source ‖ NUL ‖ "nvrtc
    /// MAJOR.MINOR" ‖ NUL ‖ flags joined by spaces ‖ NUL ‖ header digest`.
    pub fn key(&self, source: &str, arch: &str) -> Result<String> {
        let setup = libs::nvrtc_setup()?;
        let flags = self.flags(arch)?;
        Ok(key_of(source, setup, &flags))
    }

    /// PTX for `source` targeting `arch`: from memory, else from the disk cache, else by
    /// running NVRTC.
    ///
    /// Errors are Backend errors: NVRTC or its headers missing (saying how to get them), an
    /// architecture this NVRTC cannot target, a compile error (with NVRTC's log and the path
    /// of the kept `.cu`), or, with `warnings_as_errors`, a warning.
    pub fn compile(&self, source: &str, arch: &str) -> Result<Arc<PtxModule>> {
        let setup = libs::nvrtc_setup()?;
        let flags = self.flags(arch)?;
        let key = key_of(source, setup, &flags);
        let (number, suffix) = parse_arch(arch)?;
        let arch = format!("sm_{number}{suffix}");
        let load = |path: &Path, bytes: Vec<u8>| {
            let ptx = String::from_utf8(bytes).map_err(|e| e.to_string())?;
            if !ptx.contains(".target") {
                return Err("not PTX (no .target directive)".to_string());
            }
            Ok(PtxModule {
                ptx,
                arch: arch.clone(),
                key: key.clone(),
                log: fs::read_to_string(path.with_extension("log")).unwrap_or_default(),
                path: path.to_path_buf(),
            })
        };
        let module = self.cache.get_or_build(&key, source, &load, |staging| {
            let mut all = flags.clone();
            all.push(format!("-I{}", setup.include_dir.display()));
            build(staging, source, &all, &key)
        })?;
        if self.options.warnings_as_errors && has_warning(&module.log) {
            return Err(Error::backend(format!(
                "NVRTC warned (warnings are errors) on {}:\n{}",
                self.cache.source_path(&key).display(),
                trim_diagnostics(&module.log)
            )));
        }
        Ok(module)
    }
}

fn key_of(source: &str, setup: &NvrtcSetup, flags: &[String]) -> String {
    let text = format!(
        "{source}\0nvrtc {}.{}\0{}\0{}",
        setup.version.0,
        setup.version.1,
        flags.join(" "),
        setup.header_digest
    );
    sha256_hex(text.as_bytes())
}

/// `sm_90a` → (90, "a"); also `compute_90a` and `90`. The suffix (`a`, `f`) selects
/// architecture-specific features and is kept.
fn parse_arch(arch: &str) -> Result<(u32, &str)> {
    let rest = arch
        .strip_prefix("sm_")
        .or_else(|| arch.strip_prefix("compute_"))
        .unwrap_or(arch);
    let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
    let (number, suffix) = rest.split_at(digits);
    match (number.parse::<u32>(), suffix) {
        (Ok(n), "" | "a" | "f") => Ok((n, suffix)),
        _ => Err(Error::backend(format!(
            "`{arch}` is not a CUDA architecture (expected the form sm_90, sm_90a or compute_80)"
        ))),
    }
}

/// Whether NVRTC's log reports a warning. Diagnostics look like
/// `fusebox.cu(12): warning #177-D: …`; lines that merely echo source text do not count.
fn has_warning(log: &str) -> bool {
    log.lines().any(|line| {
        let line = line.trim_start();
        line.contains("): warning")
            || line.starts_with("warning")
            || line.starts_with("nvrtc: warning")
    })
}

/// Runs NVRTC on the source and leaves `<key>.ptx` (and `<key>.log`) in `staging`.
fn build(staging: &Staging, source: &str, flags: &[String], key: &str) -> Result<()> {
    let c_source = CString::new(source)
        .map_err(|_| Error::backend("CUDA source contains a NUL byte".to_string()))?;
    let name = c"fusebox.cu";
    let (status, log, ptx) = run_nvrtc(&c_source, name, flags)?;
    if !log.trim().is_empty() {
        let path = staging.path().join(format!("{key}.log"));
        fs::write(&path, &log).map_err(|e| Error::write(path.display(), e))?;
    }
    if let Err(e) = status {
        let (kept, moved) = staging.keep_source();
        return Err(Error::backend(format!(
            "NVRTC failed ({e}) on {}{} with {}:\n{}",
            kept.display(),
            if moved { "" } else { " (could not be kept)" },
            flags.join(" "),
            trim_diagnostics(&log)
        )));
    }
    let path = staging.path().join(staging.artifact_name());
    fs::write(&path, ptx).map_err(|e| Error::write(path.display(), e))
}

/// What one NVRTC compile gives: its status, its log and (on success) the PTX.
type NvrtcOutput = (
    std::result::Result<(), cudarc::nvrtc::result::NvrtcError>,
    String,
    String,
);

fn run_nvrtc(source: &CStr, name: &CStr, flags: &[String]) -> Result<NvrtcOutput> {
    use cudarc::nvrtc::result as nvrtc;
    let program = nvrtc::create_program(source, Some(name))
        .map_err(|e| Error::backend(format!("nvrtcCreateProgram failed: {e}")))?;
    // SAFETY: `program` was just created and is destroyed exactly once below; the options
    // contain no NUL byte (checked in `flags`, and paths cannot contain one), so cudarc's
    // conversion to C strings cannot fail.
    let status = unsafe { nvrtc::compile_program(program, flags) };
    // SAFETY: as above; the log and PTX are copied out before the program is destroyed.
    let log = unsafe { nvrtc::get_program_log(program) }
        .map(|chars| text_of(&chars))
        .unwrap_or_default();
    let ptx = match status {
        // SAFETY: as above.
        Ok(()) => unsafe { nvrtc::get_ptx(program) }.map(|chars| text_of(&chars)),
        Err(_) => Ok(String::new()),
    };
    // SAFETY: created above and not destroyed before.
    let _ = unsafe { nvrtc::destroy_program(program) };
    let ptx = ptx.map_err(|e| Error::backend(format!("nvrtcGetPTX failed: {e}")))?;
    Ok((status, log, ptx))
}

/// A NUL-terminated C character buffer as text.
fn text_of(chars: &[std::ffi::c_char]) -> String {
    let bytes: Vec<u8> = chars
        .iter()
        .map(|&c| c as u8)
        .take_while(|&b| b != 0)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn architectures_parse() {
        assert_eq!(parse_arch("sm_90").unwrap(), (90, ""));
        assert_eq!(parse_arch("sm_90a").unwrap(), (90, "a"));
        assert_eq!(parse_arch("compute_80").unwrap(), (80, ""));
        assert_eq!(parse_arch("86").unwrap(), (86, ""));
        for bad in ["", "sm_", "sm_x", "sm_90b", "gfx90a", "sm_-1"] {
            let err = parse_arch(bad).unwrap_err().to_string();
            assert!(err.contains("not a CUDA architecture"), "{bad}: {err}");
        }
        assert_eq!(arch_for_capability(9, 0), "sm_90");
        assert_eq!(arch_for_capability(8, 6), "sm_86");
    }

    #[test]
    fn warnings_are_told_from_echoed_source() {
        let warned = "fusebox.cu(3): warning #177-D: variable \"x\" was declared but never referenced\n  int x;\n";
        assert!(has_warning(warned));
        assert!(has_warning("nvrtc: warning : option ignored\n"));
        let echo = "fusebox.cu(9): error: identifier \"y\" is undefined\n  // warning: y\n";
        assert!(!has_warning(echo));
        assert!(!has_warning(""));
    }

    #[test]
    fn defaults_keep_ieee_semantics() {
        let options = CompileOptions::from_env();
        assert!(!options.fast_math && !options.fmad && !options.warnings_as_errors);
        assert!(options.cache_dir.ends_with("cuda"));
    }

    #[test]
    fn c_text_stops_at_nul() {
        let chars: Vec<std::ffi::c_char> = b"ab\0cd".iter().map(|&b| b as _).collect();
        assert_eq!(text_of(&chars), "ab");
    }
}
