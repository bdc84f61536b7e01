//! The tiny Qwen2/Qwen3 checkpoints against the PyTorch/transformers goldens
//! (tolerances from tests/fixtures/MODEL-FIXTURES-README.md).

mod common;

use candle_core::{DType, Device, Tensor};
use common::*;
use mtrl_model::{
    left_padding_positions, logprobs_and_grads, token_logprobs, Engine, KvCache, Policy,
};

/// The checkpoint in the dtype the test runs: f32 takes the CPU f32 kernels, f64 candle's ops
/// (the backend CUDA runs; the fixtures' f32 values are exact in f64).
fn load(kind: &str, dev: &Device) -> Policy {
    Policy::load(&model_dir(kind), DTYPE.with(|d| d.get()), dev).unwrap()
}

thread_local! {
    static DTYPE: std::cell::Cell<DType> = const { std::cell::Cell::new(DType::F32) };
}

fn on(dev: &Device, t: &Tensor) -> Tensor {
    t.to_device(dev).unwrap()
}

fn logits_and_logprobs(kind: &str, dev: &Device) {
    let p = load(kind, dev);
    let (g, _) = golden(kind);
    for i in 0..3 {
        let ids = on(dev, &g[&format!("seq{i}.input_ids")]);
        let logits = p.forward(&ids, None, None).unwrap();
        let d = max_abs_diff(&logits, &g[&format!("seq{i}.logits")], None);
        assert!(d < 1e-4, "{kind} seq{i} logits diff {d}");
        for differentiable in [false, true] {
            let lp = token_logprobs(&p, &ids, None, 1.0, differentiable, 1000).unwrap();
            let d = max_abs_diff(&lp.logprobs, &g[&format!("seq{i}.logprobs")], None);
            assert!(
                d < 1e-4,
                "{kind} seq{i} logprobs diff {d} (differentiable {differentiable})"
            );
        }
        // The entropy of the whole next-token distribution, against PyTorch's logits, at two
        // temperatures (the CPU kernel computes it in the log-sum-exp pass).
        let gl = &g[&format!("seq{i}.logits")];
        let t = gl.dim(1).unwrap();
        for temp in [1.0, 0.7] {
            let lp = token_logprobs(&p, &ids, None, temp, false, 1000).unwrap();
            let z = (gl
                .narrow(1, 0, t - 1)
                .unwrap()
                .to_dtype(DType::F32)
                .unwrap()
                / temp)
                .unwrap();
            let lsm = candle_nn::ops::log_softmax(&z, 2).unwrap();
            let h = (lsm.exp().unwrap() * &lsm)
                .unwrap()
                .sum(2)
                .unwrap()
                .neg()
                .unwrap();
            let d = max_abs_diff(&lp.entropy, &on(dev, &h), None);
            assert!(d < 1e-4, "{kind} seq{i} entropy diff {d} at T = {temp}");
        }
    }
    // right padding: positions 0..T-1
    let (ids, am) = (
        on(dev, &g["right_padded.input_ids"]),
        on(dev, &g["right_padded.attention_mask"]),
    );
    let logits = p.forward(&ids, Some(&am), None).unwrap();
    let mask3 = am
        .unsqueeze(2)
        .unwrap()
        .broadcast_as(logits.dims())
        .unwrap()
        .contiguous()
        .unwrap();
    let d = max_abs_diff(&logits, &g["right_padded.logits"], Some(&mask3));
    assert!(d < 1e-4, "{kind} right_padded logits diff {d}");
    for differentiable in [false, true] {
        let lp = token_logprobs(&p, &ids, Some(&am), 1.0, differentiable, 4096).unwrap();
        let d = max_abs_diff(
            &lp.logprobs,
            &g["right_padded.logprobs"],
            Some(&g["right_padded.logprob_mask"]),
        );
        assert!(d < 1e-4, "{kind} right_padded logprobs diff {d}");
        assert_eq!(
            max_abs_diff(&lp.valid_mask, &g["right_padded.logprob_mask"], None),
            0.0
        );
    }
    // left padding with position_ids = clamp(cumsum(mask) - 1, 0)
    let (ids, am) = (
        on(dev, &g["left_padded.input_ids"]),
        on(dev, &g["left_padded.attention_mask"]),
    );
    let pos = left_padding_positions(&am).unwrap();
    assert_eq!(ids_vec(&pos), ids_vec(&g["left_padded.position_ids"]));
    let logits = p.forward(&ids, Some(&am), Some(&pos)).unwrap();
    let t = logits.dim(1).unwrap();
    let last = logits.narrow(1, t - 1, 1).unwrap().squeeze(1).unwrap();
    let d = max_abs_diff(&last, &g["left_padded.last_logits"], None);
    assert!(d < 1e-4, "{kind} left_padded last logits diff {d}");
    let lsm = candle_nn::ops::log_softmax(&logits.narrow(1, 0, t - 1).unwrap(), 2).unwrap();
    let tgt = ids
        .narrow(1, 1, t - 1)
        .unwrap()
        .to_dtype(DType::U32)
        .unwrap()
        .unsqueeze(2)
        .unwrap();
    let lp = lsm
        .gather(&tgt.contiguous().unwrap(), 2)
        .unwrap()
        .squeeze(2)
        .unwrap();
    let d = max_abs_diff(
        &lp,
        &g["left_padded.logprobs"],
        Some(&g["left_padded.logprob_mask"]),
    );
    assert!(d < 1e-4, "{kind} left_padded logprobs diff {d}");
}

