//! What a training run does as one of N data-parallel ranks (`mpirun -np N mtrl train`).
//!
//! Each rank runs its own engine on its own device and generates its share of each step's groups
//! ([`mtrl_rollout::Shard`]); [`Ranks::gather_batch`] gives every rank the whole batch in
//! admission order, so advantages, staleness and the step record are the single process's; the
//! learner then takes every N-th micro-batch and the ranks sum gradients
//! ([`mtrl_learner::dist`]). Rank 0 alone writes checkpoints, records, trajectory logs and
//! telemetry; [`Ranks::gather_counters`] brings it every rank's rollout counters, which it logs
//! with a rank label (`rollout-ranks.jsonl`, and Prometheus series labelled `rank`).
//!
//! With one rank ([`mtrl_learner::Local`]) every call here is free and returns its input.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mtrl_core::{Config, Trajectory};
use mtrl_learner::Collective;
use mtrl_model::Policy;
use mtrl_rollout::{RolloutCounters, Shard};
use serde_json::json;

use crate::bail;
use crate::error::{Context, Result, TrainError};

/// This process's place among the ranks.
#[derive(Clone)]
pub struct Ranks {
    pub comm: Arc<dyn Collective>,
}

fn coll(e: mtrl_learner::LearnerError) -> TrainError {
    TrainError::Msg(e.to_string())
}

impl Ranks {
    pub fn new(comm: Arc<dyn Collective>) -> Ranks {
        Ranks { comm }
    }

    pub fn rank(&self) -> usize {
        self.comm.rank()
    }

    pub fn world(&self) -> usize {
        self.comm.world()
    }

    /// Rank 0: the one that writes.
    pub fn lead(&self) -> bool {
        self.rank() == 0
    }

    pub fn shard(&self) -> Shard {
        Shard {
            rank: self.rank(),
            world: self.world(),
        }
    }

    /// Every rank at `what`; true when any raised `flag` (see [`Collective::arrive`]).
    pub fn arrive(&self, what: &str, flag: bool) -> Result<bool> {
        self.comm.arrive(what, flag).map_err(coll)
    }

    /// [`Ranks::arrive`] bounded by `wait` instead of the collective timeout (`None`: no bound).
    pub fn arrive_within(&self, what: &str, flag: bool, wait: Option<Duration>) -> Result<bool> {
        self.comm.arrive_within(what, flag, wait).map_err(coll)
    }

    /// The whole batch from every rank's groups (`mine` are the groups of this rank's share of
    /// `first .. first + b`, in index order); returns it with the seconds spent.
    pub fn gather_batch(
        &self,
        mine: Vec<Vec<Trajectory>>,
        first: u64,
        b: usize,
    ) -> Result<(Vec<Vec<Trajectory>>, f64)> {
        if self.world() <= 1 {
            return Ok((mine, 0.0));
        }
        let t0 = Instant::now();
        let shard = self.shard();
        let idx: Vec<u64> = (first..first + b as u64)
            .filter(|i| shard.owns(*i, b))
            .collect();
        if idx.len() != mine.len() {
            bail!(
                "rank {}: {} groups for the {} of its share of groups {first}..{}",
                self.rank(),
                mine.len(),
                idx.len(),
                first + b as u64
            );
        }
        let payload: Vec<(u64, Vec<Trajectory>)> = idx.into_iter().zip(mine).collect();
        let bytes = serde_json::to_vec(&payload)?;
        let what = format!("groups {first}..{} gather", first + b as u64);
        let all = self.comm.all_gather_bytes(&bytes, &what).map_err(coll)?;
        let mut by_index: BTreeMap<u64, Vec<Trajectory>> = BTreeMap::new();
        for (r, part) in all.iter().enumerate() {
            let groups: Vec<(u64, Vec<Trajectory>)> = serde_json::from_slice(part)
                .with_context(|| format!("the groups rank {r} sent for {what}"))?;
            by_index.extend(groups);
        }
        let batch: Vec<Vec<Trajectory>> = (first..first + b as u64)
            .map(|i| {
                by_index
                    .remove(&i)
                    .ok_or_else(|| TrainError::Msg(format!("{what}: no rank sent group {i}")))
            })
            .collect::<Result<_>>()?;
        Ok((batch, t0.elapsed().as_secs_f64()))
    }

    /// Every rank's rollout counters, in rank order.
    pub fn gather_counters(&self, c: &RolloutCounters) -> Result<Vec<RolloutCounters>> {
        if self.world() <= 1 {
            return Ok(vec![*c]);
        }
        let bytes: Vec<u8> = pack(c).iter().flat_map(|x| x.to_le_bytes()).collect();
        let all = self
            .comm
            .all_gather_bytes(&bytes, "rollout counters gather")
            .map_err(coll)?;
        all.iter()
            .map(|b| {
                let v: Vec<f64> = b
                    .chunks_exact(8)
                    .map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")))
                    .collect();
                unpack(&v)
            })
            .collect()
    }

