//! The C compiler driver and the on-disk kernel cache.
//!
//! [`Compiler::compile`] turns one C translation unit into a loaded shared library. Compiling
//! costs tens to hundreds of milliseconds per kernel, so results are cached twice: in memory
//! for the life of a [`Compiler`], and on disk across processes.
//!
//! # The disk cache
//!
//! An entry is content-addressed by its key (see [`Compiler::key`]): the hex SHA-256 of the
//! source, the compiler's identity and the flags. Everything that can change the machine code
//! is in the key, so an entry never goes stale and is never rewritten with other contents;
//! changing the source, the compiler or a flag simply names another entry. In `cache_dir`:
//!
//! - `<key>.so`: the library;
//! - `<key>.sha256`: the hex SHA-256 of the library's bytes;
//! - `<key>.c`: the source it was compiled from, kept so that a user can read exactly what ran
//!   (and find it when a compile fails).
//!
//! Several threads or processes may build the same entry at once, and a process may die half
//! way through writing one, so a reader must never see a half-written library. A writer
//! therefore compiles in a private temporary directory inside `cache_dir` (same file system,
//! so renames are atomic), writes the digest there, and then renames the source, the digest
//! and finally the library into place. Readers only ever look at `<key>.so`: once it exists,
//! its digest already does. Before loading, a reader hashes the library and compares it with
//! the digest; a mismatch, a missing digest or a library the dynamic loader rejects means the
//! entry was damaged (a crash from an older layout, a full disk, a user's stray edit) and it is
//! rebuilt, counted in [`CompileStats::rebuilt_corrupt`]. A damaged entry is replaced by
//! renaming a fresh build over it, never unlinked first, so a reader cannot delete the valid
//! copy a concurrent writer has just renamed in.
//!
//! Compiler output must be byte-for-byte reproducible for concurrent writers to agree on the
//! digest: the compiler runs inside the temporary directory on the relative name `<key>.c`,
//! so no temporary path ends up in the library (GCC records the input name in its symbol
//! table).
//!
//! The dynamic loader keeps a library loaded under its path, and a later `dlopen` of the
//! same path returns the library already loaded rather than reading the file again. That is
//! sound here only because entries are content-addressed and never change once renamed in.

use crate::error::{Error, ErrorKind, Result, Site};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::ffi::c_void;
use std::fmt;
use std::fs;
use std::io;
use std::mem::ManuallyDrop;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

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

/// Libraries linked after the source file (the linker resolves left to right): libmvec for the
/// vector math variants, libm for the scalar ones.
pub const LINK_LIBS: &[&str] = &["-lmvec", "-lm"];

/// At most this many lines of compiler diagnostics go into an error message: the first errors
/// are the useful ones, and a runaway cascade should not bury them.
const MAX_DIAGNOSTIC_LINES: usize = 40;
/// At most this many bytes of compiler diagnostics go into an error message.
const MAX_DIAGNOSTIC_BYTES: usize = 6000;

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

