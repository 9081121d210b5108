//! How fusebox opens every file it reads: graph files, rule files, `.npy` values, ONNX models
//! and their external data.
//!
//! Each of these files may come from someone else, and a path is only a name: a FIFO there
//! would block a plain `open` or `read` forever, a symbolic link to `/dev/zero` would be read
//! until memory runs out, and a directory or a device is not data at all. So every reader goes
//! through [`open`] (or [`read`] / [`read_text`], built on it), which
//!
//! 1. opens without blocking (`O_NONBLOCK`: opening a FIFO returns at once instead of waiting
//!    for a writer; `O_NOCTTY`: a terminal never becomes the controlling one),
//! 2. asks the *open handle* what it is (`fstat`), so nothing can be swapped in between the
//!    check and the read, and refuses anything but a regular file,
//! 3. refuses a file larger than its kind's limit ([`FileKind::limit`]), and
//! 4. hands out a reader that stops after that limit, so a file that grows while it is read is
//!    still read only so far.
//!
//! Errors ([`FileError`]) say what is wrong with the file ("it is a FIFO, not a regular
//! file") without naming it; each caller puts the path in front in its own style.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// What a file is read as; each kind has its own size limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    /// A RON graph file.
    Graph,
    /// A rule file: `ops.ron`, `fusion.ron`, …, or a `rewrites/*.ron` file.
    Rules,
    /// A `.npy` value: a stored value (`value: "w.npy"`) or an `--input` file.
    Npy,
    /// An ONNX model (`.onnx`).
    OnnxModel,
    /// A file of an ONNX model's external data.
    OnnxExternal,
}

/// Why a file cannot be read as its kind.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// Opening, inspecting or reading it failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// A directory, a FIFO, a device, a socket: `what` it is.
    #[error("it is {what}, not a regular file")]
    NotRegular { what: &'static str },
    #[error("{}", too_big(.size, .kind))]
    TooBig { size: u64, kind: FileKind },
    /// The room to read it (at most its kind's limit) was refused.
    #[error("cannot allocate {size} bytes to read it")]
    Alloc { size: u64 },
    #[error("it grew while it was read, past the {} {} may be", human(.kind.limit()), .kind.noun())]
    Grew { kind: FileKind },
    /// Read as text, it is not UTF-8: the first bad byte is at `offset`.
    #[error("it is not UTF-8 text (an invalid byte at offset {offset})")]
    NotUtf8 { offset: usize },
}

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// The most bytes a graph file may hold. A graph file holds names and shapes, not values (they
/// are `.npy` files beside it), so even a model of hundreds of thousands of nodes takes a few
/// tens of MiB.
pub const MAX_GRAPH_FILE: u64 = 256 * MIB;

/// The most bytes one rule file may hold; the largest default rule file is 34 KB.
pub const MAX_RULE_FILE: u64 = 16 * MIB;

/// The most bytes a `.npy` file may hold: the largest value the reference evaluator and the
/// CPU backend can hold ([`crate::eval::MAX_ELEMENTS`] elements of 8 bytes, 16 GiB), plus the
/// largest header the reader accepts (64 KiB) and its preamble, rounded up to 128 KiB.
pub const MAX_NPY_FILE: u64 = NPY_ELEMENTS * 8 + 128 * 1024;

/// [`crate::eval::MAX_ELEMENTS`], written again here because this module sits below the
/// evaluator in the layering (the tensor reader uses it); `tests/limits.rs` keeps the two
/// equal.
const NPY_ELEMENTS: u64 = 1 << 31;

/// The most bytes an ONNX model may hold: 2 GiB, protobuf's own limit for one message (larger
/// models keep their weights in external data files).
pub const MAX_ONNX_MODEL: u64 = 2 * GIB;

/// The most bytes an external data file may hold. One file may carry every weight of a model,
/// so this is generous; what is *read* from it is one tensor at a time, each at most
/// [`crate::onnx::proto::MAX_ELEMENTS`] elements.
pub const MAX_ONNX_EXTERNAL: u64 = 256 * GIB;

impl FileKind {
    /// The most bytes a file of this kind may hold.
    pub const fn limit(self) -> u64 {
        match self {
            FileKind::Graph => MAX_GRAPH_FILE,
            FileKind::Rules => MAX_RULE_FILE,
            FileKind::Npy => MAX_NPY_FILE,
            FileKind::OnnxModel => MAX_ONNX_MODEL,
            FileKind::OnnxExternal => MAX_ONNX_EXTERNAL,
        }
    }

    /// The kind, as a message names it ("more than the 16 MiB a rule file may be").
    pub const fn noun(self) -> &'static str {
        match self {
            FileKind::Graph => "a graph file",
            FileKind::Rules => "a rule file",
            FileKind::Npy => "a .npy file",
            FileKind::OnnxModel => "an ONNX model",
            FileKind::OnnxExternal => "an ONNX external data file",
        }
    }
}

/// A regular file open for reading, with its size when it was opened (at most its kind's
/// limit). [`Read`] on it stops after that limit.
pub struct Opened {
    reader: std::io::Take<File>,
    /// The file's size as `fstat` gave it on the open handle.
    pub size: u64,
}

