//! The Docker check against a fake daemon on a real unix socket.

use std::os::unix::net::UnixListener;
use std::time::Duration;

use bottle_core::BackendKind;
use bottle_preflight::docker::{INFO_REQUEST, VERSION_REQUEST, check_disk_quota, check_docker};
use bottle_preflight::{Check, Status};

use bottle_test_support::RecordingRunner;

use crate::support::{FakeDocker, FakeHost, http};

/// A `/version` body as Docker 20.10 sends it.
const VERSION_20_10: &str = r#"{"Platform":{"Name":""},"Components":[{"Name":"Engine","Version":"20.10.24+dfsg1","Details":{"ApiVersion":"1.41","Arch":"amd64","MinAPIVersion":"1.12","Os":"linux"}}],"Version":"20.10.24+dfsg1","ApiVersion":"1.41","MinAPIVersion":"1.12","GitCommit":"5d6db84","GoVersion":"go1.19.8","Os":"linux","Arch":"amd64","KernelVersion":"6.18.44","BuildTime":"2026-05-07T21:09:36.000000000+00:00"}"#;

fn check(host: &FakeHost, backend: BackendKind) -> Check {
    let runner = RecordingRunner::refusing();
    check_docker(&host.ctx(&runner, backend)).unwrap()
}

#[test]
fn reachable_daemon_passes_and_gets_the_exact_request() {
    let host = FakeHost::new();
    let socket = host.path("/var/run/docker.sock");
    let server = FakeDocker::serve(&socket, Some(http("200 OK", VERSION_20_10)));
    let check = check(&host, BackendKind::Docker);
    assert_eq!(check.status, Status::Ok, "{check:?}");
    assert_eq!(
        check.message,
        format!("docker 20.10.24+dfsg1 (api 1.41) at {}", socket.display())
    );
    assert_eq!(server.request(), VERSION_REQUEST);
}

#[test]
fn chunked_answer_passes() {
    let host = FakeHost::new();
    let socket = host.path("/var/run/docker.sock");
    let (a, b) = VERSION_20_10.split_at(40);
    let response = format!(
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{a}\r\n{:x}\r\n{b}\r\n0\r\n\r\n",
        a.len(),
        b.len()
    );
    let server = FakeDocker::serve(&socket, Some(response.into_bytes()));
    assert_eq!(check(&host, BackendKind::Docker).status, Status::Ok);
    server.request();
}

#[test]
fn old_api_warns() {
    let host = FakeHost::new();
    let socket = host.path("/var/run/docker.sock");
    let server = FakeDocker::serve(
        &socket,
        Some(http(
            "200 OK",
            r#"{"Version":"19.03.15","ApiVersion":"1.40"}"#,
        )),
    );
    let check = check(&host, BackendKind::Docker);
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
    server.request();
}

