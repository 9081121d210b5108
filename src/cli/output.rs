//! Files the command writes: `run --out DIR` outputs and `optimize --emit … --out FILE`.
//!
//! Graph files are untrusted, and output names come from them, so a name never becomes a path
//! by itself: [`file_name`] turns it into one plain file name inside the output directory. And a
//! run writes all of its outputs or none: [`write_all_or_none`] stages every file in a
//! temporary directory inside DIR (the same file system, so renames are atomic) and moves them
//! into place only once all were written, restoring what it replaced if a move fails.

use sha2::{Digest, Sha256};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// The longest name, in bytes, that is used as it is (or percent-encoded) before `.npy`;
/// longer ones are cut and get a hash suffix. File systems allow 255 bytes per name, and the
/// suffix and extension must still fit.
pub const MAX_PLAIN: usize = 200;

/// The file name (not a path) of output `name` inside `--out DIR`.
///
/// A plain name (not empty, not `.` or `..`, at most [`MAX_PLAIN`] bytes, no `/`, `\`, `%`, NUL
/// or other control characters) maps to `NAME.npy`. Otherwise each of those bytes is written
/// as `%XX` (uppercase hex of its UTF-8 bytes; `.` and `..` become `%2E` and `%2E%2E`, the
/// empty name `%`), and a result longer than [`MAX_PLAIN`] bytes keeps its first
/// [`MAX_PLAIN`] bytes followed by `~` and the first 16 hex digits of the SHA-256 of the name.
/// Encoding `%` itself keeps the mapping one-to-one, and a hashed stem is longer than any
/// unhashed one, so two names can only meet on a hash collision (which
/// [`check_distinct`] still reports).
pub fn file_name(name: &str) -> String {
    let stem = match name {
        "" => "%".to_string(),
        "." => "%2E".to_string(),
        ".." => "%2E%2E".to_string(),
        _ => {
            let mut stem = String::with_capacity(name.len());
            for c in name.chars() {
                if is_unsafe(c) {
                    let mut bytes = [0; 4];
                    for b in c.encode_utf8(&mut bytes).bytes() {
                        stem.push_str(&format!("%{b:02X}"));
                    }
                } else {
                    stem.push(c);
                }
            }
            stem
        }
    };
    if stem.len() <= MAX_PLAIN {
        return format!("{stem}.npy");
    }
    let mut cut = MAX_PLAIN;
    while !stem.is_char_boundary(cut) {
        cut -= 1;
    }
    // Never split a `%XX` escape: a dangling `%` or `%X` would read as a different escape.
    let head = &stem[..cut];
    let head = match head.rfind('%') {
        Some(i) if head.len() - i < 3 => &head[..i],
        _ => head,
    };
    let digest = Sha256::digest(name.as_bytes());
    let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    format!("{head}~{hex}.npy")
}

fn is_unsafe(c: char) -> bool {
    matches!(c, '/' | '\\' | '%') || c.is_control()
}

/// Two names (of outputs, of weights: `noun`) whose files would be one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameClash {
    #[error("{noun} `{first}` and `{second}` would both be written to {file}")]
    SameFile {
        noun: String,
        first: String,
        second: String,
        file: String,
    },
    /// Two files whose names differ only in letter case.
    #[error(
        "{noun} `{first}` and `{second}` would be written to {first_file} and {second_file}, which are one file on case-insensitive file systems (macOS, Windows); rename one of them"
    )]
    SameFileFolded {
        noun: String,
        first: String,
        second: String,
        first_file: String,
        second_file: String,
    },
}

/// The file names of `names`, or an error naming two of them that would share one file;
/// `noun` says what the names are in that message (`outputs`, `weights`).
///
/// Two names whose files differ only in letter case (`A.npy`, `a.npy`) are refused too: they
/// are two files on Linux but one on the case-insensitive file systems macOS and Windows use by
/// default, where the second would silently replace the first. Refusing everywhere keeps a
/// graph's outputs the same on every machine.
pub fn check_distinct(names: &[String], noun: &str) -> Result<Vec<String>, NameClash> {
    let mut seen = std::collections::HashMap::new();
    let mut folded = std::collections::HashMap::new();
    let mut files = Vec::with_capacity(names.len());
    for name in names {
        let file = file_name(name);
        if let Some(other) = seen.insert(file.clone(), name) {
            if other != name {
                return Err(NameClash::SameFile {
                    noun: noun.to_string(),
                    first: other.clone(),
                    second: name.clone(),
                    file,
                });
            }
        } else if let Some((other, other_file)) =
            folded.insert(file.to_lowercase(), (name, file.clone()))
        {
            return Err(NameClash::SameFileFolded {
                noun: noun.to_string(),
                first: other.clone(),
                second: name.clone(),
                first_file: other_file,
                second_file: file,
            });
        }
        files.push(file);
    }
    Ok(files)
}

