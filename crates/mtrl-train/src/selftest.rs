//! `mtrl selftest`: the model's golden checks as a library call, for machines that have the binary
//! but no cargo (the GPU machine). Against `tests/fixtures/golden` (PyTorch/transformers outputs
//! of the tiny checkpoints) on the chosen device, in f32 with the fixture README's tolerances:
//! logits and log-probs (unpadded and right-padded, plain and differentiable paths), greedy
//! decoding through the KV cache and the engine, one GRPO/PPO step's loss and gradients, and one
//! clipped AdamW step (`param_after`, on elements whose gradient is not float noise). Then a bf16
//! agreement check: the same model in bf16 against the f32 goldens (log-prob error, greedy
//! agreement, gradient direction), and a bf16 AdamW step through the f32 master weights.
//!
//! Emits one JSON object per check and a summary; an error when any check fails. The
//! same checks run under `cargo test` in `crates/mtrl-model/tests/golden.rs` and
//! `crates/mtrl-learner/tests/golden_step.rs`; this copy exists because the GPU machine has no
//! Rust toolchain.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use mtrl_learner::{clip_global_norm, AdamW, AdamWConfig};
use mtrl_model::{
    logprobs_and_grads, token_logprobs, Engine, GenerationRequest, KvCache, Policy, SamplingParams,
};
use serde_json::{json, Value};

use crate::bail;
use crate::error::{Context, Result};

/// What to check, and where.
#[derive(Debug, Clone)]
pub struct SelftestOptions {
    /// The fixtures folder (holds tiny-qwen3/, tiny-qwen2/ and golden/).
    pub fixtures: PathBuf,
    /// cpu, cuda or cuda:N.
    pub device: String,
    /// Fixture models to check (empty: those present).
    pub kinds: Vec<String>,
    /// Also run the bf16 agreement checks.
    pub bf16: bool,
}

/// How this binary was built (what `scripts/gpu-check.sh --dry-run` checks).
pub fn build_info() -> Value {
    json!({
        "mtrl": env!("CARGO_PKG_VERSION"),
        "cuda": cfg!(feature = "cuda"),
        "cuda_compute_cap": if cfg!(feature = "cuda") { option_env!("CUDA_COMPUTE_CAP") } else { None },
        "flash_attn": mtrl_model::flash_varlen::KERNEL_BUILT,
    })
}

struct Report<'a> {
    emit: &'a mut dyn FnMut(&Value),
    device: String,
    passed: usize,
    failed: Vec<String>,
}

impl Report<'_> {
    fn check(&mut self, name: &str, dtype: &str, ok: bool, mut fields: Value) {
        fields["check"] = json!(name);
        fields["device"] = json!(self.device);
        fields["dtype"] = json!(dtype);
        fields["ok"] = json!(ok);
        (self.emit)(&fields);
        if ok {
            self.passed += 1;
        } else {
            self.failed.push(name.to_string());
        }
    }

    /// `got` within `tol` of `want` (max abs diff over entries where `mask` ≠ 0).
    fn close(
        &mut self,
        name: &str,
        dtype: &str,
        got: &Tensor,
        want: &Tensor,
        mask: Option<&Tensor>,
        tol: f32,
    ) -> Result<()> {
        let d = max_abs_diff(got, want, mask)?;
        self.check(name, dtype, d < tol, json!({"max_abs_diff": d, "tol": tol}));
        Ok(())
    }
}

fn host(t: &Tensor) -> Result<Vec<f32>> {
    Ok(t.to_device(&Device::Cpu)?
        .to_dtype(DType::F32)?
        .flatten_all()?
        .to_vec1::<f32>()?)
}

