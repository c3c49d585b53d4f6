//! The stable `BOT-M` codes of manifest errors.
//!
//! A code names one check and never changes meaning; `docs/MANIFEST.md`
//! lists them all and the bad-manifest catalogue (`tests/manifests/bad`)
//! holds at least one file per code.

/// The manifest file cannot be read.
pub const READ: &str = "BOT-M001";
/// The text is not valid TOML.
pub const SYNTAX: &str = "BOT-M002";
/// A key the manifest format does not have.
pub const UNKNOWN_KEY: &str = "BOT-M003";
/// A value of the wrong type (a number where a string belongs, ...).
pub const WRONG_TYPE: &str = "BOT-M004";
/// A value of the right type but out of range or not one of the choices.
pub const INVALID_VALUE: &str = "BOT-M005";
/// A required key is missing.
pub const MISSING_KEY: &str = "BOT-M006";
/// `version` is not 1.
pub const VERSION: &str = "BOT-M010";
/// No `[agents.<name>]` table.
pub const NO_AGENTS: &str = "BOT-M011";
/// An agent name that does not make a bottle name.
pub const AGENT_NAME: &str = "BOT-M012";
/// Neither `image` nor `build`.
pub const NO_IMAGE: &str = "BOT-M013";
/// Both `image` and `build`.
pub const IMAGE_AND_BUILD: &str = "BOT-M014";
/// An empty or blank `image`.
pub const EMPTY_IMAGE: &str = "BOT-M015";
/// `build.context` is not a directory.
pub const BUILD_CONTEXT: &str = "BOT-M016";
/// An empty string in `command`.
pub const EMPTY_ARGUMENT: &str = "BOT-M017";
/// An `env` key that is not a variable name.
pub const ENV_NAME: &str = "BOT-M018";
/// An `env` key the bundle sets.
pub const ENV_RESERVED: &str = "BOT-M019";
/// `prompt` is not a file.
pub const PROMPT_FILE: &str = "BOT-M020";
/// A `skills` entry is not a directory.
pub const SKILLS_DIR: &str = "BOT-M021";
/// An egress rule (or credential host) written as a URL.
pub const HOST_URL: &str = "BOT-M022";
/// An egress rule (or credential host) with a path.
pub const HOST_PATH: &str = "BOT-M023";
/// An egress rule (or credential host) with a port.
pub const HOST_PORT: &str = "BOT-M024";
/// A misplaced or too broad wildcard.
pub const HOST_WILDCARD: &str = "BOT-M025";
/// Not a valid host name or IP literal.
pub const HOST_NAME: &str = "BOT-M026";
/// An egress rule listed twice.
pub const HOST_DUPLICATE: &str = "BOT-M027";
/// Egress port 0, or an empty port list.
pub const PORT_INVALID: &str = "BOT-M028";
/// An egress port listed twice.
pub const PORT_DUPLICATE: &str = "BOT-M029";
/// A credential name empty or used twice.
pub const CREDENTIAL_NAME: &str = "BOT-M030";
/// A credential header that is not an HTTP header name.
pub const CREDENTIAL_HEADER: &str = "BOT-M031";
/// A credential format without exactly one `{}`, or with control characters.
pub const CREDENTIAL_FORMAT: &str = "BOT-M032";
/// A credential host not on the egress allowlist.
pub const CREDENTIAL_HOST: &str = "BOT-M033";
/// A credential env source that is not a variable name.
pub const CREDENTIAL_ENV: &str = "BOT-M034";
/// A credential file source that is empty or names another user's home.
pub const CREDENTIAL_FILE: &str = "BOT-M035";
/// A git repository name that is not valid.
pub const GIT_NAME: &str = "BOT-M036";
/// A git repository name used twice.
pub const GIT_DUPLICATE: &str = "BOT-M037";
/// `push` on a read-only repository.
pub const GIT_PUSH_READ_ONLY: &str = "BOT-M038";
/// A read-write repository with no `push` globs.
pub const GIT_NO_PUSH: &str = "BOT-M039";
/// `limits.memory` is not a size.
pub const MEMORY_SYNTAX: &str = "BOT-M040";
/// `limits.memory` is below 64 MiB.
pub const MEMORY_SMALL: &str = "BOT-M041";
/// `limits.audit_log` is not a size.
pub const AUDIT_LOG_SYNTAX: &str = "BOT-M051";
/// `limits.audit_log` is below 1 MiB.
pub const AUDIT_LOG_SMALL: &str = "BOT-M052";
/// `limits.pids` is below 16.
pub const PIDS_SMALL: &str = "BOT-M042";
/// `limits.cpus` is not a positive finite number.
pub const CPUS: &str = "BOT-M043";
/// A `devices` entry outside `/dev/`.
pub const DEVICE_PATH: &str = "BOT-M044";
/// A `devices_blacklist` entry outside `/dev/`.
pub const BLACKLIST_PATH: &str = "BOT-M045";
/// An `egress.resolve` name that is not an exact `allow` rule.
pub const RESOLVE_NAME: &str = "BOT-M046";
/// An `egress.resolve` address that is not an IP address.
pub const RESOLVE_ADDRESS: &str = "BOT-M047";
/// `limits.disk` is not a size.
pub const DISK_SYNTAX: &str = "BOT-M048";
/// `limits.disk` is below 256 MiB.
pub const DISK_SMALL: &str = "BOT-M049";
/// An `egress.upstream_ca` file that is missing, unreadable or not a file.
pub const UPSTREAM_CA_FILE: &str = "BOT-M060";
/// An `egress.upstream_ca` file that is not PEM or holds no certificate.
pub const UPSTREAM_CA_PEM: &str = "BOT-M061";
/// An `egress.on_secret` host that is not an `allow` rule.
pub const ON_SECRET_HOST: &str = "BOT-M063";
/// A local git repository path (`git[].url`) is not a directory.
pub const GIT_PATH: &str = "BOT-M070";
/// A local git repository path (`git[].url`) is a directory but neither a
/// working checkout nor a bare repository.
pub const GIT_NOT_A_REPOSITORY: &str = "BOT-M071";
/// A `publish` entry that is not a port or `"PORT:HOST_PORT"`.
pub const PUBLISH_INVALID: &str = "BOT-M080";
/// A `publish` host port listed twice.
pub const PUBLISH_DUPLICATE: &str = "BOT-M081";
/// An `egress.host_services` entry that is not a port on the host's
/// loopback.
pub const HOST_SERVICE: &str = "BOT-M082";
/// An `egress.tcp` entry that is not `NAME:PORT`.
pub const TCP_DESTINATION: &str = "BOT-M083";
/// Two relays (host services, TCP destinations) on one port, or one on a
/// port of the bundle's own.
pub const RELAY_PORT: &str = "BOT-M084";
/// An `egress.allow` rule or `egress.resolve` address on loopback: the
/// box's own, never the host's.
pub const LOOPBACK: &str = "BOT-M085";

