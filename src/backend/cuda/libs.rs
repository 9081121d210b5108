//! Finding the CUDA libraries and headers, and loading them without panicking.
//!
//! cudarc (built with `dynamic-loading`) opens its libraries on first use by plain names
//! (`libnvrtc.so`, `libnvrtc.so.12`, …) and panics when none loads. fusebox therefore probes
//! first, here, and only then lets cudarc make calls. To find NVRTC where the system's
//! loader would not look, fusebox loads it by full path first and never unloads it: glibc
//! answers a later `dlopen` by a plain name with an already loaded library whose soname
//! matches, so cudarc's lookup finds that copy.
//!
//! NVRTC is searched for in this order, the first hit winning:
//!
//! 1. `FUSEBOX_CUDA_DIR`, when set: a pip-wheel `nvidia/` directory (`cuda_nvrtc/lib`,
//!    `cuda_runtime/include`), its parent, or a CUDA toolkit root (`lib64`, `include`). A set
//!    variable that holds no NVRTC is an error, not a reason to look elsewhere.
//! 2. [`toolkit_cache_dir`] (`~/.cache/fusebox/cuda-toolkit`), where `.ci/run` unpacks the
//!    `nvidia-cuda-nvrtc-cu12` and `nvidia-cuda-runtime-cu12` wheels.
//! 3. The system: whatever the dynamic loader finds by cudarc's names (`LD_LIBRARY_PATH`,
//!    the ldconfig cache), with headers from `CUDA_HOME`, `CUDA_PATH` or `/usr/local/cuda`.
//! 4. Python `site-packages/nvidia` directories of the usual prefixes (a virtualenv, conda,
//!    `~/.local`, `/usr/local`, `/usr`), where `pip install nvidia-cuda-nvrtc-cu12` puts it.
//!
//! The generated kernels include `cuda_fp16.h` and `cuda_bf16.h`, which NVRTC does not carry,
//! so NVRTC counts as available only together with a directory holding those headers.

use crate::backend::cache::{env_nonempty, sha256_hex, user_cache_dir};
use crate::error::{Error, Result};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The environment variable naming a directory with NVRTC and the CUDA headers.
pub const CUDA_DIR_VAR: &str = "FUSEBOX_CUDA_DIR";

/// The headers every generated module includes.
const HEADERS: [&str; 2] = ["cuda_fp16.h", "cuda_bf16.h"];

/// How to get NVRTC and the headers, for error messages.
const HOW_TO_INSTALL: &str = "get them with `python3 -m pip download --no-deps nvidia-cuda-nvrtc-cu12 nvidia-cuda-runtime-cu12 -d DIR` and unpack both wheels (they are zip files) into ~/.cache/fusebox/cuda-toolkit, as .ci/run does, or set FUSEBOX_CUDA_DIR to an unpacked `nvidia/` directory or a CUDA toolkit";

/// NVRTC ready to compile fusebox's kernels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvrtcSetup {
    /// The library file loaded by path, or `None` when the system's loader found it.
    pub library: Option<PathBuf>,
    /// Which step of the search found it (`FUSEBOX_CUDA_DIR`, `the fusebox cache`, …).
    pub found_by: &'static str,
    /// The directory holding `cuda_fp16.h` and `cuda_bf16.h`, passed to NVRTC with `-I`.
    pub include_dir: PathBuf,
    /// What `nvrtcVersion` reports: (major, minor).
    pub version: (i32, i32),
    /// The compute capabilities this NVRTC can target (`80` for sm_80), ascending.
    pub archs: Vec<u32>,
    /// The hex SHA-256 of the fp16/bf16 headers (`.h` and `.hpp`): their contents shape the
    /// PTX, so the PTX cache key includes it instead of the directory's path.
    pub header_digest: String,
}