/// The names of `dir`'s entries, in lower case (empty if it cannot be listed): what a new file
/// must not be named, on a file system that folds case or not.
pub fn existing_names(dir: &Path) -> std::collections::HashSet<String> {
    fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().to_lowercase())
                .collect()
        })
        .unwrap_or_default()
}

/// A file name for the value of `name` that is in neither `existing` nor `taken` (both in
/// lower case, so that no two differ only in case): [`file_name`]'s, or when that is in use
/// the same stem with `~2`, `~3`, … before `.npy`. The name chosen is added to `taken`.
///
/// This is how a copied stored value never replaces a file: not one already in the
/// directory (another input's stored value, the user's data), nor one another file of the
/// same write will have.
pub fn free_name(
    name: &str,
    existing: &std::collections::HashSet<String>,
    taken: &mut std::collections::HashSet<String>,
) -> String {
    free_or_same_name(name, existing, taken, &|_: &str| false).0
}

/// [`free_name`], except that an existing file for which `same` says it already holds the
/// value may be chosen too (the second result is then `true`: nothing needs writing), so that
/// writing the same values again into a directory does not pile up copies.
pub fn free_or_same_name(
    name: &str,
    existing: &std::collections::HashSet<String>,
    taken: &mut std::collections::HashSet<String>,
    same: &dyn Fn(&str) -> bool,
) -> (String, bool) {
    let plain = file_name(name);
    let stem = plain.strip_suffix(".npy").unwrap_or(&plain).to_string();
    let mut candidate = plain;
    let mut k = 2u64;
    loop {
        let folded = candidate.to_lowercase();
        if !taken.contains(&folded) {
            if !existing.contains(&folded) {
                taken.insert(folded);
                return (candidate, false);
            }
            if same(&candidate) {
                taken.insert(folded);
                return (candidate, true);
            }
        }
        candidate = format!("{stem}~{k}.npy");
        k += 1;
    }
}

/// Removes a staging directory or temporary file when dropped, whatever happened.
struct Cleanup(PathBuf);

impl Drop for Cleanup {
    fn drop(&mut self) {
        if self.0.is_dir() {
            let _ = fs::remove_dir_all(&self.0);
        } else {
            let _ = fs::remove_file(&self.0);
        }
    }
}

/// The prefix of a staging directory's name: `.fusebox-staging-PID-N`.
const STAGING_PREFIX: &str = ".fusebox-staging-";
/// What names a temporary file of [`write_atomically`]: `.BASE.fusebox-tmp-PID-N`.
const TEMP_MARK: &str = ".fusebox-tmp-";

/// `PID-N` with both numbers written as fusebox writes them (decimal, no sign, no leading
/// zero): the process id, or `None` for anything else.
fn pid_and_counter(text: &str) -> Option<u32> {
    let (pid, n) = text.split_once('-')?;
    let canonical = |s: &str| {
        !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) && (s == "0" || !s.starts_with('0'))
    };
    if !canonical(pid) || !canonical(n) || n.parse::<u32>().is_err() {
        return None;
    }
    pid.parse().ok()
}

/// The process that made entry `name` of type `kind`, if it is exactly what an interrupted
/// write leaves: a staging directory of [`write_all_or_none`] or a temporary file of
/// [`write_atomically`]. A link, or a name that only looks similar, is nobody's staging.
fn staging_owner(name: &str, kind: &fs::FileType) -> Option<u32> {
    if kind.is_dir() {
        return pid_and_counter(name.strip_prefix(STAGING_PREFIX)?);
    }
    if kind.is_file() && name.starts_with('.') {
        let (_, tail) = name.rsplit_once(TEMP_MARK)?;
        return pid_and_counter(tail);
    }
    None
}

/// Removes what writes killed midway (by a signal, a power cut) left in `dir`: the staging
/// directories and temporary files of processes that no longer run. A running process's are
/// kept however old (its write may be under way), and nothing else is touched; see
/// [`crate::backend::cache::sweep_staging`], which the kernel cache uses alike.
pub fn sweep_dead_staging(dir: &Path) {
    crate::backend::cache::sweep_staging(dir, staging_owner, None);
}