/// Every code with a one-line summary, in code order.
pub const ALL: &[(&str, &str)] = &[
    (READ, "the manifest file cannot be read"),
    (SYNTAX, "the text is not valid TOML"),
    (UNKNOWN_KEY, "a key the manifest format does not have"),
    (WRONG_TYPE, "a value of the wrong type"),
    (
        INVALID_VALUE,
        "a value out of range or not one of the choices",
    ),
    (MISSING_KEY, "a required key is missing"),
    (VERSION, "`version` is not 1"),
    (NO_AGENTS, "no `[agents.<name>]` table"),
    (AGENT_NAME, "an agent name with no letters or digits"),
    (NO_IMAGE, "an agent with neither `image` nor `build`"),
    (IMAGE_AND_BUILD, "an agent with both `image` and `build`"),
    (EMPTY_IMAGE, "an empty or blank `image`"),
    (BUILD_CONTEXT, "`build.context` is not a directory"),
    (EMPTY_ARGUMENT, "an empty string in `command`"),
    (ENV_NAME, "an `env` key that is not a variable name"),
    (ENV_RESERVED, "an `env` key the bundle sets"),
    (PROMPT_FILE, "`prompt` is not a file"),
    (SKILLS_DIR, "a `skills` entry is not a directory"),
    (
        HOST_URL,
        "an egress rule or credential host written as a URL",
    ),
    (HOST_PATH, "an egress rule or credential host with a path"),
    (HOST_PORT, "an egress rule or credential host with a port"),
    (HOST_WILDCARD, "a misplaced or too broad wildcard"),
    (HOST_NAME, "not a valid host name or IP address"),
    (HOST_DUPLICATE, "an egress rule listed twice"),
    (PORT_INVALID, "egress port 0, or an empty port list"),
    (PORT_DUPLICATE, "an egress port listed twice"),
    (CREDENTIAL_NAME, "a credential name empty or used twice"),
    (
        CREDENTIAL_HEADER,
        "a credential header that is not an HTTP header name",
    ),
    (
        CREDENTIAL_FORMAT,
        "a credential format without exactly one `{}`",
    ),
    (
        CREDENTIAL_HOST,
        "a credential host not on the egress allowlist",
    ),
    (
        CREDENTIAL_ENV,
        "a credential env source that is not a variable name",
    ),
    (
        CREDENTIAL_FILE,
        "a credential file source that is empty or another user's home",
    ),
    (GIT_NAME, "a git repository name that is not valid"),
    (GIT_DUPLICATE, "a git repository name used twice"),
    (GIT_PUSH_READ_ONLY, "`push` on a read-only repository"),
    (GIT_NO_PUSH, "a read-write repository with no `push` globs"),
    (MEMORY_SYNTAX, "`limits.memory` is not a size"),
    (MEMORY_SMALL, "`limits.memory` is below 64 MiB"),
    (PIDS_SMALL, "`limits.pids` is below 16"),
    (AUDIT_LOG_SYNTAX, "`limits.audit_log` is not a size"),
    (AUDIT_LOG_SMALL, "`limits.audit_log` is below 1 MiB"),
    (CPUS, "`limits.cpus` is not a positive finite number"),
    (DEVICE_PATH, "a `devices` entry outside /dev/"),
    (BLACKLIST_PATH, "a `devices_blacklist` entry outside /dev/"),
    (
        RESOLVE_NAME,
        "an `egress.resolve` name that is not an exact `allow` rule",
    ),
    (
        RESOLVE_ADDRESS,
        "an `egress.resolve` address that is not an IP address",
    ),
    (DISK_SYNTAX, "`limits.disk` is not a size"),
    (DISK_SMALL, "`limits.disk` is below 256 MiB"),
    (
        UPSTREAM_CA_FILE,
        "an `egress.upstream_ca` file that is missing or unreadable",
    ),
    (
        UPSTREAM_CA_PEM,
        "an `egress.upstream_ca` file that is not PEM or holds no certificate",
    ),
    (
        ON_SECRET_HOST,
        "an `egress.on_secret` host that is not an `allow` rule",
    ),
    (
        GIT_PATH,
        "a local git repository path that is not a directory",
    ),
    (
        GIT_NOT_A_REPOSITORY,
        "a local git repository path that is neither a working checkout nor a bare repository",
    ),
    (
        PUBLISH_INVALID,
        "a `publish` entry that is not a port or `\"PORT:HOST_PORT\"`",
    ),
    (PUBLISH_DUPLICATE, "a `publish` host port listed twice"),
    (
        HOST_SERVICE,
        "an `egress.host_services` entry that is not a port on the host's loopback",
    ),
    (
        TCP_DESTINATION,
        "an `egress.tcp` entry that is not `NAME:PORT`",
    ),
    (
        RELAY_PORT,
        "two host services or TCP destinations on one port, or one on a bundle port",
    ),
    (
        LOOPBACK,
        "an `egress.allow` rule or `egress.resolve` address on loopback",
    ),
];
