//! The Prometheus scrape endpoint (`[logging] prometheus = "host:port"`): installs
//! `metrics-exporter-prometheus` as the process's `metrics` recorder with an HTTP listener, so
//! every `metrics::counter!/gauge!/histogram!` in the workspace (rollout, MLflow tracker, and the
//! run records through [`PrometheusSink`]) is served at `http://host:port/metrics` (any path
//! answers). No push gateway.
//!
//! Series of the records: `mtrl_train_<field>` for RL steps, `mtrl_sft_<field>` for SFT steps and
//! `mtrl_eval_<figure>{benchmark, model}` for evaluations
//! (`@` spelled `_at_`, seconds as `_seconds`): gauges for per-step values, counters (`_total`)
//! for sums over the run, histograms for durations and per-sample staleness.
//!
//! A process has one global recorder: the first call installs it; a later call for the same
//! address is a no-op (e.g. `mtrl bench train` runs several trainings), one for another address
//! is an error. Histograms are rendered as summaries (quantiles over a sliding window).

use std::net::SocketAddr;
use std::sync::Mutex;

use metrics_exporter_prometheus::PrometheusBuilder;
use mtrl_core::{FailureReason, SftRecord, StepRecord};

use super::{Record, RunStatus, Sink};
use crate::bail;
use crate::error::{Result, TrainError};

static INSTALLED: Mutex<Option<SocketAddr>> = Mutex::new(None);

/// Starts serving `/metrics` on `addr` (the validated `logging.prometheus`).
pub fn install(addr: &str) -> Result<SocketAddr> {
    let Ok(sock) = addr.parse::<SocketAddr>() else {
        bail!("logging.prometheus: `{addr}` is not an address like 127.0.0.1:9000");
    };
    let mut slot = match INSTALLED.lock() {
        Ok(s) => s,
        Err(p) => p.into_inner(),
    };
    match *slot {
        Some(a) if a == sock => return Ok(a),
        Some(a) => bail!(
            "logging.prometheus: this process already serves metrics on {a}; cannot also serve {sock}"
        ),
        None => {}
    }
    PrometheusBuilder::new()
        .with_http_listener(sock)
        .install()
        .map_err(|e| {
            TrainError::msg(format!(
                "logging.prometheus: cannot serve metrics on {sock}: {e}"
            ))
        })?;
    describe();
    *slot = Some(sock);
    Ok(sock)
}

/// HELP lines for the main series (the others are self-explanatory by name).
fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_gauge!("mtrl_train_step", "learner steps done");
    describe_gauge!(
        "mtrl_train_reward_mean",
        "mean reward of the last step's batch"
    );
    describe_gauge!(
        "mtrl_train_ndcg_at_10",
        "mean nDCG@10 of the last step's batch"
    );
    describe_gauge!(
        "mtrl_train_failure_rate",
        "failed episodes / episodes, last step"
    );
    describe_counter!(
        "mtrl_train_stale_samples_dropped_total",
        "samples dropped for exceeding the staleness bound"
    );
    describe_histogram!(
        "mtrl_train_sample_staleness",
        "policy versions between sampling and training, per sample"
    );
    describe_counter!("mtrl_rollout_episodes_total", "finished episodes");
    describe_counter!(
        "mtrl_rollout_tool_calls_total",
        "well-formed tool calls, by tool"
    );
    describe_counter!(
        "mtrl_rollout_tool_errors_total",
        "tool calls answered with an error"
    );
    describe_counter!(
        "mtrl_rollout_engine_tokens_total",
        "tokens sampled by the engine"
    );
    describe_counter!(
        "mtrl_mlflow_dropped_total",
        "MLflow items given up, by reason"
    );
}

/// Sets the record series on the `metrics` facade (served by the exporter [`install`]ed).
pub struct PrometheusSink {
    addr: SocketAddr,
}

impl PrometheusSink {
    /// Serves `/metrics` on `addr` (see [`install`]).
    pub fn start(addr: &str) -> Result<PrometheusSink> {
        let addr = install(addr)?;
        eprintln!("prometheus: serving metrics on http://{addr}/metrics");
        Ok(PrometheusSink { addr })
    }
}

impl Sink for PrometheusSink {
    fn record(&mut self, r: Record<'_>) -> Result<()> {
        match r {
            Record::Step(s) => step_series(s),
            Record::Sft(s) => sft_series(s),
            Record::Eval {
                benchmark,
                model,
                summary,
            } => eval_series(benchmark, model, summary),
        }
        Ok(())
    }

    fn finish(&mut self, _status: RunStatus) -> Result<Option<(&'static str, serde_json::Value)>> {
        Ok(Some(("prometheus", self.addr.to_string().into())))
    }
}

