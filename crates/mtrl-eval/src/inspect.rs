//! Reading trajectories in a terminal (`mtrl inspect`): a run's summary per step, selected
//! trajectories turn by turn, and one task side by side at two points of training.
//!
//! Everything here renders to a `String` from records read by [`crate::trajlog::read_run`]; the
//! CLI only prints. A turn shows the assistant's message as written, then the tool calls it made
//! (arguments, returned ids, latency, error), then the tool responses (cut to a few hundred
//! characters unless `full`). Colours are plain ANSI codes, off unless asked for.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use mtrl_core::Role;

use crate::error::{EvalError, Result};
use crate::trajlog::{At, Kind, RunLog, TrajectoryRecord};

/// Which trajectories to show.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Query {
    pub step: Option<At>,
    pub kind: Option<Kind>,
    pub task: Option<String>,
    /// Only failed episodes.
    pub failed: bool,
    /// The N lowest rewards (after the other filters), worst first.
    pub worst: Option<usize>,
}

impl Query {
    /// Whether any filter is set (otherwise the CLI prints the run's summary).
    pub fn is_empty(&self) -> bool {
        *self == Query::default()
    }
}

/// How to render.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Style {
    /// ANSI colours.
    pub color: bool,
    /// Whole messages instead of cut ones.
    pub full: bool,
}

impl Style {
    fn paint(&self, code: &str, text: &str) -> String {
        if self.color {
            format!("\x1b[{code}m{text}\x1b[0m")
        } else {
            text.to_string()
        }
    }
}

/// The records that match `q`, in log order (or worst first with `worst`).
pub fn select<'a>(log: &'a RunLog, q: &Query) -> Vec<&'a TrajectoryRecord> {
    let mut out: Vec<&TrajectoryRecord> = log
        .records
        .iter()
        .filter(|r| q.step.as_ref().is_none_or(|s| &r.step == s))
        .filter(|r| q.kind.is_none_or(|k| r.kind == k))
        .filter(|r| q.task.as_ref().is_none_or(|t| &r.task_id == t))
        .filter(|r| !q.failed || r.failure.is_some())
        .collect();
    if let Some(n) = q.worst {
        out.sort_by(|a, b| a.reward.total_cmp(&b.reward));
        out.truncate(n);
    }
    out
}

fn cut(text: &str, max: usize, full: bool) -> (String, bool) {
    let n = text.chars().count();
    if full || n <= max {
        return (text.to_string(), false);
    }
    (text.chars().take(max).collect(), true)
}

fn indent(out: &mut String, text: &str) {
    for line in text.lines() {
        let _ = writeln!(out, "    {line}");
    }
}

fn ids(list: &[String], max: usize) -> String {
    let mut s = list.iter().take(max).cloned().collect::<Vec<_>>().join(" ");
    if list.len() > max {
        let _ = write!(s, " … (+{})", list.len() - max);
    }
    s
}