impl Opened {
    /// The file itself, for seeking (external data reads a range of it). Reads through it are
    /// not bounded by the limit: bound them by what is needed.
    pub fn file_mut(&mut self) -> &mut File {
        self.reader.get_mut()
    }
}

impl Read for Opened {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.reader.read(buf)
    }
}

/// Opens `path` as a `kind`: a regular file of at most `kind.limit()` bytes, checked on the
/// open handle, without blocking on a FIFO.
pub fn open(path: &Path, kind: FileKind) -> Result<Opened, FileError> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)?;
    let meta = file.metadata()?;
    let file_type = meta.file_type();
    if !file_type.is_file() {
        let what = if file_type.is_dir() {
            "a directory"
        } else if file_type.is_fifo() {
            "a FIFO"
        } else if file_type.is_char_device() {
            "a character device"
        } else if file_type.is_block_device() {
            "a block device"
        } else if file_type.is_socket() {
            "a socket"
        } else {
            "not a file"
        };
        return Err(FileError::NotRegular { what });
    }
    let size = meta.len();
    let limit = kind.limit();
    if size > limit {
        return Err(FileError::TooBig { size, kind });
    }
    Ok(Opened {
        // One byte past the limit, so that a file that grew past it is seen to have.
        reader: file.take(limit + 1),
        size,
    })
}

/// The whole of `path` as a `kind` (see [`open`]).
pub fn read(path: &Path, kind: FileKind) -> Result<Vec<u8>, FileError> {
    let mut opened = open(path, kind)?;
    let mut bytes = Vec::new();
    // The size is bounded by the limit, but even that much memory may be refused: an error,
    // not an abort.
    let room = usize::try_from(opened.size).unwrap_or(usize::MAX);
    bytes
        .try_reserve_exact(room)
        .map_err(|_| FileError::Alloc { size: opened.size })?;
    opened.read_to_end(&mut bytes)?;
    if bytes.len() as u64 > kind.limit() {
        return Err(FileError::Grew { kind });
    }
    Ok(bytes)
}

/// [`read`], as UTF-8 text.
pub fn read_text(path: &Path, kind: FileKind) -> Result<String, FileError> {
    String::from_utf8(read(path, kind)?).map_err(|e| FileError::NotUtf8 {
        offset: e.utf8_error().valid_up_to(),
    })
}

/// The refusal of a file of `size` bytes, more than `kind` may be ([`FileError::TooBig`]'s
/// message; by reference, as the error's fields are).
fn too_big(size: &u64, kind: &FileKind) -> String {
    format!(
        "it is {size} bytes ({}), more than the {} {} may be",
        human(*size),
        human(kind.limit()),
        kind.noun()
    )
}

/// `n` bytes in binary units, exact when it is a whole number of them ("16 MiB"), else with
/// one decimal ("3.2 GiB").
pub fn human(n: u64) -> String {
    let units = [
        (1u64 << 40, "TiB"),
        (GIB, "GiB"),
        (MIB, "MiB"),
        (1 << 10, "KiB"),
    ];
    for (size, unit) in units {
        if n >= size {
            return if n.is_multiple_of(size) {
                format!("{} {unit}", n / size)
            } else {
                format!("{:.1} {unit}", n as f64 / size as f64)
            };
        }
    }
    format!("{n} bytes")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> std::path::PathBuf {
        let dir =
            std::env::temp_dir().join(format!("fusebox-file-limits-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_fifo_is_refused_without_blocking() {
        let dir = dir("fifo");
        let fifo = dir.join("f.ron");
        let name = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: `name` is a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0);
        let err = read(&fifo, FileKind::Rules).unwrap_err().to_string();
        assert_eq!(err, "it is a FIFO, not a regular file");
    }

    #[test]
    fn devices_and_directories_are_refused() {
        let dir = dir("kinds");
        std::os::unix::fs::symlink("/dev/zero", dir.join("zero")).unwrap();
        assert_eq!(
            read(&dir.join("zero"), FileKind::Npy)
                .unwrap_err()
                .to_string(),
            "it is a character device, not a regular file"
        );
        assert_eq!(
            read(&dir, FileKind::Graph).unwrap_err().to_string(),
            "it is a directory, not a regular file"
        );
    }

    #[test]
    fn a_file_over_its_kinds_limit_is_refused_before_reading() {
        let dir = dir("big");
        let path = dir.join("ops.ron");
        let file = File::create(&path).unwrap();
        // Sparse: no disk and no time.
        file.set_len(MAX_RULE_FILE + 1).unwrap();
        assert_eq!(
            read(&path, FileKind::Rules).unwrap_err().to_string(),
            "it is 16777217 bytes (16.0 MiB), more than the 16 MiB a rule file may be"
        );
        file.set_len(MAX_RULE_FILE).unwrap();
        assert_eq!(
            read(&path, FileKind::Rules).unwrap().len() as u64,
            MAX_RULE_FILE
        );
    }

    #[test]
    fn sizes_read_in_binary_units() {
        assert_eq!(human(16 * GIB + 128 * 1024), "16.0 GiB");
        assert_eq!(human(2 * GIB), "2 GiB");
        assert_eq!(human(1000), "1000 bytes");
    }
}
