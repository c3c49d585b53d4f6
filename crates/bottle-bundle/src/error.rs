//! The bundle's error type and its stable codes (`BOT-B…`).

use bottle_core::Coded;

/// Everything that can stop a bundle daemon from starting or running.
#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    /// The config file could not be read.
    #[error("could not read bundle config {path}: {source}")]
    ConfigRead {
        /// The file.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The config file is not valid.
    #[error("invalid bundle config {path}: {detail}")]
    ConfigInvalid {
        /// The file.
        path: String,
        /// What is wrong.
        detail: String,
    },
    /// An allowlist rule cannot be understood.
    #[error("invalid allow rule {rule:?}: {reason}")]
    Rule {
        /// The rule as written.
        rule: String,
        /// Why it was refused.
        reason: String,
    },
    /// A daemon's listen address is not a socket address.
    #[error("{daemon} listen address {addr:?} is not host:port")]
    ListenAddr {
        /// The daemon.
        daemon: &'static str,
        /// The address as written.
        addr: String,
    },
    /// A daemon could not bind its port.
    #[error("could not bind {daemon} on {addr}: {source}")]
    Bind {
        /// The daemon.
        daemon: &'static str,
        /// The address.
        addr: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The certificate authority could not be made or loaded.
    #[error("certificate authority: {detail}")]
    Ca {
        /// What failed.
        detail: String,
    },
    /// A credential's secret file could not be read.
    #[error("could not read credential {name} from {path}: {detail}")]
    Credential {
        /// The credential's name.
        name: String,
        /// The file.
        path: String,
        /// What failed.
        detail: String,
    },
    /// TLS configuration failed (upstream roots, server config).
    #[error("tls setup failed: {detail}")]
    Tls {
        /// What failed.
        detail: String,
    },
    /// The roots for upstream TLS cannot be assembled: a root file is
    /// unreadable or holds no usable certificate, or nothing is trusted.
    #[error("upstream TLS roots: {detail}")]
    UpstreamRoots {
        /// Which file, and what is wrong with it.
        detail: String,
    },
    /// The audit log could not be opened, written or read.
    #[error("audit log {path}: {source}")]
    Audit {
        /// The file.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A daemon kept crashing.
    #[error("daemon {daemon} failed {restarts} times within {window_ms} ms, last: {last}")]
    CrashLoop {
        /// The daemon.
        daemon: String,
        /// Restarts counted.
        restarts: u32,
        /// The window.
        window_ms: u64,
        /// The last failure.
        last: String,
    },
    /// A daemon stopped with an I/O error.
    #[error("daemon {daemon} stopped: {detail}")]
    Daemon {
        /// The daemon.
        daemon: String,
        /// What failed.
        detail: String,
    },
    /// A git-gate repository is misconfigured or missing.
    #[error("git-gate repository {repo}: {detail}")]
    GitRepo {
        /// The repository's name.
        repo: String,
        /// What is wrong.
        detail: String,
    },
    /// Git itself cannot be found or set up (host side or in the bundle).
    #[error("git runtime: {detail}")]
    GitRuntime {
        /// What failed.
        detail: String,
    },
}

/// The host-side failures keep their codes inside the bundle (`gen-ca`).
impl From<bottle_bundle_files::BundleFilesError> for BundleError {
    fn from(err: bottle_bundle_files::BundleFilesError) -> Self {
        use bottle_bundle_files::BundleFilesError as Files;
        match err {
            Files::Ca { detail } => Self::Ca { detail },
            Files::GitRuntime { detail } => Self::GitRuntime { detail },
        }
    }
}

impl Coded for BundleError {
    fn code(&self) -> &'static str {
        match self {
            Self::ConfigRead { .. } => "BOT-B001",
            Self::ConfigInvalid { .. } => "BOT-B002",
            Self::Rule { .. } => "BOT-B003",
            Self::ListenAddr { .. } => "BOT-B004",
            Self::Bind { .. } => "BOT-B005",
            Self::Ca { .. } => "BOT-B007",
            Self::Credential { .. } => "BOT-B008",
            Self::Tls { .. } => "BOT-B009",
            Self::Audit { .. } => "BOT-B010",
            Self::CrashLoop { .. } => "BOT-B011",
            Self::Daemon { .. } => "BOT-B012",
            Self::GitRepo { .. } => "BOT-B013",
            Self::GitRuntime { .. } => "BOT-B014",
            Self::UpstreamRoots { .. } => "BOT-B015",
        }
    }

    fn fix(&self) -> Option<String> {
        let fix = match self {
            Self::ConfigRead { .. } => "check that the backend wrote the config into the bundle",
            Self::ConfigInvalid { .. } => {
                "regenerate it with the same bottle version as the bundle image"
            }
            Self::Rule { .. } => {
                "use an exact host (api.example.com), a suffix rule (*.example.com) or an IP literal"
            }
            Self::ListenAddr { .. } => "use an address like 0.0.0.0:8888",
            Self::Bind { .. } => "free the port or change the daemon's listen address",
            Self::Ca { .. } => "regenerate the bottle's CA with bottle_bundle::generate_ca",
            Self::Credential { .. } => "check that the backend copied the secret into the bundle",
            Self::Tls { .. } => "check the PEM files named in the bundle config",
            Self::Audit { .. } => "check that the log directory exists and is writable",
            Self::CrashLoop { .. } => "read the bundle's stderr for the cause",
            Self::Daemon { .. } => "read the bundle's stderr for the cause",
            Self::GitRepo { .. } => {
                "check the repository's entry in the manifest and that the backend mounted it into the bundle"
            }
            Self::GitRuntime { .. } => {
                "install git on the host (Debian: apt-get install git) and rebuild the bundle image"
            }
            Self::UpstreamRoots { .. } => {
                "give egress.upstream_ca PEM files holding CA certificates, or trust the web roots (egress.upstream_trust = \"web\" or \"web+system\")"
            }
        };
        Some(fix.into())
    }
}
