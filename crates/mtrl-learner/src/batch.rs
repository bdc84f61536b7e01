//! From groups of trajectories to padded training rows.
//!
//! Advantages over the whole batch (`mtrl_algo::batch_advantages`): each trajectory is a sample
//! whose turns are its runs of sampled tokens (one per model call), with the trajectory's
//! `turn_rewards` or, without them, its whole reward on the last turn; every token gets the
//! advantage of its turn. Per trajectory: a row of its tokens with the loss mask
//! shifted to log-prob positions (`logp[t]` scores token t + 1, so `mask[t] = loss_mask[t + 1]` and
//! `behaviour[t] = logprobs[t + 1]`). A trajectory whose oldest sampled token is more than η
//! versions behind the learner is dropped and counted; so is one without sampled tokens.
//! Rows are grouped into micro-batches by length, longest first, at most `micro_batch_tokens` rows
//! × longest row each (a row longer than the budget gets a micro-batch of its own); the split is a
//! function of the rows, so it is deterministic ([`micro_batches`]).

use mtrl_algo::{batch_advantages, Advantage, Sample};
use mtrl_core::Trajectory;

use crate::error::Result;

/// One training row.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub tokens: Vec<u32>,
    /// `len − 1` entries: 1 where `logp[t]` is trained.
    pub mask: Vec<f32>,
    /// `len − 1` entries: the rollout's log-prob of token t + 1 (0 where masked out).
    pub behaviour: Vec<f32>,
    /// `len − 1` entries: the advantage of the token at t + 1 (0 where masked out).
    pub advantages: Vec<f32>,
    /// `len − 1` proximal log-probs (decoupled PPO), empty until the learner computes them.
    pub prox: Vec<f32>,
    /// Trained tokens of the whole trajectory this row is a segment of (its own when it is the
    /// whole trajectory): sequence-level aggregation counts trajectories, not rows.
    pub traj_tokens: f64,
}

impl Row {
    /// Trained tokens (the mask's sum).
    pub fn trained(&self) -> f64 {
        self.mask.iter().map(|&m| m as f64).sum()
    }

    /// The share of its trajectory this row holds (1 for a whole trajectory).
    pub fn share(&self) -> f64 {
        let t = self.trained();
        if self.traj_tokens > 0.0 && t != self.traj_tokens {
            t / self.traj_tokens
        } else {
            1.0
        }
    }
}

/// Trajectories among `rows` (segments of one trajectory add up to 1): N_seqs of the
/// sequence-level aggregations.
pub fn sequences(rows: &[Row]) -> f64 {
    rows.iter().map(Row::share).sum()
}

/// Rows of a batch, plus what was dropped.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Rows {
    pub rows: Vec<Row>,
    /// Trajectories dropped for staleness > η.
    pub dropped_stale: u64,
    /// Trajectories without any sampled token (nothing to train).
    pub empty: u64,
    /// `lag_counts[k]`: trajectories whose oldest sampled token is k versions old.
    pub lag_counts: Vec<u64>,
}

/// Builds rows from `groups` for a learner at `version` with bound `max_staleness`.
pub fn build_rows(
    groups: &[Vec<Trajectory>],
    estimator: Advantage,
    version: u64,
    max_staleness: u64,
) -> Result<Rows> {
    let mut out = Rows::default();
    let samples = groups
        .iter()
        .map(|g| g.iter().map(sample).collect::<Result<Vec<_>>>())
        .collect::<Result<Vec<_>>>()?;
    let adv = batch_advantages(estimator, &samples)?;
    for (group, adv) in groups.iter().zip(adv) {
        for (t, a) in group.iter().zip(adv) {
            let oldest = t
                .versions
                .iter()
                .zip(&t.loss_mask)
                .filter(|(_, m)| **m == 1)
                .map(|(v, _)| *v)
                .min();
            let Some(oldest) = oldest else {
                out.empty += 1;
                continue;
            };
            let lag = version.saturating_sub(oldest) as usize;
            if out.lag_counts.len() <= lag {
                out.lag_counts.resize(lag + 1, 0);
            }
            out.lag_counts[lag] += 1;
            if lag as u64 > max_staleness {
                out.dropped_stale += 1;
                continue;
            }
            let mut rows = segment_rows(t, &a);
            if rows.is_empty() {
                out.empty += 1;
            }
            let total: f64 = rows.iter().map(Row::trained).sum();
            for r in &mut rows {
                r.traj_tokens = total;
            }
            out.rows.extend(rows);
        }
    }
    Ok(out)
}

