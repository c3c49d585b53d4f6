//! A network interface holding test addresses, removed when dropped.

use std::io;
use std::net::IpAddr;

use bottle_core::exec::{CommandOutput, CommandRunner as _, CommandSpec, SystemRunner};

/// A dummy interface (or, on kernels without the dummy driver, an empty
/// bridge, which behaves the same) holding test addresses as /32s.
pub struct TestInterface {
    name: String,
}

fn ip(args: &[&str]) -> io::Result<CommandOutput> {
    SystemRunner.run(&CommandSpec::new("ip").args(args.iter().copied()))
}

fn ip_ok(args: &[&str]) -> io::Result<CommandOutput> {
    let out = ip(args)?;
    if !out.success() {
        return Err(io::Error::other(format!(
            "ip {}: {}",
            args.join(" "),
            out.stderr_text().trim()
        )));
    }
    Ok(out)
}

impl TestInterface {
    /// Creates `name` holding `addrs`, each checked with `ip route get` to be
    /// delivered to this host before it is used. Needs CAP_NET_ADMIN.
    pub fn create(name: &str, addrs: &[IpAddr]) -> io::Result<TestInterface> {
        let _ = ip(&["link", "del", name]);
        let created = ip(&["link", "add", name, "type", "dummy"])?.success()
            || ip(&["link", "add", name, "type", "bridge"])?.success();
        if !created {
            return Err(io::Error::other(format!(
                "cannot create interface {name} (needs root / CAP_NET_ADMIN)"
            )));
        }
        let iface = TestInterface {
            name: name.to_string(),
        };
        for addr in addrs {
            ip_ok(&["addr", "add", &format!("{addr}/32"), "dev", name])?;
        }
        ip_ok(&["link", "set", name, "up"])?;
        for addr in addrs {
            let route = ip_ok(&["route", "get", &addr.to_string()])?.stdout_text();
            if !route.starts_with(&format!("local {addr} ")) {
                return Err(io::Error::other(format!(
                    "{addr} is not delivered to this host: {route}"
                )));
            }
        }
        Ok(iface)
    }

    /// The interface's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for TestInterface {
    fn drop(&mut self) {
        let _ = ip(&["link", "del", &self.name]);
    }
}