/// Why NVRTC cannot be used: what is missing, where it was looked for and how to get it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NvrtcError {
    /// `FUSEBOX_CUDA_DIR` names a directory without the library.
    #[error(
        "{CUDA_DIR_VAR}={dir} holds no NVRTC library (libnvrtc.so.12) under cuda_nvrtc/lib, nvidia/cuda_nvrtc/lib, lib64 or lib; {HOW_TO_INSTALL}"
    )]
    NotInDir { dir: String },
    /// No search step found it; `cache` is the fusebox cache directory searched.
    #[error(
        "NVRTC (libnvrtc.so.12) not found: {CUDA_DIR_VAR} is unset, {} holds none, the system library path has none and no Python site-packages/nvidia does; {HOW_TO_INSTALL}",
        .cache.display()
    )]
    NotFound { cache: PathBuf },
    /// Loaded by path, but cudarc would not find it by any of `names`.
    #[error("NVRTC at {at} was loaded, but not under a name cudarc looks for ({names})")]
    NotUnderCudarcName { at: String, names: String },
    #[error(
        "NVRTC found at {at}, but no directory holds {}: they come with the CUDA runtime headers; {HOW_TO_INSTALL}",
        HEADERS.join(" and ")
    )]
    NoHeaders { at: String },
    /// An NVRTC query failed; `message` is cudarc's.
    #[error("{function} failed on {at}: {message}")]
    CallFailed {
        function: &'static str,
        at: String,
        message: String,
    },
    /// The library (opened as `name`) lacks a function fusebox calls.
    #[error("NVRTC {name} (at {at}) lacks `{symbol}`: it is too old; fusebox needs CUDA 12")]
    MissingSymbol {
        name: String,
        at: String,
        symbol: &'static str,
    },
    #[error("NVRTC at {at} could not be opened again")]
    NotReopened { at: String },
    /// The dynamic loader refused the library at `path`; `message` is its reason.
    #[error("cannot load {}: {message}", .path.display())]
    Load { path: PathBuf, message: String },
}

/// NVRTC and its headers, found and loaded once per process; or a Backend error naming what is
/// missing, where it was looked for and how to get it.
pub fn nvrtc_available() -> Result<NvrtcSetup> {
    nvrtc_setup().cloned()
}

/// [`nvrtc_available`] without the copy, for callers on every compile.
pub(crate) fn nvrtc_setup() -> Result<&'static NvrtcSetup> {
    nvrtc_found().map_err(|e| Error::backend(e.to_string()))
}

/// NVRTC as the search found it, or why it was not, searched once per process.
pub(crate) fn nvrtc_found() -> std::result::Result<&'static NvrtcSetup, &'static NvrtcError> {
    static NVRTC: OnceLock<std::result::Result<NvrtcSetup, NvrtcError>> = OnceLock::new();
    NVRTC.get_or_init(find_nvrtc).as_ref()
}

/// Whether the CUDA driver library (libcuda, installed with the NVIDIA driver) can be loaded:
/// cudarc's driver calls are safe only when this is true.
pub fn driver_available() -> bool {
    static DRIVER: OnceLock<bool> = OnceLock::new();
    // SAFETY: the probe only tries to dlopen the library by cudarc's names and closes it.
    *DRIVER.get_or_init(|| unsafe { cudarc::driver::sys::is_culib_present() })
}

/// Whether cuBLAS can be loaded: cudarc's cuBLAS calls are safe only when this is true.
pub fn cublas_available() -> bool {
    cublas().is_some()
}

/// `Some(path)` when cuBLAS was loaded by path, `Some(None)` when the system's loader finds
/// it, `None` when it is missing. Searched once per process.
fn cublas() -> &'static Option<Option<PathBuf>> {
    static CUBLAS: OnceLock<Option<Option<PathBuf>>> = OnceLock::new();
    CUBLAS.get_or_init(find_cublas)
}

/// Whether cuDNN can be loaded: cudarc's cuDNN calls are safe only when this is true. Without
/// it, convolutions run as im2col GEMMs through cuBLAS.
pub fn cudnn_available() -> bool {
    cudnn().is_some()
}

/// [`cublas`]'s answer for cuDNN.
fn cudnn() -> &'static Option<Option<PathBuf>> {
    static CUDNN: OnceLock<Option<Option<PathBuf>>> = OnceLock::new();
    CUDNN.get_or_init(find_cudnn)
}

/// Where `.ci/run` unpacks the NVRTC and runtime wheels: `$XDG_CACHE_HOME/fusebox/cuda-toolkit`
/// (else under `~/.cache`), holding `nvidia/cuda_nvrtc` and `nvidia/cuda_runtime`.
pub fn toolkit_cache_dir() -> PathBuf {
    user_cache_dir("cuda-toolkit")
}

