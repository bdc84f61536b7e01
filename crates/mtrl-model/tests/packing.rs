//! Packed rows and activation checkpointing, per kernel set (CPU f32 kernels, candle f64 and
//! bf16: the backend CUDA runs): a right-padded batch runs packed end to end, and its log-probs,
//! loss and every parameter gradient equal those of its rows run one at a time; with activation
//! checkpointing on, the backward recomputes the layers and gives the same gradients, LoRA
//! dropout masks included; no gradient the backward returns holds a graph.

mod common;

use std::collections::BTreeMap;

use candle_core::{DType, Device, Tensor};
use common::*;
use mtrl_model::{lora, token_logprobs, AttentionKernel, LoraSpec, Policy};

/// Rows of different lengths (right padding to the longest).
const LENS: [usize; 4] = [7, 13, 3, 10];

fn policy(kind: &str, dtype: DType) -> Policy {
    Policy::load(&model_dir(kind), dtype, &Device::Cpu).unwrap()
}

fn row(i: usize, len: usize) -> Vec<u32> {
    (0..len)
        .map(|j| 5 + ((i * 131 + j * 37) % 900) as u32)
        .collect()
}

/// A loss weight per log-prob position (non-uniform, so every position's gradient differs).
fn weight(i: usize, j: usize) -> f32 {
    0.25 + ((i * 7 + j * 3) % 5) as f32 * 0.1
}

type Grads = BTreeMap<String, Vec<f32>>;

/// `rows` right-padded to the longest: ids and attention `[b, t]`.
fn batch(rows: &[Vec<u32>]) -> (Tensor, Tensor) {
    let t = rows.iter().map(Vec::len).max().unwrap();
    let b = rows.len();
    let (mut ids, mut att) = (vec![0u32; b * t], vec![0u32; b * t]);
    for (i, r) in rows.iter().enumerate() {
        ids[i * t..i * t + r.len()].copy_from_slice(r);
        att[i * t..i * t + r.len()].fill(1);
    }
    let dev = Device::Cpu;
    (
        Tensor::from_vec(ids, (b, t), &dev).unwrap(),
        Tensor::from_vec(att, (b, t), &dev).unwrap(),
    )
}

/// Log-probs (per row, valid positions), the loss `Σ w·logp` and the gradients of `rows` run as
/// one right-padded batch.
fn run(p: &Policy, rows: &[Vec<u32>], offset: usize) -> (Vec<Vec<f32>>, f32, Grads, bool) {
    let t = rows.iter().map(Vec::len).max().unwrap();
    let b = rows.len();
    let (mut ids, mut att) = (vec![0u32; b * t], vec![0u32; b * t]);
    let mut w = vec![0f32; b * (t - 1)];
    for (i, r) in rows.iter().enumerate() {
        ids[i * t..i * t + r.len()].copy_from_slice(r);
        att[i * t..i * t + r.len()].fill(1);
        for j in 0..r.len() - 1 {
            w[i * (t - 1) + j] = weight(offset + i, j);
        }
    }
    let dev = Device::Cpu;
    let ids = Tensor::from_vec(ids, (b, t), &dev).unwrap();
    let att = Tensor::from_vec(att, (b, t), &dev).unwrap();
    let w = Tensor::from_vec(w, (b, t - 1), &dev).unwrap();
    let fwd = token_logprobs(p, &ids, Some(&att), 1.0, true, 1 << 20).unwrap();
    let (loss, grads) = fwd
        .loss_and_grads(|lp| (lp.to_dtype(DType::F32)? * &w)?.sum_all())
        .unwrap();
    // The store holds plain gradients: none keeps a graph (and with it the forward's activations)
    // alive for as long as the caller keeps the store.
    let kept = grads
        .get_ids()
        .filter(|id| grads.get_id(**id).is_some_and(|g| g.track_op()))
        .count();
    assert_eq!(kept, 0, "{kept} gradients hold a graph");
    let lp: Vec<Vec<f32>> = fwd
        .logprobs
        .to_dtype(DType::F32)
        .unwrap()
        .to_vec2()
        .unwrap()
        .into_iter()
        .zip(rows)
        .map(|(l, r)| l[..r.len() - 1].to_vec())
        .collect();
    let g = p
        .named_parameters()
        .iter()
        .filter_map(|(n, v)| {
            let g = grads.get(v)?.to_dtype(DType::F32).ok()?;
            Some((n.clone(), g.flatten_all().ok()?.to_vec1().ok()?))
        })
        .collect();
    (
        lp,
        loss.to_scalar::<f32>().unwrap(),
        g,
        fwd.recomputes_layers(),
    )
}

fn rows() -> Vec<Vec<u32>> {
    LENS.iter().enumerate().map(|(i, &l)| row(i, l)).collect()
}

