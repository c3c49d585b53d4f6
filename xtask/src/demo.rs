//! `cargo xtask demo`: bring up the example bottle and show its policy at
//! work — an allowed request succeeding, a denied one refused, a direct
//! connection going nowhere — then tear everything down.
//!
//! "The internet" is a TEST-NET address (203.0.113.80) on a dummy (or empty
//! bridge) interface this command creates, so the demo sends nothing off this machine.

use std::io::{Read as _, Write as _};
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context as _, bail};

use crate::dist;
use crate::process::{capture, cargo, command, describe_exit, watch, workspace_root};

/// The dummy interface that stands in for the internet.
const IFACE: &str = "btldemo0";
/// The demo upstream's address (TEST-NET-3, outside the 192.0.2.0/24 some hosts put eth0 in), pinned in examples/bottle.toml.
const UPSTREAM: &str = "203.0.113.80";
/// What the upstream answers.
const GREETING: &str = "hello from demo.bottle.test, the one host this bottle may reach\n";
/// The example agent's build context (`examples/bottle.toml`'s
/// `build.context`), under the workspace root.
pub(crate) const EXAMPLE_CONTEXT: &str = "examples/demo-agent";
/// Where Debian's `busybox-static` (which `.ci/setup` installs) puts it.
pub(crate) const HOST_BUSYBOX: &str = "/bin/busybox";

/// Copies the host's static busybox into the example's build context as
/// `busybox`, the one file its Dockerfile copies that is not committed (a
/// 2 MB binary). README's set-up (`cargo xtask install`), `cargo xtask
/// test` and the demo call it, so `bottle start demo` in `examples/` works
/// as written. Refuses a busybox that is not static: the image has no
/// dynamic loader to run it with.
pub(crate) fn complete_example_context(context: &Path, busybox: &Path) -> anyhow::Result<PathBuf> {
    let bytes = std::fs::read(busybox).with_context(|| {
        format!(
            "could not read {}; install it with `apt-get install busybox-static` (or run .ci/setup)",
            busybox.display()
        )
    })?;
    if bottle_core::bundle_binary::elf_needs_interpreter(&bytes) != Some(false) {
        bail!(
            "{} is not a static executable; install Debian's busybox-static",
            busybox.display()
        );
    }
    let target = context.join("busybox");
    std::fs::write(&target, &bytes)
        .with_context(|| format!("could not write {}", target.display()))?;
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o755))
        .with_context(|| format!("could not make {} executable", target.display()))?;
    Ok(target)
}

/// Removes the dummy interface however the demo ends.
struct Interface;

impl Interface {
    fn create() -> anyhow::Result<Interface> {
        let _ = capture(&command("ip").args(["link", "del", IFACE]));
        // An empty bridge stands in on kernels built without the dummy
        // driver: no ports either, and its addresses are just as local.
        if sh("ip", &["link", "add", IFACE, "type", "dummy"]).is_err() {
            sh("ip", &["link", "add", IFACE, "type", "bridge"])?;
        }
        let guard = Interface;
        sh(
            "ip",
            &["addr", "add", &format!("{UPSTREAM}/32"), "dev", IFACE],
        )?;
        sh("ip", &["link", "set", IFACE, "up"])?;
        // The upstream must be this machine's own address, or the demo
        // would send traffic somewhere real.
        let route = output("ip", &["route", "get", UPSTREAM])?;
        if !route.starts_with(&format!("local {UPSTREAM} ")) {
            bail!("{UPSTREAM} does not route to this machine ({route:?}); not running the demo");
        }
        Ok(guard)
    }
}

impl Drop for Interface {
    fn drop(&mut self) {
        let _ = capture(&command("ip").args(["link", "del", IFACE]));
    }
}

fn sh(program: &str, args: &[&str]) -> anyhow::Result<()> {
    let out = watch(command(program).args(args))?;
    if !out.success() {
        bail!(
            "{program} {} failed ({})",
            args.join(" "),
            describe_exit(&out)
        );
    }
    Ok(())
}

fn output(program: &str, args: &[&str]) -> anyhow::Result<String> {
    Ok(capture(&command(program).args(args))?.stdout_text())
}

/// Serves [`GREETING`] on the upstream address until dropped.
fn serve_upstream(stop: Arc<AtomicBool>) -> anyhow::Result<()> {
    let listener = TcpListener::bind((UPSTREAM, 80)).context("binding the demo upstream")?;
    listener.set_nonblocking(true)?;
    std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            match listener.accept() {
                Ok((mut stream, _)) => {
                    let _ = stream.set_nonblocking(false);
                    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
                    let mut buf = [0u8; 4096];
                    let _ = stream.read(&mut buf);
                    let _ = write!(
                        stream,
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{GREETING}",
                        GREETING.len()
                    );
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    });
    Ok(())
}

/// The `bottle` binary, built for the demo.
fn bottle_binary() -> anyhow::Result<PathBuf> {
    if !watch(cargo().args(["build", "--quiet", "-p", "bottle-cli"]))?.success() {
        bail!("building bottle failed");
    }
    Ok(dist::target_dir().join("debug").join("bottle"))
}

fn step(text: &str) {
    println!("\n\x1b[1m==> {text}\x1b[0m");
}