    /// Compares a checksum of the parameters across the ranks after `step`; an error names the
    /// ranks whose parameters differ from rank 0's (every rank sees the same values, so every
    /// rank stops with the same error).
    pub fn check_parameters(&self, policy: &Policy, step: u64) -> Result<()> {
        if self.world() <= 1 {
            return Ok(());
        }
        let mine = checksum(policy)?;
        let all = self
            .comm
            .all_gather_bytes(&mine.to_le_bytes(), &format!("step {step} checksum"))
            .map_err(coll)?;
        let sums: Vec<u64> = all
            .iter()
            .map(|b| u64::from_le_bytes(b[..8].try_into().expect("8 bytes")))
            .collect();
        let off: Vec<String> = sums
            .iter()
            .enumerate()
            .filter(|(_, s)| **s != sums[0])
            .map(|(r, s)| format!("rank {r} ({s:016x})"))
            .collect();
        if !off.is_empty() {
            bail!(
                "the ranks' parameters diverged by step {step}: {} differ from rank 0 ({:016x}); \
                 the last checkpoint holds rank 0's state",
                off.join(", "),
                sums[0]
            );
        }
        Ok(())
    }
}

/// The config as this rank runs it: with several ranks, `model.device = "cuda"` (or `cuda:0`, the
/// configs' single-GPU default) becomes `cuda:<local rank>` (one GPU per rank); another fixed
/// ordinal, a batch smaller than the world, and
/// the bring-your-own-agent environment (one endpoint per rank, one agent URL) are refused.
pub fn rank_config(cfg: &mtrl_core::Config, ranks: &Ranks) -> Result<mtrl_core::Config> {
    let mut cfg = cfg.clone();
    let world = ranks.world();
    if world <= 1 {
        return Ok(cfg);
    }
    let src = cfg.source.display().to_string();
    let b = cfg.train.global_batch_size;
    if b < world {
        bail!(
            "{src}: train.global_batch_size = {b} is below the {world} ranks: every rank needs at              least one group per step"
        );
    }
    if cfg.rollout.environment == mtrl_core::config::EnvironmentKind::Agent {
        bail!(
            "{src}: rollout.environment = \"agent\" runs in one process only (the agent has one \
             URL); launch it without mpirun"
        );
    }
    if let Some(m) = cfg.model.as_mut() {
        if m.device == "cuda" || m.device == "cuda:0" {
            m.device = format!("cuda:{}", ranks.comm.local_rank());
        } else if m.device.starts_with("cuda:") {
            bail!(
                "{src}: model.device = \"{}\" under {world} ranks: write \"cuda\" and each rank \
                 takes cuda:<its local rank>",
                m.device
            );
        }
    }
    Ok(cfg)
}

/// The data-parallel figures of a step record.
pub fn record(
    rec: &mut mtrl_core::StepRecord,
    world: usize,
    m: &mtrl_learner::StepMetrics,
    gather_s: f64,
) {
    rec.world_size = world as u64;
    rec.allreduce_bytes = m.comm.bytes;
    rec.allreduce_calls = m.comm.calls;
    rec.time_allreduce_s = m.comm.seconds;
    rec.time_gather_s = gather_s;
}

/// `MTRL_RANK_FAULT=diverge:<rank>@<step>`: this rank nudges its first parameter after the step.
pub fn diverge(policy: &Policy, f: mtrl_dist::RankFault) -> Result<()> {
    if f.action != mtrl_dist::faults::FaultAction::Diverge {
        return Ok(());
    }
    if let Some((name, var)) = policy.named_parameters().iter().next() {
        eprintln!(
            "{}: rank {} perturbs `{name}`",
            mtrl_dist::RANK_FAULT_VAR,
            f.rank
        );
        var.set(&var.as_tensor().affine(1.0, 1e-3)?)?;
    }
    Ok(())
}

