//! Shared fixtures: a fake host root and a fake Docker daemon on a real
//! unix socket. The recording command runner is bottle-test-support's.

use std::io::{self, Read as _, Write as _};
use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::Duration;

use bottle_core::BackendKind;
use bottle_core::exec::CommandRunner;
use bottle_preflight::{Check, Context, HostRoot, Identity};
use bottle_test_support::wait_for;

/// A temp dir standing in for `/`.
pub(crate) struct FakeHost {
    pub dir: tempfile::TempDir,
}

impl FakeHost {
    pub(crate) fn new() -> Self {
        FakeHost {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    pub(crate) fn root(&self) -> HostRoot {
        HostRoot::new(self.dir.path())
    }

    /// The real path of a host path under this root.
    pub(crate) fn path(&self, host_path: &str) -> PathBuf {
        self.root().join(host_path)
    }

    /// Writes a file (creating parents) and returns its real path.
    pub(crate) fn write(&self, host_path: &str, contents: &str) -> PathBuf {
        let path = self.path(host_path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, contents).unwrap();
        path
    }

    pub(crate) fn mkdir(&self, host_path: &str) -> PathBuf {
        let path = self.path(host_path);
        std::fs::create_dir_all(&path).unwrap();
        path
    }

    pub(crate) fn chmod(&self, host_path: &str, mode: u32) {
        std::fs::set_permissions(self.path(host_path), std::fs::Permissions::from_mode(mode))
            .unwrap();
    }

    /// A context for a Linux x86_64 host under this root, with no `PATH` and
    /// the default Docker socket.
    pub(crate) fn ctx<'a>(
        &self,
        runner: &'a dyn CommandRunner,
        backend: BackendKind,
    ) -> Context<'a> {
        Context {
            root: self.root(),
            runner,
            backend,
            os: "linux".into(),
            arch: "x86_64".into(),
            path: None,
            docker_host: None,
            identity: Identity {
                uid: 1000,
                gid: 1000,
                groups: vec![1000],
            },
            docker_timeout: Duration::from_secs(2),
            bundle_bin: None,
            toolbox_bin: None,
            exe: None,
            gvisor_runtime: None,
        }
    }
}

/// A fake Docker daemon: accepts one connection on a real unix socket,
/// reads the request head, then writes `response` (or, with `None`, never
/// answers and waits for the client to hang up).
pub(crate) struct FakeDocker {
    thread: JoinHandle<Vec<u8>>,
}

const SERVER_BOUND: Duration = Duration::from_secs(10);

impl FakeDocker {
    pub(crate) fn serve(socket: &Path, response: Option<Vec<u8>>) -> Self {
        std::fs::create_dir_all(socket.parent().unwrap()).unwrap();
        let listener = UnixListener::bind(socket).unwrap();
        listener.set_nonblocking(true).unwrap();
        let thread = std::thread::spawn(move || {
            let mut stream = wait_for("a client to connect", SERVER_BOUND, || {
                match listener.accept() {
                    Ok((stream, _)) => Some(stream),
                    Err(err) if err.kind() == io::ErrorKind::WouldBlock => None,
                    Err(err) => panic!("accept: {err}"),
                }
            });
            stream.set_nonblocking(false).unwrap();
            stream.set_read_timeout(Some(SERVER_BOUND)).unwrap();
            let mut request = Vec::new();
            let mut byte = [0u8; 1];
            while !request.ends_with(b"\r\n\r\n") {
                match stream.read(&mut byte).unwrap() {
                    0 => break,
                    _ => request.push(byte[0]),
                }
            }
            match response {
                Some(response) => stream.write_all(&response).unwrap(),
                None => {
                    // Say nothing; the client gives up and hangs up.
                    let mut rest = Vec::new();
                    let _ = stream.read_to_end(&mut rest);
                }
            }
            request
        });
        FakeDocker { thread }
    }

    /// The request bytes the server received.
    pub(crate) fn request(self) -> Vec<u8> {
        self.thread.join().unwrap()
    }
}

/// An HTTP/1.1 response with a content-length body.
pub(crate) fn http(status: &str, body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 {status}\r\nApi-Version: 1.41\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// The check with `id`.
pub(crate) fn find<'a>(checks: &'a [Check], id: &str) -> &'a Check {
    checks
        .iter()
        .find(|check| check.id == id)
        .unwrap_or_else(|| panic!("no check {id} in {checks:#?}"))
}

pub(crate) fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}
