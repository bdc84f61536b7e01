//! The Prometheus scrape endpoint (`[logging] prometheus = "host:port"`): installs
//! `metrics-exporter-prometheus` as the process's `metrics` recorder with an HTTP listener, so
//! every `metrics::counter!/gauge!/histogram!` in the workspace (rollout, learner loop, MLflow
//! tracker) is served at `http://host:port/metrics` (any path answers). No push gateway.
//!
//! A process has one global recorder: the first call installs it; a later call for the same
//! address is a no-op (e.g. `mtrl bench train` runs several trainings), one for another address
//! is an error. Histograms are rendered as summaries (quantiles over a sliding window).

use std::net::SocketAddr;
use std::sync::Mutex;

use anyhow::{bail, Result};
use metrics_exporter_prometheus::PrometheusBuilder;

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
        .map_err(|e| anyhow::anyhow!("logging.prometheus: cannot serve metrics on {sock}: {e}"))?;
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
