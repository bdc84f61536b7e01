//! `[env]`: budgets of an episode, the reward, and how tool results are shown.
//!
//! ```toml
//! [env]
//! max_turns = 8                # assistant messages per episode
//! max_tokens_per_turn = 512    # a message not ended within this many tokens fails the episode
//! max_context_tokens = 8192    # prompt + transcript (token mode)
//! max_calls_per_turn = 8       # tool calls executed per message (more are answered with an error)
//! final_k = 10                 # submitted ids scored
//! submit_excess = "cut"        # a submit listing more than final_k ids: "cut" (the first final_k
//!                              # are scored) or "refuse" (an error the model can fix next turn)
//! max_search_k = 50            # largest `k` a search tool accepts
//! snippet_words = 60           # snippet budget per hit, in words (0: titles only)
//! hits = "full"                # how a search result is shown: "full" ({doc_id, title, snippet}),
//!                              # "titles" ({doc_id, title}) or "ids" (["12", "884", …])
//! default_query = false        # a search call may leave out `query`: the task's question is searched
//! submit_hits = false          # `submit` also takes `hits`: 1-based ranks of the hits shown (searches numbered in order),
//!                              # or `top` (+ `interleave`): the first n distinct hits, in order or round-robin
//! submit_rrf = false           # with submit_hits, `top` also takes `"rrf": true`: the first n of the searches'
//!                              # hits fused by reciprocal rank (the ids both tools found first)
//! failure_reward = -1.0
//! reward = "ndcg@10"           # "recall@K", "exact_match", or a weighted sum:
//! # reward = { "ndcg@10" = 0.8, "recall@100" = 0.2 }
//! system_prompt = "…"          # optional; replaces the built-in instructions (tools are still listed)
//! tool_calls = "strict"        # "strict": only <tool_call>{json}</tool_call> blocks are calls;
//!                              # "tolerant": without such a block, JSON objects with a "name" in
//!                              # the message (in Markdown fences or bare) are read as calls too
//! ```

use std::collections::BTreeMap;

use serde::Deserialize;

use super::Ctx;
use crate::error::Result;

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum RewardSpec {
    Name(String),
    Weighted(BTreeMap<String, f64>),
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvSpec {
    pub max_turns: Option<usize>,
    pub max_tokens_per_turn: Option<usize>,
    pub max_context_tokens: Option<usize>,
    pub max_calls_per_turn: Option<usize>,
    pub final_k: Option<usize>,
    pub submit_excess: Option<String>,
    pub max_search_k: Option<usize>,
    pub snippet_words: Option<usize>,
    pub hits: Option<String>,
    pub default_query: Option<bool>,
    pub submit_hits: Option<bool>,
    pub submit_rrf: Option<bool>,
    pub failure_reward: Option<f64>,
    pub reward: Option<RewardSpec>,
    pub system_prompt: Option<String>,
    pub tool_calls: Option<String>,
}

/// One reward function, by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RewardKind {
    /// nDCG@k of the submitted ranking.
    Ndcg(usize),
    /// recall@k of the submitted ranking.
    Recall(usize),
    /// 1 when the submitted answer text matches a reference answer (normalised), else 0.
    ExactMatch,
}

impl RewardKind {
    /// Parses `ndcg@10`, `recall@100`, `exact_match`.
    pub fn parse(name: &str) -> Option<RewardKind> {
        let name = name.trim().to_ascii_lowercase();
        if name == "exact_match" || name == "em" {
            return Some(RewardKind::ExactMatch);
        }
        let (metric, k) = name.split_once('@')?;
        let k: usize = k.parse().ok().filter(|k| (1..=10_000).contains(k))?;
        match metric {
            "ndcg" => Some(RewardKind::Ndcg(k)),
            "recall" => Some(RewardKind::Recall(k)),
            _ => None,
        }
    }

    pub fn name(&self) -> String {
        match self {
            RewardKind::Ndcg(k) => format!("ndcg@{k}"),
            RewardKind::Recall(k) => format!("recall@{k}"),
            RewardKind::ExactMatch => "exact_match".into(),
        }
    }
}

/// How a search tool shows its hits to the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HitFormat {
    /// `[{"doc_id", "title", "snippet"}, …]`.
    #[default]
    Full,
    /// `[{"doc_id", "title"}, …]`.
    Titles,
    /// `["12", "884", …]`: the ids alone, in the same form `submit` takes them (small models copy
    /// them straight into their answer).
    Ids,
}

