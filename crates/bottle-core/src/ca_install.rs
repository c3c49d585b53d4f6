//! How the bottle's CA gets trusted inside a box: the one definition both
//! backends run (ARCHITECTURE.md invariant 4). A backend supplies only the
//! primitives ([`AgentBox`], the box's one trait: look at a path or a
//! directory, write a file or a link, run a program, flush what it held
//! back); a refused write is a warning here, not a failed launch. What
//! goes where, in which order, and what counts as a problem is here.
//!
//! 1. The CA goes where the image's own tooling reads anchors
//!    ([`ANCHORS`]), when that directory or tool exists, so a later
//!    `update-ca-certificates`/`update-ca-trust` by the agent keeps it.
//! 2. That tool is run as root, under the box's own `timeout` when it has
//!    one ([`TIMEOUT_PROGRAMS`]), which kills it past [`TOOL_TIMEOUT`];
//!    without one an overrunning tool is only abandoned, and the warning
//!    says it may still be running.
//! 3. Every system bundle file that exists ([`SYSTEM_BUNDLES`]) is made to
//!    contain the CA, following symlinks inside the box (at most
//!    [`MAX_LINK_DEPTH`] hops), unless the tool already put it there.
//! 4. The hashed directory [`HASHED_DIR`] gets `<subject-hash>.N`, the
//!    name OpenSSL's `-CApath` lookup uses, computed on the host
//!    ([`crate::subject_hash`]) so boxes without `openssl` get it too.
//!
//! Debian's `update-ca-certificates` is not run when its whole effect can
//! be written from outside ([`ImageTrust::tool_is_emulated`]): it is the
//! Debian script, with no hooks and no other local anchor. It would link
//! `bottle.pem` to the anchor, rebuild the bundle as the image's own plus
//! the CA, and rehash; the same three files are written instead, without a
//! running box, which takes the install off a launch's critical path (the
//! tool rehashes every certificate of the image: seconds).
//!
//! Every path read back from the box was chosen by the image, so it is
//! hostile: warnings pass it through [`crate::display::escape_for_terminal`].

use std::time::Duration;

use crate::agent::AGENT_CA_PATH;
use crate::agent_box::{AgentBox, Entry, Refused, ToolRun};
use crate::display::escape_for_terminal;

/// An anchor directory and the tool that rebuilds the bundles from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Anchor {
    /// The directory the image's tooling reads extra roots from.
    pub dir: &'static str,
    /// The file name the CA gets there.
    pub file: &'static str,
    /// The tool (absolute path) and its arguments.
    pub tool: &'static [&'static str],
}

/// Where each family's tooling reads its anchors.
pub const ANCHORS: [Anchor; 3] = [
    // Debian, Ubuntu, Alpine.
    Anchor {
        dir: "/usr/local/share/ca-certificates",
        file: "bottle.crt",
        tool: &["/usr/sbin/update-ca-certificates"],
    },
    // Fedora, RHEL, UBI.
    Anchor {
        dir: "/etc/pki/ca-trust/source/anchors",
        file: "bottle.pem",
        tool: &["/usr/bin/update-ca-trust", "extract"],
    },
    // Arch.
    Anchor {
        dir: "/etc/ca-certificates/trust-source/anchors",
        file: "bottle.crt",
        tool: &["/usr/bin/update-ca-trust", "extract"],
    },
];

/// The single-file bundles TLS libraries read by default.
pub const SYSTEM_BUNDLES: [&str; 5] = [
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
    "/etc/ssl/ca-bundle.pem",
    "/etc/ssl/certs/ca-bundle.crt",
];

/// OpenSSL's default hashed certificate directory.
pub const HASHED_DIR: &str = "/etc/ssl/certs";

/// Where Debian's `update-ca-certificates` finds the hooks it runs after a
/// change (Java's keystore, Mono's): an image with any is not emulated.
pub const DEBIAN_HOOKS_DIR: &str = "/etc/ca-certificates/update.d";

/// What Debian's `update-ca-certificates` script sets, each on a line of
/// its own: a tool without every one is not the script whose effect
/// [`install_surveyed`] knows how to write (Alpine's is a C program).
const DEBIAN_TOOL_MARKS: [&str; 4] = [
    "LOCALCERTSDIR=/usr/local/share/ca-certificates",
    "ETCCERTSDIR=/etc/ssl/certs",
    "HOOKSDIR=/etc/ca-certificates/update.d",
    "CERTBUNDLE=ca-certificates.crt",
];

/// How many symlinks are followed from a bundle's path.
pub const MAX_LINK_DEPTH: usize = 8;

/// How long an image's trust tool may run.
pub const TOOL_TIMEOUT: Duration = Duration::from_secs(60);

/// How much longer than [`TOOL_TIMEOUT`] a backend waits, so that the
/// box's own `timeout` acts first.
pub const TOOL_GRACE: Duration = Duration::from_secs(10);

/// Where images keep `timeout` (coreutils, or a busybox applet), which
/// kills a tool past [`TOOL_TIMEOUT`] inside the box.
pub const TIMEOUT_PROGRAMS: [&str; 2] = ["/usr/bin/timeout", "/bin/timeout"];

/// How much of a tool's stderr a warning shows.
const STDERR_SHOWN: usize = 300;

/// What installing the CA did, and what it could not do.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CaInstallReport {
    /// Files written or appended to.
    pub installed: Vec<String>,
    /// Tools run successfully.
    pub ran: Vec<String>,
    /// Tools whose effect was written instead of running them.
    pub emulated: Vec<String>,
    /// Problems, one line each, safe for the operator's terminal.
    pub warnings: Vec<String>,
}

impl CaInstallReport {
    fn warn(&mut self, text: String) {
        self.warnings.push(escape_for_terminal(&text).into_owned());
    }
}

