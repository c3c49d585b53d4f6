//! `bottle start`: plan, confirm, launch (planning again when a launch
//! running at the same time took the plan's subnet), then hand the agent's
//! command to a session or run it attached.

use std::path::Path;
use std::process::ExitCode;

use bottle_core::display::escape_for_terminal;
use bottle_core::timeline::Timeline;
use bottle_core::{BottleLauncher, BottleSpec, Plan, slug};

use crate::args::{Global, StartArgs};
use crate::backends;
use crate::devices;
use crate::failure::{EXIT_DECLINED, Failure};
use crate::interrupt::launch_interruptibly;
use crate::lookup::{spec_for, state_root};
use crate::output::{self, note, out};
use crate::prompt::confirm;

/// `bottle start`.
pub(crate) fn start(global: &Global, args: &StartArgs) -> Result<ExitCode, Failure> {
    let timeline = args.timings.then(Timeline::new);
    let lap = |name: &str| {
        if let Some(timeline) = &timeline {
            timeline.lap(name);
        }
    };
    let kind = backends::selected(global)?;
    let spec = spec_for(global, &args.agent, args.name.as_deref())?;
    let resolved = devices::resolve(&spec)?;
    lap("load-manifest");
    let backend = backends::open(
        kind,
        global,
        backends::Mode {
            detach: args.detach,
            timeline: timeline.clone(),
        },
    )?;
    backend.preflight()?;
    lap("preflight");
    let started = Started {
        global,
        args,
        timeline: timeline.as_ref(),
    };
    match &backend {
        backends::AnyBackend::Docker(b) => started.claimed_or_cold(b, &spec, &resolved),
        backends::AnyBackend::Smolmachines(b) => started.claimed_or_cold(b, &spec, &resolved),
    }
}

/// One `bottle start`: the operator's options and, with `--timings`, the
/// timeline its phases are recorded on.
pub(crate) struct Started<'a> {
    pub(crate) global: &'a Global,
    pub(crate) args: &'a StartArgs,
    timeline: Option<&'a Timeline>,
}

