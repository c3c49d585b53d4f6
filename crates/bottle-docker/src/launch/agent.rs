//! A docker bottle's launch: the bundle's steps around the agent
//! container's. The agent is created pinned at `.3` on the bottle network
//! alone, given its keep-alive, prompt, skills and (when its image has no
//! trust tool to run) its CA, started while the bundle (started ahead) is
//! checked, and verified isolated before an image's trust tool installs
//! its CA through an exec, the golden snapshot for reset is taken and the
//! launch is marked complete; nothing of the agent runs until then.

use bollard::query_parameters::{CreateContainerOptionsBuilder, UploadToContainerOptionsBuilder};

use super::{Launch, Step};
use crate::isolation;
use bottle_core::agent_box::{
    self, AgentBox, BoxFile, Contents, Entry, FileOwner, Refused, ToolRun,
};
use bottle_core::ca_install;
use bottle_core::display::escape_for_terminal;
use bottle_core::life::{Phase, StateDir};
use bottle_core::sandbox::{SandboxError, reset};
use bottle_core::sandbox::{TOOLBOX_MODE, TOOLBOX_PATH};

use crate::archive::{container_dir_has_entries, container_entry, container_owner};
use crate::bottle::{DockerBottle, exec_captured};
use crate::client::Engine;
use crate::config::{self, AGENT_PROMPT_PATH, AGENT_SKILLS_DIR};
use crate::data::{self, AgentData, DockerPlanData};
use crate::error::DockerError;
use crate::names::role;
use crate::pause::{GVISOR_TMP_KEEP, PAUSE_PATH, UNAME_PATH, pause_elf, uname_elf};
use crate::reset::DockerResetSubstrate;
use crate::tarball::{Ownership, TarBuilder, entry_name};
use crate::toolbox::InBoxAgent;
use bottle_core::isolation::Isolation;

