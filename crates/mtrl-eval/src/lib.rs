//! `mtrl-eval`: evaluation jobs and what a run leaves behind to read.
//!
//! (Module docs are filled in by the modules' authors.)
//!
//! **Evaluation** ([`job`]): every test file of `[data] test` is run by each model — checkpoint
//! folders or loaded policies through `mtrl-rollout`'s engine thread and episode loop (the code
//! training uses, so tools, budgets and reward are the same), scripted baselines through
//! `mtrl_env::run_episode`. Greedy decoding gives the main figures; `n` sampled attempts per
//! task give pass@k ([`passk`], the unbiased estimator); a paired bootstrap ([`bootstrap`]) gives
//! the interval of an nDCG@10 difference. The [`report::EvalReport`] keeps per-task results and
//! every trajectory, and renders as Markdown, JSON and CSV ([`render`]). Test prompts that also
//! appear in the training files are refused ([`leak`]); test tasks without judgments are errors
//! ([`tasks`]).
//!
//! **What a run leaves to read**: [`trajlog`] writes every training and evaluation trajectory as a
//! versioned JSON line (token counts, not ids; tool calls with result ids and latency) from a
//! background thread fed by a bounded queue, so the learner never waits (full: dropped and
//! counted); [`inspect`] renders a run's logs turn by turn for `mtrl inspect`; [`plot`] draws
//! `metrics.jsonl` and evaluation reports as a PNG with an embedded font (`mtrl plot`).

pub mod bench_search;
pub mod bench_search_peer;
pub mod bootstrap;
pub mod error;
pub mod inspect;
pub mod job;
pub mod leak;
pub mod passk;
pub mod plot;
pub mod render;
pub mod report;
pub mod runner;
pub mod strategy;
pub mod tasks;
pub mod trajlog;

pub use job::{
    evaluate, load_adapted, load_model, prepare_test_sets, Contender, EvalJob, EvalSettings,
    ProgressFn,
};
pub use report::{EvalReport, ModelRun, PassCriterion, PassMetric};
pub use tasks::TestSet;
pub use trajlog::{Kind, LogOptions, LogStats, TrajectoryLog, TrajectoryRecord};
