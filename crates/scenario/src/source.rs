//! Reading a scenario file with bounds.
//!
//! A scenario is text a person writes; anything beyond [`MAX_SOURCE`] bytes is a mistake
//! (`/dev/zero`, a binary, a log), and reading it whole would only end when memory does.

use std::io::Read;

/// The largest scenario file read, in bytes (64 MiB).
pub const MAX_SOURCE: u64 = 64 << 20;

/// Why a scenario file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The file could not be opened or read.
    #[error("{path}: cannot read: {source}")]
    Io {
        /// The path as given (`-` is standard input).
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// Longer than [`MAX_SOURCE`].
    #[error("{path}: longer than {} MiB; not a scenario", MAX_SOURCE >> 20)]
    TooLarge {
        /// The path as given.
        path: String,
    },
    /// Not UTF-8 text.
    #[error("{path}: not UTF-8 text (byte offset {offset})")]
    NotText {
        /// The path as given.
        path: String,
        /// Where the first invalid byte is.
        offset: usize,
    },
}

/// Reads the scenario at `path` (`-`: standard input), refusing more than [`MAX_SOURCE`]
/// bytes and anything that is not UTF-8.
///
/// # Errors
/// [`SourceError`], naming the path.
pub fn read_source(path: &str) -> Result<String, SourceError> {
    let io = |source| SourceError::Io {
        path: path.to_owned(),
        source,
    };
    let mut bytes = Vec::new();
    let limit = MAX_SOURCE + 1;
    if path == "-" {
        std::io::stdin()
            .lock()
            .take(limit)
            .read_to_end(&mut bytes)
            .map_err(io)?;
    } else {
        std::fs::File::open(path)
            .map_err(io)?
            .take(limit)
            .read_to_end(&mut bytes)
            .map_err(io)?;
    }
    if bytes.len() as u64 > MAX_SOURCE {
        return Err(SourceError::TooLarge {
            path: path.to_owned(),
        });
    }
    String::from_utf8(bytes).map_err(|e| SourceError::NotText {
        path: path.to_owned(),
        offset: e.utf8_error().valid_up_to(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dev_zero_is_refused_after_the_limit() {
        if !std::path::Path::new("/dev/zero").exists() {
            return;
        }
        assert!(matches!(
            read_source("/dev/zero"),
            Err(SourceError::TooLarge { .. })
        ));
    }

    #[test]
    fn a_missing_file_names_its_path() {
        let e = read_source("/nonexistent/usermm.scn").unwrap_err();
        assert!(e
            .to_string()
            .starts_with("/nonexistent/usermm.scn: cannot read"));
    }
}
