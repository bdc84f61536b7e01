//! Errors of configuration loading and validation, and of reading run records.

use std::path::PathBuf;

/// Result alias of `mtrl-core`.
pub type Result<T> = std::result::Result<T, CoreError>;

/// Everything that can go wrong while reading or validating a configuration.
#[derive(Debug, thiserror::Error)]
pub enum CoreError {
    /// The config file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The TOML is malformed, or a key is unknown or has the wrong type (toml names line and key).
    #[error("invalid config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    /// A key parsed but its value is not acceptable.
    #[error("invalid value for `{key}` in {path}: {message}")]
    Invalid {
        path: PathBuf,
        key: String,
        message: String,
    },
    /// A command needs a section the config does not have.
    #[error("config file {path} has no [{section}] section, which this command needs")]
    MissingSection { path: PathBuf, section: String },
    /// A run-record file (metrics, SFT records) could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A line of a run-record file is malformed or of another format version.
    #[error("{path}:{line}: {message}")]
    Record {
        path: PathBuf,
        line: usize,
        message: String,
    },
}
