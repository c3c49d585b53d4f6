//! A small seeded generator (SplitMix64): every case is a pure function of
//! the campaign's seed, its target and its index, so a failure replays
//! from those three numbers alone.

/// SplitMix64: tiny, fast and good enough to pick mutations.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// The generator for case `index` of `target` in the campaign `seed`.
    pub fn for_case(seed: u64, target: &str, index: u64) -> Self {
        let mut mix = Rng(seed);
        let mut state = mix.next_u64() ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        for byte in target.bytes() {
            state = (state ^ u64::from(byte)).wrapping_mul(0x0100_0000_01B3);
        }
        Rng(state)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`0` when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            return 0;
        }
        usize::try_from(self.next_u64() % n as u64).unwrap_or(0)
    }

    /// True with probability `1 / n`.
    pub fn one_in(&mut self, n: usize) -> bool {
        self.below(n) == 0
    }

    /// One element of a non-empty slice.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    /// Fewer than `max` random bytes.
    pub fn bytes(&mut self, max: usize) -> Vec<u8> {
        let len = self.below(max);
        (0..len).map(|_| self.next_u64() as u8).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::Rng;

    #[test]
    fn cases_replay_and_differ() {
        let a: Vec<u64> = (0..4)
            .map(|i| Rng::for_case(7, "proxy", i).next_u64())
            .collect();
        let b: Vec<u64> = (0..4)
            .map(|i| Rng::for_case(7, "proxy", i).next_u64())
            .collect();
        assert_eq!(a, b);
        assert_ne!(a[0], a[1]);
        assert_ne!(
            Rng::for_case(7, "proxy", 0).next_u64(),
            Rng::for_case(7, "gitgate", 0).next_u64()
        );
        assert!((0..100).all(|_| Rng::for_case(1, "x", 2).below(3) < 3));
    }
}
