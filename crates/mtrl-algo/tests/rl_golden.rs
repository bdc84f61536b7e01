//! Advantages and losses against `tests/fixtures/rl-golden.json` (float64 numpy, gradients
//! cross-checked with torch autograd), plus the micro-batch invariance of every aggregation.

use candle_core::{Device, Tensor, Var};
use mtrl_algo::{
    advantages, aggregate, per_token_loss, Advantage, Aggregation, GlobalCounts, LossInputs,
    PassAtKReward, PolicyLoss,
};
use serde_json::Value;

fn golden() -> Value {
    let p = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/fixtures/rl-golden.json"
    );
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn vec2(v: &Value) -> Vec<Vec<f64>> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|r| {
            r.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect()
        })
        .collect()
}

fn vec1(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

fn close(a: f64, b: f64, what: &str) {
    assert!((a - b).abs() <= 1e-9 + 1e-9 * b.abs(), "{what}: {a} vs {b}");
}

fn t2(rows: &[Vec<f64>]) -> Tensor {
    Tensor::new(rows.to_vec(), &Device::Cpu).unwrap()
}

#[test]
fn advantages_match() {
    let g = golden();
    let a = &g["advantages"];
    let groups = vec2(&a["reward_groups"]);
    let cases = [
        ("grpo", Advantage::Grpo),
        ("dr_grpo", Advantage::DrGrpo),
        ("rloo", Advantage::Rloo),
        (
            "pass_at_k_k2",
            Advantage::GrpoPassAtK {
                k: 2,
                reward: PassAtKReward::Binary { threshold: 0.5 },
            },
        ),
    ];
    for (key, est) in cases {
        let want = vec2(&a[key]);
        for (group, want) in groups.iter().zip(&want) {
            let got = advantages(est, group).unwrap();
            for (x, y) in got.iter().zip(want) {
                close(*x, *y, key);
            }
        }
    }
}

struct Table {
    logp_new: Vec<Vec<f64>>,
    logp_old: Tensor,
    logp_rollout: Tensor,
    adv: Tensor,
    mask: Tensor,
}

fn table() -> Table {
    let g = golden();
    let t = &g["loss_table"];
    Table {
        logp_new: vec2(&t["logp_new"]),
        logp_old: t2(&vec2(&t["logp_old"])),
        logp_rollout: t2(&vec2(&t["logp_rollout"])),
        adv: Tensor::new(vec1(&t["advantage_per_sequence"]), &Device::Cpu).unwrap(),
        mask: t2(&vec2(&t["mask"])),
    }
}

/// Runs one loss over the table: (token-mean loss, per-token loss, d loss / d logp_new, clipped).
fn run(
    loss: PolicyLoss,
    behaviour: bool,
    agg: Aggregation,
) -> (f64, Vec<Vec<f64>>, Vec<Vec<f64>>, f64) {
    let t = table();
    let logp = Var::from_tensor(&t2(&t.logp_new)).unwrap();
    let x = LossInputs {
        logp: logp.as_tensor(),
        logp_old: &t.logp_old,
        behaviour: behaviour.then_some((&t.logp_rollout, 2.0)),
        advantages: &t.adv,
        mask: &t.mask,
    };
    let out = per_token_loss(loss, &x).unwrap();
    let l = aggregate(
        &out.per_token,
        &t.mask,
        agg,
        GlobalCounts::of_mask(&t.mask).unwrap(),
    )
    .unwrap();
    let grads = l.backward().unwrap();
    let grad = grads
        .get(logp.as_tensor())
        .unwrap()
        .to_vec2::<f64>()
        .unwrap();
    (
        l.to_scalar::<f64>().unwrap(),
        out.per_token.to_vec2::<f64>().unwrap(),
        grad,
        out.clipped_tokens().unwrap(),
    )
}

fn check2(got: &[Vec<f64>], want: &Value, mask: &[Vec<f64>], what: &str) {
    let want = vec2(want);
    for (b, (g, w)) in got.iter().zip(&want).enumerate() {
        for (t, (x, y)) in g.iter().zip(w).enumerate() {
            if mask[b][t] > 0.0 {
                close(*x, *y, &format!("{what}[{b},{t}]"));
            }
        }
    }
}

#[test]
fn ppo_clip_matches() {
    let g = golden();
    let p = &g["losses"]["ppo_clip"];
    let mask = vec2(&g["loss_table"]["mask"]);
    let ppo = PolicyLoss::Ppo {
        clip_low: 0.2,
        clip_high: 0.2,
        dual_clip: None,
    };
    let (loss, per_token, grad, clipped) = run(ppo, false, Aggregation::TokenMean);
    close(loss, p["loss_token_mean"].as_f64().unwrap(), "ppo loss");
    check2(&per_token, &p["per_token_loss"], &mask, "ppo per-token");
    check2(&grad, &p["grad_logp_new_token_mean"], &mask, "ppo grad");
    let n: f64 = mask.iter().flatten().sum();
    close(
        clipped / n,
        p["clip_fraction"].as_f64().unwrap(),
        "clip fraction",
    );
    let (l2, ..) = run(ppo, false, Aggregation::SeqMeanTokenMean);
    close(
        l2,
        p["loss_seq_mean_token_mean"].as_f64().unwrap(),
        "seq-mean-token-mean",
    );
    let (l3, ..) = run(ppo, false, Aggregation::SeqMeanTokenSumNorm { max_len: 5 });
    close(
        l3,
        p["loss_seq_mean_token_sum_norm"].as_f64().unwrap(),
        "seq-mean-token-sum-norm",
    );
}

#[test]
fn cispo_matches() {
    let g = golden();
    let p = &g["losses"]["cispo"];
    let mask = vec2(&g["loss_table"]["mask"]);
    let (loss, per_token, grad, _) = run(
        PolicyLoss::Cispo {
            clip_low: 1.0,
            clip_high: 0.28,
        },
        false,
        Aggregation::TokenMean,
    );
    close(loss, p["loss_token_mean"].as_f64().unwrap(), "cispo loss");
    check2(&per_token, &p["per_token_loss"], &mask, "cispo per-token");
    check2(&grad, &p["grad_logp_new_token_mean"], &mask, "cispo grad");
}

#[test]
fn tis_ppo_matches() {
    let g = golden();
    let p = &g["losses"]["tis_ppo_clip"];
    let mask = vec2(&g["loss_table"]["mask"]);
    let ppo = PolicyLoss::Ppo {
        clip_low: 0.2,
        clip_high: 0.2,
        dual_clip: None,
    };
    let (loss, per_token, grad, _) = run(ppo, true, Aggregation::TokenMean);
    close(loss, p["loss_token_mean"].as_f64().unwrap(), "tis loss");
    check2(&per_token, &p["per_token_loss"], &mask, "tis per-token");
    check2(&grad, &p["grad_logp_new_token_mean"], &mask, "tis grad");
}

#[test]
fn is_and_dual_clip_hand_worked() {
    // One token, logp_old = 0: ratio = e^{logp}. IS with cap 1.5, A = 2: the value is −A·min(r, C),
    // the gradient −A·min(r, C) (truncated, never zeroed).
    let dev = &Device::Cpu;
    let mask = Tensor::new(&[[1.0f64, 1.0]], dev).unwrap();
    let old = Tensor::new(&[[0.0f64, 0.0]], dev).unwrap();
    let adv = Tensor::new(&[2.0f64], dev).unwrap();
    let logp = Var::new(&[[0.1f64, 0.7]], dev).unwrap(); // ratios 1.10517, 2.01375
    let x = LossInputs {
        logp: logp.as_tensor(),
        logp_old: &old,
        behaviour: None,
        advantages: &adv,
        mask: &mask,
    };
    let out = per_token_loss(PolicyLoss::Is { cap: Some(1.5) }, &x).unwrap();
    let v = out.per_token.to_vec2::<f64>().unwrap();
    close(v[0][0], -2.0 * 0.1f64.exp(), "is below cap");
    close(v[0][1], -3.0, "is at cap");
    assert_eq!(out.clipped_tokens().unwrap(), 1.0);
    let g = out.per_token.sum_all().unwrap().backward().unwrap();
    let g = g.get(logp.as_tensor()).unwrap().to_vec2::<f64>().unwrap();
    close(g[0][0], -2.0 * 0.1f64.exp(), "is grad");
    close(g[0][1], -3.0, "is grad capped");
    // Cap C = 1 (the weight of every token above 1 is 1): the gradient is −A, not 0.
    let out = per_token_loss(PolicyLoss::Is { cap: Some(1.0) }, &x).unwrap();
    let g = out.per_token.sum_all().unwrap().backward().unwrap();
    let g = g.get(logp.as_tensor()).unwrap().to_vec2::<f64>().unwrap();
    close(g[0][0], -2.0, "is cap 1");
    close(g[0][1], -2.0, "is cap 1");

    // Dual clip, A = −1, ratio e^{1.5} = 4.48: PPO loss = 4.48, capped at −c·A = 3.
    let adv = Tensor::new(&[-1.0f64], dev).unwrap();
    let logp = Var::new(&[[1.5f64, 0.0]], dev).unwrap();
    let x = LossInputs {
        logp: logp.as_tensor(),
        logp_old: &old,
        behaviour: None,
        advantages: &adv,
        mask: &mask,
    };
    let ppo = PolicyLoss::Ppo {
        clip_low: 0.2,
        clip_high: 0.2,
        dual_clip: Some(3.0),
    };
    let v = per_token_loss(ppo, &x)
        .unwrap()
        .per_token
        .to_vec2::<f64>()
        .unwrap();
    close(v[0][0], 3.0, "dual clip");
    close(v[0][1], 1.0, "inside band");
}

#[test]
fn micro_batches_give_the_full_batch_gradient() {
    let t = table();
    let rows = t.logp_new.clone();
    let old = t.logp_old.to_vec2::<f64>().unwrap();
    let mask = t.mask.to_vec2::<f64>().unwrap();
    let adv = t.adv.to_vec1::<f64>().unwrap();
    let aggs = [
        Aggregation::TokenMean,
        Aggregation::SeqMeanTokenMean,
        Aggregation::SeqMeanTokenSum,
        Aggregation::SeqMeanTokenSumNorm { max_len: 5 },
    ];
    let losses = [
        PolicyLoss::Ppo {
            clip_low: 0.2,
            clip_high: 0.28,
            dual_clip: Some(3.0),
        },
        PolicyLoss::Cispo {
            clip_low: 1.0,
            clip_high: 0.28,
        },
        PolicyLoss::Is { cap: Some(2.0) },
    ];
    let global = GlobalCounts::of_mask(&t.mask).unwrap();
    for agg in aggs {
        for loss in losses {
            let grad_of = |idx: &[usize]| -> (f64, Vec<Vec<f64>>) {
                let pick =
                    |m: &[Vec<f64>]| t2(&idx.iter().map(|&i| m[i].clone()).collect::<Vec<_>>());
                let logp = Var::from_tensor(&pick(&rows)).unwrap();
                let (o, m) = (pick(&old), pick(&mask));
                let a = Tensor::new(
                    idx.iter().map(|&i| adv[i]).collect::<Vec<_>>(),
                    &Device::Cpu,
                )
                .unwrap();
                let x = LossInputs {
                    logp: logp.as_tensor(),
                    logp_old: &o,
                    behaviour: None,
                    advantages: &a,
                    mask: &m,
                };
                let l = aggregate(
                    &per_token_loss(loss, &x).unwrap().per_token,
                    &m,
                    agg,
                    global,
                )
                .unwrap();
                let g = l
                    .backward()
                    .unwrap()
                    .get(logp.as_tensor())
                    .unwrap()
                    .to_vec2::<f64>()
                    .unwrap();
                (l.to_scalar::<f64>().unwrap(), g)
            };
            let (full_l, full_g) = grad_of(&[0, 1, 2]);
            let mut sum_l = 0.0;
            let mut micro_g = Vec::new();
            for part in [[0usize].as_slice(), &[1], &[2]] {
                let (l, g) = grad_of(part);
                sum_l += l;
                micro_g.extend(g);
            }
            close(sum_l, full_l, &format!("{agg:?} {loss:?} loss"));
            for (a, b) in micro_g.iter().flatten().zip(full_g.iter().flatten()) {
                close(*a, *b, &format!("{agg:?} {loss:?} grad"));
            }
        }
    }
}
