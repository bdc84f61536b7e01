//! A tiny deterministic generator (SplitMix64) and string hashing (FNV-1a), used for shuffles,
//! validation hold-outs and dataset mixing. Chosen over `rand` so that the streams are defined
//! here, stable across dependency upgrades, and a cursor is just a few integers.

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
        let x = SplitMix64(3).next_f64();
        assert!((0.0..1.0).contains(&x));
    }
}
