//! The C compiler driver and the on-disk kernel cache.
//!
//! [`Compiler::compile`] turns one C translation unit into a loaded shared library. Compiling
//! costs a few tenths of a second to a second per kernel, so results are cached twice: in memory
//! for the life of a [`Compiler`], and on disk across processes.
//!
//! # The disk cache
//!
//! Entries live in [`crate::backend::cache`]'s content-addressed store, keyed by
//! [`Compiler::key`]: the hex SHA-256 of the source, the compiler's identity and the flags. In
//! `cache_dir`, `<key>.so` is the library, `<key>.sha256` its digest and `<key>.c` the source
//! it was compiled from. That module explains why concurrent writers and crashed ones never
//! leave a half-written library where a reader would load it; a library the dynamic loader
//! rejects counts as damaged and is rebuilt, like one whose digest does not match.
//!
//! Compiler output must be byte-for-byte reproducible for concurrent writers to agree on the
//! digest: the compiler runs inside the temporary build directory on the relative name
//! `<key>.c`, so no temporary path ends up in the library (GCC records the input name in its
//! symbol table).
//!
//! # The precompiled header
//!
//! Every kernel includes the same system headers, and GCC spends about as long parsing
//! `immintrin.h` as optimizing a typical kernel. The cache directory therefore also holds
//! [`PRECOMPILED_HEADER`] compiled once with the kernels' own flags (`<key>.h`, `<key>.h.gch`,
//! `<key>.sha256`, published like a library, keyed like one), and builds read it with
//! `-include`. It is an accelerator only: the libraries are byte for byte the same, a compiler
//! that cannot make one builds without, and a kernel that fails with it is built again without
//! it before anything is reported.
//!
//! The dynamic loader keeps a library loaded under its path, and a later `dlopen` of the
//! same path returns the library already loaded rather than reading the file again. That is
//! sound here only because entries are content-addressed and never change once renamed in.

pub use crate::backend::cache::CompileStats;
use crate::backend::cache::{
    KernelCache, Staging, env_nonempty, hex, lock, trim_diagnostics, user_cache_dir,
};
use crate::error::{Error, Result};
use sha2::{Digest, Sha256};
use std::ffi::c_void;
use std::fmt;
use std::fs;
use std::io;
use std::mem::ManuallyDrop;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, OnceLock};

/// The C ABI of every generated kernel (see [`crate::lower::ir::Launch`]): `sizes[rank]`, then
/// per argument `rank` strides, one offset and one pointer.
pub type KernelFn = unsafe extern "C" fn(
    sizes: *const i64,
    strides: *const i64,
    offsets: *const i64,
    ptrs: *const *mut c_void,
);

/// The flags every kernel is compiled with, and why:
///
/// - `-O3 -march=native`: kernels are hot loops; auto-vectorization for this machine's vector
///   width is most of their speed. (`-march=native` ties a library to the host CPU, so the
///   cache key includes the host's identity; see [`Compiler::key`].)
/// - `-fopenmp`: `#pragma omp parallel for` spreads a kernel over threads, and
///   `#pragma omp declare simd` declarations let the vectorizer call glibc's libmvec vector
///   variants of `expf`, `tanhf`, … (scalar calls in the loop cost about 35× more).
/// - `-fPIC -shared`: the output is a shared library loaded with `dlopen`.
/// - `-fno-math-errno`: math functions need not set `errno`. This changes no value; it only
///   lets `sqrt` become one instruction and lets math calls vectorize.
/// - `-ffp-contract=off`: no fusing of `a * b + c` into one FMA, whose single rounding would
///   give results (and overflows) that differ from the unfused graph's.
///
/// There is deliberately no `-ffast-math`: NaN, ±Inf, signed zeros and IEEE rounding must
/// behave exactly as in the reference evaluator.
pub const DEFAULT_FLAGS: &[&str] = &[
    "-O3",
    "-march=native",
    "-fopenmp",
    "-fPIC",
    "-shared",
    "-fno-math-errno",
    "-ffp-contract=off",
];

