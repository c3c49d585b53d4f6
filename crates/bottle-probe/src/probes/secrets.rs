//! What must never reach the agent: the bundle's CA private key (on disk or
//! served by a bundle daemon), the credential files the bundle injects
//! from, and real-looking credentials in the environment.

use std::io::Read;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use super::{Attempt, Ctx, Probe, contains, errno_name, snippet};
use crate::net;

const CAT: &str = "secrets";

/// Directories where bundle-side secrets live (in the bundle) or where the
/// agent's CA certificate is mounted (in the agent).
const SECRET_DIRS: &[&str] = &["/run/bottle", "/etc/bottle", "/var/lib/bottle"];

/// The secrets probes.
pub(super) fn probes() -> Vec<Probe> {
    vec![
        Probe::new(
            "secret-ca-key-files",
            CAT,
            false,
            "read /run/bottle/ca-key.pem, /run/bottle/ca.key and every file under /run/bottle, /etc/bottle, /var/lib/bottle: blocked unless one holds a PRIVATE KEY",
            |_| ca_key_files(),
        ),
        Probe::new(
            "secret-credential-files",
            CAT,
            false,
            "read the bundle's credential files (/run/bottle/credentials/*, /run/bottle/git-credentials/*, bundle.json): blocked unless one is readable",
            |_| credential_files(),
        ),
        Probe::new(
            "secret-ca-key-via-bundle",
            CAT,
            false,
            "ask the own bundle's daemons (8888, 9418, 9100) for /run/bottle files by path, traversal and file:// URL: blocked unless a reply holds a PRIVATE KEY or the bundle config",
            ca_key_via_bundle,
        ),
        Probe::new(
            "secret-env-credentials",
            CAT,
            false,
            "environment variables named like credentials (TOKEN, KEY, SECRET, PASSWORD, AUTH): blocked unless one holds a non-placeholder value (names are reported)",
            |_| env_credentials(std::env::vars()),
        ),
    ]
}

/// Files under `dir`, two levels deep, at most `cap`.
fn files_under(dir: &Path, cap: usize) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![(dir.to_path_buf(), 0)];
    while let Some((d, depth)) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            if out.len() >= cap {
                return out;
            }
            let p = e.path();
            match e.file_type() {
                Ok(t) if t.is_dir() && depth < 2 => stack.push((p, depth + 1)),
                Ok(t) if t.is_file() => out.push(p),
                _ => {}
            }
        }
    }
    out
}

fn read_head(p: &Path) -> std::io::Result<Vec<u8>> {
    let mut buf = Vec::new();
    std::fs::File::open(p)?
        .take(64 * 1024)
        .read_to_end(&mut buf)?;
    Ok(buf)
}

fn ca_key_files() -> Attempt {
    let mut candidates = vec![
        PathBuf::from("/run/bottle/ca-key.pem"),
        PathBuf::from("/run/bottle/ca.key"),
    ];
    for d in SECRET_DIRS {
        candidates.extend(files_under(Path::new(d), 200));
    }
    let mut seen = Vec::new();
    for p in &candidates {
        match read_head(p) {
            Ok(b) if contains(&b, "PRIVATE KEY") => {
                return Attempt::reached(format!("{} holds a private key", p.display()));
            }
            Ok(b) => seen.push(format!(
                "{}: readable, no key ({} bytes)",
                p.display(),
                b.len()
            )),
            Err(e) => seen.push(format!("{}: {}", p.display(), errno_name(&e))),
        }
    }
    Attempt::blocked(seen.join("; "))
}

fn credential_files() -> Attempt {
    let mut candidates = vec![PathBuf::from("/run/bottle/bundle.json")];
    for d in ["/run/bottle/credentials", "/run/bottle/git-credentials"] {
        candidates.extend(files_under(Path::new(d), 100));
    }
    let mut seen = Vec::new();
    for p in &candidates {
        match read_head(p) {
            Ok(b) => {
                return Attempt::reached(format!("{} readable ({} bytes)", p.display(), b.len()));
            }
            Err(e) => seen.push(format!("{}: {}", p.display(), errno_name(&e))),
        }
    }
    Attempt::blocked(seen.join("; "))
}