/// The agent container's steps: a docker bottle's plan only.
impl<'a> Launch<'a, DockerPlanData> {
    /// The agent container's part of the plan.
    fn agent(&self) -> &'a AgentData {
        &self.plan.backend_data.agent
    }

    /// Every step of [`super::Step::ALL`], in order.
    pub(super) fn run(&mut self) -> Result<DockerBottle, DockerError> {
        let data = self.agent();
        self.prepare_bundle()?;
        let (network, agent) = (self.bundle.network.clone(), data.container.clone());
        let (network, agent) = (&network, &agent);
        let bundle = self.bundle.container.clone();
        // The bundle is complete: its start (a third of a launch) goes to
        // the Engine now and overlaps the agent container's steps. Nothing
        // of the agent runs until every check below has passed.
        // The egress lock goes with the start: released the moment the
        // bundle holds its endpoint, so concurrent launches wait no longer.
        let docker = self.engine.docker.clone();
        let starting = bundle.clone();
        let egress_lock = self.egress_lock.take();
        self.bundle_starting = Some(self.engine.spawn(async move {
            let started = super::bundle::start_watched(&docker, &starting).await;
            drop(egress_lock);
            started
        }));

        self.create_agent(agent)?;
        self.step_done(Step::AgentCreate)?;

        self.provision_files(agent)?;
        // An image without a trust tool gets its CA through the archive
        // API alone, on a thread, while both containers start.
        self.ca_installing = Some(self.spawn_ca_install(agent));
        self.step_done(Step::AgentFiles)?;

        // The agent's keep-alive starts while the bundle is checked; the
        // agent's own checks wait for it.
        let docker = self.engine.docker.clone();
        let starting = agent.clone();
        self.agent_starting = Some(
            self.engine
                .spawn(async move { docker.start_container(&starting, None).await }),
        );
        if let Some(start) = self.bundle_starting.take() {
            let (started, output) = self.engine.block_on(start).unwrap_or_else(|join| {
                let err = std::io::Error::other(join.to_string());
                (Err(bollard::errors::Error::IOError { err }), None)
            });
            self.bundle_output = output;
            started.map_err(|err| self.bundle_start_failed(err))?;
        }
        self.step_done(Step::BundleStart)?;

        self.check_bundle()?;

        if let Some(start) = self.agent_starting.take() {
            self.engine
                .block_on(super::started(start))
                .map_err(DockerError::api(format!("start {agent}")))?;
        }
        self.step_done(Step::AgentStart)?;

        self.verify_agent(network, agent)?;
        self.step_done(Step::AgentVerify)?;

        // An image with a trust tool gets its CA now: the tool runs through
        // an exec.
        let ca = match self.ca_installing.take().map(std::thread::JoinHandle::join) {
            Some(Ok(installed)) => installed?,
            Some(Err(_)) | None => {
                return Err(DockerError::PlanData {
                    detail: "installing the CA panicked".into(),
                });
            }
        };
        let mut warnings = match ca {
            CaInstall::Done(report) => self.report_ca(report, true),
            CaInstall::AfterStart(trust) => {
                let report = self.install_ca(agent, &trust)?;
                self.report_ca(report, false)
            }
        };
        self.step_done(Step::ProvisionCa)?;

        if self.bundle.git.is_empty() {
            self.note("git: no repositories configured, skipped");
        } else {
            let names: Vec<&str> = self.bundle.git.iter().map(|r| r.name.as_str()).collect();
            self.note(&format!(
                "git: {} served by git-gate at http://{}:{}/<name>.git (GIT_GATE_URL)",
                names.join(", "),
                self.bundle.ip,
                bottle_core::bundle::GIT_GATE_PORT
            ));
        }
        self.step_done(Step::ProvisionGit)?;

        self.provision_supervise();
        self.step_done(Step::ProvisionSupervise)?;

        let substrate = DockerResetSubstrate::new(
            self.engine.clone(),
            &self.plan.bottle,
            agent,
            &bundle,
            &self.paths.root,
            crate::data::gvisor_binary_of(self.plan)?,
        );
        // A bottle without reset still runs: the operator is told, and a
        // reset later halts it with "none recorded" rather than pass.
        match reset::record_golden(&substrate, substrate.files()) {
            Ok(_) => self.note("reset: golden snapshot taken"),
            Err(SandboxError::NotAvailable { why, .. }) => {
                warnings.push(format!("reset is unavailable: {why}"));
            }
            Err(err) => warnings.push(format!("reset is unavailable: {err}")),
        }
        self.step_done(Step::Snapshot)?;

        StateDir::new(&self.paths.root).advance(Phase::Running)?;
        self.step_done(Step::Complete)?;

        Ok(DockerBottle {
            engine: self.engine.clone(),
            name: self.plan.bottle.clone(),
            container: agent.clone(),
            default_command: data.default_command.clone(),
            image: data.image_ref.clone(),
            user: (!data.user.is_empty()).then(|| data.user.clone()),
            warnings,
            toolbox: InBoxAgent::new(&self.plan.bottle, &self.plan.state_dir),
            bundle,
            state_dir: self.paths.root.clone(),
            gvisor_binary: crate::data::gvisor_binary_of(self.plan)?,
        })
    }

    fn create_agent(&mut self, agent: &str) -> Result<(), DockerError> {
        let resolv = self.paths.agent_resolv_conf();
        data::write_file(&resolv, config::AGENT_RESOLV_CONF.as_bytes(), 0o644)?;
        let agent_box = self.paths.agent_box();
        let toolbox_note = fill_box(&agent_box, &self.agent().arch, self.plan.isolation)?;
        self.note(&toolbox_note);
        let body = config::agent_container(
            self.plan,
            &resolv.display().to_string(),
            &agent_box.display().to_string(),
            self.labels.for_role(role::AGENT),
        );
        let options = CreateContainerOptionsBuilder::default().name(agent).build();
        let created = self
            .engine
            .block_on(self.engine.docker.create_container(Some(options), body));
        if let Err(err) = created {
            return Err(match (self.plan.disk_bytes, storage_opt_refusal(&err)) {
                (Some(bytes), Some(said)) => DockerError::DiskCapUnsupported {
                    size: bottle_core::disk::format_size(bytes),
                    storage: self.agent().storage.clone(),
                    engine_said: Some(said),
                },
                _ => DockerError::api(format!("create container {agent}"))(err),
            });
        }
        self.undo_container("the agent container", agent);
        Ok(())
    }

    /// Starts, on a thread, the survey of the agent's image (remembered by
    /// image ID) and, when that needs no running box (no trust tool to
    /// run), the CA's install from it. The archive API works on a created
    /// or starting container alike, and nothing of the agent runs before
    /// `provision-ca` joins it.
    fn spawn_ca_install(&self, agent: &str) -> super::CaInstalling {
        let engine = self.engine.clone();
        let container = agent.to_string();
        let image_id = self.agent().image_id.clone();
        let surveys = self.settings.ca_surveys.clone();
        let cert_path = self.paths.ca_cert();
        std::thread::spawn(move || {
            let mut target = ContainerBox::new(&engine, &container);
            let trust = match surveys.lookup(&image_id) {
                Some(trust) => trust,
                None => {
                    let trust = ca_install::survey(&mut target)?;
                    surveys.store(&image_id, &trust);
                    trust
                }
            };
            if trust.runs_a_tool() {
                return Ok(CaInstall::AfterStart(trust));
            }
            let cert = std::fs::read(&cert_path).map_err(DockerError::io("read", cert_path))?;
            Ok(CaInstall::Done(ca_install::install_surveyed(
                &mut target,
                &cert,
                &trust,
            )?))
        })
    }

    /// Installs the bundle's CA as [`bottle_core::ca_install`] defines:
    /// files through the archive API (no shell needed), the image's trust
    /// tool through an exec as root.
    fn install_ca(
        &self,
        agent: &str,
        trust: &ca_install::ImageTrust,
    ) -> Result<ca_install::CaInstallReport, DockerError> {
        let cert_path = self.paths.ca_cert();
        let cert = std::fs::read(&cert_path).map_err(DockerError::io("read", cert_path))?;
        let mut target = ContainerBox::new(self.engine, agent);
        ca_install::install_surveyed(&mut target, &cert, trust)
    }

    /// Says where the CA went; returns the report's warnings.
    fn report_ca(&self, report: ca_install::CaInstallReport, before_start: bool) -> Vec<String> {
        let when = if before_start {
            " (while the containers started)"
        } else {
            ""
        };
        self.note(&format!(
            "ca: installed at {}{when}",
            report.installed.join(", ")
        ));
        if !report.ran.is_empty() {
            self.note(&format!("ca: ran {}", report.ran.join(", ")));
        }
        if !report.emulated.is_empty() {
            self.note(&format!(
                "ca: wrote what {} would (it has no hooks and no other local anchor to act on)",
                report.emulated.join(", ")
            ));
        }
        report.warnings
    }

    /// The MCP config naming supervise went in with the agent's files
    /// (`agent-files`); this step reports it.
    fn provision_supervise(&self) {
        let address = self.bundle.ip.to_string();
        self.note(&format!(
            "supervise: MCP at {} (MCP_SUPERVISE_URL), config in {}",
            bottle_core::bundle::supervise_url(&address),
            bottle_core::bundle::AGENT_MCP_CONFIG
        ));
    }

    /// Puts what every box receives (`bottle_core::agent_box`) into the
    /// created agent in one upload, with a gVisor box's `/tmp` ahead of it.
    fn provision_files(&self, agent: &str) -> Result<(), DockerError> {
        let data = self.agent();
        let mut files = Vec::new();
        if self.plan.isolation == Isolation::Gvisor {
            // gVisor mounts a tmpfs of its own over an empty /tmp at boot,
            // which the host (`bottle cp`, the reset's snapshot) never sees:
            // a /tmp that is not empty stays the box's own directory, as in
            // a container.
            files.push(root_dir("/tmp", 0o1777));
            files.push(root_dir(GVISOR_TMP_KEEP, 0o755));
        }
        files.extend(agent_box::agent_files(&agent_box::AgentFileInputs {
            bundle_address: self.bundle.ip,
            prompt: data.prompt.as_deref(),
            skills: &data.skills,
        }));
        let mut target = ContainerBox::new(self.engine, agent);
        agent_box::provision(&mut target, &files)?.map_err(|refused| {
            DockerError::AgentFilesRefused {
                container: agent.to_string(),
                reason: refused.0,
            }
        })?;
        match &data.prompt {
            Some(_) => self.note(&format!("prompt: copied to {AGENT_PROMPT_PATH}")),
            None => self.note("prompt: none configured, skipped"),
        }
        match data.skills.len() {
            0 => self.note("skills: none configured, skipped"),
            n => self.note(&format!("skills: {n} copied under {AGENT_SKILLS_DIR}")),
        }
        Ok(())
    }

    /// Fails closed unless the agent runs on the bottle network only, at
    /// its pinned address, with every capability dropped and no privilege
    /// gain, under the runtime its tier asks for; a gVisor box must also
    /// be gVisor's on the host and inside ([`crate::gvisor`]).
    fn verify_agent(&self, network: &str, agent: &str) -> Result<(), DockerError> {
        self.check_network(network)?;
        let inspect = self.block(&format!("inspect container {agent}"), async {
            self.engine.docker.inspect_container(agent, None).await
        })?;
        // A gVisor box under another runtime is not a confinement that
        // differs but one that is missing: its own code.
        if let Some(binary) = crate::data::gvisor_binary_of(self.plan)? {
            let kernel = self.confirm_gvisor(agent, &inspect, &binary)?;
            self.note(&format!("gvisor: the box's kernel is {kernel}"));
        }
        isolation::check_agent(network, &inspect, self.agent().ip)
            .map_err(|what| DockerError::IsolationUnconfirmed { what })?;
        Ok(())
    }

    /// The Engine runs the box under the plan's gVisor runtime, the host
    /// kernel sees gVisor's sandbox as the container's process, and the
    /// box's own `uname(2)` answers with a kernel that is not the host's.
    /// Returns the box's kernel.
    fn confirm_gvisor(
        &self,
        agent: &str,
        inspect: &bollard::models::ContainerInspectResponse,
        binary: &std::path::Path,
    ) -> Result<String, DockerError> {
        let refused = |what: String| DockerError::NotUnderGvisor { what };
        let runtime = self.agent().runtime.as_deref().unwrap_or_default();
        crate::gvisor::check_host_side(inspect, runtime, binary).map_err(refused)?;
        let (release, version) = crate::gvisor::host_kernel().map_err(refused)?;
        let out = self.engine.block_on(exec_captured(
            self.engine,
            agent,
            &[UNAME_PATH.to_string()],
            Some(crate::names::KEEPALIVE_USER),
        ))?;
        crate::gvisor::check_box_kernel(&out.stdout, out.exit_code, &release, &version)
            .map_err(refused)
    }
}

