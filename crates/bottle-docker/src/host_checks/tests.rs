//! The docker backend's host checks against a fake daemon on a real unix
//! socket under a temp-dir host root.

use std::io::{self, Read as _, Write as _};
use std::os::unix::net::UnixListener;
use std::thread::JoinHandle;

use bottle_core::BackendKind;
use bottle_core::exec::CommandRunner;
use bottle_preflight::HostRoot;
use bottle_test_support::{RecordingRunner, wait_for};

use super::*;

/// A temp dir standing in for `/`.
struct FakeHost {
    dir: tempfile::TempDir,
}

impl FakeHost {
    fn new() -> Self {
        FakeHost {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    /// The real path of a host path under this root.
    fn path(&self, host_path: &str) -> PathBuf {
        HostRoot::new(self.dir.path()).join(host_path)
    }

    /// A context for a Linux x86_64 host under this root, with the
    /// default Docker socket.
    fn ctx<'a>(&self, runner: &'a dyn CommandRunner, backend: BackendKind) -> Context<'a> {
        Context::fixed(HostRoot::new(self.dir.path()), runner, backend)
    }
}

/// A fake Docker daemon on a real unix socket: accepts one connection per
/// response, in turn, reads its request head, then writes the response
/// and closes (or, for `None`, never answers and waits for the client to
/// hang up). After the last it stops listening: a further request is
/// refused.
struct FakeDocker {
    thread: JoinHandle<Vec<String>>,
}

const SERVER_BOUND: Duration = Duration::from_secs(10);

impl FakeDocker {
    fn serve(socket: &Path, response: Option<Vec<u8>>) -> Self {
        FakeDocker::serve_each(socket, vec![response])
    }

    fn serve_each(socket: &Path, responses: Vec<Option<Vec<u8>>>) -> Self {
        std::fs::create_dir_all(socket.parent().unwrap()).unwrap();
        let listener = UnixListener::bind(socket).unwrap();
        listener.set_nonblocking(true).unwrap();
        let thread = std::thread::spawn(move || {
            let mut requests = Vec::new();
            for response in responses {
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
                let request = String::from_utf8_lossy(&request).into_owned();
                requests.push(request.lines().next().unwrap_or_default().to_owned());
            }
            requests
        });
        FakeDocker { thread }
    }

    /// The request line of each connection, in turn.
    fn request_lines(self) -> Vec<String> {
        self.thread.join().unwrap()
    }

    /// The request line the server received.
    fn request_line(self) -> String {
        self.request_lines().remove(0)
    }
}

