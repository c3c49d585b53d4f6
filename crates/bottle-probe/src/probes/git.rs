//! git-gate's push checks, attacked through the push's framing: a push
//! certificate (`git push --signed`) carries its commands inside the
//! certificate, where a gate that reads only the plain command list does
//! not see them. Raw HTTP/1.1 and pkt-lines, no git in the bottle.
//!
//! Each probe reads the receive-pack advertisement for `main`'s object
//! id, then pushes refs at objects the repository already holds, so the
//! pack is the empty one. The plain push to an allowed branch is the
//! positive control: it must land. The harness checks the host's bare
//! repository afterwards (the control's ref is there, the signed ones are
//! not, `main` is where it was).

use std::net::SocketAddr;
use std::time::Duration;

use super::{Attempt, Ctx, Probe, errno_name, snippet};
use crate::contract::git_probe_ref;
use crate::net;

const CAT: &str = "git";

/// The null object id: the old value of a ref being created.
const ZERO: &str = "0000000000000000000000000000000000000000";

/// A packfile of no objects: `PACK`, version 2, count 0, and the SHA-1 of
/// those twelve bytes (the empty pack `git push` sends when every object is
/// already on the other side).
pub(crate) const EMPTY_PACK: &[u8] = b"PACK\0\0\0\x02\0\0\0\0\
    \x02\x9d\x08\x82\x3b\xd8\xa8\xea\xb5\x10\xad\x6a\xc7\x5c\x82\x3c\xfd\x3e\xd3\x1e";

/// What the probe asks receive-pack for: a plain report (no side-band).
const CAPS: &str = "report-status agent=bottle-probe";

/// A push answer is awaited at least this long (receive-pack and its hook
/// run before it).
const PUSH_BOUND: Duration = Duration::from_secs(5);

pub(super) fn probes() -> Vec<Probe> {
    vec![
        Probe::new(
            "git-push-plain-control",
            CAT,
            false,
            "an ordinary push creating refs/heads/agent/probe-control-<token> at main's oid (an allowed branch, empty pack): must be reached (`ok` in report-status); the git probes' positive control",
            plain_control,
        ),
        Probe::new(
            "git-push-signed",
            CAT,
            false,
            "the same create of an allowed branch (agent/probe-signed-<token>) inside a push certificate: blocked unless report-status says `ok` for it (the gate refuses signed pushes)",
            signed,
        ),
        Probe::new(
            "git-push-cert-protected",
            CAT,
            false,
            "a push certificate carrying an update of refs/heads/main (to another advertised oid, else to itself): blocked unless report-status says `ok` for main",
            cert_protected,
        ),
    ]
}

/// Where the probe's repository is served.
struct Repo {
    addr: SocketAddr,
    /// The `Host:` header.
    host: String,
    /// `/<prefix>/<repo>.git`.
    path: String,
}

