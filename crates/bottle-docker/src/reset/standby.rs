//! The standby box a reset swaps in (docs/design/standby-reset.md).
//!
//! Off the reset's critical path, [`DockerResetSubstrate::prepare_standby`]
//! creates a second agent box from the bottle's plan, named
//! `<agent>-standby` and labelled like the agent
//! ([`crate::config::standby_container`]), its layer replaced by a copy of
//! the golden snapshot before its start; started (keep-alive only) on the
//! bottle network at an address the daemon picks and disconnected from it
//! at once (a box created with no network can never be connected to one;
//! one that started on it connects again three times faster); given an
//! in-box agent with the preparing handle's channel open when that handle
//! calls (so its first call after the swap starts none); checked from the
//! three sources against the golden baseline, leaving out exactly that
//! agent's process; and paused. Only then is it recorded as waiting
//! (`golden/standby.json`: its ID and the agent's process).
//!
//! A reset that finds a waiting standby (under the reset lock):
//! 1. at once pauses the old box, force-disconnects it from the bottle
//!    network and unpauses the standby (still on no network): from here
//!    none of the old box's processes runs and nothing it queued leaves it;
//! 2. connects the standby at the plan's agent address (the bundle trusts
//!    no source address) while the old box is renamed `<agent>-old-<ms>`;
//! 3. renames the standby to the agent's name, so `exec`, `cp`, forwards
//!    and sessions find the new box. The protocol in core then reads the
//!    three sources of the new box as of any reset, with no soft pass.
//!
//! The next preparation removes the retired boxes. A bottle with no
//! waiting standby, or one that no longer stands as recorded, resets by
//! restart. A gVisor box always resets by restart: its standby would be a
//! second sandbox, not verified here.

use std::path::PathBuf;

use bollard::models::{NetworkConnectRequest, NetworkDisconnectRequest};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, ListContainersOptionsBuilder, RenameContainerOptionsBuilder,
};
use bottle_core::life::{Phase, StateDir};
use bottle_core::sandbox::Baseline;
use bottle_core::sandbox::reset::engine_check;
use serde::{Deserialize, Serialize};

use super::{ChannelProcess, DockerResetSubstrate, sibling, swap_layer};
use crate::client::remove_container;
use crate::data::{self, DockerPlan, StatePaths};
use crate::error::DockerError;

/// What [`DockerResetSubstrate::prepare_standby`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StandbyPrepared {
    /// A verified standby now waits, or already did; `channel_open` when
    /// this preparation made it and started its in-box agent with the
    /// caller's channel open.
    Waiting {
        /// The caller's channel into it is open.
        channel_open: bool,
    },
    /// This bottle resets by restart; why.
    NotUsed(String),
}

/// `golden/standby.json`: the waiting standby.
#[derive(Debug, Serialize, Deserialize)]
struct StandbyRecord {
    /// Its container ID.
    container: String,
    /// The in-box agent started in it with its channel open, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    channel: Option<ChannelProcess>,
}

/// Starts the in-box agent in a standby (by its ID) with its channel open,
/// for the first call after the reset that swaps it in.
pub type OpenChannel<'a> = &'a dyn Fn(&str) -> Result<ChannelProcess, DockerError>;

/// Removes a container on drop unless defused: a standby whose
/// preparation failed half-way is not left behind.
struct Unfinished<'a> {
    substrate: &'a DockerResetSubstrate,
    container: Option<String>,
}

impl Drop for Unfinished<'_> {
    fn drop(&mut self) {
        if let Some(container) = self.container.take() {
            let _ = remove_container(&self.substrate.engine, &container);
        }
    }
}

impl DockerResetSubstrate {
    /// The standby's name while it waits.
    pub fn standby_name(&self) -> String {
        format!("{}-standby", self.agent)
    }

    /// The prefix of a box a reset retired.
    fn retired_prefix(&self) -> String {
        format!("{}-old-", self.agent)
    }

    fn standby_record(&self) -> PathBuf {
        self.files.golden_dir().join("standby.json")
    }