impl Started<'_> {
    pub(crate) fn lap(&self, name: &str) {
        if let Some(timeline) = self.timeline {
            timeline.lap(name);
        }
    }

    /// With `--timings`, the timeline on stderr (never mixed with the
    /// agent's output on stdout, and whatever `--quiet` says: the operator
    /// asked for it).
    fn print_timings(&self) {
        if let Some(timeline) = self.timeline {
            output::err_bytes(format!("timings:\n{}", timeline.render()).as_bytes());
        }
    }

    /// `start` on one backend: prepare, show, confirm, launch, attach.
    /// Starts a pooled bottle of the agent when one passes its claim's
    /// checks, otherwise cold. A bottle named by the operator is always
    /// started cold: a pool entry's name cannot change.
    fn claimed_or_cold<B: bottle_core::pool::WarmPool>(
        &self,
        backend: &B,
        spec: &BottleSpec,
        resolved: &bottle_core::devices::ResolvedDevices,
    ) -> Result<ExitCode, Failure> {
        if self.args.name.is_none()
            && let Some(code) = start_claimed(backend, self, spec, resolved)?
        {
            return Ok(code);
        }
        self.on(backend, spec, resolved)
    }

    fn on<B: BottleLauncher>(
        &self,
        backend: &B,
        spec: &BottleSpec,
        resolved: &bottle_core::devices::ResolvedDevices,
    ) -> Result<ExitCode, Failure> {
        let global = self.global;
        let kind = backend.kind();
        let plan_for = |spec: &BottleSpec| -> Result<Plan<B::PlanData>, Failure> {
            let mut plan = backend.prepare(spec)?;
            resolved.fill_plan(&mut plan, Path::new("/"));
            if !kind.supports_devices() {
                plan.devices.clear();
            }
            Ok(plan)
        };
        let mut plan = plan_for(spec)?;
        for warning in &resolved.warnings {
            note(global.quiet, &format!("warning: {warning}"));
        }
        if !kind.supports_devices()
            && let Some(warning) = bottle_core::devices::unsupported_warning(kind, resolved)
        {
            note(global.quiet, &format!("warning: {warning}"));
        }
        self.lap("prepare");
        if !global.quiet || !global.yes {
            output::err(&format!("{}\n{}", plan.bottle, plan.render()));
        }
        if !global.yes && !confirm("start this bottle?")? {
            note(global.quiet, "not started");
            return Ok(ExitCode::from(EXIT_DECLINED));
        }
        self.lap("confirm");
        let mut launched = launch_interruptibly(backend, &plan);
        // Bottles started at the same time can plan the same free subnet;
        // the later launch finds it taken before it creates anything. Under
        // `-y` a fresh plan is what starting again would run, so plan again.
        for _ in 0..PLAN_TAKEN_REPLANS {
            match &launched {
                Err(failed) if global.yes && failed.plan_taken => {
                    note(
                        global.quiet,
                        "the planned subnet was taken by a launch running at the same time: planning again",
                    );
                    plan = plan_for(spec)?;
                    launched = launch_interruptibly(backend, &plan);
                }
                _ => break,
            }
        }
        let bottle = launched.map_err(|failed| failed.failure)?;
        self.lap("launched");
        for warning in bottle.launch_warnings() {
            note(global.quiet, &format!("warning: {warning}"));
        }
        let forwards = crate::forward::Forward::of_plan(&plan.publish, &plan.host_services);
        self.run_agent(backend, bottle, &plan.command, &forwards)
    }

    /// The end of `start` for a launched (or claimed) bottle: hand the
    /// agent's `command` to a detached session and print the name, or run
    /// it attached and stop the bottle when it ends.
    ///
    /// First the host's side of its published ports and host services
    /// (`forwards`): a port that cannot be published fails the start, and
    /// the bottle is removed.
    pub(crate) fn run_agent(
        &self,
        backend: &dyn bottle_core::BottleBackend,
        bottle: Box<dyn bottle_core::Bottle>,
        command: &[String],
        forwards: &[crate::forward::Forward],
    ) -> Result<ExitCode, Failure> {
        let global = self.global;
        let kind = backend.kind();
        let state_dir = crate::lookup::state_dir_of(bottle.name())?;
        match crate::forward::spawn_all(
            &bottle_core::exec::SystemRunner,
            &state_dir,
            kind,
            bottle.name(),
            forwards,
        ) {
            Ok(records) => {
                for record in records
                    .iter()
                    .filter(|r| r.kind == crate::forward::KIND_PORT)
                {
                    note(
                        global.quiet,
                        &format!(
                            "the agent's port {} is on http://{}",
                            record.port, record.listen
                        ),
                    );
                }
            }
            Err(failure) => {
                let name = bottle.name().to_string();
                drop(bottle);
                let _ = backend.stop(&name);
                return Err(failure);
            }
        }
        self.lap("forwards");
        if self.args.detach {
            let name = bottle.name().to_string();
            let preparable = bottle.reset_is_preparable();
            drop(bottle);
            let paths = bottle_core::state::SessionPaths::new(&state_root()?, slug::slug_of(&name));
            if let Err(failure) = crate::session::spawn_host(
                &bottle_core::exec::SystemRunner,
                &paths,
                kind,
                &name,
                command,
            ) {
                // A detached start whose agent does not run leaves nothing
                // behind: it says why, and the bottle goes.
                crate::session::end(&paths);
                crate::forward::end_all(&state_dir);
                let _ = backend.stop(&name);
                return Err(failure);
            }
            self.lap("session-spawn");
            // The first reset's standby, made in the background. Not for an
            // attached agent: its bottle is stopped when the agent ends,
            // and a plain stop does not wait for a preparation.
            if preparable && let Err(why) = crate::reset::spawn_prepare(&name, kind) {
                note(global.quiet, &crate::reset::prepare_warning(&name, &why));
            }
            self.print_timings();
            out(&format!("{name}\n"));
            note(
                global.quiet,
                &format!(
                    "the agent runs in the background:\n  bottle attach {name}   join it (detach: ctrl-p ctrl-q)\n  bottle logs {name}     its audit log\n  bottle stop {name}     end it and remove the bottle"
                ),
            );
            return Ok(ExitCode::SUCCESS);
        }
        self.print_timings();
        let watcher = crate::checkout::Watcher::start(&state_dir);
        let code = bottle.exec_interactive(command);
        let name = bottle.name().to_string();
        drop(bottle);
        crate::forward::end_all(&state_dir);
        // The agent is done: what it pushed goes into the checkouts before
        // the stop removes the mirrors.
        if let Some(watcher) = watcher {
            crate::checkout::print_report(global, &watcher.finish());
        }
        let stopped = backend.stop(&name);
        let code = code?;
        stopped?;
        Ok(ExitCode::from(u8::try_from(code).unwrap_or(1)))
    }
}

