//! Dispatches each command: the small ones are here, the rest (`start`,
//! `stop`, `cp` …) in modules of their own. Parse → validate → plan → act.

use std::io;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use bottle_core::audit_files;
use bottle_core::{BottleInfo, Plan, slug};

use crate::args::{
    CleanupArgs, Cli, Command, CommitArgs, CompletionsArgs, ExecArgs, Global, PlanArgs, PortArgs,
};
use crate::backends;
use crate::devices;
use crate::failure::{EXIT_DECLINED, EXIT_USAGE, Failure};
use crate::lookup::{
    backends_to_ask, find_bottle, find_bottle_and_backend, load_manifest, spec_for, state_root,
};
use crate::output::{self, note, out};
use crate::prompt::confirm_to;

/// Runs one command.
pub(crate) fn run(cli: Cli) -> Result<ExitCode, Failure> {
    let global = &cli.global;
    match cli.command {
        Command::Check => check(global),
        Command::Plan(args) => plan(global, &args),
        Command::Start(args) => crate::start::start(global, &args),
        Command::List => list(global),
        Command::Stop(args) => crate::stop::stop(global, &args.bottle, args.wait),
        Command::Sync(args) => crate::checkout::sync_command(global, &args.bottle),
        Command::Cleanup(args) => cleanup(global, &args),
        Command::Attach(args) => {
            crate::session::attach::run(global, &args.bottle, args.detach_keys)
        }
        Command::SessionHost(args) => {
            crate::session::host::run(global, &args.bottle, &args.command)
        }
        Command::FinishStop(args) => crate::stop::finish(global, &args.bottle),
        Command::RefillPool(args) => crate::pool::refill(global, &args.agent),
        Command::PrepareReset(args) => crate::reset::prepare(global, &args.bottle),
        Command::Exec(args) => exec(global, &args),
        Command::Execute(args) => crate::execute::run(global, &args),
        Command::Cp(args) => crate::cp::run(global, &args),
        Command::Commit(args) => commit(global, &args),
        Command::Port(args) => port(global, &args),
        Command::Forward(args) => crate::forward::run(global, &args),
        Command::Reset(args) => crate::reset::reset(global, &args),
        Command::Logs(args) => crate::logs::logs(global, &args, &state_root()?),
        Command::Requests(args) => crate::requests::list(global, &args, &state_root()?),
        Command::Approve(args) => crate::requests::decide(
            global,
            &args,
            bottle_core::requests::Status::Approved,
            &state_root()?,
        ),
        Command::Deny(args) => crate::requests::decide(
            global,
            &args,
            bottle_core::requests::Status::Denied,
            &state_root()?,
        ),
        Command::Doctor => doctor(global),
        Command::Serve(args) => crate::serve::run(global, &args),
        Command::Pool(args) => crate::pool::run(global, &args),
        Command::Completions(args) => completions(&args),
    }
}

fn check(global: &Global) -> Result<ExitCode, Failure> {
    let manifest = load_manifest(global)?;
    let agents: Vec<&str> = manifest.agents.keys().map(String::as_str).collect();
    out(&format!(
        "{}: ok ({} agent{}: {})\n",
        global.manifest.display(),
        agents.len(),
        if agents.len() == 1 { "" } else { "s" },
        agents.join(", ")
    ));
    Ok(ExitCode::SUCCESS)
}

fn plan(global: &Global, args: &PlanArgs) -> Result<ExitCode, Failure> {
    let kind = backends::selected(global)?;
    let spec = spec_for(global, &args.agent, args.name.as_deref())?;
    let mut plan = Plan::from_spec(&spec, kind, spec.agent.memory_bytes());
    let resolved = devices::resolve(&spec)?;
    resolved.fill_plan(&mut plan, Path::new("/"));
    // The disk cap is the one backend fact the operator needs before
    // `start`: whether the daemon's storage can hold it at all.
    if kind == bottle_core::BackendKind::Docker {
        let runner = bottle_core::exec::SystemRunner;
        let context = bottle_preflight::Context::from_host(&runner, kind);
        if let Ok((cap, _)) = bottle_docker::host_checks::storage(&context) {
            plan.backend_lines
                .push(("disk".into(), cap.plan_line(plan.disk_bytes)));
        }
    }
    for warning in &resolved.warnings {
        note(global.quiet, &format!("warning: {warning}"));
    }
    if global.json {
        output::json(&plan)?;
    } else {
        out(&format!(
            "plan for {} (backend-specific resources are resolved by `bottle start`):\n{}",
            plan.bottle,
            plan.render()
        ));
    }
    Ok(ExitCode::SUCCESS)
}

