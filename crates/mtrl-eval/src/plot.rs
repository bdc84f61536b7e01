//! `mtrl plot`: the figure of a training run as one PNG of four panels — reward and nDCG@10,
//! failure rate, turns per episode, and staleness — with training per step (raw, faint, and a
//! moving mean once there are enough steps), validation curves where the run has them, and
//! evaluations at no step (a base model) as dashed horizontal lines. What is read, from where,
//! is in `plot/read.rs`.
//!
//! Charts are drawn by `plotters` into a bitmap and encoded as PNG; text uses DejaVu Sans, embedded
//! from `assets/` (licence beside it) and registered with plotters' `ab_glyph` renderer, so no
//! system font library (fontconfig, freetype) is needed at build or run time.

mod read;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

pub use read::{read_curves, step_in, Metric, RunCurves, Series};

use crate::error::{EvalError, Result};

/// File name of the figure.
pub const FIGURE: &str = "training.png";
const SIZE: (u32, u32) = (1600, 1100);
const FONT: &str = "sans-serif";
static FONT_BYTES: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");

/// Registers the embedded font with plotters (once per process).
fn register_font() -> Result<()> {
    static DONE: OnceLock<bool> = OnceLock::new();
    let ok = *DONE.get_or_init(|| {
        plotters::style::register_font(FONT, FontStyle::Normal, FONT_BYTES).is_ok()
    });
    match ok {
        true => Ok(()),
        false => Err(EvalError::Invalid(
            "the embedded chart font (DejaVuSans.ttf) could not be loaded".into(),
        )),
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    /// Per-step training values (drawn faint when a moving mean is drawn too).
    Raw,
    Smooth,
    /// Validation points, joined, with markers.
    Val,
    /// A horizontal reference (an evaluation at no step).
    Reference,
}

struct Line {
    label: String,
    points: Vec<(f64, f64)>,
    color: RGBColor,
    kind: Kind,
}

struct Panel {
    title: &'static str,
    lines: Vec<Line>,
    /// Lowest value the y axis starts from (when the data is above it).
    floor: Option<f64>,
    /// Where the legend goes (the y range is widened there to make room for it).
    legend: Corner,
}

const PALETTE: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(127, 127, 127),
];
/// Validation colours, one per source (a panel shows one metric per source).
const VAL_COLORS: [RGBColor; 3] = [
    RGBColor(0, 0, 0),
    RGBColor(23, 150, 160),
    RGBColor(200, 60, 160),
];

#[derive(Debug, Clone, Copy, PartialEq)]
enum Corner {
    UpperRight,
    LowerRight,
}

/// Trailing mean over `w` points.
fn moving_mean(points: &[(f64, f64)], w: usize) -> Vec<(f64, f64)> {
    let mut sum = 0.0;
    let mut out = Vec::with_capacity(points.len());
    for (i, &(x, y)) in points.iter().enumerate() {
        sum += y;
        if i >= w {
            sum -= points[i - w].1;
        }
        out.push((x, sum / (i + 1).min(w) as f64));
    }
    out
}

/// Training lines of one metric: raw, plus a moving mean once there are 12 steps or more.
fn train_lines(c: &RunCurves, m: Metric, name: &str, color: RGBColor, out: &mut Vec<Line>) {
    let Some(points) = c.train.get(&m).filter(|p| !p.is_empty()) else {
        return;
    };
    if points.len() < 12 {
        out.push(Line {
            label: format!("train {name}"),
            points: points.clone(),
            color,
            kind: Kind::Smooth,
        });
        return;
    }
    let w = (points.len() / 10).clamp(3, 50);
    out.push(Line {
        label: format!("train {name} (per step)"),
        points: points.clone(),
        color,
        kind: Kind::Raw,
    });
    out.push(Line {
        label: format!("train {name} (mean of {w} steps)"),
        points: moving_mean(points, w),
        color,
        kind: Kind::Smooth,
    });
}

/// Validation and reference lines of one metric. `unless`: skip a source (or reference) that also
/// has this metric (reward and nDCG@10 of an evaluation nearly coincide; one line is enough).
fn val_lines(c: &RunCurves, m: Metric, name: &str, unless: Option<Metric>, out: &mut Vec<Line>) {
    let shown = |f: &dyn Fn(Metric) -> bool| unless.is_none_or(|u| !f(u));
    for (i, (source, series)) in c.val.iter().enumerate() {
        let has = |x: Metric| series.get(&x).is_some_and(|p| !p.is_empty());
        if let Some(points) = series.get(&m).filter(|p| !p.is_empty() && shown(&has)) {
            out.push(Line {
                label: format!("{source} {name}"),
                points: points.clone(),
                color: VAL_COLORS[i % VAL_COLORS.len()],
                kind: Kind::Val,
            });
        }
    }
    for (i, (label, figures)) in c.references.iter().enumerate().take(4) {
        let has = |x: Metric| figures.contains_key(&x);
        if let Some(&y) = figures.get(&m).filter(|_| shown(&has)) {
            out.push(Line {
                label: format!("{label} {name}"),
                points: vec![(f64::NAN, y)],
                color: PALETTE[(i + 4) % PALETTE.len()],
                kind: Kind::Reference,
            });
        }
    }
}

