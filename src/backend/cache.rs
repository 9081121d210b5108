//! The kernel cache both compilers share: in memory for the life of a compiler, and on disk,
//! content-addressed, across processes.
//!
//! The CPU compiler caches shared libraries built by `cc`, the CUDA one PTX built by NVRTC;
//! everything about keeping those files safe is the same and lives here, in
//! [`KernelCache::get_or_build`]. Each caller computes its own key (a hex SHA-256 of everything
//! that can change the artifact), builds artifacts, and says how to load one. The helpers both
//! compilers report with (their errors, compiler logs cut to a readable size) live here too.
//!
//! # The disk layout
//!
//! An entry is named by its key. Because everything that can change the artifact is in the
//! key, an entry never goes stale and is never rewritten with other contents; a changed source,
//! compiler or option simply names another entry. In the cache directory:
//!
//! - `<key>.<artifact>` (`.so`, `.ptx`): what was built;
//! - `<key>.sha256`: the hex SHA-256 of the artifact's bytes;
//! - `<key>.<source>` (`.c`, `.cu`): the source it was built from, kept so that a user can read
//!   exactly what ran (and find it when a build fails);
//! - any other `<key>.*` file the build left beside the artifact (NVRTC's log).
//!
//! # Why readers never see half an entry
//!
//! Several threads or processes may build the same entry at once, and a process may die half
//! way through writing one. A writer therefore builds in a private temporary directory inside
//! the cache directory (same file system, so renames are atomic), writes the digest there, and
//! renames the source and companions, then the digest, and last the artifact into place.
//! Readers only ever look at `<key>.<artifact>`: once it exists, its digest already does.
//! Before using an entry a reader hashes the artifact and compares it with the digest; a
//! mismatch, a missing digest, or an artifact the caller's loader rejects means the entry was
//! damaged (a crash from an older layout, a full disk, a stray edit), and it is rebuilt and
//! counted in [`CompileStats::rebuilt_corrupt`]. A damaged entry is replaced by renaming a
//! fresh build over it, never unlinked first, so a reader cannot delete the valid copy a
//! concurrent writer has just renamed in.

use crate::error::{Error, Result};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

/// What a compiler has done since it was created.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CompileStats {
    /// Times the compiler ran successfully (rebuilds of damaged entries included).
    pub compiled: usize,
    /// Artifacts loaded from a valid disk cache entry.
    pub disk_hits: usize,
    /// Requests answered from the compiler's memory.
    pub memory_hits: usize,
    /// Damaged disk entries (digest mismatch or missing, or rejected by the loader) rebuilt.
    pub rebuilt_corrupt: usize,
}

impl CompileStats {
    /// Both counts together (two builds' counters added).
    pub fn plus(&self, other: &CompileStats) -> CompileStats {
        CompileStats {
            compiled: self.compiled + other.compiled,
            disk_hits: self.disk_hits + other.disk_hits,
            memory_hits: self.memory_hits + other.memory_hits,
            rebuilt_corrupt: self.rebuilt_corrupt + other.rebuilt_corrupt,
        }
    }

    /// What happened between `earlier` and `self` (two readings of one compiler's counters).
    pub fn since(&self, earlier: &CompileStats) -> CompileStats {
        CompileStats {
            compiled: self.compiled - earlier.compiled,
            disk_hits: self.disk_hits - earlier.disk_hits,
            memory_hits: self.memory_hits - earlier.memory_hits,
            rebuilt_corrupt: self.rebuilt_corrupt - earlier.rebuilt_corrupt,
        }
    }
}

