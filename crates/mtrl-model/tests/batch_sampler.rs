//! `batch_sampler::sample_rows` against hand-worked values, an f64 host reference, the host
//! sampler, and itself in other batches (row independence). Every case runs on each device of
//! `common::devices()` (cpu; cuda:0 too with the `cuda` feature).

mod common;

use candle_core::{DType, Device, Tensor};
use mtrl_model::sampler::sample;
use mtrl_model::{sample_rows, Drawn, SamplingParams};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn params(temperature: f64, top_k: usize, top_p: f64) -> SamplingParams {
    SamplingParams {
        temperature,
        top_k,
        top_p,
        seed: 0,
    }
}

/// Samples `rows` (each with its params and draw) on `dev`.
fn draw(dev: &Device, rows: &[Vec<f32>], ps: &[SamplingParams], us: &[f64]) -> Vec<Drawn> {
    let v = rows[0].len();
    let flat: Vec<f32> = rows.iter().flatten().copied().collect();
    let t = Tensor::from_vec(flat, (rows.len(), v), dev).unwrap();
    let refs: Vec<&SamplingParams> = ps.iter().collect();
    sample_rows(&t, &refs, us).unwrap()
}

/// The same row and params for every draw of the grid `u = (i + 0.5) / n`.
fn grid(dev: &Device, row: &[f32], p: &SamplingParams, n: usize) -> Vec<Drawn> {
    let rows = vec![row.to_vec(); n];
    let us: Vec<f64> = (0..n).map(|i| (i as f64 + 0.5) / n as f64).collect();
    draw(dev, &rows, &vec![p.clone(); n], &us)
}

/// `log_softmax(row / t)` in f64.
fn log_softmax(row: &[f32], t: f64) -> Vec<f64> {
    let z: Vec<f64> = row.iter().map(|&x| x as f64 / t).collect();
    let m = z.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let lse = m + z.iter().map(|x| (x - m).exp()).sum::<f64>().ln();
    z.iter().map(|x| x - lse).collect()
}

fn random_row(rng: &mut ChaCha8Rng, v: usize, scale: f32) -> Vec<f32> {
    (0..v)
        .map(|_| (rng.random::<f32>() * 2.0 - 1.0) * scale)
        .collect()
}

#[test]
fn hand_worked_top_k_then_top_p() {
    // logits [2, 1, 0, -1], T = 1, top_k = 3 keeps {0, 1, 2}: probabilities e²/S, e/S, 1/S with
    // S = e² + e + 1 ≈ 0.665, 0.245, 0.090. top_p = 0.8: the mass above token 1 is 0.665 < 0.8
    // (kept), above token 2 it is 0.910 ≥ 0.8 (dropped). Kept {0, 1}: e²/(e² + e) = 1/(1 + e⁻¹).
    let row = vec![2.0f32, 1.0, 0.0, -1.0];
    let p = params(1.0, 3, 0.8);
    let e = std::f64::consts::E;
    let p0 = 1.0 / (1.0 + 1.0 / e);
    let want_trunc = [p0.ln(), (1.0 - p0).ln()];
    let lse = (e * e + e + 1.0 + 1.0 / e).ln();
    let want_full = [2.0 - lse, 1.0 - lse];
    for dev in common::devices() {
        let n = 1000;
        let out = grid(&dev, &row, &p, n);
        for (i, d) in out.iter().enumerate() {
            let u = (i as f64 + 0.5) / n as f64;
            let want = if u < p0 { 0 } else { 1 };
            assert_eq!(d.token, want, "u = {u}");
            let t = d.token as usize;
            assert!(
                (d.logprob_truncated as f64 - want_trunc[t]).abs() < 1e-6,
                "{d:?}"
            );
            assert!((d.logprob as f64 - want_full[t]).abs() < 1e-6, "{d:?}");
        }
    }
}

