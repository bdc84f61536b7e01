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
//!   of several searches (a hybrid of both tools) without copying an id;
//! - `submit({"top": 10})` submits the first 10 distinct ids of those results in call order, and
//!   `submit({"top": 10, "interleave": true})` takes them round-robin across the searches (1st of
//!   each, then 2nd of each, …): a whole ranked list in a few tokens, for a model that cannot yet
//!   count out `[1, 2, …, 10]`. `top` past `final_k` is refused under `submit_excess = "refuse"`.
//!   With `env.submit_rrf`, `submit({"top": 10, "rrf": true})` fuses the searches by reciprocal
//!   rank, as the `hybrid-rrf` baseline does (ids found by several searches first).
//!
//! The trajectory keeps the arguments the model wrote; the resolved ids are the call's
//! `result_ids`.

use mtrl_core::config::SubmitExcess;
use mtrl_core::trajectory::ToolCallRecord;
use mtrl_core::EnvConfig;
use serde_json::{Map, Value};

use crate::tool::Tool;
use crate::tools::clean_ids;

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
        return resolve_submit(cfg, tool, map, earlier);
    }
    if cfg.default_query && !map.contains_key("query") && takes_query(tool) {
        let mut out = map.clone();
        out.insert("query".into(), Value::String(question.to_string()));
        return Ok(Value::Object(out));
    }
    Ok(arguments.clone())
}

/// `submit` with `hits` or `top` resolved into `doc_ids` (unchanged when neither is given or the
/// shortcut is off).
fn resolve_submit(
    cfg: &EnvConfig,
    tool: &dyn Tool,
    map: &Map<String, Value>,
    earlier: &[ToolCallRecord],
) -> Result<Value, String> {
    let has_hits = map.contains_key("hits");
    let has_top = map.contains_key("top");
    let has_rrf = cfg.submit_rrf && map.contains_key("rrf");
    if !cfg.submit_hits || !(has_hits || has_top || has_rrf || map.contains_key("interleave")) {
        return Ok(Value::Object(map.clone()));
    }
    if [map.contains_key("doc_ids"), has_hits, has_top]
        .iter()
        .filter(|&&b| b)
        .count()
        > 1
    {
        return Err("give one of `doc_ids`, `hits` or `top`".into());
    }
    // Every successful search of the episode, in call order.
    let searches: Vec<&Vec<String>> = earlier
        .iter()
        .filter(|c| c.error.is_none() && c.name != tool.name())
        .map(|c| &c.result_ids)
        .collect();
    let ids = if has_hits {
        if map.contains_key("interleave") {
            return Err("`interleave` goes with `top`, not with `hits`".into());
        }
        if has_rrf {
            return Err("`rrf` goes with `top`, not with `hits`".into());
        }
        by_rank(&map["hits"], &searches)?
    } else {
        let Some(top) = map.get("top") else {
            let key = if has_rrf { "rrf" } else { "interleave" };
            return Err(format!(
                "`{key}` goes with `top`: e.g. {{\"top\": 10, \"{key}\": true}}"
            ));
        };
        let n = top
            .as_u64()
            .filter(|&n| n >= 1)
            .ok_or_else(|| format!("`top` holds {top}, not a count (1, 2, …)"))?
            as usize;
        if cfg.submit_excess == SubmitExcess::Refuse && n > cfg.final_k {
            return Err(format!(
                "submit takes at most {} documents; `top` asked for {n}",
                cfg.final_k
            ));
        }
        let flag = |key: &str| match map.get(key) {
            None => Ok(false),
            Some(v) => v
                .as_bool()
                .ok_or_else(|| format!("`{key}` holds {v}, not true or false")),
        };
        let interleave = flag("interleave")?;
        let rrf = has_rrf && flag("rrf")?;
        if interleave && rrf {
            return Err("give one of `interleave` or `rrf`".into());
        }
        if searches.is_empty() {
            return Err("`top` takes the results of a search, and there was none yet".into());
        }
        let order = Order::of(rrf, interleave);
        top_hits(&searches, n, order)
    };
    let mut out = map.clone();
    for key in ["hits", "top", "interleave"] {
        out.remove(key);
    }
    if cfg.submit_rrf {
        out.remove("rrf");
    }
    out.insert("doc_ids".into(), Value::Array(ids));
    Ok(Value::Object(out))
}