fn env_nonempty(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn default_cache_dir() -> PathBuf {
    if let Some(dir) = env_nonempty("FUSEBOX_CACHE_DIR") {
        return PathBuf::from(dir);
    }
    let base = env_nonempty("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| env_nonempty("HOME").map(|home| Path::new(&home).join(".cache")));
    match base {
        Some(base) => base.join("fusebox").join("cpu"),
        None => std::env::temp_dir().join("fusebox-cache").join("cpu"),
    }
}

/// What a [`Compiler`] has done since it was created.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CompileStats {
    /// Times the C compiler ran successfully (rebuilds of damaged entries included).
    pub compiled: usize,
    /// Libraries loaded from a valid disk cache entry.
    pub disk_hits: usize,
    /// Requests answered from this compiler's memory.
    pub memory_hits: usize,
    /// Damaged disk entries (digest mismatch or missing, or rejected by the loader) rebuilt.
    pub rebuilt_corrupt: usize,
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
            return Err(backend(format!(
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
            Err(e) => Err(backend(format!(
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

/// One in-memory cache slot. Each key has its own lock so that one thread compiles a given
/// source while others wait for it, and distinct sources still compile in parallel.
type Slot = Arc<Mutex<Option<Arc<Module>>>>;

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
    memory: Mutex<HashMap<String, Slot>>,
    stats: Mutex<CompileStats>,
}

impl fmt::Debug for Compiler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Compiler")
            .field("config", &self.config)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

/// Distinguishes temporary directories of one process; with the pid and the clock it makes
/// their names unique across processes too.
static TEMP_COUNTER: AtomicUsize = AtomicUsize::new(0);

impl Compiler {
    /// A compiler with empty memory cache. Nothing runs until the first compile.
    pub fn new(config: CompilerConfig) -> Compiler {
        Compiler {
            config,
            version: OnceLock::new(),
            host: OnceLock::new(),
            memory: Mutex::new(HashMap::new()),
            stats: Mutex::new(CompileStats::default()),
        }
    }

    pub fn config(&self) -> &CompilerConfig {
        &self.config
    }

    /// Counters since creation.
    pub fn stats(&self) -> CompileStats {
        *lock(&self.stats)
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
    /// Errors are [`ErrorKind::Backend`]: a compiler that cannot be run, a cache directory
    /// that cannot be written, or a failed compile, whose message carries the compiler's
    /// diagnostics (the first lines) and the path of the kept source file.
    pub fn compile(&self, source: &str) -> Result<Arc<Module>> {
        let key = self.key(source)?;
        let slot = lock(&self.memory).entry(key.clone()).or_default().clone();
        let mut loaded = lock(&slot);
        if let Some(module) = loaded.as_ref() {
            lock(&self.stats).memory_hits += 1;
            return Ok(module.clone());
        }
        let module = Arc::new(self.load_or_build(&key, source)?);
        *loaded = Some(module.clone());
        Ok(module)
    }

    fn load_or_build(&self, key: &str, source: &str) -> Result<Module> {
        let dir = &self.config.cache_dir;
        let so = dir.join(format!("{key}.so"));
        let damaged = match load_cached(key, &so) {
            Cached::Valid(module) => {
                lock(&self.stats).disk_hits += 1;
                // The source is documentation only; restore it if someone removed it.
                let c = dir.join(format!("{key}.c"));
                if !c.exists() {
                    let _ = write_atomically(dir, &c, source.as_bytes());
                }
                return Ok(module);
            }
            Cached::Missing => false,
            Cached::Damaged => true,
        };
        let module = self.build(key, source)?;
        let mut stats = lock(&self.stats);
        stats.compiled += 1;
        if damaged {
            stats.rebuilt_corrupt += 1;
        }
        Ok(module)
    }

    /// Runs the compiler in a fresh temporary directory and publishes the entry (see the
    /// module docs for the order of renames and why).
    fn build(&self, key: &str, source: &str) -> Result<Module> {
        let dir = &self.config.cache_dir;
        fs::create_dir_all(dir).map_err(|e| {
            backend(format!(
                "cannot create the kernel cache directory {}: {e} (set FUSEBOX_CACHE_DIR to a writable directory)",
                dir.display()
            ))
        })?;
        let temp = TempDir::create(dir)?;
        let c_name = format!("{key}.c");
        let so_name = format!("{key}.so");
        let digest_name = format!("{key}.sha256");
        let kept_source = dir.join(&c_name);

        fs::write(temp.0.join(&c_name), source)
            .map_err(|e| io_error("cannot write kernel source", &temp.0.join(&c_name), e))?;
        let output = Command::new(&self.config.cc)
            .args(&self.config.flags)
            .arg(&c_name)
            .arg("-o")
            .arg(&so_name)
            .args(LINK_LIBS)
            .current_dir(&temp.0)
            .output()
            .map_err(|e| cannot_run(&self.config.cc, &e))?;
        if !output.status.success() {
            // Keep the source where the message says it is, even though nothing was built.
            let kept = fs::rename(temp.0.join(&c_name), &kept_source).is_ok();
            let status = match output.status.code() {
                Some(code) => format!("exit status {code}"),
                None => "killed by a signal".to_string(),
            };
            let mut diagnostics = String::from_utf8_lossy(&output.stderr).into_owned();
            if diagnostics.trim().is_empty() {
                diagnostics = String::from_utf8_lossy(&output.stdout).into_owned();
            }
            return Err(backend(format!(
                "C compiler `{}` failed ({status}) on {}{}:\n{}",
                self.config.cc,
                kept_source.display(),
                if kept { "" } else { " (could not be kept)" },
                trim_diagnostics(&diagnostics)
            )));
        }

        let built = temp.0.join(&so_name);
        let bytes = fs::read(&built).map_err(|e| {
            io_error(
                "the C compiler reported success but its output cannot be read",
                &built,
                e,
            )
        })?;
        fs::write(temp.0.join(&digest_name), hex(&Sha256::digest(&bytes)))
            .map_err(|e| io_error("cannot write digest", &temp.0.join(&digest_name), e))?;
        // Source, then digest, then library: whoever sees `<key>.so` finds its digest too.
        for name in [&c_name, &digest_name, &so_name] {
            let (from, to) = (temp.0.join(name), dir.join(name));
            fs::rename(&from, &to).map_err(|e| {
                backend(format!(
                    "cannot move {} to {}: {e}",
                    from.display(),
                    to.display()
                ))
            })?;
        }
        let so = dir.join(&so_name);
        let library = open_library(&so).map_err(|e| {
            backend(format!(
                "the freshly compiled {} cannot be loaded: {e} (source: {})",
                so.display(),
                kept_source.display()
            ))
        })?;
        Ok(Module {
            key: key.to_string(),
            path: so,
            library: ManuallyDrop::new(library),
        })
    }
}

/// What the disk cache holds for one key.
enum Cached {
    Valid(Module),
    Missing,
    Damaged,
}

/// Loads `<key>.so` if it is present, matches its digest and is accepted by the loader.
fn load_cached(key: &str, so: &Path) -> Cached {
    let bytes = match fs::read(so) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Cached::Missing,
        Err(_) => return Cached::Damaged,
    };
    let Ok(recorded) = fs::read_to_string(so.with_extension("sha256")) else {
        return Cached::Damaged;
    };
    if !recorded
        .trim()
        .eq_ignore_ascii_case(&hex(&Sha256::digest(&bytes)))
    {
        return Cached::Damaged;
    }
    match open_library(so) {
        Ok(library) => Cached::Valid(Module {
            key: key.to_string(),
            path: so.to_path_buf(),
            library: ManuallyDrop::new(library),
        }),
        Err(_) => Cached::Damaged,
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

/// A private build directory inside the cache directory, removed on drop (after its files
/// were renamed out, or after a failure).
struct TempDir(PathBuf);

impl TempDir {
    fn create(cache_dir: &Path) -> Result<TempDir> {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let name = format!(
            ".tmp-{}-{}-{nanos}",
            std::process::id(),
            TEMP_COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let path = cache_dir.join(name);
        fs::create_dir(&path).map_err(|e| io_error("cannot create a build directory", &path, e))?;
        Ok(TempDir(path))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// Writes `path` through a temporary file and a rename, so no reader sees it half written.
fn write_atomically(dir: &Path, path: &Path, bytes: &[u8]) -> io::Result<()> {
    let temp = dir.join(format!(
        ".tmp-{}-{}.part",
        std::process::id(),
        TEMP_COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    fs::write(&temp, bytes)?;
    fs::rename(&temp, path).inspect_err(|_| {
        let _ = fs::remove_file(&temp);
    })
}

fn query_version(cc: &str) -> Result<String> {
    let output = Command::new(cc)
        .arg("--version")
        .output()
        .map_err(|e| cannot_run(cc, &e))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let first = stdout.lines().map(str::trim).find(|l| !l.is_empty());
    match (output.status.success(), first) {
        (true, Some(line)) => Ok(line.to_string()),
        _ => Err(backend(format!(
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
    backend(format!(
        "cannot run the C compiler `{cc}`: {e}; install a C compiler or set FUSEBOX_CC to one (for example FUSEBOX_CC=gcc)"
    ))
}

fn io_error(what: &str, path: &Path, e: io::Error) -> Error {
    backend(format!("{what} {}: {e}", path.display()))
}

fn backend(message: String) -> Error {
    Error::new(Site::default(), ErrorKind::Backend(message))
}

/// The first lines of compiler output, cut to a readable size.
fn trim_diagnostics(text: &str) -> String {
    let lines: Vec<&str> = text.trim_end().lines().collect();
    let mut out = String::new();
    let mut shown = 0;
    for line in &lines {
        if shown == MAX_DIAGNOSTIC_LINES || out.len() + line.len() > MAX_DIAGNOSTIC_BYTES {
            break;
        }
        out.push_str(line);
        out.push('\n');
        shown += 1;
    }
    if shown < lines.len() {
        out.push_str(&format!("… ({} more lines)\n", lines.len() - shown));
    }
    out.trim_end().to_string()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A poisoned lock only means another thread panicked while holding it; the data (counters,
/// a map of finished modules) is still consistent, so keep going.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
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
    fn diagnostics_are_cut_to_the_first_lines() {
        let long: String = (0..100).map(|i| format!("line {i}\n")).collect();
        let cut = trim_diagnostics(&long);
        assert_eq!(cut.lines().count(), MAX_DIAGNOSTIC_LINES + 1);
        assert!(cut.starts_with("line 0\n"));
        assert!(cut.ends_with("(60 more lines)"));
        assert_eq!(trim_diagnostics("a\nb\n"), "a\nb");
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
