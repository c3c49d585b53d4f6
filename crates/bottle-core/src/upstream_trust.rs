//! Which roots the bundle trusts for upstream TLS: the compiled-in web
//! roots, the host's system store, or both (`egress.upstream_trust`, or
//! [`UPSTREAM_TRUST_ENV`] when the manifest does not say), plus the
//! manifest's `egress.upstream_ca` files.
//!
//! A network that re-signs TLS with its own CA (most corporate networks)
//! breaks every upstream the web roots alone would trust; the operator
//! gives the bundle that CA, or the host's store that already holds it.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The host-wide default for `egress.upstream_trust`, for operators whose
/// whole network re-signs TLS.
pub const UPSTREAM_TRUST_ENV: &str = "BOTTLE_UPSTREAM_TRUST";

/// Where Linux distributions keep their system trust bundle, in the order
/// they are tried: Debian/Ubuntu/Alpine/Arch, Fedora/RHEL, and the
/// BSD-style path some others link.
pub const SYSTEM_TRUST_STORES: [&str; 3] = [
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
];

/// The root sets the bundle can trust besides `egress.upstream_ca`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum UpstreamTrust {
    /// The web roots compiled into the bundle.
    #[default]
    #[serde(rename = "web")]
    Web,
    /// The host's system trust store instead of the web roots.
    #[serde(rename = "system")]
    System,
    /// Both.
    #[serde(rename = "web+system")]
    WebAndSystem,
}

impl UpstreamTrust {
    /// Every value as written, for messages and the manifest schema.
    pub const CHOICES: [&'static str; 3] = ["web", "system", "web+system"];

    /// Parses a value as the manifest and [`UPSTREAM_TRUST_ENV`] write it.
    pub fn parse(text: &str) -> Option<UpstreamTrust> {
        match text {
            "web" => Some(UpstreamTrust::Web),
            "system" => Some(UpstreamTrust::System),
            "web+system" => Some(UpstreamTrust::WebAndSystem),
            _ => None,
        }
    }

    /// The value as written.
    pub fn as_str(self) -> &'static str {
        match self {
            UpstreamTrust::Web => "web",
            UpstreamTrust::System => "system",
            UpstreamTrust::WebAndSystem => "web+system",
        }
    }

    /// Whether the compiled-in web roots are trusted.
    pub fn web_roots(self) -> bool {
        matches!(self, UpstreamTrust::Web | UpstreamTrust::WebAndSystem)
    }

    /// Whether the host's system store is trusted.
    pub fn system_store(self) -> bool {
        matches!(self, UpstreamTrust::System | UpstreamTrust::WebAndSystem)
    }

    /// The trust in effect: the manifest's, else the host default from
    /// [`UPSTREAM_TRUST_ENV`] (`env_value`), else web. `Err` carries an
    /// unusable environment value.
    pub fn effective(
        manifest: Option<UpstreamTrust>,
        env_value: Option<&str>,
    ) -> Result<UpstreamTrust, String> {
        match (manifest, env_value) {
            (Some(trust), _) => Ok(trust),
            (None, None) => Ok(UpstreamTrust::Web),
            (None, Some(value)) => UpstreamTrust::parse(value).ok_or_else(|| value.to_string()),
        }
    }

    /// One line for the plan: what the bundle trusts for upstream TLS.
    pub fn describe(self, extra_ca: &[String]) -> String {
        let base = match self {
            UpstreamTrust::Web => "web roots",
            UpstreamTrust::System => "host system store",
            UpstreamTrust::WebAndSystem => "web roots + host system store",
        };
        match extra_ca.len() {
            0 => base.to_string(),
            n => format!(
                "{base} + {n} extra CA{} ({})",
                if n == 1 { "" } else { "s" },
                extra_ca.join(", ")
            ),
        }
    }
}

impl fmt::Display for UpstreamTrust {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The host's system trust bundle under `root` (`/` on the host): the
/// first of [`SYSTEM_TRUST_STORES`] that is a file, symlinks followed (Arch
/// and Nix link it elsewhere), as its real path.
pub fn find_system_store(root: &Path) -> Option<PathBuf> {
    SYSTEM_TRUST_STORES.iter().find_map(|candidate| {
        let path = root.join(candidate.trim_start_matches('/'));
        let real = std::fs::canonicalize(&path).ok()?;
        std::fs::metadata(&real)
            .is_ok_and(|meta| meta.is_file())
            .then_some(real)
    })
}

/// Why a file is not a usable CA file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PemProblem {
    /// No PEM block at all (DER, or some other file).
    NotPem,
    /// PEM, but no well-formed `CERTIFICATE` block (a key, a CSR, a
    /// truncated block).
    NoCertificate,
}

impl PemProblem {
    /// What is wrong, to follow the file's name.
    pub fn describe(self) -> &'static str {
        match self {
            PemProblem::NotPem => "is not PEM (no -----BEGIN line)",
            PemProblem::NoCertificate => "holds no PEM certificate",
        }
    }
}

