//! One module per subcommand, plus shared helpers.

pub mod bench_allreduce;
pub mod bench_engine;
pub mod bench_model;
pub mod bench_search;
pub mod bench_train;
pub mod common;
pub mod convert;
pub mod data;
pub mod demo;
pub mod eval;
pub mod examples;
pub mod export;
pub mod generate;
pub mod index;
pub mod inspect;
pub mod logprobs;
pub mod plot;
pub mod rollout;
pub mod search;
pub mod search_eval;
pub mod selftest;
pub mod serve;
pub mod sft;
pub mod train;
