//! The folder a `.gguf` model path stands for: its small files, written once beside it, stamped.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use super::Gguf;
use crate::error::{ModelError, Result};

/// Whether `path` names a GGUF file (by extension).
pub fn is_gguf(path: &Path) -> bool {
    path.extension().and_then(|e| e.to_str()) == Some("gguf")
}

/// Whether `path` can name a model: a folder, or a `.gguf` file.
pub fn is_model_path(path: &Path) -> bool {
    path.is_dir() || (is_gguf(path) && path.is_file())
}

const STAMP: &str = "mtrl-gguf-source.json";

/// Part of the stamp: bump it whenever the converter's output changes, so every cached folder is
/// converted again.
const CONVERTER_VERSION: u32 = 1;

/// The checkpoint folder for `path`: `path` itself unless it is a `.gguf` file, whose small files
/// (`config.json`, `generation_config.json`, `tokenizer.json`, `tokenizer_config.json`) are
/// written into `<stem>.mtrl/` beside it on first use and reused while the source's size and
/// modification time match the stamp there. The weights are not written: [`crate::Policy::load`]
/// dequantises them from the `.gguf` itself at each load (faster than reading them back in f32,
/// and no second copy of the model on disk).
pub fn checkpoint_dir(path: &Path) -> Result<PathBuf> {
    if !is_gguf(path) || !path.is_file() {
        return Ok(path.to_path_buf());
    }
    let meta = std::fs::metadata(path).map_err(|e| ModelError::io(path, e))?;
    let mtime = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos());
    let stamp = json!({"source": path.file_name().map(|f| f.to_string_lossy()), "len": meta.len(),
                       "mtime_ns": mtime.to_string(), "converter": CONVERTER_VERSION});
    let stem = path
        .file_stem()
        .map_or("model".into(), |s| s.to_string_lossy());
    let dir = path.with_file_name(format!("{stem}.mtrl"));
    let fresh = || {
        std::fs::read_to_string(dir.join(STAMP))
            .ok()
            .and_then(|t| serde_json::from_str::<Value>(&t).ok())
            .as_ref()
            == Some(&stamp)
    };
    if fresh() {
        return Ok(dir);
    }
    // One process converts; the others (MPI ranks, parallel tests) wait for its stamp.
    let lock = path.with_file_name(format!("{stem}.mtrl.lock"));
    let started = std::time::Instant::now();
    loop {
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&lock)
        {
            Ok(_) => break,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                if fresh() {
                    return Ok(dir);
                }
                let age = std::fs::metadata(&lock)
                    .and_then(|m| m.modified())
                    .ok()
                    .and_then(|t| t.elapsed().ok());
                if age.is_some_and(|a| a > std::time::Duration::from_secs(1800)) {
                    let _ = std::fs::remove_file(&lock); // left by a killed process
                } else if started.elapsed() > std::time::Duration::from_secs(3600) {
                    return Err(ModelError::checkpoint(
                        &lock,
                        "another process has been converting this GGUF for an hour; remove the \
                         lock file if none is",
                    ));
                }
                std::thread::sleep(std::time::Duration::from_millis(200));
            }
            Err(e) => return Err(ModelError::io(&lock, e)),
        }
    }
    let result = (|| {
        if fresh() {
            return Ok(());
        }
        let tmp = path.with_file_name(format!("{stem}.mtrl.tmp-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        Gguf::open(path)?.small_files()?.write_all(&tmp)?;
        let p = tmp.join(STAMP);
        std::fs::write(&p, stamp.to_string()).map_err(|e| ModelError::io(&p, e))?;
        if dir.exists() {
            std::fs::remove_dir_all(&dir).map_err(|e| ModelError::io(&dir, e))?;
        }
        std::fs::rename(&tmp, &dir).map_err(|e| ModelError::io(&dir, e))
    })();
    let _ = std::fs::remove_file(&lock);
    result?;
    Ok(dir)
}

/// The `.gguf` file a [`checkpoint_dir`] folder stands for (`None` for any other folder): what a
/// LoRA adapter of a policy loaded from it names as its base.
pub fn source_of(dir: &Path) -> Option<PathBuf> {
    let text = std::fs::read_to_string(dir.join(STAMP)).ok()?;
    let v: Value = serde_json::from_str(&text).ok()?;
    let name = v.get("source")?.as_str()?;
    Some(dir.parent()?.join(name))
}