impl HitFormat {
    /// Parses `full`, `titles`, `ids`.
    pub fn parse(name: &str) -> Option<HitFormat> {
        match name.trim().to_ascii_lowercase().as_str() {
            "full" => Some(HitFormat::Full),
            "titles" => Some(HitFormat::Titles),
            "ids" => Some(HitFormat::Ids),
            _ => None,
        }
    }
}

/// The reward: a weighted sum of named functions (a single name has weight 1).
#[derive(Debug, Clone, PartialEq)]
pub struct RewardChoice {
    pub terms: Vec<(RewardKind, f64)>,
}

/// Which assistant text is read as a tool call (`env.tool_calls`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolCallSyntax {
    /// Only `<tool_call>{json}</tool_call>` blocks, as Qwen's chat template asks for.
    Strict,
    /// Those blocks; and, in a message without any, every JSON object with a `name` key, bare or
    /// in a Markdown code fence (what small models often write instead).
    Tolerant,
}

impl ToolCallSyntax {
    pub fn parse(s: &str) -> Option<ToolCallSyntax> {
        match s {
            "strict" => Some(ToolCallSyntax::Strict),
            "tolerant" => Some(ToolCallSyntax::Tolerant),
            _ => None,
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            ToolCallSyntax::Strict => "strict",
            ToolCallSyntax::Tolerant => "tolerant",
        }
    }
}

/// What a `submit` listing more than `final_k` ids gets (`env.submit_excess`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubmitExcess {
    /// The first `final_k` distinct ids are scored, the rest ignored.
    Cut,
    /// The call is refused with an error the model sees (and may fix on its next turn): a list
    /// has a length the model must choose, so continuing it is never free.
    Refuse,
}