/// An HTTP/1.1 response with a content-length body.
fn http(status: &str, body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 {status}\r\nApi-Version: 1.41\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// The request line of a check: bollard sends `GET /version` and `GET
/// /info` unversioned, so any daemon answers them in its own API.
fn request_line(path: &str) -> String {
    format!("GET {path} HTTP/1.1")
}

/// A `/version` body as Docker 20.10 sends it.
const VERSION_20_10: &str = r#"{"Platform":{"Name":""},"Components":[{"Name":"Engine","Version":"20.10.24+dfsg1","Details":{"ApiVersion":"1.41","Arch":"amd64","MinAPIVersion":"1.12","Os":"linux"}}],"Version":"20.10.24+dfsg1","ApiVersion":"1.41","MinAPIVersion":"1.12","GitCommit":"5d6db84","GoVersion":"go1.19.8","Os":"linux","Arch":"amd64","KernelVersion":"6.18.44","BuildTime":"2026-05-07T21:09:36.000000000+00:00"}"#;

fn daemon(host: &FakeHost, backend: BackendKind) -> Check {
    let runner = RecordingRunner::refusing();
    check_daemon(&host.ctx(&runner, backend)).unwrap()
}

#[test]
fn a_reachable_daemon_passes() {
    let host = FakeHost::new();
    let socket = host.path(DEFAULT_SOCKET);
    let server = FakeDocker::serve(&socket, Some(http("200 OK", VERSION_20_10)));
    let check = daemon(&host, BackendKind::Docker);
    assert_eq!(check.status, Status::Ok, "{check:?}");
    assert_eq!(
        check.message,
        format!("docker 20.10.24+dfsg1 (api 1.41) at {}", socket.display())
    );
    assert_eq!(server.request_line(), request_line("/version"));
}

#[test]
fn a_chunked_answer_passes() {
    let host = FakeHost::new();
    let socket = host.path(DEFAULT_SOCKET);
    let (a, b) = VERSION_20_10.split_at(40);
    let response = format!(
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n{:x}\r\n{a}\r\n{:x}\r\n{b}\r\n0\r\n\r\n",
        a.len(),
        b.len()
    );
    let server = FakeDocker::serve(&socket, Some(response.into_bytes()));
    let check = daemon(&host, BackendKind::Docker);
    assert_eq!(check.status, Status::Ok, "{check:?}");
    server.request_line();
}

#[test]
fn an_old_api_warns() {
    let host = FakeHost::new();
    let socket = host.path(DEFAULT_SOCKET);
    let server = FakeDocker::serve(
        &socket,
        Some(http(
            "200 OK",
            r#"{"Version":"19.03.15","ApiVersion":"1.40"}"#,
        )),
    );
    let check = daemon(&host, BackendKind::Docker);
    assert_eq!(check.status, Status::Warn);
    assert!(
        check.message.ends_with("speaks api 1.40, older than 1.41"),
        "{}",
        check.message
    );
    assert_eq!(
        check.remediation.as_deref(),
        Some("upgrade Docker Engine to 20.10 (api 1.41) or newer")
    );
    server.request_line();
}

#[test]
fn bad_json_fails_for_every_backend() {
    for backend in [BackendKind::Docker, BackendKind::Smolmachines] {
        let host = FakeHost::new();
        let server = FakeDocker::serve(
            &host.path(DEFAULT_SOCKET),
            Some(http("200 OK", r#"{"Version":"#)),
        );
        let check = daemon(&host, backend);
        assert_eq!(check.status, Status::Fail, "{check:?}");
        assert!(
            check
                .message
                .contains("answered GET /version with unexpected json"),
            "{}",
            check.message
        );
        server.request_line();
    }
}

#[test]
fn an_answer_without_an_api_version_fails() {
    let host = FakeHost::new();
    let server = FakeDocker::serve(
        &host.path(DEFAULT_SOCKET),
        Some(http("200 OK", r#"{"Version":"24.0.7"}"#)),
    );
    let check = daemon(&host, BackendKind::Docker);
    assert_eq!(check.status, Status::Fail);
    assert!(
        check.message.ends_with("without an ApiVersion"),
        "{}",
        check.message
    );
    server.request_line();
}

#[test]
fn an_http_error_fails() {
    let host = FakeHost::new();
    let server = FakeDocker::serve(
        &host.path(DEFAULT_SOCKET),
        Some(http("500 Internal Server Error", r#"{"message":"boom"}"#)),
    );
    let check = daemon(&host, BackendKind::Docker);
    assert_eq!(check.status, Status::Fail);
    assert!(
        check
            .message
            .ends_with("answered GET /version with HTTP 500: boom"),
        "{}",
        check.message
    );
    server.request_line();
}

#[test]
fn something_else_on_the_socket_fails() {
    let host = FakeHost::new();
    let server = FakeDocker::serve(
        &host.path(DEFAULT_SOCKET),
        Some(b"SSH-2.0-OpenSSH_9.6\r\n\r\n".to_vec()),
    );
    let check = daemon(&host, BackendKind::Docker);
    assert_eq!(check.status, Status::Fail);
    assert!(
        check
            .message
            .contains("did not answer like a docker daemon: "),
        "{}",
        check.message
    );
    assert!(
        check
            .remediation
            .as_deref()
            .unwrap()
            .contains("DOCKER_HOST"),
        "{check:?}"
    );
    server.request_line();
}

#[test]
fn a_refused_connection_fails() {
    let host = FakeHost::new();
    let socket = host.path(DEFAULT_SOCKET);
    std::fs::create_dir_all(socket.parent().unwrap()).unwrap();
    // Bound then closed: the socket file stays but nothing accepts.
    drop(UnixListener::bind(&socket).unwrap());
    let check = daemon(&host, BackendKind::Docker);
    assert_eq!(check.status, Status::Fail);
    assert_eq!(
        check.message,
        format!(
            "docker daemon not reachable: nothing accepts connections on {} (the daemon is not running)",
            socket.display()
        )
    );
}

#[test]
fn an_io_error_under_the_clients_error_is_told_by_its_kind() {
    let of = |kind: io::ErrorKind| {
        AskError::of(bollard::errors::Error::IOError {
            err: io::Error::from(kind),
        })
    };
    assert!(matches!(
        of(io::ErrorKind::PermissionDenied),
        AskError::Denied
    ));
    assert!(matches!(
        of(io::ErrorKind::ConnectionRefused),
        AskError::Refused
    ));
    assert!(matches!(of(io::ErrorKind::NotFound), AskError::Missing));
    assert!(matches!(of(io::ErrorKind::TimedOut), AskError::Timeout));
    assert!(matches!(of(io::ErrorKind::BrokenPipe), AskError::Io(_)));
}

#[test]
fn a_missing_socket_fails_with_how_to_start_docker() {
    let host = FakeHost::new();
    let check = daemon(&host, BackendKind::Docker);
    assert_eq!(check.status, Status::Fail);
    assert_eq!(
        check.message,
        format!(
            "docker daemon not reachable: no socket at {}",
            host.path(DEFAULT_SOCKET).display()
        )
    );
    let fix = check.remediation.unwrap();
    assert!(
        fix.contains("`sudo apt-get install docker.io && sudo systemctl start docker`"),
        "{fix}"
    );
    assert!(fix.contains("`dockerd &`"), "{fix}");
    assert!(fix.contains("docker group"), "{fix}");

    std::fs::create_dir_all(host.path("/etc")).unwrap();
    std::fs::write(host.path("/etc/NIXOS"), "").unwrap();
    let check = daemon(&host, BackendKind::Docker);
    assert!(
        check
            .remediation
            .unwrap()
            .contains("virtualisation.docker.enable = true;")
    );
}

#[test]
fn smolmachines_needs_the_daemon_too() {
    // smolmachines runs the bundle as a container, so it needs the daemon:
    // its failure is not softened, and the rest is skipped.
    let host = FakeHost::new();
    let runner = RecordingRunner::refusing();
    let checks = DockerHostChecks.run(&host.ctx(&runner, BackendKind::Smolmachines));
    let ids: Vec<&str> = checks.iter().map(|c| c.id).collect();
    assert_eq!(ids, DockerHostChecks.ids());
    let statuses: Vec<Status> = checks.iter().map(|c| c.status).collect();
    assert_eq!(statuses, [Status::Fail, Status::Skip, Status::Skip]);
}

#[test]
fn a_reachable_daemon_is_asked_for_its_version_then_once_for_its_info() {
    // The fake answers two requests and then refuses: a second `GET
    // /info` would leave the gVisor check skipped.
    let host = FakeHost::new();
    let server = FakeDocker::serve_each(
        &host.path(DEFAULT_SOCKET),
        vec![
            Some(http("200 OK", VERSION_20_10)),
            Some(http("200 OK", INFO_RUNSC)),
        ],
    );
    let runner = RecordingRunner::printing("runsc version release-20261116.0\n");
    let checks = DockerHostChecks.run(&host.ctx(&runner, BackendKind::Docker));
    let statuses: Vec<Status> = checks.iter().map(|c| c.status).collect();
    // No storage driver in that answer: taken as unable to cap.
    assert_eq!(
        statuses,
        [Status::Ok, Status::Warn, Status::Ok],
        "{checks:#?}"
    );
    assert_eq!(
        server.request_lines(),
        [request_line("/version"), request_line("/info")]
    );
}

#[test]
fn a_silent_daemon_times_out() {
    let host = FakeHost::new();
    let server = FakeDocker::serve(&host.path(DEFAULT_SOCKET), None);
    let runner = RecordingRunner::refusing();
    let mut ctx = host.ctx(&runner, BackendKind::Docker);
    ctx.docker_timeout = Duration::from_millis(200);
    let check = check_daemon(&ctx).unwrap();
    assert_eq!(check.status, Status::Fail);
    assert!(
        check.message.ends_with("did not answer within 200ms"),
        "{}",
        check.message
    );
    assert_eq!(server.request_line(), request_line("/version"));
}

#[test]
fn docker_host_is_followed_to_a_unix_socket_and_nowhere_else() {
    let host = FakeHost::new();
    let server = FakeDocker::serve(
        &host.path("/run/user/1000/docker.sock"),
        Some(http("200 OK", VERSION_20_10)),
    );
    let runner = RecordingRunner::refusing();
    let mut ctx = host.ctx(&runner, BackendKind::Docker);
    ctx.docker_host = Some("unix:///run/user/1000/docker.sock".into());
    let check = check_daemon(&ctx).unwrap();
    assert_eq!(check.status, Status::Ok, "{check:?}");
    assert!(check.message.ends_with("/run/user/1000/docker.sock"));
    server.request_line();

    ctx.docker_host = Some("tcp://192.0.2.10:2375".into());
    let check = check_daemon(&ctx).unwrap();
    assert_eq!(check.status, Status::Warn);
    assert_eq!(
        check.message,
        "DOCKER_HOST=tcp://192.0.2.10:2375 is not a unix socket, so it was not probed"
    );
}

#[test]
fn endpoints() {
    assert_eq!(endpoint(None), Endpoint::Unix(DEFAULT_SOCKET.into()));
    assert_eq!(endpoint(Some("")), Endpoint::Unix(DEFAULT_SOCKET.into()));
    assert_eq!(
        endpoint(Some("unix:///run/user/1000/docker.sock")),
        Endpoint::Unix("/run/user/1000/docker.sock".into())
    );
    assert_eq!(
        endpoint(Some("tcp://127.0.0.1:2375")),
        Endpoint::Other("tcp://127.0.0.1:2375".into())
    );
}

/// `GET /info` as Docker 28 on overlay2 over ext4 sends it, cut to the
/// storage fields and their neighbours.
const INFO_OVERLAY2_EXT4: &str = r#"{"ID":"x","Containers":3,"Driver":"overlay2","DriverStatus":[["Backing Filesystem","extfs"],["Supports d_type","true"],["Using metacopy","false"],["Native Overlay Diff","true"],["userxattr","false"]],"DockerRootDir":"/var/lib/docker","Architecture":"x86_64"}"#;

fn disk_quota_with(answer: &str) -> Check {
    let host = FakeHost::new();
    let server = FakeDocker::serve(&host.path(DEFAULT_SOCKET), Some(http("200 OK", answer)));
    let runner = RecordingRunner::refusing();
    let check = check_disk_quota(&daemon_info(&host.ctx(&runner, BackendKind::Docker)));
    assert_eq!(server.request_line(), request_line("/info"));
    check
}

#[test]
fn overlay2_on_ext4_warns_that_an_agent_can_fill_the_disk() {
    let check = disk_quota_with(INFO_OVERLAY2_EXT4);
    assert_eq!(check.id, "docker.disk_quota");
    assert_eq!(check.status, Status::Warn, "{check:?}");
    assert_eq!(
        check.message,
        "overlay2 on extfs cannot limit a container's writable layer: an agent can fill the disk \
         holding /var/lib/docker, and a bottle that sets limits.disk is refused"
    );
    assert!(
        check
            .remediation
            .as_deref()
            .unwrap()
            .contains("xfs mounted with pquota"),
        "{check:?}"
    );
}

#[test]
fn storage_that_can_cap_passes() {
    let xfs = disk_quota_with(&INFO_OVERLAY2_EXT4.replace("extfs", "xfs"));
    assert_eq!(xfs.status, Status::Ok, "{xfs:?}");
    assert!(xfs.message.starts_with("overlay2 on xfs caps"), "{xfs:?}");
    assert!(xfs.message.contains("pquota"), "{xfs:?}");
    let btrfs = disk_quota_with(
        r#"{"Driver":"btrfs","DriverStatus":[["Btrfs",""]],"DockerRootDir":"/srv/docker"}"#,
    );
    assert_eq!(btrfs.status, Status::Ok, "{btrfs:?}");
    assert!(btrfs.message.starts_with("btrfs caps"), "{btrfs:?}");
}

#[test]
fn an_unreachable_daemon_skips_the_storage_and_gvisor_checks() {
    let host = FakeHost::new();
    let runner = RecordingRunner::refusing();
    let ctx = host.ctx(&runner, BackendKind::Docker);
    let info = daemon_info(&ctx);
    for check in [check_disk_quota(&info), check_gvisor(&ctx, &info)] {
        assert_eq!(check.status, Status::Skip, "{check:?}");
        assert!(check.message.starts_with("not checked: "), "{check:?}");
    }
}

/// `GET /info`'s runtimes as Docker 20.10 reports them with Debian's runsc
/// registered the way `.ci/setup` does.
const INFO_RUNSC: &str = r#"{"ID":"x","Runtimes":{"io.containerd.runc.v2":{"path":"runc"},"runc":{"path":"runc"},"runsc":{"path":"/usr/bin/runsc","runtimeArgs":["--platform=ptrace","--network=host","--file-access=shared","--overlay2=none","--oci-seccomp"]}},"DefaultRuntime":"runc"}"#;

fn gvisor_with(answer: &str, runner: &RecordingRunner) -> (Check, Vec<Vec<String>>) {
    let host = FakeHost::new();
    let server = FakeDocker::serve(&host.path(DEFAULT_SOCKET), Some(http("200 OK", answer)));
    let ctx = host.ctx(runner, BackendKind::Docker);
    let check = check_gvisor(&ctx, &daemon_info(&ctx));
    assert_eq!(server.request_line(), request_line("/info"));
    (check, runner.calls())
}

#[test]
fn debians_runsc_is_reported_with_its_platform_and_known_gaps() {
    let runner = RecordingRunner::printing("runsc version 0.0~20221219.0\nspec: 1.0.2-dev\n");
    let (check, calls) = gvisor_with(INFO_RUNSC, &runner);
    assert_eq!(calls, [["/usr/bin/runsc", "--version"]]);
    assert_eq!(check.status, Status::Warn, "{check:?}");
    for part in [
        "runsc 0.0~20221219.0 at /usr/bin/runsc",
        "platform ptrace, network host, file access shared",
        "systrap",
        "AT_NO_AUTOMOUNT",
        "google/gvisor#10704",
        "SO_RCVTIMEO",
    ] {
        assert!(check.message.contains(part), "{part}: {}", check.message);
    }
    assert!(check.remediation.unwrap().contains("gvisor.dev"));
}

#[test]
fn a_current_gvisor_build_passes() {
    let runner = RecordingRunner::printing("runsc version release-20261116.0\n");
    let (check, _) = gvisor_with(INFO_RUNSC, &runner);
    assert_eq!(check.status, Status::Ok, "{check:?}");
    assert_eq!(
        check.message,
        "`runsc`: runsc release-20261116.0 at /usr/bin/runsc (platform ptrace, network host, file access shared)"
    );
}

#[test]
fn no_gvisor_runtime_and_an_unfit_one_warn_with_the_fix() {
    let runner = RecordingRunner::refusing();
    let (check, calls) = gvisor_with(r#"{"Runtimes":{"runc":{"path":"runc"}}}"#, &runner);
    assert!(calls.is_empty(), "nothing is run without a runtime");
    assert_eq!(check.status, Status::Warn);
    assert!(
        check.message.contains("no `runsc` runtime (it has: runc)"),
        "{}",
        check.message
    );
    let fix = check.remediation.unwrap();
    for step in ["apt-get install runsc", "daemon.json", "kill -HUP"] {
        assert!(fix.contains(step), "{fix}");
    }

    let (check, _) = gvisor_with(
        r#"{"Runtimes":{"runsc":{"path":"/usr/bin/runsc","runtimeArgs":["--network=host"]}}}"#,
        &RecordingRunner::refusing(),
    );
    assert_eq!(check.status, Status::Warn);
    assert!(check.message.contains("--file-access"), "{}", check.message);
    assert!(check.message.contains("BOT-D091"), "{}", check.message);
}

#[test]
fn a_runtime_binary_that_is_not_runsc_warns() {
    let runner = RecordingRunner::printing("runc version 1.1.5\n");
    let (check, _) = gvisor_with(INFO_RUNSC, &runner);
    assert_eq!(check.status, Status::Warn);
    assert!(
        check.message.contains("may not be gVisor"),
        "{}",
        check.message
    );
}

#[test]
fn this_hosts_daemon_answers_where_ci_requires_it() {
    let runner = bottle_core::exec::SystemRunner;
    let checks = DockerHostChecks.run(&Context::from_host(&runner, BackendKind::Docker));
    println!("{}", bottle_preflight::Report::new(&checks));
    for check in &checks {
        assert!(
            !check.message.starts_with("check could not run"),
            "{check:#?}"
        );
    }
    if bottle_test_support::docker_required() {
        assert_eq!(checks[0].status, Status::Ok, "{checks:#?}");
        assert_ne!(checks[1].status, Status::Skip, "{checks:#?}");
    }
}
