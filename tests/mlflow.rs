//! MLflow tracking against a real MLflow server (and, for failures, a closed port and a flaky
//! fake): what the tracker logs — params, per-step metrics, artifacts, status — is read back
//! through the REST API; an outage is retried, counted, and never blocks or fails the caller.
//!
//! The server: `MTRL_TEST_MLFLOW_URI` when set (scripts/test.sh starts one with
//! scripts/mlflow-server.sh); otherwise this test starts its own with that script (`--no-install`:
//! tests never reach the network) and fails, saying what to run, when MLflow is not installed.

mod train_common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use mtrl_train::telemetry::mlflow::{proxied_artifact_root, Options, RunSpec, RunStatus, Tracker};
use serde_json::Value;

/// The tracking server's URL: `MTRL_TEST_MLFLOW_URI`, or a server started for this process
/// (the script stops it when this process exits: `--owner-pid`).
fn server() -> &'static str {
    static S: OnceLock<String> = OnceLock::new();
    S.get_or_init(|| {
        if let Ok(url) = std::env::var("MTRL_TEST_MLFLOW_URI") {
            return url;
        }
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/mlflow-server.sh");
        let pid = std::process::id().to_string();
        let out = Command::new("bash")
            .args([script, "start", "--no-install", "--owner-pid", &pid])
            .output()
            .expect("running scripts/mlflow-server.sh");
        assert!(
            out.status.success(),
            "MTRL_TEST_MLFLOW_URI is not set and no MLflow server could be started:\n{}\n\
             Run the tests via scripts/test.sh (installs MLflow and starts a server), or run \
             scripts/mlflow-server.sh install once.",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout);
        text.lines()
            .find_map(|l| l.strip_prefix("MTRL_MLFLOW_URI="))
            .map(str::to_string)
            .unwrap_or_else(|| panic!("no MTRL_MLFLOW_URI in the script's output: {text}"))
    })
}

fn get(url: &str, endpoint: &str, query: &[(&str, &str)]) -> Value {
    let mut req = ureq::get(&format!("{url}/api/2.0/mlflow/{endpoint}"));
    for (k, v) in query {
        req = req.query(*k, *v);
    }
    let mut resp = req.call().unwrap_or_else(|e| panic!("GET {endpoint}: {e}"));
    resp.body_mut().read_json().unwrap()
}

fn unique(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{prefix}-{}-{nanos}", std::process::id())
}

fn fast_options() -> Options {
    Options {
        queue: 64,
        max_attempts: 4,
        backoff: Duration::from_millis(20),
        max_backoff: Duration::from_millis(100),
        request_timeout: Duration::from_secs(10),
        finish_timeout: Duration::from_secs(30),
    }
}

/// `(step, value)` of a metric's history, by step.
fn history(url: &str, run_id: &str, key: &str) -> Vec<(i64, f64)> {
    let v = get(
        url,
        "metrics/get-history",
        &[("run_id", run_id), ("metric_key", key)],
    );
    let mut h: Vec<(i64, f64)> = v["metrics"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|m| (m["step"].as_i64().unwrap(), m["value"].as_f64().unwrap()))
                .collect()
        })
        .unwrap_or_default();
    h.sort_by_key(|x| x.0);
    h
}

fn kv(list: &Value, key: &str) -> Option<String> {
    list.as_array()?
        .iter()
        .find(|p| p["key"] == key)
        .and_then(|p| p["value"].as_str().map(str::to_string))
}

fn download(url: &str, artifact_uri: &str, path: &str) -> String {
    let root = proxied_artifact_root(artifact_uri).expect("proxied artifact store");
    let mut resp = ureq::get(&format!(
        "{url}/api/2.0/mlflow-artifacts/artifacts/{root}/{path}"
    ))
    .call()
    .unwrap_or_else(|e| panic!("downloading {path}: {e}"));
    resp.body_mut().read_to_string().unwrap()
}