/// What a box's image says about trusting a CA, looked up before the
/// install writes anything: which anchor directories and trust tools it
/// has, its `timeout`, where each system bundle leads, whether it has the
/// hashed directory. It depends only on the image's content and the
/// launch's fixed layout, so a backend may remember it by image ID
/// ([`install_surveyed`] re-reads every file it writes to).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ImageTrust {
    /// For each of [`ANCHORS`], in order: whether its directory exists and
    /// whether its tool does.
    anchors: Vec<AnchorFound>,
    /// The first of [`TIMEOUT_PROGRAMS`] the image has; looked for only
    /// when a tool will run.
    timeout: Option<String>,
    /// For each of [`SYSTEM_BUNDLES`], in order: where it leads.
    bundles: Vec<BundleFound>,
    /// Whether [`HASHED_DIR`] is a directory.
    hashed_dir: bool,
    /// Whether the image's only trust tool is Debian's script with nothing
    /// else to do than what [`install_surveyed`] writes in its place.
    tool_emulated: bool,
}

/// One anchor's directory and tool, as found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct AnchorFound {
    dir: bool,
    tool: bool,
}

/// Where one system bundle's path leads, symlinks followed.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
enum BundleFound {
    /// Nothing, or a directory: not a bundle, and no warning.
    Absent,
    /// A regular file at this resolved path.
    File(String),
    /// A symlink chain ending at this path, which does not exist.
    Dangling(String),
    /// More than [`MAX_LINK_DEPTH`] symlinks.
    TooLong,
}

impl ImageTrust {
    /// Whether installing will run one of the image's trust tools, which
    /// needs the box running; without one the install only looks at and
    /// writes files, which a backend may do before the box starts.
    pub fn runs_a_tool(&self) -> bool {
        self.anchors.iter().any(|found| found.tool) && !self.tool_emulated
    }

    /// Whether the install writes what Debian's `update-ca-certificates`
    /// would instead of running it: it is the image's only trust tool, it
    /// is the Debian script, [`DEBIAN_HOOKS_DIR`] and the local anchor
    /// directory are empty, the first system bundle is a file where the
    /// script writes it, and the hashed directory exists.
    pub fn tool_is_emulated(&self) -> bool {
        self.tool_emulated
    }

    /// Whether this survey has the shape this version of bottle makes: one
    /// entry per anchor and per bundle, absolute paths, a known `timeout`.
    /// A backend checks a remembered survey with it and surveys again when
    /// it fails.
    pub fn is_well_formed(&self) -> bool {
        let absolute = |path: &str| path.starts_with('/') && !path.contains('\0');
        self.anchors.len() == ANCHORS.len()
            && self.bundles.len() == SYSTEM_BUNDLES.len()
            && self
                .timeout
                .as_deref()
                .is_none_or(|program| TIMEOUT_PROGRAMS.contains(&program))
            && self.bundles.iter().all(|bundle| match bundle {
                BundleFound::File(path) | BundleFound::Dangling(path) => absolute(path),
                BundleFound::Absent | BundleFound::TooLong => true,
            })
    }
}

/// Looks at everything [`install_surveyed`] needs to know of the image,
/// writing nothing.
pub fn survey<B: AgentBox>(target: &mut B) -> Result<ImageTrust, B::Error> {
    let mut anchors = Vec::with_capacity(ANCHORS.len());
    for anchor in ANCHORS {
        let dir = target.entry(anchor.dir)? == Entry::Dir;
        let tool = is_program(&target.entry(anchor.tool[0])?);
        anchors.push(AnchorFound { dir, tool });
    }
    let mut timeout = None;
    if anchors.iter().any(|found| found.tool) {
        for program in TIMEOUT_PROGRAMS {
            if is_program(&target.entry(program)?) {
                timeout = Some(program.to_string());
                break;
            }
        }
    }
    let mut bundles = Vec::with_capacity(SYSTEM_BUNDLES.len());
    for bundle in SYSTEM_BUNDLES {
        bundles.push(walk(target, bundle)?.0);
    }
    let hashed_dir = target.entry(HASHED_DIR)? == Entry::Dir;
    let tool_emulated = debian_tool_alone(target, &anchors, &bundles, hashed_dir)?;
    Ok(ImageTrust {
        anchors,
        timeout,
        bundles,
        hashed_dir,
        tool_emulated,
    })
}

