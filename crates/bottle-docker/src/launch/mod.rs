//! `launch`: the steps that turn a confirmed plan into a running bottle,
//! each registering its undo on a [`bottle_core::undo::Unwind`], and the
//! failure injection that tests use to prove the unwinding.
//!
//! Running a bundle on Docker is one component (`bundle.rs`), a
//! [`BundleComponent`] value saying how its network is shaped, how its
//! resources are labelled and what its health must show. A docker
//! bottle's [`launch`] runs it ([`BundleComponent::BESIDE_CONTAINER`]) and
//! the agent container's steps (`agent.rs`); any other backend runs it
//! alone through [`launch_bundle`]: the microVM bundle host
//! ([`crate::vm_bundle`]) with [`BundleComponent::FOR_MICROVM`], whose
//! bottle network is still internal but gives the host its gateway
//! address, because smolvm dials the guest's traffic from the host. [`Step`]
//! lists the steps in order (`steps.rs`).
//!
//! Every step ends through [`bottle_core::launch_steps`]: its lap on the
//! `--timings` timeline, the operator's ^C, and `BOTTLE_FAILPOINT`.

mod agent;
mod bundle;
mod steps;

use std::collections::HashMap;
use std::time::Duration;

use bottle_core::life::{BottleRecord, StateDir};
use bottle_core::undo::Unwind;
use bottle_core::{BackendKind, Plan};

use crate::bottle::DockerBottle;
use crate::client::Engine;
use crate::config::HostOnBridge;
use crate::data::{self, BundleData, DockerPlan, StatePaths};
use crate::error::DockerError;
use crate::images::Progress;
use crate::lifecycle;
use crate::names::{self, BottleLabels};
use bottle_core::process::Owner;

pub use bottle_core::launch_steps::FAILPOINT_ENV;
pub use bundle::container_logs;
pub use steps::{BUNDLE_STEPS, Step};

/// A `BOTTLE_FAILPOINT` naming a docker launch step.
pub type Failpoint = bottle_core::launch_steps::Failpoint<Step>;

/// The bundle as a component of a bottle: what its resources carry and
/// how its bottle network is shaped for the box it serves. A value, so a
/// backend that runs its agent elsewhere reuses the bundle by naming one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BundleComponent {
    /// [`names::LABEL_MANAGED`] on everything the launch creates: whose
    /// `list`, `stop` and `cleanup` find them.
    pub managed: &'static str,
    /// Whether the host holds an address on the bottle network's bridge.
    /// With [`HostOnBridge::Gateway`], `bundle-health` also requires the
    /// host to connect to the bundle's proxy port at its pinned address.
    pub host_on_bridge: HostOnBridge,
}

impl BundleComponent {
    /// A docker bottle's bundle, beside the agent's container: the host
    /// has no address on the bottle network, so nothing on the host is
    /// reachable from the box.
    pub const BESIDE_CONTAINER: BundleComponent = BundleComponent {
        managed: names::MANAGED_BY_DOCKER,
        host_on_bridge: HostOnBridge::Withheld,
    };

    /// A microVM bottle's bundle, which smolvm dials from the host: the
    /// host keeps the network's gateway address, and the resources carry
    /// [`names::MANAGED_FOR_VM`] so the docker backend's `list`, `stop` and
    /// `cleanup` leave them to the smolmachines backend.
    pub const FOR_MICROVM: BundleComponent = BundleComponent {
        managed: names::MANAGED_FOR_VM,
        host_on_bridge: HostOnBridge::Gateway,
    };
}

/// Settings of one launch that come from the backend's options.
pub struct LaunchSettings {
    /// Progress lines (provisioning notes).
    pub progress: Option<Progress>,
    /// How long to wait for the bundle's health check.
    pub health_timeout: Duration,
    /// What ends every step: its lap (`--timings`), the operator's ^C,
    /// failure injection.
    pub step_ends: bottle_core::launch_steps::StepEnds<Step>,
    /// The agent images' CA surveys, remembered by image ID.
    pub ca_surveys: crate::cache::CaSurveyCache,
}