/// How many `CERTIFICATE` blocks `text` holds, each with base64 between
/// its BEGIN and END lines. The bundle parses them fully at start; this is
/// the check that catches the wrong file before launch.
pub fn certificate_count(text: &[u8]) -> Result<usize, PemProblem> {
    const BEGIN: &str = "-----BEGIN CERTIFICATE-----";
    const END: &str = "-----END CERTIFICATE-----";
    let text = String::from_utf8_lossy(text);
    if !text.contains("-----BEGIN ") {
        return Err(PemProblem::NotPem);
    }
    let mut count = 0;
    let mut rest = text.as_ref();
    while let Some(start) = rest.find(BEGIN) {
        let after = &rest[start + BEGIN.len()..];
        let Some(end) = after.find(END) else { break };
        let body = &after[..end];
        let is_base64 = body
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"+/=".contains(&b) || b.is_ascii_whitespace());
        if is_base64 && body.bytes().any(|b| b.is_ascii_alphanumeric()) {
            count += 1;
        }
        rest = &after[end + END.len()..];
    }
    if count == 0 {
        Err(PemProblem::NoCertificate)
    } else {
        Ok(count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CERT: &str =
        "-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIU\n-----END CERTIFICATE-----\n";

    #[test]
    fn values_parse_and_say_which_roots() {
        for choice in UpstreamTrust::CHOICES {
            assert_eq!(UpstreamTrust::parse(choice).unwrap().as_str(), choice);
        }
        assert_eq!(UpstreamTrust::parse("System"), None);
        assert!(UpstreamTrust::Web.web_roots() && !UpstreamTrust::Web.system_store());
        assert!(!UpstreamTrust::System.web_roots() && UpstreamTrust::System.system_store());
        assert!(
            UpstreamTrust::WebAndSystem.web_roots() && UpstreamTrust::WebAndSystem.system_store()
        );
    }

    #[test]
    fn the_manifest_wins_over_the_host_default() {
        use UpstreamTrust::*;
        assert_eq!(UpstreamTrust::effective(None, None), Ok(Web));
        assert_eq!(UpstreamTrust::effective(None, Some("system")), Ok(System));
        assert_eq!(UpstreamTrust::effective(Some(Web), Some("system")), Ok(Web));
        assert_eq!(
            UpstreamTrust::effective(None, Some("corp")),
            Err("corp".into())
        );
    }

    #[test]
    fn the_plan_line_counts_the_extra_cas() {
        assert_eq!(UpstreamTrust::Web.describe(&[]), "web roots");
        assert_eq!(
            UpstreamTrust::Web.describe(&["corp-ca.pem".into()]),
            "web roots + 1 extra CA (corp-ca.pem)"
        );
        assert_eq!(
            UpstreamTrust::System.describe(&["a.pem".into(), "b.pem".into()]),
            "host system store + 2 extra CAs (a.pem, b.pem)"
        );
    }

    #[test]
    fn certificates_are_counted_and_other_files_refused() {
        assert_eq!(certificate_count(CERT.as_bytes()), Ok(1));
        assert_eq!(certificate_count(format!("{CERT}{CERT}").as_bytes()), Ok(2));
        assert_eq!(
            certificate_count(b"\x30\x82\x01\xb3"),
            Err(PemProblem::NotPem)
        );
        assert_eq!(
            certificate_count(b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"),
            Err(PemProblem::NoCertificate)
        );
        assert_eq!(
            certificate_count(b"-----BEGIN CERTIFICATE-----\nMIIB"),
            Err(PemProblem::NoCertificate)
        );
    }

    #[test]
    fn the_system_store_is_found_through_a_symlink() {
        let root = tempfile::tempdir().unwrap();
        assert_eq!(find_system_store(root.path()), None);
        let real = root.path().join("nix/store/bundle.crt");
        std::fs::create_dir_all(real.parent().unwrap()).unwrap();
        std::fs::write(&real, CERT).unwrap();
        let pki = root.path().join("etc/pki/tls/certs");
        std::fs::create_dir_all(&pki).unwrap();
        std::os::unix::fs::symlink(&real, pki.join("ca-bundle.crt")).unwrap();
        assert_eq!(
            find_system_store(root.path()),
            Some(std::fs::canonicalize(&real).unwrap())
        );
        // A dangling first candidate does not hide a later one.
        let ssl = root.path().join("etc/ssl/certs");
        std::fs::create_dir_all(&ssl).unwrap();
        std::os::unix::fs::symlink(root.path().join("gone"), ssl.join("ca-certificates.crt"))
            .unwrap();
        assert_eq!(
            find_system_store(root.path()),
            Some(std::fs::canonicalize(&real).unwrap())
        );
    }
}
