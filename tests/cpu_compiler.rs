//! The CPU compiler driver and its caches: hand-written C kernels of the kernel ABI compiled,
//! loaded and called; memory and disk cache hits; damaged entries rebuilt; concurrent threads
//! and processes sharing one cache directory; compiler errors reported, not panicked on.

use fusebox::ErrorKind;
use fusebox::backend::cpu::compiler::{
    CompileStats, Compiler, CompilerConfig, DEFAULT_FLAGS, KernelFn, Module, PRECOMPILED_HEADER,
};
use sha2::{Digest, Sha256};
use std::ffi::c_void;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Barrier};
use std::time::{SystemTime, UNIX_EPOCH};

/// `y[i] = 2 * x[i]` over `sizes[0]` doubles, honouring each argument's stride and offset.
const SCALE2: &str = r#"
#include <stdint.h>
void scale2(const int64_t *sizes, const int64_t *strides, const int64_t *offsets,
            void *const *ptrs) {
    const double *x = (const double *)ptrs[0];
    double *y = (double *)ptrs[1];
    for (int64_t i = 0; i < sizes[0]; i++)
        y[offsets[1] + i * strides[1]] = 2.0 * x[offsets[0] + i * strides[0]];
}
"#;

/// A fresh, empty directory for one test.
fn temp_dir(tag: &str) -> PathBuf {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let dir = std::env::temp_dir().join(format!(
        "fusebox-cpu-compiler-{}-{tag}-{nanos}",
        std::process::id()
    ));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    dir
}

fn compiler(dir: &Path) -> Compiler {
    Compiler::new(CompilerConfig::from_env().with_cache_dir(dir))
}

/// A source unique to `tag`, so tests never share a library the loader already holds.
fn scale2_source(tag: &str) -> String {
    format!("/* {tag} */\n{SCALE2}")
}

/// Calls a one-axis kernel with two arguments.
fn call_1d(
    kernel: KernelFn,
    n: i64,
    strides: [i64; 2],
    offsets: [i64; 2],
    x: &[f64],
    y: &mut [f64],
) {
    let ptrs = [x.as_ptr() as *mut c_void, y.as_mut_ptr() as *mut c_void];
    let last = |s: i64, o: i64| (o + (n - 1) * s) as usize;
    assert!(last(strides[0], offsets[0]) < x.len() && last(strides[1], offsets[1]) < y.len());
    let sizes = [n];
    // SAFETY: the kernel follows the ABI above and touches only the indices checked above.
    unsafe {
        kernel(
            sizes.as_ptr(),
            strides.as_ptr(),
            offsets.as_ptr(),
            ptrs.as_ptr(),
        )
    };
}

