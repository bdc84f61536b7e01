//! The warm-start job on a pretrained model (`[warm_start]` without `model_config`; `mtrl train
//! --config` runs it): task splits → indexes → the scripted teacher's episodes → SFT of the
//! `[model]` (its `[lora]` adapter, or every weight) on those conversations rendered in the
//! model's own chat template and tool-call format → multi-turn RL from the SFT result → evaluation
//! of base, SFT and tuned against the scripted baselines on a held-out split.
//!
//! A real model that rarely finishes an episode gives GRPO no signal (every reward −1); the SFT
//! stage teaches the call format and the shape of an episode, RL then improves on it, and the
//! report shows the two gains apart (tuned − sft, sft's own row against base).
//!
//! Resumable: a rerun without `fresh` keeps a finished SFT stage (`<sft>/sft-done.json`) and
//! resumes RL from its newest checkpoint; the teacher's episodes (seeded) and the evaluation are
//! redone. With `fresh`, every stage runs again (earlier RL checkpoints are moved aside).

use std::path::Path;
use std::sync::Arc;

use mtrl_core::config::{ModelSource, WarmStartConfig};
use mtrl_core::Config;
use serde_json::json;

use crate::demo::{self, DemoOptions, DemoOutcome, Stages};
use crate::demo_eval::{self, ModelRef};
use crate::error::{Context, Result};
use crate::run::TrainOptions;
use crate::{setup, sft};

/// The marker a finished SFT stage leaves in its output folder.
pub const SFT_DONE: &str = "sft-done.json";

/// Runs the job (see the module docs); `cfg` has been through [`demo::configure`].
pub fn run(cfg: &Config, ws: &WarmStartConfig, o: &DemoOptions) -> Result<DemoOutcome> {
    let mut st = Stages::new();
    let base = match &cfg.model()?.source {
        ModelSource::Dir(d) => d.clone(),
        _ => crate::bail!("{}: [model] is not a checkpoint", cfg.source.display()),
    };
    eprintln!(
        "mtrl: warm start + RL of {} ({}), config {} (seed {})",
        base.display(),
        if cfg.lora.is_some() {
            "LoRA"
        } else {
            "every weight"
        },
        cfg.source.display(),
        cfg.train.seed
    );
    st.start("1/6 task files");
    demo::task_files(cfg)?;
    st.start("2/6 search indexes");
    let (index, build) = setup::open_index(cfg, !o.progress)?;
    eprintln!("{build}");
    let index = Arc::new(index);
    st.start("3/6 teacher episodes");
    let sets = mtrl_env::TaskSets::load(cfg.data()?)?;
    let train_tasks: Vec<_> = sets.train.iter().flat_map(|s| s.tasks.clone()).collect();
    let teacher = demo::teacher(cfg, ws, &index, &train_tasks)?;
    st.start("4/6 warm start (SFT)");
    let sft_out = cfg
        .sft
        .output
        .clone()
        .with_context(|| format!("{}: `sft.output` is required", cfg.source.display()))?;
    if !o.fresh && sft_out.join(SFT_DONE).is_file() {
        eprintln!(
            "         kept: {} (finished earlier; --fresh redoes it)",
            sft_out.display()
        );
    } else {
        warm_start_sft(cfg, index.clone(), &teacher, &sft_out, o.progress)?;
    }
    st.start("5/6 multi-turn RL");
    let rl = rl_config(cfg, &sft_out);
    let opts = TrainOptions {
        fresh: o.fresh,
        max_steps: o.max_steps,
        progress: o.progress,
        stop: o.stop.clone(),
        watch_signals: o.watch_signals,
        ..TrainOptions::default()
    };
    demo::rl_stage(&rl, opts, "rerun the same command to resume")?;
    st.start(&format!("6/6 evaluation on the {} split", o.split.name()));
    let dir = demo::report_dir(cfg);
    let lora = cfg.lora.is_some();
    let sft_ref = ModelRef {
        label: "sft".into(),
        dir: if lora { base.clone() } else { sft_out.clone() },
        adapter: lora.then(|| sft_out.clone()),
    };
    let models = demo_eval::Models {
        before: vec![
            ModelRef {
                label: "base".into(),
                dir: base.clone(),
                adapter: None,
            },
            sft_ref,
        ],
        tuned_base: lora.then_some(base),
    };
    let eval = demo_eval::evaluate(&rl, ws, index, &sets.validation, models, o, &dir)?;
    demo::finish(cfg, o, st, eval, dir, (0, 0, None))
}

/// RL's config: the job's, starting from the SFT result (its adapter as `lora.init`, or the
/// fine-tuned checkpoint as `[model]`).
pub fn rl_config(cfg: &Config, sft_out: &Path) -> Config {
    let mut rl = cfg.clone();
    match (rl.lora.as_mut(), rl.model.as_mut()) {
        (Some(l), _) => l.init = Some(sft_out.to_path_buf()),
        (None, Some(m)) => {
            m.source = ModelSource::Dir(sft_out.to_path_buf());
            m.path_text = sft_out.display().to_string();
        }
        (None, None) => {}
    }
    rl
}

/// SFT of `[model]` (a fresh `[lora]` adapter, or every weight) on the teacher's conversations in
/// the model's chat template; saves the adapter (or checkpoint) into `out` with [`SFT_DONE`].
fn warm_start_sft(
    cfg: &Config,
    index: Arc<mtrl_search::SearchIndex>,
    teacher: &[mtrl_core::Trajectory],
    out: &Path,
    progress: bool,
) -> Result<()> {
    let t0 = std::time::Instant::now();
    let _ = std::fs::remove_file(out.join(SFT_DONE));
    let parts = setup::model_parts(cfg)?;
    let policy = setup::initial_policy(cfg, &parts)?;
    let tools = sft::tool_schemas(cfg, index);
    let examples = sft::examples(parts.codec.as_ref(), &tools, teacher, progress)?;
    let (records, _) = sft::fine_tune_logged(cfg, &policy, &examples, out, progress)?;
    policy
        .save(out, parts.dtype)
        .with_context(|| format!("saving the SFT result into {}", out.display()))?;
    if cfg.lora.is_none() {
        sft::copy_tokenizer(&setup::tokenizer_dir(cfg)?, out)?;
    }
    let (first, last) = (records.first(), records.last());
    let secs = t0.elapsed().as_secs_f64();
    if let (Some(a), Some(b)) = (first, last) {
        eprintln!(
            "         {} steps in {secs:.0} s, loss {:.3} → {:.3} → {}",
            records.len(),
            a.loss,
            b.loss,
            out.display()
        );
    }
    let done = json!({
        "steps": records.len(),
        "examples": examples.len(),
        "first_loss": first.map(|r| r.loss),
        "last_loss": last.map(|r| r.loss),
        "seconds": secs,
    });
    let path = out.join(SFT_DONE);
    std::fs::write(&path, serde_json::to_string_pretty(&done)?)
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}
