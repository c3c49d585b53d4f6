//! The guest side of a machine: `machine exec` runs a command confined to
//! the machine's guest root ([`sandbox`]), `machine cp` copies into or out
//! of it.

mod sandbox;

pub(crate) use sandbox::furnish;

use std::io::Write as _;
use std::path::{Component, Path, PathBuf};
use std::process::ExitCode;

use bottle_core::exec::{CommandSpec, SystemRunner};
use clap::Args;

use crate::machine::require_running;
use crate::{Fake, Result, error};

/// `machine exec`.
#[derive(Args)]
pub(crate) struct ExecArgs {
    /// The machine's name.
    #[arg(long, default_value = "default")]
    name: String,
    /// An environment variable for the command.
    #[arg(short, long = "env", value_name = "KEY=VALUE", value_parser = key_value)]
    env: Vec<(String, String)>,
    /// The command's working directory in the guest.
    #[arg(short, long)]
    workdir: Option<String>,
    /// Stream stdin to the command, and its output back, while it runs.
    #[arg(short, long)]
    interactive: bool,
    /// Give the command a terminal (the caller's, here); streams like `-i`.
    #[arg(short, long)]
    tty: bool,
    /// The command and its arguments.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    command: Vec<String>,
}

fn key_value(pair: &str) -> std::result::Result<(String, String), String> {
    pair.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("invalid env '{pair}', expected KEY=VALUE"))
}

/// `machine cp SRC DST`, exactly one of them `MACHINE:/path`.
#[derive(Args)]
pub(crate) struct CpArgs {
    /// A host path or `MACHINE:/path`.
    src: String,
    /// A host path or `MACHINE:/path`.
    dst: String,
}

/// Runs the command in the guest root, with smolvm's two shapes of I/O.
///
/// Without `-i` or `-t` the command's stdin is empty and its output is
/// buffered like smolvm's: stdout, then stderr, then its exit code. With
/// either, smolvm runs an interactive session (`interactive_session` in its
/// agent client): the caller's stdin streams to the command as it comes and
/// its end is the command's, and the output streams back as the command
/// writes it. The fake gets that by handing the command its own stdin,
/// stdout and stderr, so with `-t` the command's terminal is the caller's,
/// whose size and resizes (SIGWINCH) it sees, where smolvm's is a pty in
/// the VM that follows the caller's. What a command can tell apart: under
/// smolvm `-t` always gives it a terminal and `-i` alone pipes; here it has
/// whatever the caller has.
///
/// This process enters the VM's namespaces, then starts [`GUEST_VERB`] on
/// its own stdio: the first process inside the VM's pid namespace, which
/// (unlike this one, whose threads may not cross into it) can run the
/// command with its output captured.
pub(crate) fn exec(fake: &Fake, args: ExecArgs) -> Result<ExitCode> {
    require_running(fake, &args.name)?;
    let vm = crate::vm::running(fake, &args.name)
        .ok_or_else(|| error(format!("machine '{}' is unreachable", args.name)))?;
    let exe = std::env::current_exe().map_err(|e| error(format!("own executable: {e}")))?;
    crate::vm::enter(vm).map_err(|reason| {
        error(format!(
            "fake-smolvm cannot sandbox guest commands here: {reason}"
        ))
    })?;
    let mut spec = CommandSpec::new(exe)
        .arg(GUEST_VERB)
        .arg(fake.guest_root(&args.name));
    if let Some(dir) = &args.workdir {
        spec = spec.arg("--workdir").arg(dir);
    }
    if args.interactive || args.tty {
        spec = spec.arg("--attached");
    }
    for (key, value) in &args.env {
        spec = spec.arg("-e").arg(format!("{key}={value}"));
    }
    let spec = spec.arg("--").args(&args.command).inherit_streams();
    let (status, _) = SystemRunner
        .run_to_status(&spec)
        .map_err(|e| error(format!("run in the VM: {e}")))?;
    let code = status
        .code()
        .or_else(|| std::os::unix::process::ExitStatusExt::signal(&status).map(|s| 128 + s))
        .unwrap_or(1);
    Ok(ExitCode::from(u8::try_from(code & 0xff).unwrap_or(1)))
}

/// The hidden verb that runs a guest command inside the VM's pid namespace.
pub(crate) const GUEST_VERB: &str = "__vm-exec";