/// Whether the image's only trust tool is Debian's `update-ca-certificates`
/// and running it would do nothing but what [`install_surveyed`] writes in
/// its place ([`ImageTrust::tool_is_emulated`]).
fn debian_tool_alone<B: AgentBox>(
    target: &mut B,
    anchors: &[AnchorFound],
    bundles: &[BundleFound],
    hashed_dir: bool,
) -> Result<bool, B::Error> {
    let [debian, others @ ..] = anchors else {
        return Ok(false);
    };
    let debian_bundle = BundleFound::File(SYSTEM_BUNDLES[0].to_string());
    if !debian.tool
        || others.iter().any(|found| found.tool)
        || bundles.first() != Some(&debian_bundle)
        || !hashed_dir
    {
        return Ok(false);
    }
    let Entry::File { contents, .. } = target.entry(ANCHORS[0].tool[0])? else {
        return Ok(false);
    };
    let script = String::from_utf8_lossy(&contents);
    if !DEBIAN_TOOL_MARKS
        .iter()
        .all(|mark| script.lines().any(|line| line.trim() == *mark))
    {
        return Ok(false);
    }
    for dir in [DEBIAN_HOOKS_DIR, ANCHORS[0].dir] {
        let empty = match target.entry(dir)? {
            Entry::Missing => true,
            Entry::Dir => !target.dir_has_entries(dir)?,
            // A link the script would follow, or a file where it expects a
            // directory: not a case to write from outside.
            Entry::File { .. } | Entry::Link(_) => false,
        };
        if !empty {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Installs the PEM certificate `cert` in `target` as the image's tooling
/// expects. Only a box that cannot be reached is an error; everything else
/// is a warning in the report.
pub fn install<B: AgentBox>(target: &mut B, cert: &[u8]) -> Result<CaInstallReport, B::Error> {
    let image = survey(target)?;
    install_surveyed(target, cert, &image)
}

/// [`install`] with the image's [`survey`] already in hand (remembered by
/// the backend). The survey only saves looking: the CA is written to
/// `/etc/bottle`, every anchor and bundle it names, and each file is read
/// from the box before the CA is appended to it. Once a trust tool has run
/// the box is no longer the image, so the bundles and the hashed directory
/// are looked at again.
pub fn install_surveyed<B: AgentBox>(
    target: &mut B,
    cert: &[u8],
    image: &ImageTrust,
) -> Result<CaInstallReport, B::Error> {
    let mut report = CaInstallReport::default();
    put(target, AGENT_CA_PATH, cert, 0o644, &mut report)?;
    let body = pem_body(cert);

    let tools = install_anchors(target, cert, &image.anchors, &mut report)?;
    // The anchor went in: what the tool would do next is written below.
    let emulated = image.tool_emulated && tools == [ANCHORS[0].tool];
    let mut tools = if emulated { Vec::new() } else { tools };
    let mut settled = 0;
    if !tools.is_empty() {
        let before = report.installed.len();
        settled = settle(target, settled, &mut report)?;
        if settled < before {
            // The anchors did not go in: the tools have nothing to add.
            tools.clear();
        }
    }
    let tool_ran = !tools.is_empty();
    for tool in tools {
        run_tool(target, tool, image.timeout.as_deref(), &mut report)?;
    }
    // The script's `bottle.pem`, which the hashed entry names (as its
    // rehash would) and a later run of the script finds in place.
    let linked_pem = emulated && {
        let anchor = format!("{}/{}", ANCHORS[0].dir, ANCHORS[0].file);
        link(target, DEBIAN_PEM, &anchor, &mut report)?
    };
    if emulated {
        report.emulated.push(ANCHORS[0].tool.join(" "));
    }

    let mut bundles = 0;
    let mut done: Vec<String> = Vec::new();
    for (bundle, found) in SYSTEM_BUNDLES.iter().zip(&image.bundles) {
        let resolved = if tool_ran {
            resolve_file(target, bundle, &mut report)?
        } else {
            surveyed_file(target, bundle, found, &mut report)?
        };
        let Some((path, contents, mode)) = resolved else {
            continue;
        };
        bundles += 1;
        if done.contains(&path) || pem_bodies(&contents).any(|b| b == body) {
            continue;
        }
        let mut appended = contents;
        if !appended.is_empty() && !appended.ends_with(b"\n") {
            appended.push(b'\n');
        }
        appended.extend_from_slice(cert);
        put(target, &path, &appended, mode, &mut report)?;
        done.push(path);
    }
    if bundles == 0 {
        report.warn(format!(
            "ca: the image has no system trust bundle (none of {}); tools that ignore SSL_CERT_FILE will not trust the bottle's CA",
            SYSTEM_BUNDLES.join(", ")
        ));
    }

    let hashed_dir = if tool_ran {
        target.entry(HASHED_DIR)? == Entry::Dir
    } else {
        image.hashed_dir
    };
    if hashed_dir {
        let entry = match linked_pem {
            true => HashedEntry::LinkTo(DEBIAN_PEM_NAME),
            false => HashedEntry::Copy(cert),
        };
        match crate::subject_hash::subject_hash(cert) {
            Ok(hash) => install_hashed(target, &hash, entry, &body, &mut report)?,
            Err(err) => report.warn(format!("ca: no entry in {HASHED_DIR}: {err}")),
        }
    }
    settle(target, settled, &mut report)?;
    Ok(report)
}

/// Flushes the box's held-back writes ([`AgentBox::flush`]). When it refuses
/// them, what was recorded as installed since `settled` was not: it
/// becomes one warning. Returns how much of the report is settled.
fn settle<B: AgentBox>(
    target: &mut B,
    settled: usize,
    report: &mut CaInstallReport,
) -> Result<usize, B::Error> {
    if let Err(Refused(why)) = target.flush()? {
        let unwritten: Vec<String> = report.installed.drain(settled..).collect();
        report.warn(format!(
            "ca: could not write {}: {}",
            unwritten.join(", "),
            bounded(why.trim(), STDERR_SHOWN)
        ));
    }
    Ok(report.installed.len())
}

/// The system bundle `bundle` as the survey `found` it: the file it led to
/// is read now (a file that is no longer one is followed again from
/// `bundle`), and a chain that led nowhere is warned about as
/// [`resolve_file`] does.
fn surveyed_file<B: AgentBox>(
    target: &mut B,
    bundle: &str,
    found: &BundleFound,
    report: &mut CaInstallReport,
) -> Result<Option<ResolvedFile>, B::Error> {
    match found {
        BundleFound::Absent => Ok(None),
        BundleFound::File(path) => match target.entry(path)? {
            Entry::File { contents, mode } => Ok(Some((path.clone(), contents, mode))),
            _ => resolve_file(target, bundle, report),
        },
        BundleFound::Dangling(end) => {
            report.warn(dangling(bundle, end));
            Ok(None)
        }
        BundleFound::TooLong => {
            report.warn(too_long(bundle));
            Ok(None)
        }
    }
}

/// Writes the CA into every anchor directory the image has, and returns
/// the tools to run afterwards. A tool whose anchor directories are all
/// missing still gets its first one (the tool reads it, so the directory
/// is only missing because nothing was ever added).
fn install_anchors<B: AgentBox>(
    target: &mut B,
    cert: &[u8],
    found: &[AnchorFound],
    report: &mut CaInstallReport,
) -> Result<Vec<&'static [&'static str]>, B::Error> {
    let found: Vec<(Anchor, bool, bool)> = ANCHORS
        .iter()
        .zip(found)
        .map(|(anchor, found)| (*anchor, found.dir, found.tool))
        .collect();
    let mut tools: Vec<&'static [&'static str]> = Vec::new();
    for (anchor, dir, tool) in &found {
        let first_of_its_tool = found
            .iter()
            .find(|(other, ..)| other.tool == anchor.tool)
            .is_some_and(|(other, ..)| other == anchor);
        let no_dir_for_its_tool = !found
            .iter()
            .any(|(other, other_dir, _)| other.tool == anchor.tool && *other_dir);
        if !(*dir || (*tool && first_of_its_tool && no_dir_for_its_tool)) {
            continue;
        }
        let path = format!("{}/{}", anchor.dir, anchor.file);
        if !put(target, &path, cert, 0o644, report)? {
            continue;
        }
        if *tool && !tools.contains(&anchor.tool) {
            tools.push(anchor.tool);
        }
    }
    Ok(tools)
}

/// Whether an entry can be run: a file, or a link (busybox applets and
/// alternatives are links; a dangling one fails to run, with a warning).
fn is_program(entry: &Entry) -> bool {
    matches!(entry, Entry::File { .. } | Entry::Link(_))
}

/// Runs an image's trust tool, under the image's own `timeout` when it has
/// one: the backend's bound only stops waiting, while `timeout` in the box
/// kills the tool (and, with coreutils, the tool's children).
fn run_tool<B: AgentBox>(
    target: &mut B,
    tool: &[&str],
    stopper: Option<&str>,
    report: &mut CaInstallReport,
) -> Result<(), B::Error> {
    let name = tool.join(" ");
    let seconds = TOOL_TIMEOUT.as_secs().to_string();
    let mut argv: Vec<&str> = match stopper {
        Some(program) => vec![program, "-s", "KILL", &seconds],
        None => Vec::new(),
    };
    argv.extend_from_slice(tool);
    let limit = TOOL_TIMEOUT.as_secs();
    match target.run(&argv, TOOL_TIMEOUT + TOOL_GRACE)? {
        ToolRun::Exited { code: 0, .. } => report.ran.push(name),
        // 124: coreutils' `timeout` stopped it; 137: busybox's (KILL).
        ToolRun::Exited {
            code: 124 | 137, ..
        } if stopper.is_some() => report.warn(format!(
            "ca: `{name}` did not finish within {limit}s and was stopped; the bundles it rebuilds may lack the CA"
        )),
        ToolRun::Exited { code, stderr } => report.warn(format!(
            "ca: `{name}` exited with {code}: {}",
            bounded(stderr.trim(), STDERR_SHOWN)
        )),
        ToolRun::TimedOut => report.warn(format!(
            "ca: `{name}` did not finish within {limit}s and may still be running in the box, which has no `timeout` to stop it"
        )),
        ToolRun::CouldNotRun(why) => report.warn(format!(
            "ca: could not run `{name}`: {}",
            bounded(why.trim(), STDERR_SHOWN)
        )),
    }
    Ok(())
}

/// At most `max` characters of `text`, marked when cut.
fn bounded(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text.to_string(),
    }
}

