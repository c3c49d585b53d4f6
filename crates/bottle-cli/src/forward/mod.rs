//! The host's side of a bottle's published ports and host services: one
//! detached `bottle __forward` process per port or service, recorded in
//! the bottle's state dir.
//!
//! Who holds what, and why the bottle gains no route:
//!
//! - a **published port** (`publish`, `bottle port`): the forwarder
//!   listens on the host's `127.0.0.1:<host port>` and nowhere else; each
//!   connection it accepts gets its own run of the in-box agent's relay
//!   (`Bottle::connect_port`: an attached exec, `machine exec -i`) to the
//!   port on the box's loopback. The box listens on nothing new and the
//!   bottle network keeps no host address: the bytes travel on the
//!   backend's exec stream ([`port`]);
//! - a **host service** (`egress.host_services`): the forwarder listens on
//!   a unix socket in the bottle's `host-services/` directory, which the
//!   bundle alone mounts (read-only); each connection the bundle's relay
//!   makes there is dialled to exactly the service's port on the host's
//!   loopback. The bundle never gets a route to the host ([`service`]).
//!
//! `start` spawns the forwarders the manifest asks for before the agent
//! runs (a port that cannot be published fails the start); `bottle port`
//! spawns one for a running bottle. Each writes its record
//! (`forwards/<key>.json`: what it forwards and its identity) once it
//! listens, and signals its spawner on a named pipe. `list` reads the
//! records, `stop` ends the forwarders, `cleanup` ends those whose bottle
//! is gone; and a forwarder whose record is removed (its bottle's state
//! dir went) ends by itself within [`WATCH_EVERY`].

/// A line of a forwarder's log (its stderr is its log file), escaped like
/// every line the CLI writes: it may quote what the box said.
macro_rules! log {
    ($($arg:tt)*) => {
        crate::output::err(&format!(
            "{} {}\n",
            bottle_core::time::now_rfc3339_millis(),
            format!($($arg)*)
        ))
    };
}

pub(crate) mod pipe;
pub(crate) mod port;
pub(crate) mod service;

use std::os::unix::fs::DirBuilderExt as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use bottle_core::backend::OpenPort;
use bottle_core::exec::{CommandRunner, CommandSpec};
use bottle_core::manifest::{HostService, Published};
use bottle_core::process::Owner;
use bottle_core::{BackendKind, slug};
use serde::{Deserialize, Serialize};

use crate::failure::{EXIT_BACKEND, EXIT_USAGE, Failure};

/// The hidden subcommand a forwarder runs as.
pub(crate) const SUBCOMMAND: &str = "__forward";
/// How long a spawner waits for its forwarder to listen.
const READY_WITHIN: Duration = Duration::from_secs(60);
/// How long `stop` lets forwarders end on SIGTERM before SIGKILL.
const END_WITHIN: Duration = Duration::from_secs(5);
/// How often a forwarder checks that its record is still there.
pub(crate) const WATCH_EVERY: Duration = Duration::from_millis(500);
/// Connections one forwarder serves at once; more are closed as they come.
pub(crate) const MAX_CONNECTIONS: usize = 64;
/// A connection that carries no byte either way for this long is closed.
pub(crate) const IDLE: Duration = Duration::from_secs(600);
/// The version of a forwarder's record.
const RECORD_VERSION: u32 = 1;

/// One thing forwarded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Forward {
    /// The agent's port, on the host's loopback.
    Port(Published),
    /// A service on the host's loopback, for the bundle.
    HostService(HostService),
}

impl Forward {
    /// The forwarders a plan asks for: its host services, then its ports.
    pub(crate) fn of_plan(publish: &[Published], host_services: &[HostService]) -> Vec<Forward> {
        host_services
            .iter()
            .cloned()
            .map(Forward::HostService)
            .chain(publish.iter().copied().map(Forward::Port))
            .collect()
    }

    /// The forwarder's files' name in `forwards/`: one per host port, one
    /// per service port.
    fn key(&self) -> String {
        match self {
            Forward::Port(published) => format!("port-{}", published.host_port),
            Forward::HostService(service) => format!("service-{}", service.port),
        }
    }

    /// The arguments of `__forward` that name it.
    fn args(&self) -> [String; 2] {
        match self {
            Forward::Port(published) => ["--publish".into(), published.to_string()],
            Forward::HostService(service) => ["--host-service".into(), service.address()],
        }
    }