impl SubmitExcess {
    pub fn parse(s: &str) -> Option<SubmitExcess> {
        match s {
            "cut" => Some(SubmitExcess::Cut),
            "refuse" => Some(SubmitExcess::Refuse),
            _ => None,
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            SubmitExcess::Cut => "cut",
            SubmitExcess::Refuse => "refuse",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct EnvConfig {
    pub max_turns: usize,
    pub max_tokens_per_turn: usize,
    pub max_context_tokens: usize,
    pub max_calls_per_turn: usize,
    pub final_k: usize,
    /// What a submit listing more than `final_k` ids gets.
    pub submit_excess: SubmitExcess,
    pub max_search_k: usize,
    pub snippet_words: usize,
    pub hits: HitFormat,
    /// A search call without `query` searches for the task's question.
    pub default_query: bool,
    /// `submit` also takes `hits`, 1-based ranks of the hits shown (every search's, numbered in
    /// call order).
    pub submit_hits: bool,
    /// With `submit_hits`: `submit({"top": n, "rrf": true})` fuses the searches by reciprocal rank.
    pub submit_rrf: bool,
    pub failure_reward: f64,
    pub reward: RewardChoice,
    pub system_prompt: Option<String>,
    /// Which assistant text is read as a tool call.
    pub tool_calls: ToolCallSyntax,
}

impl Default for EnvConfig {
    fn default() -> Self {
        EnvConfig {
            max_turns: 8,
            max_tokens_per_turn: 512,
            max_context_tokens: 8192,
            max_calls_per_turn: 8,
            final_k: 10,
            submit_excess: SubmitExcess::Cut,
            max_search_k: 50,
            snippet_words: 60,
            hits: HitFormat::Full,
            default_query: false,
            submit_hits: false,
            submit_rrf: false,
            failure_reward: -1.0,
            reward: RewardChoice {
                terms: vec![(RewardKind::Ndcg(10), 1.0)],
            },
            system_prompt: None,
            tool_calls: ToolCallSyntax::Strict,
        }
    }
}

impl EnvSpec {
    pub(crate) fn validate(self, ctx: &Ctx<'_>) -> Result<EnvConfig> {
        let d = EnvConfig::default();
        let kind = |name: &str| {
            RewardKind::parse(name).ok_or_else(|| {
                ctx.invalid(
                    "env.reward",
                    format!("`{name}` is not \"ndcg@K\", \"recall@K\" or \"exact_match\""),
                )
            })
        };
        let reward = match self.reward {
            None => d.reward,
            Some(RewardSpec::Name(n)) => RewardChoice {
                terms: vec![(kind(&n)?, 1.0)],
            },
            Some(RewardSpec::Weighted(map)) => {
                if map.is_empty() {
                    return Err(ctx.invalid("env.reward", "a weighted reward needs a term"));
                }
                let mut terms = Vec::new();
                for (n, w) in map {
                    if !w.is_finite() {
                        return Err(ctx.invalid("env.reward", format!("weight of `{n}` is {w}")));
                    }
                    terms.push((kind(&n)?, w));
                }
                RewardChoice { terms }
            }
        };
        let hits = match &self.hits {
            None => d.hits,
            Some(h) => HitFormat::parse(h).ok_or_else(|| {
                ctx.invalid(
                    "env.hits",
                    format!("`{h}` is not \"full\", \"titles\" or \"ids\""),
                )
            })?,
        };
        let submit_excess = match &self.submit_excess {
            None => d.submit_excess,
            Some(s) => SubmitExcess::parse(s).ok_or_else(|| {
                ctx.invalid(
                    "env.submit_excess",
                    format!("`{s}` is not \"cut\" or \"refuse\""),
                )
            })?,
        };
        let tool_calls = match &self.tool_calls {
            None => d.tool_calls,
            Some(s) => ToolCallSyntax::parse(s).ok_or_else(|| {
                ctx.invalid(
                    "env.tool_calls",
                    format!("`{s}` is not \"strict\" or \"tolerant\""),
                )
            })?,
        };
        let failure_reward = self.failure_reward.unwrap_or(d.failure_reward);
        if !failure_reward.is_finite() {
            return Err(ctx.invalid("env.failure_reward", "must be a finite number"));
        }
        if let Some(p) = &self.system_prompt {
            ctx.non_empty("env.system_prompt", p)?;
        }
        let max_tokens_per_turn = ctx.range(
            "env.max_tokens_per_turn",
            self.max_tokens_per_turn.unwrap_or(d.max_tokens_per_turn),
            1,
            1 << 20,
        )?;
        let max_context_tokens = ctx.range(
            "env.max_context_tokens",
            self.max_context_tokens.unwrap_or(d.max_context_tokens),
            16,
            1 << 24,
        )?;
        let submit_hits = self.submit_hits.unwrap_or(d.submit_hits);
        let submit_rrf = self.submit_rrf.unwrap_or(d.submit_rrf);
        if submit_rrf && !submit_hits {
            return Err(ctx.invalid(
                "env.submit_rrf",
                "needs env.submit_hits = true (it is a form of `top`)",
            ));
        }
        if max_context_tokens <= max_tokens_per_turn {
            return Err(ctx.invalid(
                "env.max_context_tokens",
                format!(
                    "{max_context_tokens} must exceed max_tokens_per_turn ({max_tokens_per_turn})"
                ),
            ));
        }
        Ok(EnvConfig {
            max_turns: ctx.range(
                "env.max_turns",
                self.max_turns.unwrap_or(d.max_turns),
                1,
                1000,
            )?,
            max_tokens_per_turn,
            max_context_tokens,
            max_calls_per_turn: ctx.range(
                "env.max_calls_per_turn",
                self.max_calls_per_turn.unwrap_or(d.max_calls_per_turn),
                1,
                1000,
            )?,
            final_k: ctx.range("env.final_k", self.final_k.unwrap_or(d.final_k), 1, 10_000)?,
            submit_excess,
            max_search_k: ctx.range(
                "env.max_search_k",
                self.max_search_k.unwrap_or(d.max_search_k),
                1,
                10_000,
            )?,
            snippet_words: ctx.range(
                "env.snippet_words",
                self.snippet_words.unwrap_or(d.snippet_words),
                0,
                100_000,
            )?,
            hits,
            default_query: self.default_query.unwrap_or(d.default_query),
            submit_hits,
            submit_rrf,
            failure_reward,
            reward,
            system_prompt: self.system_prompt,
            tool_calls,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::Config;

    fn load(text: &str) -> Result<Config> {
        Config::from_toml_str(text, Path::new("configs/e.toml"))
    }

    #[test]
    fn submit_rrf_needs_submit_hits() {
        let e = load("[env]\nsubmit_hits = true\nsubmit_rrf = true\n").unwrap();
        assert!(e.env.unwrap().submit_rrf);
        let err = load("[env]\nsubmit_rrf = true\n").unwrap_err().to_string();
        assert!(
            err.contains("env.submit_rrf") && err.contains("submit_hits"),
            "{err}"
        );
    }

    #[test]
    fn defaults_match_the_design() {
        let cfg = load("[env]\n").unwrap();
        let e = cfg.env.unwrap();
        assert_eq!(e, EnvConfig::default());
        assert_eq!(
            (e.max_turns, e.max_tokens_per_turn, e.final_k),
            (8, 512, 10)
        );
        assert_eq!(e.failure_reward, -1.0);
        assert_eq!(e.reward.terms, vec![(RewardKind::Ndcg(10), 1.0)]);
    }

    #[test]
    fn mistyped_key_names_file_and_key() {
        let msg = load("[env]\nmax_turn = 3\n").unwrap_err().to_string();
        assert!(
            msg.contains("max_turn") && msg.contains("configs/e.toml"),
            "{msg}"
        );
    }

    #[test]
    fn rewards_parse_by_name_and_weight() {
        let e = load("[env]\nreward = { \"ndcg@5\" = 0.5, \"recall@100\" = 0.5 }\n")
            .unwrap()
            .env
            .unwrap();
        assert_eq!(
            e.reward.terms,
            vec![(RewardKind::Ndcg(5), 0.5), (RewardKind::Recall(100), 0.5)]
        );
        let msg = load("[env]\nreward = 'mrr@10'\n").unwrap_err().to_string();
        assert!(
            msg.contains("env.reward") && msg.contains("mrr@10"),
            "{msg}"
        );
        assert_eq!(RewardKind::parse("EM"), Some(RewardKind::ExactMatch));
        assert_eq!(RewardKind::parse("ndcg@0"), None);
        assert_eq!(RewardKind::Recall(7).name(), "recall@7");
    }

    #[test]
    fn ranges_are_checked() {
        let msg = load("[env]\nmax_turns = 0\n").unwrap_err().to_string();
        assert!(msg.contains("env.max_turns"), "{msg}");
        let msg = load("[env]\nmax_context_tokens = 100\nmax_tokens_per_turn = 200\n")
            .unwrap_err()
            .to_string();
        assert!(msg.contains("env.max_context_tokens"), "{msg}");
    }

    #[test]
    fn hit_formats_parse_and_unknown_ones_name_the_key() {
        let e = load("[env]\nhits = \"ids\"\n").unwrap().env.unwrap();
        assert_eq!(e.hits, HitFormat::Ids);
        assert_eq!(HitFormat::parse(" Titles"), Some(HitFormat::Titles));
        let msg = load("[env]\nhits = \"snippets\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("env.hits") && msg.contains("snippets"),
            "{msg}"
        );
    }

    #[test]
    fn tool_calls_parses_and_unknown_values_name_the_key() {
        let e = load("[env]\ntool_calls = \"tolerant\"\n")
            .unwrap()
            .env
            .unwrap();
        assert_eq!(e.tool_calls, ToolCallSyntax::Tolerant);
        assert_eq!(
            ToolCallSyntax::parse(e.tool_calls.name()),
            Some(e.tool_calls)
        );
        let d = load("[env]\n").unwrap().env.unwrap();
        assert_eq!(d.tool_calls, ToolCallSyntax::Strict);
        // An agent environment's agent reads its own model's text: the key would not act there.
        let msg = load(
            "[env]\ntool_calls = \"tolerant\"\n[rollout]\nenvironment = \"agent\"\n\
             agent_url = \"http://127.0.0.1:8080\"\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            msg.contains("env.tool_calls") && msg.contains("agent"),
            "{msg}"
        );
        let msg = load("[env]\ntool_calls = \"lenient\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("env.tool_calls") && msg.contains("lenient"),
            "{msg}"
        );
    }

    #[test]
    fn submit_excess_parses_and_unknown_values_name_the_key() {
        let e = load("[env]\nsubmit_excess = \"refuse\"\n")
            .unwrap()
            .env
            .unwrap();
        assert_eq!(e.submit_excess, SubmitExcess::Refuse);
        assert_eq!(
            SubmitExcess::parse(e.submit_excess.name()),
            Some(e.submit_excess)
        );
        let msg = load("[env]\nsubmit_excess = \"drop\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("env.submit_excess") && msg.contains("drop"),
            "{msg}"
        );
    }
}
