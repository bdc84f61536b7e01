//! `[data]`: task files for training, validation and test.
//!
//! ```toml
//! [data]
//! train = ["../runs/data/cranfield/train.jsonl", "more.parquet"]   # or one string
//! weights = [3.0, 1.0]           # sampling weight per train file (default: equal)
//! validation = "../runs/data/cranfield/validation.jsonl"           # optional
//! validation_fraction = 0.05     # held out of each train file when `validation` is absent
//! test = ["../runs/data/cranfield/test.jsonl"]
//! skip_bad_rows = false          # skip (and count) malformed task rows instead of failing
//! seed = 0                       # shuffling and mixing
//! ```

use std::path::PathBuf;

use serde::Deserialize;

use super::Ctx;
use crate::error::Result;

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    fn into_vec(self) -> Vec<String> {
        match self {
            OneOrMany::One(s) => vec![s],
            OneOrMany::Many(v) => v,
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataSpec {
    pub train: Option<OneOrMany>,
    pub weights: Option<Vec<f64>>,
    pub validation: Option<OneOrMany>,
    pub validation_fraction: Option<f64>,
    pub test: Option<OneOrMany>,
    pub skip_bad_rows: Option<bool>,
    pub seed: Option<u64>,
}

/// A task file and its sampling weight.
#[derive(Debug, Clone, PartialEq)]
pub struct DatasetConfig {
    pub path: PathBuf,
    pub weight: f64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct DataConfig {
    pub train: Vec<DatasetConfig>,
    pub validation: Vec<PathBuf>,
    /// Fraction of each train file held out for validation when `validation` is empty.
    pub validation_fraction: f64,
    pub test: Vec<PathBuf>,
    pub skip_bad_rows: bool,
    pub seed: u64,
}

impl DataSpec {
    pub(crate) fn validate(self, ctx: &Ctx<'_>) -> Result<DataConfig> {
        let paths = |key: &str, v: Option<OneOrMany>| -> Result<Vec<PathBuf>> {
            let v = v.map(OneOrMany::into_vec).unwrap_or_default();
            v.iter()
                .map(|p| {
                    ctx.non_empty(key, p)?;
                    Ok(ctx.resolve(p))
                })
                .collect()
        };
        let train = paths("data.train", self.train)?;
        let weights = match self.weights {
            None => vec![1.0; train.len()],
            Some(w) if w.len() != train.len() => {
                return Err(ctx.invalid(
                    "data.weights",
                    format!("{} weights for {} train files", w.len(), train.len()),
                ))
            }
            Some(w) => w,
        };
        if let Some(w) = weights.iter().find(|w| !(w.is_finite() && **w > 0.0)) {
            return Err(ctx.invalid("data.weights", format!("{w} is not a positive number")));
        }
        let validation_fraction = self.validation_fraction.unwrap_or(0.05);
        if !(0.0..1.0).contains(&validation_fraction) {
            return Err(ctx.invalid(
                "data.validation_fraction",
                format!("{validation_fraction} is outside [0, 1)"),
            ));
        }
        Ok(DataConfig {
            train: train
                .into_iter()
                .zip(weights)
                .map(|(path, weight)| DatasetConfig { path, weight })
                .collect(),
            validation: paths("data.validation", self.validation)?,
            validation_fraction,
            test: paths("data.test", self.test)?,
            skip_bad_rows: self.skip_bad_rows.unwrap_or(false),
            seed: self.seed.unwrap_or(0),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::Config;

    fn load(text: &str) -> crate::Result<Config> {
        Config::from_toml_str(text, Path::new("configs/d.toml"))
    }

    #[test]
    fn one_or_many_paths_resolve_with_default_weights() {
        let d = load("[data]\ntrain = 'a.jsonl'\ntest = ['t1.csv', '/abs/t2.parquet']\n")
            .unwrap()
            .data
            .unwrap();
        assert_eq!(d.train.len(), 1);
        assert_eq!(d.train[0].path, Path::new("configs/a.jsonl"));
        assert_eq!(d.train[0].weight, 1.0);
        assert_eq!(d.test[1], Path::new("/abs/t2.parquet"));
        assert_eq!(d.validation_fraction, 0.05);
        assert!(d.validation.is_empty() && !d.skip_bad_rows);
    }

    #[test]
    fn mistyped_key_names_file_and_key() {
        let msg = load("[data]\nvalidation_fractoin = 0.1\n")
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("validation_fractoin") && msg.contains("configs/d.toml"),
            "{msg}"
        );
    }

    #[test]
    fn weights_and_fraction_are_checked() {
        let msg = load("[data]\ntrain = ['a', 'b']\nweights = [1.0]\n")
            .unwrap_err()
            .to_string();
        assert!(msg.contains("data.weights"), "{msg}");
        let msg = load("[data]\ntrain = ['a']\nweights = [-1.0]\n")
            .unwrap_err()
            .to_string();
        assert!(msg.contains("data.weights"), "{msg}");
        let msg = load("[data]\nvalidation_fraction = 1.5\n")
            .unwrap_err()
            .to_string();
        assert!(msg.contains("data.validation_fraction"), "{msg}");
    }
}