/// `hits`: the ids at these 1-based ranks, every search numbered in call order.
fn by_rank(ranks: &Value, searches: &[&Vec<String>]) -> Result<Vec<Value>, String> {
    let ranks = ranks
        .as_array()
        .ok_or("`hits` must be a list of 1-based ranks, e.g. [1, 2, 3]")?;
    if searches.is_empty() {
        return Err("`hits` refers to the results of a search, and there was none yet".into());
    }
    let all: Vec<&String> = searches.iter().flat_map(|ids| ids.iter()).collect();
    ranks
        .iter()
        .map(|r| {
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
            Ok(Value::String((*id).clone()))
        })
        .collect()
}

/// How `top` orders the searches' hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// Concatenated in call order.
    Calls,
    /// 1st of each search, then 2nd of each, …
    RoundRobin,
    /// Reciprocal-rank fusion ([`crate::scripted::rrf`], as `hybrid-rrf`).
    Rrf,
}

impl Order {
    /// The order a submit's `rrf` and `interleave` flags name (`rrf` wins; neither: call order).
    pub fn of(rrf: bool, interleave: bool) -> Order {
        if rrf {
            Order::Rrf
        } else if interleave {
            Order::RoundRobin
        } else {
            Order::Calls
        }
    }
}

/// `top`: the first `n` distinct ids of the searches' results in `order`; fewer when fewer were
/// shown.
fn top_hits(searches: &[&Vec<String>], n: usize, order: Order) -> Vec<Value> {
    let all: Vec<&String> = searches.iter().flat_map(|ids| ids.iter()).collect();
    let order: Vec<String> = match order {
        Order::RoundRobin => {
            let lens: Vec<usize> = searches.iter().map(|ids| ids.len()).collect();
            round_robin(&lens)
                .into_iter()
                .map(|r| all[r - 1].clone())
                .collect()
        }
        Order::Rrf => {
            let lists: Vec<Vec<String>> = searches.iter().map(|ids| (*ids).clone()).collect();
            crate::scripted::rrf(&lists)
        }
        Order::Calls => all.into_iter().cloned().collect(),
    };
    clean_ids(&order, |_| true, n)
        .0
        .into_iter()
        .map(Value::String)
        .collect()
}