/// The system headers the generated kernels include (`emit/prelude.c`, and `emit/vector.c`
/// where the target has AVX-512), compiled once into a precompiled header that every kernel
/// build reads with `-include` instead of parsing them again.
///
/// Parsing `immintrin.h` costs GCC 12 about as much as optimizing a typical kernel: the fused
/// `lstm_cell`, `layernorm` and `softmax` kernels took 0.7 to 1.0 s to build on the 2-core
/// development machine, and 0.3 to 0.5 s with the precompiled header, byte-identical.
/// Force-including these headers changes nothing in a kernel: each has an include guard, so
/// the kernel's own `#include` lines find them already read, and they declare only names
/// reserved to the implementation (`_mm512_*`, `__m512`) that no generated name can take.
/// (tests/cpu_emit.rs checks that these are exactly the headers generated modules include.)
pub const PRECOMPILED_HEADER: &str = "\
/* The system headers of fusebox's generated kernels, precompiled. */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif
";

/// Libraries linked after the source file (the linker resolves left to right): libmvec for the
/// vector math variants, libm for the scalar ones.
pub const LINK_LIBS: &[&str] = &["-lmvec", "-lm"];

/// How to run the C compiler and where to keep what it builds.
#[derive(Debug, Clone)]
pub struct CompilerConfig {
    /// The compiler program (a path or a name looked up in `PATH`; no arguments). Default:
    /// the `FUSEBOX_CC` environment variable, else `cc`.
    pub cc: String,
    /// Arguments before the source file. Default: [`DEFAULT_FLAGS`].
    pub flags: Vec<String>,
    /// Where compiled libraries are cached. Default: `FUSEBOX_CACHE_DIR`, else
    /// `$XDG_CACHE_HOME/fusebox/cpu`, else `$HOME/.cache/fusebox/cpu`, else
    /// `<temp dir>/fusebox-cache/cpu`.
    pub cache_dir: PathBuf,
}

impl CompilerConfig {
    /// The configuration the environment asks for (empty variables count as unset).
    pub fn from_env() -> CompilerConfig {
        CompilerConfig {
            cc: env_nonempty("FUSEBOX_CC").unwrap_or_else(|| "cc".to_string()),
            flags: DEFAULT_FLAGS.iter().map(|f| f.to_string()).collect(),
            cache_dir: default_cache_dir(),
        }
    }

    /// The same configuration caching in `dir` instead.
    pub fn with_cache_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.cache_dir = dir.into();
        self
    }
}

impl Default for CompilerConfig {
    fn default() -> Self {
        CompilerConfig::from_env()
    }
}

fn default_cache_dir() -> PathBuf {
    match env_nonempty("FUSEBOX_CACHE_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => user_cache_dir("cpu"),
    }
}

/// A loaded kernel library.
///
/// Function pointers from [`Module::kernel`] point into this library: they are valid only
/// while the `Module` (usually an `Arc<Module>`) is alive.
///
/// Dropping a `Module` does not unload the library (`dlclose` is never called). Kernels run
/// OpenMP parallel loops, and the OpenMP runtime (libgomp) keeps its worker threads alive
/// after a loop ends; unloading the last library that depends on it unmaps the runtime under
/// those threads and the process crashes. Keeping every kernel library costs one mapping per
/// distinct kernel source for the life of the process, and repeated loads of one library only
/// raise the loader's reference count.
pub struct Module {
    key: String,
    path: PathBuf,
    library: ManuallyDrop<libloading::Library>,
}

impl fmt::Debug for Module {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Module")
            .field("key", &self.key)
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl Module {
    /// The cache key: the hex SHA-256 naming this library's entry.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The library file, `<cache_dir>/<key>.so`; its source is beside it as `<key>.c`.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The kernel function `name`.
    ///
    /// `name` must be a C identifier: anything else could never name a generated kernel and
    /// is rejected rather than passed to the loader. The pointer is only valid while `self`
    /// is alive, and calling it is only sound with arguments following the ABI of
    /// [`crate::lower::ir::Launch`] for the kernel's IR. Note that the loader also finds
    /// symbols of the libraries this one links (`sqrt` would resolve to libm's), so callers
    /// should only ask for names the emitter generated.
    pub fn kernel(&self, name: &str) -> Result<KernelFn> {
        if !is_c_identifier(name) {
            return Err(Error::backend(format!(
                "`{name}` is not a C identifier, so it cannot name a kernel in {}",
                self.path.display()
            )));
        }
        // SAFETY: the symbol is only looked up here, not called; the caller is responsible
        // for calling it with the kernel ABI (documented above), and the returned pointer is
        // valid as long as `self.library` is loaded, i.e. as long as `self` lives.
        let symbol = unsafe { self.library.get::<KernelFn>(name.as_bytes()) };
        match symbol {
            Ok(symbol) => Ok(*symbol),
            Err(e) => Err(Error::backend(format!(
                "kernel `{name}` not found in {}: {e}",
                self.path.display()
            ))),
        }
    }
}

fn is_c_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    match chars.next() {
        Some(c) if c == '_' || c.is_ascii_alphabetic() => {}
        _ => return false,
    }
    chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
}