/// One line each for NVRTC, the headers, the driver and cuBLAS: what `fusebox info` prints.
pub fn describe() -> String {
    let mut out = String::new();
    match nvrtc_found() {
        Ok(setup) => {
            let library = match &setup.library {
                Some(path) => format!("{} (found by {})", path.display(), setup.found_by),
                None => setup.found_by.to_string(),
            };
            out += &format!(
                "NVRTC: {}.{} from {library}; targets sm_{}..sm_{}\n",
                setup.version.0,
                setup.version.1,
                setup.archs.first().copied().unwrap_or(0),
                setup.archs.last().copied().unwrap_or(0),
            );
            out += &format!("CUDA headers: {}\n", setup.include_dir.display());
        }
        Err(e) => out += &format!("NVRTC: not available: {e}\n"),
    }
    out += &format!(
        "CUDA driver library: {}\n",
        if driver_available() {
            "found"
        } else {
            "not found (libcuda comes with the NVIDIA driver; needed to run kernels, not to compile them)"
        }
    );
    out += &format!(
        "cuBLAS: {}\n",
        found(
            cublas(),
            "pip wheel nvidia-cublas-cu12, or the CUDA toolkit"
        )
    );
    out += &format!(
        "cuDNN: {}\n",
        found(
            cudnn(),
            "pip wheel nvidia-cudnn-cu12; without it convolutions run as im2col GEMMs"
        )
    );
    out
}

/// Where a library loaded by path ([`find_by_path`]) was found, for `fusebox info`.
fn found(library: &Option<Option<PathBuf>>, how_to_get: &str) -> String {
    match library {
        Some(Some(path)) => format!("found at {}", path.display()),
        Some(None) => "found on the system library path".to_string(),
        None => format!("not found ({how_to_get})"),
    }
}

/// A directory that may hold NVRTC, and which search step it comes from.
struct Candidate {
    root: PathBuf,
    found_by: &'static str,
}

fn find_nvrtc() -> std::result::Result<NvrtcSetup, NvrtcError> {
    if let Some(dir) = env_nonempty(CUDA_DIR_VAR) {
        let root = PathBuf::from(&dir);
        let Some(library) = find_library(&root, "nvrtc", &["cuda_nvrtc"]) else {
            return Err(NvrtcError::NotInDir { dir });
        };
        return setup_from(library, &root, CUDA_DIR_VAR);
    }
    let cache = toolkit_cache_dir();
    if let Some(library) = find_library(&cache, "nvrtc", &["cuda_nvrtc"]) {
        return setup_from(library, &cache, "the fusebox cache");
    }
    // SAFETY: the probe only tries to dlopen the library by cudarc's names and closes it.
    if unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        let include = find_include(header_roots().iter().map(PathBuf::as_path));
        return finish(None, include, "the system library path");
    }
    for candidate in python_roots() {
        if let Some(library) = find_library(&candidate.root, "nvrtc", &["cuda_nvrtc"]) {
            return setup_from(library, &candidate.root, candidate.found_by);
        }
    }
    Err(NvrtcError::NotFound {
        cache: toolkit_cache_dir(),
    })
}

/// Loads `library` by path and finds the headers beside it (or on the system).
fn setup_from(
    library: PathBuf,
    root: &Path,
    found_by: &'static str,
) -> std::result::Result<NvrtcSetup, NvrtcError> {
    preload(&library)?;
    let roots = header_roots();
    let include = find_include(std::iter::once(root).chain(roots.iter().map(PathBuf::as_path)));
    finish(Some(library), include, found_by)
}

/// Checks that cudarc finds NVRTC with every function fusebox calls, and asks it for its
/// version and targets.
fn finish(
    library: Option<PathBuf>,
    include_dir: Option<PathBuf>,
    found_by: &'static str,
) -> std::result::Result<NvrtcSetup, NvrtcError> {
    let where_ = match &library {
        Some(path) => path.display().to_string(),
        None => "the system library path".to_string(),
    };
    // SAFETY: as in `find_nvrtc`.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(NvrtcError::NotUnderCudarcName {
            at: where_,
            names: candidate_names("nvrtc").join(", "),
        });
    }
    check_symbols(&where_)?;
    let Some(include_dir) = include_dir else {
        return Err(NvrtcError::NoHeaders { at: where_ });
    };
    let (mut major, mut minor) = (0, 0);
    // SAFETY: the library is loaded and has the symbol (checked above); the pointers are to
    // live locals.
    unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) }
        .result()
        .map_err(|e| call_failed("nvrtcVersion", &where_, e))?;
    Ok(NvrtcSetup {
        library,
        found_by,
        version: (major, minor),
        archs: supported_archs(&where_)?,
        header_digest: header_digest(&include_dir),
        include_dir,
    })
}