/// The largest difference of two gradient sets relative to the largest gradient entry.
fn grad_gap(a: &Grads, b: &Grads) -> f32 {
    assert_eq!(
        a.keys().collect::<Vec<_>>(),
        b.keys().collect::<Vec<_>>(),
        "different parameters got gradients"
    );
    let mut scale = 0f32;
    let mut gap = 0f32;
    for (n, x) in a {
        for (u, v) in x.iter().zip(&b[n]) {
            scale = scale.max(u.abs());
            gap = gap.max((u - v).abs());
        }
    }
    assert!(scale > 0.0, "all gradients are zero");
    gap / scale
}

/// Relative tolerance of a gradient (or loss) comparison in `dtype`: summation order only in
/// f32 (the log-prob head runs in f32 for every dtype, f64 included); bf16 rounds each product's
/// output, so a row run alone rounds differently (measured: 2e-7 in f32 and f64, 5e-3 in bf16).
fn tol(dtype: DType) -> f32 {
    match dtype {
        DType::BF16 => 1e-2,
        _ => 1e-5,
    }
}

fn packing_matches_one_row_at_a_time(dtype: DType) {
    let p = policy("qwen3", dtype);
    let rows = rows();
    let (lp, loss, grads, _) = run(&p, &rows, 0);
    let mut loss1 = 0f32;
    let mut grads1: Grads = BTreeMap::new();
    for (i, r) in rows.iter().enumerate() {
        let (l, s, g, _) = run(&p, std::slice::from_ref(r), i);
        let d = l[0]
            .iter()
            .zip(&lp[i])
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        assert!(d <= logprob_tol(dtype), "row {i}: log-probs differ by {d}");
        loss1 += s;
        for (n, v) in g {
            let acc = grads1.entry(n).or_insert_with(|| vec![0.0; v.len()]);
            acc.iter_mut().zip(v).for_each(|(a, x)| *a += x);
        }
    }
    assert!(
        ((loss - loss1) / loss1).abs() <= tol(dtype),
        "loss {loss} packed vs {loss1} row by row"
    );
    let gap = grad_gap(&grads, &grads1);
    assert!(gap <= tol(dtype), "gradients differ by {gap} (relative)");
}

fn checkpointing_gives_the_same_gradients(dtype: DType) {
    let mut p = policy("qwen3", dtype);
    let (lp, loss, grads, recomputed) = run(&p, &rows(), 0);
    assert!(!recomputed);
    p.set_activation_checkpointing(true);
    let (lp2, loss2, grads2, recomputed) = run(&p, &rows(), 0);
    assert!(recomputed, "the forward kept the whole graph");
    assert_eq!(lp, lp2, "checkpointing changed the forward");
    assert_eq!(loss, loss2);
    let gap = grad_gap(&grads, &grads2);
    // Same kernels on the same inputs (measured: identical in all three kernel sets); the tied
    // embedding's two gradient terms could be summed in another order.
    assert!(
        gap <= tol(dtype) / 10.0,
        "gradients differ by {gap} (relative)"
    );
}

/// The fused attention core (FlashAttention-2 on CUDA; here its CPU twin, reading the row
/// offsets in place, with RoPE on the packed positions) gives the spelled core's log-probs, loss
/// and gradients, with and without activation checkpointing.
fn fused_attention_gives_the_same_gradients(dtype: DType) {
    let mut p = policy("qwen3", dtype);
    p.set_attention_kernel(AttentionKernel::Spelled);
    assert!(!p.attends_fused());
    let (lp, loss, grads, _) = run(&p, &rows(), 0);
    p.set_attention_kernel(AttentionKernel::Fused);
    assert!(p.attends_fused());
    let (lp2, loss2, grads2, _) = run(&p, &rows(), 0);
    // The inference view (scoring: no graph, candle's fused RoPE) gives the same log-probs.
    let (ids, att) = batch(&rows());
    let scored = token_logprobs(&p, &ids, Some(&att), 1.0, false, 1 << 20)
        .unwrap()
        .logprobs
        .to_dtype(DType::F32)
        .unwrap()
        .to_vec2::<f32>()
        .unwrap();
    let scored: Vec<Vec<f32>> = scored
        .into_iter()
        .zip(rows())
        .map(|(l, r)| l[..r.len() - 1].to_vec())
        .collect();
    if dtype != DType::BF16 {
        for (i, (a, b)) in scored.iter().zip(&lp2).enumerate() {
            let d = a
                .iter()
                .zip(b)
                .map(|(x, y)| (x - y).abs())
                .fold(0f32, f32::max);
            assert!(d <= logprob_tol(dtype), "row {i}: scoring differs by {d}");
        }
    }
    if dtype == DType::BF16 {
        // bf16 rounds the spelled core's scores and probabilities; the fused core keeps them in
        // f32 (f64 in the twin) and rounds its output once. Both are held to the f64 model.
        let truth = run(&policy("qwen3", DType::F64), &rows(), 0);
        // The mean error of the log-probs (the largest is one position's rounding luck).
        let lp_err = |l: &[Vec<f32>]| {
            let n = truth.0.iter().flatten().count() as f32;
            l.iter()
                .flatten()
                .zip(truth.0.iter().flatten())
                .map(|(x, y)| (x - y).abs())
                .sum::<f32>()
                / n
        };
        let (e_spelled, e_fused) = (lp_err(&lp), lp_err(&lp2));
        // The inference view rounds differently again (candle's fused norms and RoPE in bf16).
        let e_scored = lp_err(&scored);
        eprintln!("bf16 vs f64: fused scoring {e_scored}");
        assert!(
            e_scored <= e_spelled * 1.5,
            "fused scoring {e_scored} vs spelled {e_spelled}"
        );
        let (g_spelled, g_fused) = (grad_gap(&grads, &truth.2), grad_gap(&grads2, &truth.2));
        eprintln!("bf16 vs f64: log-probs {e_spelled} spelled, {e_fused} fused; gradients {g_spelled} spelled, {g_fused} fused");
        assert!(
            e_fused <= e_spelled * 1.5,
            "fused log-probs {e_fused} vs spelled {e_spelled}"
        );
        assert!(
            g_fused <= g_spelled * 1.5,
            "fused gradients {g_fused} vs spelled {g_spelled}"
        );
        return;
    }
    for (i, (a, b)) in lp.iter().zip(&lp2).enumerate() {
        let d = a
            .iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        assert!(d <= logprob_tol(dtype), "row {i}: log-probs differ by {d}");
    }
    assert!(
        ((loss - loss2) / loss).abs() <= tol(dtype),
        "loss {loss} spelled vs {loss2} fused"
    );
    let gap = grad_gap(&grads, &grads2);
    assert!(gap <= tol(dtype), "gradients differ by {gap} (relative)");
    p.set_activation_checkpointing(true);
    let (lp3, loss3, grads3, recomputed) = run(&p, &rows(), 0);
    assert!(recomputed);
    assert_eq!(lp2, lp3, "checkpointing changed the fused forward");
    assert_eq!(loss2, loss3);
    let gap = grad_gap(&grads2, &grads3);
    assert!(
        gap <= tol(dtype) / 10.0,
        "checkpointed gradients differ by {gap}"
    );
}