fn eval_series(benchmark: &str, model: &str, s: &mtrl_eval::report::Summary) {
    let labels = [
        ("benchmark", benchmark.to_string()),
        ("model", model.to_string()),
    ];
    metrics::gauge!("mtrl_eval_ndcg_at_10", &labels).set(s.ndcg_at_10);
    metrics::gauge!("mtrl_eval_fail_rate", &labels).set(s.fail_rate);
    metrics::gauge!("mtrl_eval_turns", &labels).set(s.turns);
    metrics::gauge!("mtrl_eval_reward", &labels).set(s.reward);
    if let Some(p) = s.pass_at_k {
        metrics::gauge!("mtrl_eval_pass_at_k", &labels).set(p);
    }
}

fn sft_series(s: &SftRecord) {
    metrics::gauge!("mtrl_sft_step").set(s.step as f64);
    metrics::gauge!("mtrl_sft_loss").set(s.loss);
    metrics::gauge!("mtrl_sft_grad_norm").set(s.grad_norm);
    metrics::gauge!("mtrl_sft_lr").set(s.lr);
    metrics::counter!("mtrl_sft_tokens_total").increment(s.tokens);
}

fn step_series(r: &StepRecord) {
    metrics::gauge!("mtrl_train_step").set(r.step as f64);
    metrics::gauge!("mtrl_train_policy_version").set(r.version as f64);
    metrics::gauge!("mtrl_train_reward_mean").set(r.reward_mean);
    metrics::gauge!("mtrl_train_reward_std").set(r.reward_std);
    metrics::gauge!("mtrl_train_ndcg_at_10").set(r.ndcg_at_10);
    metrics::gauge!("mtrl_train_failure_rate").set(r.failure_rate);
    for reason in FailureReason::ALL {
        let c = r.failures.get(reason.as_str()).copied().unwrap_or(0);
        metrics::counter!("mtrl_train_failures_total", "reason" => reason.as_str()).increment(c);
    }
    metrics::gauge!("mtrl_train_turns_mean").set(r.turns_mean);
    for (lag, c) in r.staleness_counts.iter().enumerate() {
        for _ in 0..*c {
            metrics::histogram!("mtrl_train_sample_staleness").record(lag as f64);
        }
    }
    metrics::counter!("mtrl_train_stale_samples_dropped_total").increment(r.staleness_violations);
    metrics::counter!("mtrl_train_sequences_total").increment(r.sequences);
    metrics::counter!("mtrl_train_tokens_total").increment(r.tokens);
    metrics::histogram!("mtrl_train_admission_wait_seconds").record(r.admission_wait_s);
    metrics::gauge!("mtrl_train_rollout_tokens_per_second").set(r.rollout_tokens_per_s);
    metrics::gauge!("mtrl_train_learner_tokens_per_second").set(r.learner_tokens_per_s);
    metrics::counter!("mtrl_train_prompt_tokens_prefilled_total")
        .increment(r.prompt_tokens_prefilled);
    metrics::counter!("mtrl_train_prompt_tokens_reused_total").increment(r.prompt_tokens_reused);
    metrics::histogram!("mtrl_train_generate_seconds").record(r.time_generate_s);
    metrics::histogram!("mtrl_train_tools_seconds").record(r.time_tools_s);
    metrics::histogram!("mtrl_train_learn_seconds").record(r.time_learn_s);
    metrics::histogram!("mtrl_train_publish_seconds").record(r.time_publish_s);
    metrics::histogram!("mtrl_train_wait_for_batch_seconds").record(r.time_wait_for_batch_s);
    metrics::histogram!("mtrl_train_step_seconds").record(r.step_wall_s);
    metrics::gauge!("mtrl_train_loss").set(r.loss);
    metrics::gauge!("mtrl_train_clip_fraction").set(r.clip_fraction);
    metrics::gauge!("mtrl_train_behaviour_weight").set(r.behaviour_weight);
    metrics::gauge!("mtrl_train_sampler_gap").set(r.sampler_gap);
    metrics::gauge!("mtrl_train_entropy").set(r.entropy);
    metrics::gauge!("mtrl_train_kl").set(r.kl);
    metrics::gauge!("mtrl_train_grad_norm").set(r.grad_norm);
    metrics::gauge!("mtrl_train_lr").set(r.lr);
    metrics::histogram!("mtrl_train_checkpoint_stall_seconds").record(r.time_checkpoint_s);
    for (name, v) in [
        ("mtrl_train_val_reward", r.val_reward_mean),
        ("mtrl_train_val_ndcg_at_10", r.val_ndcg_at_10),
        ("mtrl_train_val_failure_rate", r.val_failure_rate),
        ("mtrl_train_val_turns", r.val_turns_mean),
        ("mtrl_train_val_sampled_reward", r.val_sampled_reward_mean),
        (
            "mtrl_train_val_sampled_failure_rate",
            r.val_sampled_failure_rate,
        ),
    ] {
        if let Some(v) = v {
            metrics::gauge!(name).set(v);
        }
    }
}