/// The rows of one trajectory: one per segment with a trained position (a trajectory whose agent
/// rewrote its history has several), each token with the advantage of its turn `a[turn]`; turns
/// are counted across segments.
fn segment_rows(t: &Trajectory, a: &[f64]) -> Vec<Row> {
    let mut rows = Vec::new();
    let mut turn = 0usize;
    for seg in t.segments() {
        let (toks, mask) = (&t.tokens[seg.clone()], &t.loss_mask[seg.clone()]);
        let n = toks.len();
        if mask.first() == Some(&1) && mask.get(1) != Some(&1) {
            // A run made of the segment's token 0 alone has no row position but is a turn.
            turn += 1;
        }
        if n < 2 || !mask[1..].contains(&1) {
            continue;
        }
        let lp = &t.logprobs[seg];
        let m: Vec<f32> = mask[1..].iter().map(|&m| m as f32).collect();
        let behaviour: Vec<f32> = (1..n)
            .map(|i| if mask[i] == 1 { lp[i] } else { 0.0 })
            .collect();
        // Token i (row position i − 1) belongs to the turn counted so far.
        let mut advantages = vec![0f32; n - 1];
        for i in 1..n {
            if mask[i] == 1 {
                advantages[i - 1] = a[turn] as f32;
                if i + 1 == n || mask[i + 1] == 0 {
                    turn += 1;
                }
            }
        }
        rows.push(Row {
            tokens: toks.to_vec(),
            mask: m,
            behaviour,
            advantages,
            prox: Vec::new(),
            traj_tokens: 0.0,
        });
    }
    rows
}

/// A trajectory as the estimators see it.
fn sample(t: &Trajectory) -> Result<Sample> {
    let turn_tokens = t.sampled_runs();
    let turn_rewards = if t.turn_rewards.is_empty() {
        let mut r = vec![0.0; turn_tokens.len()];
        if let Some(last) = r.last_mut() {
            *last = t.reward;
        }
        r
    } else if t.turn_rewards.len() == turn_tokens.len() {
        t.turn_rewards.clone()
    } else {
        return Err(crate::error::LearnerError::Invalid(format!(
            "trajectory `{}` has {} turn rewards for {} sampled turns",
            t.task_id,
            t.turn_rewards.len(),
            turn_tokens.len()
        )));
    };
    Ok(Sample {
        turn_rewards,
        turn_tokens,
    })
}