fn count(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

fn step_name(kind: Kind, at: &At) -> String {
    match (kind, at) {
        (Kind::Train, At::Step(s)) => format!("train step {s}"),
        (Kind::Eval, At::Step(s)) => format!("eval at step {s}"),
        (k, At::Label(l)) => format!("{} `{l}`", k.as_str()),
    }
}

/// One trajectory, turn by turn.
pub fn render(r: &TrajectoryRecord, style: &Style) -> String {
    let mut out = String::new();
    let head = format!(
        "━━ {} · task {} · sample {} ━━",
        step_name(r.kind, &r.step),
        r.task_id,
        r.sample
    );
    let _ = writeln!(out, "{}", style.paint("1", &head));
    let mut facts = vec![format!("reward {:.3}", r.reward)];
    for (name, v) in &r.scores {
        facts.push(format!("{name} {v:.3}"));
    }
    facts.push(format!("turns {}", r.turns));
    if r.tokens.total > 0 {
        facts.push(format!(
            "tokens {} (prompt {}, sampled {})",
            r.tokens.total, r.tokens.prompt, r.tokens.sampled
        ));
    }
    if let Some(v) = r.versions {
        facts.push(match v.min == v.max {
            true => format!("policy v{}", v.min),
            false => format!("policy v{}–v{}", v.min, v.max),
        });
    }
    facts.push(format!(
        "{} tool calls, {} errors",
        r.tool_calls.len(),
        r.tool_errors
    ));
    let _ = writeln!(out, "{}", facts.join(" · "));
    let mut turn = 0u32;
    for m in &r.messages {
        match m.role {
            Role::System => {
                let _ = writeln!(out, "{}", style.paint("2", "[system]"));
                let (text, cut_) = cut(&m.content, 200, style.full);
                indent(&mut out, &text);
                if cut_ {
                    let note = format!("    … {} chars (--full)", m.content.chars().count());
                    let _ = writeln!(out, "{}", style.paint("2", &note));
                }
            }
            Role::User => {
                let _ = writeln!(out, "{}", style.paint("1;34", "[user]"));
                indent(&mut out, &cut(&m.content, 2000, style.full).0);
            }
            Role::Assistant => {
                turn += 1;
                let _ = writeln!(
                    out,
                    "{}",
                    style.paint("1;32", &format!("[assistant {turn}]"))
                );
                let (text, cut_) = cut(&m.content, 2000, style.full);
                indent(&mut out, &text);
                if cut_ {
                    let _ = writeln!(out, "{}", style.paint("2", "    … (--full)"));
                }
                for c in r.tool_calls.iter().filter(|c| c.turn == turn) {
                    let mut line = format!("  ↳ {} {}", c.name, c.arguments);
                    match &c.error {
                        Some(e) => {
                            let _ = write!(line, " ✗ {e}");
                        }
                        None if c.result_ids.is_empty() => {}
                        None => {
                            let n = c.result_ids.len();
                            let _ = write!(line, " → {n} ids: {}", ids(&c.result_ids, 10));
                        }
                    }
                    let _ = write!(line, " ({:.1} ms)", c.latency_ms);
                    let code = if c.error.is_some() { "31" } else { "36" };
                    let _ = writeln!(out, "{}", style.paint(code, &line));
                }
            }
            Role::Tool => {
                let name = m.name.as_deref().unwrap_or("?");
                let _ = writeln!(out, "{}", style.paint("35", &format!("[tool {name}]")));
                let (text, cut_) = cut(&m.content, 300, style.full);
                indent(&mut out, &text);
                if cut_ {
                    let note = format!("    … {} chars (--full)", m.content.chars().count());
                    let _ = writeln!(out, "{}", style.paint("2", &note));
                }
            }
        }
    }
    match &r.answer {
        Some(a) => {
            let _ = writeln!(out, "answer: {}", ids(a, 20));
        }
        None => {
            let _ = writeln!(out, "answer: none");
        }
    }
    if let Some(f) = r.failure {
        let _ = writeln!(
            out,
            "{}",
            style.paint("1;31", &format!("failure: {}", f.as_str()))
        );
    }
    out
}

/// Renders `records` one after the other, at most `limit` of them.
pub fn render_all(records: &[&TrajectoryRecord], limit: usize, style: &Style) -> String {
    let mut out = String::new();
    for r in records.iter().take(limit) {
        out.push_str(&render(r, style));
        out.push('\n');
    }
    if records.len() > limit {
        let _ = writeln!(
            out,
            "… {} more trajectories match (--limit)",
            records.len() - limit
        );
    }
    out
}

/// Figures of a set of records.
struct Agg {
    n: usize,
    reward: f64,
    ndcg: Option<f64>,
    failed: usize,
    turns: f64,
}

fn agg(rs: &[&TrajectoryRecord]) -> Agg {
    let n = rs.len().max(1) as f64;
    let ndcg: Vec<f64> = rs.iter().filter_map(|r| r.score("ndcg@10")).collect();
    Agg {
        n: rs.len(),
        reward: rs.iter().map(|r| r.reward).sum::<f64>() / n,
        ndcg: (!ndcg.is_empty()).then(|| ndcg.iter().sum::<f64>() / n),
        failed: rs.iter().filter(|r| r.failure.is_some()).count(),
        turns: rs.iter().map(|r| r.turns as f64).sum::<f64>() / n,
    }
}

fn agg_line(a: &Agg) -> String {
    let ndcg = a
        .ndcg
        .map_or(String::new(), |v| format!(", nDCG@10 {v:.3}"));
    format!(
        "{} trajectories, reward {:.3}{ndcg}, failed {}, turns {:.2}",
        a.n, a.reward, a.failed, a.turns
    )
}

/// The steps and labels in the log, e.g. `train 1–20; eval base`.
pub fn describe_steps(log: &RunLog) -> String {
    let mut by_kind: BTreeMap<Kind, Vec<&At>> = BTreeMap::new();
    for r in &log.records {
        let v = by_kind.entry(r.kind).or_default();
        if !v.contains(&&r.step) {
            v.push(&r.step);
        }
    }
    let mut parts = Vec::new();
    for (kind, mut steps) in by_kind {
        steps.sort();
        let mut items: Vec<String> = Vec::new();
        let mut run: Option<(u64, u64)> = None;
        let flush = |run: &mut Option<(u64, u64)>, items: &mut Vec<String>| {
            if let Some((a, b)) = run.take() {
                items.push(if a == b {
                    a.to_string()
                } else {
                    format!("{a}–{b}")
                });
            }
        };
        for s in steps {
            match (s, run) {
                (At::Step(x), Some((a, b))) if *x == b + 1 => run = Some((a, *x)),
                (At::Step(x), _) => {
                    flush(&mut run, &mut items);
                    run = Some((*x, *x));
                }
                (At::Label(l), _) => {
                    flush(&mut run, &mut items);
                    items.push(l.clone());
                }
            }
        }
        flush(&mut run, &mut items);
        parts.push(format!("{} {}", kind.as_str(), items.join(", ")));
    }
    parts.join("; ")
}

/// One line per (kind, step): counts, mean reward, nDCG@10, failures, turns.
pub fn summary(log: &RunLog, style: &Style) -> String {
    let mut out = String::new();
    let head = format!(
        "{}: {} in {} ({})",
        log.dir.display(),
        count(log.records.len(), "trajectory", "trajectories"),
        count(log.files.len(), "file", "files"),
        describe_steps(log)
    );
    let _ = writeln!(out, "{}", style.paint("1", &head));
    if log.duplicates > 0 {
        let _ = writeln!(
            out,
            "{} lines replaced by a later line (steps replayed after a resume)",
            log.duplicates
        );
    }
    let mut groups: BTreeMap<(Kind, &At), Vec<&TrajectoryRecord>> = BTreeMap::new();
    for r in &log.records {
        groups.entry((r.kind, &r.step)).or_default().push(r);
    }
    for ((kind, at), rs) in &groups {
        let _ = writeln!(out, "  {:<18} {}", step_name(*kind, at), agg_line(&agg(rs)));
    }
    let _ = writeln!(
        out,
        "show trajectories with --step S, --task ID, --failed, --worst N; --compare A B"
    );
    out
}

/// How one task was handled at step `a` and at step `b`: per step its figures and one line per
/// sample, then the first sample of each step turn by turn. Tasks are ordered by how much their
/// mean reward changed; at most `limit` are shown.
pub fn compare(
    log: &RunLog,
    a: &At,
    b: &At,
    task: Option<&str>,
    limit: usize,
    style: &Style,
) -> Result<String> {
    let at = |s: &At| -> Result<BTreeMap<&str, Vec<&TrajectoryRecord>>> {
        let mut m: BTreeMap<&str, Vec<&TrajectoryRecord>> = BTreeMap::new();
        for r in log.records.iter().filter(|r| &r.step == s) {
            if task.is_none_or(|t| t == r.task_id) {
                m.entry(&r.task_id).or_default().push(r);
            }
        }
        if m.is_empty() {
            let which = task.map_or(String::new(), |t| format!(" for task {t}"));
            return Err(EvalError::Invalid(format!(
                "{}: nothing logged at step {s}{which} (logged: {})",
                log.dir.display(),
                describe_steps(log)
            )));
        }
        Ok(m)
    };
    let (ma, mb) = (at(a)?, at(b)?);
    let mut common: Vec<(&str, f64)> = ma
        .iter()
        .filter_map(|(t, ra)| {
            let rb = mb.get(t)?;
            Some((*t, agg(rb).reward - agg(ra).reward))
        })
        .collect();
    if common.is_empty() {
        return Err(EvalError::Invalid(format!(
            "{}: no task was logged at both step {a} and step {b}",
            log.dir.display()
        )));
    }
    common.sort_by(|x, y| y.1.abs().total_cmp(&x.1.abs()).then(x.0.cmp(y.0)));
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{} logged at both step {a} and step {b}; by change of mean reward",
        count(common.len(), "task", "tasks")
    );
    for (t, delta) in common.iter().take(limit) {
        let head = format!("══ task {t}: step {a} → step {b}, mean reward {delta:+.3} ══");
        let _ = writeln!(out, "\n{}", style.paint("1", &head));
        for (s, rs) in [(a, &ma[t]), (b, &mb[t])] {
            let _ = writeln!(out, "step {s}: {}", agg_line(&agg(rs)));
            for r in rs.iter() {
                let answer = r.answer.as_ref().map_or("none".into(), |x| ids(x, 5));
                let fail = r
                    .failure
                    .map_or(String::new(), |f| format!(" {}", f.as_str()));
                let _ = writeln!(
                    out,
                    "  sample {:>2}: reward {:>6.3}  turns {}  calls {}  answer {answer}{fail}",
                    r.sample,
                    r.reward,
                    r.turns,
                    r.tool_calls.len()
                );
            }
        }
        for rs in [&ma[t], &mb[t]] {
            if let Some(first) = rs.iter().min_by_key(|r| r.sample) {
                out.push('\n');
                out.push_str(&render(first, style));
            }
        }
    }
    if common.len() > limit {
        let _ = writeln!(out, "\n… {} more tasks (--limit)", common.len() - limit);
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