/// Where the agent's CA install stands once its files are in.
pub(super) enum CaInstall {
    /// Installed while the containers started (the image has no trust
    /// tool).
    Done(ca_install::CaInstallReport),
    /// To install after the start, from this survey: a tool runs.
    AfterStart(ca_install::ImageTrust),
}

/// The agent container as [`agent_box`] and [`ca_install`] see it. Writes,
/// puts and links are held back in one archive and extracted together at
/// a flush (each upload is a round trip that waits for the container's
/// lock, which a starting container holds); reading a path that is held
/// back flushes first, and a refusal met there is what the next flush
/// answers.
struct ContainerBox<'a> {
    engine: &'a Engine,
    container: &'a str,
    held: Option<TarBuilder>,
    held_paths: Vec<String>,
    refused: Option<Refused>,
    /// The agent's user as the image names it, looked up at the first
    /// file that is the agent's.
    agent_owner: Option<Ownership>,
}

impl<'a> ContainerBox<'a> {
    fn new(engine: &'a Engine, container: &'a str) -> ContainerBox<'a> {
        ContainerBox {
            engine,
            container,
            held: None,
            held_paths: Vec::new(),
            refused: None,
            agent_owner: None,
        }
    }

    /// Who owns a file that is `owner`'s in this container.
    fn ownership(&mut self, owner: FileOwner) -> Result<Ownership, DockerError> {
        Ok(match owner {
            FileOwner::Root => Ownership::ROOT,
            FileOwner::Agent => match self.agent_owner {
                Some(owner) => owner,
                None => *self
                    .agent_owner
                    .insert(container_owner(self.engine, self.container)?),
            },
        })
    }

    /// The archive writes are held back in, with `path` recorded.
    fn hold(&mut self, path: &str) -> &mut TarBuilder {
        self.held_paths.push(path.to_string());
        self.held.get_or_insert_with(TarBuilder::new)
    }

    /// Extracts what is held back at the container's root, keeping a
    /// refusal for [`AgentBox::flush`] to answer.
    fn extract_held(&mut self) -> Result<(), DockerError> {
        let Some(tar) = self.held.take() else {
            return Ok(());
        };
        let paths = std::mem::take(&mut self.held_paths).join(", ");
        let options = UploadToContainerOptionsBuilder::default().path("/").build();
        let uploaded = self.engine.block_on(self.engine.docker.upload_to_container(
            self.container,
            Some(options),
            bollard::body_full(tar.finish()?.into()),
        ));
        match uploaded {
            Ok(()) => Ok(()),
            // The daemon answered: it could not extract these files there
            // (a read-only directory, no room left).
            Err(bollard::errors::Error::DockerResponseServerError { message, .. }) => {
                self.refused.get_or_insert(Refused(message));
                Ok(())
            }
            Err(err) => Err(DockerError::api(format!(
                "copy {paths} into {}",
                self.container
            ))(err)),
        }
    }
}

