//! Flattening for MLflow: a TOML config into `section.key = value` params, a step record (JSON)
//! into its numeric leaves. Pure functions.

use serde_json::Value;

/// `[train] lr = 0.01` → `("train.lr", "0.01")`; arrays of tables get their index
/// (`data.train.0.path`); other arrays and scalars are written as TOML (strings without quotes).
pub fn toml_params(v: &toml::Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    walk_toml("", v, &mut out);
    out
}

fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_string()
    } else {
        format!("{prefix}.{key}")
    }
}

fn walk_toml(prefix: &str, v: &toml::Value, out: &mut Vec<(String, String)>) {
    match v {
        toml::Value::Table(t) => {
            for (k, v) in t {
                walk_toml(&join(prefix, k), v, out);
            }
        }
        toml::Value::Array(a) if a.iter().any(|x| x.is_table()) => {
            for (i, x) in a.iter().enumerate() {
                walk_toml(&join(prefix, &i.to_string()), x, out);
            }
        }
        toml::Value::String(s) => out.push((prefix.to_string(), s.clone())),
        other => out.push((prefix.to_string(), other.to_string())),
    }
}

/// Every number in `rec`, keyed by its path (`failures.no_answer`, `staleness_counts.0`);
/// `step` itself is left out (it is the metric's step), and so is `format_version`; booleans and strings are skipped.
pub fn numeric_leaves(rec: &Value) -> Vec<(String, f64)> {
    let mut out = Vec::new();
    walk_json("", rec, &mut out);
    out.retain(|(k, _)| k != "step" && k != "format_version");
    out
}

fn walk_json(prefix: &str, v: &Value, out: &mut Vec<(String, f64)>) {
    match v {
        Value::Object(m) => {
            for (k, v) in m {
                walk_json(&join(prefix, k), v, out);
            }
        }
        Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                walk_json(&join(prefix, &i.to_string()), x, out);
            }
        }
        Value::Number(n) => {
            if let Some(f) = n.as_f64() {
                out.push((prefix.to_string(), f));
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_is_flattened() {
        let v: toml::Value = toml::from_str(
            "name = \"x\"\n[train]\nlr = 0.01\nseed = 3\n[search.bm25]\nstopwords = [\"a\", \"b\"]\n\
             [[data.train]]\npath = \"t.jsonl\"\nweight = 2.0\n",
        )
        .unwrap();
        let p = toml_params(&v);
        let get = |k: &str| p.iter().find(|(x, _)| x == k).map(|(_, v)| v.as_str());
        assert_eq!(get("name"), Some("x"));
        assert_eq!(get("train.lr"), Some("0.01"));
        assert_eq!(get("train.seed"), Some("3"));
        assert_eq!(get("search.bm25.stopwords"), Some("[\"a\", \"b\"]"));
        assert_eq!(get("data.train.0.path"), Some("t.jsonl"));
        assert_eq!(get("data.train.0.weight"), Some("2.0"));
    }

    #[test]
    fn record_leaves() {
        let rec = serde_json::json!({
            "step": 3, "loss": 0.5, "ok": true, "name": "x",
            "failures": {"no_answer": 2}, "staleness_counts": [4, 0]
        });
        let mut got = numeric_leaves(&rec);
        got.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(
            got,
            vec![
                ("failures.no_answer".to_string(), 2.0),
                ("loss".to_string(), 0.5),
                ("staleness_counts.0".to_string(), 4.0),
                ("staleness_counts.1".to_string(), 0.0),
            ]
        );
    }
}
