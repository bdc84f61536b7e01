//! Resuming a run: the config keys a resume must not change, the check against a checkpoint's
//! trainer state, `--fresh` (earlier checkpoints moved aside, never deleted) and writing a
//! checkpoint with its data cursor.
//!
//! Invariant: resume keys compare what paths point to, not how they are spelled. Paths are
//! stored canonical (symlinks resolved, absolute), and a stored path that is spelled differently
//! is canonicalised again before it is compared, so the same config reached from another working
//! directory, by an absolute path or through `..` resumes, while a config that names another
//! file does not.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use mtrl_core::config::{ModelSource, RANDOM_PRESETS};
use mtrl_core::rng::hash_str;
use mtrl_core::Config;
use mtrl_learner::{CheckpointManager, Learner, TrainerState};
use serde_json::json;

use crate::bail;
use crate::error::{Context, Result};

/// Keys whose values are (lists of) paths, as `path@weight` items separated by `, `.
const PATH_KEYS: [&str; 2] = ["model.path", "data.train"];

/// What a path points to: canonical when it exists, else absolute with `.`/`..` removed.
pub fn path_identity(p: &Path) -> PathBuf {
    if let Ok(c) = std::fs::canonicalize(p) {
        return c;
    }
    let abs = if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir().map_or_else(|_| p.to_path_buf(), |d| d.join(p))
    };
    let mut out = PathBuf::new();
    for c in abs.components() {
        match c {
            std::path::Component::CurDir => {}
            std::path::Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// Config values a resume must not change, by key.
pub fn resume_keys(cfg: &Config) -> BTreeMap<String, String> {
    let mut k = BTreeMap::new();
    if let Some(m) = &cfg.model {
        let v = match &m.source {
            ModelSource::Dir(d) => path_identity(d).display().to_string(),
            ModelSource::RandomConfig(d) => format!("random:{}", path_identity(d).display()),
            ModelSource::RandomPreset(_) => m.path_text.clone(),
        };
        k.insert("model.path".into(), v);
    }
    if let Some(d) = &cfg.data {
        let train: Vec<String> = d
            .train
            .iter()
            .map(|t| format!("{}@{}", path_identity(&t.path).display(), t.weight))
            .collect();
        k.insert("data.train".into(), train.join(", "));
        k.insert("data.seed".into(), d.seed.to_string());
    }
    k.insert(
        "rollout.group_size".into(),
        cfg.rollout.group_size.to_string(),
    );
    k.insert(
        "rollout.environment".into(),
        cfg.rollout.environment.as_str().into(),
    );
    k.insert(
        "train.global_batch_size".into(),
        cfg.train.global_batch_size.to_string(),
    );
    // An adapter's shape is fixed by its rank, targets and scaling (absent for full fine-tuning,
    // so checkpoints from before LoRA resume as they did).
    if let Some(l) = &cfg.lora {
        let v = format!(
            "rank {}, alpha {}, targets {}, rslora {}",
            l.rank,
            l.alpha,
            l.target_modules.join("/"),
            l.rslora
        );
        k.insert("lora".into(), v);
    }
    k
}

/// One item of a path key (`[random:]path[@weight]`) with its path canonical; a preset
/// (`random:tiny`) names no file and stays as it is.
fn canonical_item(item: &str) -> String {
    let (path, weight) = match item.rsplit_once('@') {
        Some((p, w)) if w.parse::<f64>().is_ok() => (p, Some(w)),
        _ => (item, None),
    };
    let (prefix, path) = match path.strip_prefix("random:") {
        Some(p) if RANDOM_PRESETS.contains(&p) => return item.to_string(),
        Some(p) => ("random:", p),
        None => ("", path),
    };
    let p = path_identity(Path::new(path));
    match weight {
        Some(w) => format!("{prefix}{}@{w}", p.display()),
        None => format!("{prefix}{}", p.display()),
    }
}

/// `old` (from a checkpoint, maybe written by a build that stored paths as spelled) and `new`
/// name the same files.
fn same_paths(old: &str, new: &str) -> bool {
    let canon = |v: &str| v.split(", ").map(canonical_item).collect::<Vec<_>>();
    canon(old) == canon(new)
}

/// Refuses to resume from `ckpt` when the config changed a resume key (naming the keys).
pub fn check_resume_keys(cfg: &Config, st: &TrainerState, ckpt: &Path) -> Result<()> {
    let now = resume_keys(cfg);
    let mut changed = Vec::new();
    for (k, v) in &now {
        match st.resume_keys.get(k) {
            Some(old) if old == v => {}
            Some(old) if PATH_KEYS.contains(&k.as_str()) && same_paths(old, v) => {}
            Some(old) => changed.push(format!("{k} (was `{old}`, now `{v}`)")),
            None => changed.push(format!("{k} (not in the checkpoint)")),
        }
    }
    if !changed.is_empty() {
        bail!(
            "cannot resume from {}: the config changed keys that make resuming meaningless: {}; \
             restore them, pick another checkpoint.dir, or pass --fresh",
            ckpt.display(),
            changed.join(", ")
        );
    }
    Ok(())
}

/// A stable hash of the config file's text.
pub fn config_hash(cfg: &Config) -> String {
    let text = std::fs::read_to_string(&cfg.source).unwrap_or_default();
    format!("{:016x}", hash_str(0, &text))
}

/// The run's step records.
pub fn metrics_path(cfg: &Config) -> PathBuf {
    cfg.checkpoint.dir.join("metrics.jsonl")
}

/// `--fresh`: moves the run's checkpoints, metrics and trajectory logs into
/// `checkpoint.dir/previous-<unix time>/` (never deletes them: a mistyped flag must not lose a
/// run).
pub fn clear_run(cfg: &Config, mgr: &CheckpointManager) -> Result<()> {
    let mut old: Vec<PathBuf> = mgr.list()?.into_iter().map(|(_, p)| p).collect();
    for p in [metrics_path(cfg), cfg.checkpoint.dir.join("trajectories")] {
        if p.exists() {
            old.push(p);
        }
    }
    if old.is_empty() {
        return Ok(());
    }
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let aside = mgr.dir().join(format!("previous-{secs}"));
    std::fs::create_dir_all(&aside).with_context(|| format!("creating {}", aside.display()))?;
    for p in &old {
        if let Some(name) = p.file_name() {
            std::fs::rename(p, aside.join(name))
                .with_context(|| format!("moving {} into {}", p.display(), aside.display()))?;
        }
    }
    eprintln!(
        "--fresh: moved {} earlier checkpoint files into {}",
        old.len(),
        aside.display()
    );
    Ok(())
}

/// Fills the trainer state's data cursor (that of `shadow`, the mixer state after the trained
/// batches) and RNG note before a checkpoint.
pub fn fill_state(state: &mut TrainerState, shadow: &mtrl_env::Mixer) -> Result<()> {
    state.data_cursor = serde_json::to_value(shadow.cursor())?;
    state.rng = json!({
        "sampling": "per generation: mtrl_core::rng::sample_seed(train.seed, group, sample, turn)",
        "data": "dataset cursor",
    });
    Ok(())
}

/// Writes a checkpoint of the learner on this thread.
pub fn save(
    mgr: &CheckpointManager,
    learner: &Learner,
    state: &mut TrainerState,
    shadow: &mtrl_env::Mixer,
    dtype: candle_core::DType,
) -> Result<std::path::PathBuf> {
    fill_state(state, shadow)?;
    Ok(mgr.save(&learner.policy, dtype, &learner.opt, state)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_compare_by_what_they_point_to() {
        let d = tempfile::tempdir().unwrap();
        let sub = d.path().join("configs");
        std::fs::create_dir(&sub).unwrap();
        let f = d.path().join("train.jsonl");
        std::fs::write(&f, "").unwrap();
        let dotted = format!("{}/../train.jsonl@1", sub.display());
        let plain = format!("{}@1", path_identity(&f).display());
        assert!(same_paths(&dotted, &plain));
        assert!(!same_paths(&format!("{}@2", f.display()), &plain));
        let other = d.path().join("other.jsonl");
        assert!(!same_paths(&format!("{}@1", other.display()), &plain));
        assert!(same_paths("random:tiny", "random:tiny"));
        assert_eq!(
            path_identity(Path::new("/a/./b/../c")),
            PathBuf::from("/a/c")
        );
    }
}