/// A fresh directory `DIR/.fusebox-staging-PID-N`; `create_dir` fails on an existing name, so
/// no other process's (or earlier run's leftover) directory is reused. Staging that dead
/// processes left in `dir` is swept first.
fn staging_dir(dir: &Path) -> io::Result<PathBuf> {
    sweep_dead_staging(dir);
    let pid = std::process::id();
    for n in 0..1000 {
        let path = dir.join(format!(".fusebox-staging-{pid}-{n}"));
        match fs::create_dir(&path) {
            Ok(()) => return Ok(path),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::new(
        io::ErrorKind::AlreadyExists,
        "no free staging directory name",
    ))
}

/// Why writing the outputs failed: the file (final path) concerned and the message.
pub struct WriteError {
    pub path: PathBuf,
    pub message: String,
}

/// Writes each `(file name, writer)` into `dir` so that either all files are in place
/// afterwards or none was touched: every file is first written into a staging directory in
/// `dir`; only then is each renamed over its final name, after a hard link (or copy) of the
/// file it replaces is kept, so that a failing rename can put every earlier one back. The
/// staging directory is removed in every case.
pub fn write_all_or_none<W, E>(dir: &Path, files: &[(String, W)]) -> Result<(), WriteError>
where
    W: Fn(&Path) -> Result<(), E>,
    E: std::fmt::Display,
{
    write_all_or_none_with(dir, files, &|_: &str| false)
}

/// [`write_all_or_none`], where the files `must_be_new` names may replace nothing: each is
/// linked into place (which fails on an existing name, so a file that appears meanwhile is
/// not replaced either), and one whose name is taken fails the whole write.
pub fn write_all_or_none_with<W, E>(
    dir: &Path,
    files: &[(String, W)],
    must_be_new: &dyn Fn(&str) -> bool,
) -> Result<(), WriteError>
where
    W: Fn(&Path) -> Result<(), E>,
    E: std::fmt::Display,
{
    let fail = |path: &Path, message: String| WriteError {
        path: path.to_path_buf(),
        message,
    };
    let staging = staging_dir(dir).map_err(|e| fail(dir, format!("cannot stage outputs: {e}")))?;
    let _cleanup = Cleanup(staging.clone());
    for (name, write) in files {
        write(&staging.join(name)).map_err(|e| fail(&dir.join(name), e.to_string()))?;
    }
    // A directory (or anything but a file or link) where an output goes would make its
    // rename fail half way, and a new file must find its name free: refuse before anything
    // moves.
    for (name, _) in files {
        let target = dir.join(name);
        if let Ok(meta) = fs::symlink_metadata(&target) {
            if meta.is_dir() {
                return Err(fail(&target, "a directory is in the way".into()));
            }
            if must_be_new(name) {
                return Err(fail(&target, "the file exists already".into()));
            }
        }
    }
    let backups = staging.join(".replaced");
    fs::create_dir(&backups).map_err(|e| fail(dir, format!("cannot stage outputs: {e}")))?;
    // For each file moved into place: the kept copy of what it replaced, if anything.
    let mut moved: Vec<(PathBuf, Option<PathBuf>)> = Vec::new();
    let result = (|| {
        for (i, (name, _)) in files.iter().enumerate() {
            let target = dir.join(name);
            if must_be_new(name) {
                place_new(&staging.join(name), &target)
                    .map_err(|e| fail(&target, e.to_string()))?;
                moved.push((target, None));
                continue;
            }
            let backup = match fs::symlink_metadata(&target) {
                Ok(_) => {
                    let backup = backups.join(i.to_string());
                    fs::hard_link(&target, &backup)
                        .or_else(|_| fs::copy(&target, &backup).map(|_| ()))
                        .map_err(|e| fail(&target, format!("cannot keep the old file: {e}")))?;
                    Some(backup)
                }
                Err(_) => None,
            };
            fs::rename(staging.join(name), &target).map_err(|e| fail(&target, e.to_string()))?;
            moved.push((target, backup));
        }
        Ok(())
    })();
    if result.is_err() {
        for (target, backup) in moved.into_iter().rev() {
            let _ = match backup {
                Some(backup) => fs::rename(backup, &target),
                None => fs::remove_file(&target),
            };
        }
    }
    result
}

/// Moves `staged` to `target` only if no file is named `target`: a hard link is made (it fails
/// on an existing name, atomically), then the staged name removed. Where the file system has no
/// hard links, the name is checked and the file renamed.
fn place_new(staged: &Path, target: &Path) -> io::Result<()> {
    let exists = || io::Error::new(io::ErrorKind::AlreadyExists, "the file exists already");
    match fs::hard_link(staged, target) {
        Ok(()) => {
            let _ = fs::remove_file(staged);
            Ok(())
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Err(exists()),
        Err(_) if fs::symlink_metadata(target).is_ok() => Err(exists()),
        Err(_) => fs::rename(staged, target),
    }
}

/// Writes `text` to `path` through a temporary file in the same directory and a rename, so
/// `path` holds either its old contents or all of the new ones, never a part.
pub fn write_atomically(path: &Path, text: &str) -> io::Result<()> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let base = path
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    sweep_dead_staging(&dir);
    let pid = std::process::id();
    for n in 0..1000 {
        let temp = dir.join(format!(".{base}{TEMP_MARK}{pid}-{n}"));
        let file = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&temp);
        let mut file = match file {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        };
        let cleanup = Cleanup(temp.clone());
        io::Write::write_all(&mut file, text.as_bytes())?;
        drop(file);
        fs::rename(&temp, path)?;
        std::mem::forget(cleanup);
        return Ok(());
    }
    Err(io::Error::new(
        io::ErrorKind::AlreadyExists,
        "no free temporary file name",
    ))
}