/// The functions fusebox calls through cudarc. cudarc panics on a missing symbol, so an NVRTC
/// too old to have one is refused here instead.
const NVRTC_SYMBOLS: [&str; 10] = [
    "nvrtcVersion",
    "nvrtcGetNumSupportedArchs",
    "nvrtcGetSupportedArchs",
    "nvrtcCreateProgram",
    "nvrtcCompileProgram",
    "nvrtcDestroyProgram",
    "nvrtcGetPTXSize",
    "nvrtcGetPTX",
    "nvrtcGetProgramLogSize",
    "nvrtcGetProgramLog",
];

/// Opens NVRTC by the first of cudarc's names that loads (the library cudarc itself will
/// use) and looks up every symbol in [`NVRTC_SYMBOLS`].
fn check_symbols(where_: &str) -> std::result::Result<(), NvrtcError> {
    for name in candidate_names("nvrtc") {
        // SAFETY: loading NVRTC runs no initializer with preconditions; it is already loaded
        // (cudarc found it), so this only raises its reference count.
        let Ok(lib) = (unsafe { libloading::Library::new(&name) }) else {
            continue;
        };
        for symbol in NVRTC_SYMBOLS {
            // SAFETY: the symbol is looked up, never called, through this handle.
            if unsafe { lib.get::<*const ()>(symbol.as_bytes()) }.is_err() {
                return Err(NvrtcError::MissingSymbol {
                    name,
                    at: where_.to_string(),
                    symbol,
                });
            }
        }
        return Ok(());
    }
    Err(NvrtcError::NotReopened {
        at: where_.to_string(),
    })
}

/// An NVRTC query `function` that failed on the library at `where_`.
fn call_failed(function: &'static str, where_: &str, e: impl std::fmt::Display) -> NvrtcError {
    NvrtcError::CallFailed {
        function,
        at: where_.to_string(),
        message: e.to_string(),
    }
}

fn supported_archs(where_: &str) -> std::result::Result<Vec<u32>, NvrtcError> {
    let mut count = 0;
    // SAFETY: the symbols exist (checked); the pointer is to a live local.
    unsafe { cudarc::nvrtc::sys::nvrtcGetNumSupportedArchs(&mut count) }
        .result()
        .map_err(|e| call_failed("nvrtcGetNumSupportedArchs", where_, e))?;
    let mut archs = vec![0; usize::try_from(count).unwrap_or(0)];
    // SAFETY: `archs` has room for the `count` entries NVRTC writes.
    unsafe { cudarc::nvrtc::sys::nvrtcGetSupportedArchs(archs.as_mut_ptr()) }
        .result()
        .map_err(|e| call_failed("nvrtcGetSupportedArchs", where_, e))?;
    let mut archs: Vec<u32> = archs
        .into_iter()
        .filter_map(|a| u32::try_from(a).ok())
        .collect();
    archs.sort_unstable();
    Ok(archs)
}

/// Loads `path` and leaks the handle, so the library stays loaded for cudarc to find by name.
fn preload(path: &Path) -> std::result::Result<(), NvrtcError> {
    // SAFETY: loading NVRTC or cuBLAS runs only their own initializers, which have no
    // preconditions.
    match unsafe { libloading::Library::new(path) } {
        Ok(library) => {
            std::mem::forget(library);
            Ok(())
        }
        Err(e) => Err(NvrtcError::Load {
            path: path.to_path_buf(),
            message: e.to_string(),
        }),
    }
}

/// cudarc's names for library `lib` (`nvrtc`, `cublas`), most specific last.
fn candidate_names(lib: &str) -> Vec<String> {
    cudarc::get_lib_name_candidates(lib)
}