fn panels(c: &RunCurves) -> Vec<Panel> {
    let mut reward = Vec::new();
    train_lines(c, Metric::Reward, "reward", PALETTE[0], &mut reward);
    train_lines(c, Metric::Ndcg, "nDCG@10", PALETTE[1], &mut reward);
    val_lines(c, Metric::Ndcg, "nDCG@10", None, &mut reward);
    val_lines(c, Metric::Reward, "reward", Some(Metric::Ndcg), &mut reward);
    let mut failure = Vec::new();
    train_lines(
        c,
        Metric::FailureRate,
        "failure rate",
        PALETTE[2],
        &mut failure,
    );
    val_lines(c, Metric::FailureRate, "failure rate", None, &mut failure);
    let mut turns = Vec::new();
    train_lines(c, Metric::Turns, "turns", PALETTE[3], &mut turns);
    val_lines(c, Metric::Turns, "turns", None, &mut turns);
    let mut stale = Vec::new();
    for (m, name, color) in [
        (Metric::StalenessMax, "max lag", PALETTE[5]),
        (Metric::Staleness, "mean lag", PALETTE[4]),
    ] {
        if let Some(points) = c.train.get(&m).filter(|p| !p.is_empty()) {
            stale.push(Line {
                label: name.into(),
                points: points.clone(),
                color,
                kind: Kind::Smooth,
            });
        }
    }
    vec![
        Panel {
            title: "Reward and nDCG@10",
            lines: reward,
            floor: None,
            legend: Corner::LowerRight,
        },
        Panel {
            title: "Failure rate",
            lines: failure,
            floor: Some(0.0),
            legend: Corner::UpperRight,
        },
        Panel {
            title: "Turns per episode",
            lines: turns,
            floor: Some(0.0),
            legend: Corner::UpperRight,
        },
        Panel {
            title: "Staleness (policy versions behind the learner)",
            lines: stale,
            floor: Some(0.0),
            legend: Corner::UpperRight,
        },
    ]
}

fn draw_err<E: std::error::Error + Send + Sync>(
    path: &Path,
) -> impl Fn(DrawingAreaErrorKind<E>) -> EvalError + '_ {
    move |e| EvalError::Invalid(format!("{}: drawing the chart: {e}", path.display()))
}