fn max_abs_diff(a: &Tensor, b: &Tensor, mask: Option<&Tensor>) -> Result<f32> {
    if a.dims() != b.dims() {
        bail!("shape {:?} vs {:?}", a.dims(), b.dims());
    }
    let (a, b) = (host(a)?, host(b)?);
    let m = match mask {
        Some(m) => host(m)?,
        None => vec![1.0; a.len()],
    };
    Ok(a.iter()
        .zip(&b)
        .zip(&m)
        .filter(|(_, m)| **m != 0.0)
        .map(|((x, y), _)| nan_is_inf((x - y).abs()))
        .fold(0.0, f32::max))
}

/// A NaN difference must fail a check (`f32::max` would drop it).
fn nan_is_inf(d: f32) -> f32 {
    if d.is_nan() {
        f32::INFINITY
    } else {
        d
    }
}

fn ids_vec(t: &Tensor) -> Result<Vec<u32>> {
    Ok(t.to_device(&Device::Cpu)?
        .to_dtype(DType::U32)?
        .flatten_all()?
        .to_vec1()?)
}

struct Golden {
    t: HashMap<String, Tensor>,
    meta: Value,
}

impl Golden {
    fn load(dir: &Path) -> Result<Golden> {
        let st = dir.join("golden.safetensors");
        let t = candle_core::safetensors::load(&st, &Device::Cpu)
            .with_context(|| format!("reading {}", st.display()))?;
        let js = dir.join("golden.json");
        let text =
            std::fs::read_to_string(&js).with_context(|| format!("reading {}", js.display()))?;
        let meta =
            serde_json::from_str(&text).with_context(|| format!("parsing {}", js.display()))?;
        Ok(Golden { t, meta })
    }

    fn get(&self, key: &str) -> Result<&Tensor> {
        self.t
            .get(key)
            .with_context(|| format!("golden tensor `{key}` is missing"))
    }

    fn on(&self, key: &str, dev: &Device) -> Result<Tensor> {
        Ok(self.get(key)?.to_device(dev)?)
    }
}

/// The fixture step's loss: PPO clip 0.2 around the detached current log-probs, token mean.
fn ppo_loss(lp: &Tensor, adv: &Tensor, mask: &Tensor) -> candle_core::Result<Tensor> {
    let ratio = (lp - lp.detach())?.exp()?;
    let a = adv.broadcast_as(ratio.shape())?;
    let l1 = (a.neg()? * &ratio)?;
    let l2 = (a.neg()? * ratio.clamp(0.8, 1.2)?)?;
    let n = mask.sum_all()?.to_dtype(DType::F32)?.to_scalar::<f32>()? as f64;
    (l1.maximum(&l2)? * mask.to_dtype(lp.dtype())?)?.sum_all()? / n
}

/// Gradients of the fixture step by parameter name (f32).
fn step_grads(p: &Policy, g: &Golden, dev: &Device) -> Result<(f32, BTreeMap<String, Tensor>)> {
    let ids = g.on("train.input_ids", dev)?;
    let am = g.on("train.attention_mask", dev)?;
    let mask = g.on("train.loss_mask", dev)?.to_dtype(DType::F32)?;
    let adv = g
        .on("train.advantages", dev)?
        .to_dtype(DType::F32)?
        .unsqueeze(1)?;
    let (loss, _, grads) = logprobs_and_grads(p, &ids, Some(&am), 1.0, |lp| {
        ppo_loss(lp, &adv.to_dtype(lp.dtype())?, &mask)
    })?;
    let mut out = BTreeMap::new();
    for (name, var) in p.named_parameters() {
        if let Some(gr) = grads.get(var) {
            out.insert(name.clone(), gr.to_dtype(DType::F32)?);
        }
    }
    Ok((loss, out))
}

fn f32_checks(r: &mut Report, kind: &str, p: &Policy, g: &Golden, dev: &Device) -> Result<()> {
    forward_checks(r, kind, p, g, dev)?;
    greedy_checks(r, kind, p, g, dev)?;
    step_checks(r, kind, p, g, dev)
}