/// The directories a library may be in under `root`: a wheel `nvidia/` directory (with the
/// package directories `packages`), its parent, or a toolkit root.
fn library_dirs(root: &Path, packages: &[&str]) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    for package in packages {
        dirs.push(root.join(package).join("lib"));
        dirs.push(root.join("nvidia").join(package).join("lib"));
    }
    dirs.push(root.join("lib64"));
    dirs.push(root.join("lib"));
    dirs
}

/// The first file under `root` named like one of cudarc's names for `lib`, the names with a
/// major version first (the dev symlink `libnvrtc.so` may point anywhere).
fn find_library(root: &Path, lib: &str, packages: &[&str]) -> Option<PathBuf> {
    let mut names = candidate_names(lib);
    names.sort_by_key(|n| n.ends_with(std::env::consts::DLL_SUFFIX));
    library_dirs(root, packages).into_iter().find_map(|dir| {
        names
            .iter()
            .map(|n| dir.join(n))
            .find(|path| path.is_file())
    })
}

/// The first directory under one of `roots` holding every header in [`HEADERS`].
fn find_include<'a>(roots: impl Iterator<Item = &'a Path>) -> Option<PathBuf> {
    roots
        .flat_map(|root| {
            [
                root.join("cuda_runtime").join("include"),
                root.join("nvidia").join("cuda_runtime").join("include"),
                root.join("include"),
            ]
        })
        .find(|dir| HEADERS.iter().all(|h| dir.join(h).is_file()))
}

/// The SHA-256 of the fp16 and bf16 headers and their `.hpp` halves, in a fixed order.
fn header_digest(include_dir: &Path) -> String {
    let mut all = Vec::new();
    for name in [
        "cuda_fp16.h",
        "cuda_fp16.hpp",
        "cuda_bf16.h",
        "cuda_bf16.hpp",
    ] {
        all.extend_from_slice(name.as_bytes());
        all.push(0);
        all.extend(std::fs::read(include_dir.join(name)).unwrap_or_default());
        all.push(0);
    }
    sha256_hex(&all)
}

/// Where else headers may be: `FUSEBOX_CUDA_DIR`, the fusebox cache, CUDA toolkit roots named
/// by the usual variables, the usual install place, and Python's `site-packages/nvidia`.
fn header_roots() -> Vec<PathBuf> {
    env_nonempty(CUDA_DIR_VAR)
        .map(PathBuf::from)
        .into_iter()
        .chain([toolkit_cache_dir()])
        .chain(
            ["CUDA_HOME", "CUDA_PATH"]
                .into_iter()
                .filter_map(env_nonempty)
                .map(PathBuf::from),
        )
        .chain([PathBuf::from("/usr/local/cuda")])
        .chain(python_roots().into_iter().map(|c| c.root))
        .collect()
}

/// `site-packages/nvidia` (and `dist-packages/nvidia`) directories under the usual Python
/// prefixes. Only directories are listed (no Python runs), so this stays cheap.
fn python_roots() -> Vec<Candidate> {
    let mut prefixes: Vec<PathBuf> = ["VIRTUAL_ENV", "CONDA_PREFIX"]
        .into_iter()
        .filter_map(env_nonempty)
        .map(PathBuf::from)
        .collect();
    if let Some(home) = env_nonempty("HOME") {
        prefixes.push(Path::new(&home).join(".local"));
    }
    prefixes.extend(["/usr/local", "/usr"].map(PathBuf::from));
    let mut roots = Vec::new();
    for prefix in prefixes {
        let Ok(entries) = std::fs::read_dir(prefix.join("lib")) else {
            continue;
        };
        let mut pythons: Vec<PathBuf> = entries
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("python3"))
            .map(|e| e.path())
            .collect();
        pythons.sort();
        for python in pythons {
            for packages in ["site-packages", "dist-packages"] {
                let root = python.join(packages).join("nvidia");
                if root.is_dir() {
                    roots.push(Candidate {
                        root,
                        found_by: "Python site-packages",
                    });
                }
            }
        }
    }
    roots
}

/// cuBLAS from the directories NVRTC is searched in (loaded by path, after cuBLASLt, which it
/// needs and which a toolkit's `lib64` has no RUNPATH to find), else from the system.
fn find_cublas() -> Option<Option<PathBuf>> {
    // SAFETY: the probe only tries to dlopen the library by cudarc's names and closes it.
    find_by_path("cublas", "cublas", &["cublasLt"], || unsafe {
        cudarc::cublas::sys::is_culib_present()
    })
}

