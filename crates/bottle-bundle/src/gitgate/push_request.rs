//! The framing of a receive-pack request, read in full before receive-pack
//! runs, so that the gate checks every ref update receive-pack would act
//! on.
//!
//! The grammar is git's (`Documentation/gitprotocol-pack.adoc`, "Reference
//! Update Request and Packfile Transfer"):
//!
//! ```text
//! update-requests = *shallow ( command-list | push-cert )
//! shallow         = PKT-LINE("shallow" SP obj-id)
//! command-list    = PKT-LINE(command NUL capability-list) *PKT-LINE(command) flush-pkt
//! push-cert       = PKT-LINE("push-cert" NUL capability-list LF)
//!                   PKT-LINE("certificate version 0.1" LF) ...header lines...
//!                   PKT-LINE(LF) *PKT-LINE(command LF)
//!                   *PKT-LINE(gpg-signature-lines LF) PKT-LINE("push-cert-end" LF)
//! push-options    = *PKT-LINE(push-option) flush-pkt   (when negotiated)
//! packfile        = "PACK" 28*(OCTET)
//! ```
//!
//! receive-pack itself is more lenient than this grammar (capabilities on
//! any line, `shallow` lines between commands, commands both inside a
//! certificate and after it, certificate text split across packets any
//! way). Each leniency is a place where the gate and receive-pack could
//! read different commands from the same bytes, so the gate accepts only
//! the grammar, in the shapes `git send-pack` writes, and refuses anything
//! else as malformed. A certificate is parsed in full (its commands and
//! any after it) so that the refusal and the audit name every ref.

use super::pktline::{MAX_PAYLOAD, Packet, PktError, read_packet};
use super::push_rules::{RefUpdate, normalize_push_ref};

/// Most ref updates one push may carry.
pub const MAX_UPDATES: usize = 10_000;
/// Most `shallow` lines one push may carry.
pub const MAX_SHALLOW: usize = 10_000;
/// Most push options one push may carry.
pub const MAX_PUSH_OPTIONS: usize = 100;
/// Largest push certificate, in bytes of its lines.
pub const MAX_CERT_BYTES: usize = 1 << 20;

/// A receive-pack request's framing, up to the packfile.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PushRequest {
    /// The client's shallow boundary (`shallow <oid>` lines).
    pub shallow: Vec<String>,
    /// Every ref update: those of a certificate, then any after it.
    pub updates: Vec<RefUpdate>,
    /// Capabilities the client asked for (after the NUL of the first
    /// command or of the `push-cert` line).
    pub caps: Vec<String>,
    /// The request is a signed push (it carries a push certificate).
    pub signed: bool,
    /// Push options sent after the command list.
    pub push_options: Vec<String>,
}

impl PushRequest {
    /// Whether the client asked for capability `cap`.
    pub fn has_cap(&self, cap: &str) -> bool {
        self.caps.iter().any(|c| c == cap)
    }

    /// The side-band packet size the client asked for, if any.
    pub fn sideband(&self) -> Option<usize> {
        if self.has_cap("side-band-64k") {
            Some(MAX_PAYLOAD - 1)
        } else if self.has_cap("side-band") {
            Some(999)
        } else {
            None
        }
    }

    /// Whether the client expects a report-status.
    pub fn wants_report(&self) -> bool {
        self.has_cap("report-status") || self.has_cap("report-status-v2")
    }