/// A checksum of every parameter's values: an FNV-1a hash over the bits of each tensor's f64
/// sum and sum of squares, in name order (ranks in step hold identical bits, so any difference
/// shows; one reduction per tensor, on its device).
pub fn checksum(policy: &Policy) -> Result<u64> {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for (name, var) in policy.named_parameters() {
        let t = var.as_tensor().to_dtype(candle_core::DType::F64)?;
        let s = t.sum_all()?.to_scalar::<f64>()?;
        let q = t.sqr()?.sum_all()?.to_scalar::<f64>()?;
        for b in name
            .bytes()
            .chain(s.to_bits().to_le_bytes())
            .chain(q.to_bits().to_le_bytes())
        {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    Ok(h)
}

const FIELDS: usize = 19;

fn pack(c: &RolloutCounters) -> [f64; FIELDS] {
    [
        c.generate_s,
        c.env_s,
        c.publish_s,
        c.admission_wait_s,
        c.tokens as f64,
        c.prefill_tokens as f64,
        c.reused_tokens as f64,
        c.admitted as f64,
        c.engine_version as f64,
        c.retries as f64,
        c.timeouts as f64,
        c.errored_episodes as f64,
        c.replaced_groups as f64,
        c.faults[0] as f64,
        c.faults[1] as f64,
        c.faults[2] as f64,
        c.prefill_s,
        c.decode_s,
        c.sample_s,
    ]
}

fn unpack(v: &[f64]) -> Result<RolloutCounters> {
    if v.len() != FIELDS {
        bail!("rollout counters of {} fields, expected {FIELDS}", v.len());
    }
    Ok(RolloutCounters {
        generate_s: v[0],
        env_s: v[1],
        publish_s: v[2],
        admission_wait_s: v[3],
        tokens: v[4] as u64,
        prefill_tokens: v[5] as u64,
        reused_tokens: v[6] as u64,
        admitted: v[7] as u64,
        engine_version: v[8] as u64,
        retries: v[9] as u64,
        timeouts: v[10] as u64,
        errored_episodes: v[11] as u64,
        replaced_groups: v[12] as u64,
        faults: [v[13] as u64, v[14] as u64, v[15] as u64],
        prefill_s: v[16],
        decode_s: v[17],
        sample_s: v[18],
    })
}

/// The job's counters from the ranks': counts summed, seconds the slowest rank's, the admission
/// index and engine version as the most and least advanced rank has them.
pub fn merge(all: &[RolloutCounters]) -> RolloutCounters {
    let mut m = RolloutCounters {
        engine_version: u64::MAX,
        ..RolloutCounters::default()
    };
    for c in all {
        m.generate_s = m.generate_s.max(c.generate_s);
        m.env_s = m.env_s.max(c.env_s);
        m.publish_s = m.publish_s.max(c.publish_s);
        m.prefill_s = m.prefill_s.max(c.prefill_s);
        m.decode_s = m.decode_s.max(c.decode_s);
        m.sample_s = m.sample_s.max(c.sample_s);
        m.admission_wait_s = m.admission_wait_s.max(c.admission_wait_s);
        m.tokens += c.tokens;
        m.prefill_tokens += c.prefill_tokens;
        m.reused_tokens += c.reused_tokens;
        m.admitted = m.admitted.max(c.admitted);
        m.engine_version = m.engine_version.min(c.engine_version);
        m.retries += c.retries;
        m.timeouts += c.timeouts;
        m.errored_episodes += c.errored_episodes;
        m.replaced_groups += c.replaced_groups;
        for k in 0..3 {
            m.faults[k] += c.faults[k];
        }
    }
    if all.is_empty() {
        m.engine_version = 0;
    }
    m
}

/// Appends one line per rank with what its rollouts did during `step` (rank 0 writes), and
/// exports the same as Prometheus counters labelled with the rank.
/// Drops the lines of `rollout-ranks.jsonl` after `step` (a resumed run writes them again), and
/// a line cut short; a missing file is fine. Rewritten atomically ([`mtrl_eval::trajlog::keep_lines`]).
pub fn cut_ranks_log(path: &Path, step: u64) -> Result<()> {
    mtrl_eval::trajlog::keep_lines(path, |l| {
        serde_json::from_str::<serde_json::Value>(l)
            .ok()
            .and_then(|v| v["step"].as_u64())
            .is_some_and(|s| s <= step)
    })?;
    Ok(())
}

pub fn log_ranks(
    path: &Path,
    step: u64,
    before: &[RolloutCounters],
    after: &[RolloutCounters],
) -> Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    for (r, (b, a)) in before.iter().zip(after).enumerate() {
        let line = json!({
            "step": step,
            "rank": r,
            "tokens": a.tokens - b.tokens,
            "prompt_tokens_prefilled": a.prefill_tokens - b.prefill_tokens,
            "episode_retries": a.retries - b.retries,
            "episodes_errored": a.errored_episodes - b.errored_episodes,
            "time_generate_s": a.generate_s - b.generate_s,
            "time_tools_s": a.env_s - b.env_s,
            "engine_version": a.engine_version,
        });
        writeln!(f, "{line}").with_context(|| format!("writing {}", path.display()))?;
        let rank = r.to_string();
        metrics::counter!("mtrl_rank_rollout_tokens_total", "rank" => rank.clone())
            .increment(a.tokens - b.tokens);
        metrics::gauge!("mtrl_rank_rollout_generate_seconds", "rank" => rank).set(a.generate_s);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_pack_round_trip_and_merge() {
        let a = RolloutCounters {
            generate_s: 1.5,
            tokens: 10,
            admitted: 8,
            engine_version: 3,
            faults: [1, 0, 2],
            ..RolloutCounters::default()
        };
        let b = RolloutCounters {
            generate_s: 2.5,
            tokens: 7,
            admitted: 9,
            engine_version: 2,
            ..RolloutCounters::default()
        };
        assert_eq!(unpack(&pack(&a)).unwrap(), a);
        let m = merge(&[a, b]);
        assert_eq!((m.tokens, m.admitted, m.engine_version), (17, 9, 2));
        assert_eq!((m.generate_s, m.faults), (2.5, [1, 0, 2]));
        assert_eq!(merge(&[a]), a);
    }
}

/// How long ranks wait for each other at a step's start: `distributed.step_timeout_s`, or derived
/// from the rollout bounds so that a healthy rank is never declared dead. Between two step
/// arrivals the last rank may spend its share of the step's episodes (in waves of
/// `rollout_max_concurrency`, each episode up to `rollout.timeout_s` per attempt, `max_retries + 1`
/// attempts) and, on rank 0, a validation pass (`val_tasks × (1 + val_samples)` episodes, bounded
/// the same way) and a checkpoint; `distributed.timeout_s` is added for the rest (learner step,
/// checkpoint write). `None` (no bound) when an episode has none (`rollout.timeout_s = 0`).
pub fn step_wait(cfg: &Config, world: usize, validation_tasks: usize) -> Option<Duration> {
    if let Some(t) = cfg.distributed.step_timeout_s {
        return Some(Duration::from_secs_f64(t));
    }
    let r = &cfg.rollout;
    let episode = r.timeout_s? * (r.max_retries as f64 + 1.0);
    let waves = |episodes: usize| episodes.div_ceil(r.rollout_max_concurrency.max(1)) as f64;
    let groups = cfg.train.global_batch_size.div_ceil(world.max(1));
    let mut bound = waves(groups * r.group_size);
    if cfg.train.val_every > 0 {
        let tasks = match cfg.train.val_tasks {
            0 => validation_tasks,
            n => n.min(validation_tasks),
        };
        bound += waves(tasks * (1 + cfg.train.val_samples));
    }
    let secs = cfg.distributed.timeout_s + episode * bound;
    Some(Duration::from_secs_f64(secs.min(315_360_000.0)))
}

#[cfg(test)]
mod wait_tests {
    use super::*;

    /// Issue 43, item 15: a resumed run's per-rank log keeps only the steps up to the resume.
    #[test]
    fn the_ranks_log_is_cut_back_on_resume() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("rollout-ranks.jsonl");
        let lines: String = (1..=5)
            .flat_map(|s| (0..2).map(move |r| format!("{{\"step\":{s},\"rank\":{r}}}\n")))
            .collect();
        std::fs::write(&p, lines).unwrap();
        cut_ranks_log(&p, 3).unwrap();
        let text = std::fs::read_to_string(&p).unwrap();
        assert_eq!(text.lines().count(), 6, "{text}");
        assert!(text.lines().all(|l| !l.contains("\"step\":4")));
        cut_ranks_log(&d.path().join("missing.jsonl"), 3).unwrap();
    }

    fn cfg(extra: &str) -> Config {
        let text = format!(
            "[rollout]\ngroup_size = 4\nrollout_max_concurrency = 8\ntimeout_s = 10\n\
             max_retries = 2\n[train]\nglobal_batch_size = 6\n{extra}"
        );
        Config::from_toml_str(&text, Path::new("w.toml")).unwrap()
    }

    /// Issue 43, defect 4: the step arrival outlasts the slowest healthy rank. 2 ranks: 3
    /// groups × 4 = 12 episodes, 2 waves of 8, each up to 10 s × 3 attempts, plus 300 s.
    #[test]
    fn the_step_arrival_bound_covers_the_rollout_bounds() {
        let c = cfg("");
        assert_eq!(step_wait(&c, 2, 50), Some(Duration::from_secs(300 + 60)));
        // Validation on rank 0: 5 tasks × (1 + 3) = 20 episodes, 3 more waves.
        let c = cfg("val_every = 1\nval_tasks = 5\nval_samples = 3");
        assert_eq!(step_wait(&c, 2, 50), Some(Duration::from_secs(300 + 150)));
        // The knob, and no bound without an episode bound.
        let c = cfg("[distributed]\nstep_timeout_s = 7.5");
        assert_eq!(step_wait(&c, 2, 50), Some(Duration::from_secs_f64(7.5)));
        let c = Config::from_toml_str("[rollout]\ntimeout_s = 0", Path::new("w.toml")).unwrap();
        assert_eq!(step_wait(&c, 2, 50), None);
    }
}