fn greedy_generation(kind: &str, dev: &Device) {
    let p = load(kind, dev);
    let (g, _) = golden(kind);
    let prompt = ids_vec(&g["gen.prompt_ids"]);
    let want = ids_vec(&g["gen.output_ids"]);
    // step logits through the KV cache, by hand
    let mut cache = KvCache::new(p.config().num_hidden_layers);
    let ids = Tensor::from_slice(&prompt, (1, prompt.len()), dev).unwrap();
    let h = p.inference().forward_cached(&ids, &mut cache).unwrap();
    let mut last = p
        .inference()
        .logits(
            &h.narrow(1, prompt.len() - 1, 1)
                .unwrap()
                .squeeze(1)
                .unwrap(),
        )
        .unwrap();
    let mut steps = Vec::new();
    for &tok in &want {
        steps.push(last.squeeze(0).unwrap());
        let h = p
            .inference()
            .decode_step(&[tok], &mut [&mut cache])
            .unwrap();
        last = p.inference().logits(&h).unwrap();
    }
    let d = max_abs_diff(
        &Tensor::stack(&steps, 0).unwrap(),
        &g["gen.step_logits"],
        None,
    );
    assert!(d < 1e-4, "{kind} gen.step_logits diff {d}");
    // the engine, greedy, alone and in a batch with other sequences
    let mut e = Engine::new(p, None, 0, 8).unwrap();
    let out = e
        .generate(vec![
            greedy_request(prompt.clone(), want.len()),
            greedy_request(vec![5, 6, 7], 3),
            greedy_request(prompt[..10].to_vec(), 30),
        ])
        .unwrap();
    assert_eq!(out[0].tokens, want, "{kind} greedy output");
    assert_eq!(out[1].tokens.len(), 3);
    assert_eq!(out[2].tokens.len(), 30);
}

