//! RFC 6455 frame heads: parsing what a peer sent, writing what the relay
//! sends. Payloads stream separately, so a frame is never held whole.

use tokio::io::{AsyncRead, AsyncReadExt};

/// A frame's opcode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Opcode {
    Continuation,
    Text,
    Binary,
    Close,
    Ping,
    Pong,
}

impl Opcode {
    fn from_bits(bits: u8) -> Option<Self> {
        Some(match bits {
            0x0 => Self::Continuation,
            0x1 => Self::Text,
            0x2 => Self::Binary,
            0x8 => Self::Close,
            0x9 => Self::Ping,
            0xA => Self::Pong,
            _ => return None,
        })
    }

    fn bits(self) -> u8 {
        match self {
            Self::Continuation => 0x0,
            Self::Text => 0x1,
            Self::Binary => 0x2,
            Self::Close => 0x8,
            Self::Ping => 0x9,
            Self::Pong => 0xA,
        }
    }

    /// Close, ping and pong: never fragmented, at most 125 bytes.
    pub(crate) fn is_control(self) -> bool {
        matches!(self, Self::Close | Self::Ping | Self::Pong)
    }
}

/// The most payload a control frame may carry.
pub(crate) const MAX_CONTROL_PAYLOAD: u64 = 125;

/// One frame's head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Head {
    pub fin: bool,
    pub opcode: Opcode,
    /// The payload's masking key, when the frame is masked (every frame a
    /// client sends must be).
    pub mask: Option<[u8; 4]>,
    pub len: u64,
}

/// Why a peer's frames cannot be relayed: each is a close code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Violation {
    /// Not the protocol: reserved bits without an extension, an unknown
    /// opcode, an unmasked client frame, a fragmented or long control
    /// frame, a continuation with no message.
    #[error("protocol error: {0}")]
    Protocol(&'static str),
    /// A frame or message over the bound.
    #[error("message too big: over {0} bytes")]
    TooBig(u64),
}

impl Violation {
    /// The close code it ends the socket with.
    pub(crate) fn code(&self) -> u16 {
        match self {
            Self::Protocol(_) => 1002,
            Self::TooBig(_) => 1009,
        }
    }
}

/// Reads one frame head; `Ok(None)` at a clean end of stream before it.
pub(crate) async fn read_head<R: AsyncRead + Unpin>(
    r: &mut R,
) -> std::io::Result<Option<Result<Head, Violation>>> {
    let mut two = [0u8; 2];
    match r.read(&mut two[..1]).await? {
        0 => return Ok(None),
        _ => r.read_exact(&mut two[1..]).await?,
    };
    let fin = two[0] & 0x80 != 0;
    if two[0] & 0x70 != 0 {
        return Ok(Some(Err(Violation::Protocol(
            "reserved bits set, and no extension was agreed",
        ))));
    }
    let Some(opcode) = Opcode::from_bits(two[0] & 0x0F) else {
        return Ok(Some(Err(Violation::Protocol("unknown opcode"))));
    };
    let masked = two[1] & 0x80 != 0;
    let len = match two[1] & 0x7F {
        126 => {
            let mut ext = [0u8; 2];
            r.read_exact(&mut ext).await?;
            u64::from(u16::from_be_bytes(ext))
        }
        127 => {
            let mut ext = [0u8; 8];
            r.read_exact(&mut ext).await?;
            let len = u64::from_be_bytes(ext);
            if len >> 63 != 0 {
                return Ok(Some(Err(Violation::Protocol(
                    "payload length with its top bit set",
                ))));
            }
            len
        }
        n => u64::from(n),
    };
    let mask = if masked {
        let mut key = [0u8; 4];
        r.read_exact(&mut key).await?;
        Some(key)
    } else {
        None
    };
    if opcode.is_control() && (!fin || len > MAX_CONTROL_PAYLOAD) {
        return Ok(Some(Err(Violation::Protocol(
            "a control frame fragmented or over 125 bytes",
        ))));
    }
    Ok(Some(Ok(Head {
        fin,
        opcode,
        mask,
        len,
    })))
}