fn list(global: &Global) -> Result<ExitCode, Failure> {
    let mut all = Vec::new();
    for backend in backends_to_ask(global)? {
        all.extend(backend.list_active()?);
    }
    if let Ok(root) = state_root() {
        read_host_state(&root, &mut all);
    }
    if global.json {
        output::json(&all)?;
        return Ok(ExitCode::SUCCESS);
    }
    if all.is_empty() {
        note(global.quiet, "no bottles running");
        return Ok(ExitCode::SUCCESS);
    }
    out(&list_table(&all));
    Ok(ExitCode::SUCCESS)
}

/// What the host's state dirs say of each bottle, the same for every
/// backend: its pending requests and whether its audit log is written.
fn read_host_state(state_root: &Path, bottles: &mut [BottleInfo]) {
    for b in bottles {
        b.pending_requests = crate::requests::pending_count(state_root, &b.name);
        b.audit = audit_files::audit_health(
            &state_root
                .join(slug::slug_of(&b.name))
                .join(audit_files::AUDIT_LOG_DIR),
        );
        b.agent_running = crate::session::agent_running(&bottle_core::state::SessionPaths::new(
            state_root,
            slug::slug_of(&b.name),
        ));
        b.ports = crate::forward::open_ports(&state_root.join(slug::slug_of(&b.name)));
    }
}

fn list_table(bottles: &[BottleInfo]) -> String {
    let rows: Vec<Vec<String>> = bottles
        .iter()
        .map(|b| {
            vec![
                b.name.clone(),
                b.agent.clone(),
                b.backend.to_string(),
                b.state.clone(),
                b.bundle_address.clone().unwrap_or_else(|| "-".into()),
                b.pending_requests.to_string(),
                b.audit.to_string(),
                match b.agent_running {
                    Some(true) => "running",
                    Some(false) => "exited",
                    None => "-",
                }
                .to_string(),
                ports_cell(&b.ports),
            ]
        })
        .collect();
    output::table(
        &[
            "NAME", "AGENT", "BACKEND", "STATE", "BUNDLE", "PENDING", "AUDIT", "SESSION", "PORTS",
        ],
        &rows,
    )
}

/// A bottle's open ports for the table: `8000->127.0.0.1:13000`, comma
/// separated; `-` for none.
fn ports_cell(ports: &[bottle_core::backend::OpenPort]) -> String {
    if ports.is_empty() {
        return "-".into();
    }
    ports
        .iter()
        .map(|p| format!("{}->{}", p.port, p.listen))
        .collect::<Vec<_>>()
        .join(",")
}

/// `bottle cleanup`: lists what this install left behind (never another
/// install's, never anything in use), asks, then removes what was listed
/// and still qualifies.
fn cleanup(global: &Global, args: &CleanupArgs) -> Result<ExitCode, Failure> {
    let root = state_root()?;
    // Old audit logs need no backend: they are pruned even where none runs.
    let cutoff = args.logs_older_than.map(crate::logs::cutoff);
    let logs = match &cutoff {
        Some(cutoff) => crate::logs::prunable(&root, cutoff)?,
        None => Vec::new(),
    };
    let mut plans = Vec::new();
    for backend in backends_to_ask(global)? {
        let items = backend.cleanup_plan()?;
        plans.push((backend, items));
    }
    // The host's side of ports and host services of bottles that are gone
    // from every backend, whichever this cleanup was asked about.
    let forwards = match running_everywhere(global) {
        Some(running) => crate::forward::leftovers(&root, &running),
        None => Vec::new(),
    };
    let found =
        logs.len() + forwards.len() + plans.iter().map(|(_, items)| items.len()).sum::<usize>();
    if found == 0 {
        out("cleanup: nothing to remove\n");
        return Ok(ExitCode::SUCCESS);
    }
    if !global.quiet || !global.yes {
        let mut list = String::from("cleanup would remove:\n");
        for (backend, items) in &plans {
            for item in items {
                let line = bottle_core::display::escape_for_terminal(&item.line()).into_owned();
                list.push_str(&format!("  {}: {line}\n", backend.kind()));
            }
        }
        for dir in &forwards {
            list.push_str(&format!("  {}\n", crate::forward::leftover_line(dir)));
        }
        for run in &logs {
            list.push_str(&format!("  audit log {}\n", run.display()));
        }
        output::err(&list);
    }
    if !global.yes && !confirm_to("remove these?", "the cleanup", "clean up")? {
        note(global.quiet, "nothing removed");
        return Ok(ExitCode::from(EXIT_DECLINED));
    }
    let mut removed = 0;
    for (backend, items) in &plans {
        // What the agent of a bottle about to go pushed into a working
        // checkout's mirror comes home first.
        for item in items {
            let dir = match item.kind.as_str() {
                "state dir" => PathBuf::from(&item.name),
                _ => root.join(slug::slug_of(&item.name)),
            };
            crate::checkout::print_report(global, &crate::checkout::sync_quietly(&dir));
            // Only a bottle's own item names its state dir: a shared
            // network's or an image's name is no bottle's.
            if matches!(item.kind.as_str(), "bottle" | "state dir" | "pool entry") {
                crate::forward::end_all(&dir);
            }
        }
        let report = backend.cleanup_approved(items)?;
        for line in &report.removed {
            note(global.quiet, &format!("removed {line}"));
        }
        for line in &report.kept {
            note(global.quiet, &format!("kept {line}"));
        }
        for line in &report.failed {
            note(false, &format!("could not remove {line}"));
        }
        removed += report.removed.len();
    }
    for line in crate::forward::cleanup(&forwards) {
        note(global.quiet, &format!("removed {line}"));
        removed += 1;
    }
    if let Some(cutoff) = &cutoff {
        let pruned = crate::logs::prune(&root, cutoff)?;
        for run in &pruned {
            note(
                global.quiet,
                &format!("removed audit log {}", run.display()),
            );
        }
        removed += pruned.len();
    }
    out(&format!("cleanup: removed {removed} resource(s)\n"));
    Ok(ExitCode::SUCCESS)
}