    /// Prepares a verified standby for the next reset unless one waits,
    /// then removes the boxes earlier resets retired. Slow (a container's
    /// create and start): run it off the reset's path. With
    /// `open_channel`, the in-box agent is started in the new standby
    /// before it is checked and paused, and the check leaves exactly that
    /// process out.
    pub fn prepare_standby(
        &self,
        open_channel: Option<OpenChannel<'_>>,
    ) -> Result<StandbyPrepared, DockerError> {
        if self.gvisor_binary.is_some() {
            return Ok(StandbyPrepared::NotUsed(
                "a gVisor box resets by restart".into(),
            ));
        }
        if bottle_core::sandbox::reset::halted(&self.files).is_some() {
            return Ok(StandbyPrepared::NotUsed("the bottle is halted".into()));
        }
        let Some(baseline) = self.baseline() else {
            return Ok(StandbyPrepared::NotUsed(
                "the bottle has no golden baseline".into(),
            ));
        };
        // One preparation at a time; a reset waits for none of it.
        let _one_preparer = data::lock_file(&self.files.golden_dir().join("standby.lock"))?;
        // A stop's finisher holds the state dir while it removes what is
        // labelled with the bottle: holding it here, a standby is either
        // made before the finisher lists the bottle's boxes or not at all.
        let state = StateDir::new(&self.files.state_dir);
        let Some(_no_stop) = state.lock() else {
            return Ok(StandbyPrepared::NotUsed(
                "the bottle's state dir is gone".into(),
            ));
        };
        if state.phase() != Some(Phase::Running) {
            return Ok(StandbyPrepared::NotUsed("the bottle is not running".into()));
        }
        let waiting = {
            let _no_reset = self.lock()?;
            let waiting = self.waiting_standby()?.is_some();
            if !waiting {
                let _ = std::fs::remove_file(self.standby_record());
                remove_container(&self.engine, &self.standby_name())?;
                // A box swapped in from a standby has no copy beside its
                // layer for a reset by restart yet.
                let upper = self.upper_dir()?;
                if !sibling(&upper, ".next").is_dir() {
                    self.prepare_next(&upper)?;
                }
            }
            waiting
        };
        if waiting {
            self.remove_retired()?;
            return Ok(StandbyPrepared::Waiting {
                channel_open: false,
            });
        }
        let plan = data::read_plan(&StatePaths::new(self.files.state_dir.clone()))?;
        let id = self.create_standby(&plan)?;
        let mut unfinished = Unfinished {
            substrate: self,
            container: Some(id.clone()),
        };
        let upper = self.upper_dir_of(&id)?;
        self.copy_tree(&self.golden_upper(), &sibling(&upper, ".next"))?;
        swap_layer(&upper)?;
        self.engine
            .block_on(self.engine.docker.start_container(&id, None))
            .map_err(DockerError::api(format!("start {}", self.standby_name())))?;
        let network = &plan.backend_data.bundle.network;
        let disconnect = NetworkDisconnectRequest {
            container: id.clone(),
            force: Some(true),
        };
        self.engine
            .block_on(self.engine.docker.disconnect_network(network, disconnect))
            .map_err(DockerError::api(format!(
                "disconnect {} from {network}",
                self.standby_name()
            )))?;
        self.wait_for_keep_alive(&id)?;
        let channel = open_channel.map(|open| open(&id)).transpose()?;
        self.verify_standby(&id, &baseline, channel)?;
        self.engine
            .block_on(self.engine.docker.pause_container(&id))
            .map_err(DockerError::api(format!("pause {}", self.standby_name())))?;
        let record = serde_json::to_vec(&StandbyRecord {
            container: id.clone(),
            channel,
        })
        .map_err(|err| DockerError::ResetState {
            what: format!("cannot encode the standby's record: {err}"),
        })?;
        {
            let _no_reset = self.lock()?;
            data::write_file(&self.standby_record(), &record, 0o600)?;
            unfinished.container = None;
        }
        // Last: the box the reset just retired stays as it left it (frozen,
        // off the network) a moment longer, where the escape gate looks.
        self.remove_retired()?;
        Ok(StandbyPrepared::Waiting {
            channel_open: channel.is_some(),
        })
    }

    fn baseline(&self) -> Option<Baseline> {
        serde_json::from_slice(&std::fs::read(self.files.baseline()).ok()?).ok()
    }

    /// The recorded standby when it is still the paused `<agent>-standby`
    /// it was recorded as; a record of anything else is removed with its
    /// box.
    fn waiting_standby(&self) -> Result<Option<StandbyRecord>, DockerError> {
        let Ok(text) = std::fs::read(self.standby_record()) else {
            return Ok(None);
        };
        let record = serde_json::from_slice::<StandbyRecord>(&text).ok();
        let expected_name = format!("/{}", self.standby_name());
        let stands = record.as_ref().is_some_and(|record| {
            self.inspect_of(&record.container).is_ok_and(|inspect| {
                inspect.name.as_deref() == Some(expected_name.as_str())
                    && inspect.state.and_then(|s| s.paused) == Some(true)
            })
        });
        if stands {
            return Ok(record);
        }
        let _ = std::fs::remove_file(self.standby_record());
        if let Some(record) = record {
            remove_container(&self.engine, &record.container)?;
        }
        Ok(None)
    }

    /// Creates `<agent>-standby` from the plan, labelled like the agent.
    fn create_standby(&self, plan: &DockerPlan) -> Result<String, DockerError> {
        let paths = StatePaths::new(self.files.state_dir.clone());
        let labels = self
            .inspect_of(&self.agent)?
            .config
            .and_then(|config| config.labels)
            .unwrap_or_default();
        let body = crate::config::standby_container(
            plan,
            &paths.agent_resolv_conf().display().to_string(),
            &paths.agent_box().display().to_string(),
            labels,
        );
        let name = self.standby_name();
        let options = CreateContainerOptionsBuilder::default().name(&name).build();
        let created = self
            .engine
            .block_on(self.engine.docker.create_container(Some(options), body))
            .map_err(DockerError::api(format!("create container {name}")))?;
        Ok(created.id)
    }