/// Compiles C sources into loaded libraries, through a memory cache and a disk cache.
///
/// `Compiler` is `Send + Sync`: share one through an `Arc` so that every thread benefits from
/// its memory cache. Separate `Compiler`s (in one process or many) may share a cache
/// directory safely.
pub struct Compiler {
    config: CompilerConfig,
    /// `Ok(first line of cc --version)`, or the error explaining why it could not be run.
    version: OnceLock<Result<String>>,
    /// What `-march=native` resolves to, as far as the key needs to know.
    host: OnceLock<String>,
    cache: KernelCache<Module>,
    /// The precompiled [`PRECOMPILED_HEADER`], in the same directory as the libraries: the
    /// header as `<key>.h`, GCC's compiled form of it as `<key>.h.gch` (where `-include
    /// <key>.h` looks for it), and its digest.
    headers: KernelCache<PathBuf>,
    header_state: Mutex<HeaderState>,
}

/// Whether kernel builds read the precompiled header.
enum HeaderState {
    /// Not looked for yet, or not worth building yet (see [`Compiler::header`]).
    Untried,
    /// `-include` this path (its `.gch` is beside it).
    Ready(PathBuf),
    /// The compiler could not build one, or a kernel failed with it but built without it:
    /// builds go on without it.
    Unavailable,
}

