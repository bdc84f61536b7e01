//! Typed reads of a JSON object's fields, each error naming the field's path, and the sampling
//! fields every generation route shares.

use serde_json::{Map, Value};

use super::{Sampling, IGNORED};
use crate::error::ApiError;

pub(super) fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Typed reads of an object's fields, each error naming `prefix.key`.
pub(super) struct Fields<'a> {
    map: &'a Map<String, Value>,
    prefix: String,
}

impl<'a> Fields<'a> {
    pub(super) fn new(map: &'a Map<String, Value>, prefix: &str) -> Self {
        Fields {
            map,
            prefix: prefix.to_string(),
        }
    }

    pub(super) fn path(&self, key: &str) -> String {
        if self.prefix.is_empty() {
            key.to_string()
        } else {
            format!("{}.{key}", self.prefix)
        }
    }

    pub(super) fn get(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    pub(super) fn only(&self, allowed: &[&str]) -> Result<(), ApiError> {
        for k in self.map.keys() {
            let ignored = self.prefix.is_empty() && IGNORED.contains(&k.as_str());
            if !(allowed.contains(&k.as_str()) || ignored) {
                return Err(ApiError::field(
                    self.path(k),
                    format!("unknown field (accepted: {})", allowed.join(", ")),
                ));
            }
        }
        Ok(())
    }

    pub(super) fn str(&self, key: &str) -> Result<Option<&'a str>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(ApiError::field(
                self.path(key),
                format!("must be a string, not {}", kind(v)),
            )),
        }
    }

    pub(super) fn bool(&self, key: &str) -> Result<Option<bool>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(ApiError::field(
                self.path(key),
                format!("must be true or false, not {}", kind(v)),
            )),
        }
    }

    pub(super) fn f64_in(&self, key: &str, lo: f64, hi: f64) -> Result<Option<f64>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Number(n)) => match n.as_f64() {
                Some(x) if x >= lo && x <= hi => Ok(Some(x)),
                _ => Err(ApiError::field(
                    self.path(key),
                    format!("must be a number in [{lo}, {hi}], not {n}"),
                )),
            },
            Some(v) => Err(ApiError::field(
                self.path(key),
                format!("must be a number, not {}", kind(v)),
            )),
        }
    }

    pub(super) fn uint_in(&self, key: &str, lo: u64, hi: u64) -> Result<Option<u64>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Number(n)) => match n.as_u64() {
                Some(x) if x >= lo && x <= hi => Ok(Some(x)),
                _ => Err(ApiError::field(
                    self.path(key),
                    format!("must be an integer in [{lo}, {hi}], not {n}"),
                )),
            },
            Some(v) => Err(ApiError::field(
                self.path(key),
                format!("must be an integer, not {}", kind(v)),
            )),
        }
    }

    pub(super) fn array(&self, key: &str) -> Result<Option<&'a Vec<Value>>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Array(a)) => Ok(Some(a)),
            Some(v) => Err(ApiError::field(
                self.path(key),
                format!("must be an array, not {}", kind(v)),
            )),
        }
    }

    pub(super) fn ids(&self, key: &str) -> Result<Option<Vec<u32>>, ApiError> {
        let Some(a) = self.array(key)? else {
            return Ok(None);
        };
        a.iter()
            .enumerate()
            .map(|(i, v)| {
                v.as_u64()
                    .filter(|&x| x <= u64::from(u32::MAX))
                    .map(|x| x as u32)
                    .ok_or_else(|| {
                        ApiError::field(
                            format!("{}[{i}]", self.path(key)),
                            "must be a token id (an integer ≥ 0)",
                        )
                    })
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }
}

pub(super) fn as_object<'a>(v: &'a Value, path: &str) -> Result<&'a Map<String, Value>, ApiError> {
    v.as_object()
        .ok_or_else(|| ApiError::field(path, format!("must be an object, not {}", kind(v))))
}

/// The sampling fields of a request (`max_tokens` capped at `max_tokens_cap` by the caller).
pub(super) fn sampling(f: &Fields<'_>) -> Result<Sampling, ApiError> {
    for key in ["presence_penalty", "frequency_penalty"] {
        if let Some(x) = f.f64_in(key, -2.0, 2.0)? {
            if x != 0.0 {
                return Err(ApiError::field(key, "penalties are not supported (only 0)"));
            }
        }
    }
    let max_tokens = match f.uint_in("max_completion_tokens", 1, 1 << 20)? {
        Some(m) => Some(m),
        None => f.uint_in("max_tokens", 1, 1 << 20)?,
    };
    let stop = match f.get("stop") {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) if a.len() <= 16 => a
            .iter()
            .enumerate()
            .map(|(i, v)| {
                v.as_str()
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
                    .ok_or_else(|| {
                        ApiError::field(format!("stop[{i}]"), "must be a non-empty string")
                    })
            })
            .collect::<Result<_, _>>()?,
        Some(_) => {
            return Err(ApiError::field(
                "stop",
                "must be a string or an array of at most 16 strings",
            ))
        }
    };
    Ok(Sampling {
        temperature: f.f64_in("temperature", 0.0, 2.0)?,
        top_p: match f.f64_in("top_p", 0.0, 1.0)? {
            Some(0.0) => return Err(ApiError::field("top_p", "must be in (0, 1]")),
            p => p,
        },
        top_k: match f.get("top_k").and_then(Value::as_i64) {
            Some(-1) => Some(0),
            _ => f.uint_in("top_k", 0, 1 << 20)?.map(|k| k as usize),
        },
        max_tokens: max_tokens.map(|m| m as usize),
        seed: match f.get("seed").and_then(Value::as_i64) {
            Some(s) if s < 0 => Some(s as u64),
            _ => f.uint_in("seed", 0, u64::MAX)?,
        },
        stop,
        n: f.uint_in("n", 1, 16)?.unwrap_or(1) as usize,
    })
}

pub(super) const SAMPLING_KEYS: &[&str] = &[
    "temperature",
    "top_p",
    "top_k",
    "max_tokens",
    "max_completion_tokens",
    "seed",
    "stop",
    "n",
    "presence_penalty",
    "frequency_penalty",
];

pub(super) fn keys(extra: &[&'static str]) -> Vec<&'static str> {
    let mut k: Vec<&str> = SAMPLING_KEYS.to_vec();
    k.extend_from_slice(extra);
    k
}