impl Repo {
    fn of(c: &Ctx) -> Result<Option<Repo>, String> {
        let t = &c.config.targets;
        if t.git_gate_url.is_empty() || t.git_repo.is_empty() {
            return Ok(None);
        }
        let rest = t.git_gate_url.strip_prefix("http://").ok_or_else(|| {
            format!(
                "targets.git_gate_url = {:?} is not an http:// URL",
                t.git_gate_url
            )
        })?;
        let (host, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        let addr = net::proxy_addr(&t.git_gate_url)?;
        let prefix = prefix.trim_end_matches('/');
        let path = if prefix.is_empty() {
            format!("/{}.git", t.git_repo)
        } else {
            format!("/{prefix}/{}.git", t.git_repo)
        };
        Ok(Some(Repo {
            addr,
            host: host.to_string(),
            path,
        }))
    }

    /// The receive-pack advertisement.
    fn advertise(&self, c: &Ctx) -> Result<Advert, String> {
        let req = format!(
            "GET {}/info/refs?service=git-receive-pack HTTP/1.1\r\nHost: {}\r\nUser-Agent: git/bottle-probe\r\nConnection: close\r\n\r\n",
            self.path, self.host
        );
        let reply = net::exchange(self.addr, req.as_bytes(), c.timeout.max(PUSH_BOUND))
            .map_err(|e| format!("git-gate {}: {}", self.addr, errno_name(&e)))?;
        if net::status(&reply) != Some(200) {
            return Err(format!("info/refs answered: {}", snippet(&reply)));
        }
        Advert::parse(&net::body(&reply)?)
    }

    /// Posts a receive-pack request and reads its report.
    fn push(&self, c: &Ctx, body: &[u8]) -> Result<Report, String> {
        let mut req = format!(
            "POST {}/git-receive-pack HTTP/1.1\r\nHost: {}\r\nUser-Agent: git/bottle-probe\r\nContent-Type: application/x-git-receive-pack-request\r\nAccept: application/x-git-receive-pack-result\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            self.path,
            self.host,
            body.len()
        )
        .into_bytes();
        req.extend_from_slice(body);
        let reply = net::exchange(self.addr, &req, c.timeout.max(PUSH_BOUND))
            .map_err(|e| format!("git-gate {}: {}", self.addr, errno_name(&e)))?;
        Ok(Report::parse(&reply))
    }
}

/// The refs and capabilities receive-pack advertised.
#[derive(Debug, Default)]
struct Advert {
    /// `(oid, refname)` in the order advertised.
    refs: Vec<(String, String)>,
    caps: Vec<String>,
}

impl Advert {
    fn parse(body: &[u8]) -> Result<Advert, String> {
        let mut advert = Advert::default();
        for line in pkt_lines(body)?.into_iter().flatten() {
            let text = String::from_utf8_lossy(&line);
            let text = text.trim_end_matches('\n');
            if text.starts_with("# service=") {
                continue;
            }
            let (refline, caps) = text.split_once('\0').unwrap_or((text, ""));
            if !caps.is_empty() {
                advert.caps = caps.split(' ').map(str::to_string).collect();
            }
            let Some((oid, name)) = refline.split_once(' ') else {
                return Err(format!("not a ref line: {}", snippet(&line)));
            };
            if oid != ZERO {
                advert.refs.push((oid.to_string(), name.to_string()));
            }
        }
        Ok(advert)
    }

    fn oid(&self, name: &str) -> Option<&str> {
        self.refs
            .iter()
            .find(|(_, n)| n == name)
            .map(|(o, _)| o.as_str())
    }
}

/// What receive-pack (or the gate in its place) answered.
#[derive(Debug, Default)]
struct Report {
    status: Option<u16>,
    /// `(ref, None)` for `ok`, `(ref, Some(reason))` for `ng`.
    refs: Vec<(String, Option<String>)>,
    /// `ERR` packets and side-band error text.
    errors: Vec<String>,
    /// The reply, shortened, for the report.
    raw: String,
}

impl Report {
    fn parse(reply: &[u8]) -> Report {
        let mut report = Report {
            status: net::status(reply),
            raw: snippet(reply),
            ..Report::default()
        };
        let Ok(body) = net::body(reply) else {
            return report;
        };
        let Ok(mut lines) = pkt_lines(&body) else {
            return report;
        };
        // A side-band answer: the report is band 1, errors band 3.
        if lines
            .iter()
            .flatten()
            .next()
            .is_some_and(|l| matches!(l.first(), Some(1..=3)))
        {
            let mut band1 = Vec::new();
            for l in lines.iter().flatten() {
                match l.split_first() {
                    Some((1, rest)) => band1.extend_from_slice(rest),
                    Some((3, rest)) => report
                        .errors
                        .push(String::from_utf8_lossy(rest).into_owned()),
                    _ => {}
                }
            }
            lines = pkt_lines(&band1).unwrap_or_default();
        }
        for l in lines.into_iter().flatten() {
            let text = String::from_utf8_lossy(&l);
            let text = text.trim_end_matches('\n');
            if let Some(r) = text.strip_prefix("ok ") {
                report.refs.push((r.to_string(), None));
            } else if let Some(rest) = text.strip_prefix("ng ") {
                let (r, why) = rest.split_once(' ').unwrap_or((rest, ""));
                report.refs.push((r.to_string(), Some(why.to_string())));
            } else if let Some(e) = text.strip_prefix("ERR ") {
                report.errors.push(e.to_string());
            }
        }
        report
    }