/// The bytes of `head`, for a payload of `head.len` bytes.
pub(crate) fn write_head(head: &Head) -> Vec<u8> {
    let mut out = Vec::with_capacity(14);
    out.push(u8::from(head.fin) << 7 | head.opcode.bits());
    let mask_bit = if head.mask.is_some() { 0x80 } else { 0 };
    match head.len {
        n @ 0..=125 => out.push(mask_bit | n as u8),
        n @ 126..=0xFFFF => {
            out.push(mask_bit | 126);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            out.push(mask_bit | 127);
            out.extend_from_slice(&n.to_be_bytes());
        }
    }
    if let Some(key) = head.mask {
        out.extend_from_slice(&key);
    }
    out
}

/// XORs `data` with `key`, `offset` bytes into the payload.
pub(crate) fn apply_mask(data: &mut [u8], key: [u8; 4], offset: u64) {
    for (i, b) in data.iter_mut().enumerate() {
        *b ^= key[((offset + i as u64) % 4) as usize];
    }
}

/// A close frame's payload: the code, then a reason cut to fit 125 bytes
/// on a character boundary.
pub(crate) fn close_payload(code: u16, reason: &str) -> Vec<u8> {
    let mut cut = reason.len().min(MAX_CONTROL_PAYLOAD as usize - 2);
    while !reason.is_char_boundary(cut) {
        cut -= 1;
    }
    let mut out = code.to_be_bytes().to_vec();
    out.extend_from_slice(&reason.as_bytes()[..cut]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn parse(bytes: &[u8]) -> Option<Result<Head, Violation>> {
        let mut r = bytes;
        read_head(&mut r).await.unwrap()
    }

    #[tokio::test]
    async fn heads_round_trip_at_every_length_form() {
        for len in [0, 5, 125, 126, 65_535, 65_536, 1 << 40] {
            for mask in [None, Some([1, 2, 3, 4])] {
                let head = Head {
                    fin: len % 2 == 0,
                    opcode: Opcode::Binary,
                    mask,
                    len,
                };
                assert_eq!(parse(&write_head(&head)).await, Some(Ok(head)), "{len}");
            }
        }
        assert_eq!(parse(b"").await, None, "a clean end");
    }

    #[tokio::test]
    async fn what_the_protocol_forbids_is_a_violation() {
        for (bytes, why) in [
            (&[0xC1, 0x80, 0, 0, 0, 0][..], "reserved bits (compression)"),
            (&[0x83, 0x80, 0, 0, 0, 0], "unknown opcode"),
            (&[0x09, 0x80, 0, 0, 0, 0], "fragmented ping"),
            (&[0x89, 0xFE, 0, 200, 0, 0, 0, 0], "long ping"),
            (
                &[0x82, 0xFF, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
                "top length bit",
            ),
        ] {
            let got = parse(bytes).await.unwrap();
            assert!(matches!(got, Err(Violation::Protocol(_))), "{why}: {got:?}");
        }
    }

    #[test]
    fn masking_twice_is_the_identity_wherever_a_chunk_starts() {
        let data: Vec<u8> = (0..=255).collect();
        let key = [0x37, 0xfa, 0x21, 0x3d];
        let mut whole = data.clone();
        apply_mask(&mut whole, key, 0);
        let mut pieces = data.clone();
        let (a, b) = pieces.split_at_mut(7);
        apply_mask(a, key, 0);
        apply_mask(b, key, 7);
        assert_eq!(whole, pieces);
        apply_mask(&mut whole, key, 0);
        assert_eq!(whole, data);
    }

    #[test]
    fn a_close_reason_is_cut_to_fit_on_a_character_boundary() {
        let payload = close_payload(1008, &"é".repeat(100));
        assert!(payload.len() <= 125);
        assert_eq!(&payload[..2], &1008u16.to_be_bytes());
        assert!(std::str::from_utf8(&payload[2..]).is_ok());
    }
}