/// Logits and log-probs (plain and differentiable paths, unpadded and right-padded).
fn forward_checks(r: &mut Report, kind: &str, p: &Policy, g: &Golden, dev: &Device) -> Result<()> {
    for i in 0..3 {
        let ids = g.on(&format!("seq{i}.input_ids"), dev)?;
        let logits = p.forward(&ids, None, None)?;
        r.close(
            &format!("{kind}.seq{i}.logits"),
            "f32",
            &logits,
            g.get(&format!("seq{i}.logits"))?,
            None,
            1e-4,
        )?;
        for differentiable in [false, true] {
            let lp = token_logprobs(p, &ids, None, 1.0, differentiable, 1000)?;
            let name = format!(
                "{kind}.seq{i}.logprobs{}",
                if differentiable { ".grad_path" } else { "" }
            );
            r.close(
                &name,
                "f32",
                &lp.logprobs,
                g.get(&format!("seq{i}.logprobs"))?,
                None,
                1e-4,
            )?;
        }
    }
    let (ids, am) = (
        g.on("right_padded.input_ids", dev)?,
        g.on("right_padded.attention_mask", dev)?,
    );
    let lp = token_logprobs(p, &ids, Some(&am), 1.0, false, 4096)?;
    r.close(
        &format!("{kind}.right_padded.logprobs"),
        "f32",
        &lp.logprobs,
        g.get("right_padded.logprobs")?,
        Some(g.get("right_padded.logprob_mask")?),
        1e-4,
    )
}

/// Greedy decoding: step logits through the KV cache, then the engine alone and in a batch.
fn greedy_checks(r: &mut Report, kind: &str, p: &Policy, g: &Golden, dev: &Device) -> Result<()> {
    let prompt = ids_vec(g.get("gen.prompt_ids")?)?;
    let want = ids_vec(g.get("gen.output_ids")?)?;
    let mut cache = KvCache::new(p.config().num_hidden_layers);
    let t = Tensor::from_slice(&prompt, (1, prompt.len()), dev)?;
    let h = p.inference().forward_cached(&t, &mut cache)?;
    let mut last = p
        .inference()
        .logits(&h.narrow(1, prompt.len() - 1, 1)?.squeeze(1)?)?;
    let mut steps = Vec::new();
    for &tok in &want {
        steps.push(last.squeeze(0)?);
        let h = p.inference().decode_step(&[tok], &mut [&mut cache])?;
        last = p.inference().logits(&h)?;
    }
    r.close(
        &format!("{kind}.gen.step_logits"),
        "f32",
        &Tensor::stack(&steps, 0)?,
        g.get("gen.step_logits")?,
        None,
        1e-4,
    )?;
    let mut e = Engine::new(p.clone(), None, 0, 8)?;
    let req = |prompt: Vec<u32>, n| GenerationRequest {
        prompt,
        sampling: SamplingParams::greedy(),
        max_new_tokens: n,
        stop_token_ids: vec![],
        stop_strings: vec![],
        session: None,
    };
    let out = e.generate(vec![
        req(prompt.clone(), want.len()),
        req(vec![5, 6, 7], 3),
        req(prompt[..10].to_vec(), 30),
    ])?;
    let same = out[0].tokens == want;
    r.check(
        &format!("{kind}.gen.engine_greedy"),
        "f32",
        same && out[1].tokens.len() == 3 && out[2].tokens.len() == 30,
        json!({"tokens_match": same}),
    );
    Ok(())
}

