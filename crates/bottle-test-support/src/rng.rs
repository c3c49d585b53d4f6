//! A small seeded random generator the fuzz campaign and the secret
//! corpus share: every case and every corpus value is a pure function of a
//! seed, so a failure replays and two runs measure the same thing.

/// Decimal digits.
pub const DIGITS: &[u8] = b"0123456789";
/// Lower-case hex.
pub const HEX: &[u8] = b"0123456789abcdef";

/// A small seeded generator (SplitMix64): tiny, fast, and good enough to
/// pick mutations and make corpus values; nothing here needs more than
/// well-spread bits.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// The generator for case `index` of `target` in the campaign `seed`
    /// (a fuzz case replays from those three numbers alone).
    pub fn for_case(seed: u64, target: &str, index: u64) -> Self {
        let mut mix = Rng(seed);
        let mut state = mix.next_u64() ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        for byte in target.bytes() {
            state = (state ^ u64::from(byte)).wrapping_mul(0x0100_0000_01B3);
        }
        Rng(state)
    }

    /// The generator for `stream` under `seed`: different streams (one per
    /// format and sample, one per benign generator and index) are
    /// independent, so adding one leaves every other unchanged.
    pub fn new(seed: u64, stream: &str) -> Self {
        // FNV-1a over the stream's name, mixed with the seed.
        let mut state = seed ^ 0xCBF2_9CE4_8422_2325;
        for byte in stream.bytes() {
            state = (state ^ u64::from(byte)).wrapping_mul(0x0100_0000_01B3);
        }
        let mut rng = Rng(state);
        rng.next_u64();
        rng
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

    /// A number in `lo..=hi`.
    pub fn between(&mut self, lo: usize, hi: usize) -> usize {
        lo + self.below(hi.saturating_sub(lo) + 1)
    }

    /// One element of a non-empty slice.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    /// `len` characters drawn uniformly from `alphabet` (ASCII).
    pub fn string(&mut self, alphabet: &[u8], len: usize) -> String {
        (0..len).map(|_| char::from(*self.pick(alphabet))).collect()
    }

    /// `len` decimal digits, the first not `0` (an id, not a padded number).
    pub fn number(&mut self, len: usize) -> String {
        let mut out = self.string(b"123456789", 1.min(len));
        out.push_str(&self.string(DIGITS, len.saturating_sub(1)));
        out
    }

    /// `len` random bytes.
    pub fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.next_u64() as u8).collect()
    }

    /// Fewer than `max` random bytes.
    pub fn bytes_below(&mut self, max: usize) -> Vec<u8> {
        let len = self.below(max);
        self.bytes(len)
    }

    /// True with probability `1 / n`.
    pub fn one_in(&mut self, n: usize) -> bool {
        self.below(n) == 0
    }

    /// `len` random bytes as lower-case hex (what a digest looks like).
    pub fn hex(&mut self, len: usize) -> String {
        self.string(HEX, len)
    }

    /// A random (version 4) UUID.
    pub fn uuid(&mut self) -> String {
        let h = self.hex(32);
        let variant = char::from(*self.pick(b"89ab"));
        format!(
            "{}-{}-4{}-{variant}{}-{}",
            &h[..8],
            &h[8..12],
            &h[13..16],
            &h[17..20],
            &h[20..]
        )
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