    /// The refs the request updates, space-separated (for the audit).
    pub fn refs(&self) -> String {
        self.updates
            .iter()
            .map(|u| u.refname.as_str())
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// The object-id length the client's `object-format` implies.
    fn oid_len(&self) -> usize {
        if self.has_cap("object-format=sha256") {
            64
        } else {
            40
        }
    }
}

/// What is wrong with a request's framing. The messages are shown to the
/// client; each says what to do instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FramingError {
    /// The bytes are not pkt-lines.
    #[error("the request is not pkt-line framed ({0}); fix: push with a git client")]
    NotPktLines(String),
    /// The body ended before the framing did.
    #[error("the request ended inside its {0}; fix: push with a git client")]
    Truncated(&'static str),
    /// A packet that has no place at this point of the request.
    #[error("unexpected {packet} in the {part}; fix: push with a git client")]
    UnexpectedPacket {
        /// `delimiter packet`, `empty packet`, ...
        packet: &'static str,
        /// Where it was.
        part: &'static str,
    },
    /// A `shallow` line that is not `shallow <oid>`, or one after a command.
    #[error("{0}; fix: push with a git client")]
    Shallow(String),
    /// A line that is not `old new refname`.
    #[error("{0:?} is not an `old-oid new-oid refname` command; fix: push with a git client")]
    Command(String),
    /// A ref name git would not accept.
    #[error("{0}")]
    RefName(String),
    /// Capabilities somewhere other than the first line.
    #[error("capabilities are only allowed on the first command line; fix: push with a git client")]
    LateCapabilities,
    /// The first line carries no capabilities.
    #[error("the first command line carries no capabilities; fix: push with a git client")]
    NoCapabilities,
    /// An object id of the wrong length for the negotiated object format.
    #[error("object id {0:?} does not match the push's object format; fix: push with a git client")]
    ObjectFormat(String),
    /// A push certificate that is not in git's shape.
    #[error("the push certificate is malformed: {0}; fix: push without --signed")]
    Certificate(String),
    /// More than the gate reads of something.
    #[error("the push carries more than {limit} {what}; fix: push fewer refs at once")]
    TooMany {
        /// What there was too much of.
        what: &'static str,
        /// The bound.
        limit: usize,
    },
    /// What follows the commands is not a packfile.
    #[error(
        "the data after the commands is not a packfile (it does not start with PACK); fix: push with a git client"
    )]
    NotAPack,
}

/// A request whose framing is wrong, with what was read before the fault
/// (to answer in the client's capabilities and to audit the refs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Malformed {
    /// The fault.
    pub error: FramingError,
    /// What was read before it.
    pub partial: PushRequest,
}

/// Parses the framing at the start of `buf`. `ended`: no more bytes will
/// come. `Ok(None)`: more bytes are needed (only when not `ended`). On
/// success, the framing ends where the packfile (if any) starts.
pub fn parse_push_request(buf: &[u8], ended: bool) -> Result<Option<PushRequest>, Malformed> {
    let mut parser = Parser {
        buf,
        pos: 0,
        ended,
        req: PushRequest::default(),
    };
    match parser.request() {
        Ok(Step::Done) => Ok(Some(parser.req)),
        Ok(Step::NeedMore) => Ok(None),
        Err(error) => Err(Malformed {
            error,
            partial: parser.req,
        }),
    }
}

enum Step {
    Done,
    NeedMore,
}

/// Returns early with [`Step::NeedMore`].
macro_rules! need {
    ($e:expr) => {
        match $e? {
            Some(v) => v,
            None => return Ok(Step::NeedMore),
        }
    };
}

struct Parser<'a> {
    buf: &'a [u8],
    pos: usize,
    ended: bool,
    req: PushRequest,
}