/// One PPO step: loss, gradient norm, recorded gradients; then clipped AdamW.
fn step_checks(r: &mut Report, kind: &str, p: &Policy, g: &Golden, dev: &Device) -> Result<()> {
    let ts = &g.meta["train_step"];
    let (loss, mut grads) = step_grads(p, g, dev)?;
    let want_loss = ts["loss"].as_f64().context("train_step.loss")?;
    let d = (loss as f64 - want_loss).abs();
    r.check(
        &format!("{kind}.train.loss"),
        "f32",
        d < 1e-6,
        json!({"abs_diff": d, "tol": 1e-6}),
    );
    let recorded: Vec<String> = ts["recorded_params"]
        .as_array()
        .context("train_step.recorded_params")?
        .iter()
        .filter_map(|v| v.as_str().map(str::to_string))
        .collect();
    for name in &recorded {
        let want = g.get(&format!("train.grad.{name}"))?;
        let got = grads
            .get(name)
            .with_context(|| format!("no gradient for {name}"))?;
        let scale = host(want)?.iter().fold(0f32, |m, x| m.max(x.abs()));
        r.close(
            &format!("{kind}.train.grad.{name}"),
            "f32",
            got,
            want,
            None,
            1e-4 * scale + 1e-7,
        )?;
    }
    let (norm, _) = clip_global_norm(&mut grads, 1.0)?;
    let want_norm = ts["grad_norm_before_clipping"]
        .as_f64()
        .context("grad norm")?;
    let rel = ((norm - want_norm) / want_norm).abs();
    r.check(
        &format!("{kind}.train.grad_norm"),
        "f32",
        rel < 1e-4,
        json!({"rel_diff": rel, "tol": 1e-4}),
    );
    let mut opt = AdamW::new(AdamWConfig::default());
    opt.step(p.named_parameters(), &grads, 1e-3)?;
    for name in &recorded {
        // Elements with |g| < 1e-6 move by ±lr whatever their (noise) sign: not comparable.
        let mask = g.get(&format!("train.grad.{name}"))?.abs()?.ge(1e-6)?;
        let got = p.named_parameters()[name].as_tensor();
        r.close(
            &format!("{kind}.train.param_after.{name}"),
            "f32",
            got,
            g.get(&format!("train.param_after.{name}"))?,
            Some(&mask),
            1e-5,
        )?;
    }
    Ok(())
}

/// bf16 against the f32 goldens: log-prob error, greedy (argmax) agreement and gradient cosine.
fn bf16_checks(r: &mut Report, kind: &str, dir: &Path, g: &Golden, dev: &Device) -> Result<()> {
    let p = Policy::load(dir, DType::BF16, dev)?;
    let (mut worst, mut sum, mut n) = (0f32, 0f64, 0usize);
    let (mut agree, mut total) = (0usize, 0usize);
    for i in 0..3 {
        let ids = g.on(&format!("seq{i}.input_ids"), dev)?;
        let lp = token_logprobs(&p, &ids, None, 1.0, false, 1000)?;
        let (a, b) = (
            host(&lp.logprobs)?,
            host(g.get(&format!("seq{i}.logprobs"))?)?,
        );
        for (x, y) in a.iter().zip(&b) {
            let d = nan_is_inf((x - y).abs());
            worst = worst.max(d);
            sum += d as f64;
            n += 1;
        }
        let a = p
            .forward(&ids, None, None)?
            .to_dtype(DType::F32)?
            .argmax(2)?;
        let b = g.get(&format!("seq{i}.logits"))?.argmax(2)?;
        let (a, b) = (ids_vec(&a)?, ids_vec(&b)?);
        agree += a.iter().zip(&b).filter(|(x, y)| x == y).count();
        total += a.len();
    }
    // bf16 keeps 8 significant bits: logits of magnitude ~10 move by ~0.05, and the log-prob of an
    // unlikely token by several times that. Measured on CPU: mean 0.067 (qwen3), 0.082 (qwen2); max 0.25, 0.38.
    let mean = sum / n.max(1) as f64;
    r.check(
        &format!("{kind}.bf16.logprobs"),
        "bf16",
        mean < 0.15 && worst < 1.0,
        json!({"mean_abs_diff": mean, "max_abs_diff": worst, "tol_mean": 0.15, "tol_max": 1.0}),
    );
    let frac = agree as f64 / total as f64;
    r.check(
        &format!("{kind}.bf16.greedy_agreement"),
        "bf16",
        frac >= 0.9,
        json!({"agreement": frac, "min": 0.9}),
    );
    let (_, grads) = step_grads(&p, g, dev)?;
    let (mut dot, mut n1, mut n2) = (0f64, 0f64, 0f64);
    let ts = &g.meta["train_step"];
    for name in ts["recorded_params"]
        .as_array()
        .context("recorded_params")?
    {
        let name = name.as_str().context("recorded_params")?;
        let (a, b) = (
            host(&grads[name])?,
            host(g.get(&format!("train.grad.{name}"))?)?,
        );
        for (x, y) in a.iter().zip(&b) {
            dot += (*x as f64) * (*y as f64);
            n1 += (*x as f64).powi(2);
            n2 += (*y as f64).powi(2);
        }
    }
    let cos = dot / (n1.sqrt() * n2.sqrt()).max(1e-30);
    r.check(
        &format!("{kind}.bf16.grad_cosine"),
        "bf16",
        cos >= 0.99,
        json!({"cosine": cos, "min": 0.99}),
    );
    // The AdamW step keeps f32 masters; the bf16 weights are the masters rounded.
    let mut grads = grads;
    clip_global_norm(&mut grads, 1.0)?;
    let mut opt = AdamW::new(AdamWConfig::default());
    opt.step(p.named_parameters(), &grads, 1e-3)?;
    let mut worst = 0f32;
    for (name, var) in p.named_parameters() {
        let master = opt
            .master(name)
            .with_context(|| format!("no master for {name}"))?;
        worst = worst.max(max_abs_diff(
            &master.to_dtype(DType::BF16)?,
            var.as_tensor(),
            None,
        )?);
    }
    r.check(
        &format!("{kind}.bf16.adamw_masters"),
        "bf16",
        worst == 0.0,
        json!({"max_abs_diff": worst}),
    );
    Ok(())
}

