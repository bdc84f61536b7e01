//! The one seeded-random module of mtrl: a tiny deterministic generator (SplitMix64), string
//! hashing (FNV-1a) and the seed derivations every crate uses — shuffles, validation hold-outs,
//! dataset mixing, teacher choices, bootstrap resamples, random-init weights and the per-generation
//! sampling seeds of rollouts. Chosen over `rand` so that the streams are defined here, stable
//! across dependency upgrades, and a cursor is just a few integers.
//!
//! Invariant: every seed a run derives goes through this module, so "same seed, same run" is a
//! property of one file. The one stream defined elsewhere is the engine's per-token draw
//! (`mtrl_model::sampler`, ChaCha8 seeded with [`sample_seed`]'s value), kept because its stream
//! is `rand_chacha`'s documented, version-stable one.

/// SplitMix64 (Steele, Lea, Flood 2014).
#[derive(Debug, Clone)]
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix(self.0)
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in 0..n (n > 0; modulo bias is negligible for the sizes used here).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }
}

/// The SplitMix64 finaliser: a bijective mix of 64 bits.
pub fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// One SplitMix64 output from state `z` (the generator's step then its finaliser): what
/// `SplitMix64(z).next_u64()` returns, as a pure function for seed derivations.
pub fn splitmix(z: u64) -> u64 {
    mix(z.wrapping_add(0x9E37_79B9_7F4A_7C15))
}

/// The sampling seed of one generation of a rollout: turn `turn` of sample `sample` of group
/// `group` under run seed `seed`. A pure function of the four, so what a sequence samples does not
/// depend on which other sequences share its decode batches (given the same logits).
pub fn sample_seed(seed: u64, group: u64, sample: u64, turn: u64) -> u64 {
    splitmix(splitmix(splitmix(splitmix(seed) ^ group) ^ sample) ^ turn)
}

/// FNV-1a of a string, mixed with `seed`.
pub fn hash_str(seed: u64, s: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.as_bytes() {
        h ^= *b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01B3);
    }
    mix(h ^ mix(seed))
}

/// A Fisher-Yates permutation of 0..n determined by `seed`.
pub fn permutation(n: usize, seed: u64) -> Vec<usize> {
    let mut p: Vec<usize> = (0..n).collect();
    let mut rng = SplitMix64(seed);
    for i in (1..n).rev() {
        let j = rng.below(i + 1);
        p.swap(i, j);
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sample_seed_depends_on_every_coordinate() {
        // The values of the formula rollouts used before it moved here (worked out in Python):
        // a change would silently change every run's sampled tokens.
        assert_eq!(sample_seed(0, 1, 2, 3), 0x1467_336e_db96_2514);
        assert_eq!(sample_seed(7, 100, 3, 0), 0x54e9_bead_febe_3063);
        let s = sample_seed(0, 1, 2, 3);
        assert_eq!(s, sample_seed(0, 1, 2, 3));
        for other in [
            sample_seed(1, 1, 2, 3),
            sample_seed(0, 2, 2, 3),
            sample_seed(0, 1, 3, 3),
            sample_seed(0, 1, 2, 4),
            sample_seed(0, 2, 1, 3),
        ] {
            assert_ne!(s, other);
        }
    }

    #[test]
    fn deterministic_and_a_permutation() {
        // First output of SplitMix64 seeded with 0 (reference value of the published algorithm).
        assert_eq!(SplitMix64(0).next_u64(), 0xE220_A839_7B1D_CDAF);
        let p = permutation(100, 7);
        assert_eq!(p, permutation(100, 7));
        assert_ne!(p, permutation(100, 8));
        let mut s = p.clone();
        s.sort();
        assert_eq!(s, (0..100).collect::<Vec<_>>());
        assert_eq!(hash_str(1, "a"), hash_str(1, "a"));
        assert_ne!(hash_str(1, "a"), hash_str(2, "a"));
        assert_eq!(splitmix(0), SplitMix64(0).next_u64());
        let x = SplitMix64(3).next_f64();
        assert!((0.0..1.0).contains(&x));
    }
}