/// Makes `path` a symlink to `to`, recording it as installed, or the
/// box's refusal as a warning; whether it was made.
fn link<B: AgentBox>(
    target: &mut B,
    path: &str,
    to: &str,
    report: &mut CaInstallReport,
) -> Result<bool, B::Error> {
    let made = target.symlink(path, to)?;
    Ok(record(
        made,
        format!("{path} -> {to}"),
        "link",
        path,
        report,
    ))
}

/// Writes `contents` to `path`, recording it as installed, or the box's
/// refusal as a warning; whether it was written.
fn put<B: AgentBox>(
    target: &mut B,
    path: &str,
    contents: &[u8],
    mode: u32,
    report: &mut CaInstallReport,
) -> Result<bool, B::Error> {
    let written = target.write(path, contents, mode)?;
    Ok(record(written, path.to_string(), "write", path, report))
}

/// Records what the box did with one write or link of `path`: `installed`
/// in the report, or its refusal as a warning that it could not `verb` it.
fn record(
    done: Result<(), Refused>,
    installed: String,
    verb: &str,
    path: &str,
    report: &mut CaInstallReport,
) -> bool {
    match done {
        Ok(()) => {
            report.installed.push(installed);
            true
        }
        Err(Refused(why)) => {
            report.warn(format!(
                "ca: could not {verb} {path}: {}",
                bounded(why.trim(), STDERR_SHOWN)
            ));
            false
        }
    }
}

/// The name Debian's script gives the CA's link in [`HASHED_DIR`] (the
/// anchor's file name, `.crt` made `.pem`).
const DEBIAN_PEM_NAME: &str = "bottle.pem";

/// [`DEBIAN_PEM_NAME`]'s path.
const DEBIAN_PEM: &str = "/etc/ssl/certs/bottle.pem";

