//! The Prometheus endpoint: `mtrl train` with `[logging] prometheus = "127.0.0.1:<port>"` serves
//! the `metrics` facade's series over HTTP; scraped over loopback while the run trains.

mod train_common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// One `GET /metrics` over a plain socket; `None` while nothing listens.
fn scrape(port: u16) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    text.starts_with("HTTP/1.1 200").then_some(text)
}

/// The value of an unlabelled series, e.g. `mtrl_train_reward_mean 0.25`.
fn value(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

#[test]
fn train_serves_metrics_while_it_runs() {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = tempfile::tempdir().unwrap();
    let cfg = train_common::write_config(
        dir.path(),
        "group_size = 8\nrollout_max_concurrency = 16",
        "global_batch_size = 8\nmax_steps = 20",
        "every_steps = 0\nkeep_last = 1",
    );
    let mut text = std::fs::read_to_string(&cfg).unwrap();
    text.push_str(&format!("[logging]\nprometheus = \"127.0.0.1:{port}\"\n"));
    std::fs::write(&cfg, text).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_mtrl"))
        .args(["train", "--quiet", "--config", cfg.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let wanted = [
        "mtrl_train_step",
        "mtrl_train_reward_mean",
        "mtrl_train_loss",
        "mtrl_train_stale_samples_dropped_total",
        "mtrl_rollout_episodes_total",
        "mtrl_rollout_engine_tokens_total",
        "mtrl_rollout_groups_admitted_total",
    ];
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut seen = None;
    while Instant::now() < deadline {
        if let Some(body) = scrape(port) {
            if wanted.iter().all(|n| value(&body, n).is_some()) {
                seen = Some(body);
                break;
            }
        }
        if child.try_wait().unwrap().is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "mtrl train failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let body = seen.expect("the run ended before /metrics showed every wanted series");
    for n in wanted {
        eprintln!("{n} = {:?}", value(&body, n));
    }
    let reward = value(&body, "mtrl_train_reward_mean").unwrap();
    assert!((-1.0..=1.0).contains(&reward), "{reward}");
    assert!(value(&body, "mtrl_train_step").unwrap() >= 1.0);
    assert!(value(&body, "mtrl_rollout_episodes_total").unwrap() >= 8.0);
    assert!(value(&body, "mtrl_rollout_engine_tokens_total").unwrap() >= 8.0);
    assert_eq!(
        value(&body, "mtrl_train_stale_samples_dropped_total"),
        Some(0.0)
    );
    assert!(body.contains("# TYPE mtrl_rollout_episodes_total counter"));
    assert!(body.contains("mtrl_train_failures_total{reason="));
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        summary["telemetry"]["prometheus"],
        format!("127.0.0.1:{port}")
    );
}