#[test]
fn full_logprob_is_log_softmax_of_scaled_logits() {
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let v = 1000;
    let rows: Vec<Vec<f32>> = (0..12).map(|_| random_row(&mut rng, v, 8.0)).collect();
    let temps = [0.0, 0.3, 0.7, 1.0, 1.5, 3.0];
    let ps: Vec<SamplingParams> = (0..12)
        .map(|i| params(temps[i % 6], [0, 20][i / 6], [1.0, 0.9][i % 2]))
        .collect();
    let us: Vec<f64> = (0..12).map(|_| rng.random::<f64>()).collect();
    for dev in common::devices() {
        for (i, d) in draw(&dev, &rows, &ps, &us).iter().enumerate() {
            let t = if ps[i].temperature == 0.0 {
                1.0
            } else {
                ps[i].temperature
            };
            let want = log_softmax(&rows[i], t)[d.token as usize];
            assert!(
                (d.logprob as f64 - want).abs() < 1e-5,
                "row {i}: {d:?} vs {want}"
            );
            let untruncated = ps[i].temperature == 0.0 || (ps[i].top_k == 0 && ps[i].top_p == 1.0);
            if untruncated {
                assert_eq!(
                    d.logprob.to_bits(),
                    d.logprob_truncated.to_bits(),
                    "row {i}"
                );
            } else {
                assert!(d.logprob_truncated > d.logprob, "row {i}: {d:?}");
            }
        }
    }
}

#[test]
fn a_row_is_bit_identical_whatever_its_batch() {
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    let v = 5003; // not a multiple of the block width: the padded tail is exercised
    let mixes = [
        params(0.0, 0, 1.0),
        params(1.0, 0, 1.0),
        params(0.8, 50, 1.0),
        params(1.2, 0, 0.9),
        params(0.6, 40, 0.7),
        params(2.0, 1, 1.0),
        params(1.0, 4999, 0.999),
    ];
    for dev in common::devices() {
        for target in &mixes {
            let row = random_row(&mut rng, v, 6.0);
            let u = rng.random::<f64>();
            let alone = draw(
                &dev,
                std::slice::from_ref(&row),
                std::slice::from_ref(target),
                &[u],
            );
            let mut rows: Vec<Vec<f32>> = (0..7).map(|_| random_row(&mut rng, v, 10.0)).collect();
            let mut ps: Vec<SamplingParams> = mixes.to_vec();
            let mut us: Vec<f64> = (0..7).map(|_| rng.random::<f64>()).collect();
            let at = rng.random_range(0..8);
            rows.insert(at, row);
            ps.insert(at, target.clone());
            us.insert(at, u);
            let batch = draw(&dev, &rows, &ps, &us)[at];
            assert_eq!(alone[0].token, batch.token, "{target:?}");
            assert_eq!(alone[0].logprob.to_bits(), batch.logprob.to_bits());
            assert_eq!(
                alone[0].logprob_truncated.to_bits(),
                batch.logprob_truncated.to_bits()
            );
        }
    }
}

#[test]
fn greedy_takes_the_first_maximum_and_top_k_one_is_argmax() {
    for dev in common::devices() {
        let tied = vec![1.0f32, 3.0, 3.0, 0.0, 3.0];
        let d = draw(
            &dev,
            std::slice::from_ref(&tied),
            &[SamplingParams::greedy()],
            &[0.7],
        )[0];
        assert_eq!(d.token, 1);
        assert!((d.logprob as f64 - log_softmax(&tied, 1.0)[1]).abs() < 1e-6);
        assert_eq!(d.logprob, d.logprob_truncated);
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let row = random_row(&mut rng, 3000, 5.0);
        let best = (0..row.len())
            .max_by(|&a, &b| row[a].total_cmp(&row[b]))
            .unwrap() as u32;
        for t in [0.1, 1.0, 4.0] {
            for d in grid(&dev, &row, &params(t, 1, 1.0), 50) {
                assert_eq!(d.token, best);
                assert!(d.logprob_truncated.abs() < 1e-6, "{d:?}");
            }
        }
    }
}

