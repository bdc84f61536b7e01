//! Datasets for training and evaluation: the deterministic validation hold-out and the weighted
//! mixer with a saveable cursor.
//!
//! - Hold-out: a task goes to validation when `hash(seed, task id) < fraction` — independent of
//!   row order and stable when rows are added.
//! - Mixer: draw `n` picks dataset `d` with probability ∝ weight from a generator seeded by
//!   `(seed, n)`; each dataset is read in a permutation determined by `(seed, d, epoch)` and starts
//!   a new epoch (new permutation) when exhausted. The whole state is [`Cursor`] (a few integers),
//!   so `restore(cursor)` continues exactly where a saved run stopped.

use std::path::PathBuf;

use mtrl_core::DataConfig;
use serde::{Deserialize, Serialize};

use crate::error::{EnvError, Result};
use crate::task::Task;
use crate::tasks::{load_tasks, LoadReport};
use mtrl_core::rng::{hash_str, mix, permutation, SplitMix64};

/// Splits `tasks` into (train, validation) by a hash of each id.
pub fn hold_out(tasks: Vec<Task>, fraction: f64, seed: u64) -> (Vec<Task>, Vec<Task>) {
    tasks
        .into_iter()
        .partition(|t| (hash_str(seed, &t.id) >> 11) as f64 / (1u64 << 53) as f64 >= fraction)
}

/// One dataset of the mix.
#[derive(Debug, Clone)]
pub struct Dataset {
    pub path: PathBuf,
    pub weight: f64,
    pub tasks: Vec<Task>,
}

/// Position in one dataset.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DatasetPos {
    pub epoch: u64,
    pub index: usize,
}

/// The mixer's whole state: save it with a checkpoint, restore it to resume.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cursor {
    pub draws: u64,
    pub positions: Vec<DatasetPos>,
}

/// Weighted, shuffled, endless sampling over several datasets.
pub struct Mixer {
    datasets: Vec<Dataset>,
    seed: u64,
    cursor: Cursor,
    perms: Vec<Vec<usize>>,
}

impl Mixer {
    /// Errors when there is no dataset or one is empty.
    pub fn new(datasets: Vec<Dataset>, seed: u64) -> Result<Mixer> {
        if datasets.is_empty() {
            return Err(EnvError::Cursor("no training dataset".into()));
        }
        if let Some(d) = datasets.iter().find(|d| d.tasks.is_empty()) {
            return Err(EnvError::EmptyDataset {
                path: d.path.clone(),
            });
        }
        let cursor = Cursor {
            draws: 0,
            positions: vec![DatasetPos::default(); datasets.len()],
        };
        let mut m = Mixer {
            perms: Vec::new(),
            datasets,
            seed,
            cursor,
        };
        m.rebuild_perms();
        Ok(m)
    }

    fn perm_seed(&self, d: usize, epoch: u64) -> u64 {
        mix(self.seed ^ mix(d as u64 + 1) ^ mix(epoch.wrapping_add(0x5151)))
    }

    fn rebuild_perms(&mut self) {
        self.perms = (0..self.datasets.len())
            .map(|d| {
                permutation(
                    self.datasets[d].tasks.len(),
                    self.perm_seed(d, self.cursor.positions[d].epoch),
                )
            })
            .collect();
    }

    pub fn datasets(&self) -> &[Dataset] {
        &self.datasets
    }

    /// The next task and the index of the dataset it came from.
    pub fn next_task(&mut self) -> (usize, &Task) {
        let total: f64 = self.datasets.iter().map(|d| d.weight).sum();
        let mut u = SplitMix64(mix(self.seed ^ mix(self.cursor.draws))).next_f64() * total;
        let mut d = self.datasets.len() - 1;
        for (i, ds) in self.datasets.iter().enumerate() {
            if u < ds.weight {
                d = i;
                break;
            }
            u -= ds.weight;
        }
        self.cursor.draws += 1;
        let pos = self.cursor.positions[d];
        let idx = self.perms[d][pos.index];
        let len = self.datasets[d].tasks.len();
        if pos.index + 1 == len {
            self.cursor.positions[d] = DatasetPos {
                epoch: pos.epoch + 1,
                index: 0,
            };
            self.perms[d] = permutation(len, self.perm_seed(d, pos.epoch + 1));
        } else {
            self.cursor.positions[d].index += 1;
        }
        (d, &self.datasets[d].tasks[idx])
    }

    pub fn cursor(&self) -> Cursor {
        self.cursor.clone()
    }