impl fmt::Debug for Compiler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Compiler")
            .field("config", &self.config)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl Compiler {
    /// A compiler with empty memory cache. Nothing runs until the first compile.
    pub fn new(config: CompilerConfig) -> Compiler {
        Compiler {
            cache: KernelCache::new(config.cache_dir.clone(), "so", "c"),
            headers: KernelCache::new(config.cache_dir.clone(), "h.gch", "h"),
            header_state: Mutex::new(HeaderState::Untried),
            config,
            version: OnceLock::new(),
            host: OnceLock::new(),
        }
    }

    pub fn config(&self) -> &CompilerConfig {
        &self.config
    }

    /// Counters since creation.
    pub fn stats(&self) -> CompileStats {
        self.cache.stats()
    }

    /// The compiler's identity used in the cache key: the first line of `cc --version`, which
    /// names the compiler and its version (a compiler upgrade must not reuse old libraries).
    /// Run once, on first use.
    pub fn compiler_version(&self) -> Result<String> {
        self.version
            .get_or_init(|| query_version(&self.config.cc))
            .clone()
    }

    /// The cache key of `source`: the hex SHA-256 of
    /// `source ‖ "\0" ‖ compiler version line ‖ "\0" ‖ flags and link libraries joined by
    /// spaces`, followed, when the flags contain `-march=native`, by `"\0"` and the host
    /// CPU's identity (model name and feature flags), because such a library may use
    /// instructions another CPU sharing the cache directory lacks. The NUL separators keep
    /// the parts from running into each other (C source never contains NUL).
    pub fn key(&self, source: &str) -> Result<String> {
        let version = self.compiler_version()?;
        let mut hasher = Sha256::new();
        hasher.update(source.as_bytes());
        hasher.update(b"\0");
        hasher.update(version.as_bytes());
        hasher.update(b"\0");
        let args: Vec<&str> = self
            .config
            .flags
            .iter()
            .map(String::as_str)
            .chain(LINK_LIBS.iter().copied())
            .collect();
        hasher.update(args.join(" ").as_bytes());
        if self.config.flags.iter().any(|f| f == "-march=native") {
            hasher.update(b"\0");
            hasher.update(self.host.get_or_init(host_identity).as_bytes());
        }
        Ok(hex(&hasher.finalize()))
    }

    /// Compiled and loaded library for `source`: from this compiler's memory cache, else from
    /// the disk cache, else by running the compiler.
    ///
    /// Errors are [`ErrorKind::Backend`](crate::ErrorKind::Backend): a compiler that cannot
    /// be run, a cache directory that cannot be written, or a failed compile, whose message
    /// carries the compiler's diagnostics (the first lines) and the path of the kept source.
    pub fn compile(&self, source: &str) -> Result<Arc<Module>> {
        let key = self.key(source)?;
        let load = |path: &Path, _bytes: Vec<u8>| {
            open_library(path)
                .map(|library| Module {
                    key: key.clone(),
                    path: path.to_path_buf(),
                    library: ManuallyDrop::new(library),
                })
                .map_err(|e| {
                    // libloading's own text is only "dlopen failed"; the loader's reason (a
                    // bad ELF header, a missing symbol) is its source.
                    let reason = std::error::Error::source(&e)
                        .map_or_else(|| e.to_string(), |why| why.to_string());
                    format!(
                        "the dynamic loader refused it: {reason} (built by C compiler `{}`; set FUSEBOX_CC to a working C compiler)",
                        self.config.cc
                    )
                })
        };
        self.cache
            .get_or_build(&key, source, &load, |staging| self.build(staging))
    }

    /// The precompiled header's path for `-include`, building it if that is worth it.
    ///
    /// Building one takes about as long as two kernels, so a compiler builds it only once it
    /// has built a kernel of its own (a process that compiles one kernel never pays for it);
    /// one already in the cache directory is used from the start. A compiler that cannot build
    /// one (not GCC, or no precompiled headers) simply builds without.
    fn header(&self) -> Option<PathBuf> {
        let mut state = lock(&self.header_state);
        match &*state {
            HeaderState::Ready(path) => return Some(path.clone()),
            HeaderState::Unavailable => return None,
            HeaderState::Untried => {}
        }
        let key = self.key(PRECOMPILED_HEADER).ok()?;
        if self.cache.stats().compiled == 0 && !self.headers.artifact_path(&key).exists() {
            return None;
        }
        let built = self.headers.get_or_build(
            &key,
            PRECOMPILED_HEADER,
            &|path, _| Ok(path.to_path_buf()),
            |staging| {
                let mut command = self.command(staging);
                command.args(["-x", "c-header", staging.source_name(), "-o"]);
                command.arg(staging.artifact_name());
                let output =
                    output_of(&mut command).map_err(|e| cannot_run(&self.config.cc, &e))?;
                if output.status.success() {
                    Ok(())
                } else {
                    Err(Error::backend("no precompiled header"))
                }
            },
        );
        let header = built.ok().map(|_| self.headers.source_path(&key));
        *state = match &header {
            Some(path) => HeaderState::Ready(path.clone()),
            None => HeaderState::Unavailable,
        };
        header
    }

    /// The compiler with the kernels' flags, to run inside `staging`.
    fn command(&self, staging: &Staging) -> Command {
        let mut command = Command::new(&self.config.cc);
        command.args(&self.config.flags).current_dir(staging.path());
        command
    }

    /// Runs the compiler once inside the staging directory on the staged source.
    fn run(&self, staging: &Staging, header: Option<&Path>) -> Result<std::process::Output> {
        let mut command = self.command(staging);
        if let Some(header) = header {
            command.arg("-include").arg(header);
        }
        command
            .arg(staging.source_name())
            .arg("-o")
            .arg(staging.artifact_name())
            .args(LINK_LIBS);
        output_of(&mut command).map_err(|e| cannot_run(&self.config.cc, &e))
    }

    /// Runs the compiler inside the staging directory on the staged source, reading the
    /// precompiled header where there is one. A build that fails with the header is run again
    /// without it: if that one succeeds the header was to blame (a damaged file, a compiler
    /// that reads another format), and later builds do without it.
    fn build(&self, staging: &Staging) -> Result<()> {
        let header = self.header();
        let mut output = self.run(staging, header.as_deref())?;
        if !output.status.success() && header.is_some() {
            output = self.run(staging, None)?;
            if output.status.success() {
                *lock(&self.header_state) = HeaderState::Unavailable;
            }
        }
        if output.status.success() {
            return Ok(());
        }
        // Keep the source where the message says it is, even though nothing was built.
        let (kept_source, kept) = staging.keep_source();
        let status = match output.status.code() {
            Some(code) => format!("exit status {code}"),
            None => "killed by a signal".to_string(),
        };
        let mut diagnostics = String::from_utf8_lossy(&output.stderr).into_owned();
        if diagnostics.trim().is_empty() {
            diagnostics = String::from_utf8_lossy(&output.stdout).into_owned();
        }
        Err(Error::backend(format!(
            "C compiler `{}` failed ({status}) on {}{}:\n{}",
            self.config.cc,
            kept_source.display(),
            if kept { "" } else { " (could not be kept)" },
            trim_diagnostics(&diagnostics)
        )))
    }
}