/// Frequencies over the grid `u = (i + 0.5)/N` against the exact kept probabilities.
fn assert_frequencies(dev: &Device, row: &[f32], p: &SamplingParams, want: &[f64]) {
    let n = 10_000;
    let mut count = vec![0usize; row.len()];
    for d in grid(dev, row, p, n) {
        count[d.token as usize] += 1;
        let lp = (want[d.token as usize]).ln();
        assert!(
            (d.logprob_truncated as f64 - lp).abs() < 1e-5,
            "{p:?}: {d:?}"
        );
    }
    for (i, (&c, &w)) in count.iter().zip(want).enumerate() {
        let f = c as f64 / n as f64;
        assert!(
            (f - w).abs() <= 2.0 / n as f64,
            "{p:?}: token {i}: {f} vs {w}"
        );
    }
}

#[test]
fn grid_frequencies_match_the_truncated_distribution() {
    let row = vec![0.5f32, -1.0, 2.0, 0.0, 1.5, -3.0, 1.0];
    let probs = |t: f64, keep: &[usize]| -> Vec<f64> {
        let w: Vec<f64> = row
            .iter()
            .enumerate()
            .map(|(i, &x)| {
                if keep.contains(&i) {
                    (x as f64 / t).exp()
                } else {
                    0.0
                }
            })
            .collect();
        let s: f64 = w.iter().sum();
        w.iter().map(|x| x / s).collect()
    };
    let all: Vec<usize> = (0..row.len()).collect();
    for dev in common::devices() {
        assert_frequencies(&dev, &row, &params(1.0, 0, 1.0), &probs(1.0, &all));
        assert_frequencies(&dev, &row, &params(0.5, 0, 1.0), &probs(0.5, &all));
        // top-3 by value: 2.0 (2), 1.5 (4), 1.0 (6).
        assert_frequencies(&dev, &row, &params(1.0, 3, 1.0), &probs(1.0, &[2, 4, 6]));
        // T = 2, top_p = 0.6: probabilities by rank ≈ .270, .210, .164, .128, …; the mass
        // above the third is 0.480 < 0.6 (kept), above the fourth 0.644 (dropped).
        let p = probs(2.0, &all);
        let mut order = all.clone();
        order.sort_by(|&a, &b| p[b].total_cmp(&p[a]));
        assert!(p[order[0]] + p[order[1]] < 0.6 && p[order[0]] + p[order[1]] + p[order[2]] > 0.6);
        assert_frequencies(&dev, &row, &params(2.0, 0, 0.6), &probs(2.0, &order[..3]));
        // Ties at the top-k threshold are all kept: three tokens share the 2nd value.
        let tied = vec![3.0f32, 1.0, 2.0, 2.0, 0.0, 2.0];
        let e = std::f64::consts::E;
        let s = e.powi(3) + 3.0 * e.powi(2);
        let want = [e.powi(3) / s, 0.0, e * e / s, e * e / s, 0.0, e * e / s];
        assert_frequencies(&dev, &tied, &params(1.0, 2, 1.0), &want);
    }
}

#[test]
fn thresholds_are_exact_for_values_closer_than_the_bisection_step() {
    // Distinct values a few 1e-30 apart, far below the final bracket width (~2e-9): the snap
    // steps must still find the exact top-2 set and the exact nucleus.
    let row = vec![1e-30f32, 3e-30, 2e-30, -1e-10, -50.0];
    for dev in common::devices() {
        let w = 1.0 / 2.0;
        assert_frequencies(&dev, &row, &params(1.0, 2, 1.0), &[0.0, w, w, 0.0, 0.0]);
        // Four tokens of (f32-)equal weight 1/4 (and one ~0): top_p = 0.5 keeps the two
        // largest values, the mass above the third being exactly 0.5.
        let row = vec![0.0f32, 1e-30, 2e-30, 3e-30, -80.0];
        assert_frequencies(&dev, &row, &params(1.0, 0, 0.5), &[0.0, 0.0, w, w, 0.0]);
    }
}

