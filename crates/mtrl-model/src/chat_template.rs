//! The `chat_template` of `tokenizer_config.json`, rendered with minijinja.
//!
//! transformers renders templates with Python Jinja2, so two things are added to minijinja:
//! - `tojson` as Python `json.dumps(x, ensure_ascii=False)`: separators `", "` / `": "`, key order
//!   kept, no HTML escaping (minijinja's own is compact and escapes `<>&'`);
//! - the Python string/dict methods real templates call (`startswith`, `endswith`, `split`,
//!   `strip`/`lstrip`/`rstrip`, `replace`, `upper`/`lower`, `items`/`keys`/`values`/`get`), and
//!   `raise_exception`.
//!
//! Inputs are any `Serialize` value; with this crate's `preserve_order` features, the key order of
//! `serde_json` objects and structs is kept, which `tojson` must reproduce byte for byte.

use minijinja::value::{Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind, State};
use serde::Serialize;

use crate::error::{ModelError, Result};

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
}

/// Options of one rendering.
#[derive(Debug, Clone, Copy, Default)]
pub struct ChatOptions {
    /// Append the assistant turn header (`<|im_start|>assistant\n`).
    pub add_generation_prompt: bool,
    /// Passed to the template only when set (Qwen3: `Some(false)` adds an empty think block).
    pub enable_thinking: Option<bool>,
}

fn py_float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 {
            "Infinity".into()
        } else {
            "-Infinity".into()
        };
    }
    let s = format!("{f:?}");
    if let Some((m, e)) = s.split_once('e') {
        let e = e
            .strip_prefix('-')
            .map(|x| format!("-{x:0>2}"))
            .unwrap_or_else(|| format!("+{e:0>2}"));
        return format!("{m}e{e}");
    }
    s
}

/// Python `json.dumps(v, ensure_ascii=False)`.
pub fn python_json(v: &Value, out: &mut String) -> std::result::Result<(), Error> {
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => {
            if let Ok(i) = i64::try_from(v.clone()) {
                if v.as_i64().is_some() || !v.to_string().contains('.') {
                    out.push_str(&i.to_string());
                    return Ok(());
                }
            }
            let f = f64::try_from(v.clone())?;
            out.push_str(&py_float(f));
        }
        ValueKind::String => {
            let s = v.as_str().unwrap_or_default();
            out.push_str(
                &serde_json::to_string(s)
                    .map_err(|e| Error::new(ErrorKind::BadSerialization, e.to_string()))?,
            );
        }
        ValueKind::Seq | ValueKind::Iterable => {
            out.push('[');
            for (i, item) in v.try_iter()?.enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                python_json(&item, out)?;
            }
            out.push(']');
        }
        ValueKind::Map => {
            out.push('{');
            for (i, key) in v.try_iter()?.enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                let k = key
                    .as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| key.to_string());
                out.push_str(
                    &serde_json::to_string(&k)
                        .map_err(|e| Error::new(ErrorKind::BadSerialization, e.to_string()))?,
                );
                out.push_str(": ");
                python_json(&v.get_item(&key)?, out)?;
            }
            out.push('}');
        }
        _ => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: cannot serialise {}", v.kind()),
            ));
        }
    }
    Ok(())
}

fn tojson(v: Value) -> std::result::Result<Value, Error> {
    let mut s = String::new();
    python_json(&v, &mut s)?;
    Ok(Value::from_safe_string(s))
}

fn strip_chars(s: &str, chars: Option<&str>, left: bool, right: bool) -> String {
    let pred = |c: char| match chars {
        Some(cs) => cs.contains(c),
        None => c.is_whitespace(),
    };
    let mut r = s;
    if left {
        r = r.trim_start_matches(pred);
    }
    if right {
        r = r.trim_end_matches(pred);
    }
    r.to_string()
}

fn arg_str(args: &[Value], i: usize) -> Option<String> {
    args.get(i).and_then(|a| a.as_str().map(str::to_string))
}