#[test]
fn run_is_logged_and_read_back() {
    let url = server().to_string();
    let experiment = unique("mtrl-test");
    let long = "x".repeat(7000);
    let spec = RunSpec {
        url: url.clone(),
        experiment: experiment.clone(),
        run_name: "roundtrip".into(),
        params: vec![
            ("train.lr".into(), "0.01".into()),
            ("model_path".into(), "random:tiny".into()),
            ("long".into(), long),
        ],
        ..RunSpec::default()
    };
    let t = Tracker::start_with(spec, fast_options()).unwrap();
    t.log_metrics(1, &[("reward_mean".into(), 0.25), ("ndcg@10".into(), 0.5)]);
    t.log_metrics(2, &[("reward_mean".into(), 0.5), ("kl".into(), f64::NAN)]);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("report.json");
    std::fs::write(&file, "{\"ndcg@10\": 0.5}\n").unwrap();
    t.log_artifact(&file, "eval/report.json");
    let stats = t.finish(RunStatus::Finished);
    // params, 2 metric batches, the artifact, the status (a busy fresh server may need a retry).
    eprintln!("round trip: {stats:?}");
    assert_eq!((stats.sent, stats.dropped), (5, 0), "{stats:?}");
    let run_id = stats.run_id.clone().unwrap();

    let exp = get(
        &url,
        "experiments/get-by-name",
        &[("experiment_name", &experiment)],
    );
    assert_eq!(
        exp["experiment"]["experiment_id"].as_str(),
        stats.experiment_id.as_deref()
    );
    let run = get(&url, "runs/get", &[("run_id", &run_id)]);
    let info = &run["run"]["info"];
    assert_eq!(info["status"], "FINISHED");
    assert_eq!(info["run_name"], "roundtrip");
    assert!(info["end_time"].as_i64().is_some());
    let data = &run["run"]["data"];
    assert_eq!(kv(&data["params"], "train.lr").as_deref(), Some("0.01"));
    assert_eq!(
        kv(&data["params"], "model_path").as_deref(),
        Some("random:tiny")
    );
    assert_eq!(kv(&data["params"], "long").map(|v| v.len()), Some(6000));
    assert_eq!(
        kv(&data["tags"], "mlflow.source.name").as_deref(),
        Some("mtrl")
    );
    assert_eq!(
        history(&url, &run_id, "reward_mean"),
        vec![(1, 0.25), (2, 0.5)]
    );
    assert_eq!(history(&url, &run_id, "ndcg_at_10"), vec![(1, 0.5)]);
    assert!(history(&url, &run_id, "kl").is_empty(), "NaN is not sent");

    let listing = get(
        &url,
        "artifacts/list",
        &[("run_id", &run_id), ("path", "eval")],
    );
    let files = listing["files"].as_array().unwrap();
    assert_eq!(files.len(), 1, "{listing}");
    assert_eq!(files[0]["path"], "eval/report.json");
    assert_eq!(files[0]["file_size"], 17);
    let artifact_uri = info["artifact_uri"].as_str().unwrap();
    assert_eq!(
        download(&url, artifact_uri, "eval/report.json"),
        "{\"ndcg@10\": 0.5}\n"
    );

    // A resumed training continues the same run; params keep their first values.
    let spec = RunSpec {
        url: url.clone(),
        experiment,
        run_name: "roundtrip".into(),
        resume_run_id: Some(run_id.clone()),
        params: vec![
            ("train.lr".into(), "0.02".into()),
            ("train.max_steps".into(), "9".into()),
        ],
        ..RunSpec::default()
    };
    let t = Tracker::start_with(spec, fast_options()).unwrap();
    t.log_metrics(3, &[("reward_mean".into(), 0.75)]);
    let stats = t.finish(RunStatus::Killed);
    assert_eq!(stats.run_id.as_deref(), Some(run_id.as_str()));
    assert_eq!((stats.sent, stats.dropped), (3, 0), "{stats:?}");
    assert_eq!(
        history(&url, &run_id, "reward_mean"),
        vec![(1, 0.25), (2, 0.5), (3, 0.75)]
    );
    let run = get(&url, "runs/get", &[("run_id", &run_id)]);
    assert_eq!(run["run"]["info"]["status"], "KILLED");
    let params = &run["run"]["data"]["params"];
    assert_eq!(kv(params, "train.lr").as_deref(), Some("0.01"));
    assert_eq!(kv(params, "train.max_steps").as_deref(), Some("9"));
}

#[test]
fn outage_is_retried_counted_and_never_blocks() {
    // A port nobody listens on.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let options = Options {
        queue: 8,
        finish_timeout: Duration::from_secs(5),
        ..fast_options()
    };
    let spec = RunSpec {
        url: format!("http://127.0.0.1:{port}"),
        experiment: "mtrl".into(),
        run_name: "outage".into(),
        ..RunSpec::default()
    };
    let t = Tracker::start_with(spec, options).unwrap();
    let t0 = Instant::now();
    for step in 0..20 {
        t.log_metrics(step, &[("loss".into(), 1.0)]);
    }
    t.log_artifact("/nonexistent/metrics.jsonl", "metrics.jsonl");
    let logging = t0.elapsed();
    let stats = t.finish(RunStatus::Finished);
    let total = t0.elapsed();
    eprintln!("outage: {stats:?}, logging took {logging:?}, all {total:?}");
    assert!(logging < Duration::from_secs(1), "log calls must not wait");
    assert!(
        total < Duration::from_secs(20),
        "finish must return promptly"
    );
    assert_eq!(stats.sent, 0);
    assert!(stats.retried >= 3, "the first item is retried: {stats:?}");
    // Every item is accounted for: 20 metric batches, the artifact, the status.
    assert_eq!(stats.dropped, 22, "{stats:?}");
    assert!(stats.run_id.is_none() && !stats.abandoned);
    assert!(stats.last_error.is_some());
}

