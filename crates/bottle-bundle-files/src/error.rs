//! The errors of the host-side bundle files. They keep the codes (and
//! texts) the bundle's own errors use for the same failures, so an operator
//! sees one code whichever side failed.

use bottle_core::Coded;

/// Why the per-bottle CA or git's runtime files could not be produced.
#[derive(Debug, thiserror::Error)]
pub enum BundleFilesError {
    /// The certificate authority could not be made.
    #[error("certificate authority: {detail}")]
    Ca {
        /// What failed.
        detail: String,
    },
    /// Git cannot be found on the host or its files cannot be collected.
    #[error("git runtime: {detail}")]
    GitRuntime {
        /// What failed.
        detail: String,
    },
}

impl Coded for BundleFilesError {
    fn code(&self) -> &'static str {
        match self {
            Self::Ca { .. } => "BOT-B007",
            Self::GitRuntime { .. } => "BOT-B014",
        }
    }

    fn fix(&self) -> Option<String> {
        let fix = match self {
            Self::Ca { .. } => "regenerate the bottle's CA with bottle_bundle::generate_ca",
            Self::GitRuntime { .. } => {
                "install git on the host (Debian: apt-get install git) and rebuild the bundle image"
            }
        };
        Some(fix.into())
    }
}
