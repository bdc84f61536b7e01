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
    // One process writes; the others (MPI ranks, parallel tests) wait on an OS file lock, which
    // the kernel releases when its holder exits, however it exits. The lock file stays (empty).
    let lock_path = path.with_file_name(format!("{stem}.mtrl.lock"));
    let not_writable = |e: std::io::Error| {
        ModelError::checkpoint(
            &lock_path,
            format!(
                "{e}: a .gguf model keeps its config and tokenizer files in {} beside it, so its \
                 folder must be writable (or convert it once with `mtrl convert` and use that folder)",
                dir.display()
            ),
        )
    };
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(not_writable)?;
    lock.lock().map_err(|e| ModelError::io(&lock_path, e))?;
    if fresh() {
        return Ok(dir);
    }
    // A folder of that name without the stamp is not ours: never delete it.
    if dir.exists() && source_of(&dir).is_none() {
        return Err(ModelError::checkpoint(
            &dir,
            format!(
                "is in the way: mtrl keeps the config and tokenizer files of {} there, and this \
                 folder is not one it wrote; move it",
                path.display()
            ),
        ));
    }
    let tmp = path.with_file_name(format!("{stem}.mtrl.tmp-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    Gguf::open(path)?.small_files()?.write_all(&tmp)?;
    let p = tmp.join(STAMP);
    std::fs::write(&p, stamp.to_string()).map_err(|e| ModelError::io(&p, e))?;
    if dir.exists() {
        std::fs::remove_dir_all(&dir).map_err(|e| ModelError::io(&dir, e))?;
    }
    std::fs::rename(&tmp, &dir).map_err(|e| ModelError::io(&dir, e))?;
    drop(lock);
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