/// Runs the demo.
pub(crate) fn run() -> anyhow::Result<ExitCode> {
    let binaries = dist::run()?;
    let bottle = bottle_binary()?;
    let root = workspace_root();
    let manifest = root.join("examples/bottle.toml");
    complete_example_context(&root.join(EXAMPLE_CONTEXT), Path::new(HOST_BUSYBOX))
        .context("completing the demo image's build context")?;

    let _interface = Interface::create()?;
    let stop = Arc::new(AtomicBool::new(false));
    serve_upstream(stop.clone())?;

    let bottle_cmd = |args: &[&str]| {
        command(&bottle)
            .arg("--manifest")
            .arg(&manifest)
            .args(args.iter().copied())
            .env("BOTTLE_BUNDLE_BIN", &binaries.bundle)
            .env("BOTTLE_TOOLBOX_BIN", &binaries.toolbox)
    };
    let show = |args: &[&str]| -> anyhow::Result<bool> {
        println!("$ bottle {}", args.join(" "));
        Ok(watch(bottle_cmd(args))?.success())
    };

    step("the plan");
    show(&["plan", "demo"])?;
    step("starting the demo bottle (builds the agent image and the bundle image on first run)");
    if !show(&["start", "demo", "--yes", "--detach"])? {
        bail!("the demo bottle did not start");
    }
    let result = (|| -> anyhow::Result<bool> {
        step("an allowed request, through the bundle's proxy");
        let allowed = show(&[
            "exec",
            "demo",
            "--",
            "wget",
            "-qO-",
            "http://demo.bottle.test/",
        ])?;
        step("a denied request: the proxy refuses a host the manifest does not list");
        let denied = !show(&[
            "exec",
            "demo",
            "--",
            "wget",
            "-qO-",
            "http://denied.bottle.test/",
        ])?;
        step("going around the proxy: the agent has no route out");
        // busybox's `wget -T` crashes, which would look like a refusal;
        // `timeout` bounds the attempt instead, and only "could not
        // connect" (1) or "timed out" (143) count as no route out.
        let direct_script = format!(
            "unset http_proxy HTTP_PROXY; timeout 5 wget -O- http://{UPSTREAM}/; rc=$?; \
             case $rc in 1|143) echo \"no connection (wget exit $rc)\";; \
             *) echo \"unexpected: wget exit $rc\"; exit 1;; esac"
        );
        let direct = show(&["exec", "demo", "--", "sh", "-c", &direct_script])?;
        step("the audit log");
        show(&["logs", "demo"])?;
        Ok(allowed && denied && direct)
    })();
    step("stopping the bottle");
    let stopped = show(&["stop", "demo"])?;
    stop.store(true, Ordering::Relaxed);
    let ok = result? && stopped;
    println!(
        "\n{}",
        if ok {
            "demo: the allowed request went through, the denied one and the direct one did not"
        } else {
            "demo: something did not behave as described above"
        }
    );
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The smallest ELF header `elf_needs_interpreter` reads: 64-bit,
    /// little-endian, no program headers, so no interpreter.
    fn static_elf() -> Vec<u8> {
        let mut bytes = vec![0u8; 64];
        bytes[..6].copy_from_slice(b"\x7fELF\x02\x01");
        bytes
    }

    /// The sources of the Dockerfile's `COPY` lines (flags and the
    /// destination left out).
    fn copied_sources(dockerfile: &str) -> Vec<String> {
        dockerfile
            .lines()
            .filter_map(|line| line.strip_prefix("COPY "))
            .flat_map(|args| {
                let mut words: Vec<&str> = args
                    .split_whitespace()
                    .filter(|word| !word.starts_with("--"))
                    .collect();
                words.pop();
                words.into_iter().map(str::to_string).collect::<Vec<_>>()
            })
            .collect()
    }

    /// A copy of the example's committed build context.
    fn example_context() -> tempfile::TempDir {
        let context = tempfile::tempdir().unwrap();
        let committed = crate::process::workspace_root().join(EXAMPLE_CONTEXT);
        for name in ["Dockerfile", "passwd", "group"] {
            std::fs::copy(committed.join(name), context.path().join(name)).unwrap();
        }
        context
    }

    #[test]
    fn the_completed_context_holds_every_file_its_dockerfile_copies() {
        let context = example_context();
        let host = tempfile::tempdir().unwrap();
        let busybox = host.path().join("busybox");
        std::fs::write(&busybox, static_elf()).unwrap();
        let dockerfile = std::fs::read_to_string(context.path().join("Dockerfile")).unwrap();
        let sources = copied_sources(&dockerfile);
        assert!(sources.contains(&"busybox".to_string()), "{sources:?}");

        let copied = complete_example_context(context.path(), &busybox).unwrap();

        assert_eq!(std::fs::read(&copied).unwrap(), static_elf());
        let mode = std::fs::metadata(&copied).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o755);
        for source in sources {
            assert!(
                context.path().join(&source).is_file(),
                "the Dockerfile copies {source}, which the context lacks"
            );
        }
    }

    #[test]
    fn a_dynamic_or_missing_busybox_is_refused_and_nothing_is_copied() {
        let context = example_context();
        let host = tempfile::tempdir().unwrap();
        let script = host.path().join("busybox");
        std::fs::write(&script, "#!/bin/sh\n").unwrap();
        let missing = host.path().join("absent");

        let not_static = complete_example_context(context.path(), &script).unwrap_err();
        let absent = complete_example_context(context.path(), &missing).unwrap_err();

        assert!(
            format!("{not_static:#}").contains("busybox-static"),
            "{not_static:#}"
        );
        assert!(
            format!("{absent:#}").contains("busybox-static"),
            "{absent:#}"
        );
        assert!(!context.path().join("busybox").exists());
    }
}