    /// What it is, for messages.
    fn describe(&self) -> String {
        match self {
            Forward::Port(p) => format!("the agent's port {} on 127.0.0.1:{}", p.port, p.host_port),
            Forward::HostService(s) => format!("the host service {}", s.address()),
        }
    }
}

/// Where a bottle's forwarders keep their files: `<state_dir>/forwards/`,
/// owner-only.
#[derive(Debug, Clone)]
pub(crate) struct ForwardPaths {
    /// The directory.
    pub dir: PathBuf,
}

impl ForwardPaths {
    /// The forwarders of the bottle whose state dir is `state_dir`.
    pub(crate) fn new(state_dir: &Path) -> ForwardPaths {
        ForwardPaths {
            dir: state_dir.join("forwards"),
        }
    }

    fn record(&self, key: &str) -> PathBuf {
        self.dir.join(format!("{key}.json"))
    }

    fn log(&self, key: &str) -> PathBuf {
        self.dir.join(format!("{key}.log"))
    }

    fn ready(&self, key: &str) -> PathBuf {
        self.dir.join(format!("{key}.ready"))
    }
}

/// A running forwarder, as its record says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Record {
    /// [`RECORD_VERSION`].
    pub version: u32,
    /// `port` or `host-service`.
    pub kind: String,
    /// Where it listens: `127.0.0.1:<host port>`, or its unix socket.
    pub listen: String,
    /// Where each connection goes: `box:<port>`, or the host's
    /// `<host>:<port>`.
    pub to: String,
    /// The port in the box (a published port), or the service's port.
    pub port: u16,
    /// The forwarder's identity, to tell it from a reused PID.
    pub owner: Owner,
}

/// The forwarder's invocation: this `bottle`, on the bottle's backend.
fn forward_spec(
    bottle_exe: &Path,
    kind: BackendKind,
    name: &str,
    forward: &Forward,
) -> CommandSpec {
    CommandSpec::new(bottle_exe)
        .args(["--backend", kind.as_str(), SUBCOMMAND, name])
        .args(forward.args())
        // Holds no directory the operator may want to unmount.
        .cwd("/")
}

/// Spawns the forwarder of `forward` for bottle `name` and waits until it
/// listens; one that exits first is reported with its log (`BOT-C081`).
pub(crate) fn spawn(
    runner: &dyn CommandRunner,
    state_dir: &Path,
    kind: BackendKind,
    name: &str,
    forward: &Forward,
) -> Result<Record, Failure> {
    let failed = |detail: String| {
        Failure::new(
            "BOT-C081",
            EXIT_BACKEND,
            format!("{} of {name} could not be forwarded: {detail}", forward.describe()),
        )
        .with_fix(
            "free the host port or pick another (`bottle port BOTTLE PORT:HOST_PORT`); the forwarder's log is in the bottle's state dir under forwards/",
        )
    };
    let paths = ForwardPaths::new(state_dir);
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&paths.dir)
        .map_err(|err| failed(format!("cannot create {}: {err}", paths.dir.display())))?;
    let key = forward.key();
    if let Some(record) = read_record(&paths.record(&key)).filter(|r| r.owner.is_alive()) {
        return Err(failed(format!(
            "{} is already forwarded to {}",
            record.listen, record.to
        )));
    }
    let ready = paths.ready(&key);
    let (pipe, _held_open) = crate::session::open_ready_pipe(&ready)
        .map_err(|err| failed(format!("cannot make {}: {err}", ready.display())))?;
    // A fresh log per forwarder: its end is why it did not start.
    let _ = std::fs::remove_file(paths.log(&key));
    let spawned = crate::spawn_self::spawn_self(
        runner,
        |exe| forward_spec(exe, kind, name, forward),
        &paths.log(&key),
    );
    let waited =
        spawned.map(|pid| crate::session::wait_ready(&pipe, Owner { pid, start: 0 }, READY_WITHIN));
    let _ = std::fs::remove_file(&ready);
    match waited.map_err(&failed)? {
        crate::session::Ready::Serving => {
            read_record(&paths.record(&key)).ok_or_else(|| failed("it wrote no record".into()))
        }
        crate::session::Ready::Exited => {
            let log = std::fs::read_to_string(paths.log(&key)).unwrap_or_default();
            let log = bottle_core::display::escape_for_terminal(log.trim()).into_owned();
            Err(failed(format!("the forwarder exited: {log}")))
        }
        crate::session::Ready::TimedOut => Err(failed(format!(
            "the forwarder did not listen within {READY_WITHIN:?}"
        ))),
    }
}

