//! The Docker Engine API versions the backend speaks: the oldest it
//! drives ([`DOCKER_MIN_API`]), which the client refuses below and
//! `bottle doctor` warns below.

use std::fmt;

/// The oldest Docker Engine API the docker backend drives: Docker 20.10's
/// (Debian's dockerd), to which bollard's newer default is negotiated down.
/// Every request the backend sends is valid at this version.
pub const DOCKER_MIN_API: DockerApiVersion = DockerApiVersion::new(1, 41);

/// A Docker Engine API version, `major.minor`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DockerApiVersion {
    /// Major.
    pub major: u32,
    /// Minor.
    pub minor: u32,
}

impl DockerApiVersion {
    /// A version from its parts.
    pub const fn new(major: u32, minor: u32) -> Self {
        DockerApiVersion { major, minor }
    }

    /// Parses an API version as the Engine reports it, such as `1.41`.
    pub fn parse(text: &str) -> Option<DockerApiVersion> {
        let (major, minor) = text.trim().split_once('.')?;
        Some(DockerApiVersion::new(
            major.parse().ok()?,
            minor.parse().ok()?,
        ))
    }
}

impl fmt::Display for DockerApiVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_versions_parse_and_order_numerically() {
        assert_eq!(
            DockerApiVersion::parse("1.41"),
            Some(DockerApiVersion::new(1, 41))
        );
        assert_eq!(
            DockerApiVersion::parse("1.9"),
            Some(DockerApiVersion::new(1, 9))
        );
        assert_eq!(DockerApiVersion::parse("one"), None);
        assert_eq!(DOCKER_MIN_API.to_string(), "1.41");
        assert!(DockerApiVersion::new(1, 9) < DOCKER_MIN_API);
        assert!(DockerApiVersion::new(1, 41) >= DOCKER_MIN_API);
    }
}
