//! Reading one RON document with errors that name the file, line and column.

use crate::error::{Error, ErrorKind, Result, Site};
use crate::span::{Position, SpanIndex, Step};
use serde::de::DeserializeOwned;

/// A parsed RON document together with the index that locates its values.
pub struct RonDocument<T> {
    pub value: T,
    pub file: String,
    pub spans: SpanIndex,
}

impl<T> RonDocument<T> {
    /// The file position of the value at `path` (or of its nearest existing ancestor).
    pub fn site(&self, path: &[Step]) -> Site {
        Site::file(&self.file, self.spans.nearest(path))
    }

    /// The file position of a character inside the string value at `path`.
    pub fn site_in_string(&self, path: &[Step], char_offset: usize) -> Site {
        let position = self
            .spans
            .string_char_position(path, char_offset)
            .unwrap_or_else(|| self.spans.nearest(path));
        Site::file(&self.file, position)
    }
}

/// Parses `text` as RON into `T`. `Option` fields may be written without `Some(...)`.
pub fn parse<T: DeserializeOwned>(text: &str, file: &str) -> Result<RonDocument<T>> {
    parse_with(text, file, ron::extensions::Extensions::IMPLICIT_SOME)
}

/// Like [`parse`], and an enum variant holding a struct may be written `Op(name: …)` rather
/// than `Op((name: …))`: how `ops.ron` writes its two kinds of entry.
pub fn parse_with_variant_newtypes<T: DeserializeOwned>(
    text: &str,
    file: &str,
) -> Result<RonDocument<T>> {
    use ron::extensions::Extensions;
    parse_with(
        text,
        file,
        Extensions::IMPLICIT_SOME | Extensions::UNWRAP_VARIANT_NEWTYPES,
    )
}

fn parse_with<T: DeserializeOwned>(
    text: &str,
    file: &str,
    extensions: ron::extensions::Extensions,
) -> Result<RonDocument<T>> {
    let options = ron::Options::default().with_default_extension(extensions);
    match options.from_str::<T>(text) {
        Ok(value) => {
            let spans = SpanIndex::scan(text);
            if let Some((key, position)) = spans.duplicate_map_key() {
                return Err(Error::new(
                    Site::file(file, position),
                    ErrorKind::Syntax(format!(
                        "key `{key}` appears twice in one map; write each key once"
                    )),
                ));
            }
            Ok(RonDocument {
                value,
                file: file.to_string(),
                spans,
            })
        }
        Err(e) => {
            // ron reports 1-based positions; an error at the very end may report column 0 on
            // an empty line, which we clamp so every position is a real 1-based place.
            let position = Position {
                line: e.span.start.line.max(1),
                column: e.span.start.col.max(1),
            };
            Err(Error::new(
                Site::file(file, position),
                ErrorKind::Syntax(e.code.to_string()),
            ))
        }
    }
}

/// Reads a RON file of `kind` (a graph or a rule file) to a string, mapping I/O failures to a
/// located error. The file must be a regular file within the kind's size limit
/// ([`crate::file_limits`]): a FIFO or a link to a device is refused, not read forever.
pub fn read_file(path: &std::path::Path, kind: crate::file_limits::FileKind) -> Result<String> {
    crate::file_limits::read_text(path, kind).map_err(|message| {
        Error::new(
            Site::whole_file(&path.display().to_string()),
            ErrorKind::Io {
                path: path.display().to_string(),
                message: message.to_string(),
            },
        )
    })
}