/// How many times `start -y` plans again after a launch found its plan
/// taken ([`bottle_core::backend::BackendErrorKind::PlanTaken`]); each new plan skips every
/// network that exists by then, so a few suffice even for dozens of
/// simultaneous starts.
const PLAN_TAKEN_REPLANS: usize = 8;

/// `start` of a pooled bottle ([`bottle_core::pool`] holds the entries):
/// claims a ready entry of the agent made
/// from what a cold start would use, shows its plan and asks as `start`
/// does, then runs the agent. `None` when no entry passed the claim's
/// checks: the caller starts cold (each refused entry is named and was
/// removed).
pub(crate) fn start_claimed<B: bottle_core::pool::WarmPool>(
    backend: &B,
    started: &Started,
    spec: &BottleSpec,
    resolved: &bottle_core::devices::ResolvedDevices,
) -> Result<Option<ExitCode>, Failure> {
    // A working checkout's mirror is made at launch, so no pool entry can
    // serve one (`pool fill` refuses to make them).
    let serves_checkout = spec.agent.git.iter().any(|repo| {
        bottle_core::checkout::RepoKind::of_url(&repo.url)
            == Some(bottle_core::checkout::RepoKind::Checkout)
    });
    if serves_checkout {
        return Ok(None);
    }
    let root = state_root()?;
    let any_ready = bottle_core::pool::list(&root)
        .iter()
        .any(|e| e.backend == backend.kind() && e.agent == spec.agent_name && e.state == "ready");
    if !any_ready {
        return Ok(None);
    }
    let mut devices = Plan::from_spec(spec, backend.kind(), spec.agent.memory_bytes());
    resolved.fill_plan(&mut devices, Path::new("/"));
    let fingerprint = backend.pool_fingerprint(spec, &devices.devices)?;
    let (global, args) = (started.global, started.args);
    let claim = backend.claim_pooled(&spec.agent_name, &fingerprint, args.detach)?;
    started.lap("claim");
    for (name, why) in &claim.refused {
        note(
            global.quiet,
            &format!(
                "warning: pooled bottle {name} refused and removed: {}",
                escape_for_terminal(why)
            ),
        );
    }
    let Some((bottle, plan)) = claim.bottle else {
        if !claim.refused.is_empty() {
            note(
                global.quiet,
                "no pooled bottle passed its checks: starting cold",
            );
        }
        return Ok(None);
    };
    if !global.quiet || !global.yes {
        output::err(&format!("{}\n{}", plan.bottle, plan.render()));
    }
    if !global.yes && !confirm("start this bottle?")? {
        drop(bottle);
        let _ = bottle_core::BottleBackend::stop(backend, &plan.bottle);
        note(global.quiet, "not started (the pooled bottle was removed)");
        return Ok(Some(ExitCode::from(EXIT_DECLINED)));
    }
    note(
        global.quiet,
        &format!("claimed pooled bottle {}", plan.bottle),
    );
    // The refill competes with the agent for the daemon: a detached agent
    // is running once `run_agent` returns; an attached one holds the
    // terminal until it ends, so its refill starts first.
    let refill = spec.agent.pool.is_some();
    if refill && !args.detach {
        crate::pool::spawn_refill(global, spec, backend.kind());
    }
    let forwards = crate::forward::Forward::of_plan(&plan.publish, &plan.host_services);
    let code = started.run_agent(backend, bottle, &plan.command, &forwards)?;
    if refill && args.detach {
        crate::pool::spawn_refill(global, spec, backend.kind());
    }
    Ok(Some(code))
}