    /// The standby's three sources against the golden baseline: its layer,
    /// its descriptors but `channel`'s, and the Engine's facts with no
    /// network (it has none until it is swapped in).
    fn verify_standby(
        &self,
        id: &str,
        baseline: &Baseline,
        channel: Option<ChannelProcess>,
    ) -> Result<(), DockerError> {
        let diverged = |what: String| DockerError::ResetState {
            what: format!("the standby diverged from the golden snapshot: {what}"),
        };
        let fs_hash = super::tree_hash(&self.upper_dir_of(id)?)?;
        if fs_hash != baseline.fs_hash {
            return Err(diverged(format!(
                "filesystem {fs_hash}, expected {}",
                baseline.fs_hash
            )));
        }
        let open_fds = self.open_fds_of(id, channel)?;
        if open_fds != baseline.open_fds {
            return Err(diverged(format!(
                "open_fds {open_fds}, expected {}",
                baseline.open_fds
            )));
        }
        let mut expected = baseline.engine.clone();
        expected.insert("networks".into(), String::new());
        let engine = engine_check(&expected, &self.engine_of(id)?);
        if !engine.matched {
            return Err(diverged(format!(
                "engine {}, expected {}",
                engine.observed, engine.expected
            )));
        }
        Ok(())
    }

    /// Swaps the waiting standby in (see the module doc) and returns its
    /// ID and in-box agent; `Ok(None)` when none waits, and the caller
    /// resets by restart. The caller holds the reset lock.
    pub(super) fn swap_in_standby(
        &self,
    ) -> Result<Option<(String, Option<ChannelProcess>)>, DockerError> {
        let Some(StandbyRecord {
            container: standby,
            channel,
        }) = self.waiting_standby()?
        else {
            return Ok(None);
        };
        let _ = std::fs::remove_file(self.standby_record());
        let plan = data::read_plan(&StatePaths::new(self.files.state_dir.clone()))?;
        let network = &plan.backend_data.bundle.network;
        let docker = &self.engine.docker;
        let retired = format!(
            "{}{}",
            self.retired_prefix(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_millis()
        );
        let rename = |from: &str, to: &str| {
            let options = RenameContainerOptionsBuilder::default().name(to).build();
            let (from, to) = (from.to_string(), to.to_string());
            async move {
                docker
                    .rename_container(&from, options)
                    .await
                    .map_err(DockerError::api(format!("rename {from} to {to}")))
            }
        };
        let disconnect = NetworkDisconnectRequest {
            container: self.agent.clone(),
            force: Some(true),
        };
        self.engine.block_on(async {
            // At once: the old box freezes (none of its processes runs
            // again) and leaves the network (nothing it queued leaves
            // it); the standby, still on no network, thaws.
            let (paused, disconnected, unpaused) = tokio::join!(
                docker.pause_container(&self.agent),
                docker.disconnect_network(network, disconnect),
                docker.unpause_container(&standby)
            );
            disconnected.map_err(DockerError::api(format!(
                "disconnect {} from {network}",
                self.agent
            )))?;
            // One that cannot be paused (not running) is killed instead.
            if paused.is_err() {
                self.kill_async(&self.agent).await?;
            }
            unpaused.map_err(DockerError::api(format!("unpause {}", self.standby_name())))?;
            let connect = NetworkConnectRequest {
                container: standby.clone(),
                endpoint_config: Some(crate::config::agent_endpoint(&plan)),
            };
            let (connected, renamed) = tokio::join!(
                docker.connect_network(network, connect),
                rename(&self.agent, &retired)
            );
            connected.map_err(DockerError::api(format!(
                "connect {} to {network}",
                self.standby_name()
            )))?;
            renamed?;
            rename(&standby, &self.agent).await
        })?;
        Ok(Some((standby, channel)))
    }

    /// Removes every box a reset retired.
    fn remove_retired(&self) -> Result<(), DockerError> {
        let prefix = format!("/{}", self.retired_prefix());
        let pattern = format!("^{prefix}");
        let filters = std::collections::HashMap::from([("name", vec![pattern.as_str()])]);
        let options = ListContainersOptionsBuilder::default()
            .all(true)
            .filters(&filters)
            .build();
        let containers = self
            .engine
            .block_on(self.engine.docker.list_containers(Some(options)))
            .map_err(DockerError::api("list retired agent boxes"))?;
        for container in containers {
            let names = container.names.unwrap_or_default();
            if let Some(name) = names.iter().find(|name| name.starts_with(&prefix)) {
                remove_container(&self.engine, name.trim_start_matches('/'))?;
            }
        }
        Ok(())
    }
}