/// Runs every check on `args.device`, handing each check's JSON object (and a final summary)
/// to `emit`; an error when any check failed.
pub fn run(args: &SelftestOptions, emit: &mut dyn FnMut(&Value)) -> Result<()> {
    let dev = mtrl_model::parse_device(&args.device)?;
    let kinds: Vec<String> = if args.kinds.is_empty() {
        ["qwen3", "qwen2"]
            .iter()
            .filter(|k| {
                args.fixtures
                    .join("golden")
                    .join(format!("tiny-{k}"))
                    .is_dir()
            })
            .map(|k| k.to_string())
            .collect()
    } else {
        args.kinds.clone()
    };
    if kinds.is_empty() {
        bail!(
            "no golden fixtures under {} (expected golden/tiny-qwen3 or golden/tiny-qwen2)",
            args.fixtures.display()
        );
    }
    let mut r = Report {
        emit,
        device: args.device.clone(),
        passed: 0,
        failed: Vec::new(),
    };
    for kind in &kinds {
        let dir = args.fixtures.join(format!("tiny-{kind}"));
        let g = Golden::load(&args.fixtures.join("golden").join(format!("tiny-{kind}")))?;
        let p = Policy::load(&dir, DType::F32, &dev)
            .with_context(|| format!("loading {}", dir.display()))?;
        f32_checks(&mut r, kind, &p, &g, &dev)?;
        if args.bf16 {
            bf16_checks(&mut r, kind, &dir, &g, &dev)?;
        }
    }
    for (name, dtype, ok, fields) in crate::selftest_kernels::checks(&dev)? {
        r.check(&name, &dtype, ok, fields);
    }
    let empty = mtrl_model::host::empty_launches();
    r.check(
        "no op on zero elements",
        "-",
        empty == 0,
        json!({"empty_launches": empty}),
    );
    (r.emit)(
        &json!({"check": "selftest", "device": args.device, "ok": r.failed.is_empty(),
               "passed": r.passed, "failed": r.failed.len(), "failed_checks": r.failed}),
    );
    if !r.failed.is_empty() {
        bail!(
            "{} of {} selftest checks failed: {}",
            r.failed.len(),
            r.passed + r.failed.len(),
            r.failed.join(", ")
        );
    }
    Ok(())
}