#[test]
fn bad_json_fails_for_every_backend() {
    for (backend, status) in [
        (BackendKind::Docker, Status::Fail),
        (BackendKind::Smolmachines, Status::Fail),
    ] {
        let host = FakeHost::new();
        let socket = host.path("/var/run/docker.sock");
        let server = FakeDocker::serve(&socket, Some(http("200 OK", r#"{"Version":"#)));
        let check = check(&host, backend);
        assert_eq!(check.status, status, "{check:?}");
        assert!(
            check
                .message
                .contains("answered GET /version with unexpected json"),
            "{}",
            check.message
        );
        server.request();
    }
}

#[test]
fn json_without_api_version_fails() {
    let host = FakeHost::new();
    let socket = host.path("/var/run/docker.sock");
    let server = FakeDocker::serve(&socket, Some(http("200 OK", r#"{"Version":"24.0.7"}"#)));
    let check = check(&host, BackendKind::Docker);
    assert_eq!(check.status, Status::Fail);
    assert!(
        check.message.contains("missing field `ApiVersion`"),
        "{}",
        check.message
    );
    server.request();
}

#[test]
fn http_error_fails() {
    let host = FakeHost::new();
    let socket = host.path("/var/run/docker.sock");
    let server = FakeDocker::serve(
        &socket,
        Some(http("500 Internal Server Error", r#"{"message":"boom"}"#)),
    );
    let check = check(&host, BackendKind::Docker);
    assert_eq!(check.status, Status::Fail);
    assert!(
        check
            .message
            .ends_with(r#"answered GET /version with HTTP 500: {"message":"boom"}"#),
        "{}",
        check.message
    );
    server.request();
}

#[test]
fn something_else_on_the_socket_fails() {
    let host = FakeHost::new();
    let socket = host.path("/var/run/docker.sock");
    let server = FakeDocker::serve(&socket, Some(b"SSH-2.0-OpenSSH_9.6\r\n\r\n".to_vec()));
    let check = check(&host, BackendKind::Docker);
    assert_eq!(check.status, Status::Fail);
    assert!(
        check
            .message
            .contains("did not answer like a docker daemon: not an HTTP response"),
        "{}",
        check.message
    );
    server.request();
}

#[test]
fn refused_connection_fails() {
    let host = FakeHost::new();
    let socket = host.path("/var/run/docker.sock");
    std::fs::create_dir_all(socket.parent().unwrap()).unwrap();
    // Bound then closed: the socket file stays but nothing accepts.
    drop(UnixListener::bind(&socket).unwrap());
    let check = check(&host, BackendKind::Docker);
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
fn missing_socket_fails_with_how_to_start_docker() {
    let host = FakeHost::new();
    let check = check(&host, BackendKind::Docker);
    assert_eq!(check.status, Status::Fail);
    assert_eq!(
        check.message,
        format!(
            "docker daemon not reachable: no socket at {}",
            host.path("/var/run/docker.sock").display()
        )
    );
    let fix = check.remediation.unwrap();
    assert!(
        fix.contains("`sudo apt-get install docker.io && sudo systemctl start docker`"),
        "{fix}"
    );
    assert!(fix.contains("`dockerd &`"), "{fix}");
    assert!(fix.contains("docker group"), "{fix}");
}

#[test]
fn missing_socket_on_nixos_suggests_configuration() {
    let host = FakeHost::new();
    host.write("/etc/NIXOS", "");
    let check = check(&host, BackendKind::Docker);
    assert!(
        check
            .remediation
            .unwrap()
            .contains("virtualisation.docker.enable = true;")
    );
}

#[test]
fn missing_socket_fails_for_smolmachines_too() {
    // smolmachines runs the bundle as a container, so it needs the daemon.
    let host = FakeHost::new();
    let check = check(&host, BackendKind::Smolmachines);
    assert_eq!(check.status, Status::Fail);
    assert!(!check.message.contains("only the docker backend"));
}

#[test]
fn silent_daemon_times_out() {
    let host = FakeHost::new();
    let socket = host.path("/var/run/docker.sock");
    let server = FakeDocker::serve(&socket, None);
    let runner = RecordingRunner::refusing();
    let mut ctx = host.ctx(&runner, BackendKind::Docker);
    ctx.docker_timeout = Duration::from_millis(200);
    let check = check_docker(&ctx).unwrap();
    assert_eq!(check.status, Status::Fail);
    assert!(
        check.message.ends_with("did not answer within 200ms"),
        "{}",
        check.message
    );
    assert_eq!(server.request(), VERSION_REQUEST);
}

#[test]
fn docker_host_unix_socket_is_used() {
    let host = FakeHost::new();
    let socket = host.path("/run/user/1000/docker.sock");
    let server = FakeDocker::serve(&socket, Some(http("200 OK", VERSION_20_10)));
    let runner = RecordingRunner::refusing();
    let mut ctx = host.ctx(&runner, BackendKind::Docker);
    ctx.docker_host = Some("unix:///run/user/1000/docker.sock".into());
    let check = check_docker(&ctx).unwrap();
    assert_eq!(check.status, Status::Ok, "{check:?}");
    assert!(check.message.ends_with("/run/user/1000/docker.sock"));
    server.request();
}

#[test]
fn docker_host_tcp_is_not_probed() {
    let host = FakeHost::new();
    let runner = RecordingRunner::refusing();
    let mut ctx = host.ctx(&runner, BackendKind::Docker);
    ctx.docker_host = Some("tcp://192.0.2.10:2375".into());
    let check = check_docker(&ctx).unwrap();
    assert_eq!(check.status, Status::Warn);
    assert_eq!(
        check.message,
        "DOCKER_HOST=tcp://192.0.2.10:2375 is not a unix socket, so it was not probed"
    );
}

/// `GET /info` as Docker 28 on overlay2 over ext4 sends it, cut to the
/// storage fields and their neighbours.
const INFO_OVERLAY2_EXT4: &str = r#"{"ID":"x","Containers":3,"Driver":"overlay2","DriverStatus":[["Backing Filesystem","extfs"],["Supports d_type","true"],["Using metacopy","false"],["Native Overlay Diff","true"],["userxattr","false"]],"DockerRootDir":"/var/lib/docker","Architecture":"x86_64"}"#;

fn disk_quota_with(info: &str) -> Check {
    let host = FakeHost::new();
    let socket = host.path("/var/run/docker.sock");
    let server = FakeDocker::serve(&socket, Some(http("200 OK", info)));
    let runner = RecordingRunner::refusing();
    let check = check_disk_quota(&host.ctx(&runner, BackendKind::Docker));
    assert_eq!(server.request(), INFO_REQUEST);
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
fn an_unreachable_daemon_skips_the_storage_check() {
    let host = FakeHost::new();
    let runner = RecordingRunner::refusing();
    let check = check_disk_quota(&host.ctx(&runner, BackendKind::Docker));
    assert_eq!(check.status, Status::Skip, "{check:?}");
    assert!(check.message.starts_with("not checked: "), "{check:?}");
}