/// The names of the bottles every backend runs; `None` when a backend
/// cannot say (it does not open here, or its listing failed), so that no
/// bottle of it is taken for gone.
fn running_everywhere(global: &Global) -> Option<Vec<String>> {
    let mut running = Vec::new();
    for kind in bottle_core::BackendKind::ALL {
        let backend = backends::open(kind, global, backends::Mode::default()).ok()?;
        backend.preflight().ok()?;
        running.extend(backend.list_active().ok()?.into_iter().map(|b| b.name));
    }
    Some(running)
}

fn exec(global: &Global, args: &ExecArgs) -> Result<ExitCode, Failure> {
    let bottle = find_bottle(global, &args.bottle)?;
    if args.tty {
        let code = bottle.exec_interactive(&args.command)?;
        return Ok(ExitCode::from(u8::try_from(code).unwrap_or(1)));
    }
    let code = bottle.exec_piped(&args.command)?;
    Ok(ExitCode::from(u8::try_from(code).unwrap_or(1)))
}

/// `bottle commit BOTTLE IMAGE`: the image, and what of bottle's it left
/// out.
fn commit(global: &Global, args: &CommitArgs) -> Result<ExitCode, Failure> {
    let bottle = find_bottle(global, &args.bottle)?;
    let report = bottle.commit(&args.image)?;
    for line in &report.removed {
        let line = bottle_core::display::escape_for_terminal(line).into_owned();
        note(global.quiet, &format!("left out {line}"));
    }
    if global.json {
        output::json(&report)?;
    } else {
        out(&format!("{} {}\n", report.image, report.id));
    }
    Ok(ExitCode::SUCCESS)
}