/// Spawns every forwarder of `forwards`; on the first that fails, ends
/// those already started and returns its failure.
pub(crate) fn spawn_all(
    runner: &dyn CommandRunner,
    state_dir: &Path,
    kind: BackendKind,
    name: &str,
    forwards: &[Forward],
) -> Result<Vec<Record>, Failure> {
    let mut records = Vec::new();
    for forward in forwards {
        match spawn(runner, state_dir, kind, name, forward) {
            Ok(record) => records.push(record),
            Err(failure) => {
                end_all(state_dir);
                return Err(failure);
            }
        }
    }
    Ok(records)
}

fn read_record(path: &Path) -> Option<Record> {
    let bytes = std::fs::read(path).ok()?;
    serde_json::from_slice::<Record>(&bytes)
        .ok()
        .filter(|r| r.version == RECORD_VERSION)
}

/// Every record of the bottle whose state dir is `state_dir`, with its
/// path.
fn records(state_dir: &Path) -> Vec<(PathBuf, Record)> {
    let paths = ForwardPaths::new(state_dir);
    let Ok(entries) = std::fs::read_dir(&paths.dir) else {
        return Vec::new();
    };
    let mut found: Vec<(PathBuf, Record)> = entries
        .filter_map(|entry| {
            let path = entry.ok()?.path();
            if path.extension().is_some_and(|e| e == "json") {
                read_record(&path).map(|record| (path, record))
            } else {
                None
            }
        })
        .collect();
    found.sort_by(|a, b| a.0.cmp(&b.0));
    found
}

/// The published ports of the bottle whose state dir is `state_dir` whose
/// forwarder runs, for `bottle list`.
pub(crate) fn open_ports(state_dir: &Path) -> Vec<OpenPort> {
    records(state_dir)
        .into_iter()
        .filter(|(_, r)| r.kind == KIND_PORT && r.owner.is_alive())
        .map(|(_, r)| OpenPort {
            port: r.port,
            listen: r.listen,
        })
        .collect()
}

/// The `kind` of a published port's record.
pub(crate) const KIND_PORT: &str = "port";
/// The `kind` of a host service's record.
pub(crate) const KIND_HOST_SERVICE: &str = "host-service";

/// Writes the calling forwarder's record for `forward`, aside then renamed
/// into place, so a reader never sees half of one.
pub(crate) fn write_record(
    state_dir: &Path,
    forward: &Forward,
    listen: String,
    to: String,
) -> std::io::Result<Record> {
    let paths = ForwardPaths::new(state_dir);
    let (kind, port) = match forward {
        Forward::Port(p) => (KIND_PORT, p.port),
        Forward::HostService(s) => (KIND_HOST_SERVICE, s.port),
    };
    let record = Record {
        version: RECORD_VERSION,
        kind: kind.into(),
        listen,
        to,
        port,
        owner: Owner::current(),
    };
    let key = forward.key();
    let aside = paths.dir.join(format!(".{key}.json.tmp"));
    std::fs::write(
        &aside,
        serde_json::to_vec(&record).map_err(std::io::Error::other)?,
    )?;
    std::fs::rename(&aside, paths.record(&key))?;
    Ok(record)
}

/// Whether the forwarder `owner` of `forward` is still the one its record
/// names: `false` once the record was removed (`stop`, the bottle's state
/// dir gone) or replaced, and the forwarder should end.
pub(crate) fn still_recorded(state_dir: &Path, forward: &Forward, owner: &Owner) -> bool {
    read_record(&ForwardPaths::new(state_dir).record(&forward.key()))
        .is_some_and(|record| record.owner == *owner)
}

