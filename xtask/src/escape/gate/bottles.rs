//! Starting the run's bottles and reading back what the host knows of
//! them: addresses, networks, and the targets each one's probe aims at.

use std::time::Duration;

use anyhow::{Context as _, bail};
use bottle_probe::contract::Targets;
use serde_json::Value;

use super::{Bottle, Gate};
use crate::escape::canary;
use crate::escape::cli::BottleGuard;
use crate::escape::evidence::Cidr;
use crate::escape::fixture;
use crate::escape::report::Row;

impl Gate {
    /// Starts `keys` one after the other and reads back their addresses.
    pub(super) fn launch_each(&mut self, keys: &[&str]) -> anyhow::Result<Vec<Bottle>> {
        let mut bottles = Vec::new();
        for key in keys {
            let guard = BottleGuard::start(&self.cli, key)?;
            let bottle = self.describe(guard, key)?;
            self.set_rebind_bundle(&bottle);
            bottles.push(bottle);
        }
        self.refresh_egress()?;
        Ok(bottles)
    }

    /// Starts `cold` as [`Gate::launch_each`] does, then `pooled` from a
    /// warm pool: filled, then claimed by `bottle start`, so every probe,
    /// control and fault that runs against the second bottle runs against
    /// a pooled one. That it was claimed is itself a control (a claim the
    /// pool refused would start it cold and prove nothing of the pool).
    pub(super) fn launch_cold_and_pooled(
        &mut self,
        cold: &str,
        pooled: &str,
    ) -> anyhow::Result<Vec<Bottle>> {
        let guard = BottleGuard::start(&self.cli, cold)?;
        let first = self.describe(guard, cold)?;
        self.set_rebind_bundle(&first);
        let guard = BottleGuard::claim_pooled(&self.cli, pooled)?;
        let state = self.cli.pool_state(&guard.name)?;
        let claimed = state.as_deref() == Some("claimed");
        self.report.rows.push(Row::control(
            "bottle B",
            "control-pool-claimed",
            claimed,
            format!(
                "`bottle start {}` {} the pooled bottle {}",
                fixture::short(pooled),
                if claimed { "claimed" } else { "did not claim" },
                guard.name
            ),
        ));
        if !claimed {
            bail!("`bottle start {pooled}` did not claim its pooled bottle ({state:?})");
        }
        let second = self.describe(guard, pooled)?;
        self.set_rebind_bundle(&second);
        self.refresh_egress()?;
        Ok(vec![first, second])
    }

    /// Starts `keys` at once (parallel `bottle start`s, racing for the
    /// shared egress network when none exists yet) and reads back their
    /// addresses.
    pub(super) fn launch_many(&mut self, keys: &[&str]) -> anyhow::Result<Vec<Bottle>> {
        let started: Vec<(String, anyhow::Result<BottleGuard>)> = std::thread::scope(|s| {
            let handles: Vec<_> = keys
                .iter()
                .map(|k| {
                    let cli = self.cli.clone();
                    (k.to_string(), s.spawn(move || BottleGuard::start(&cli, k)))
                })
                .collect();
            handles
                .into_iter()
                .map(|(k, h)| {
                    let result = h
                        .join()
                        .unwrap_or_else(|_| Err(anyhow::anyhow!("the start thread panicked")));
                    (k, result)
                })
                .collect()
        });
        let mut bottles = Vec::new();
        let mut first_error = None;
        for (key, guard) in started {
            match guard {
                Ok(guard) => match self.describe(guard, &key) {
                    Ok(b) => bottles.push(b),
                    Err(e) => first_error = first_error.or(Some(e)),
                },
                Err(e) => first_error = first_error.or(Some(e.context(format!("starting {key}")))),
            }
        }
        if let Some(err) = first_error {
            return Err(err);
        }
        for bottle in &bottles {
            self.set_rebind_bundle(bottle);
        }
        self.refresh_egress()?;
        Ok(bottles)
    }

    /// Whether `bottle`'s bundle serves its proxy right now: its agent
    /// fetches its allowed host through it. The other-bottle probes aim at
    /// that port, so "blocked" means something only while this holds.
    pub(super) fn proxy_alive(&mut self, phase: &str, bottle: &Bottle) -> anyhow::Result<bool> {
        let host = fixture::allowed_host(&bottle.key);
        let alive = self
            .fetch_through_proxy(bottle, &host)?
            .contains(&self.token);
        self.report.rows.push(Row::control(
            phase,
            "control-other-bundle-alive",
            alive,
            format!(
                "{} fetched {host} through its own bundle {}: {}",
                fixture::short(&bottle.key),
                bottle.bundle_ip,
                if alive { "token seen" } else { "failed" }
            ),
        ));
        Ok(alive)
    }

    /// What `http://HOST/` answers from inside `bottle`, fetched through
    /// its own proxy: the response's head and body, or its error output.
    /// busybox `nc`, not `wget`: gVisor 20221219 in its host network mode
    /// answers a blocking `read(2)` on a socket that has nothing yet with
    /// EAGAIN, which busybox wget takes for a failed response (`nc` polls
    /// first). Its input stays open for 3 s, since the proxy closes a
    /// connection whose client half-closes; the proxy closes after an
    /// HTTP/1.0 answer, which ends `nc`. The same request in every tier.
    pub(super) fn fetch_through_proxy(
        &self,
        bottle: &Bottle,
        host: &str,
    ) -> anyhow::Result<String> {
        let script = format!(
            "{{ printf 'GET http://{host}/ HTTP/1.0\\r\\nHost: {host}\\r\\n\\r\\n'; sleep 3; }} | timeout 8 nc {} {}",
            bottle.bundle_ip,
            bottle_core::bundle::PROXY_PORT
        );
        let out = self.cli.exec(
            &bottle.guard.name,
            &["sh", "-c", script.as_str()],
            Duration::from_secs(30),
        )?;
        Ok(format!("{}{}", out.stdout, out.stderr))
    }