/// `bottle port BOTTLE [PORT[:HOST_PORT]] [--close HOST_PORT]`.
fn port(global: &Global, args: &PortArgs) -> Result<ExitCode, Failure> {
    let (bottle, kind) = find_bottle_and_backend(global, &args.bottle)?;
    let name = bottle.name().to_string();
    drop(bottle);
    let state_dir = crate::lookup::state_dir_of(&name)?;
    if let Some(host_port) = args.close {
        if !crate::forward::close_port(&state_dir, host_port) {
            return Err(Failure::new(
                "BOT-C080",
                EXIT_USAGE,
                format!("{name} has no port published on 127.0.0.1:{host_port}"),
            )
            .with_fix(format!("see `bottle port {name}`")));
        }
        out(&format!("closed 127.0.0.1:{host_port}\n"));
        return Ok(ExitCode::SUCCESS);
    }
    let Some(spec) = &args.port else {
        let ports = crate::forward::open_ports(&state_dir);
        if global.json {
            output::json(&ports)?;
        } else if ports.is_empty() {
            note(global.quiet, &format!("{name} has no published port"));
        } else {
            let rows: Vec<Vec<String>> = ports
                .iter()
                .map(|p| vec![p.port.to_string(), p.listen.clone()])
                .collect();
            out(&output::table(&["PORT", "HOST"], &rows));
        }
        return Ok(ExitCode::SUCCESS);
    };
    let mut published = bottle_core::manifest::Published::parse(spec, true).map_err(|err| {
        Failure::new("BOT-C080", EXIT_USAGE, format!("{spec:?} {}", err.problem())).with_fix(
            "write the agent's port, e.g. 8000, or PORT:HOST_PORT, e.g. 3000:13000 (HOST_PORT 0: any free port)",
        )
    })?;
    if published.host_port == 0 {
        published.host_port = crate::forward::free_host_port().map_err(|err| {
            Failure::new(
                "BOT-C081",
                crate::failure::EXIT_BACKEND,
                format!("no free port on 127.0.0.1: {err}"),
            )
        })?;
    }
    let record = crate::forward::spawn(
        &bottle_core::exec::SystemRunner,
        &state_dir,
        kind,
        &name,
        &crate::forward::Forward::Port(published),
    )?;
    if global.json {
        output::json(&bottle_core::backend::OpenPort {
            port: record.port,
            listen: record.listen,
        })?;
    } else {
        out(&format!("{}\n", record.listen));
        note(
            global.quiet,
            &format!(
                "the agent's port {} of {name} is on http://{} (this host's loopback only); `bottle port {name} --close {}` closes it",
                record.port, record.listen, published.host_port
            ),
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn doctor(global: &Global) -> Result<ExitCode, Failure> {
    let kind = backends::selected(global)?;
    let runner = bottle_core::exec::SystemRunner;
    let context = bottle_preflight::Context::from_host(&runner, kind);
    let checks =
        bottle_preflight::run_all(&context, &[&bottle_docker::host_checks::DockerHostChecks]);
    if global.json {
        output::json(&checks)?;
    } else {
        out(&format!(
            "bottle doctor (backend: {kind})\n{}{}\n",
            bottle_preflight::Report::new(&checks),
            bottle_preflight::Summary::of(&checks)
        ));
    }
    Ok(if bottle_preflight::is_fatal(&checks) {
        ExitCode::from(crate::failure::EXIT_PREFLIGHT)
    } else {
        ExitCode::SUCCESS
    })
}

fn completions(args: &CompletionsArgs) -> Result<ExitCode, Failure> {
    use clap::CommandFactory as _;
    let mut command = Cli::command();
    clap_complete::generate(args.shell, &mut command, "bottle", &mut io::stdout());
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use bottle_core::BackendKind;
    use bottle_core::audit_files::{AUDIT_DEGRADED_MARKER, AUDIT_OK_MARKER, AuditHealth};

    use super::*;

    fn info(name: &str) -> BottleInfo {
        BottleInfo {
            name: name.into(),
            agent: "claude".into(),
            backend: BackendKind::Docker,
            state: "running".into(),
            bundle_address: None,
            created: None,
            pending_requests: 0,
            agent_running: None,
            ports: Vec::new(),
            audit: AuditHealth::Unknown,
        }
    }

    #[test]
    fn list_shows_a_degraded_audit_log() {
        let root = tempfile::tempdir().unwrap();
        let mut bottles = vec![info("bot-bottle-good"), info("bot-bottle-full")];
        for (slug, marker) in [("good", AUDIT_OK_MARKER), ("full", AUDIT_DEGRADED_MARKER)] {
            let logs = root.path().join(slug).join(audit_files::AUDIT_LOG_DIR);
            std::fs::create_dir_all(&logs).unwrap();
            std::fs::write(logs.join(marker), "").unwrap();
        }
        read_host_state(root.path(), &mut bottles);
        assert_eq!(
            bottles.iter().map(|b| b.audit).collect::<Vec<_>>(),
            [AuditHealth::Ok, AuditHealth::Degraded]
        );
        let table = list_table(&bottles);
        let columns: Vec<Vec<&str>> = table
            .lines()
            .map(|line| line.split_whitespace().collect())
            .collect();
        assert_eq!(columns[0][6..], ["AUDIT", "SESSION", "PORTS"], "{table}");
        assert_eq!(columns[1][6..], ["ok", "-", "-"], "{table}");
        assert_eq!(columns[2][6..], ["degraded", "-", "-"], "{table}");
        let json = serde_json::to_value(&bottles).unwrap();
        assert_eq!(json[1]["audit"], "degraded");
    }
}