/// The value of environment variable `name`, with an empty value counting as unset.
pub fn env_nonempty(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// `$XDG_CACHE_HOME/fusebox/<name>`, else `$HOME/.cache/fusebox/<name>`, else
/// `<temp dir>/fusebox-cache/<name>`: where fusebox keeps what it builds or downloads when no
/// variable names a place.
pub fn user_cache_dir(name: &str) -> PathBuf {
    let base = env_nonempty("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| env_nonempty("HOME").map(|home| Path::new(&home).join(".cache")));
    match base {
        Some(base) => base.join("fusebox").join(name),
        None => std::env::temp_dir().join("fusebox-cache").join(name),
    }
}

/// Lowercase hex, two digits per byte (the form of every key and digest).
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(2 * bytes.len());
    for b in bytes {
        let _ = write!(out, "{b:02x}");
    }
    out
}

/// The hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// A poisoned lock only means another thread panicked while holding it; the data (counters,
/// a map of finished artifacts) is still consistent, so keep going.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// At most this many lines of compiler diagnostics go into an error message: the first errors
/// are the useful ones, and a runaway cascade should not bury them.
const MAX_DIAGNOSTIC_LINES: usize = 40;
/// At most this many bytes of compiler diagnostics go into an error message.
const MAX_DIAGNOSTIC_BYTES: usize = 6000;

/// The first lines of compiler output, cut to a readable size.
pub(crate) fn trim_diagnostics(text: &str) -> String {
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

pub(crate) fn io_error(what: &str, path: &Path, e: io::Error) -> Error {
    Error::backend(format!("{what} {}: {e}", path.display()))
}

/// One in-memory slot. Each key has its own lock so that one thread builds a given source
/// while others wait for it, and distinct sources still build in parallel.
type Slot<T> = Arc<Mutex<Option<Arc<T>>>>;

/// Artifacts of type `T` (a loaded library, a PTX module) by key, in memory and on disk.
///
/// `KernelCache` is `Send + Sync` when `T` is. Separate caches (in one process or many) may
/// share a directory safely.
pub struct KernelCache<T> {
    dir: PathBuf,
    /// File extension of the artifact (`so`, `ptx`) and of the kept source (`c`, `cu`).
    artifact: &'static str,
    source: &'static str,
    memory: Mutex<HashMap<String, Slot<T>>>,
    stats: Mutex<CompileStats>,
}

/// Loads an artifact from its file and bytes; `Err` says why it cannot be used.
pub type Loader<'a, T> = &'a dyn Fn(&Path, Vec<u8>) -> Loaded<T>;

/// What a [`Loader`] gives. The reason is a string because it is only ever shown: a cached
/// entry that fails to load is rebuilt whatever the reason, and a fresh build's reason goes
/// into the backend error's message.
pub type Loaded<T> = std::result::Result<T, String>;

impl<T> KernelCache<T> {
    /// An empty cache over `dir` (created on the first build).
    pub fn new(dir: PathBuf, artifact: &'static str, source: &'static str) -> KernelCache<T> {
        KernelCache {
            dir,
            artifact,
            source,
            memory: Mutex::new(HashMap::new()),
            stats: Mutex::new(CompileStats::default()),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Counters since creation.
    pub fn stats(&self) -> CompileStats {
        *lock(&self.stats)
    }

    /// Where the artifact of `key` is (or would be) stored.
    pub fn artifact_path(&self, key: &str) -> PathBuf {
        self.dir.join(format!("{key}.{}", self.artifact))
    }

    /// Where the source of `key` is (or would be) kept.
    pub fn source_path(&self, key: &str) -> PathBuf {
        self.dir.join(format!("{key}.{}", self.source))
    }

    /// The artifact of `key`: from memory, else from a valid disk entry (through `load`),
    /// else built by `build` and published.
    ///
    /// `build` gets a [`Staging`] directory already holding `source` under
    /// [`Staging::source_name`]; it must leave the artifact there under
    /// [`Staging::artifact_name`] (and may leave `<key>.*` companions). `load` turns a
    /// verified file into a `T`, or says why it cannot; on a cached entry that counts as
    /// damage (and the entry is rebuilt), on a fresh build it is an error.
    pub fn get_or_build(
        &self,
        key: &str,
        source: &str,
        load: Loader<'_, T>,
        build: impl FnOnce(&Staging) -> Result<()>,
    ) -> Result<Arc<T>> {
        let slot = lock(&self.memory)
            .entry(key.to_string())
            .or_default()
            .clone();
        let mut loaded = lock(&slot);
        if let Some(value) = loaded.as_ref() {
            lock(&self.stats).memory_hits += 1;
            return Ok(value.clone());
        }
        let value = Arc::new(self.load_or_build(key, source, load, build)?);
        *loaded = Some(value.clone());
        Ok(value)
    }

    fn load_or_build(
        &self,
        key: &str,
        source: &str,
        load: Loader<'_, T>,
        build: impl FnOnce(&Staging) -> Result<()>,
    ) -> Result<T> {
        let path = self.artifact_path(key);
        let damaged = match self.read_verified(key) {
            Cached::Valid(bytes) => match load(&path, bytes) {
                Ok(value) => {
                    lock(&self.stats).disk_hits += 1;
                    // The source is documentation only; restore it if someone removed it.
                    let kept = self.source_path(key);
                    if !kept.exists() {
                        let _ = write_atomically(&self.dir, &kept, source.as_bytes());
                    }
                    return Ok(value);
                }
                Err(_) => true,
            },
            Cached::Missing => false,
            Cached::Damaged => true,
        };
        let value = self.build(key, source, load, build)?;
        let mut stats = lock(&self.stats);
        stats.compiled += 1;
        if damaged {
            stats.rebuilt_corrupt += 1;
        }
        Ok(value)
    }

    /// The artifact's bytes if they are present and match their recorded digest.
    fn read_verified(&self, key: &str) -> Cached {
        let bytes = match read_regular(&self.artifact_path(key)) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Cached::Missing,
            Err(_) => return Cached::Damaged,
        };
        // `<key>.sha256`, as `build` names it (not the artifact's name with its last
        // extension replaced: an artifact extension may have two parts, like `h.gch`).
        let Ok(recorded) = read_regular(&self.dir.join(format!("{key}.sha256"))) else {
            return Cached::Damaged;
        };
        let Ok(recorded) = String::from_utf8(recorded) else {
            return Cached::Damaged;
        };
        if recorded.trim().eq_ignore_ascii_case(&sha256_hex(&bytes)) {
            Cached::Valid(bytes)
        } else {
            Cached::Damaged
        }
    }

    /// Builds in a fresh staging directory and publishes the entry (see the module docs for
    /// the order of renames and why).
    fn build(
        &self,
        key: &str,
        source: &str,
        load: Loader<'_, T>,
        build: impl FnOnce(&Staging) -> Result<()>,
    ) -> Result<T> {
        fs::create_dir_all(&self.dir).map_err(|e| {
            Error::write(
                self.dir.display(),
                format!(
                    "cannot create the kernel cache directory: {e} (set FUSEBOX_CACHE_DIR to a writable directory)"
                ),
            )
        })?;
        sweep_abandoned_staging(&self.dir);
        let staging = Staging {
            temp: create_temp_dir(&self.dir)?,
            source_name: format!("{key}.{}", self.source),
            artifact_name: format!("{key}.{}", self.artifact),
            kept_source: self.source_path(key),
        };
        let staged_source = staging.temp.join(&staging.source_name);
        fs::write(&staged_source, source).map_err(|e| Error::write(staged_source.display(), e))?;
        build(&staging)?;

        let built = staging.temp.join(&staging.artifact_name);
        let bytes = fs::read(&built).map_err(|e| {
            io_error(
                "the compiler reported success but its output cannot be read",
                &built,
                e,
            )
        })?;
        let digest_name = format!("{key}.sha256");
        let digest = staging.temp.join(&digest_name);
        fs::write(&digest, sha256_hex(&bytes)).map_err(|e| Error::write(digest.display(), e))?;
        // Source and companions, then digest, then artifact: whoever sees the artifact finds
        // its digest too.
        let mut companions = staged_names(&staging.temp)?;
        companions.retain(|n| *n != digest_name && *n != staging.artifact_name);
        companions.sort();
        for name in companions
            .iter()
            .chain([&digest_name, &staging.artifact_name])
        {
            let (from, to) = (staging.temp.join(name), self.dir.join(name));
            fs::rename(&from, &to).map_err(|e| {
                Error::backend(format!(
                    "cannot move {} to {}: {e}",
                    from.display(),
                    to.display()
                ))
            })?;
        }
        let path = self.artifact_path(key);
        load(&path, bytes).map_err(|e| {
            Error::backend(format!(
                "the freshly built {} cannot be loaded: {e} (source: {})",
                path.display(),
                staging.kept_source.display()
            ))
        })
    }
}

/// What the disk holds for one key, before the caller's loader has looked at it.
enum Cached {
    Valid(Vec<u8>),
    Missing,
    Damaged,
}

/// A private build directory inside the cache directory, removed on drop (after its files
/// were renamed out, or after a failure).
pub struct Staging {
    temp: PathBuf,
    source_name: String,
    artifact_name: String,
    kept_source: PathBuf,
}

impl Staging {
    /// The directory to build in.
    pub fn path(&self) -> &Path {
        &self.temp
    }

    /// The source file's name inside [`Staging::path`] (`<key>.c`): compilers run there on
    /// this relative name, so no temporary path ends up in what they build.
    pub fn source_name(&self) -> &str {
        &self.source_name
    }

    /// The name the build must give its artifact inside [`Staging::path`].
    pub fn artifact_name(&self) -> &str {
        &self.artifact_name
    }

    /// Moves the staged source to its place in the cache directory, so that the error
    /// message of a failed build can name a file the user can open. Returns that place, and
    /// whether the move worked.
    pub fn keep_source(&self) -> (&Path, bool) {
        let kept = fs::rename(self.temp.join(&self.source_name), &self.kept_source).is_ok();
        (&self.kept_source, kept)
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.temp);
    }
}

/// Distinguishes temporary names of one process; with the pid and the clock it makes them
/// unique across processes too.
static TEMP_COUNTER: AtomicUsize = AtomicUsize::new(0);

fn temp_name(suffix: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!(
        ".tmp-{}-{}-{nanos}{suffix}",
        std::process::id(),
        TEMP_COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// Reads `path` only if it is a regular file (after following links). Anything else in place of
/// a cache entry is damage: a FIFO would block the read forever, a device could be endless.
fn read_regular(path: &Path) -> io::Result<Vec<u8>> {
    if !fs::metadata(path)?.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "not a regular file",
        ));
    }
    fs::read(path)
}

/// How old a staging entry must be before it is removed even though its process may live:
/// no compile takes this long, and a process id can be reused.
const ABANDONED_AFTER: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// Removes the staging directories and `.part` files (`.tmp-PID-…`) that builds killed midway
/// left in the cache directory: those of processes that no longer run, and any older than
/// [`ABANDONED_AFTER`]. A live process's staging is never touched while it is young, so
/// concurrent builds by other processes are safe. Failures are ignored: sweeping is tidying.
fn sweep_abandoned_staging(dir: &Path) {
    let owner = |name: &str, _: &fs::FileType| {
        name.strip_prefix(".tmp-")
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
    };
    sweep_staging(dir, owner, Some(ABANDONED_AFTER));
}

/// Removes the entries of `dir` that `owner` recognises as staging (it returns the id of the
/// process that made the entry, from its name and type) and whose process no longer runs, or
/// that are older than `abandoned_after` when one is given. The entry's type is read without
/// following links, and a link is never followed: a link with a staging name is removed as a
/// link, and removing a directory does not follow the links inside it. This process's own
/// staging is never removed. Failures are ignored: sweeping is tidying.
///
/// Shared by the kernel cache and the files commands write (`run --out`, `import`, `grad`),
/// whose staging a killed process leaves behind just the same.
pub(crate) fn sweep_staging(
    dir: &Path,
    owner: impl Fn(&str, &fs::FileType) -> Option<u32>,
    abandoned_after: Option<std::time::Duration>,
) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| owner(n, &kind)) else {
            continue;
        };
        if pid == std::process::id() {
            continue;
        }
        let old = abandoned_after.is_some_and(|limit| {
            entry
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age > limit)
        });
        if !process_runs(pid) || old {
            let path = entry.path();
            let _ = if kind.is_dir() {
                fs::remove_dir_all(&path)
            } else {
                fs::remove_file(&path)
            };
        }
    }
}

