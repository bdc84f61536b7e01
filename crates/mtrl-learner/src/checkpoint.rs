//! Training checkpoints: atomic, checksummed, rotated.
//!
//! Layout of `checkpoint.dir`: one folder per checkpoint, `step-00000042/`, holding
//! - `policy/` — the policy as a Hugging Face checkpoint (loads in transformers unchanged), or
//!   with LoRA the adapter as PEFT writes it (`adapter_config.json` + `adapter_model.safetensors`);
//! - `optimizer.safetensors` + `optimizer.json` — AdamW moments, master weights and step;
//! - `trainer.json` — step, policy version, dataset cursor, RNG states, config hash, resume keys,
//!   metric history (`format_version`);
//! - `CHECKSUMS.json` — sha256 of every other file, written last.
//!
//! A checkpoint is written into `.tmp-step-N/`, every file fsynced, then renamed into place and
//! the parent folder fsynced: a crash leaves either no `step-N/` or a complete one. On resume,
//! folders are tried newest first; one whose checksums fail (truncated, edited, half-copied) is
//! reported and skipped, so the previous one is used, and a run sets it aside as
//! `rejected-step-N` ([`CheckpointManager::set_aside`]).
//!
//! Invariant: rotation deletes only folders that verified and are older than the one just
//! written; it never deletes the folder just written.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use candle_core::DType;
use mtrl_model::{Policy, PolicySnapshot};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::adamw::AdamW;
use crate::error::{LearnerError, Result};

pub const FORMAT_VERSION: u32 = 1;
const CHECKSUMS: &str = "CHECKSUMS.json";
/// A checkpoint being written (renamed to `step-N` once complete).
const TMP_PREFIX: &str = ".tmp-step-";
/// A checkpoint of the same step being replaced (removed once the new one is in place).
const OLD_PREFIX: &str = ".old-step-";
/// A checkpoint that failed verification, set aside at the start of a run.
const REJECTED_PREFIX: &str = "rejected-";

/// Everything besides weights and optimizer needed to continue a run exactly.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TrainerState {
    pub format_version: u32,
    pub step: u64,
    pub policy_version: u64,
    /// Opaque dataset cursor (owned by the data loader).
    pub data_cursor: serde_json::Value,
    /// Opaque RNG states (owned by whoever draws).
    pub rng: serde_json::Value,
    /// Hash of the full config, for information.
    pub config_hash: String,
    /// Config values that must not change across a resume (model, datasets, group size, …).
    pub resume_keys: BTreeMap<String, String>,
    /// Per-step metrics so far.
    pub metrics: Vec<serde_json::Value>,
    /// The best step by the validation metric so far; its checkpoint survives `keep_last`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub best: Option<BestCheckpoint>,
}

/// The best step by a validation metric.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BestCheckpoint {
    pub step: u64,
    pub metric: String,
    pub value: f64,
    /// The mean reward of the sampled validation episodes (`train.val_samples` > 0), which breaks
    /// ties of `value`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tiebreak: Option<f64>,
}

impl BestCheckpoint {
    /// Whether a step scoring `value` (tie-break `tiebreak`) replaces this one: a higher value, or
    /// an equal one with a higher tie-break. On a full tie the earlier step stays.
    pub fn beaten_by(&self, value: f64, tiebreak: Option<f64>) -> bool {
        value > self.value
            || (value == self.value
                && matches!((tiebreak, self.tiebreak), (Some(n), Some(o)) if n > o))
    }
}

/// A checkpoint that failed verification, with the reason.
#[derive(Debug, Clone)]
pub struct Rejected {
    pub path: PathBuf,
    pub reason: String,
}

#[derive(Debug, Clone)]
pub struct CheckpointManager {
    dir: PathBuf,
    keep_last: usize,
    /// Folders known to verify: written by this manager (or a clone of it) or checked by
    /// [`CheckpointManager::latest_valid`] / rotation. Rotation deletes only these, so a folder
    /// is hashed at most once per process.
    verified: Arc<Mutex<BTreeSet<PathBuf>>>,
}

