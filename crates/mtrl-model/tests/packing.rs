//! Packed rows and activation checkpointing, per kernel set (CPU f32 kernels, candle f64 and
//! bf16: the backend CUDA runs): a right-padded batch runs packed end to end, and its log-probs,
//! loss and every parameter gradient equal those of its rows run one at a time; with activation
//! checkpointing on, the backward recomputes the layers and gives the same gradients, LoRA
//! dropout masks included; no gradient the backward returns holds a graph.

mod common;

use std::collections::BTreeMap;

use candle_core::{DType, Device, Tensor};
use common::*;
use mtrl_model::{lora, token_logprobs, LoraSpec, Policy};

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

per_kernels!(
    packing_matches_one_row_at_a_time,
    checkpointing_gives_the_same_gradients
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