    /// Continues from a saved cursor (which must fit these datasets).
    pub fn restore(&mut self, cursor: Cursor) -> Result<()> {
        if cursor.positions.len() != self.datasets.len() {
            return Err(EnvError::Cursor(format!(
                "{} positions for {} datasets",
                cursor.positions.len(),
                self.datasets.len()
            )));
        }
        for (p, d) in cursor.positions.iter().zip(&self.datasets) {
            if p.index >= d.tasks.len() {
                return Err(EnvError::Cursor(format!(
                    "position {} in {} which has {} tasks",
                    p.index,
                    d.path.display(),
                    d.tasks.len()
                )));
            }
        }
        self.cursor = cursor;
        self.rebuild_perms();
        Ok(())
    }
}

/// The task sets of a `[data]` section.
pub struct TaskSets {
    pub train: Vec<Dataset>,
    pub validation: Vec<Task>,
    pub test: Vec<Task>,
    pub reports: Vec<LoadReport>,
}

impl TaskSets {
    /// Loads every file of `cfg`; holds `validation_fraction` of each train file out for
    /// validation when no validation file is given.
    pub fn load(cfg: &DataConfig) -> Result<TaskSets> {
        let mut reports = Vec::new();
        let mut load = |p: &PathBuf| -> Result<Vec<Task>> {
            let (tasks, rep) = load_tasks(p, cfg.skip_bad_rows)?;
            reports.push(rep);
            Ok(tasks)
        };
        let mut validation = Vec::new();
        for p in &cfg.validation {
            validation.extend(load(p)?);
        }
        let mut train = Vec::new();
        for d in &cfg.train {
            let mut tasks = load(&d.path)?;
            if cfg.validation.is_empty() && cfg.validation_fraction > 0.0 {
                let (t, v) = hold_out(tasks, cfg.validation_fraction, cfg.seed);
                validation.extend(v);
                tasks = t;
            }
            train.push(Dataset {
                path: d.path.clone(),
                weight: d.weight,
                tasks,
            });
        }
        let mut test = Vec::new();
        for p in &cfg.test {
            test.extend(load(p)?);
        }
        Ok(TaskSets {
            train,
            validation,
            test,
            reports,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tasks(prefix: &str, n: usize) -> Vec<Task> {
        (0..n)
            .map(|i| Task {
                id: format!("{prefix}{i}"),
                prompt: String::new(),
            })
            .collect()
    }

    #[test]
    fn hold_out_is_deterministic_and_near_fraction() {
        let (t, v) = hold_out(tasks("q", 2000), 0.05, 0);
        assert_eq!(t.len() + v.len(), 2000);
        assert!((60..=140).contains(&v.len()), "{}", v.len());
        let (_, v2) = hold_out(tasks("q", 2000), 0.05, 0);
        assert_eq!(v, v2);
        // Adding rows does not move existing ones.
        let (_, v3) = hold_out(tasks("q", 3000), 0.05, 0);
        assert!(v.iter().all(|x| v3.contains(x)));
    }

    #[test]
    fn mixer_follows_weights_epochs_and_resumes() {
        let ds = vec![
            Dataset {
                path: "a".into(),
                weight: 3.0,
                tasks: tasks("a", 5),
            },
            Dataset {
                path: "b".into(),
                weight: 1.0,
                tasks: tasks("b", 7),
            },
        ];
        let mut m = Mixer::new(ds.clone(), 9).unwrap();
        let mut from_a = 0;
        let mut first: Vec<String> = Vec::new();
        for _ in 0..4000 {
            let (d, t) = m.next_task();
            from_a += (d == 0) as usize;
            if first.len() < 5 && d == 0 {
                first.push(t.id.clone());
            }
        }
        assert!((2800..3200).contains(&from_a), "{from_a}");
        // An epoch visits every task once.
        first.sort();
        assert_eq!(first, vec!["a0", "a1", "a2", "a3", "a4"]);
        // Save, draw, restore: the same stream again.
        let saved = m.cursor();
        let a: Vec<String> = (0..50).map(|_| m.next_task().1.id.clone()).collect();
        let mut m2 = Mixer::new(ds, 9).unwrap();
        m2.restore(saved.clone()).unwrap();
        let b: Vec<String> = (0..50).map(|_| m2.next_task().1.id.clone()).collect();
        assert_eq!(a, b);
        let json = serde_json::to_string(&saved).unwrap();
        assert_eq!(serde_json::from_str::<Cursor>(&json).unwrap(), saved);
        assert!(m2
            .restore(Cursor {
                draws: 0,
                positions: vec![]
            })
            .is_err());
    }
}