/// `dlopen` with every symbol resolved now (`RTLD_NOW`): a library that references a missing
/// function fails here, where it can be rebuilt or reported, instead of crashing on the first
/// call of a kernel.
fn open_library(path: &Path) -> std::result::Result<libloading::Library, libloading::Error> {
    #[cfg(unix)]
    {
        use libloading::os::unix::{Library, RTLD_LOCAL, RTLD_NOW};
        // SAFETY: loading runs the library's initializers; our libraries are plain C kernels
        // built by `Compiler::build` (or verified byte-for-byte against its digest).
        unsafe { Library::open(Some(path), RTLD_NOW | RTLD_LOCAL) }.map(Into::into)
    }
    #[cfg(not(unix))]
    {
        // SAFETY: as above.
        unsafe { libloading::Library::new(path) }
    }
}

/// `ETXTBSY`, "text file busy" (26 on Linux and macOS): the program is open for writing.
const TEXT_FILE_BUSY: i32 = 26;

/// Runs `command` to completion, trying again for a moment while its program is open for
/// writing somewhere (`ETXTBSY`): a compiler wrapper a build step has just written is ready a
/// few milliseconds later, and so is one this process just wrote while another of its threads
/// was starting a child, which holds every open file until it executes.
fn output_of(command: &mut Command) -> std::io::Result<std::process::Output> {
    let mut wait = std::time::Duration::from_millis(5);
    for _ in 0..6 {
        match command.output() {
            Err(e) if e.raw_os_error() == Some(TEXT_FILE_BUSY) => {
                std::thread::sleep(wait);
                wait *= 2;
            }
            done => return done,
        }
    }
    command.output()
}

fn query_version(cc: &str) -> Result<String> {
    let output = output_of(Command::new(cc).arg("--version")).map_err(|e| cannot_run(cc, &e))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let first = stdout.lines().map(str::trim).find(|l| !l.is_empty());
    match (output.status.success(), first) {
        (true, Some(line)) => Ok(line.to_string()),
        _ => Err(Error::backend(format!(
            "C compiler `{cc}` did not report a version with `{cc} --version`: {}; set FUSEBOX_CC to a C compiler such as gcc or clang",
            trim_diagnostics(&String::from_utf8_lossy(&output.stderr))
        ))),
    }
}

/// The host CPU as far as `-march=native` can see it: the model name and feature flags of
/// the first processor in `/proc/cpuinfo` (empty where that file does not exist).
fn host_identity() -> String {
    let Ok(info) = fs::read_to_string("/proc/cpuinfo") else {
        return std::env::consts::ARCH.to_string();
    };
    let field = |name: &str| {
        info.lines()
            .find(|l| l.split(':').next().is_some_and(|k| k.trim() == name))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
            .unwrap_or_default()
    };
    format!(
        "{} | {} | {}",
        std::env::consts::ARCH,
        field("model name"),
        field("flags")
    )
}

fn cannot_run(cc: &str, e: &io::Error) -> Error {
    Error::backend(format!(
        "cannot run the C compiler `{cc}`: {e}; install a C compiler or set FUSEBOX_CC to one (for example FUSEBOX_CC=gcc)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers() {
        assert!(is_c_identifier("k0_fused"));
        assert!(is_c_identifier("_x"));
        assert!(!is_c_identifier(""));
        assert!(!is_c_identifier("0k"));
        assert!(!is_c_identifier("k-1"));
        assert!(!is_c_identifier("k\0"));
        assert!(!is_c_identifier("é"));
    }

    #[test]
    fn hex_is_lowercase_two_digits_per_byte() {
        assert_eq!(hex(&[0, 15, 255]), "000fff");
        // SHA-256 of the empty string, a published test vector.
        assert_eq!(
            hex(&Sha256::digest(b"")),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    #[test]
    fn compiler_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<Compiler>();
        check::<Module>();
    }
}
