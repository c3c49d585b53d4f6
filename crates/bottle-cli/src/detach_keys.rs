//! The detach key sequence of `bottle attach`, written like Docker's
//! `--detach-keys` (`ctrl-p,ctrl-q`, the default), and the matcher that
//! finds it in the operator's keystrokes.

use std::str::FromStr;

/// Docker's default, so the operator's habit carries over.
pub(crate) const DEFAULT_DETACH_KEYS: &str = "ctrl-p,ctrl-q";

/// A non-empty sequence of bytes that detaches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DetachKeys(Vec<u8>);

impl FromStr for DetachKeys {
    type Err = String;

    fn from_str(text: &str) -> Result<DetachKeys, String> {
        let keys = text
            .split(',')
            .map(|key| {
                let key = key.trim();
                match key.strip_prefix("ctrl-") {
                    // ctrl-a..ctrl-z and ctrl-@ [ \ ] ^ _ are the codes
                    // 0x00..0x1f a terminal sends for them.
                    Some(rest) => match rest.as_bytes() {
                        [c @ b'a'..=b'z'] => Ok(c - b'a' + 1),
                        [c @ (b'@' | b'[' | b'\\' | b']' | b'^' | b'_')] => Ok(c - b'@'),
                        _ => Err(format!("{key:?} is not a control key (ctrl-a..ctrl-z, ctrl-@, ctrl-[, ctrl-\\, ctrl-], ctrl-^, ctrl-_)")),
                    },
                    None => match key.as_bytes() {
                        [c] if c.is_ascii_graphic() => Ok(*c),
                        _ => Err(format!("{key:?} is not one printable character or ctrl-KEY")),
                    },
                }
            })
            .collect::<Result<Vec<u8>, String>>()?;
        Ok(DetachKeys(keys))
    }
}

/// Passes keystrokes through until the detach sequence is typed. Bytes
/// that might begin it are held back until the next byte decides; a
/// sequence broken off is passed on whole, so no keystroke is lost.
#[derive(Debug)]
pub(crate) struct Matcher {
    keys: DetachKeys,
    matched: usize,
}

impl Matcher {
    pub(crate) fn new(keys: DetachKeys) -> Matcher {
        Matcher { keys, matched: 0 }
    }

    /// The bytes to forward from `input`, and whether the sequence was
    /// completed (then the rest of `input` is dropped).
    pub(crate) fn feed(&mut self, input: &[u8]) -> (Vec<u8>, bool) {
        let keys = &self.keys.0;
        let mut forward = Vec::with_capacity(input.len());
        for &byte in input {
            if byte == keys[self.matched] {
                self.matched += 1;
                if self.matched == keys.len() {
                    self.matched = 0;
                    return (forward, true);
                }
                continue;
            }
            forward.extend_from_slice(&keys[..self.matched]);
            self.matched = usize::from(byte == keys[0]);
            if self.matched == 0 {
                forward.push(byte);
            }
        }
        (forward, false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(text: &str) -> DetachKeys {
        text.parse().unwrap()
    }

    #[test]
    fn docker_spellings_parse_to_their_bytes() {
        assert_eq!(keys(DEFAULT_DETACH_KEYS), DetachKeys(vec![0x10, 0x11]));
        assert_eq!(keys("ctrl-a,x"), DetachKeys(vec![0x01, b'x']));
        assert_eq!(keys("ctrl-@,ctrl-_"), DetachKeys(vec![0x00, 0x1f]));
        for bad in ["", "ctrl-", "ctrl-1", "xy", "ctrl-p,,ctrl-q", " "] {
            assert!(bad.parse::<DetachKeys>().is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn the_sequence_detaches_and_is_not_forwarded() {
        let mut matcher = Matcher::new(keys(DEFAULT_DETACH_KEYS));
        assert_eq!(matcher.feed(b"ls\r"), (b"ls\r".to_vec(), false));
        assert_eq!(matcher.feed(b"a\x10\x11rest"), (b"a".to_vec(), true));
    }

    #[test]
    fn the_sequence_may_arrive_split_across_reads() {
        let mut matcher = Matcher::new(keys(DEFAULT_DETACH_KEYS));
        assert_eq!(matcher.feed(b"x\x10"), (b"x".to_vec(), false));
        assert_eq!(matcher.feed(b"\x11"), (Vec::new(), true));
    }

    #[test]
    fn a_broken_off_prefix_is_forwarded_whole() {
        let mut matcher = Matcher::new(keys(DEFAULT_DETACH_KEYS));
        // ctrl-p then another key: both reach the agent (ctrl-p is also
        // "previous line" in a shell).
        assert_eq!(matcher.feed(b"\x10"), (Vec::new(), false));
        assert_eq!(matcher.feed(b"k"), (b"\x10k".to_vec(), false));
        // A repeated first key restarts the match rather than losing it.
        assert_eq!(matcher.feed(b"\x10\x10\x11"), (b"\x10".to_vec(), true));
    }
}