fn ca_key_via_bundle(c: &Ctx) -> Attempt {
    let own = &c.config.targets.own_bundle;
    let ip = match net::parse_ip("own_bundle", own) {
        Ok(ip) => ip,
        Err(e) => return Attempt::error(e),
    };
    let targets = [
        "/run/bottle/ca-key.pem",
        "/../../../../run/bottle/ca-key.pem",
        "/%2e%2e/%2e%2e/run/bottle/ca-key.pem",
        "/ca-key.pem",
        "/run/bottle/bundle.json",
        "file:///run/bottle/ca-key.pem",
    ];
    let mut seen = Vec::new();
    for port in [8888u16, 9418, 9100] {
        let addr = SocketAddr::new(ip, port);
        for t in targets {
            let host = net::authority(own, port);
            match net::http_get(addr, &host, t, c.timeout) {
                Ok(b) if contains(&b, "PRIVATE KEY") || contains(&b, "\"ca_key\"") => {
                    return Attempt::reached(format!("{addr} GET {t}: {}", snippet(&b)));
                }
                Ok(b) => seen.push(format!("{port} {t}: {:?}", net::status(&b))),
                Err(e) => {
                    // A closed port refuses every path alike.
                    seen.push(format!("{port}: {}", errno_name(&e)));
                    break;
                }
            }
        }
    }
    Attempt::blocked(seen.join("; "))
}

/// Whether a variable name looks like a credential's. git's
/// `GIT_CONFIG_KEY_<n>` names a configuration key (bottle sets them so git
/// reaches the git-gate), not a secret.
pub(super) fn credential_name(name: &str) -> bool {
    let n = name.to_ascii_uppercase();
    let git_config_key = n
        .strip_prefix("GIT_CONFIG_KEY_")
        .is_some_and(|i| !i.is_empty() && i.bytes().all(|b| b.is_ascii_digit()));
    !git_config_key
        && [
            "TOKEN",
            "KEY",
            "SECRET",
            "PASSWORD",
            "PASSWD",
            "AUTH",
            "CREDENTIAL",
        ]
        .iter()
        .any(|w| n.contains(w))
}

/// A value that is obviously not a real secret.
pub(super) fn placeholder(value: &str) -> bool {
    let v = value.trim().to_ascii_lowercase();
    v.len() < 8
        || [
            "placeholder",
            "dummy",
            "fake",
            "example",
            "changeme",
            "bottle",
            "xxxx",
            "redacted",
            "none",
            "test",
        ]
        .iter()
        .any(|w| v.contains(w))
        || v.starts_with('/')
        || v.chars().collect::<std::collections::BTreeSet<_>>().len() <= 2
}

pub(super) fn env_credentials(vars: impl Iterator<Item = (String, String)>) -> Attempt {
    let mut names = Vec::new();
    let mut real = Vec::new();
    for (k, v) in vars {
        if !credential_name(&k) {
            continue;
        }
        if placeholder(&v) {
            names.push(format!("{k} (placeholder)"));
        } else {
            names.push(k.clone());
            real.push(k);
        }
    }
    if real.is_empty() {
        Attempt::blocked(if names.is_empty() {
            "no credential-like variable".to_string()
        } else {
            format!("only placeholders: {}", names.join(", "))
        })
    } else {
        Attempt::reached(format!("non-placeholder values in: {}", real.join(", ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::Outcome;

    #[test]
    fn git_config_keys_are_not_credentials() {
        assert!(!credential_name("GIT_CONFIG_KEY_0"));
        assert!(!credential_name("GIT_CONFIG_KEY_12"));
        assert!(credential_name("GIT_CONFIG_KEY_X"));
        assert!(credential_name("GIT_CONFIG_KEY_"));
        assert!(credential_name("OPENAI_API_KEY"));
    }

    fn vars(v: &[(&str, &str)]) -> impl Iterator<Item = (String, String)> {
        v.iter()
            .map(|(a, b)| ((*a).to_string(), (*b).to_string()))
            .collect::<Vec<_>>()
            .into_iter()
    }

    #[test]
    fn judges_environment_credentials() {
        let clean = env_credentials(vars(&[
            ("PATH", "/bin"),
            ("ANTHROPIC_API_KEY", "placeholder"),
        ]));
        assert_eq!(clean.outcome, Outcome::Blocked);
        assert!(clean.observed.contains("ANTHROPIC_API_KEY"));
        let leaked = env_credentials(vars(&[(
            "GITHUB_TOKEN",
            "ghp_Zq81mXk2Lr9vNw3pYt6sHb4cJd7fGe0aUo5i",
        )]));
        assert_eq!(leaked.outcome, Outcome::Reached);
        assert!(leaked.observed.contains("GITHUB_TOKEN"));
        assert_eq!(
            env_credentials(vars(&[("SSL_CERT_FILE", "/etc/bottle/ca.pem")])).outcome,
            Outcome::Blocked
        );
    }

    #[test]
    fn finds_files_two_levels_deep() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("a/b/c")).unwrap();
        std::fs::write(d.path().join("top"), "x").unwrap();
        std::fs::write(d.path().join("a/b/inner"), "x").unwrap();
        std::fs::write(d.path().join("a/b/c/too-deep"), "x").unwrap();
        let found = files_under(d.path(), 10);
        assert_eq!(found.len(), 2, "{found:?}");
    }
}
