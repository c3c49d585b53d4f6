//! The gVisor check (`docker.gvisor`): whether the daemon has the runtime
//! `isolation = "gvisor"` needs, registered so it can run a bottle's box,
//! which build it is (`runsc --version`), on which platform, and the gaps
//! of that build bottle knows of.
//!
//! gVisor is an optional tier: its absence is a warning, never a failure
//! (a manifest asking for it is refused at `bottle start` instead). The
//! registration is judged by [`bottle_core::isolation::assess`], exactly
//! as the docker backend judges it.

use std::collections::HashMap;

use bottle_core::exec::CommandSpec;
use bottle_core::isolation::{GVISOR_FIX, GvisorBuild, Registration};
use serde::Deserialize;

use crate::check::{Check, Status};
use crate::docker::{Endpoint, INFO_REQUEST, endpoint, probe_json};
use crate::host::Context;

/// Stable id of the gVisor check.
pub const ID: &str = "docker.gvisor";
pub(crate) const TITLE: &str = "gvisor runtime";

/// The fields of `GET /info` this check reads.
#[derive(Debug, Clone, Default, Deserialize)]
struct RuntimesInfo {
    #[serde(rename = "Runtimes", default)]
    runtimes: HashMap<String, RuntimeEntry>,
}

#[derive(Debug, Clone, Default, Deserialize)]
struct RuntimeEntry {
    #[serde(default)]
    path: String,
    #[serde(rename = "runtimeArgs", default)]
    runtime_args: Vec<String>,
}

/// Checks the daemon's gVisor runtime: registered, fit, its build and
/// platform, and the build's known gaps.
pub fn check_gvisor(ctx: &Context<'_>) -> Check {
    let name = bottle_core::isolation::gvisor_runtime_name(ctx.gvisor_runtime.as_deref());
    let name = name.as_str();
    let skip = |why: String| Check::new(ID, TITLE, Status::Skip, format!("not checked: {why}"));
    let socket = match endpoint(ctx.docker_host.as_deref()) {
        Endpoint::Other(value) => {
            return skip(format!("DOCKER_HOST={value} is not a unix socket"));
        }
        Endpoint::Unix(path) => ctx.root.join(path),
    };
    let info: RuntimesInfo = match probe_json(&socket, ctx.docker_timeout, INFO_REQUEST) {
        Ok(info) => info,
        Err(why) => {
            return skip(format!(
                "the docker daemon did not answer GET /info ({why})"
            ));
        }
    };
    let Some(entry) = info.runtimes.get(name) else {
        return Check::new(
            ID,
            TITLE,
            Status::Warn,
            format!(
                "the daemon has no `{name}` runtime (it has: {}): bottles with isolation = \"gvisor\" are refused (BOT-D090)",
                bottle_core::isolation::runtime_names(info.runtimes.keys())
            ),
        )
        .with_remediation(GVISOR_FIX);
    };
    let registration = Registration {
        path: entry.path.clone(),
        args: entry.runtime_args.clone(),
    };
    let setup = match bottle_core::isolation::assess(&registration) {
        Ok(setup) => setup,
        Err(unfit) => {
            return Check::new(
                ID,
                TITLE,
                Status::Warn,
                format!(
                    "`{name}` ({}) cannot run a bottle's box: {} (BOT-D091)",
                    registration.path,
                    unfit.join("; ")
                ),
            )
            .with_remediation(GVISOR_FIX);
        }
    };
    let program = if registration.path.is_empty() {
        name.to_string()
    } else {
        registration.path.clone()
    };
    let version = ctx
        .runner
        .run(&CommandSpec::new(&program).arg("--version"))
        .ok()
        .filter(|out| out.success())
        .and_then(|out| GvisorBuild::parse(&out.stdout_text()));
    let Some(build) = version else {
        return Check::new(
            ID,
            TITLE,
            Status::Warn,
            format!("`{program} --version` did not name a gVisor build: `{name}` may not be gVisor (a launch confirms it and refuses a box that is not)"),
        )
        .with_remediation(GVISOR_FIX);
    };
    let summary = format!(
        "`{name}`: runsc {} at {program} ({})",
        build.version,
        setup.describe()
    );
    let gaps = build.known_gaps(Some(&setup));
    if gaps.is_empty() {
        Check::new(ID, TITLE, Status::Ok, summary)
    } else {
        Check::new(
            ID,
            TITLE,
            Status::Warn,
            format!("{summary}; known gaps of this build: {}", gaps.join("; ")),
        )
        .with_remediation(
            "a current gVisor release (https://gvisor.dev/docs/user_guide/install/) has the systrap platform and its own network stack; register it as `runsc` without --network=host and reload dockerd with SIGHUP",
        )
    }
}