/// Python methods on strings and dicts that Hugging Face templates use.
fn py_method(
    _state: &State,
    value: &Value,
    method: &str,
    args: &[Value],
) -> std::result::Result<Value, Error> {
    if let Some(s) = value.as_str() {
        let a0 = arg_str(args, 0);
        return Ok(match method {
            "startswith" => Value::from(a0.is_some_and(|p| s.starts_with(&p))),
            "endswith" => Value::from(a0.is_some_and(|p| s.ends_with(&p))),
            "strip" => Value::from(strip_chars(s, a0.as_deref(), true, true)),
            "lstrip" => Value::from(strip_chars(s, a0.as_deref(), true, false)),
            "rstrip" => Value::from(strip_chars(s, a0.as_deref(), false, true)),
            "upper" => Value::from(s.to_uppercase()),
            "lower" => Value::from(s.to_lowercase()),
            "replace" => Value::from(s.replace(
                &a0.unwrap_or_default(),
                &arg_str(args, 1).unwrap_or_default(),
            )),
            "split" => Value::from(match a0 {
                Some(sep) if !sep.is_empty() => s
                    .split(sep.as_str())
                    .map(str::to_string)
                    .collect::<Vec<_>>(),
                _ => s.split_whitespace().map(str::to_string).collect::<Vec<_>>(),
            }),
            _ => {
                return Err(Error::new(
                    ErrorKind::UnknownMethod,
                    format!("string has no method `{method}`"),
                ))
            }
        });
    }
    if value.kind() == ValueKind::Map {
        return match method {
            "items" => Ok(Value::from(
                value
                    .try_iter()?
                    .map(|k| Ok(Value::from(vec![k.clone(), value.get_item(&k)?])))
                    .collect::<std::result::Result<Vec<_>, Error>>()?,
            )),
            "keys" => Ok(Value::from(value.try_iter()?.collect::<Vec<_>>())),
            "values" => Ok(Value::from(
                value
                    .try_iter()?
                    .map(|k| value.get_item(&k))
                    .collect::<std::result::Result<Vec<_>, Error>>()?,
            )),
            "get" => {
                let key = args.first().cloned().unwrap_or_default();
                let v = value.get_item(&key)?;
                Ok(if v.is_undefined() {
                    args.get(1).cloned().unwrap_or(Value::from(()))
                } else {
                    v
                })
            }
            _ => Err(Error::new(
                ErrorKind::UnknownMethod,
                format!("dict has no method `{method}`"),
            )),
        };
    }
    Err(Error::new(
        ErrorKind::UnknownMethod,
        format!("{} has no method `{method}`", value.kind()),
    ))
}

impl ChatTemplate {
    /// Compiles `source`; `bos`/`eos` are exposed to the template as `bos_token`/`eos_token`.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self> {
        let mut env = Environment::new();
        env.set_unknown_method_callback(py_method);
        env.add_filter("tojson", tojson);
        env.add_function(
            "raise_exception",
            |msg: String| -> std::result::Result<Value, Error> {
                Err(Error::new(ErrorKind::InvalidOperation, msg))
            },
        );
        env.set_trim_blocks(false);
        env.set_lstrip_blocks(false);
        env.add_template_owned("chat", source.to_string())
            .map_err(|e| ModelError::ChatTemplate(format!("does not compile: {e:#}")))?;
        Ok(Self {
            env,
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
        })
    }

    /// Renders `messages` (a list of `{role, content, …}`), with optional `tools` (JSON schemas).
    pub fn render<M: Serialize + ?Sized, T: Serialize + ?Sized>(
        &self,
        messages: &M,
        tools: Option<&T>,
        opts: ChatOptions,
    ) -> Result<String> {
        let tmpl = self
            .env
            .get_template("chat")
            .map_err(|e| ModelError::ChatTemplate(e.to_string()))?;
        let tools = tools
            .map(Value::from_serialize)
            .filter(|t| t.len() != Some(0));
        let mut ctx = vec![
            ("messages", Value::from_serialize(messages)),
            ("tools", tools.unwrap_or(Value::from(()))),
            (
                "add_generation_prompt",
                Value::from(opts.add_generation_prompt),
            ),
            ("bos_token", Value::from(self.bos_token.clone())),
            ("eos_token", Value::from(self.eos_token.clone())),
        ];
        if let Some(t) = opts.enable_thinking {
            ctx.push(("enable_thinking", Value::from(t)));
        }
        let ctx: Value = ctx.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        tmpl.render(ctx)
            .map_err(|e| ModelError::ChatTemplate(format!("render failed: {e:#}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn python_compatible_tojson() {
        let v = Value::from_serialize(json!({"b": 1, "a": [1.5, "x<y>&'\n", null, true], "é": {}}));
        let mut s = String::new();
        python_json(&v, &mut s).unwrap();
        assert_eq!(
            s,
            r#"{"b": 1, "a": [1.5, "x<y>&'\n", null, true], "é": {}}"#
        );
        assert_eq!(py_float(1.0), "1.0");
        assert_eq!(py_float(1e20), "1e+20");
    }

    #[test]
    fn python_string_methods() {
        let t = ChatTemplate::new(
            "{{ s.startswith('a') }}|{{ s.split('-')[-1].lstrip('x') }}|{{ s.strip('a') }}|{{ [1,2,3][::-1] }}",
            "",
            "",
        )
        .unwrap();
        let out = t
            .env
            .get_template("chat")
            .unwrap()
            .render(minijinja::context! { s => "ab-xxc" })
            .unwrap();
        assert_eq!(out, "True|c|b-xxc|[3, 2, 1]");
    }
}