    /// Whether receive-pack reported `ok` for `name`.
    fn ok(&self, name: &str) -> bool {
        self.status == Some(200) && self.refs.iter().any(|(r, ng)| r == name && ng.is_none())
    }

    fn describe(&self) -> String {
        let refs: Vec<String> = self
            .refs
            .iter()
            .map(|(r, ng)| match ng {
                None => format!("ok {r}"),
                Some(why) => format!("ng {r} {why}"),
            })
            .collect();
        if refs.is_empty() && self.errors.is_empty() {
            format!("no report: {}", self.raw)
        } else {
            format!(
                "status {:?}; {}{}",
                self.status,
                refs.join(", "),
                if self.errors.is_empty() {
                    String::new()
                } else {
                    format!("; ERR {}", self.errors.join(" / "))
                }
            )
        }
    }
}

/// One pkt-line.
pub(crate) fn pkt(payload: &[u8]) -> Vec<u8> {
    let mut out = format!("{:04x}", payload.len() + 4).into_bytes();
    out.extend_from_slice(payload);
    out
}

const FLUSH: &[u8] = b"0000";

/// The packets of `body`: `Some(payload)`, or `None` for a flush (and the
/// other special packets).
fn pkt_lines(body: &[u8]) -> Result<Vec<Option<Vec<u8>>>, String> {
    let mut out = Vec::new();
    let mut at = body;
    while !at.is_empty() {
        let len = at
            .get(..4)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| usize::from_str_radix(h, 16).ok())
            .ok_or_else(|| format!("not a pkt-line: {}", snippet(at)))?;
        if len < 4 {
            out.push(None);
            at = &at[4..];
            continue;
        }
        let payload = at
            .get(4..len)
            .ok_or_else(|| format!("a pkt-line is cut off: {}", snippet(at)))?;
        out.push(Some(payload.to_vec()));
        at = &at[len..];
    }
    Ok(out)
}

/// A plain push: the command list, a flush, the empty pack.
pub(crate) fn plain_push(commands: &[String]) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, c) in commands.iter().enumerate() {
        if i == 0 {
            out.extend(pkt(format!("{c}\0{CAPS}").as_bytes()));
        } else {
            out.extend(pkt(c.as_bytes()));
        }
    }
    out.extend_from_slice(FLUSH);
    out.extend_from_slice(EMPTY_PACK);
    out
}

/// A signed push in the shape `git push --signed` sends: the commands
/// only inside the certificate (whose signature nobody checks before the
/// gate's refusal), a flush, the empty pack.
pub(crate) fn signed_push(commands: &[String], pushee: &str) -> Vec<u8> {
    let mut out = Vec::new();
    let mut line = |text: &str| out.extend(pkt(text.as_bytes()));
    line(&format!("push-cert\0{CAPS}\n"));
    line("certificate version 0.1\n");
    line("pusher bottle-probe <probe@bottle.invalid> 1700000000 +0000\n");
    line(&format!("pushee {pushee}\n"));
    line("nonce 1700000000-0123456789abcdef\n");
    line("\n");
    for c in commands {
        line(&format!("{c}\n"));
    }
    line("-----BEGIN PGP SIGNATURE-----\n");
    line("iQEzBAABCAAdFiEEbottleprobebottleprobebottle\n");
    line("-----END PGP SIGNATURE-----\n");
    line("push-cert-end\n");
    out.extend_from_slice(FLUSH);
    out.extend_from_slice(EMPTY_PACK);
    out
}