/// Splits rows into micro-batches (groups of row indices): rows are taken longest first, and a
/// group holds rows while they fit `budget` (a row longer than the budget gets a group of its
/// own). With `fused` attention (the kernel reads the packed rows in place) the bound is the
/// rows' own tokens, `Σ len`; otherwise the padded layout the spelled attention runs in, `rows ×
/// t_max` (its scores `∝ rows × t_max²`), where grouping by length keeps the padding small.
/// Everything but the attention core runs on the rows' own tokens either way. Deterministic: ties
/// keep the rows' order.
pub fn micro_batches(rows: &[Row], budget: usize, fused: bool) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..rows.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(rows[i].tokens.len()));
    let mut out: Vec<Vec<usize>> = Vec::new();
    let mut used = 0usize;
    for i in order {
        let len = rows[i].tokens.len();
        match out.last_mut() {
            Some(g) if fused && used + len <= budget => {
                g.push(i);
                used += len;
            }
            Some(g) if !fused && (g.len() + 1) * rows[g[0]].tokens.len() <= budget => g.push(i),
            _ => {
                out.push(vec![i]);
                used = len;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn traj(tokens: &[u32], mask: &[u8], version: u64, reward: f64) -> Trajectory {
        let mut t = Trajectory::new("t");
        for (&id, &m) in tokens.iter().zip(mask) {
            if m == 1 {
                t.push_sampled(&[id], &[-0.5], &[version]);
            } else {
                t.push_context(&[id]);
            }
        }
        t.reward = reward;
        t
    }

    #[test]
    fn rows_shift_mask_and_drop_stale() {
        let g = vec![
            traj(&[1, 2, 3, 4], &[0, 0, 1, 1], 5, 1.0),
            traj(&[1, 2, 3], &[0, 0, 1], 3, 0.0),
            traj(&[1, 2], &[0, 0], 0, 0.0),
        ];
        let r = build_rows(&[g], Advantage::DrGrpo, 5, 1).unwrap();
        assert_eq!(r.rows.len(), 1);
        assert_eq!(r.dropped_stale, 1);
        assert_eq!(r.empty, 1);
        assert_eq!(r.lag_counts, vec![1, 0, 1]);
        let row = &r.rows[0];
        assert_eq!(row.mask, vec![0.0, 1.0, 1.0]);
        assert_eq!(row.behaviour, vec![0.0, -0.5, -0.5]);
        // The trajectory without a sampled token takes no part in the group's statistics
        // (nothing it did can be trained on): dr_grpo over [1, 0] gives 1 − 0.5.
        assert_eq!(row.advantages, vec![0.0, 0.5, 0.5]);
    }

    #[test]
    fn every_configurable_estimator_name_is_one_the_algo_crate_knows() {
        assert_eq!(mtrl_core::config::ADVANTAGES, Advantage::NAMES);
    }

    #[test]
    fn tokens_get_the_advantage_of_their_turn() {
        // Two model calls: ids 2–3 (turn 0) and id 5 (turn 1), tool output id 4 between.
        let mut t = traj(&[1, 2, 3, 4, 5], &[0, 1, 1, 0, 1], 5, 1.0);
        t.turn_rewards = vec![0.25, 0.75];
        let r = build_rows(&[vec![t.clone()]], Advantage::MonteCarlo, 5, 1).unwrap();
        // Returns: turn 0 = 0.25 + 0.75 = 1, turn 1 = 0.75.
        assert_eq!(r.rows[0].advantages, vec![1.0, 1.0, 0.0, 0.75]);
        // Without turn rewards the reward sits on the last turn: both returns are 1.
        t.turn_rewards.clear();
        let r = build_rows(&[vec![t.clone()]], Advantage::MonteCarlo, 5, 1).unwrap();
        assert_eq!(r.rows[0].advantages, vec![1.0, 1.0, 0.0, 1.0]);
        t.turn_rewards = vec![1.0];
        let e = build_rows(&[vec![t]], Advantage::MonteCarlo, 5, 1).unwrap_err();
        assert!(
            e.to_string().contains("1 turn rewards for 2 sampled turns"),
            "{e}"
        );
    }

    #[test]
    fn each_segment_is_a_row_and_turns_count_across_segments() {
        // An agent rewrote its history: the second call's prompt (4) is not a continuation.
        let mut t = traj(&[1, 2, 3, 4, 5], &[0, 1, 1, 0, 1], 5, 1.0);
        t.segment_starts = vec![3];
        t.turn_rewards = vec![0.25, 0.75];
        t.check().unwrap();
        let r = build_rows(&[vec![t]], Advantage::MonteCarlo, 5, 1).unwrap();
        assert_eq!(r.rows.len(), 2);
        assert_eq!(r.rows[0].tokens, vec![1, 2, 3]);
        assert_eq!(r.rows[0].advantages, vec![1.0, 1.0]);
        assert_eq!(r.rows[0].behaviour, vec![-0.5, -0.5]);
        assert_eq!(r.rows[1].tokens, vec![4, 5]);
        assert_eq!(r.rows[1].mask, vec![1.0]);
        assert_eq!(r.rows[1].advantages, vec![0.75]);
        // Issue 43, item 13: the two rows are one trajectory for sequence-level aggregation.
        assert_eq!(
            (r.rows[0].share(), r.rows[1].share()),
            (2.0 / 3.0, 1.0 / 3.0)
        );
        assert_eq!(sequences(&r.rows), 1.0);
    }

    #[test]
    fn micro_batches_respect_the_budget() {
        let row = |n: usize| Row {
            tokens: vec![0; n],
            mask: vec![1.0; n - 1],
            behaviour: vec![0.0; n - 1],
            advantages: vec![0.0; n - 1],
            prox: Vec::new(),
            traj_tokens: 0.0,
        };
        let rows = vec![row(4), row(4), row(8), row(2), row(20), row(3)];
        // Longest first: 20 alone (over the budget); 8 + 4 (2 · 8 = 16); 4 + 3 + 2 (3 · 4 = 12).
        let mb = micro_batches(&rows, 16, false);
        assert_eq!(mb, vec![vec![4], vec![2, 0], vec![1, 5, 3]]);
        assert_eq!(
            micro_batches(&rows, 1000, false),
            vec![vec![4, 2, 0, 1, 5, 3]]
        );
        assert!(micro_batches(&[], 10, false).is_empty());
        // Fused attention: the rows' own tokens. 20 alone; 8 + 4 + 4 = 16; 3 + 2.
        let mb = micro_batches(&rows, 16, true);
        assert_eq!(mb, vec![vec![4], vec![2, 0, 1], vec![5, 3]]);
        assert_eq!(micro_batches(&rows, 41, true), vec![vec![4, 2, 0, 1, 5, 3]]);
        assert_eq!(micro_batches(&rows, 40, true).len(), 2);
    }
}