/// One launch in progress: what it runs on, what it brings up, and what
/// it must take down if it fails.
struct Launch<'a, D> {
    engine: &'a Engine,
    settings: &'a LaunchSettings,
    plan: &'a Plan<D>,
    bundle: &'a BundleData,
    paths: StatePaths,
    labels: BottleLabels,
    component: BundleComponent,
    /// What to remove if the launch fails, newest last.
    undo: Unwind<'a>,
    /// Held from ensuring the egress network until the bundle holds an
    /// endpoint on it, so `stop` elsewhere cannot remove it in between.
    egress_lock: Option<lifecycle::EgressLock>,
    /// The bundle's start, under way while the agent container is created
    /// and filled; joined before the bundle's checks, and before any undo.
    bundle_starting: Option<BundleStart>,
    /// The bundle's stderr, attached before its start: `bundle-health`
    /// reads the ready line from it.
    bundle_output: Option<BundleOutput>,
    /// The agent's start (its keep-alive only), under way while the
    /// bundle is checked; joined before the agent's checks, and before any
    /// undo.
    agent_starting: Option<ContainerStart>,
    /// The agent's CA install (docker bottles), under way while both
    /// containers start; joined at `provision-ca`, and before any undo.
    ca_installing: Option<CaInstalling>,
}

/// The agent's CA install, on a thread of its own.
type CaInstalling = std::thread::JoinHandle<Result<agent::CaInstall, crate::error::DockerError>>;

/// A container's start, sent to the Engine while the launch goes on.
type ContainerStart = tokio::task::JoinHandle<Result<(), bollard::errors::Error>>;

/// The bundle's stderr, attached before its start.
type BundleOutput = std::pin::Pin<
    Box<
        dyn futures_util::Stream<
                Item = Result<bollard::container::LogOutput, bollard::errors::Error>,
            > + Send,
    >,
>;

/// The bundle's start, sent to the Engine with its stderr attached first
/// (no stderr when the Engine refused the attach).
type BundleStart =
    tokio::task::JoinHandle<(Result<(), bollard::errors::Error>, Option<BundleOutput>)>;

/// What a start sent ahead came to.
async fn started(start: ContainerStart) -> Result<(), bollard::errors::Error> {
    start.await.unwrap_or_else(|join| {
        Err(bollard::errors::Error::IOError {
            err: std::io::Error::other(join.to_string()),
        })
    })
}

/// Launches the bottle `plan` describes; on failure everything created so
/// far is removed before the error is returned.
pub fn launch(
    engine: &Engine,
    settings: &LaunchSettings,
    plan: &DockerPlan,
) -> Result<DockerBottle, DockerError> {
    if plan.backend != BackendKind::Docker {
        return Err(DockerError::PlanData {
            detail: format!("the plan is for the {} backend", plan.backend),
        });
    }
    let bundle = &plan.backend_data.bundle;
    let mut launch = Launch::begin(
        engine,
        settings,
        plan,
        bundle,
        BundleComponent::BESIDE_CONTAINER,
    )?;
    // The state dir is this launch's to remove on failure.
    let root = launch.paths.root.clone();
    launch.undo.push("the state dir", move || {
        data::remove_state_dir(&root)
            .map(drop)
            .map_err(|e| e.to_string())
    });
    // The plan first: a state dir holding only the plan is a launch that
    // died at once, which `cleanup` recognises as such.
    let record = BottleRecord::launching(&plan.bottle, &plan.agent, BackendKind::Docker);
    let result = data::write_plan(&launch.paths, plan)
        .and_then(|()| Ok(StateDir::new(&plan.state_dir).begin(&record)?))
        .and_then(|()| launch.run());
    launch.finish(result)
}

/// Launches only the bundle of `plan`, as `component`: the steps up to
/// `bundle-health`, unwound the same way on failure. Of the state dir
/// (the other backend's), only the bundle's files are this launch's to
/// remove.
pub fn launch_bundle<D>(
    engine: &Engine,
    settings: &LaunchSettings,
    plan: &Plan<D>,
    bundle: &BundleData,
    component: BundleComponent,
) -> Result<(), DockerError> {
    let mut launch = Launch::begin(engine, settings, plan, bundle, component)?;
    let root = launch.paths.root.clone();
    launch.undo.push("the bundle's files", move || {
        data::remove_bundle_files(&root)
            .map(drop)
            .map_err(|e| e.to_string())
    });
    let result = launch.run_bundle();
    launch.finish(result)
}