    fn describe(&mut self, guard: BottleGuard, key: &str) -> anyhow::Result<Bottle> {
        let bundle_ip = self.cli.bundle_address(&guard.name)?;
        let network = self.engine.inspect_network(&guard.name)?;
        let ipam = &network["IPAM"]["Config"][0];
        let subnet = ipam["Subnet"]
            .as_str()
            .and_then(Cidr::parse)
            .with_context(|| format!("network {} has no IPv4 subnet", guard.name))?;
        // smolmachines: the host's `.1` on the bundle bridge, which the VM
        // must not reach (its allowlist is the bundle's /32).
        let gateway = ipam["Gateway"].as_str().unwrap_or_default().to_string();
        // smolmachines: no agent container, so no agent address (the probe
        // skips the other-agent target).
        let agent_ip = if self.smolvm.is_some() {
            String::new()
        } else {
            let agent = self
                .engine
                .inspect_container(&format!("{}-agent", guard.name))?;
            let ip = agent["NetworkSettings"]["Networks"][&guard.name]["IPAddress"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            if ip.is_empty() {
                bail!("the agent of {} has no address on its network", guard.name);
            }
            ip
        };
        self.bottle_subnets.push(subnet);
        self.bottle_bridges.push((subnet, bridge_device(&network)));
        Ok(Bottle {
            guard,
            key: key.to_string(),
            bundle_ip,
            agent_ip,
            gateway,
            probe_copied: false,
        })
    }

    fn set_rebind_bundle(&self, bottle: &Bottle) {
        if let Ok(ip) = bottle.bundle_ip.parse() {
            self.dns
                .set(&fixture::rebind_bundle_host(&bottle.key), vec![ip]);
        }
    }

    pub(super) fn refresh_egress(&mut self) -> anyhow::Result<()> {
        let network = self.engine.inspect_network("bot-bottle-egress")?;
        self.egress = network["IPAM"]["Config"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c["Subnet"].as_str().and_then(Cidr::parse))
            .collect();
        Ok(())
    }

    pub(super) fn targets(&self, me: &Bottle, other: &Bottle) -> Targets {
        let mut rebind: Vec<String> = fixture::REBIND_HOSTS
            .iter()
            .map(|s| s.to_string())
            .collect();
        rebind.push(fixture::rebind_bundle_host(&me.key));
        Targets {
            internet_v4: canary::INTERNET.to_string(),
            internet_v6: canary::INTERNET_V6.to_string(),
            metadata: canary::METADATA.to_string(),
            private: canary::PRIVATE.to_string(),
            dns_server: canary::DNS.to_string(),
            host_loopback_port: self.port("host-loopback").unwrap_or(0),
            host_any_port: self.port("host-any").unwrap_or(0),
            gateway: me.gateway.clone(),
            own_bundle: me.bundle_ip.clone(),
            other_bundle: other.bundle_ip.clone(),
            other_agent: other.agent_ip.clone(),
            proxy: format!(
                "http://{}:{}",
                me.bundle_ip,
                bottle_core::bundle::PROXY_PORT
            ),
            allowed_host: fixture::allowed_host(&me.key),
            denied_host: "denied.bottle.test".into(),
            credential_host: fixture::credential_host(&me.key),
            redact_host: fixture::redact_host(&me.key),
            supervise_url: bottle_core::bundle::supervise_url(&me.bundle_ip),
            git_gate_url: format!(
                "http://{}:{}",
                me.bundle_ip,
                bottle_core::bundle::GIT_GATE_PORT
            ),
            git_repo: fixture::GIT_REPO.into(),
            rebind_hosts: rebind,
            canary_names: self.canary_names(),
            host_service_port: self.ports.host_service,
            host_service_unnamed_port: self.ports.unnamed_service,
            pinned_tcp_host: fixture::PINNED_TCP_HOST.into(),
            pinned_tcp_addr: canary::PINNED_TCP.to_string(),
            pinned_tcp_port: canary::PINNED_TCP_PORT,
            pinned_tcp_other_port: canary::PINNED_TCP_OTHER_PORT,
            other_tcp_host: fixture::OTHER_TCP_HOST.into(),
            other_tcp_addr: canary::OTHER_TCP.to_string(),
        }
    }
}

/// The Linux bridge of a Docker bridge network: its `bridge.name` option,
/// else Docker's default `br-<first 12 of the id>`.
pub(super) fn bridge_device(network: &Value) -> String {
    match network["Options"]["com.docker.network.bridge.name"].as_str() {
        Some(name) if !name.is_empty() => name.to_string(),
        _ => {
            let id = network["Id"].as_str().unwrap_or_default();
            format!("br-{}", id.get(..12).unwrap_or(id))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bridge_devices_follow_docker_naming() {
        let net = serde_json::json!({"Id": "0123456789abcdef0123", "Options": {}});
        assert_eq!(bridge_device(&net), "br-0123456789ab");
        let named = serde_json::json!({
            "Id": "0123456789abcdef0123",
            "Options": {"com.docker.network.bridge.name": "docker0"}
        });
        assert_eq!(bridge_device(&named), "docker0");
    }
}
