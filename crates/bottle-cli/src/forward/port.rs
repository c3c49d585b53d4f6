//! A published port's forwarder: listens on the host's `127.0.0.1` only,
//! and relays each connection through its own run of the in-box agent's
//! relay (`Bottle::connect_port`) to the port on the box's loopback.
//!
//! Every connection is audited in the bottle's audit log (`port` lines):
//! `OPEN` when the box's port answered, `CLOSE` with its bytes each way,
//! or `refused` when nothing in the box listens; the forwarder's own log
//! (`forwards/port-<host port>.log`) says why a connection went nowhere.

use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use bottle_core::audit_files::{AUDIT_LOG_DIR, AUDIT_LOG_FILE};
use bottle_core::manifest::Published;
use bottle_core::port_relay::{RelayStatus, read_status};
use bottle_core::sandbox::ToolboxStream;
use bottle_core::sandbox::audit::{SandboxRecord, append};

use super::{Forward, IDLE, MAX_CONNECTIONS};
use crate::failure::{EXIT_BACKEND, Failure};

/// The audit reason of a connection the box's port answered.
const PUBLISHED: &str = "published_port";
/// The audit reason of a connection nothing in the box listened for.
const NOTHING_LISTENS: &str = "nothing_listens";

/// Listens for `published` and relays its connections into bottle `name`
/// until the forwarder's record is removed.
pub(crate) fn serve(
    global: &crate::args::Global,
    name: &str,
    state_dir: &Path,
    forward: &Forward,
    published: Published,
    ready: &Path,
) -> Result<ExitCode, Failure> {
    let bottle = crate::lookup::find_bottle(global, name)?;
    let port = published.port;
    // The relay must work before the port is offered: one connection now
    // says whether the in-box agent relays, and whether anything listens.
    match bottle
        .connect_port(port)
        .map_err(Failure::from)
        .and_then(|mut stream| {
            read_status(&mut *stream.from_agent).map_err(|err| no_relay(name, &err.to_string()))
        })? {
        RelayStatus::Connected => {}
        RelayStatus::Refused(why) => log!("nothing answers in {name} yet: {why}"),
        RelayStatus::NoRelay(said) => return Err(no_relay(name, &said)),
    }
    let listener = TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, published.host_port)))
        .map_err(|err| {
            Failure::new(
                "BOT-C082",
                EXIT_BACKEND,
                format!("cannot listen on 127.0.0.1:{}: {err}", published.host_port),
            )
            .with_fix("pick a free host port: `bottle port BOTTLE PORT:HOST_PORT` (0 picks one)")
        })?;
    let listen = format!("127.0.0.1:{}", published.host_port);
    let record = super::write_record(state_dir, forward, listen.clone(), format!("box:{port}"))
        .map_err(|err| {
            Failure::new(
                "BOT-C082",
                EXIT_BACKEND,
                format!("cannot record the forwarder of {listen}: {err}"),
            )
        })?;
    crate::session::signal_ready_at(ready);
    log!("forwarding {listen} to port {port} of {name}");
    let audit = state_dir.join(AUDIT_LOG_DIR).join(AUDIT_LOG_FILE);
    let active = Arc::new(AtomicUsize::new(0));
    while let Some(client) = super::next_client(
        &listener,
        |l: &TcpListener| {
            let (client, _) = l.accept()?;
            let _ = client.set_nodelay(true);
            Ok(client)
        },
        state_dir,
        forward,
        &record.owner,
    ) {
        if active.load(Ordering::SeqCst) >= MAX_CONNECTIONS {
            log!("{listen}: {MAX_CONNECTIONS} connections already; closing one more");
            continue;
        }
        let stream = match bottle.connect_port(port) {
            Ok(stream) => stream,
            Err(err) => {
                log!("{listen}: could not start the relay into {name}: {err}");
                continue;
            }
        };
        active.fetch_add(1, Ordering::SeqCst);
        let connection = Connection {
            bottle: name.to_string(),
            audit: audit.clone(),
            published,
            active: Arc::clone(&active),
        };
        std::thread::spawn(move || connection.relay(client, stream));
    }
    log!("the record of {listen} is gone: stopping");
    Ok(ExitCode::SUCCESS)
}

fn no_relay(name: &str, said: &str) -> Failure {
    Failure::new(
        "BOT-C083",
        EXIT_BACKEND,
        format!(
            "the in-box agent of {name} did not relay ({})",
            if said.is_empty() {
                "it said nothing".to_string()
            } else {
                bottle_core::display::escape_for_terminal(said).into_owned()
            }
        ),
    )
    .with_fix(
        "a published port needs the in-box agent at /.bottle/toolbox: install `bottle-toolbox` where bottle finds it (`cargo xtask install`, or BOTTLE_TOOLBOX_BIN), then start a new bottle",
    )
}

/// One accepted connection and where it goes.
struct Connection {
    bottle: String,
    audit: PathBuf,
    published: Published,
    active: Arc<AtomicUsize>,
}

impl Connection {
    fn line(&self, method: &'static str, reason: &str, bytes: (u64, u64), started: Instant) {
        let record = SandboxRecord::published_port(
            &self.bottle,
            method,
            self.published.host_port,
            self.published.port,
            reason,
            bytes,
            started.elapsed(),
        );
        if let Err(err) = append(&self.audit, &record) {
            log!("cannot write the audit log {}: {err}", self.audit.display());
        }
    }

    fn relay(self, client: TcpStream, stream: ToolboxStream) {
        let started = Instant::now();
        let ToolboxStream {
            to_agent,
            mut from_agent,
        } = stream;
        let port = self.published.port;
        match read_status(&mut *from_agent) {
            Ok(RelayStatus::Connected) => {
                self.line("OPEN", PUBLISHED, (0, 0), started);
                let bytes = super::pipe::splice(client, to_agent, from_agent, IDLE);
                self.line("CLOSE", PUBLISHED, bytes, started);
            }
            Ok(RelayStatus::Refused(why)) => {
                log!("a connection to port {port} went nowhere: {why}");
                self.line("OPEN", NOTHING_LISTENS, (0, 0), started);
            }
            Ok(RelayStatus::NoRelay(said)) => {
                log!("the in-box relay to port {port} did not start: {said:?}");
            }
            Err(err) => log!("the in-box relay to port {port} broke: {err}"),
        }
        // The client is closed with it.
        self.active.fetch_sub(1, Ordering::SeqCst);
    }
}