fn draw_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    p: &Panel,
    (x0, x1): (f64, f64),
) -> std::result::Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let ys: Vec<f64> = p
        .lines
        .iter()
        .flat_map(|l| l.points.iter().map(|q| q.1))
        .filter(|y| y.is_finite())
        .collect();
    if ys.is_empty() {
        let mut chart = ChartBuilder::on(area)
            .caption(p.title, (FONT, 26))
            .margin(15)
            .build_cartesian_2d(x0..x1, 0f64..1f64)?;
        chart.configure_mesh().disable_mesh().draw()?;
        let style = TextStyle::from((FONT, 22)).color(&PALETTE[5]);
        chart.draw_series(std::iter::once(Text::new(
            "not recorded in this run",
            (x0 + (x1 - x0) * 0.3, 0.5),
            style,
        )))?;
        return Ok(());
    }
    let mut lo = ys.iter().copied().fold(f64::INFINITY, f64::min);
    let mut hi = ys.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if let Some(f) = p.floor {
        lo = lo.min(f);
    }
    if hi - lo < 1e-9 {
        hi += 0.5;
        if p.floor.is_none() {
            lo -= 0.5;
        }
    }
    // Room for the legend (about 22 px an entry in a ~400 px high plot) on its side.
    let entries = p.lines.iter().filter(|l| l.kind != Kind::Raw).count() as f64;
    let f = ((entries * 22.0 + 20.0) / 400.0).min(0.65);
    let span = hi - lo;
    let room = span * f / (1.0 - f);
    let pad = span * 0.04;
    let (lo, hi) = match p.legend {
        Corner::LowerRight => (lo - room, hi + pad),
        // Below the floor too, so that a line at 0 is not hidden by the axis.
        _ => (lo - pad, hi + room),
    };
    let mut chart = ChartBuilder::on(area)
        .caption(p.title, (FONT, 26))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(65)
        .build_cartesian_2d(x0..x1, lo..hi)?;
    chart
        .configure_mesh()
        .x_desc("training step")
        .x_labels(((x1 - x0) as usize + 1).min(10))
        .x_label_formatter(&|x| format!("{x:.0}"))
        .label_style((FONT, 17))
        .axis_desc_style((FONT, 18))
        .light_line_style(RGBColor(238, 238, 238))
        .bold_line_style(RGBColor(215, 215, 215))
        .draw()?;
    for l in &p.lines {
        let color = l.color;
        let legend_style = color.stroke_width(3);
        match l.kind {
            Kind::Raw => {
                let faint = color.mix(0.3).stroke_width(1);
                chart.draw_series(LineSeries::new(l.points.clone(), faint))?;
            }
            Kind::Smooth => {
                // Reward wider: nDCG@10 drawn over it (equal when nothing fails) leaves it visible.
                let width = if l.label.starts_with("train reward") {
                    5
                } else {
                    3
                };
                let style = color.stroke_width(width);
                chart
                    .draw_series(LineSeries::new(l.points.clone(), style))?
                    .label(&l.label)
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 24, y)], legend_style)
                    });
                if l.points.len() <= 30 {
                    chart
                        .draw_series(l.points.iter().map(|&q| Circle::new(q, 3, color.filled())))?;
                }
            }
            Kind::Val => {
                chart.draw_series(LineSeries::new(l.points.clone(), color.stroke_width(2)))?;
                chart
                    .draw_series(l.points.iter().map(|&q| Circle::new(q, 5, color.filled())))?
                    .label(&l.label)
                    .legend(move |(x, y)| Circle::new((x + 12, y), 5, color.filled()));
            }
            Kind::Reference => {
                let y = l.points[0].1;
                let style = color.stroke_width(2);
                chart
                    .draw_series(DashedLineSeries::new([(x0, y), (x1, y)], 10, 6, style))?
                    .label(&l.label)
                    .legend(move |(x, y)| {
                        let dash = |a: i32| PathElement::new(vec![(a, 0), (a + 8, 0)], style);
                        EmptyElement::at((x, y)) + dash(0) + dash(14)
                    });
            }
        }
    }
    chart
        .configure_series_labels()
        .position(match p.legend {
            Corner::UpperRight => SeriesLabelPosition::UpperRight,
            Corner::LowerRight => SeriesLabelPosition::LowerRight,
        })
        .label_font((FONT, 17))
        .background_style(WHITE.mix(0.85))
        .border_style(RGBColor(200, 200, 200))
        .draw()?;
    Ok(())
}

/// Draws `curves` into the PNG `path`.
pub fn plot_curves(curves: &RunCurves, path: &Path) -> Result<()> {
    register_font()?;
    let panels = panels(curves);
    let xs: Vec<f64> = panels
        .iter()
        .flat_map(|p| p.lines.iter().flat_map(|l| l.points.iter().map(|q| q.0)))
        .filter(|x| x.is_finite())
        .collect();
    let x0 = xs.iter().copied().fold(f64::INFINITY, f64::min);
    let x1 = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let (x0, x1) = match (x0.is_finite(), x1 - x0 >= 1.0) {
        (false, _) => (0.0, 1.0),
        (true, false) => (x0 - 1.0, x0 + 1.0),
        (true, true) => (x0, x1),
    };
    let err = draw_err(path);
    let root = BitMapBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(&err)?;
    let steps = curves.train.get(&Metric::Reward).map_or(0, Vec::len);
    // The folder's last two components: checkpoint folders are often `runs/NAME/run`.
    let parts: Vec<String> = (curves.run_dir.components().rev().take(2))
        .map(|c| c.as_os_str().to_string_lossy().to_string())
        .collect();
    let name = parts.into_iter().rev().collect::<Vec<_>>().join("/");
    let title = format!("mtrl run {name}: {steps} training steps");
    let (top, body) = root.split_vertically(60);
    let style = TextStyle::from((FONT, 32)).pos(Pos::new(HPos::Center, VPos::Top));
    top.draw_text(&title, &style, (SIZE.0 as i32 / 2, 22))
        .map_err(&err)?;
    for (area, p) in body.split_evenly((2, 2)).iter().zip(&panels) {
        draw_panel(area, p, (x0, x1)).map_err(&err)?;
    }
    root.present().map_err(&err)?;
    Ok(())
}

/// Reads a run folder's curves and writes its figure into `out_dir` (created); returns the paths
/// written.
pub fn plot_run(run_dir: &Path, out_dir: &Path) -> Result<Vec<PathBuf>> {
    let curves = read_curves(run_dir)?;
    std::fs::create_dir_all(out_dir).map_err(|source| EvalError::Io {
        path: out_dir.to_path_buf(),
        source,
    })?;
    let path = out_dir.join(FIGURE);
    plot_curves(&curves, &path)?;
    Ok(vec![path])
}

#[cfg(test)]
mod tests;