#[test]
fn agrees_with_the_host_sampler_without_truncation() {
    let mut rng = ChaCha8Rng::seed_from_u64(4);
    let v = 2000;
    let seeds: u64 = 2000;
    let n = seeds as usize;
    for dev in common::devices() {
        let mut same = 0;
        for t in [0.7, 1.0, 1.3] {
            let row = random_row(&mut rng, v, 6.0);
            let p = params(t, 0, 1.0);
            let mut rngs: Vec<ChaCha8Rng> = (0..seeds).map(ChaCha8Rng::seed_from_u64).collect();
            let us: Vec<f64> = rngs.iter().map(|r| r.clone().random::<f64>()).collect();
            let out = draw(&dev, &vec![row.clone(); n], &vec![p.clone(); n], &us);
            for (d, r) in out.iter().zip(&mut rngs) {
                let h = sample(&row, &p, r);
                if h.token == d.token {
                    same += 1;
                    assert!((h.logprob - d.logprob).abs() < 1e-5, "{h:?} vs {d:?}");
                }
            }
        }
        let total = 3 * seeds;
        assert!(same * 1000 >= total * 999, "{same} of {total} agree");
    }
}

#[test]
fn edges_stay_inside_the_kept_set() {
    for dev in common::devices() {
        // u just below 1 (rounds to 1.0 in f32) and zero-weight tails: the last positive token.
        let ninf = f32::NEG_INFINITY;
        let row = vec![0.0f32, 0.0, ninf, ninf];
        let d = draw(
            &dev,
            std::slice::from_ref(&row),
            &[params(1.0, 0, 1.0)],
            &[1.0 - f64::EPSILON / 2.0],
        )[0];
        assert_eq!(d.token, 1);
        let d = draw(&dev, &[row], &[params(1.0, 0, 1.0)], &[0.0])[0];
        assert_eq!(d.token, 0);
        // bf16 logits are computed in f32.
        let row = Tensor::new(&[[0.0f32, 2.0, 1.0]], &dev)
            .unwrap()
            .to_dtype(DType::BF16)
            .unwrap();
        let d = sample_rows(&row, &[&params(0.0, 0, 1.0)], &[0.5]).unwrap()[0];
        assert_eq!(d.token, 1);
        // One column.
        let d = draw(&dev, &[vec![5.0]], &[params(1.0, 1, 0.3)], &[0.9])[0];
        assert_eq!((d.token, d.logprob, d.logprob_truncated), (0, 0.0, 0.0));
    }
}

#[test]
fn bad_input_is_an_error() {
    let dev = Device::Cpu;
    let t = Tensor::zeros((2, 4), DType::F32, &dev).unwrap();
    let ok = params(1.0, 0, 1.0);
    assert!(sample_rows(&t, &[&ok], &[0.5, 0.5]).is_err());
    assert!(sample_rows(&t, &[&ok, &ok], &[0.5]).is_err());
    assert!(sample_rows(&t, &[&ok, &params(f64::NAN, 0, 1.0)], &[0.5, 0.5]).is_err());
    assert!(sample_rows(&t, &[&ok, &params(1.0, 0, 0.0)], &[0.5, 0.5]).is_err());
    assert!(sample_rows(&t, &[&ok, &params(1e-50, 0, 1.0)], &[0.5, 0.5]).is_err());
    assert!(sample_rows(&t, &[&ok, &ok], &[0.5, 1.0]).is_err());
    assert!(sample_rows(&t, &[&ok, &ok], &[0.5, f64::NAN]).is_err());
    let flat = Tensor::zeros(4, DType::F32, &dev).unwrap();
    assert!(sample_rows(&flat, &[&ok], &[0.5]).is_err());
    let ints = Tensor::zeros((1, 4), DType::U32, &dev).unwrap();
    assert!(sample_rows(&ints, &[&ok], &[0.5]).is_err());
    let empty = Tensor::zeros((0, 4), DType::F32, &dev).unwrap();
    assert!(sample_rows(&empty, &[], &[]).unwrap().is_empty());
}
