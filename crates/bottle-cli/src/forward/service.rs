//! A host service's forwarder: serves the unix socket the bundle's relay
//! connects to (`<state_dir>/host-services/<port>.sock`, mounted into the
//! bundle alone, read-only) and dials each connection to exactly the
//! service's port on the host's loopback, nothing else. The bundle audits
//! every connection; this side keeps a log of what could not be reached.

use std::net::{SocketAddr, TcpStream, ToSocketAddrs as _};
use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bottle_core::bundle::{host_service_socket, host_services_dir};
use bottle_core::manifest::HostService;
use bottle_core::manifest::endpoint::is_loopback_host;

use super::pipe::SendHalf;
use super::{Forward, IDLE, MAX_CONNECTIONS};
use crate::failure::{EXIT_BACKEND, Failure};

/// How long a dial of the host service may take.
const DIAL_WITHIN: Duration = Duration::from_secs(5);

/// Serves `service`'s socket for the bottle whose state dir is
/// `state_dir`, until the forwarder's record is removed.
pub(crate) fn serve(
    state_dir: &Path,
    forward: &Forward,
    service: &HostService,
    ready: &Path,
) -> Result<ExitCode, Failure> {
    let failed = |what: String| {
        Failure::new("BOT-C082", EXIT_BACKEND, what).with_fix(
            "the bottle's launch makes host-services/ in its state dir; start the bottle again",
        )
    };
    let dir = host_services_dir(state_dir);
    // A socket's path is bounded (108 bytes): bound from inside its
    // directory, by its bare name.
    std::env::set_current_dir(&dir)
        .map_err(|err| failed(format!("cannot enter {}: {err}", dir.display())))?;
    let name = host_service_socket(service.port);
    let _ = std::fs::remove_file(&name);
    let listener = UnixListener::bind(&name)
        .map_err(|err| failed(format!("cannot listen on {}/{name}: {err}", dir.display())))?;
    std::fs::set_permissions(&name, std::fs::Permissions::from_mode(0o600))
        .map_err(|err| failed(format!("cannot make {name} owner-only: {err}")))?;
    let socket = dir.join(&name).display().to_string();
    let record = super::write_record(state_dir, forward, socket.clone(), service.address())
        .map_err(|err| failed(format!("cannot record the forwarder of {socket}: {err}")))?;
    crate::session::signal_ready_at(ready);
    log!("forwarding {socket} to {}", service.address());
    let active = Arc::new(AtomicUsize::new(0));
    while let Some(client) = super::next_client(
        &listener,
        |l: &UnixListener| l.accept().map(|(client, _)| client),
        state_dir,
        forward,
        &record.owner,
    ) {
        if active.load(Ordering::SeqCst) >= MAX_CONNECTIONS {
            log!("{MAX_CONNECTIONS} connections already; closing one more");
            continue;
        }
        active.fetch_add(1, Ordering::SeqCst);
        let (service, active) = (service.clone(), Arc::clone(&active));
        std::thread::spawn(move || {
            match dial(&service) {
                Ok(upstream) => match upstream.try_clone() {
                    Ok(sending) => {
                        let _ = super::pipe::splice(
                            client,
                            Box::new(SendHalf(sending)),
                            Box::new(upstream),
                            IDLE,
                        );
                    }
                    Err(err) => log!("{}: {err}", service.address()),
                },
                Err(err) => log!("{} does not answer: {err}", service.address()),
            }
            active.fetch_sub(1, Ordering::SeqCst);
        });
    }
    let _ = std::fs::remove_file(&name);
    log!("the record of {socket} is gone: stopping");
    Ok(ExitCode::SUCCESS)
}

/// Connects to the service on the host's loopback, and nowhere else: a
/// name (`localhost`) counts only for its loopback addresses.
fn dial(service: &HostService) -> std::io::Result<TcpStream> {
    let addrs: Vec<SocketAddr> = (service.host.as_str(), service.port)
        .to_socket_addrs()?
        .filter(|addr| is_loopback_host(&addr.ip().to_string()))
        .collect();
    let mut last = std::io::Error::other(format!("{} has no loopback address", service.host));
    for addr in addrs {
        match TcpStream::connect_timeout(&addr, DIAL_WITHIN) {
            Ok(stream) => {
                let _ = stream.set_nodelay(true);
                let _ = stream.set_read_timeout(Some(Duration::from_secs(15)));
                return Ok(stream);
            }
            Err(err) => last = err,
        }
    }
    Err(last)
}