/// cuDNN from the directories NVRTC is searched in (`nvidia/cudnn/lib` of its wheel, loaded by
/// path after the libraries it opens by name at run time), else from the system.
fn find_cudnn() -> Option<Option<PathBuf>> {
    let parts = [
        "cudnn_graph",
        "cudnn_engines_precompiled",
        "cudnn_engines_runtime_compiled",
        "cudnn_heuristic",
        "cudnn_ops",
        "cudnn_cnn",
    ];
    // SAFETY: the probe only tries to dlopen the library by cudarc's names and closes it.
    find_by_path("cudnn", "cudnn", &parts, || unsafe {
        cudarc::cudnn::sys::is_culib_present()
    })
}

/// Library `lib` (package directory `package` of a wheel) from the directories NVRTC is
/// searched in, loaded by path after `companions` from the same root, which it needs by name;
/// then `present` (cudarc's probe by its names) says whether cudarc will find it. `Some(path)`
/// when loaded by path, `Some(None)` when only the system's loader finds it, `None` when it is
/// missing.
fn find_by_path(
    lib: &str,
    package: &str,
    companions: &[&str],
    present: impl Fn() -> bool,
) -> Option<Option<PathBuf>> {
    let mut roots: Vec<PathBuf> = env_nonempty(CUDA_DIR_VAR)
        .map(PathBuf::from)
        .into_iter()
        .collect();
    roots.push(toolkit_cache_dir());
    roots.extend(python_roots().into_iter().map(|c| c.root));
    let found = roots
        .iter()
        .find_map(|root| find_library(root, lib, &[package]).map(|path| (root, path)));
    if let Some((root, library)) = &found {
        for companion in companions {
            if let Some(path) = find_library(root, companion, &[package]) {
                let _ = preload(&path);
            }
        }
        let _ = preload(library);
    }
    if !present() {
        return None;
    }
    Some(found.map(|(_, library)| library))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("fusebox-libs-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn libraries_are_found_in_wheel_and_toolkit_layouts() {
        let dir = scratch("layouts");
        let wheel = dir.join("wheel").join("nvidia");
        let toolkit = dir.join("toolkit");
        for lib in [
            wheel.join("cuda_nvrtc/lib/libnvrtc.so.12"),
            toolkit.join("lib64/libnvrtc.so"),
            toolkit.join("lib64/libnvrtc.so.12"),
        ] {
            std::fs::create_dir_all(lib.parent().unwrap()).unwrap();
            std::fs::write(&lib, b"").unwrap();
        }
        let want = wheel.join("cuda_nvrtc/lib/libnvrtc.so.12");
        assert_eq!(
            find_library(&wheel, "nvrtc", &["cuda_nvrtc"]),
            Some(want.clone())
        );
        // The parent of `nvidia/` works too.
        assert_eq!(
            find_library(&dir.join("wheel"), "nvrtc", &["cuda_nvrtc"]),
            Some(want)
        );
        // The versioned name wins over the unversioned symlink.
        assert_eq!(
            find_library(&toolkit, "nvrtc", &["cuda_nvrtc"]),
            Some(toolkit.join("lib64/libnvrtc.so.12"))
        );
        assert_eq!(find_library(&dir, "nvrtc", &["cuda_nvrtc"]), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn include_dir_needs_both_headers() {
        let dir = scratch("headers");
        let include = dir.join("nvidia/cuda_runtime/include");
        std::fs::create_dir_all(&include).unwrap();
        std::fs::write(include.join("cuda_fp16.h"), b"// fp16").unwrap();
        assert_eq!(find_include([dir.as_path()].into_iter()), None);
        std::fs::write(include.join("cuda_bf16.h"), b"// bf16").unwrap();
        assert_eq!(
            find_include([dir.as_path()].into_iter()),
            Some(include.clone())
        );

        // The digest follows the contents, not the place.
        let before = header_digest(&include);
        let copy = dir.join("copy");
        std::fs::create_dir_all(&copy).unwrap();
        for h in HEADERS {
            std::fs::copy(include.join(h), copy.join(h)).unwrap();
        }
        assert_eq!(header_digest(&copy), before);
        std::fs::write(copy.join("cuda_bf16.hpp"), b"// more").unwrap();
        assert_ne!(header_digest(&copy), before);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