per_kernels!(
    packing_matches_one_row_at_a_time,
    checkpointing_gives_the_same_gradients,
    fused_attention_gives_the_same_gradients
);

fn lora_spec(dropout: f64, layers: Option<Vec<usize>>) -> LoraSpec {
    LoraSpec {
        rank: 4,
        alpha: 8.0,
        targets: lora::TARGETS.map(String::from).to_vec(),
        dropout,
        rslora: false,
        layers,
    }
}

/// A LoRA policy whose `B`s are non-zero (so that `A`'s gradient, through `B`, is not zero).
fn adapted(spec: LoraSpec) -> Policy {
    let mut p = policy("qwen2", DType::F32)
        .with_lora(spec, None, 3)
        .unwrap();
    let b: std::collections::HashMap<String, Tensor> = p
        .named_parameters()
        .iter()
        .filter(|(n, _)| n.contains("lora_B"))
        .map(|(n, v)| {
            (
                n.clone(),
                (v.as_tensor().ones_like().unwrap() * 0.05).unwrap(),
            )
        })
        .collect();
    p.set_weights(&b).unwrap();
    p
}

/// An adapter on the upper layer only: the recompute stops at it, and its gradients are those of
/// the full graph.
#[test]
fn checkpointing_an_adapter_on_the_upper_layers() {
    let mut p = adapted(lora_spec(0.0, Some(vec![1])));
    let (_, loss, grads, _) = run(&p, &rows(), 0);
    p.set_activation_checkpointing(true);
    let (_, loss2, grads2, recomputed) = run(&p, &rows(), 0);
    assert!(recomputed);
    assert_eq!(loss, loss2);
    assert!(
        grads.keys().all(|n| n.contains("layers.1.")),
        "{:?}",
        grads.keys()
    );
    let gap = grad_gap(&grads, &grads2);
    assert!(gap <= 1e-6, "adapter gradients differ by {gap} (relative)");
}

/// LoRA with dropout: the recompute draws the masks of the forward (the shared call counter is
/// rewound per layer), so the adapter's gradients are those of the full graph.
#[test]
fn checkpointing_replays_lora_dropout_masks() {
    let mut p = adapted(lora_spec(0.3, None));
    p.set_dropout_seed(11);
    let (_, loss, grads, _) = run(&p, &rows(), 0);
    p.set_activation_checkpointing(true);
    p.set_dropout_seed(11);
    let (_, loss2, grads2, recomputed) = run(&p, &rows(), 0);
    assert!(recomputed);
    assert_eq!(loss, loss2);
    assert!(
        grads.keys().all(|n| n.contains("lora_")),
        "{:?}",
        grads.keys()
    );
    let gap = grad_gap(&grads, &grads2);
    assert!(gap <= 1e-5, "adapter gradients differ by {gap} (relative)");
    // The masks matter: another seed gives other gradients.
    p.set_dropout_seed(12);
    let (_, _, grads3, _) = run(&p, &rows(), 0);
    assert!(grad_gap(&grads, &grads3) > 1e-3);
}