/// Whether `a` and `b` name one existing file (the same device and inode, however each path
/// is spelled or linked).
pub fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (fs::metadata(a), fs::metadata(b)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_names_are_kept_and_others_encoded_inside_the_directory() {
        assert_eq!(file_name("y"), "y.npy");
        assert_eq!(file_name("onnx::Tanh_21"), "onnx::Tanh_21.npy");
        assert_eq!(file_name("23"), "23.npy");
        assert_eq!(file_name("../../escaped"), "..%2F..%2Fescaped.npy");
        assert_eq!(file_name("/tmp/x/abs"), "%2Ftmp%2Fx%2Fabs.npy");
        assert_eq!(file_name(".."), "%2E%2E.npy");
        assert_eq!(file_name("."), "%2E.npy");
        assert_eq!(file_name(""), "%.npy");
        assert_eq!(file_name("a\\b%c\u{1b}"), "a%5Cb%25c%1B.npy");
        assert_eq!(file_name("\u{85}"), "%C2%85.npy");
    }

    #[test]
    fn long_names_are_cut_with_a_hash_and_stay_distinct() {
        let a = "x".repeat(70_000);
        let b = format!("{}y", "x".repeat(69_999));
        let (fa, fb) = (file_name(&a), file_name(&b));
        assert_ne!(fa, fb);
        assert!(fa.len() <= 255 && fb.len() <= 255, "{}", fa.len());
        assert!(fa.starts_with(&"x".repeat(MAX_PLAIN)));
        assert_eq!(file_name(&"é".repeat(150)).len(), 200 + 1 + 16 + 4);
        let slashes = file_name(&"/".repeat(100));
        assert!(!slashes.contains('/'));
        assert!(slashes.split('~').next().unwrap().ends_with("%2F"));
        assert_eq!(
            file_name(&"a".repeat(MAX_PLAIN)),
            format!("{}.npy", "a".repeat(200))
        );
    }

    #[test]
    fn the_same_file_twice_is_an_error() {
        let names = vec!["a".to_string(), "b".to_string()];
        assert_eq!(
            check_distinct(&names, "outputs").unwrap(),
            ["a.npy", "b.npy"]
        );
        let names = vec!["a".to_string(), "a".to_string()];
        assert!(check_distinct(&names, "outputs").is_ok());
    }

    /// `A` and `a` are one file on macOS and Windows: refused on every system alike.
    #[test]
    fn names_differing_only_in_case_are_refused() {
        let names = vec!["Gate".to_string(), "x".to_string(), "gate".to_string()];
        let e = check_distinct(&names, "outputs").unwrap_err();
        assert_eq!(
            e.to_string(),
            "outputs `Gate` and `gate` would be written to Gate.npy and gate.npy, which are one file on case-insensitive file systems (macOS, Windows); rename one of them"
        );
        let names = vec!["É".to_string(), "é".to_string()];
        assert!(check_distinct(&names, "weights").is_err());
    }

    /// A copy's name avoids every existing and taken name, whatever its case.
    #[test]
    fn free_names_avoid_existing_and_taken_names_without_case() {
        let existing: std::collections::HashSet<String> =
            ["w.npy", "w~2.npy"].map(String::from).into();
        let mut taken: std::collections::HashSet<String> = ["joint.ron".to_string()].into();
        assert_eq!(free_name("W", &existing, &mut taken), "W~3.npy");
        assert_eq!(free_name("w", &existing, &mut taken), "w~4.npy");
        assert_eq!(free_name("v", &existing, &mut taken), "v.npy");
        assert_eq!(
            free_name("joint.ron", &existing, &mut taken),
            "joint.ron.npy"
        );
    }

    /// Only fusebox's exact staging names are recognised, and only as the kind it makes.
    #[test]
    fn staging_names_are_recognised_exactly() {
        let dir = scratch("staging-names");
        fs::create_dir(dir.join("d")).unwrap();
        fs::write(dir.join("f"), "").unwrap();
        let dir_kind = fs::symlink_metadata(dir.join("d")).unwrap().file_type();
        let file_kind = fs::symlink_metadata(dir.join("f")).unwrap().file_type();
        assert_eq!(staging_owner(".fusebox-staging-42-0", &dir_kind), Some(42));
        assert_eq!(staging_owner(".fusebox-staging-42-0", &file_kind), None);
        assert_eq!(
            staging_owner(".x.ron.fusebox-tmp-42-3", &file_kind),
            Some(42)
        );
        assert_eq!(staging_owner(".x.ron.fusebox-tmp-42-3", &dir_kind), None);
        for other in [
            ".fusebox-staging-042-0",
            ".fusebox-staging-42-x",
            ".fusebox-staging-42",
            "fusebox-staging-42-0",
            ".fusebox-staging--42-0",
        ] {
            assert_eq!(staging_owner(other, &dir_kind), None, "{other}");
        }
    }

    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("fusebox-output-unit-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn entries(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
            .collect();
        names.sort();
        names
    }

    type Writer = Box<dyn Fn(&Path) -> io::Result<()>>;

    fn writes(files: &[(&str, Option<&'static str>)]) -> Vec<(String, Writer)> {
        files
            .iter()
            .map(|&(name, text)| {
                let write: Writer = Box::new(move |path: &Path| match text {
                    Some(t) => fs::write(path, t),
                    None => Err(io::Error::other("disk full")),
                });
                (name.to_string(), write)
            })
            .collect()
    }

    #[test]
    fn a_failed_write_leaves_every_old_file_and_no_staging() {
        let dir = scratch("write-fails");
        fs::write(dir.join("a.npy"), "old a").unwrap();
        let e = write_all_or_none(&dir, &writes(&[("a.npy", Some("new a")), ("b.npy", None)]))
            .err()
            .unwrap();
        assert_eq!(e.path, dir.join("b.npy"));
        assert_eq!(fs::read_to_string(dir.join("a.npy")).unwrap(), "old a");
        assert_eq!(entries(&dir), ["a.npy"]);
    }

    #[test]
    fn a_failed_rename_puts_back_what_earlier_renames_replaced() {
        let dir = scratch("rename-fails");
        fs::write(dir.join("a.npy"), "old a").unwrap();
        // The second writer reports success without writing: its rename is what fails, after
        // the first file was already moved into place and new `c.npy` was created.
        let missing: Writer = Box::new(|_: &Path| Ok(()));
        let mut files = writes(&[("a.npy", Some("new a")), ("c.npy", Some("new c"))]);
        files.push(("b.npy".into(), missing));
        let e = write_all_or_none(&dir, &files).err().unwrap();
        assert_eq!(e.path, dir.join("b.npy"));
        assert_eq!(fs::read_to_string(dir.join("a.npy")).unwrap(), "old a");
        assert_eq!(entries(&dir), ["a.npy"]);
        write_all_or_none(
            &dir,
            &writes(&[("a.npy", Some("new a")), ("b.npy", Some("b"))]),
        )
        .ok()
        .unwrap();
        assert_eq!(fs::read_to_string(dir.join("a.npy")).unwrap(), "new a");
        assert_eq!(entries(&dir), ["a.npy", "b.npy"]);
    }

    #[test]
    fn an_atomic_write_leaves_no_temporary_file() {
        let dir = scratch("atomic-file");
        let path = dir.join("x.c");
        write_atomically(&path, "one").unwrap();
        write_atomically(&path, "two").unwrap();
        assert_eq!(fs::read_to_string(&path).unwrap(), "two");
        fs::create_dir(dir.join("d")).unwrap();
        assert!(write_atomically(&dir.join("d"), "three").is_err());
        assert_eq!(entries(&dir), ["d", "x.c"]);
    }
}