/// Whether process `pid` may run: `kill(pid, 0)` says no (`ESRCH`) only for an id no process
/// has; a process of another user answers `EPERM`, and runs. An id beyond `i32` is no process;
/// 0 would address a process group, so it counts as running. Elsewhere than Unix every process
/// is assumed to run (so only age sweeps).
pub(crate) fn process_runs(pid: u32) -> bool {
    #[cfg(unix)]
    {
        let Ok(id) = i32::try_from(pid) else {
            return false;
        };
        if id == 0 {
            return true;
        }
        // SAFETY: signal 0 sends nothing; it only asks whether `id` names a process.
        let answer = unsafe { libc::kill(id, 0) };
        answer == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
    }
    #[cfg(not(unix))]
    {
        let _ = pid;
        true
    }
}

fn create_temp_dir(dir: &Path) -> Result<PathBuf> {
    let path = dir.join(temp_name(""));
    fs::create_dir(&path).map_err(|e| io_error("cannot create a build directory", &path, e))?;
    Ok(path)
}

/// Names of the plain files in `dir`.
fn staged_names(dir: &Path) -> Result<Vec<String>> {
    let entries = fs::read_dir(dir).map_err(|e| io_error("cannot list", dir, e))?;
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| io_error("cannot list", dir, e))?;
        if entry.file_type().is_ok_and(|t| t.is_file())
            && let Ok(name) = entry.file_name().into_string()
        {
            names.push(name);
        }
    }
    Ok(names)
}