/// [`GUEST_VERB`]'s arguments.
#[derive(Args)]
pub(crate) struct GuestRunArgs {
    /// The guest root.
    root: PathBuf,
    /// The command's working directory in the guest.
    #[arg(long)]
    workdir: Option<String>,
    /// Stream on this process's stdio instead of buffering.
    #[arg(long)]
    attached: bool,
    /// An environment variable for the command.
    #[arg(short, long = "env", value_parser = key_value)]
    env: Vec<(String, String)>,
    /// The command and its arguments.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    command: Vec<String>,
}

/// Inside the VM: runs the command in the guest root and prints what it
/// wrote, buffered or streamed.
pub(crate) fn run(args: GuestRunArgs) -> Result<ExitCode> {
    let io = if args.attached {
        sandbox::GuestIo::Attached
    } else {
        sandbox::GuestIo::Buffered
    };
    let out = sandbox::run_in_guest(
        &args.root,
        &args.command,
        &args.env,
        args.workdir.as_deref(),
        io,
    )
    .map_err(|reason| {
        error(format!(
            "fake-smolvm cannot sandbox guest commands here: {reason}"
        ))
    })?;
    let _ = std::io::stdout().write_all(&out.stdout);
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().write_all(&out.stderr);
    Ok(ExitCode::from(
        u8::try_from(out.code.unwrap_or(1) & 0xff).unwrap_or(1),
    ))
}

pub(crate) fn cp(fake: &Fake, args: CpArgs) -> Result<ExitCode> {
    let split = |s: &str| -> Option<(String, String)> {
        let (name, path) = s.split_once(':')?;
        (!name.is_empty() && !name.contains('/') && path.starts_with('/'))
            .then(|| (name.to_string(), path.to_string()))
    };
    match (split(&args.src), split(&args.dst)) {
        (None, Some((name, guest))) => {
            require_running(fake, &name)?;
            let target = guest_path(&fake.guest_root(&name), &guest)?;
            copy_into(Path::new(&args.src), &target)?;
        }
        (Some((name, guest)), None) => {
            require_running(fake, &name)?;
            let source = guest_path(&fake.guest_root(&name), &guest)?;
            copy_into(&source, Path::new(&args.dst))?;
        }
        _ => return Err(error("exactly one of SRC and DST must be MACHINE:/path")),
    }
    Ok(ExitCode::SUCCESS)
}

/// `root` + an absolute guest path, refusing `..`.
fn guest_path(root: &Path, guest: &str) -> Result<PathBuf> {
    let mut out = root.to_path_buf();
    for component in Path::new(guest).components() {
        match component {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(part) => out.push(part),
            _ => return Err(error(format!("guest path {guest:?} must not contain '..'"))),
        }
    }
    Ok(out)
}

/// Copies a file or a directory tree to `dst` (into it, if it is a
/// directory). The destination's parent must exist, as with `cp`.
fn copy_into(src: &Path, dst: &Path) -> Result<()> {
    let meta =
        std::fs::symlink_metadata(src).map_err(|e| error(format!("{}: {e}", src.display())))?;
    let target = if dst.is_dir() {
        dst.join(src.file_name().ok_or_else(|| error("source has no name"))?)
    } else {
        dst.to_path_buf()
    };
    if !target.parent().is_some_and(Path::is_dir) {
        return Err(error(format!(
            "destination directory of {} does not exist",
            target.display()
        )));
    }
    copy_tree(src, &target, meta.is_dir())
}

fn copy_tree(src: &Path, dst: &Path, is_dir: bool) -> Result<()> {
    if is_dir {
        std::fs::create_dir_all(dst).map_err(|e| error(format!("{}: {e}", dst.display())))?;
        for entry in std::fs::read_dir(src).map_err(|e| error(format!("{}: {e}", src.display())))? {
            let entry = entry.map_err(|e| error(e.to_string()))?;
            let kind = entry.file_type().map_err(|e| error(e.to_string()))?;
            if kind.is_symlink() {
                continue;
            }
            copy_tree(&entry.path(), &dst.join(entry.file_name()), kind.is_dir())?;
        }
        Ok(())
    } else {
        std::fs::copy(src, dst)
            .map(drop)
            .map_err(|e| error(format!("copy {} to {}: {e}", src.display(), dst.display())))
    }
}
