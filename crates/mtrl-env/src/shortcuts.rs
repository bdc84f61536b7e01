//! Argument shortcuts a configuration may switch on (`env.default_query`, `env.submit_hits`).
//!
//! Both exist for policies too small to copy text: a from-scratch model of a million parameters
//! learns *decisions* (which tool, how many hits, when to stop, which hits to keep) in minutes, but
//! not to copy a question or a list of ids token by token. With the shortcuts its choices still go
//! through the real tools and the real reward:
//! - a search call without `query` searches for the task's question;
//! - `submit({"hits": [1, 3]})` submits the ids at those 1-based ranks, in the order given. The
//!   hits of every successful search call of the episode are numbered in call order: the first
//!   search's k₁ hits are 1…k₁, the next search's continue at k₁+1, so a list can mix the results
//!   of several searches (a hybrid of both tools) without copying an id.
//!
//! The trajectory keeps the arguments the model wrote; the resolved ids are the call's
//! `result_ids`.

use mtrl_core::trajectory::ToolCallRecord;
use mtrl_core::EnvConfig;
use serde_json::Value;

use crate::tool::Tool;

/// The arguments `tool` is called with: `arguments` with the enabled shortcuts resolved, or the
/// error message the model is shown.
pub fn resolve(
    cfg: &EnvConfig,
    tool: &dyn Tool,
    arguments: &Value,
    question: &str,
    earlier: &[ToolCallRecord],
) -> Result<Value, String> {
    let Value::Object(map) = arguments else {
        return Ok(arguments.clone());
    };
    if tool.is_final() {
        if !cfg.submit_hits || !map.contains_key("hits") {
            return Ok(arguments.clone());
        }
        if map.contains_key("doc_ids") {
            return Err("give `doc_ids` or `hits`, not both".into());
        }
        let ranks = map["hits"]
            .as_array()
            .ok_or("`hits` must be a list of 1-based ranks, e.g. [1, 2, 3]")?;
        // Every successful search of the episode, numbered in call order.
        let searches: Vec<&ToolCallRecord> = earlier
            .iter()
            .filter(|c| c.error.is_none() && c.name != tool.name())
            .collect();
        if searches.is_empty() {
            return Err("`hits` refers to the results of a search, and there was none yet".into());
        }
        let all: Vec<&String> = searches.iter().flat_map(|c| &c.result_ids).collect();
        let mut ids = Vec::with_capacity(ranks.len());
        for r in ranks {
            let rank = r
                .as_u64()
                .filter(|&r| r >= 1)
                .ok_or_else(|| format!("`hits` holds {r}, not a rank (1, 2, …)"))?;
            let id = all.get(rank as usize - 1).ok_or_else(|| {
                format!(
                    "hit {rank} is out of range: the searches so far returned {} hits",
                    all.len()
                )
            })?;
            ids.push(Value::String((*id).clone()));
        }
        let mut out = map.clone();
        out.remove("hits");
        out.insert("doc_ids".into(), Value::Array(ids));
        return Ok(Value::Object(out));
    }
    if cfg.default_query && !map.contains_key("query") && takes_query(tool) {
        let mut out = map.clone();
        out.insert("query".into(), Value::String(question.to_string()));
        return Ok(Value::Object(out));
    }
    Ok(arguments.clone())
}

/// Whether `tool`'s schema has a `query` parameter.
fn takes_query(tool: &dyn Tool) -> bool {
    tool.schema()["function"]["parameters"]["properties"]
        .get("query")
        .is_some()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::tools::SubmitTool;

    fn search(name: &str, ids: &[&str], error: bool) -> ToolCallRecord {
        ToolCallRecord {
            turn: 1,
            name: name.into(),
            arguments: json!({}),
            result_ids: ids.iter().map(|s| s.to_string()).collect(),
            latency_ms: 0.0,
            error: error.then(|| "boom".to_string()),
        }
    }

    #[test]
    fn hits_number_every_good_search_in_order() {
        let cfg = EnvConfig {
            submit_hits: true,
            ..EnvConfig::default()
        };
        let submit = SubmitTool::new(10, None);
        let earlier = vec![
            search("bm25_search", &["a", "b", "c"], false),
            search("vector_search", &[], true),
            search("vector_search", &["d", "a"], false),
        ];
        let out = resolve(&cfg, &submit, &json!({"hits": [3, 1, 4, 5]}), "q", &earlier).unwrap();
        assert_eq!(out, json!({"doc_ids": ["c", "a", "d", "a"]}));
        let err = resolve(&cfg, &submit, &json!({"hits": [6]}), "q", &earlier).unwrap_err();
        assert!(err.contains("hit 6") && err.contains("returned 5"), "{err}");
        for bad in [
            json!({"hits": [0]}),
            json!({"hits": "1"}),
            json!({"hits": [1], "doc_ids": []}),
        ] {
            assert!(
                resolve(&cfg, &submit, &bad, "q", &earlier).is_err(),
                "{bad}"
            );
        }
        assert!(resolve(&cfg, &submit, &json!({"hits": [1]}), "q", &[]).is_err());
        // Switched off: passed through for the tool to refuse.
        let off = EnvConfig::default();
        let args = json!({"hits": [1]});
        assert_eq!(resolve(&off, &submit, &args, "q", &earlier).unwrap(), args);
    }

    struct Echo;

    impl mtrl_search::Retriever for Echo {
        fn name(&self) -> &'static str {
            "echo"
        }
        fn search(&self, q: &str, _k: usize) -> mtrl_search::Result<Vec<mtrl_search::Hit>> {
            Ok(vec![mtrl_search::Hit {
                doc_id: q.into(),
                score: 1.0,
                title: String::new(),
                snippet: String::new(),
            }])
        }
    }

    #[test]
    fn a_missing_query_is_the_question_when_enabled() {
        let tool = crate::tools::SearchTool::new("s", "d", std::sync::Arc::new(Echo), 1, 5, 0);
        let on = EnvConfig {
            default_query: true,
            ..EnvConfig::default()
        };
        let out = resolve(&on, &tool, &json!({"k": 2}), "wing flutter", &[]).unwrap();
        assert_eq!(out, json!({"k": 2, "query": "wing flutter"}));
        let own = json!({"query": "mine"});
        assert_eq!(resolve(&on, &tool, &own, "wing flutter", &[]).unwrap(), own);
        let off = EnvConfig::default();
        assert_eq!(
            resolve(&off, &tool, &json!({}), "x", &[]).unwrap(),
            json!({})
        );
    }
}