impl<'a> Parser<'a> {
    /// The next packet, `None` when more bytes are needed.
    fn packet(&mut self, part: &'static str) -> Result<Option<Packet<'a>>, FramingError> {
        let buf: &'a [u8] = self.buf;
        match read_packet(&buf[self.pos..]) {
            Ok((packet, len)) => {
                self.pos += len;
                Ok(Some(packet))
            }
            Err(PktError::Incomplete) if self.ended => Err(FramingError::Truncated(part)),
            Err(PktError::Incomplete) => Ok(None),
            Err(PktError::Invalid(e)) => Err(FramingError::NotPktLines(e)),
        }
    }

    /// The next data packet; a flush is `Some(None)`.
    fn line(&mut self, part: &'static str) -> Result<Option<Option<&'a [u8]>>, FramingError> {
        let unexpected = |packet| FramingError::UnexpectedPacket { packet, part };
        Ok(match self.packet(part)? {
            None => None,
            Some(Packet::Flush) => Some(None),
            Some(Packet::Data([])) => return Err(unexpected("empty packet")),
            Some(Packet::Data(d)) => Some(Some(d)),
            Some(Packet::Delim) => return Err(unexpected("delimiter packet")),
            Some(Packet::ResponseEnd) => return Err(unexpected("response-end packet")),
        })
    }

    fn request(&mut self) -> Result<Step, FramingError> {
        // Shallow lines, then the first command or the certificate.
        let first = loop {
            let Some(line) = need!(self.line("command list")) else {
                // An empty command list: receive-pack does nothing.
                return self.after_commands();
            };
            let line = chomp(line);
            match line.strip_prefix(b"shallow ") {
                Some(oid) => self.shallow(oid)?,
                None => break line,
            }
        };
        let (head, caps) = split_caps(first);
        let caps = caps.ok_or(FramingError::NoCapabilities)?;
        self.req.caps = String::from_utf8_lossy(caps)
            .split(' ')
            .filter(|c| !c.is_empty())
            .map(str::to_string)
            .collect();
        if head == b"push-cert" {
            self.req.signed = true;
            need!(self.certificate());
        } else {
            self.command(head)?;
        }
        while let Some(line) = need!(self.line("command list")) {
            let line = chomp(line);
            if line.starts_with(b"shallow ") {
                return Err(FramingError::Shallow(
                    "a shallow line comes after a command".into(),
                ));
            }
            if line.contains(&0) {
                return Err(FramingError::LateCapabilities);
            }
            if line == b"push-cert" {
                return Err(FramingError::Certificate(
                    "a second certificate, or one after commands".into(),
                ));
            }
            self.command(line)?;
        }
        self.check_object_format()?;
        if self.req.has_cap("push-options") {
            need!(self.push_options());
        }
        self.after_commands()
    }

    fn shallow(&mut self, oid: &[u8]) -> Result<(), FramingError> {
        if self.req.shallow.len() >= MAX_SHALLOW {
            return Err(FramingError::TooMany {
                what: "shallow lines",
                limit: MAX_SHALLOW,
            });
        }
        let text = std::str::from_utf8(oid).ok().filter(|t| is_hex_oid(t));
        let Some(oid) = text else {
            return Err(FramingError::Shallow(format!(
                "{:?} is not `shallow <object-id>`",
                String::from_utf8_lossy(oid)
            )));
        };
        self.req.shallow.push(oid.to_ascii_lowercase());
        Ok(())
    }

    fn command(&mut self, line: &[u8]) -> Result<(), FramingError> {
        if self.req.updates.len() >= MAX_UPDATES {
            return Err(FramingError::TooMany {
                what: "ref updates",
                limit: MAX_UPDATES,
            });
        }
        let shown = || String::from_utf8_lossy(line).chars().take(200).collect();
        let text = std::str::from_utf8(line).map_err(|_| FramingError::Command(shown()))?;
        let update = RefUpdate::parse(text).ok_or_else(|| FramingError::Command(shown()))?;
        match normalize_push_ref(&update.refname) {
            Ok(full) if full == update.refname && full.starts_with("refs/") => {}
            Ok(_) => {
                return Err(FramingError::RefName(format!(
                    "{:?} is not a full ref name; fix: push to refs/heads/<branch>",
                    update.refname
                )));
            }
            Err(e) => return Err(FramingError::RefName(e)),
        }
        self.req.updates.push(update);
        Ok(())
    }

    /// The certificate, after its `push-cert` line, through `push-cert-end`.
    /// Every line is one packet ending in LF, as `git send-pack` writes it.
    fn certificate(&mut self) -> Result<Option<()>, FramingError> {
        let malformed = |what: &str| FramingError::Certificate(what.to_string());
        let start = self.pos;
        let mut in_header = true;
        let mut in_signature = false;
        let mut first = true;
        loop {
            if self.pos - start > MAX_CERT_BYTES {
                return Err(FramingError::TooMany {
                    what: "bytes of push certificate",
                    limit: MAX_CERT_BYTES,
                });
            }
            let Some(line) = self.line("push certificate")? else {
                return Ok(None);
            };
            let Some(line) = line else {
                return Err(malformed("it ends with a flush before push-cert-end"));
            };
            let Some(text) = line.strip_suffix(b"\n") else {
                return Err(malformed("a line does not end with LF"));
            };
            if text.contains(&b'\n') || text.contains(&0) {
                return Err(malformed("a packet holds more than one line"));
            }
            if text == b"push-cert-end" {
                if in_header {
                    return Err(malformed("it has no blank line before its commands"));
                }
                return Ok(Some(()));
            }
            if first {
                if text != b"certificate version 0.1" {
                    return Err(malformed(
                        "it does not start with `certificate version 0.1`",
                    ));
                }
                first = false;
            } else if in_header {
                if text.is_empty() {
                    in_header = false;
                } else if !CERT_HEADERS.iter().any(|h| text.starts_with(h)) {
                    return Err(malformed(
                        "a header line is not pusher, pushee, nonce or push-option",
                    ));
                }
            } else if in_signature || text.starts_with(b"-----BEGIN ") {
                in_signature = true;
            } else {
                self.command(text)?;
            }
        }
    }

    fn push_options(&mut self) -> Result<Option<()>, FramingError> {
        loop {
            let Some(line) = self.line("push options")? else {
                return Ok(None);
            };
            let Some(option) = line else {
                return Ok(Some(()));
            };
            if self.req.push_options.len() >= MAX_PUSH_OPTIONS {
                return Err(FramingError::TooMany {
                    what: "push options",
                    limit: MAX_PUSH_OPTIONS,
                });
            }
            self.req
                .push_options
                .push(String::from_utf8_lossy(chomp(option)).into_owned());
        }
    }

    /// What follows the framing: nothing (a push of deletions only), a
    /// trailing flush, or a packfile.
    fn after_commands(&mut self) -> Result<Step, FramingError> {
        let rest = &self.buf[self.pos..];
        if rest.len() < 4 {
            if !self.ended {
                return Ok(Step::NeedMore);
            }
            if rest.is_empty() {
                return Ok(Step::Done);
            }
            return Err(FramingError::NotAPack);
        }
        if rest.starts_with(b"PACK") || rest.starts_with(b"0000") {
            Ok(Step::Done)
        } else {
            Err(FramingError::NotAPack)
        }
    }

    fn check_object_format(&self) -> Result<(), FramingError> {
        let len = self.req.oid_len();
        let updates = self.req.updates.iter().flat_map(|u| [&u.old, &u.new]);
        match self
            .req
            .shallow
            .iter()
            .chain(updates)
            .find(|o| o.len() != len)
        {
            Some(oid) => Err(FramingError::ObjectFormat(oid.clone())),
            None => Ok(()),
        }
    }
}

/// The header lines a certificate may hold after its version line.
const CERT_HEADERS: [&[u8]; 4] = [b"pusher ", b"pushee ", b"nonce ", b"push-option "];

/// A line without its one trailing LF (git's `PACKET_READ_CHOMP_NEWLINE`).
fn chomp(line: &[u8]) -> &[u8] {
    line.strip_suffix(b"\n").unwrap_or(line)
}

/// The line before its NUL, and the capabilities after it.
fn split_caps(line: &[u8]) -> (&[u8], Option<&[u8]>) {
    match line.iter().position(|&b| b == 0) {
        Some(nul) => (&line[..nul], Some(&line[nul + 1..])),
        None => (line, None),
    }
}

fn is_hex_oid(s: &str) -> bool {
    (s.len() == 40 || s.len() == 64) && s.bytes().all(|b| b.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use super::super::pktline::{FLUSH, pkt};
    use super::*;

    const OLD: &str = "1111111111111111111111111111111111111111";
    const NEW: &str = "2222222222222222222222222222222222222222";
    const CAPS: &str = "report-status side-band-64k agent=git/2.47";

    fn cmd(refname: &str) -> String {
        format!("{OLD} {NEW} {refname}")
    }

    /// Joins packets; `None` is a flush, raw bytes are appended as they are.
    fn body(parts: &[Part]) -> Vec<u8> {
        let mut out = Vec::new();
        for p in parts {
            match p {
                Part::Line(l) => out.extend(pkt(l.as_bytes())),
                Part::Flush => out.extend_from_slice(FLUSH),
                Part::Raw(r) => out.extend_from_slice(r),
            }
        }
        out
    }

    /// Whether an error is the one a framing must get.
    type IsError = fn(&FramingError) -> bool;

    enum Part {
        Line(String),
        Flush,
        Raw(&'static [u8]),
    }
    use Part::{Flush, Line, Raw};

    fn first(refname: &str) -> Part {
        Line(format!("{}\0{CAPS}\n", cmd(refname)))
    }

    /// The certificate `git push --signed` sends for `refs`, then `after`.
    fn signed(refs: &[&str], after: Vec<Part>) -> Vec<Part> {
        let mut parts = vec![
            Line(format!("push-cert\0{CAPS}")),
            Line("certificate version 0.1\n".into()),
            Line("pusher agent <agent@bottle.invalid> 1700000000 +0000\n".into()),
            Line("pushee http://gate/work.git\n".into()),
            Line("nonce 1700000000-abc\n".into()),
            Line("\n".into()),
        ];
        parts.extend(refs.iter().map(|r| Line(format!("{}\n", cmd(r)))));
        parts.push(Line("-----BEGIN PGP SIGNATURE-----\n".into()));
        parts.push(Line("iQEzBAABCAAdFiEE\n".into()));
        parts.push(Line("-----END PGP SIGNATURE-----\n".into()));
        parts.push(Line("push-cert-end\n".into()));
        parts.extend(after);
        parts
    }

    fn refs(req: &PushRequest) -> Vec<&str> {
        req.updates.iter().map(|u| u.refname.as_str()).collect()
    }

    #[test]
    fn accepts_the_framings_git_sends() {
        let shallow = Line(format!("shallow {}\n", "3".repeat(40)));
        let table: Vec<(&str, Vec<Part>, Vec<&str>)> = vec![
            (
                "command list and a pack",
                vec![
                    first("refs/heads/a"),
                    Line(cmd("refs/heads/b")),
                    Flush,
                    Raw(b"PACK\0\0\0\x02"),
                ],
                vec!["refs/heads/a", "refs/heads/b"],
            ),
            (
                "deletions only, body ends",
                vec![first("refs/heads/a"), Flush],
                vec!["refs/heads/a"],
            ),
            (
                "deletions only, trailing flush",
                vec![first("refs/heads/a"), Flush, Flush],
                vec!["refs/heads/a"],
            ),
            (
                "shallow lines first",
                vec![shallow, first("refs/heads/a"), Flush, Raw(b"PACK")],
                vec!["refs/heads/a"],
            ),
            (
                "signed push",
                signed(
                    &["refs/heads/main", "refs/heads/agent/x"],
                    vec![Flush, Raw(b"PACK")],
                ),
                vec!["refs/heads/main", "refs/heads/agent/x"],
            ),
            (
                "signed push with commands after the certificate",
                signed(
                    &["refs/heads/agent/x"],
                    vec![Line(cmd("refs/heads/main")), Flush],
                ),
                vec!["refs/heads/agent/x", "refs/heads/main"],
            ),
            ("empty command list", vec![Flush], vec![]),
        ];
        for (name, parts, want) in table {
            let buf = body(&parts);
            let req = parse_push_request(&buf, true)
                .unwrap_or_else(|e| panic!("{name}: {e:?}"))
                .unwrap_or_else(|| panic!("{name}: incomplete"));
            assert_eq!(refs(&req), want, "{name}");
            // A cut never errs: it is "more, please" until the framing
            // and the first bytes after it are in.
            for cut in 0..buf.len() {
                let got = parse_push_request(&buf[..cut], false);
                assert!(
                    got == Ok(None) || got == Ok(Some(req.clone())),
                    "{name} cut {cut}: {got:?}"
                );
            }
        }
    }

    #[test]
    fn reads_capabilities_certificates_shallow_and_options() {
        let buf = body(&signed(&["refs/heads/main"], vec![Flush, Raw(b"PACK")]));
        let req = parse_push_request(&buf, true).unwrap().unwrap();
        assert!(req.signed);
        assert!(req.wants_report());
        assert_eq!(req.sideband(), Some(MAX_PAYLOAD - 1));

        let shallow = "3".repeat(40);
        let buf = body(&[
            Line(format!("shallow {shallow}")),
            Line(format!(
                "{}\0report-status push-options\n",
                cmd("refs/heads/a")
            )),
            Flush,
            Line("ci.skip\n".into()),
            Line("topic=x".into()),
            Flush,
            Raw(b"PACK"),
        ]);
        let req = parse_push_request(&buf, true).unwrap().unwrap();
        assert!(!req.signed);
        assert_eq!(req.shallow, [shallow]);
        assert_eq!(req.push_options, ["ci.skip", "topic=x"]);
        assert_eq!(req.refs(), "refs/heads/a");
    }

    #[test]
    fn refuses_what_is_not_the_grammar() {
        let shallow_late = Line(format!("shallow {}", "3".repeat(40)));
        let mut two_lines = signed(&["refs/heads/a"], vec![Flush]);
        two_lines[5] = Line(format!("\n{}\n", cmd("refs/heads/main")));
        let mut no_blank = signed(&["refs/heads/a"], vec![Flush]);
        no_blank.remove(5);
        let mut flush_inside = signed(&["refs/heads/a"], vec![]);
        flush_inside.insert(7, Flush);
        let mut no_lf = signed(&["refs/heads/a"], vec![Flush]);
        no_lf[6] = Line(cmd("refs/heads/a"));
        let table: Vec<(&str, Vec<Part>, IsError)> = vec![
            ("not pkt-lines", vec![Raw(b"zzzz")], |e| {
                matches!(e, FramingError::NotPktLines(_))
            }),
            (
                "no capabilities",
                vec![Line(cmd("refs/heads/a")), Flush],
                |e| *e == FramingError::NoCapabilities,
            ),
            (
                "garbled command",
                vec![Line("junk\0report-status".into()), Flush],
                |e| matches!(e, FramingError::Command(_)),
            ),
            (
                "capabilities on a later line",
                vec![
                    first("refs/heads/a"),
                    Line(format!("{}\0side-band-64k", cmd("refs/heads/b"))),
                    Flush,
                ],
                |e| *e == FramingError::LateCapabilities,
            ),
            (
                "shallow after a command",
                vec![first("refs/heads/a"), shallow_late, Flush],
                |e| matches!(e, FramingError::Shallow(_)),
            ),
            (
                "garbled shallow",
                vec![Line("shallow xyz".into()), Flush],
                |e| matches!(e, FramingError::Shallow(_)),
            ),
            (
                "delimiter packet",
                vec![first("refs/heads/a"), Raw(b"0001"), Flush],
                |e| matches!(e, FramingError::UnexpectedPacket { .. }),
            ),
            (
                "empty packet",
                vec![first("refs/heads/a"), Raw(b"0004"), Flush],
                |e| matches!(e, FramingError::UnexpectedPacket { .. }),
            ),
            ("not a full ref name", vec![first("main"), Flush], |e| {
                matches!(e, FramingError::RefName(_))
            }),
            (
                "a funny ref name",
                vec![first("refs/heads/a..b"), Flush],
                |e| matches!(e, FramingError::RefName(_)),
            ),
            (
                "sha256 ids without object-format",
                vec![
                    Line(format!(
                        "{} {} refs/heads/a\0report-status",
                        "1".repeat(64),
                        "2".repeat(64)
                    )),
                    Flush,
                ],
                |e| matches!(e, FramingError::ObjectFormat(_)),
            ),
            (
                "not a pack after the commands",
                vec![first("refs/heads/a"), Flush, Raw(b"JUNK")],
                |e| *e == FramingError::NotAPack,
            ),
            (
                "a command line split into two in a certificate",
                two_lines,
                |e| matches!(e, FramingError::Certificate(_)),
            ),
            ("a certificate without its blank line", no_blank, |e| {
                matches!(e, FramingError::Certificate(_))
            }),
            ("a flush inside a certificate", flush_inside, |e| {
                matches!(e, FramingError::Certificate(_))
            }),
            ("a certificate line without LF", no_lf, |e| {
                matches!(e, FramingError::Certificate(_))
            }),
            (
                "a certificate after commands",
                vec![first("refs/heads/a"), Line("push-cert\n".into()), Flush],
                |e| matches!(e, FramingError::Certificate(_)),
            ),
            ("truncated", vec![first("refs/heads/a")], |e| {
                matches!(e, FramingError::Truncated(_))
            }),
        ];
        for (name, parts, want) in table {
            let err = parse_push_request(&body(&parts), true).unwrap_err();
            assert!(want(&err.error), "{name}: {err:?}");
            assert!(
                err.error.to_string().contains("fix:"),
                "{name}: {}",
                err.error
            );
        }
    }

    #[test]
    fn what_was_read_before_a_fault_is_kept() {
        let buf = body(&[first("refs/heads/a"), Line("junk".into()), Flush]);
        let err = parse_push_request(&buf, true).unwrap_err();
        assert_eq!(err.partial.refs(), "refs/heads/a");
        assert!(err.partial.wants_report());
    }

    #[test]
    fn counts_are_bounded() {
        let mut parts = vec![first("refs/heads/b0")];
        parts.extend((1..=MAX_UPDATES).map(|i| Line(cmd(&format!("refs/heads/b{i}")))));
        parts.push(Flush);
        let err = parse_push_request(&body(&parts), true).unwrap_err();
        assert!(
            matches!(
                err.error,
                FramingError::TooMany {
                    limit: MAX_UPDATES,
                    ..
                }
            ),
            "{err:?}"
        );

        let mut cert = signed(&[], vec![]);
        let end = cert.split_off(6);
        let line = format!("{}\n", cmd(&format!("refs/heads/{}", "x".repeat(300))));
        cert.extend((0..=MAX_CERT_BYTES / line.len()).map(|_| Line(line.clone())));
        cert.extend(end);
        let err = parse_push_request(&body(&cert), true).unwrap_err();
        assert!(
            matches!(
                err.error,
                FramingError::TooMany {
                    limit: MAX_CERT_BYTES,
                    ..
                }
            ),
            "{err:?}"
        );
    }
}