fn grpo_step(kind: &str, dev: &Device) {
    let p = load(kind, dev);
    let (g, meta) = golden(kind);
    let ts = &meta["train_step"];
    let ids = on(dev, &g["train.input_ids"]);
    let am = on(dev, &g["train.attention_mask"]);
    let lmask = on(dev, &g["train.loss_mask"]);
    let adv = on(dev, &g["train.advantages"]).unsqueeze(1).unwrap();
    let (loss, fwd, grads) = logprobs_and_grads(&p, &ids, Some(&am), 1.0, |lp| {
        let ratio = (lp - lp.detach())?.exp()?;
        let a = adv.broadcast_as(ratio.shape())?;
        let l1 = (a.neg()? * &ratio)?;
        let l2 = (a.neg()? * ratio.clamp(0.8, 1.2)?)?;
        let per_tok = l1.maximum(&l2)?;
        (per_tok * &lmask)?.sum_all()? / lmask.sum_all()?.to_scalar::<f32>()? as f64
    })
    .unwrap();
    let d = max_abs_diff(
        &fwd.logprobs,
        &g["train.logprobs"],
        Some(&g["train.loss_mask"]),
    );
    assert!(d < 1e-4, "{kind} train.logprobs diff {d}");
    let want_loss = ts["loss"].as_f64().unwrap();
    assert!(
        (loss as f64 - want_loss).abs() < 1e-6,
        "{kind} loss {loss} vs {want_loss}"
    );
    let mut sq = 0f64;
    for var in p.named_parameters().values() {
        if let Some(gr) = grads.get(var.as_tensor()) {
            let v: f64 = gr
                .to_dtype(DType::F64)
                .unwrap()
                .sqr()
                .unwrap()
                .sum_all()
                .unwrap()
                .to_scalar()
                .unwrap();
            sq += v;
        }
    }
    let norm = sq.sqrt();
    let want_norm = ts["grad_norm_before_clipping"].as_f64().unwrap();
    assert!(
        ((norm - want_norm) / want_norm).abs() < 1e-4,
        "{kind} grad norm {norm} vs {want_norm}"
    );
    for name in ts["recorded_params"].as_array().unwrap() {
        let name = name.as_str().unwrap();
        let var = &p.named_parameters()[name];
        let got = grads
            .get(var.as_tensor())
            .unwrap_or_else(|| panic!("no grad for {name}"));
        let want = &g[&format!("train.grad.{name}")];
        let scale: f32 = want.abs().unwrap().max_all().unwrap().to_scalar().unwrap();
        let d = max_abs_diff(got, want, None);
        assert!(
            d < 1e-4 * scale + 1e-7,
            "{kind} grad {name} diff {d} (max|g| {scale})"
        );
    }
    // One row per vocabulary chunk and no logits kept (every chunk recomputed, dW accumulated
    // across chunks) gives the gradients of the single-chunk pass.
    let gl = (&lmask * adv.broadcast_as(lmask.shape()).unwrap()).unwrap();
    let one = token_logprobs(&p, &ids, Some(&am), 1.0, true, 1 << 25).unwrap();
    let rows = token_logprobs(&p, &ids, Some(&am), 1.0, true, 1).unwrap();
    let (ga, gb) = (one.backward(&gl).unwrap(), rows.backward(&gl).unwrap());
    for (name, var) in p.named_parameters() {
        let (a, b) = (ga.get(var.as_tensor()), gb.get(var.as_tensor()));
        let (Some(a), Some(b)) = (a, b) else {
            panic!("{kind} {name}: gradient missing in one of the chunkings")
        };
        let scale: f32 = a
            .to_dtype(DType::F32)
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar()
            .unwrap();
        let d = max_abs_diff(a, b, None);
        assert!(d <= 1e-5 * scale + 1e-8, "{kind} {name} chunked diff {d}");
    }
}

#[test]
fn qwen3_logits_and_logprobs() {
    for dev in devices() {
        logits_and_logprobs("qwen3", &dev);
    }
}

#[test]
fn qwen2_logits_and_logprobs() {
    for dev in devices() {
        logits_and_logprobs("qwen2", &dev);
    }
}

#[test]
fn qwen3_greedy_generation() {
    for dev in devices() {
        greedy_generation("qwen3", &dev);
    }
}

#[test]
fn qwen2_greedy_generation() {
    for dev in devices() {
        greedy_generation("qwen2", &dev);
    }
}

#[test]
fn qwen3_grpo_step() {
    for dev in devices() {
        grpo_step("qwen3", &dev);
    }
}

#[test]
fn qwen2_grpo_step() {
    for dev in devices() {
        grpo_step("qwen2", &dev);
    }
}

/// The training forward and backward through candle's ops (one-hot-free gradient of the head,
/// log-probs kept on the device) against the same goldens, in f64 on the CPU.
#[test]
fn candle_f64_grpo_step_and_logprobs() {
    DTYPE.with(|d| d.set(DType::F64));
    for kind in ["qwen3", "qwen2"] {
        logits_and_logprobs(kind, &Device::Cpu);
        grpo_step(kind, &Device::Cpu);
    }
}