/// Runs `scale2` of `module` on a small contiguous input and checks every value.
fn check_scale2(module: &Module) {
    let x: Vec<f64> = (0..37).map(|i| i as f64 * 0.25 - 3.0).collect();
    let mut y = vec![f64::NAN; x.len()];
    call_1d(
        module.kernel("scale2").unwrap(),
        37,
        [1, 1],
        [0, 0],
        &x,
        &mut y,
    );
    for (xi, yi) in x.iter().zip(&y) {
        assert_eq!(*yi, xi + xi);
    }
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Entry files of `key` in `dir`, and that the digest file matches the library's bytes.
fn assert_entry_consistent(dir: &Path, key: &str, source: &str) {
    let so = fs::read(dir.join(format!("{key}.so"))).unwrap();
    let digest = fs::read_to_string(dir.join(format!("{key}.sha256"))).unwrap();
    assert_eq!(digest.trim(), sha256_hex(&so));
    assert_eq!(
        fs::read_to_string(dir.join(format!("{key}.c"))).unwrap(),
        source
    );
}

/// Names in `dir`, sorted.
fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

fn entry_names(key: &str) -> Vec<String> {
    vec![
        format!("{key}.c"),
        format!("{key}.sha256"),
        format!("{key}.so"),
    ]
}

#[test]
fn kernel_honours_sizes_strides_and_offsets() {
    let dir = temp_dir("abi");
    let compiler = compiler(&dir);
    let module = compiler.compile(&scale2_source("abi")).unwrap();
    check_scale2(&module);

    // Read every second element starting at 1, write backwards from the end.
    let x: Vec<f64> = (0..20).map(|i| i as f64).collect();
    let mut y = vec![-1.0; 10];
    call_1d(
        module.kernel("scale2").unwrap(),
        10,
        [2, -1],
        [1, 9],
        &x,
        &mut y,
    );
    let expected: Vec<f64> = (0..10).rev().map(|i| 2.0 * (2 * i + 1) as f64).collect();
    assert_eq!(y, expected);
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn openmp_vector_math_and_no_fp_contraction() {
    // Two kernels in one unit: expf through libmvec's vector variants in an OpenMP loop, and
    // `a * b - 1`, which an FMA would compute without rounding the product.
    let source = r#"
#include <stdint.h>
#include <math.h>
#pragma omp declare simd notinbranch
float expf(float);
void k_exp(const int64_t *sizes, const int64_t *strides, const int64_t *offsets,
           void *const *ptrs) {
    const float *x = (const float *)ptrs[0] + offsets[0];
    float *y = (float *)ptrs[1] + offsets[1];
    #pragma omp parallel for simd
    for (int64_t i = 0; i < sizes[0]; i++) y[i] = expf(x[i]);
    (void)strides;
}
void k_mul_sub(const int64_t *sizes, const int64_t *strides, const int64_t *offsets,
               void *const *ptrs) {
    const float *a = (const float *)ptrs[0];
    const float *b = (const float *)ptrs[1];
    float *y = (float *)ptrs[2];
    for (int64_t i = 0; i < sizes[0]; i++) y[i] = a[i] * b[i] - 1.0f;
    (void)strides; (void)offsets;
}
"#;
    let dir = temp_dir("omp");
    let compiler = compiler(&dir);
    let module = compiler.compile(source).unwrap();

    let n = 4096usize;
    let x: Vec<f32> = (0..n).map(|i| i as f32 / 256.0 - 8.0).collect();
    let mut y = vec![f32::NAN; n];
    let ptrs = [x.as_ptr() as *mut c_void, y.as_mut_ptr() as *mut c_void];
    let (sizes, strides, offsets) = ([n as i64], [1i64, 1], [0i64, 0]);
    let k_exp = module.kernel("k_exp").unwrap();
    // SAFETY: k_exp reads x[0..n] and writes y[0..n].
    unsafe {
        k_exp(
            sizes.as_ptr(),
            strides.as_ptr(),
            offsets.as_ptr(),
            ptrs.as_ptr(),
        )
    };
    for (xi, yi) in x.iter().zip(&y) {
        let exact = (*xi as f64).exp();
        assert!(
            ((*yi as f64) - exact).abs() <= 4.0 * f32::EPSILON as f64 * exact,
            "expf({xi}) = {yi}, expected {exact}"
        );
    }

    // (1 + 2^-12)^2 = 1 + 2^-11 + 2^-24: rounding the product to f32 drops the 2^-24 (a tie,
    // to even), so the unfused result is exactly 2^-11; an FMA would give 2^-11 + 2^-24.
    let a = vec![1.0f32 + 2f32.powi(-12); 64];
    let mut out = vec![f32::NAN; 64];
    let ptrs = [
        a.as_ptr() as *mut c_void,
        a.as_ptr() as *mut c_void,
        out.as_mut_ptr() as *mut c_void,
    ];
    let (sizes, strides, offsets) = ([64i64], [1i64, 1, 1], [0i64, 0, 0]);
    let k = module.kernel("k_mul_sub").unwrap();
    // SAFETY: k_mul_sub reads a[0..64] twice and writes out[0..64].
    unsafe {
        k(
            sizes.as_ptr(),
            strides.as_ptr(),
            offsets.as_ptr(),
            ptrs.as_ptr(),
        )
    };
    let unfused = a[0] * a[0] - 1.0;
    assert_eq!(unfused, 2f32.powi(-11));
    assert!(
        out.iter().all(|v| v.to_bits() == unfused.to_bits()),
        "{out:?}"
    );
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn same_source_twice_is_one_compile_and_writes_a_full_entry() {
    let dir = temp_dir("memory");
    let compiler = compiler(&dir);
    let source = scale2_source("memory");
    let first = compiler.compile(&source).unwrap();
    let second = compiler.compile(&source).unwrap();
    assert!(Arc::ptr_eq(&first, &second));
    assert_eq!(
        compiler.stats(),
        CompileStats {
            compiled: 1,
            memory_hits: 1,
            ..CompileStats::default()
        }
    );
    let key = first.key().to_string();
    assert_eq!(key.len(), 64);
    assert!(
        key.bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
    );
    assert_eq!(key, compiler.key(&source).unwrap());
    assert_eq!(first.path(), dir.join(format!("{key}.so")));
    // Only the entry remains: the build directory is gone.
    assert_eq!(listing(&dir), entry_names(&key));
    assert_entry_consistent(&dir, &key, &source);
    check_scale2(&second);
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_new_compiler_loads_from_disk() {
    let dir = temp_dir("disk");
    let source = scale2_source("disk");
    let key = compiler(&dir).compile(&source).unwrap().key().to_string();

    let again = compiler(&dir);
    let module = again.compile(&source).unwrap();
    assert_eq!(module.key(), key);
    assert_eq!(
        again.stats(),
        CompileStats {
            disk_hits: 1,
            ..CompileStats::default()
        }
    );
    check_scale2(&module);

    // The kept source is documentation; a disk hit puts it back if it was removed.
    fs::remove_file(dir.join(format!("{key}.c"))).unwrap();
    let third = compiler(&dir);
    third.compile(&source).unwrap();
    assert_eq!(third.stats().disk_hits, 1);
    assert_entry_consistent(&dir, &key, &source);
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn key_depends_on_source_and_flags() {
    let dir = temp_dir("key");
    let a = compiler(&dir);
    let b = compiler(&dir);
    assert_eq!(a.key("int x;").unwrap(), b.key("int x;").unwrap());
    assert_ne!(a.key("int x;").unwrap(), a.key("int y;").unwrap());
    let mut config = CompilerConfig::from_env().with_cache_dir(&dir);
    config.flags.retain(|f| f != "-O3");
    config.flags.push("-O2".into());
    let o2 = Compiler::new(config);
    assert_ne!(a.key("int x;").unwrap(), o2.key("int x;").unwrap());
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn config_defaults_and_version() {
    let config = CompilerConfig::from_env();
    assert_eq!(config.flags, DEFAULT_FLAGS);
    assert!(!config.flags.iter().any(|f| f.contains("fast-math")));
    let moved = config.clone().with_cache_dir("/some/where");
    assert_eq!(moved.cache_dir, Path::new("/some/where"));
    assert_eq!(moved.cc, config.cc);

    // The version is the first line of `cc --version`, asked independently here.
    let output = Command::new(&config.cc).arg("--version").output().unwrap();
    let expected = String::from_utf8(output.stdout).unwrap();
    let compiler = Compiler::new(config);
    assert_eq!(
        compiler.compiler_version().unwrap(),
        expected.lines().next().unwrap().trim()
    );
}

/// Damages the entry of `source` with `damage` (after a first compile wrote it), then checks
/// that a new compiler notices, rebuilds, and leaves a good entry a third compiler can load.
fn damaged_entry_is_rebuilt(tag: &str, damage: impl FnOnce(&Path, &Path)) {
    let dir = temp_dir(tag);
    let source = scale2_source(tag);
    let key = compiler(&dir).compile(&source).unwrap().key().to_string();
    let so = dir.join(format!("{key}.so"));
    let digest = dir.join(format!("{key}.sha256"));
    damage(&so, &digest);

    let rebuilding = compiler(&dir);
    let module = rebuilding.compile(&source).unwrap();
    assert_eq!(
        rebuilding.stats(),
        CompileStats {
            compiled: 1,
            rebuilt_corrupt: 1,
            ..CompileStats::default()
        },
        "{tag}"
    );
    check_scale2(&module);
    assert_entry_consistent(&dir, &key, &source);
    assert_eq!(listing(&dir), entry_names(&key));

    let third = compiler(&dir);
    check_scale2(&third.compile(&source).unwrap());
    assert_eq!(third.stats().disk_hits, 1);
    fs::remove_dir_all(&dir).unwrap();
}

/// Replaces a file's contents through a new inode: the library may still be mapped by this
/// process, and shrinking a mapped file in place would make touching it fault.
fn replace(path: &Path, bytes: &[u8]) {
    fs::remove_file(path).unwrap();
    fs::write(path, bytes).unwrap();
}

#[test]
fn truncated_library_is_rebuilt() {
    damaged_entry_is_rebuilt("truncated", |so, _| {
        let bytes = fs::read(so).unwrap();
        replace(so, &bytes[..bytes.len() / 2]);
    });
}

#[test]
fn overwritten_bytes_are_rebuilt() {
    damaged_entry_is_rebuilt("overwritten", |so, _| {
        let mut bytes = fs::read(so).unwrap();
        let middle = bytes.len() / 2;
        for b in &mut bytes[middle..middle + 16] {
            *b ^= 0xa5;
        }
        replace(so, &bytes);
    });
}

#[test]
fn missing_or_wrong_digest_is_rebuilt() {
    damaged_entry_is_rebuilt("no-digest", |_, digest| fs::remove_file(digest).unwrap());
    damaged_entry_is_rebuilt("wrong-digest", |_, digest| {
        fs::write(digest, sha256_hex(b"something else")).unwrap()
    });
}

#[test]
fn library_the_loader_rejects_is_rebuilt_even_with_a_matching_digest() {
    // Planted before anything was compiled: once this process has loaded a path, the loader
    // answers later loads of that path from memory without reading the file again.
    let dir = temp_dir("not-elf");
    let source = scale2_source("not-elf");
    let compiler = compiler(&dir);
    let key = compiler.key(&source).unwrap();
    let junk = b"this is not a shared library";
    fs::write(dir.join(format!("{key}.so")), junk).unwrap();
    fs::write(dir.join(format!("{key}.sha256")), sha256_hex(junk)).unwrap();

    check_scale2(&compiler.compile(&source).unwrap());
    assert_eq!(
        compiler.stats(),
        CompileStats {
            compiled: 1,
            rebuilt_corrupt: 1,
            ..CompileStats::default()
        }
    );
    assert_entry_consistent(&dir, &key, &source);
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn leftovers_of_an_interrupted_writer_are_never_loaded() {
    // A crashed writer may leave its build directory, and (from a hand copy or an older
    // layout) a library without a digest. Neither may be loaded.
    let dir = temp_dir("leftovers");
    let source = scale2_source("leftovers");
    let compiler = compiler(&dir);
    let key = compiler.key(&source).unwrap();
    let stale = dir.join(".tmp-1-0-0");
    fs::create_dir(&stale).unwrap();
    fs::write(stale.join(format!("{key}.so")), b"half a libr").unwrap();
    fs::write(dir.join(format!("{key}.so")), b"\x7fELF half written").unwrap();

    let module = compiler.compile(&source).unwrap();
    check_scale2(&module);
    assert_eq!(
        compiler.stats(),
        CompileStats {
            compiled: 1,
            rebuilt_corrupt: 1,
            ..CompileStats::default()
        }
    );
    assert_entry_consistent(&dir, &key, &source);
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn compile_error_carries_the_diagnostic_and_the_kept_source() {
    let dir = temp_dir("invalid");
    let compiler = compiler(&dir);
    let source = "void broken(void) { return undeclared_thing_42 + ; }\n";
    let err = compiler.compile(source).unwrap_err();
    let ErrorKind::Backend(message) = &err.kind else {
        panic!("expected a backend error, got {err}");
    };
    assert!(message.contains("undeclared_thing_42"), "{message}");
    assert!(message.contains("error"), "{message}");
    let kept = dir.join(format!("{}.c", compiler.key(source).unwrap()));
    assert!(message.contains(&kept.display().to_string()), "{message}");
    assert_eq!(fs::read_to_string(&kept).unwrap(), source);
    assert_eq!(compiler.stats(), CompileStats::default());
    // Nothing loadable was published, and no build directory is left behind.
    assert_eq!(
        listing(&dir),
        vec![kept.file_name().unwrap().to_str().unwrap()]
    );

    // The compiler keeps working after a failure.
    check_scale2(&compiler.compile(&scale2_source("invalid")).unwrap());
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn missing_compiler_is_a_clean_error() {
    let dir = temp_dir("no-cc");
    let config = CompilerConfig {
        cc: "/nonexistent/cc".into(),
        ..CompilerConfig::from_env().with_cache_dir(&dir)
    };
    let compiler = Compiler::new(config);
    for err in [
        compiler.compiler_version().unwrap_err(),
        compiler.compile(SCALE2).unwrap_err(),
    ] {
        let ErrorKind::Backend(message) = &err.kind else {
            panic!("expected a backend error, got {err}");
        };
        assert!(message.contains("/nonexistent/cc"), "{message}");
        assert!(message.contains("FUSEBOX_CC"), "{message}");
    }
    assert_eq!(compiler.stats(), CompileStats::default());
    assert!(listing(&dir).is_empty());
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn kernel_names_are_checked() {
    let dir = temp_dir("names");
    let module = compiler(&dir).compile(&scale2_source("names")).unwrap();
    for bad in ["", "scale2; rm", "2scale", "scale2\0"] {
        let err = module.kernel(bad).unwrap_err();
        assert!(err.to_string().contains("not a C identifier"), "{err}");
    }
    let err = module.kernel("no_such_kernel").unwrap_err();
    assert!(err.to_string().contains("no_such_kernel"), "{err}");
    assert!(module.kernel("scale2").is_ok());
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn one_compiler_shared_by_threads_compiles_once() {
    let dir = temp_dir("shared");
    let compiler = Arc::new(compiler(&dir));
    let source = Arc::new(scale2_source("shared"));
    let barrier = Arc::new(Barrier::new(4));
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let (compiler, source, barrier) = (compiler.clone(), source.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                let module = compiler.compile(&source).unwrap();
                check_scale2(&module);
                module
            })
        })
        .collect();
    let modules: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert!(modules.iter().all(|m| Arc::ptr_eq(m, &modules[0])));
    assert_eq!(
        compiler.stats(),
        CompileStats {
            compiled: 1,
            memory_hits: 3,
            ..CompileStats::default()
        }
    );
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn separate_compilers_in_threads_share_one_fresh_dir() {
    let dir = temp_dir("threads");
    let source = Arc::new(scale2_source("threads"));
    let barrier = Arc::new(Barrier::new(6));
    let handles: Vec<_> = (0..6)
        .map(|_| {
            let (dir, source, barrier) = (dir.clone(), source.clone(), barrier.clone());
            std::thread::spawn(move || {
                let compiler = compiler(&dir);
                compiler.key(&source).unwrap(); // ask for the version before the race
                barrier.wait();
                let module = compiler.compile(&source).unwrap();
                check_scale2(&module);
                (module.key().to_string(), compiler.stats())
            })
        })
        .collect();
    let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let key = &results[0].0;
    for (k, stats) in &results {
        assert_eq!(k, key);
        // Each either built the entry or found a complete one; none found a damaged one.
        assert_eq!(stats.compiled + stats.disk_hits, 1, "{stats:?}");
        assert_eq!(stats.rebuilt_corrupt, 0, "{stats:?}");
    }
    assert_entry_consistent(&dir, key, &source);
    assert_eq!(listing(&dir), entry_names(key));
    fs::remove_dir_all(&dir).unwrap();
}

const CHILD_DIR_VAR: &str = "FUSEBOX_TEST_CPU_COMPILER_CHILD_DIR";
const CHILD_TEST: &str = "child_process_compiles_into_shared_dir";

/// One of the processes of `separate_processes_share_one_fresh_dir` (which runs this test
/// binary again, selecting this test): compiles into the directory it is given and reports.
#[test]
#[ignore = "run as a child process by separate_processes_share_one_fresh_dir"]
fn child_process_compiles_into_shared_dir() {
    let Some(dir) = std::env::var_os(CHILD_DIR_VAR) else {
        eprintln!("{CHILD_TEST} only does something as a child process; skipped");
        return;
    };
    let compiler = compiler(Path::new(&dir));
    let module = compiler.compile(&scale2_source("processes")).unwrap();
    check_scale2(&module);
    let stats = compiler.stats();
    println!(
        "CHILD key={} compiled={} disk_hits={} rebuilt_corrupt={}",
        module.key(),
        stats.compiled,
        stats.disk_hits,
        stats.rebuilt_corrupt
    );
}

#[test]
fn separate_processes_share_one_fresh_dir() {
    let dir = temp_dir("processes");
    let exe = std::env::current_exe().unwrap();
    // libtest names a test by its module path inside the test binary (this file is a module
    // of a suite), which `--exact` must match.
    let child_test = module_path!()
        .split_once("::")
        .map_or(CHILD_TEST.to_string(), |(_, module)| {
            format!("{module}::{CHILD_TEST}")
        });
    let children: Vec<_> = (0..4)
        .map(|_| {
            Command::new(&exe)
                .args(["--ignored", "--exact", &child_test, "--nocapture"])
                .args(["--test-threads", "1"])
                .env(CHILD_DIR_VAR, &dir)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let source = scale2_source("processes");
    let key = compiler(&dir).key(&source).unwrap();
    for child in children {
        let output = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "child failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let report = stdout
            .lines()
            .find_map(|l| l.split_once("CHILD ").map(|(_, report)| report))
            .unwrap_or_else(|| panic!("no report from the child:\n{stdout}"));
        let field = |name: &str| -> String {
            report
                .split(' ')
                .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
                .unwrap()
                .to_string()
        };
        assert_eq!(field("key"), key);
        let built: usize = field("compiled").parse().unwrap();
        let found: usize = field("disk_hits").parse().unwrap();
        assert_eq!(built + found, 1, "{report}");
        assert_eq!(field("rebuilt_corrupt"), "0", "{report}");
    }
    assert_entry_consistent(&dir, &key, &source);
    assert_eq!(listing(&dir), entry_names(&key));
    let parent = compiler(&dir);
    check_scale2(&parent.compile(&source).unwrap());
    assert_eq!(parent.stats().disk_hits, 1);
    fs::remove_dir_all(&dir).unwrap();
}

// ---------------------------------------------------------------------------------------------
// The precompiled header.

/// A C compiler that logs each command line (one line per run, `--version` included) to
/// `<dir>/cc.log` and then runs `cc`, or fails any run with `-include` when `refuse_header`.
fn logging_compiler(dir: &Path, refuse_header: bool) -> (Compiler, PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let log = dir.join("cc.log");
    let script = dir.join("logging-cc");
    let refuse = if refuse_header {
        "case \" $* \" in *\" -include \"*) echo 'no precompiled headers here' >&2; exit 1;; esac\n"
    } else {
        ""
    };
    let cc = std::env::var("FUSEBOX_CC")
        .ok()
        .filter(|cc| !cc.is_empty())
        .unwrap_or_else(|| "cc".to_string());
    fs::write(
        &script,
        format!(
            "#!/bin/sh\nprintf '%s\\n' \"$*\" >> '{}'\n{refuse}exec {cc} \"$@\"\n",
            log.display()
        ),
    )
    .unwrap();
    fs::set_permissions(&script, fs::Permissions::from_mode(0o755)).unwrap();
    let cache = dir.join("cache");
    let config = CompilerConfig {
        cc: script.display().to_string(),
        ..CompilerConfig::from_env().with_cache_dir(&cache)
    };
    (Compiler::new(config), log)
}

/// The compiler's runs since the last call, `--version` queries left out.
fn runs(log: &Path) -> Vec<String> {
    let text = fs::read_to_string(log).unwrap_or_default();
    fs::write(log, "").unwrap();
    text.lines()
        .filter(|l| *l != "--version")
        .map(String::from)
        .collect()
}

/// A kernel source including the same system headers as a generated one.
fn with_system_headers(tag: &str) -> String {
    format!("/* {tag} */\n{PRECOMPILED_HEADER}{SCALE2}")
}

#[test]
fn the_precompiled_header_is_built_after_the_first_kernel_and_read_from_then_on() {
    let dir = temp_dir("header");
    let (compiler, log) = logging_compiler(&dir, false);
    let cache = dir.join("cache");
    let header_key = compiler.key(PRECOMPILED_HEADER).unwrap();
    let header = cache.join(format!("{header_key}.h"));
    let include = format!("-include {}", header.display());

    // The first kernel builds without: a process compiling one kernel never pays for it.
    check_scale2(&compiler.compile(&with_system_headers("header-1")).unwrap());
    let first = runs(&log);
    assert_eq!(first.len(), 1, "{first:?}");
    assert!(!first[0].contains("-include"), "{first:?}");
    assert!(!header.exists());

    // The second builds it (once, from exactly PRECOMPILED_HEADER) and reads it.
    let second_source = with_system_headers("header-2");
    let second = compiler.compile(&second_source).unwrap();
    check_scale2(&second);
    let built = runs(&log);
    assert_eq!(built.len(), 2, "{built:?}");
    assert!(built[0].contains("-x c-header"), "{built:?}");
    assert!(built[1].contains(&include), "{built:?}");
    assert_eq!(fs::read_to_string(&header).unwrap(), PRECOMPILED_HEADER);
    let gch = fs::read(cache.join(format!("{header_key}.h.gch"))).unwrap();
    let digest = fs::read_to_string(cache.join(format!("{header_key}.sha256"))).unwrap();
    assert_eq!(digest.trim(), sha256_hex(&gch));
    check_scale2(&compiler.compile(&with_system_headers("header-3")).unwrap());
    assert_eq!(runs(&log).len(), 1);
    assert_eq!(compiler.stats().compiled, 3, "the header is not a kernel");

    // Another compiler on the same directory reads it from its first build on.
    let (other, _) = logging_compiler(&dir, false);
    check_scale2(&other.compile(&with_system_headers("header-4")).unwrap());
    let later = runs(&log);
    assert_eq!(later.len(), 1, "{later:?}");
    assert!(later[0].contains(&include), "{later:?}");

    // The header changes nothing in what is built: byte for byte the library a compiler
    // without it builds from the same source.
    let fresh_dir = temp_dir("header-fresh");
    let (fresh, fresh_log) = logging_compiler(&fresh_dir, false);
    let rebuilt = fresh.compile(&second_source).unwrap();
    assert!(!runs(&fresh_log)[0].contains("-include"));
    assert_eq!(
        fs::read(rebuilt.path()).unwrap(),
        fs::read(second.path()).unwrap()
    );
    fs::remove_dir_all(&dir).unwrap();
    fs::remove_dir_all(&fresh_dir).unwrap();
}

#[test]
fn a_compiler_that_fails_with_the_header_builds_every_kernel_without_it() {
    let dir = temp_dir("no-header");
    let (compiler, log) = logging_compiler(&dir, true);
    for tag in ["no-header-1", "no-header-2", "no-header-3"] {
        check_scale2(&compiler.compile(&with_system_headers(tag)).unwrap());
    }
    let all = runs(&log);
    let with_header = all.iter().filter(|l| l.contains("-include")).count();
    // The first kernel without, the header built before the second, the second tried with
    // it and again without, the third without.
    assert_eq!(all.len(), 5, "{all:?}");
    assert_eq!(with_header, 1, "{all:?}");
    assert!(!all[4].contains("-include"), "{all:?}");
    assert_eq!(compiler.stats().compiled, 3);
    fs::remove_dir_all(&dir).unwrap();
}

/// A compiler program still open for writing when fusebox starts it (a wrapper a build step
/// is finishing, or one written while another thread was starting a child) is run once it is
/// closed, not reported missing: here the test holds the wrapper open for 30 ms.
#[test]
fn a_compiler_still_being_written_is_run_once_it_is_closed() {
    let dir = temp_dir("busy-cc");
    let (compiler, log) = logging_compiler(&dir, false);
    let held = fs::OpenOptions::new()
        .append(true)
        .open(dir.join("logging-cc"))
        .unwrap();
    let closer = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(30));
        drop(held);
    });
    check_scale2(&compiler.compile(&with_system_headers("busy-cc")).unwrap());
    closer.join().unwrap();
    assert!(!runs(&log).is_empty());
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_damaged_precompiled_header_is_rebuilt() {
    let dir = temp_dir("damaged-header");
    let (compiler, log) = logging_compiler(&dir, false);
    for tag in ["damaged-header-1", "damaged-header-2"] {
        compiler.compile(&with_system_headers(tag)).unwrap();
    }
    let header_key = compiler.key(PRECOMPILED_HEADER).unwrap();
    let gch = dir.join("cache").join(format!("{header_key}.h.gch"));
    replace(&gch, b"not a precompiled header");
    runs(&log);
    let (other, _) = logging_compiler(&dir, false);
    check_scale2(
        &other
            .compile(&with_system_headers("damaged-header-3"))
            .unwrap(),
    );
    let rebuilt = runs(&log);
    assert_eq!(rebuilt.len(), 2, "{rebuilt:?}");
    assert!(rebuilt[0].contains("-x c-header") && rebuilt[1].contains("-include"));
    assert_ne!(fs::read(&gch).unwrap(), b"not a precompiled header");
    fs::remove_dir_all(&dir).unwrap();
}