/// What a `<hash>.N` entry in [`HASHED_DIR`] is made of.
#[derive(Debug, Clone, Copy)]
enum HashedEntry<'a> {
    /// A file with the certificate.
    Copy(&'a [u8]),
    /// A symlink to this name in the same directory, as a rehash makes.
    LinkTo(&'a str),
}

/// Puts the CA at the first free `<hash>.N` in [`HASHED_DIR`], unless an
/// entry there already holds it.
fn install_hashed<B: AgentBox>(
    target: &mut B,
    hash: &str,
    entry: HashedEntry<'_>,
    body: &str,
    report: &mut CaInstallReport,
) -> Result<(), B::Error> {
    for n in 0..10 {
        let path = format!("{HASHED_DIR}/{hash}.{n}");
        if target.entry(&path)? == Entry::Missing {
            match entry {
                HashedEntry::Copy(cert) => put(target, &path, cert, 0o644, report)?,
                HashedEntry::LinkTo(name) => link(target, &path, name, report)?,
            };
            return Ok(());
        }
        let held = resolve_file(target, &path, report)?;
        if held.is_some_and(|(_, contents, _)| pem_bodies(&contents).any(|b| b == body)) {
            return Ok(());
        }
    }
    report.warn(format!(
        "ca: {HASHED_DIR}/{hash}.0 to .9 are all taken by other certificates"
    ));
    Ok(())
}

/// A regular file reached from a path: its resolved path, contents and
/// mode.
type ResolvedFile = (String, Vec<u8>, u32);

/// The regular file `path` leads to, following symlinks: its resolved
/// path, contents and mode; `None` (with a warning for a dangling or too
/// long chain) when there is none.
fn resolve_file<B: AgentBox>(
    target: &mut B,
    path: &str,
    report: &mut CaInstallReport,
) -> Result<Option<ResolvedFile>, B::Error> {
    Ok(match walk(target, path)? {
        (BundleFound::File(resolved), Some((contents, mode))) => Some((resolved, contents, mode)),
        (BundleFound::Dangling(end), _) => {
            report.warn(dangling(path, &end));
            None
        }
        (BundleFound::TooLong, _) => {
            report.warn(too_long(path));
            None
        }
        _ => None,
    })
}

/// A regular file's contents and permission bits.
type FileRead = (Vec<u8>, u32);

/// Where `path` leads, following symlinks (at most [`MAX_LINK_DEPTH`]),
/// and the contents and mode of the regular file it leads to.
fn walk<B: AgentBox>(
    target: &mut B,
    path: &str,
) -> Result<(BundleFound, Option<FileRead>), B::Error> {
    let mut current = path.to_string();
    for _ in 0..=MAX_LINK_DEPTH {
        match target.entry(&current)? {
            Entry::File { contents, mode } => {
                return Ok((BundleFound::File(current), Some((contents, mode))));
            }
            Entry::Dir => return Ok((BundleFound::Absent, None)),
            Entry::Missing if current == path => return Ok((BundleFound::Absent, None)),
            Entry::Missing => return Ok((BundleFound::Dangling(current), None)),
            Entry::Link(link) => current = join_link(&current, &link),
        }
    }
    Ok((BundleFound::TooLong, None))
}

fn dangling(path: &str, end: &str) -> String {
    format!("ca: {path} is a symlink to {end}, which does not exist; the CA is not in it")
}

fn too_long(path: &str) -> String {
    format!("ca: {path} is a chain of more than {MAX_LINK_DEPTH} symlinks; the CA is not in it")
}

/// Where the symlink at `path` with target `link` points, as an absolute,
/// normalised path inside the box.
fn join_link(path: &str, link: &str) -> String {
    let base = if link.starts_with('/') {
        String::new()
    } else {
        path.rsplit_once('/')
            .map(|(dir, _)| dir)
            .unwrap_or("")
            .to_string()
    };
    let mut parts: Vec<&str> = Vec::new();
    for part in base.split('/').chain(link.split('/')) {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            part => parts.push(part),
        }
    }
    format!("/{}", parts.join("/"))
}

/// The base64 body of the first PEM block in `pem`, whitespace removed.
fn pem_body(pem: &[u8]) -> String {
    pem_bodies(pem).next().unwrap_or_default()
}