/// The 1-based ranks of searches that returned `lens` hits (numbered in call order, as `hits`
/// numbers them), round-robin: the 1st of each search, then the 2nd of each, …
pub fn round_robin(lens: &[usize]) -> Vec<usize> {
    let offsets: Vec<usize> = lens
        .iter()
        .scan(0, |total, &l| {
            let o = *total;
            *total += l;
            Some(o)
        })
        .collect();
    let longest = lens.iter().copied().max().unwrap_or(0);
    (0..longest)
        .flat_map(|i| {
            lens.iter()
                .zip(&offsets)
                .filter(move |(l, _)| i < **l)
                .map(move |(_, o)| o + i + 1)
        })
        .collect()
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

    #[test]
    fn top_takes_the_first_distinct_hits_in_call_order_or_round_robin() {
        let cfg = EnvConfig {
            submit_hits: true,
            final_k: 4,
            submit_excess: SubmitExcess::Refuse,
            ..EnvConfig::default()
        };
        let submit = SubmitTool::new(4, None);
        let earlier = vec![
            search("bm25_search", &["a", "b", "c"], false),
            search("vector_search", &["x"], true),
            search("vector_search", &["b", "d"], false),
        ];
        let go = |args: Value| resolve(&cfg, &submit, &args, "q", &earlier);
        assert_eq!(
            go(json!({"top": 4})).unwrap(),
            json!({"doc_ids": ["a", "b", "c", "d"]})
        );
        // Round-robin: a, b (1st of each), b again (skipped), d, then c.
        assert_eq!(
            go(json!({"top": 4, "interleave": true})).unwrap(),
            json!({"doc_ids": ["a", "b", "d", "c"]})
        );
        assert_eq!(
            go(json!({"top": 3, "interleave": true})).unwrap(),
            json!({"doc_ids": ["a", "b", "d"]})
        );
        assert_eq!(
            go(json!({"top": 2, "interleave": false})).unwrap(),
            json!({"doc_ids": ["a", "b"]})
        );
        let two = vec![
            search("bm25_search", &["a", "b", "c"], false),
            search("vector_search", &["d", "a", "e"], false),
        ];
        let rr = resolve(
            &cfg,
            &submit,
            &json!({"top": 4, "interleave": true}),
            "q",
            &two,
        );
        assert_eq!(rr.unwrap(), json!({"doc_ids": ["a", "d", "b", "c"]}));
        // Fewer than asked when fewer were shown.
        let one = &two[..1];
        let out = resolve(&cfg, &submit, &json!({"top": 4}), "q", one).unwrap();
        assert_eq!(out, json!({"doc_ids": ["a", "b", "c"]}));
        for (bad, needle) in [
            (json!({"top": 5}), "at most 4"),
            (json!({"top": 0}), "not a count"),
            (json!({"top": "3"}), "not a count"),
            (json!({"top": 2, "interleave": 1}), "not true or false"),
            (json!({"interleave": true}), "goes with `top`"),
            (json!({"hits": [1], "interleave": true}), "not with `hits`"),
            (json!({"top": 2, "hits": [1]}), "one of"),
            (json!({"top": 2, "doc_ids": []}), "one of"),
        ] {
            let err = go(bad.clone()).unwrap_err();
            assert!(err.contains(needle), "{bad}: {err}");
        }
        assert!(resolve(&cfg, &submit, &json!({"top": 1}), "q", &[]).is_err());
        // Past final_k is cut, not refused, under submit_excess = "cut".
        let cut = EnvConfig {
            submit_excess: SubmitExcess::Cut,
            ..cfg.clone()
        };
        assert!(resolve(&cut, &submit, &json!({"top": 9}), "q", &earlier).is_ok());
    }

    #[test]
    fn top_with_rrf_fuses_the_searches_as_hybrid_rrf_does() {
        let cfg = EnvConfig {
            submit_hits: true,
            submit_rrf: true,
            final_k: 4,
            ..EnvConfig::default()
        };
        let submit = SubmitTool::new(4, None);
        let two = vec![
            search("bm25_search", &["a", "b", "c"], false),
            search("vector_search", &["d", "b", "a"], false),
        ];
        let go = |cfg: &EnvConfig, args: Value| resolve(cfg, &submit, &args, "q", &two);
        // a: 1/61 + 1/63, b: 2/62, then d (1/61) before c (1/63).
        let fused = crate::scripted::rrf(&[
            vec!["a".into(), "b".into(), "c".into()],
            vec!["d".into(), "b".into(), "a".into()],
        ]);
        assert_eq!(fused, ["a", "b", "d", "c"]);
        assert_eq!(
            go(&cfg, json!({"top": 3, "rrf": true})).unwrap(),
            json!({"doc_ids": ["a", "b", "d"]})
        );
        assert_eq!(
            go(&cfg, json!({"top": 3, "rrf": false})).unwrap(),
            json!({"doc_ids": ["a", "b", "c"]})
        );
        for (bad, needle) in [
            (json!({"top": 2, "rrf": true, "interleave": true}), "one of"),
            (json!({"top": 2, "rrf": "yes"}), "not true or false"),
            (json!({"rrf": true}), "goes with `top`"),
            (json!({"hits": [1], "rrf": true}), "not with `hits`"),
        ] {
            let err = go(&cfg, bad.clone()).unwrap_err();
            assert!(err.contains(needle), "{bad}: {err}");
        }
        // Switched off (`env.submit_rrf = false`): `rrf` is left for the tool to refuse.
        let off = EnvConfig {
            submit_rrf: false,
            ..cfg.clone()
        };
        let out = go(&off, json!({"top": 3, "rrf": true})).unwrap();
        assert_eq!(out, json!({"doc_ids": ["a", "b", "c"], "rrf": true}));
        assert!(submit.call(&out).is_err());
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