/// A fake tracking server on loopback that answers `503` to the first `fail` log-batch
/// requests; serves `requests` requests, then stops.
fn flaky_server(fail: usize, requests: usize) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        let mut failed = 0;
        for stream in listener.incoming().take(requests) {
            let Ok(mut s) = stream else { continue };
            let mut r = BufReader::new(s.try_clone().unwrap());
            let mut first = String::new();
            r.read_line(&mut first).unwrap();
            let mut len = 0usize;
            loop {
                let mut h = String::new();
                r.read_line(&mut h).unwrap();
                if h.trim().is_empty() {
                    break;
                }
                if let Some(v) = h.to_ascii_lowercase().strip_prefix("content-length:") {
                    len = v.trim().parse().unwrap();
                }
            }
            let mut body = vec![0u8; len];
            r.read_exact(&mut body).unwrap();
            let (status, reply) = if first.contains("experiments/get-by-name") {
                ("200 OK", r#"{"experiment": {"experiment_id": "7"}}"#)
            } else if first.contains("runs/create") {
                (
                    "200 OK",
                    r#"{"run": {"info": {"experiment_id": "7", "run_id": "r1",
                        "artifact_uri": "mlflow-artifacts:/7/r1/artifacts"}}}"#,
                )
            } else if first.contains("log-batch") && failed < fail {
                failed += 1;
                (
                    "503 Service Unavailable",
                    r#"{"error_code": "TEMPORARILY_UNAVAILABLE"}"#,
                )
            } else {
                ("200 OK", "{}")
            };
            let _ = write!(
                s,
                "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
                 Connection: close\r\n\r\n{reply}",
                reply.len()
            );
        }
    });
    url
}

#[test]
fn transient_errors_are_retried_until_they_pass() {
    // get-by-name, runs/create, 2 failed + 1 good log-batch, runs/update.
    let url = flaky_server(2, 6);
    let spec = RunSpec {
        url,
        experiment: "mtrl".into(),
        run_name: "flaky".into(),
        ..RunSpec::default()
    };
    let t = Tracker::start_with(spec, fast_options()).unwrap();
    t.log_metrics(1, &[("loss".into(), 0.5)]);
    let stats = t.finish(RunStatus::Finished);
    assert_eq!(
        (stats.sent, stats.retried, stats.dropped),
        (2, 2, 0),
        "{stats:?}"
    );
    assert_eq!(stats.run_id.as_deref(), Some("r1"));
}

#[test]
fn train_logs_params_metrics_and_artifacts() {
    let url = server().to_string();
    let experiment = unique("mtrl-train");
    let dir = tempfile::tempdir().unwrap();
    let cfg = train_common::write_config(
        dir.path(),
        "group_size = 4\nrollout_max_concurrency = 4",
        "global_batch_size = 2\nmax_steps = 3",
        "every_steps = 0\nkeep_last = 1",
    );
    let mut text = std::fs::read_to_string(&cfg).unwrap();
    text.push_str(&format!(
        "[logging]\nmlflow = \"{url}\"\nmlflow_experiment = \"{experiment}\"\n"
    ));
    std::fs::write(&cfg, text).unwrap();
    let out = train_common::train(&cfg, &[]);
    let summary: Value = serde_json::from_slice(&out.stdout).unwrap();
    let m = &summary["telemetry"]["mlflow"];
    assert_eq!(m["dropped"], 0, "{summary}");
    let run_id = m["run_id"].as_str().unwrap().to_string();
    let run = get(&url, "runs/get", &[("run_id", &run_id)]);
    assert_eq!(run["run"]["info"]["status"], "FINISHED");
    let params = &run["run"]["data"]["params"];
    assert_eq!(kv(params, "train.max_steps").as_deref(), Some("3"));
    assert_eq!(kv(params, "seed").as_deref(), Some("0"));
    assert_eq!(kv(params, "model_path").as_deref(), Some("random:tiny"));
    let steps: Vec<i64> = history(&url, &run_id, "reward_mean")
        .iter()
        .map(|x| x.0)
        .collect();
    assert_eq!(steps, vec![1, 2, 3]);
    assert_eq!(history(&url, &run_id, "sequences").len(), 3);
    let recs = train_common::records(&dir.path().join("run"));
    let artifact_uri = run["run"]["info"]["artifact_uri"].as_str().unwrap();
    let metrics = download(&url, artifact_uri, "metrics.jsonl");
    assert_eq!(metrics.lines().count(), recs.len());
    let saved = std::fs::read_to_string(dir.path().join("run/mlflow-run.json")).unwrap();
    assert!(saved.contains(&run_id), "{saved}");

    // Resuming (two more steps) continues the same MLflow run.
    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("max_steps = 3", "max_steps = 5");
    std::fs::write(&cfg, text).unwrap();
    let out = train_common::train(&cfg, &[]);
    let summary: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["resumed_from"], 3, "{summary}");
    assert_eq!(summary["telemetry"]["mlflow"]["run_id"], run_id.as_str());
    let steps: Vec<i64> = history(&url, &run_id, "reward_mean")
        .iter()
        .map(|x| x.0)
        .collect();
    assert_eq!(steps, vec![1, 2, 3, 4, 5]);
    let run = get(&url, "runs/get", &[("run_id", &run_id)]);
    assert_eq!(run["run"]["info"]["status"], "FINISHED");
    let metrics = download(&url, artifact_uri, "metrics.jsonl");
    assert_eq!(metrics.lines().count(), 5, "the artifact is replaced");
}