impl AgentBox for ContainerBox<'_> {
    type Error = DockerError;

    fn entry(&mut self, path: &str) -> Result<Entry, DockerError> {
        if self.held_paths.iter().any(|held| held == path) {
            self.extract_held()?;
        }
        container_entry(self.engine, self.container, path)
    }

    fn write(
        &mut self,
        path: &str,
        contents: &[u8],
        mode: u32,
    ) -> Result<Result<(), Refused>, DockerError> {
        self.hold(path)
            .file(&entry_name(path), contents, mode, Ownership::ROOT)?;
        Ok(Ok(()))
    }

    fn put(&mut self, file: &BoxFile) -> Result<Result<(), Refused>, DockerError> {
        let owner = self.ownership(file.owner)?;
        let name = entry_name(&file.path);
        let tar = self.hold(&file.path);
        match &file.contents {
            Contents::Dir { mode } => tar.dir(&name, *mode, owner)?,
            Contents::File { bytes, mode } => tar.file(&name, bytes, *mode, owner)?,
            Contents::Host(host) => tar.host_path(host, &name, owner)?,
        }
        Ok(Ok(()))
    }

    fn symlink(&mut self, path: &str, target: &str) -> Result<Result<(), Refused>, DockerError> {
        self.hold(path)
            .symlink(&entry_name(path), target, Ownership::ROOT)?;
        Ok(Ok(()))
    }

    fn flush(&mut self) -> Result<Result<(), Refused>, DockerError> {
        self.extract_held()?;
        Ok(match self.refused.take() {
            Some(refused) => Err(refused),
            None => Ok(()),
        })
    }

    fn dir_has_entries(&mut self, dir: &str) -> Result<bool, DockerError> {
        container_dir_has_entries(self.engine, self.container, dir)
    }

    fn run(&mut self, argv: &[&str], timeout: std::time::Duration) -> Result<ToolRun, DockerError> {
        // A tool reads what was written before it.
        self.extract_held()?;
        let argv: Vec<String> = argv.iter().map(|a| a.to_string()).collect();
        // Built inside the runtime: a timer needs its reactor.
        let ran = self.engine.block_on(async {
            tokio::time::timeout(
                timeout,
                exec_captured(self.engine, self.container, &argv, Some("0:0")),
            )
            .await
        });
        Ok(match ran {
            Err(_) => ToolRun::TimedOut,
            Ok(Err(err)) => ToolRun::CouldNotRun(err.to_string()),
            Ok(Ok(out)) => ToolRun::Exited {
                code: out.exit_code,
                stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            },
        })
    }
}