/// Writes `path` through a temporary file and a rename, so no reader sees it half written.
pub(crate) fn write_atomically(dir: &Path, path: &Path, bytes: &[u8]) -> io::Result<()> {
    let temp = dir.join(temp_name(".part"));
    fs::write(&temp, bytes)?;
    fs::rename(&temp, path).inspect_err(|_| {
        let _ = fs::remove_file(&temp);
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "fusebox-cache-unit-{}-{tag}-{}",
            std::process::id(),
            temp_name("")
        ));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    /// A "compiler" that upper-cases its source; loading reads the text back.
    fn upper(staging: &Staging) -> Result<()> {
        let text = fs::read_to_string(staging.path().join(staging.source_name()))
            .map_err(|e| Error::backend(e.to_string()))?;
        fs::write(
            staging.path().join(staging.artifact_name()),
            text.to_uppercase(),
        )
        .map_err(|e| Error::backend(e.to_string()))
    }

    fn text(_: &Path, bytes: Vec<u8>) -> Loaded<String> {
        String::from_utf8(bytes).map_err(|e| e.to_string())
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut n: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        n.sort();
        n
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
    fn a_fifo_in_place_of_an_entry_is_rebuilt_not_waited_on() {
        let dir = scratch("fifo");
        fs::create_dir_all(&dir).unwrap();
        let made = std::process::Command::new("mkfifo")
            .arg(dir.join("k1.out"))
            .status();
        if !made.is_ok_and(|s| s.success()) {
            eprintln!("skipped: mkfifo is not available");
            return;
        }
        let (done, result) = std::sync::mpsc::channel();
        let cache_dir = dir.clone();
        std::thread::spawn(move || {
            let cache = KernelCache::<String>::new(cache_dir, "out", "in");
            let built = cache
                .get_or_build("k1", "abc", &text, upper)
                .map(|v| (*v).clone());
            let _ = done.send((built, cache.stats()));
        });
        let (built, stats) = result
            .recv_timeout(std::time::Duration::from_secs(60))
            .expect("reading the cache entry blocked on a FIFO");
        assert_eq!(built.unwrap(), "ABC");
        assert_eq!(stats.rebuilt_corrupt, 1);
        assert!(fs::metadata(dir.join("k1.out")).unwrap().is_file());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn staging_left_by_dead_processes_is_swept_and_live_staging_kept() {
        let dir = scratch("sweep");
        fs::create_dir_all(&dir).unwrap();
        // Linux process ids stay below 2^22, so this one never runs.
        let dead = dir.join(".tmp-999999999-0-1");
        fs::create_dir(&dead).unwrap();
        fs::write(dead.join("k9.in"), "half a build").unwrap();
        fs::write(dir.join(".tmp-999999999-1-2.part"), "half a file").unwrap();
        let live = dir.join(format!(".tmp-{}-77-3", std::process::id()));
        fs::create_dir(&live).unwrap();
        let cache = KernelCache::<String>::new(dir.clone(), "out", "in");
        cache.get_or_build("k1", "abc", &text, upper).unwrap();
        let left = names(&dir);
        assert!(
            !left.iter().any(|n| n.starts_with(".tmp-999999999")),
            "{left:?}"
        );
        assert!(live.exists(), "a running process's staging was removed");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn builds_publishes_and_reuses() {
        let dir = scratch("reuse");
        let cache = KernelCache::<String>::new(dir.clone(), "out", "in");
        let built = cache.get_or_build("k1", "abc", &text, upper).unwrap();
        assert_eq!(*built, "ABC");
        let again = cache
            .get_or_build("k1", "abc", &text, |_| panic!("no rebuild"))
            .unwrap();
        assert!(Arc::ptr_eq(&built, &again));
        assert_eq!(names(&dir), ["k1.in", "k1.out", "k1.sha256"]);
        assert_eq!(
            fs::read_to_string(dir.join("k1.sha256")).unwrap(),
            sha256_hex(b"ABC")
        );

        let fresh = KernelCache::<String>::new(dir.clone(), "out", "in");
        let from_disk = fresh
            .get_or_build("k1", "abc", &text, |_| panic!("no rebuild"))
            .unwrap();
        assert_eq!(*from_disk, "ABC");
        assert_eq!(
            fresh.stats(),
            CompileStats {
                disk_hits: 1,
                ..CompileStats::default()
            }
        );
        assert_eq!(
            cache.stats(),
            CompileStats {
                compiled: 1,
                memory_hits: 1,
                ..CompileStats::default()
            }
        );
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn companions_are_published_and_damage_is_rebuilt() {
        let dir = scratch("damage");
        let with_log = |s: &Staging| {
            upper(s)?;
            fs::write(s.path().join("k2.log"), "note").map_err(|e| Error::backend(e.to_string()))
        };
        let cache = KernelCache::<String>::new(dir.clone(), "out", "in");
        cache.get_or_build("k2", "xy", &text, with_log).unwrap();
        assert_eq!(names(&dir), ["k2.in", "k2.log", "k2.out", "k2.sha256"]);

        fs::write(dir.join("k2.out"), "XZ").unwrap();
        let rebuilding = KernelCache::<String>::new(dir.clone(), "out", "in");
        assert_eq!(
            *rebuilding.get_or_build("k2", "xy", &text, upper).unwrap(),
            "XY"
        );
        assert_eq!(
            rebuilding.stats(),
            CompileStats {
                compiled: 1,
                rebuilt_corrupt: 1,
                ..CompileStats::default()
            }
        );

        // A valid digest but a loader that refuses the bytes also counts as damage.
        let picky = KernelCache::<String>::new(dir.clone(), "out", "in");
        let refuse_once = std::cell::Cell::new(true);
        let load = |p: &Path, b: Vec<u8>| {
            if refuse_once.replace(false) {
                Err("no".to_string())
            } else {
                text(p, b)
            }
        };
        picky.get_or_build("k2", "xy", &load, upper).unwrap();
        assert_eq!(picky.stats().rebuilt_corrupt, 1);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn failed_build_keeps_the_source_and_nothing_else() {
        let dir = scratch("fail");
        let cache = KernelCache::<String>::new(dir.clone(), "out", "in");
        let err = cache
            .get_or_build("k3", "bad", &text, |s| {
                let (kept, moved) = s.keep_source();
                assert!(moved);
                Err(Error::backend(format!("broken, see {}", kept.display())))
            })
            .unwrap_err();
        assert!(err.to_string().contains("k3.in"), "{err}");
        assert_eq!(names(&dir), ["k3.in"]);
        assert_eq!(cache.stats(), CompileStats::default());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn stats_difference() {
        let a = CompileStats {
            compiled: 3,
            disk_hits: 2,
            memory_hits: 5,
            rebuilt_corrupt: 1,
        };
        let b = CompileStats {
            compiled: 1,
            disk_hits: 2,
            memory_hits: 1,
            rebuilt_corrupt: 0,
        };
        assert_eq!(
            a.since(&b),
            CompileStats {
                compiled: 2,
                disk_hits: 0,
                memory_hits: 4,
                rebuilt_corrupt: 1
            }
        );
    }
}