/// The repository and `main`'s oid, or the attempt to report instead:
/// `unreachable` says what a gate that does not answer means for this
/// probe.
fn prepare(c: &Ctx, unreachable: fn(String) -> Attempt) -> Result<(Repo, Advert, String), Attempt> {
    let repo = match Repo::of(c) {
        Ok(Some(r)) => r,
        Ok(None) => return Err(Attempt::skipped("no git-gate repository")),
        Err(e) => return Err(Attempt::error(e)),
    };
    let advert = repo.advertise(c).map_err(unreachable)?;
    if !advert.caps.iter().any(|c| c == "report-status") {
        return Err(Attempt::error(format!(
            "receive-pack does not offer report-status: {:?}",
            advert.caps
        )));
    }
    let Some(main) = advert.oid("refs/heads/main").map(str::to_string) else {
        return Err(Attempt::error(format!(
            "the advertisement names no refs/heads/main: {:?}",
            advert.refs
        )));
    };
    Ok((repo, advert, main))
}

/// The positive control: an ordinary push to an allowed branch lands.
fn plain_control(c: &Ctx) -> Attempt {
    let (repo, _, main) = match prepare(c, |e| Attempt::blocked(format!("no advertisement: {e}"))) {
        Ok(p) => p,
        Err(a) => return a,
    };
    let name = git_probe_ref("control", &c.config.token);
    match repo.push(c, &plain_push(&[format!("{ZERO} {main} {name}")])) {
        Ok(r) if r.ok(&name) => Attempt::reached(format!("pushed: {}", r.describe())),
        Ok(r) => Attempt::blocked(format!("refused: {}", r.describe())),
        Err(e) => Attempt::blocked(e),
    }
}

/// A gate that does not answer proves nothing about its push checks.
fn no_gate(e: String) -> Attempt {
    Attempt::error(format!("no advertisement, so the push proves nothing: {e}"))
}

/// A signed push creating an allowed branch: the gate refuses signed
/// pushes, so it must not land.
fn signed(c: &Ctx) -> Attempt {
    let (repo, _, main) = match prepare(c, no_gate) {
        Ok(p) => p,
        Err(a) => return a,
    };
    let name = git_probe_ref("signed", &c.config.token);
    let pushee = format!("http://{}{}", repo.host, repo.path);
    match repo.push(c, &signed_push(&[format!("{ZERO} {main} {name}")], &pushee)) {
        Ok(r) if r.ok(&name) => Attempt::reached(format!("signed push accepted: {}", r.describe())),
        Ok(r) => Attempt::blocked(format!("refused: {}", r.describe())),
        Err(e) => Attempt::blocked(format!("no answer: {e}")),
    }
}