/// Every PEM certificate body in `text`, whitespace removed, so a bundle
/// that re-wraps lines still matches.
fn pem_bodies(text: &[u8]) -> impl Iterator<Item = String> + '_ {
    let text = String::from_utf8_lossy(text).into_owned();
    let mut bodies = Vec::new();
    let mut rest = text.as_str();
    while let Some(start) = rest.find("-----BEGIN CERTIFICATE-----") {
        rest = &rest[start + "-----BEGIN CERTIFICATE-----".len()..];
        let Some(end) = rest.find("-----END CERTIFICATE-----") else {
            break;
        };
        bodies.push(
            rest[..end]
                .chars()
                .filter(|c| !c.is_ascii_whitespace())
                .collect::<String>(),
        );
        rest = &rest[end..];
    }
    bodies.into_iter()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    const CERT: &[u8] = include_bytes!("subject_hash/test-ca.pem");

    /// A box as a map of paths; records what ran.
    #[derive(Default)]
    struct FakeBox {
        entries: BTreeMap<String, Entry>,
        ran: Vec<String>,
        /// What running a tool does to the box.
        on_run: Option<fn(&mut FakeBox)>,
        /// What running a tool returns (default: exit 0).
        outcome: Option<ToolRun>,
        /// Directories whose writes the box refuses.
        read_only: Vec<&'static str>,
        /// Why the box refuses its held-back writes at a flush, if it
        /// does.
        refuse_flush: Option<&'static str>,
        /// How many flushes were asked for.
        flushes: usize,
    }

    impl FakeBox {
        fn dir(mut self, path: &str) -> Self {
            self.entries.insert(path.into(), Entry::Dir);
            self
        }
        fn file(mut self, path: &str, contents: &[u8]) -> Self {
            self.entries.insert(
                path.into(),
                Entry::File {
                    contents: contents.to_vec(),
                    mode: 0o644,
                },
            );
            self
        }
        fn link(mut self, path: &str, target: &str) -> Self {
            self.entries.insert(path.into(), Entry::Link(target.into()));
            self
        }
        fn contents(&self, path: &str) -> Vec<u8> {
            match self.entries.get(path) {
                Some(Entry::File { contents, .. }) => contents.clone(),
                other => panic!("{path}: {other:?}"),
            }
        }
    }

    impl AgentBox for FakeBox {
        type Error = std::convert::Infallible;
        fn entry(&mut self, path: &str) -> Result<Entry, Self::Error> {
            Ok(self.entries.get(path).cloned().unwrap_or(Entry::Missing))
        }
        fn write(
            &mut self,
            path: &str,
            contents: &[u8],
            mode: u32,
        ) -> Result<Result<(), Refused>, Self::Error> {
            if self.read_only.iter().any(|dir| path.starts_with(dir)) {
                return Ok(Err(Refused("Read-only file system".into())));
            }
            self.entries.insert(
                path.into(),
                Entry::File {
                    contents: contents.to_vec(),
                    mode,
                },
            );
            Ok(Ok(()))
        }
        fn put(
            &mut self,
            file: &crate::agent_box::BoxFile,
        ) -> Result<Result<(), Refused>, Self::Error> {
            unreachable!("the CA's install puts nothing: {file:?}")
        }
        fn symlink(
            &mut self,
            path: &str,
            target: &str,
        ) -> Result<Result<(), Refused>, Self::Error> {
            if self.read_only.iter().any(|dir| path.starts_with(dir)) {
                return Ok(Err(Refused("Read-only file system".into())));
            }
            self.entries.insert(path.into(), Entry::Link(target.into()));
            Ok(Ok(()))
        }
        fn dir_has_entries(&mut self, dir: &str) -> Result<bool, Self::Error> {
            let inside = format!("{dir}/");
            Ok(self.entries.keys().any(|path| path.starts_with(&inside)))
        }
        fn flush(&mut self) -> Result<Result<(), Refused>, Self::Error> {
            self.flushes += 1;
            Ok(match self.refuse_flush {
                Some(why) => Err(Refused(why.into())),
                None => Ok(()),
            })
        }
        fn run(&mut self, argv: &[&str], _: Duration) -> Result<ToolRun, Self::Error> {
            self.ran.push(argv.join(" "));
            if let Some(effect) = self.on_run {
                effect(self);
            }
            Ok(self.outcome.clone().unwrap_or(ToolRun::Exited {
                code: 0,
                stderr: String::new(),
            }))
        }
    }

    fn has_ca(contents: &[u8]) -> bool {
        pem_bodies(contents).any(|b| b == pem_body(CERT))
    }

    #[test]
    fn a_symlinked_bundle_gets_the_ca_in_its_target() {
        let mut target = FakeBox::default()
            .dir("/etc/ssl/certs")
            .link(
                "/etc/ssl/certs/ca-certificates.crt",
                "../../ca-certificates/extracted/tls-ca-bundle.pem",
            )
            .file(
                "/etc/ca-certificates/extracted/tls-ca-bundle.pem",
                b"roots\n",
            );
        let report = install(&mut target, CERT).unwrap();
        assert!(report.warnings.is_empty(), "{report:?}");
        let bundle = target.contents("/etc/ca-certificates/extracted/tls-ca-bundle.pem");
        assert!(bundle.starts_with(b"roots\n") && has_ca(&bundle));
        assert_eq!(
            target.entries["/etc/ssl/certs/ca-certificates.crt"],
            Entry::Link("../../ca-certificates/extracted/tls-ca-bundle.pem".into())
        );
    }

    #[test]
    fn a_dangling_bundle_link_is_a_warning_naming_it() {
        let mut target = FakeBox::default()
            .link("/etc/ssl/cert.pem", "/nix/store/x/ca-bundle.crt")
            .file("/etc/pki/tls/certs/ca-bundle.crt", b"");
        let report = install(&mut target, CERT).unwrap();
        assert_eq!(report.warnings.len(), 1, "{report:?}");
        assert!(report.warnings[0].contains("/nix/store/x/ca-bundle.crt"));
        assert!(has_ca(&target.contents("/etc/pki/tls/certs/ca-bundle.crt")));
    }

    #[test]
    fn no_bundle_at_all_is_a_warning() {
        let mut target = FakeBox::default();
        let report = install(&mut target, CERT).unwrap();
        assert_eq!(report.installed, [AGENT_CA_PATH]);
        assert_eq!(report.warnings.len(), 1, "{report:?}");
        assert!(report.warnings[0].contains("no system trust bundle"));
    }

    #[test]
    fn the_anchor_is_written_and_the_tool_run_before_the_bundles() {
        let mut target = FakeBox::default()
            .dir("/etc/pki/ca-trust/source/anchors")
            .file("/usr/bin/update-ca-trust", b"#!/bin/sh\n")
            .file("/etc/pki/tls/certs/ca-bundle.crt", b"roots\n");
        // The tool rebuilds the bundle from the anchors, as Fedora's does.
        target.on_run = Some(|b: &mut FakeBox| {
            let anchor = b.contents("/etc/pki/ca-trust/source/anchors/bottle.pem");
            let mut bundle = b"roots\n".to_vec();
            bundle.extend(anchor);
            b.entries.insert(
                "/etc/pki/tls/certs/ca-bundle.crt".into(),
                Entry::File {
                    contents: bundle,
                    mode: 0o444,
                },
            );
        });
        let report = install(&mut target, CERT).unwrap();
        assert_eq!(target.ran, ["/usr/bin/update-ca-trust extract"]);
        assert_eq!(report.ran, ["/usr/bin/update-ca-trust extract"]);
        let bundle = target.contents("/etc/pki/tls/certs/ca-bundle.crt");
        assert_eq!(
            pem_bodies(&bundle).count(),
            1,
            "the CA is not appended twice"
        );
        assert!(report.warnings.is_empty(), "{report:?}");
    }

    #[test]
    fn the_hashed_directory_gets_the_first_free_name() {
        let hash = include_str!("subject_hash/test-ca.hash").trim();
        let taken = format!("/etc/ssl/certs/{hash}.0");
        let mut target = FakeBox::default()
            .dir("/etc/ssl/certs")
            .file(&taken, b"another\n");
        install(&mut target, CERT).unwrap();
        assert!(has_ca(
            &target.contents(&format!("/etc/ssl/certs/{hash}.1"))
        ));
        // Run again: the entry holding the CA is found, none is added.
        let before = target.entries.len();
        install(&mut target, CERT).unwrap();
        assert_eq!(target.entries.len(), before);
    }

    #[test]
    fn hostile_link_targets_are_escaped_in_warnings() {
        let mut target = FakeBox::default().link("/etc/ssl/cert.pem", "/x\x1b[2Jy");
        let report = install(&mut target, CERT).unwrap();
        assert!(
            report.warnings.iter().all(|w| !w.contains('\x1b')),
            "{report:?}"
        );
    }

    #[test]
    fn the_tool_runs_under_the_boxs_timeout_which_stops_it() {
        let mut target = FakeBox::default()
            .link("/usr/sbin/update-ca-certificates", "/bin/busybox")
            .link("/bin/timeout", "/bin/busybox");
        target.outcome = Some(ToolRun::Exited {
            code: 137,
            stderr: String::new(),
        });
        let report = install(&mut target, CERT).unwrap();
        assert_eq!(
            target.ran,
            ["/bin/timeout -s KILL 60 /usr/sbin/update-ca-certificates"]
        );
        assert!(
            report.installed[1] == "/usr/local/share/ca-certificates/bottle.crt",
            "{report:?}"
        );
        assert!(
            report.warnings[0].contains("did not finish within 60s and was stopped"),
            "{report:?}"
        );
    }

    #[test]
    fn without_timeout_an_overrunning_tool_is_said_to_be_still_running() {
        let mut target = FakeBox::default().file("/usr/bin/update-ca-trust", b"#!/bin/sh\n");
        target.outcome = Some(ToolRun::TimedOut);
        let report = install(&mut target, CERT).unwrap();
        assert_eq!(target.ran, ["/usr/bin/update-ca-trust extract"]);
        assert!(
            report.warnings[0].contains("may still be running"),
            "{report:?}"
        );
    }

    #[test]
    fn a_tool_without_anchor_directories_gets_only_its_first() {
        let mut target = FakeBox::default().file("/usr/bin/update-ca-trust", b"#!/bin/sh\n");
        let report = install(&mut target, CERT).unwrap();
        assert_eq!(
            report.installed[..2],
            [AGENT_CA_PATH, "/etc/pki/ca-trust/source/anchors/bottle.pem"]
        );
        assert!(
            !report
                .installed
                .iter()
                .any(|p| p.starts_with("/etc/ca-certificates/")),
            "{report:?}"
        );
        // On Arch the same tool reads its own directory, which exists.
        let mut arch = FakeBox::default()
            .file("/usr/bin/update-ca-trust", b"#!/bin/sh\n")
            .dir("/etc/ca-certificates/trust-source/anchors");
        let report = install(&mut arch, CERT).unwrap();
        assert_eq!(
            report.installed[..2],
            [
                AGENT_CA_PATH,
                "/etc/ca-certificates/trust-source/anchors/bottle.crt"
            ]
        );
        assert_eq!(arch.ran, ["/usr/bin/update-ca-trust extract"]);
    }

    #[test]
    fn a_tools_stderr_is_bounded_and_escaped_in_its_warning() {
        let mut target = FakeBox::default().file("/usr/bin/update-ca-trust", b"#!/bin/sh\n");
        target.outcome = Some(ToolRun::Exited {
            code: 1,
            stderr: format!("\x1b[2J{}", "x".repeat(10_000)),
        });
        let report = install(&mut target, CERT).unwrap();
        let warning = &report.warnings[0];
        assert!(warning.contains("exited with 1"), "{warning}");
        assert!(
            !warning.contains('\x1b') && warning.len() < 500,
            "{warning}"
        );
    }

    #[test]
    fn a_refused_write_is_a_warning_and_its_tool_is_not_run() {
        let mut target = FakeBox::default()
            .file("/usr/sbin/update-ca-certificates", b"#!/bin/sh\n")
            .file("/etc/ssl/certs/ca-certificates.crt", b"roots\n");
        target.read_only = vec!["/usr/"];
        let report = install(&mut target, CERT).unwrap();
        assert!(target.ran.is_empty(), "{:?}", target.ran);
        assert_eq!(report.warnings.len(), 1, "{report:?}");
        assert!(
            report.warnings[0].contains(
                "could not write /usr/local/share/ca-certificates/bottle.crt: Read-only file system"
            ),
            "{report:?}"
        );
        assert!(has_ca(
            &target.contents("/etc/ssl/certs/ca-certificates.crt")
        ));
    }

    #[test]
    fn links_resolve_relative_to_their_directory() {
        assert_eq!(
            join_link("/etc/ssl/cert.pem", "certs/x.crt"),
            "/etc/ssl/certs/x.crt"
        );
        assert_eq!(join_link("/etc/ssl/cert.pem", "../../a/./b"), "/a/b");
        assert_eq!(join_link("/etc/ssl/cert.pem", "/abs"), "/abs");
    }

    /// A box with a bundle behind a link, a dangling bundle link and the
    /// hashed directory, and no trust tool.
    fn toolless_image() -> FakeBox {
        FakeBox::default()
            .dir("/etc/ssl/certs")
            .link("/etc/ssl/cert.pem", "certs/ca-certificates.crt")
            .file("/etc/ssl/certs/ca-certificates.crt", b"roots\n")
            .link("/etc/ssl/ca-bundle.pem", "/nowhere.pem")
    }

    #[test]
    fn an_install_from_a_remembered_survey_does_what_a_fresh_one_does() {
        let fedora = || {
            let mut image = FakeBox::default()
                .dir("/etc/pki/ca-trust/source/anchors")
                .file("/usr/bin/update-ca-trust", b"#!/bin/sh\n")
                .file("/usr/bin/timeout", b"")
                .file("/etc/pki/tls/certs/ca-bundle.crt", b"roots\n");
            image.outcome = Some(ToolRun::Exited {
                code: 0,
                stderr: String::new(),
            });
            image
        };
        for image in [toolless_image as fn() -> FakeBox, fedora, debian_image] {
            let mut fresh = image();
            let fresh_report = install(&mut fresh, CERT).unwrap();
            // The survey of another box of the same image, as a cache
            // would give it back.
            let remembered: ImageTrust = serde_json::from_str(
                &serde_json::to_string(&survey(&mut image()).unwrap()).unwrap(),
            )
            .unwrap();
            assert!(remembered.is_well_formed());
            let mut cached = image();
            let cached_report = install_surveyed(&mut cached, CERT, &remembered).unwrap();
            assert_eq!(cached_report, fresh_report);
            assert_eq!(cached.entries, fresh.entries);
            assert_eq!(cached.ran, fresh.ran);
            assert!(!fresh_report.installed.is_empty());
        }
    }

    #[test]
    fn a_surveyed_bundle_is_read_again_and_followed_again_when_it_moved() {
        let remembered = survey(&mut toolless_image()).unwrap();
        // The file the survey found is now a link elsewhere: the install
        // follows it rather than trust the survey.
        let mut target = toolless_image()
            .link("/etc/ssl/certs/ca-certificates.crt", "/opt/roots.pem")
            .file("/opt/roots.pem", b"other roots\n");
        install_surveyed(&mut target, CERT, &remembered).unwrap();
        let bundle = target.contents("/opt/roots.pem");
        assert!(bundle.starts_with(b"other roots\n") && has_ca(&bundle));
        assert!(has_ca(&target.contents(AGENT_CA_PATH)));
    }

    #[test]
    fn a_survey_of_another_shape_is_not_well_formed() {
        let good = survey(&mut toolless_image()).unwrap();
        assert!(good.is_well_formed());
        let mut short = good.clone();
        short.bundles.pop();
        let mut relative = good.clone();
        relative.bundles[0] = BundleFound::File("etc/ssl/x".into());
        let mut unknown_timeout = good.clone();
        unknown_timeout.timeout = Some("/tmp/timeout".into());
        let mut no_anchors = good;
        no_anchors.anchors.clear();
        for bad in [short, relative, unknown_timeout, no_anchors] {
            assert!(!bad.is_well_formed(), "{bad:?}");
        }
    }

    /// A Debian image as `ca-certificates` leaves it: the script, its empty
    /// hook and local anchor directories, the bundle, the hashed directory.
    fn debian_image() -> FakeBox {
        FakeBox::default()
            .file(
                "/usr/sbin/update-ca-certificates",
                b"#!/bin/sh\nLOCALCERTSDIR=/usr/local/share/ca-certificates\nETCCERTSDIR=/etc/ssl/certs\n\
                  CERTBUNDLE=ca-certificates.crt\nHOOKSDIR=/etc/ca-certificates/update.d\n",
            )
            .file("/usr/bin/timeout", b"")
            .dir("/etc/ca-certificates/update.d")
            .dir("/usr/local/share/ca-certificates")
            .dir("/etc/ssl/certs")
            .file("/etc/ssl/certs/ca-certificates.crt", b"roots\n")
    }

    #[test]
    fn debians_tool_alone_is_written_from_outside_not_run() {
        let trust = survey(&mut debian_image()).unwrap();
        assert!(
            trust.tool_is_emulated() && !trust.runs_a_tool(),
            "{trust:?}"
        );
        let mut target = debian_image();
        let report = install_surveyed(&mut target, CERT, &trust).unwrap();
        assert!(target.ran.is_empty(), "{:?}", target.ran);
        assert_eq!(report.emulated, ["/usr/sbin/update-ca-certificates"]);
        assert!(report.warnings.is_empty(), "{report:?}");
        // What the script would leave: the anchor, `bottle.pem` linking to
        // it, the bundle with the CA after the image's roots, the hashed
        // name linking to `bottle.pem`.
        let anchor = "/usr/local/share/ca-certificates/bottle.crt";
        assert!(has_ca(&target.contents(anchor)));
        assert_eq!(
            target.entries["/etc/ssl/certs/bottle.pem"],
            Entry::Link(anchor.into())
        );
        let bundle = target.contents("/etc/ssl/certs/ca-certificates.crt");
        assert!(bundle.starts_with(b"roots\n") && has_ca(&bundle));
        let hash = include_str!("subject_hash/test-ca.hash").trim();
        assert_eq!(
            target.entries[&format!("/etc/ssl/certs/{hash}.0")],
            Entry::Link("bottle.pem".into())
        );
        assert!(has_ca(&target.contents(AGENT_CA_PATH)));
    }

    #[test]
    fn debians_tool_runs_when_anything_else_would_do_more() {
        let hooked = || debian_image().file("/etc/ca-certificates/update.d/jks-keystore", b"");
        let linked_hooks = || debian_image().link("/etc/ca-certificates/update.d", "/opt/hooks");
        let local = || debian_image().file("/usr/local/share/ca-certificates/corp.crt", b"");
        let other_script = || debian_image().file("/usr/sbin/update-ca-certificates", b"\x7fELF");
        let with_fedoras = || debian_image().file("/usr/bin/update-ca-trust", b"#!/bin/sh\n");
        let moved_bundle = || {
            debian_image()
                .link("/etc/ssl/certs/ca-certificates.crt", "/opt/roots.pem")
                .file("/opt/roots.pem", b"roots\n")
        };
        let unhashed = || {
            let mut image = debian_image();
            image.entries.remove("/etc/ssl/certs");
            image
        };
        for image in [
            hooked,
            linked_hooks,
            local,
            other_script,
            with_fedoras,
            moved_bundle,
            unhashed,
        ] {
            let trust = survey(&mut image()).unwrap();
            assert!(
                trust.runs_a_tool() && !trust.tool_is_emulated(),
                "{trust:?}"
            );
            let mut target = image();
            let report = install_surveyed(&mut target, CERT, &trust).unwrap();
            assert!(report.emulated.is_empty(), "{report:?}");
            assert!(!target.ran.is_empty(), "the tool did not run");
        }
    }

    #[test]
    fn a_refused_link_is_a_warning_and_the_hashed_entry_is_a_copy() {
        let trust = survey(&mut debian_image()).unwrap();
        let mut target = debian_image();
        target.read_only.push("/etc/ssl/certs/bottle.pem");
        let report = install_surveyed(&mut target, CERT, &trust).unwrap();
        assert!(
            report
                .warnings
                .iter()
                .any(|w| w.contains("could not link /etc/ssl/certs/bottle.pem")),
            "{report:?}"
        );
        let hash = include_str!("subject_hash/test-ca.hash").trim();
        assert!(has_ca(
            &target.contents(&format!("/etc/ssl/certs/{hash}.0"))
        ));
    }

    #[test]
    fn held_back_writes_are_flushed_before_a_tool_and_at_the_end() {
        let mut target = debian_image();
        install(&mut target, CERT).unwrap();
        assert_eq!(target.flushes, 1, "no tool: one flush, at the end");
        let mut target = debian_image().file("/etc/ca-certificates/update.d/hook", b"");
        install(&mut target, CERT).unwrap();
        assert_eq!(target.flushes, 2, "before the tool, and at the end");
    }

    #[test]
    fn a_refused_flush_unclaims_what_it_held_as_one_warning() {
        let mut target = debian_image();
        target.refuse_flush = Some("no space left on device");
        let report = install(&mut target, CERT).unwrap();
        assert!(report.installed.is_empty(), "{report:?}");
        assert_eq!(report.warnings.len(), 1, "{report:?}");
        let warning = &report.warnings[0];
        assert!(
            warning.contains("could not write /etc/bottle/ca.pem")
                && warning.contains("/etc/ssl/certs/ca-certificates.crt")
                && warning.contains("no space left on device"),
            "{warning}"
        );
    }
}