/// The next connection on `listener` (taken with `accept`), or `None` once
/// the forwarder's record no longer names it: it is to stop.
pub(crate) fn next_client<L: std::os::fd::AsFd, C>(
    listener: &L,
    accept: impl Fn(&L) -> std::io::Result<C>,
    state_dir: &Path,
    forward: &Forward,
    owner: &Owner,
) -> Option<C> {
    use rustix::event::{PollFd, PollFlags, Timespec, poll};
    loop {
        if !still_recorded(state_dir, forward, owner) {
            return None;
        }
        let mut fds = [PollFd::new(listener, PollFlags::IN)];
        let timeout = Timespec::try_from(WATCH_EVERY).ok();
        if poll(&mut fds, timeout.as_ref()).unwrap_or(0) == 0 {
            continue;
        }
        match accept(listener) {
            Ok(client) => return Some(client),
            Err(err) => {
                log!("accept: {err}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

/// Tells the forwarder of `record` to end, with every connection it runs
/// (SIGTERM to its process group: it is a session leader).
fn signal(record: &Record, signal: rustix::process::Signal) {
    if !record.owner.is_alive() {
        return;
    }
    if let Some(group) = i32::try_from(record.owner.pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    {
        let _ = rustix::process::kill_process_group(group, signal);
    }
}

/// Ends every forwarder of the bottle whose state dir is `state_dir`
/// (SIGTERM, then SIGKILL to those that outlive [`END_WITHIN`]) and
/// removes their files. Returns what it ended, one line each.
pub(crate) fn end_all(state_dir: &Path) -> Vec<String> {
    let found = records(state_dir);
    for (_, record) in &found {
        signal(record, rustix::process::Signal::TERM);
    }
    let deadline = Instant::now() + END_WITHIN;
    let mut ended = Vec::new();
    for (path, record) in &found {
        if record.owner.is_alive()
            && let Some(pid) = i32::try_from(record.owner.pid)
                .ok()
                .and_then(rustix::process::Pid::from_raw)
        {
            let left = deadline.saturating_duration_since(Instant::now());
            if !crate::session::exits_within(record.owner, pid, left) {
                signal(record, rustix::process::Signal::KILL);
            }
            ended.push(format!("forwarder {} -> {}", record.listen, record.to));
        }
        let _ = std::fs::remove_file(path);
    }
    // Best effort, like the rest of a stop: logs hold no secret.
    let _ = std::fs::remove_dir_all(ForwardPaths::new(state_dir).dir);
    ended
}

/// Ends the forwarder of the port published on `host_port`; `false` when
/// there is none.
pub(crate) fn close_port(state_dir: &Path, host_port: u16) -> bool {
    let forward_key = format!("port-{host_port}");
    let path = ForwardPaths::new(state_dir).record(&forward_key);
    let Some(record) = read_record(&path).filter(|r| r.owner.is_alive()) else {
        return false;
    };
    // Its record gone, the forwarder ends within WATCH_EVERY; the signal
    // ends it at once, with its connections.
    let _ = std::fs::remove_file(&path);
    signal(&record, rustix::process::Signal::TERM);
    true
}

/// A port of `127.0.0.1` free now, for `bottle port BOTTLE PORT:0`.
pub(crate) fn free_host_port() -> std::io::Result<u16> {
    let probe = std::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0))?;
    Ok(probe.local_addr()?.port())
}

/// The state dirs under `state_root` of bottles not in `running` (the
/// names every backend lists) that still hold forwarders, for `bottle
/// cleanup` to list before it asks.
pub(crate) fn leftovers(state_root: &Path, running: &[String]) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(state_root) else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let dir = entry.path();
        let Some(slug) = dir.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        if ForwardPaths::new(&dir).dir.is_dir()
            && !running.iter().any(|name| slug::slug_of(name) == slug)
        {
            found.push(dir);
        }
    }
    found.sort();
    found
}

/// The name of the gone bottle whose state dir is `state_dir`.
fn gone_bottle_name(state_dir: &Path) -> String {
    let slug = state_dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    slug::bottle_name(&slug)
}

/// What [`leftovers`] names, for the operator.
pub(crate) fn leftover_line(state_dir: &Path) -> String {
    format!(
        "the forwarders of the gone bottle {}",
        gone_bottle_name(state_dir)
    )
}

/// Ends the forwarders in `state_dirs` (from [`leftovers`]).
pub(crate) fn cleanup(state_dirs: &[PathBuf]) -> Vec<String> {
    let mut ended = Vec::new();
    for dir in state_dirs {
        let bottle = gone_bottle_name(dir);
        ended.extend(
            end_all(dir)
                .into_iter()
                .map(|line| format!("{line} of the gone bottle {bottle}")),
        );
    }
    ended
}

/// `bottle __forward BOTTLE --publish PORT:HOST_PORT | --host-service
/// HOST:PORT`: leaves the operator's session, closes what it inherited,
/// and serves until its record goes.
pub(crate) fn run(
    global: &crate::args::Global,
    args: &crate::args::ForwardArgs,
) -> Result<ExitCode, Failure> {
    // First, so the operator's terminal closing cannot signal us; then let
    // go of whatever the spawner had open.
    let _ = rustix::process::setsid();
    let _ = crate::session::host::close_inherited_fds();
    let usage = |what: String| Failure::new("BOT-C080", EXIT_USAGE, what);
    let forward = match (&args.publish, &args.host_service) {
        (Some(spec), None) => Forward::Port(
            Published::parse(spec, false)
                .map_err(|err| usage(format!("--publish {spec:?} {}", err.problem())))?,
        ),
        (None, Some(spec)) => Forward::HostService(HostService::parse(spec).map_err(|_| {
            usage(format!(
                "--host-service {spec:?} is not HOST:PORT on loopback"
            ))
        })?),
        _ => return Err(usage("name one of --publish and --host-service".into())),
    };
    let name = slug::bottle_name(slug::slug_of(&args.bottle));
    let state_dir = crate::lookup::state_dir_of(&name)?;
    let ready = ForwardPaths::new(&state_dir).ready(&forward.key());
    match &forward {
        Forward::Port(published) => {
            port::serve(global, &name, &state_dir, &forward, *published, &ready)
        }
        Forward::HostService(service) => service::serve(&state_dir, &forward, service, &ready),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_forwarder_is_this_bottle_on_the_bottles_backend() {
        let spec = forward_spec(
            Path::new("/usr/bin/bottle"),
            BackendKind::Docker,
            "bot-bottle-demo",
            &Forward::Port(Published {
                port: 8000,
                host_port: 13000,
            }),
        );
        assert_eq!(
            spec.argv(),
            [
                "/usr/bin/bottle",
                "--backend",
                "docker",
                SUBCOMMAND,
                "bot-bottle-demo",
                "--publish",
                "8000:13000"
            ]
        );
        let service = HostService::parse("localhost:11434").unwrap();
        assert_eq!(
            Forward::HostService(service).args(),
            ["--host-service", "localhost:11434"]
        );
    }

    #[test]
    fn records_are_read_listed_and_ended() {
        let dir = tempfile::tempdir().unwrap();
        let forward = Forward::Port(Published {
            port: 8000,
            host_port: 13000,
        });
        assert!(open_ports(dir.path()).is_empty());
        std::fs::create_dir_all(ForwardPaths::new(dir.path()).dir).unwrap();
        // This test process stands in for the forwarder.
        let record = write_record(
            dir.path(),
            &forward,
            "127.0.0.1:13000".into(),
            "box:8000".into(),
        )
        .unwrap();
        assert!(still_recorded(dir.path(), &forward, &record.owner));
        assert_eq!(
            open_ports(dir.path()),
            [OpenPort {
                port: 8000,
                listen: "127.0.0.1:13000".into()
            }]
        );
        // A record of a process that is gone is not an open port.
        let gone = Record {
            owner: Owner {
                pid: u32::MAX - 1,
                start: 1,
            },
            ..record.clone()
        };
        std::fs::write(
            ForwardPaths::new(dir.path()).record("port-13001"),
            serde_json::to_vec(&gone).unwrap(),
        )
        .unwrap();
        assert_eq!(open_ports(dir.path()).len(), 1);
        // Ending removes the records (the live one is this test: its
        // record is removed without signalling it, as it is not dead yet
        // in this test's eyes; see below).
        let paths = ForwardPaths::new(dir.path());
        std::fs::remove_file(paths.record(&forward.key())).unwrap();
        assert!(!still_recorded(dir.path(), &forward, &record.owner));
        assert!(
            end_all(dir.path()).is_empty(),
            "the dead one needs no signal"
        );
        assert!(!paths.dir.exists());
    }

    #[test]
    fn cleanup_ends_only_the_forwarders_of_bottles_that_are_gone() {
        let root = tempfile::tempdir().unwrap();
        for slug in ["kept", "gone"] {
            let dir = ForwardPaths::new(&root.path().join(slug)).dir;
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("port-1.log"), "").unwrap();
        }
        let gone = leftovers(root.path(), &["bot-bottle-kept".to_string()]);
        assert_eq!(gone, [root.path().join("gone")]);
        cleanup(&gone);
        assert!(ForwardPaths::new(&root.path().join("kept")).dir.is_dir());
        assert!(!ForwardPaths::new(&root.path().join("gone")).dir.exists());
    }
}