impl<'a, D> Launch<'a, D> {
    fn begin(
        engine: &'a Engine,
        settings: &'a LaunchSettings,
        plan: &'a Plan<D>,
        bundle: &'a BundleData,
        component: BundleComponent,
    ) -> Result<Launch<'a, D>, DockerError> {
        if bundle.version != data::STATE_LAYOUT_VERSION {
            return Err(DockerError::PlanData {
                detail: format!(
                    "version {} (this bottle reads {})",
                    bundle.version,
                    data::STATE_LAYOUT_VERSION
                ),
            });
        }
        if lifecycle::bottle_resources_exist(engine, &plan.slug)? {
            return Err(DockerError::AlreadyExists {
                name: plan.bottle.clone(),
            });
        }
        let paths = StatePaths::new(&plan.state_dir);
        let owner = Owner::current();
        let labels = BottleLabels {
            name: plan.bottle.clone(),
            agent: plan.agent.clone(),
            slug: plan.slug.clone(),
            owner,
            state_dir: plan.state_dir.display().to_string(),
            detached: bundle.detached,
            bundle_ip: bundle.ip.to_string(),
        };
        Ok(Launch {
            engine,
            settings,
            plan,
            bundle,
            paths,
            labels,
            component,
            undo: Unwind::default(),
            egress_lock: None,
            bundle_starting: None,
            bundle_output: None,
            agent_starting: None,
            ca_installing: None,
        })
    }

    /// Ends the launch: a successful one keeps what it created, a failed
    /// one removes it, newest first.
    fn finish<T>(mut self, result: Result<T, DockerError>) -> Result<T, DockerError> {
        // The undo must not race a start still in flight.
        if let Some(start) = self.bundle_starting.take() {
            let _ = self.engine.block_on(start);
        }
        if let Some(start) = self.agent_starting.take() {
            let _ = self.engine.block_on(started(start));
        }
        self.bundle_output = None;
        if let Some(installing) = self.ca_installing.take() {
            let _ = installing.join();
        }
        // Removing the egress network takes the egress lock itself.
        self.egress_lock = None;
        let undo = std::mem::take(&mut self.undo);
        match result {
            Ok(value) => {
                undo.disarm();
                Ok(value)
            }
            Err(err) => {
                for failure in undo.run() {
                    self.note(&format!("unwinding: {failure}"));
                }
                Err(err)
            }
        }
    }

    /// Registers the removal of container `name`, which is `what`.
    fn undo_container(&mut self, what: &'static str, name: &str) {
        let (engine, name) = (self.engine, name.to_string());
        self.undo.push(what, move || {
            lifecycle::remove_container(engine, &name)
                .map(drop)
                .map_err(|e| e.to_string())
        });
    }
}

impl<D> Launch<'_, D> {
    fn note(&self, line: &str) {
        if let Some(progress) = &self.settings.progress {
            progress(line);
        }
    }

    /// The labels of a resource of `role`, managed as the component says.
    fn labels_for(&self, role: &str) -> HashMap<String, String> {
        let mut labels = self.labels.for_role(role);
        labels.insert(
            names::LABEL_MANAGED.to_string(),
            self.component.managed.to_string(),
        );
        labels
    }

    /// Ends a step: records it on the timeline, then fails here if the
    /// operator interrupted the launch or the failpoint names it.
    fn step_done(&self, step: Step) -> Result<(), DockerError> {
        Ok(self.settings.step_ends.done(step)?)
    }

    /// Runs an Engine API call to completion; `action` names it in the
    /// error.
    fn block<T>(
        &self,
        action: &str,
        future: impl std::future::Future<Output = Result<T, bollard::errors::Error>>,
    ) -> Result<T, DockerError> {
        self.engine
            .block_on(future)
            .map_err(DockerError::api(action.to_string()))
    }
}