fn sha256(path: &Path) -> Result<String> {
    let mut f = std::fs::File::open(path).map_err(LearnerError::io("open", path))?;
    let mut h = Sha256::new();
    std::io::copy(&mut f, &mut h).map_err(LearnerError::io("read", path))?;
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// Relative paths of all files under `root` (sorted), and `root` with every folder below it.
fn walk(root: &Path) -> Result<(Vec<PathBuf>, Vec<PathBuf>)> {
    let (mut files, mut dirs) = (Vec::new(), vec![root.to_path_buf()]);
    let mut i = 0;
    while i < dirs.len() {
        let d = dirs[i].clone();
        for e in std::fs::read_dir(&d).map_err(LearnerError::io("list", &d))? {
            let p = e.map_err(LearnerError::io("list", &d))?.path();
            if p.is_dir() {
                dirs.push(p);
            } else if let Ok(rel) = p.strip_prefix(root) {
                files.push(rel.to_path_buf());
            }
        }
        i += 1;
    }
    files.sort();
    Ok((files, dirs))
}

fn fsync(path: &Path) -> Result<()> {
    std::fs::File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(LearnerError::io("sync", path))
}

impl CheckpointManager {
    pub fn new(dir: impl Into<PathBuf>, keep_last: usize) -> CheckpointManager {
        CheckpointManager {
            dir: dir.into(),
            keep_last: keep_last.max(1),
            verified: Arc::default(),
        }
    }

    fn mark_verified(&self, path: &Path) {
        if let Ok(mut v) = self.verified.lock() {
            v.insert(path.to_path_buf());
        }
    }

    /// Whether `path` verifies (remembered once it did).
    fn is_verified(&self, path: &Path) -> bool {
        if self.verified.lock().is_ok_and(|v| v.contains(path)) {
            return true;
        }
        let ok = Self::verify(path).is_ok();
        if ok {
            self.mark_verified(path);
        }
        ok
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn step_dir(&self, step: u64) -> PathBuf {
        self.dir.join(format!("step-{step:08}"))
    }

    /// Checkpoint folders, newest first.
    pub fn list(&self) -> Result<Vec<(u64, PathBuf)>> {
        if !self.dir.exists() {
            return Ok(Vec::new());
        }
        let mut out = Vec::new();
        for e in std::fs::read_dir(&self.dir).map_err(LearnerError::io("list", &self.dir))? {
            let e = e.map_err(LearnerError::io("list", &self.dir))?;
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(n) = name
                .strip_prefix("step-")
                .and_then(|n| n.parse::<u64>().ok())
            {
                out.push((n, e.path()));
            }
        }
        out.sort_by_key(|x| std::cmp::Reverse(x.0));
        Ok(out)
    }

    /// Writes a checkpoint atomically, then rotates. The folder just written and the best step
    /// are always kept; so are the newest `keep_last - 1` older folders that verify, and what
    /// lies between them; everything older than those is deleted. Folders of later steps (not
    /// this run's: a copy, a damaged leftover) are never counted and never deleted, and a folder
    /// that fails verification never fills a slot, so neither can push valid ones out.
    pub fn save(
        &self,
        policy: &Policy,
        policy_dtype: DType,
        opt: &AdamW,
        state: &TrainerState,
    ) -> Result<PathBuf> {
        self.save_snapshot(&policy.snapshot_view()?, policy_dtype, opt, state)
    }

    /// [`CheckpointManager::save`] of a [`PolicySnapshot`] (what the background writer saves).
    pub fn save_snapshot(
        &self,
        policy: &PolicySnapshot,
        policy_dtype: DType,
        opt: &AdamW,
        state: &TrainerState,
    ) -> Result<PathBuf> {
        std::fs::create_dir_all(&self.dir).map_err(LearnerError::io("create", &self.dir))?;
        self.clean_stale()?;
        let tmp = self.dir.join(format!("{TMP_PREFIX}{:08}", state.step));
        std::fs::create_dir_all(&tmp).map_err(LearnerError::io("create", &tmp))?;
        policy.save(&tmp.join("policy"), policy_dtype)?;
        opt.save(&tmp)?;
        let mut st = state.clone();
        st.format_version = FORMAT_VERSION;
        let p = tmp.join("trainer.json");
        let text =
            serde_json::to_string_pretty(&st).map_err(|e| LearnerError::Invalid(e.to_string()))?;
        std::fs::write(&p, text).map_err(LearnerError::io("write", &p))?;
        let mut sums = BTreeMap::new();
        let (files, dirs) = walk(&tmp)?;
        for rel in files {
            let full = tmp.join(&rel);
            fsync(&full)?;
            sums.insert(rel.to_string_lossy().into_owned(), sha256(&full)?);
        }
        let p = tmp.join(CHECKSUMS);
        let text = serde_json::to_string_pretty(&sums)
            .map_err(|e| LearnerError::Invalid(e.to_string()))?;
        std::fs::write(&p, text).map_err(LearnerError::io("write", &p))?;
        fsync(&p)?;
        // Directory entries too: the files' names must survive a crash as well as their bytes.
        for d in dirs {
            fsync(&d)?;
        }
        let dest = self.step_dir(state.step);
        // An older checkpoint of the same step is set aside, not deleted, until the new one is
        // in place.
        let old = self.dir.join(format!("{OLD_PREFIX}{:08}", state.step));
        let had_old = dest.exists();
        if had_old {
            std::fs::rename(&dest, &old).map_err(LearnerError::io("rename", &dest))?;
        }
        std::fs::rename(&tmp, &dest).map_err(LearnerError::io("rename", &tmp))?;
        fsync(&self.dir)?;
        if had_old {
            std::fs::remove_dir_all(&old).map_err(LearnerError::io("remove", &old))?;
        }
        self.mark_verified(&dest);
        let best = state.best.as_ref().map(|b| b.step);
        let mut kept = 1;
        for (n, old) in self.list()? {
            if n >= state.step || Some(n) == best {
                continue;
            }
            if kept < self.keep_last {
                // Only a folder that verifies fills a slot; one that does not is left as it is.
                if self.is_verified(&old) {
                    kept += 1;
                }
                continue;
            }
            std::fs::remove_dir_all(&old).map_err(LearnerError::io("remove", &old))?;
            if let Ok(mut v) = self.verified.lock() {
                v.remove(&old);
            }
        }
        Ok(dest)
    }

    /// Checks a checkpoint folder against its checksums.
    /// Removes what an interrupted save left: `.tmp-step-*` folders (never complete) and
    /// `.old-step-*` ones whose replacement is in place (one without is renamed back). Returns
    /// how many folders were cleaned.
    pub fn clean_stale(&self) -> Result<usize> {
        if !self.dir.exists() {
            return Ok(0);
        }
        let mut n = 0;
        for e in std::fs::read_dir(&self.dir).map_err(LearnerError::io("list", &self.dir))? {
            let e = e.map_err(LearnerError::io("list", &self.dir))?;
            let name = e.file_name().to_string_lossy().into_owned();
            let path = e.path();
            if name.starts_with(TMP_PREFIX) {
                std::fs::remove_dir_all(&path).map_err(LearnerError::io("remove", &path))?;
                n += 1;
            } else if let Some(step) = name.strip_prefix(OLD_PREFIX) {
                let dest = self.dir.join(format!("step-{step}"));
                if dest.exists() {
                    std::fs::remove_dir_all(&path).map_err(LearnerError::io("remove", &path))?;
                } else {
                    std::fs::rename(&path, &dest).map_err(LearnerError::io("rename", &path))?;
                }
                n += 1;
            }
        }
        Ok(n)
    }

    pub fn verify(path: &Path) -> std::result::Result<(), String> {
        let sums_path = path.join(CHECKSUMS);
        let text =
            std::fs::read_to_string(&sums_path).map_err(|_| format!("{CHECKSUMS} is missing"))?;
        let sums: BTreeMap<String, String> =
            serde_json::from_str(&text).map_err(|e| format!("{CHECKSUMS} is malformed: {e}"))?;
        for (rel, want) in &sums {
            match sha256(&path.join(rel)) {
                Ok(got) if &got == want => {}
                Ok(_) => return Err(format!("{rel} does not match its checksum")),
                Err(_) => return Err(format!("{rel} is missing")),
            }
        }
        for needed in ["trainer.json", "optimizer.json", "optimizer.safetensors"] {
            if !sums.contains_key(needed) {
                return Err(format!("{needed} is not part of the checkpoint"));
            }
        }
        // The policy: a full checkpoint, or a LoRA adapter (PEFT's two files).
        let full = sums.contains_key("policy/config.json");
        let adapter = sums.contains_key("policy/adapter_config.json")
            && sums.contains_key("policy/adapter_model.safetensors");
        if !full && !adapter {
            return Err(
                "policy/config.json (or a LoRA adapter's adapter_config.json and \
                 adapter_model.safetensors) is not part of the checkpoint"
                    .into(),
            );
        }
        Ok(())
    }

    /// Moves folders that failed verification out of the listing, to `rejected-step-N` (with a
    /// `-k` suffix when that name is taken), so rotation and later resumes never see them.
    /// Nothing is deleted: a person may want to look at them. Returns the new paths.
    pub fn set_aside(&self, rejected: &[Rejected]) -> Result<Vec<PathBuf>> {
        let mut out = Vec::new();
        for r in rejected {
            let Some(name) = r.path.file_name().map(|n| n.to_string_lossy().into_owned()) else {
                continue;
            };
            let mut dest = self.dir.join(format!("{REJECTED_PREFIX}{name}"));
            let mut k = 1;
            while dest.exists() {
                dest = self.dir.join(format!("{REJECTED_PREFIX}{name}-{k}"));
                k += 1;
            }
            std::fs::rename(&r.path, &dest).map_err(LearnerError::io("rename", &r.path))?;
            out.push(dest);
        }
        if !out.is_empty() {
            fsync(&self.dir)?;
        }
        Ok(out)
    }

    /// The newest checkpoint that verifies, plus the newer ones that did not.
    pub fn latest_valid(&self) -> Result<(Option<PathBuf>, Vec<Rejected>)> {
        let mut rejected = Vec::new();
        for (_, path) in self.list()? {
            match Self::verify(&path) {
                Ok(()) => {
                    self.mark_verified(&path);
                    return Ok((Some(path), rejected));
                }
                Err(reason) => rejected.push(Rejected { path, reason }),
            }
        }
        Ok((None, rejected))
    }

    /// Reads `trainer.json` of a verified checkpoint.
    pub fn load_state(path: &Path) -> Result<TrainerState> {
        let p = path.join("trainer.json");
        let text = std::fs::read_to_string(&p).map_err(LearnerError::io("read", &p))?;
        let st: TrainerState =
            serde_json::from_str(&text).map_err(|e| LearnerError::BadCheckpoint {
                path: p.clone(),
                message: e.to_string(),
            })?;
        if st.format_version != FORMAT_VERSION {
            return Err(LearnerError::BadCheckpoint {
                path: p,
                message: format!(
                    "format_version {} (expected {FORMAT_VERSION})",
                    st.format_version
                ),
            });
        }
        Ok(st)
    }
}

#[cfg(test)]
mod tests {
    /// Trainer state and metrics go through JSON on every checkpoint; an exact resume needs every
    /// f64 back bit for bit. serde_json's default parser is one ulp off for this value (a loss
    /// of −2⁻²⁴ seen in `tests/train_resume.rs`); the workspace enables `float_roundtrip`.
    #[test]
    fn json_floats_round_trip_exactly() {
        for x in [
            -(2f64.powi(-24)),
            0.1,
            1.0 / 3.0,
            5e-324,
            f64::MAX,
            -1.4679805181188883,
        ] {
            let text = serde_json::to_string(&x).unwrap();
            let back: f64 = serde_json::from_str(&text).unwrap();
            assert_eq!(back.to_bits(), x.to_bits(), "{text}");
        }
    }

    /// A higher value wins; an equal one wins only with a higher tie-break; a full tie (or a
    /// missing tie-break) keeps the earlier step. `best.json` without `tiebreak` still parses.
    #[test]
    fn best_checkpoint_ties_go_to_the_higher_tiebreak() {
        let b = super::BestCheckpoint {
            step: 10,
            metric: "val_reward".into(),
            value: 0.4,
            tiebreak: Some(0.2),
        };
        assert!(b.beaten_by(0.5, None));
        assert!(!b.beaten_by(0.3, Some(0.9)));
        assert!(b.beaten_by(0.4, Some(0.25)));
        assert!(!b.beaten_by(0.4, Some(0.2)));
        assert!(!b.beaten_by(0.4, None));
        let old: super::BestCheckpoint =
            serde_json::from_str(r#"{"step":3,"metric":"val_reward","value":0.1}"#).unwrap();
        assert_eq!(old.tiebreak, None);
        assert!(!old.beaten_by(0.1, Some(1.0)));
    }
}
