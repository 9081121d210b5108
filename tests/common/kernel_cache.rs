//! One C compiler for a whole test binary.
//!
//! The test files of a suite compile many of the same kernels (softmax and layernorm rows,
//! concat segments, the examples): with one compiler and one cache directory they compile each
//! once, where a compiler per file compiled them once per file. Tests that count what gets
//! compiled keep compilers of their own, since this one's counters move with every test.

use fusebox::backend::cpu::compiler::{Compiler, CompilerConfig};
use std::sync::OnceLock;

/// The suite's compiler, caching under `CARGO_TARGET_TMPDIR`.
pub fn compiler() -> &'static Compiler {
    static COMPILER: OnceLock<Compiler> = OnceLock::new();
    COMPILER.get_or_init(|| {
        let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("cpu-kernel-cache");
        Compiler::new(CompilerConfig::from_env().with_cache_dir(dir))
    })
}