/// A root-owned directory a box receives.
fn root_dir(path: &str, mode: u32) -> BoxFile {
    BoxFile {
        path: path.to_string(),
        contents: Contents::Dir { mode },
        owner: FileOwner::Root,
    }
}

/// The in-box agent's mode in a gVisor box: readable, because gVisor
/// cannot execute a program its caller cannot read.
const GVISOR_TOOLBOX_MODE: u32 = 0o555;

/// Fills the agent's box directory on the host, mounted read-only at
/// `/.bottle`: the keep-alive program, and the in-box agent when one is
/// found (execute-only, [`TOOLBOX_MODE`]), and in a gVisor box the
/// kernel-identity program ([`UNAME_PATH`]). Returns the note saying which
/// in-box agent. The directory is world-searchable: the keep-alive runs as
/// a uid of its own.
fn fill_box(
    dir: &std::path::Path,
    arch: &str,
    isolation: Isolation,
) -> Result<String, DockerError> {
    use std::os::unix::fs::PermissionsExt as _;
    let unsupported = || DockerError::UnsupportedArch {
        arch: arch.to_string(),
    };
    let pause = pause_elf(arch).ok_or_else(unsupported)?;
    let program = |path: &str| dir.join(path.rsplit('/').next().unwrap_or(path));
    data::write_file(&program(PAUSE_PATH), &pause, 0o555)?;
    if isolation == Isolation::Gvisor {
        // Asks the box's kernel who it is, at the launch's check.
        let uname = uname_elf(arch).ok_or_else(unsupported)?;
        data::write_file(&program(UNAME_PATH), &uname, 0o555)?;
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))
        .map_err(DockerError::io("set permissions of", dir))?;
    Ok(match bottle_core::bundle_binary::find_toolbox() {
        Ok(binary) => {
            // gVisor (20221219) loads a program with its caller's
            // credentials and cannot run one they cannot read: there the
            // in-box agent is readable and makes itself non-dumpable with
            // its first instructions (docs/SECURITY.md, gVisor).
            let mode = match isolation {
                Isolation::Container => TOOLBOX_MODE,
                Isolation::Gvisor => GVISOR_TOOLBOX_MODE,
            };
            data::write_file(&program(TOOLBOX_PATH), &binary.bytes, mode)?;
            format!("toolbox: {} at {TOOLBOX_PATH}", binary.path.display())
        }
        Err(why) => format!(
            "toolbox: not installed, `bottle execute` is unavailable: {}",
            escape_for_terminal(&why)
        ),
    })
}

/// The daemon's refusal of a container's `StorageOpt`, if that is what
/// `err` is: overlay2 answers "--storage-opt is supported only for overlay
/// over xfs with 'pquota' mount option", other drivers name the option
/// similarly. Only this refusal means "the storage cannot cap the layer".
fn storage_opt_refusal(err: &bollard::errors::Error) -> Option<String> {
    match err {
        bollard::errors::Error::DockerResponseServerError { message, .. }
            if message.contains("storage-opt") || message.contains("StorageOpt") =>
        {
            Some(message.clone())
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_storage_opt_refusal_is_a_disk_cap_refusal() {
        let server = |message: &str| bollard::errors::Error::DockerResponseServerError {
            status_code: 500,
            message: message.into(),
        };
        let pquota =
            "--storage-opt is supported only for overlay over xfs with 'pquota' mount option";
        assert_eq!(
            storage_opt_refusal(&server(pquota)).as_deref(),
            Some(pquota)
        );
        assert_eq!(storage_opt_refusal(&server("No such image: x")), None);
        assert_eq!(
            storage_opt_refusal(&bollard::errors::Error::RequestTimeoutError),
            None
        );
    }
}