/// A push certificate updating the protected branch.
fn cert_protected(c: &Ctx) -> Attempt {
    let (repo, advert, main) = match prepare(c, no_gate) {
        Ok(p) => p,
        Err(a) => return a,
    };
    let other = advert
        .refs
        .iter()
        .map(|(o, _)| o.as_str())
        .find(|o| *o != main)
        .unwrap_or(&main)
        .to_string();
    let name = "refs/heads/main";
    let pushee = format!("http://{}{}", repo.host, repo.path);
    match repo.push(
        c,
        &signed_push(&[format!("{main} {other} {name}")], &pushee),
    ) {
        Ok(r) if r.ok(name) => Attempt::reached(format!(
            "main updated to {other} through a certificate: {}",
            r.describe()
        )),
        Ok(r) => Attempt::blocked(format!("refused: {}", r.describe())),
        Err(e) => Attempt::blocked(format!("no answer: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advertisements_parse_with_their_capabilities() {
        let mut body = pkt(b"# service=git-receive-pack\n");
        body.extend_from_slice(FLUSH);
        body.extend(pkt(format!(
            "{} refs/heads/main\0report-status delete-refs\n",
            "a".repeat(40)
        )
        .as_bytes()));
        body.extend(pkt(
            format!("{} refs/heads/base\n", "b".repeat(40)).as_bytes()
        ));
        body.extend_from_slice(FLUSH);
        let a = Advert::parse(&body).unwrap();
        assert_eq!(a.oid("refs/heads/main"), Some("a".repeat(40).as_str()));
        assert_eq!(a.oid("refs/heads/base"), Some("b".repeat(40).as_str()));
        assert_eq!(a.caps, ["report-status", "delete-refs"]);
        let empty = pkt(format!("{ZERO} capabilities^{{}}\0report-status\n").as_bytes());
        assert!(Advert::parse(&empty).unwrap().refs.is_empty());
        assert!(Advert::parse(b"zzzz").is_err());
    }

    #[test]
    fn reports_parse_plain_and_side_band() {
        let mut plain = pkt(b"unpack ok\n");
        plain.extend(pkt(b"ok refs/heads/agent/a\n"));
        plain.extend(pkt(b"ng refs/heads/main bottle: signed push\n"));
        plain.extend_from_slice(FLUSH);
        let reply = [
            format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", plain.len()).into_bytes(),
            plain.clone(),
        ]
        .concat();
        let r = Report::parse(&reply);
        assert!(r.ok("refs/heads/agent/a"));
        assert!(!r.ok("refs/heads/main"));
        assert!(
            r.describe()
                .contains("ng refs/heads/main bottle: signed push")
        );

        let mut band = Vec::new();
        band.extend(pkt(&[&[1u8][..], &plain].concat()));
        band.extend(pkt(b"\x03denied"));
        band.extend_from_slice(FLUSH);
        let reply = [
            format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", band.len()).into_bytes(),
            band,
        ]
        .concat();
        let r = Report::parse(&reply);
        assert!(r.ok("refs/heads/agent/a"));
        assert_eq!(r.errors, ["denied"]);

        let err = [
            b"HTTP/1.1 200 OK\r\n\r\n".to_vec(),
            pkt(b"ERR the push request is malformed\n"),
        ]
        .concat();
        let r = Report::parse(&err);
        assert!(r.refs.is_empty());
        assert!(r.describe().contains("ERR the push request is malformed"));
        assert!(!Report::parse(b"HTTP/1.1 403 Forbidden\r\n\r\n").ok("x"));
    }

    #[test]
    fn pushes_are_framed_as_git_sends_them() {
        let plain = plain_push(&[format!("{ZERO} {} refs/heads/agent/x", "a".repeat(40))]);
        let lines = pkt_lines(&plain[..plain.len() - EMPTY_PACK.len()]).unwrap();
        assert_eq!(lines.len(), 2);
        assert!(
            lines[0]
                .as_ref()
                .unwrap()
                .ends_with(b"\0report-status agent=bottle-probe")
        );
        assert_eq!(lines[1], None);
        assert!(plain.ends_with(EMPTY_PACK));

        let signed = signed_push(&["c1".into(), "c2".into()], "http://g/r.git");
        let lines = pkt_lines(&signed[..signed.len() - EMPTY_PACK.len()]).unwrap();
        let texts: Vec<String> = lines
            .iter()
            .map(|l| {
                l.as_ref().map_or("<flush>".into(), |b| {
                    String::from_utf8_lossy(b).into_owned()
                })
            })
            .collect();
        assert_eq!(texts[0], "push-cert\0report-status agent=bottle-probe\n");
        assert_eq!(&texts[6..8], ["c1\n", "c2\n"]);
        assert_eq!(texts[texts.len() - 2], "push-cert-end\n");
        assert_eq!(texts[texts.len() - 1], "<flush>");
    }

    #[test]
    fn the_empty_pack_is_a_version_2_pack_of_no_objects() {
        assert_eq!(EMPTY_PACK.len(), 12 + 20);
        assert_eq!(&EMPTY_PACK[..12], b"PACK\0\0\0\x02\0\0\0\0");
    }
}
