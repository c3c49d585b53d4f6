//! `fake-smolvm`: a stand-in for the `smolvm` CLI, for tests on hosts
//! without smolvm or KVM. It honours the real CLI contract of the version it
//! pretends to be and keeps its state where smolvm does, in a real SQLite
//! database of smolvm's schema, so the code under test cannot tell the
//! difference until it needs a real VM.
//!
//! What is real and what is not:
//! - `--version` prints `smolvm X.Y.Z` (`FAKE_SMOLVM_VERSION`, default 1.9.3);
//! - argv shapes follow that version: `machine create NAME` and `machine
//!   delete NAME` before 1.1.0, `--name NAME` from 1.1.0; a wrong shape is
//!   clap's usage error (exit 2);
//! - the database is `dirs::data_local_dir()/smolvm/server/smolvm.db`
//!   (`$SMOLVM_DATA_DIR` as `HOME` on Linux from 1.2.5), WAL, with
//!   `vms(name TEXT PRIMARY KEY, data BLOB NOT NULL)` and
//!   `config(key TEXT PRIMARY KEY, value TEXT)`; records are `VmRecord` JSON
//!   with smolvm's field names;
//! - `machine create --from` drops `--allow-cidr` before 1.8.0
//!   (`allowed_cidrs: null`), as `run_from_smolmachine` did;
//! - `machine start` reads the record and writes what it "booted with"
//!   (`allowed_cidrs`, `dns_filter_hosts`, `network`) to
//!   `<data>/smolvm/fake/started/<name>.json` for the test to check;
//! - `machine exec` runs the command on the host, confined to a per-machine
//!   "guest root" (`<data>/smolvm/fake/guests/<name>`): a user and mount
//!   namespace, the host's `/usr`, `/bin`, `/lib*` bound read-only, then
//!   `chroot`. Absolute guest paths therefore land in the guest root and the
//!   host is never written. Output is buffered like smolvm's: stdout, then
//!   stderr, then the command's exit code. smolvm's own errors print
//!   `Error: …` and exit 1;
//! - `machine cp` copies into (or out of) the guest root;
//! - `pack create --image HOST:PORT/NAME:TAG -o OUT` fetches the manifest
//!   and every blob over real HTTP, checks their digests and sizes, and
//!   writes `OUT` and `OUT.smolmachine` (a JSON description, not a VM);
//! - there is no VM: nothing boots, no network policy is enforced.
//!
//! `FAKE_SMOLVM_MODE` (comma-separated) injects faults:
//! - `revert-db-writes`: a trigger undoes every later write to the machine's
//!   record, so a patch of the allowlist does not take;
//! - `no-row`: `machine create` succeeds without writing a record;
//! - `start-clears-cidrs`: `machine start` boots, then resets the record's
//!   `allowed_cidrs` to null.
//!
//! Every invocation is appended to `<data>/smolvm/fake/calls.jsonl`.

use std::io::{Read as _, Write as _};
use std::path::{Component, Path, PathBuf};
use std::process::ExitCode;

use bottle_core::exec::{CommandRunner as _, CommandSpec, SystemRunner};
use bottle_smolvm::version::SmolvmVersion;
use rusqlite::{Connection, OptionalExtension as _};
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};

enum Failure {
    /// clap's usage error: exit 2.
    Usage(String),
    /// smolvm's own error: `Error: …`, exit 1.
    Error(String),
}

type Result<T> = std::result::Result<T, Failure>;

fn error(msg: impl Into<String>) -> Failure {
    Failure::Error(msg.into())
}

fn usage(msg: impl Into<String>) -> Failure {
    Failure::Usage(msg.into())
}

struct Fake {
    version: SmolvmVersion,
    modes: Vec<String>,
    db: PathBuf,
    fake_dir: PathBuf,
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let fake = match Fake::from_env() {
        Ok(fake) => fake,
        Err(failure) => return report(failure),
    };
    fake.log_call(&args);
    match fake.run(&args) {
        Ok(code) => code,
        Err(failure) => report(failure),
    }
}

fn report(failure: Failure) -> ExitCode {
    match failure {
        Failure::Usage(msg) => {
            eprintln!("error: {msg}\n\nFor more information, try '--help'.");
            ExitCode::from(2)
        }
        Failure::Error(msg) => {
            eprintln!("Error: {msg}");
            ExitCode::from(1)
        }
    }
}

impl Fake {
    fn from_env() -> Result<Fake> {
        let version_text = std::env::var("FAKE_SMOLVM_VERSION").unwrap_or_else(|_| "1.9.3".into());
        let version = SmolvmVersion::parse(&version_text)
            .map_err(|_| error(format!("FAKE_SMOLVM_VERSION={version_text:?} is not X.Y.Z")))?;
        let modes = std::env::var("FAKE_SMOLVM_MODE")
            .unwrap_or_default()
            .split(',')
            .filter(|m| !m.is_empty())
            .map(str::to_string)
            .collect();
        let data_local = data_local_dir(version)?;
        Ok(Fake {
            version,
            modes,
            db: data_local.join("smolvm/server/smolvm.db"),
            fake_dir: data_local.join("smolvm/fake"),
        })
    }

    fn mode(&self, mode: &str) -> bool {
        self.modes.iter().any(|m| m == mode)
    }

    fn log_call(&self, args: &[String]) {
        let _ = std::fs::create_dir_all(&self.fake_dir);
        if let Ok(mut file) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.fake_dir.join("calls.jsonl"))
        {
            let _ = writeln!(
                file,
                "{}",
                json!({ "version": self.version.to_string(), "argv": args })
            );
        }
    }

    fn guest_root(&self, name: &str) -> PathBuf {
        self.fake_dir.join("guests").join(name)
    }

    fn run(&self, args: &[String]) -> Result<ExitCode> {
        let words: Vec<&str> = args.iter().map(String::as_str).collect();
        match words.as_slice() {
            ["--version"] | ["-V"] => {
                println!("smolvm {}", self.version);
                Ok(ExitCode::SUCCESS)
            }
            ["machine" | "vm", sub, rest @ ..] => match *sub {
                "create" => self.create(rest),
                "start" => self.start(rest),
                "stop" => self.stop(rest),
                "delete" | "rm" => self.delete(rest),
                "ls" | "list" => self.ls(rest),
                "exec" => self.exec(rest),
                "cp" => self.cp(rest),
                other => Err(usage(format!("unrecognized subcommand '{other}'"))),
            },
            ["pack", "create", rest @ ..] => self.pack_create(rest),
            _ => Err(usage(format!("unrecognized arguments {args:?}"))),
        }
    }

    fn open_db(&self) -> Result<Connection> {
        if let Some(parent) = self.db.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| error(format!("create {}: {e}", parent.display())))?;
        }
        let conn = Connection::open(&self.db).map_err(|e| error(format!("open database: {e}")))?;
        conn.busy_timeout(std::time::Duration::from_secs(10))
            .map_err(|e| error(format!("database: {e}")))?;
        conn.execute_batch(
            "PRAGMA journal_mode=WAL;
             CREATE TABLE IF NOT EXISTS vms (name TEXT PRIMARY KEY, data BLOB NOT NULL);
             CREATE TABLE IF NOT EXISTS config (key TEXT PRIMARY KEY, value TEXT);",
        )
        .map_err(|e| error(format!("initialize database: {e}")))?;
        Ok(conn)
    }

    fn get(&self, conn: &Connection, name: &str) -> Result<Option<Value>> {
        let data: Option<Vec<u8>> = conn
            .query_row("SELECT data FROM vms WHERE name = ?1", [name], |r| r.get(0))
            .optional()
            .map_err(|e| error(format!("get vm '{name}': {e}")))?;
        data.map(|d| {
            serde_json::from_slice(&d).map_err(|e| error(format!("decode vm '{name}': {e}")))
        })
        .transpose()
    }

    fn put(&self, conn: &Connection, name: &str, record: &Value) -> Result<()> {
        let bytes = serde_json::to_vec(record).map_err(|e| error(e.to_string()))?;
        conn.execute(
            "INSERT INTO vms (name, data) VALUES (?1, ?2)
             ON CONFLICT(name) DO UPDATE SET data = excluded.data",
            rusqlite::params![name, bytes],
        )
        .map_err(|e| error(format!("insert vm '{name}': {e}")))?;
        Ok(())
    }

    fn require(&self, conn: &Connection, name: &str) -> Result<Value> {
        self.get(conn, name)?
            .ok_or_else(|| error(format!("machine '{name}' not found")))
    }

    fn create(&self, rest: &[&str]) -> Result<ExitCode> {
        let mut name = None;
        let mut from = None;
        let mut net = false;
        let mut cidrs = Vec::new();
        let mut it = rest.iter();
        while let Some(arg) = it.next() {
            match *arg {
                "--name" | "-n" if self.version.name_is_a_flag() => {
                    name = Some(value(&mut it, arg)?)
                }
                "--from" => from = Some(value(&mut it, arg)?),
                "--net" => net = true,
                "--allow-cidr" => cidrs.push(value(&mut it, arg)?),
                flag if flag.starts_with('-') => {
                    return Err(usage(format!("unexpected argument '{flag}' found")));
                }
                positional if !self.version.name_is_a_flag() && name.is_none() => {
                    name = Some(positional.to_string());
                }
                positional => {
                    return Err(usage(format!("unexpected argument '{positional}' found")));
                }
            }
        }
        let name = name.ok_or_else(|| usage("the machine name is required"))?;
        let from = from.ok_or_else(|| usage("this fake supports only `machine create --from`"))?;
        let artifact: Value = std::fs::read(&from)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .filter(|v: &Value| v["format"] == "fake-smolmachine/1")
            .ok_or_else(|| error(format!("{from} is not a .smolmachine artifact")))?;
        let conn = self.open_db()?;
        if self.get(&conn, &name)?.is_some() {
            return Err(error(format!("machine '{name}' already exists")));
        }
        // run_from_smolmachine dropped --allow-cidr until 1.8.0 (#892).
        let allowed_cidrs = if self.version.from_drops_allow_cidr() || cidrs.is_empty() {
            Value::Null
        } else {
            json!(cidrs)
        };
        let record = json!({
            "name": name,
            "created_at": unix_now(),
            "state": "created",
            "pid": null,
            "cpus": 1,
            "mem": 512,
            "mounts": [],
            "ports": [],
            "network": net || !cidrs.is_empty(),
            "env": [],
            "workdir": null,
            "storage_gb": null,
            "overlay_gb": null,
            "image": artifact["image"],
            "entrypoint": [],
            "cmd": [],
            "ssh_agent": false,
            "ephemeral": false,
            "source_smolmachine": from,
            "allowed_cidrs": allowed_cidrs,
            "network_backend": null,
            "dns_filter_hosts": null,
        });
        if !self.mode("no-row") {
            self.put(&conn, &name, &record)?;
        }
        if self.mode("revert-db-writes") {
            let quoted = name.replace('\'', "''");
            conn.execute_batch(&format!(
                "CREATE TRIGGER IF NOT EXISTS fake_revert_{hash} AFTER UPDATE OF data ON vms
                 WHEN NEW.name = '{quoted}'
                 BEGIN UPDATE vms SET data = OLD.data WHERE name = NEW.name; END;",
                hash = hex(&Sha256::digest(name.as_bytes())[..8]),
            ))
            .map_err(|e| error(format!("install revert trigger: {e}")))?;
        }
        println!("Created machine: {name}");
        Ok(ExitCode::SUCCESS)
    }

    fn name_flag(&self, rest: &[&str]) -> Result<String> {
        let mut name = None;
        let mut it = rest.iter();
        while let Some(arg) = it.next() {
            match *arg {
                "--name" | "-n" => name = Some(value(&mut it, arg)?),
                other => return Err(usage(format!("unexpected argument '{other}' found"))),
            }
        }
        Ok(name.unwrap_or_else(|| "default".into()))
    }

    fn start(&self, rest: &[&str]) -> Result<ExitCode> {
        let name = self.name_flag(rest)?;
        let conn = self.open_db()?;
        let mut record = self.require(&conn, &name)?;
        let started_dir = self.fake_dir.join("started");
        std::fs::create_dir_all(&started_dir).map_err(|e| error(e.to_string()))?;
        let booted = json!({
            "allowed_cidrs": record["allowed_cidrs"],
            "dns_filter_hosts": record["dns_filter_hosts"],
            "network": record["network"],
        });
        std::fs::write(started_dir.join(format!("{name}.json")), booted.to_string())
            .map_err(|e| error(e.to_string()))?;
        std::fs::create_dir_all(self.guest_root(&name)).map_err(|e| error(e.to_string()))?;
        record["state"] = json!("running");
        record["pid"] = json!(std::process::id());
        if self.mode("start-clears-cidrs") {
            record["allowed_cidrs"] = Value::Null;
        }
        self.put(&conn, &name, &record)?;
        println!("Machine '{name}' started");
        Ok(ExitCode::SUCCESS)
    }

    fn stop(&self, rest: &[&str]) -> Result<ExitCode> {
        let name = self.name_flag(rest)?;
        let conn = self.open_db()?;
        let mut record = self.require(&conn, &name)?;
        record["state"] = json!("stopped");
        record["pid"] = Value::Null;
        self.put(&conn, &name, &record)?;
        println!("Machine '{name}' stopped");
        Ok(ExitCode::SUCCESS)
    }

    fn delete(&self, rest: &[&str]) -> Result<ExitCode> {
        let mut name = None;
        let mut force = false;
        let mut it = rest.iter();
        while let Some(arg) = it.next() {
            match *arg {
                "--name" | "-n" if self.version.name_is_a_flag() => {
                    name = Some(value(&mut it, arg)?)
                }
                "-f" | "--force" => force = true,
                flag if flag.starts_with('-') => {
                    return Err(usage(format!("unexpected argument '{flag}' found")));
                }
                positional if !self.version.name_is_a_flag() && name.is_none() => {
                    name = Some(positional.to_string());
                }
                positional => {
                    return Err(usage(format!("unexpected argument '{positional}' found")));
                }
            }
        }
        let name = name.ok_or_else(|| usage("the machine name is required"))?;
        if !force {
            return Err(error("delete needs confirmation; pass -f"));
        }
        let conn = self.open_db()?;
        self.require(&conn, &name)?;
        conn.execute("DELETE FROM vms WHERE name = ?1", [&name])
            .map_err(|e| error(format!("delete vm '{name}': {e}")))?;
        let _ = std::fs::remove_dir_all(self.guest_root(&name));
        let _ = std::fs::remove_file(self.fake_dir.join("started").join(format!("{name}.json")));
        println!("Deleted machine: {name}");
        Ok(ExitCode::SUCCESS)
    }

    fn ls(&self, rest: &[&str]) -> Result<ExitCode> {
        let mut json_out = false;
        for arg in rest {
            match *arg {
                "--json" => json_out = true,
                "-v" | "--verbose" => {}
                other => return Err(usage(format!("unexpected argument '{other}' found"))),
            }
        }
        let conn = self.open_db()?;
        let mut stmt = conn
            .prepare("SELECT data FROM vms ORDER BY name")
            .map_err(|e| error(e.to_string()))?;
        let rows: Vec<Vec<u8>> = stmt
            .query_map([], |r| r.get(0))
            .and_then(|rows| rows.collect())
            .map_err(|e| error(e.to_string()))?;
        let mut out = Vec::new();
        for row in rows {
            let r: Value = serde_json::from_slice(&row).map_err(|e| error(e.to_string()))?;
            out.push(json!({
                "name": r["name"],
                "state": r["state"],
                "cpus": r["cpus"],
                "memory_mib": r["mem"],
                "pid": r["pid"],
                "mounts": r["mounts"].as_array().map_or(0, Vec::len),
                "ports": r["ports"].as_array().map_or(0, Vec::len),
                "created_at": r["created_at"],
                "storage_gb": r["storage_gb"],
                "overlay_gb": r["overlay_gb"],
                "image": r["image"],
                "entrypoint": r["entrypoint"],
                "cmd": r["cmd"],
                "ephemeral": r["ephemeral"],
                "gpu": false,
                "network": r["network"],
            }));
        }
        if json_out {
            println!(
                "{}",
                serde_json::to_string_pretty(&out).map_err(|e| error(e.to_string()))?
            );
        } else if out.is_empty() {
            println!("No machines found");
        } else {
            for m in out {
                println!(
                    "{}\t{}",
                    m["name"].as_str().unwrap_or(""),
                    m["state"].as_str().unwrap_or("")
                );
            }
        }
        Ok(ExitCode::SUCCESS)
    }

    fn require_running(&self, name: &str) -> Result<()> {
        let conn = self.open_db()?;
        let record = self.require(&conn, name)?;
        if record["state"] != "running" {
            return Err(error(format!(
                "machine '{name}' is not running; start it with `smolvm machine start --name {name}`"
            )));
        }
        Ok(())
    }

    fn exec(&self, rest: &[&str]) -> Result<ExitCode> {
        let mut name = None;
        let mut env = Vec::new();
        let mut workdir = None;
        let mut interactive = false;
        let mut it = rest.iter();
        let mut argv = Vec::new();
        while let Some(arg) = it.next() {
            match *arg {
                "--name" => name = Some(value(&mut it, arg)?),
                "-e" | "--env" => {
                    let pair = value(&mut it, arg)?;
                    let (k, v) = pair.split_once('=').ok_or_else(|| {
                        usage(format!("invalid env '{pair}', expected KEY=VALUE"))
                    })?;
                    env.push((k.to_string(), v.to_string()));
                }
                "-w" | "--workdir" => workdir = Some(value(&mut it, arg)?),
                "-i" | "--interactive" => interactive = true,
                "-t" | "--tty" | "-it" => {}
                "--" => {
                    argv.extend(it.by_ref().map(|s| s.to_string()));
                }
                other => argv.push(other.to_string()),
            }
        }
        if argv.is_empty() {
            return Err(usage(
                "the following required arguments were not provided: <COMMAND>",
            ));
        }
        let name = name.unwrap_or_else(|| "default".into());
        self.require_running(&name)?;
        let stdin = if interactive {
            let mut buf = Vec::new();
            let _ = std::io::stdin().read_to_end(&mut buf);
            Some(buf)
        } else {
            None
        };
        let out = sandbox::run_in_guest(
            &self.guest_root(&name),
            &argv,
            &env,
            workdir.as_deref(),
            stdin,
        )
        .map_err(|reason| {
            error(format!(
                "fake-smolvm cannot sandbox guest commands here: {reason}"
            ))
        })?;
        let _ = std::io::stdout().write_all(&out.stdout);
        let _ = std::io::stdout().flush();
        let _ = std::io::stderr().write_all(&out.stderr);
        let code = out.code.unwrap_or(137);
        Ok(ExitCode::from(u8::try_from(code & 0xff).unwrap_or(1)))
    }

    fn cp(&self, rest: &[&str]) -> Result<ExitCode> {
        let [src, dst] = rest else {
            return Err(usage("expected SRC DST"));
        };
        let split = |s: &str| -> Option<(String, String)> {
            let (name, path) = s.split_once(':')?;
            (!name.is_empty() && !name.contains('/') && path.starts_with('/'))
                .then(|| (name.to_string(), path.to_string()))
        };
        match (split(src), split(dst)) {
            (None, Some((name, guest))) => {
                self.require_running(&name)?;
                let target = guest_path(&self.guest_root(&name), &guest)?;
                copy_into(Path::new(src), &target)?;
            }
            (Some((name, guest)), None) => {
                self.require_running(&name)?;
                let source = guest_path(&self.guest_root(&name), &guest)?;
                copy_into(&source, Path::new(dst))?;
            }
            _ => return Err(error("exactly one of SRC and DST must be MACHINE:/path")),
        }
        Ok(ExitCode::SUCCESS)
    }

    fn pack_create(&self, rest: &[&str]) -> Result<ExitCode> {
        let mut image = None;
        let mut output = None;
        let mut it = rest.iter();
        while let Some(arg) = it.next() {
            match *arg {
                "--image" | "-I" => image = Some(value(&mut it, arg)?),
                "-o" | "--output" => output = Some(value(&mut it, arg)?),
                other => return Err(usage(format!("unexpected argument '{other}' found"))),
            }
        }
        let image = image.ok_or_else(|| usage("--image is required"))?;
        let output = PathBuf::from(output.ok_or_else(|| usage("-o is required"))?);
        let pulled = pull::pull(&image).map_err(|e| error(format!("pull {image}: {e}")))?;
        std::fs::write(&output, "#!/bin/sh\necho 'fake smolmachine launcher'\n")
            .map_err(|e| error(format!("write {}: {e}", output.display())))?;
        let mut sidecar = output.into_os_string();
        sidecar.push(".smolmachine");
        let artifact = json!({
            "format": "fake-smolmachine/1",
            "image": image,
            "manifest_digest": pulled.manifest_digest,
            "config": pulled.config,
            "layers": pulled.layers,
            "bytes": pulled.bytes,
        });
        std::fs::write(&sidecar, artifact.to_string())
            .map_err(|e| error(format!("write {}: {e}", PathBuf::from(&sidecar).display())))?;
        println!(
            "Packed {image} ({} layers, {} bytes)",
            pulled.layers.len(),
            pulled.bytes
        );
        Ok(ExitCode::SUCCESS)
    }
}

fn value<'a>(it: &mut impl Iterator<Item = &'a &'a str>, flag: &str) -> Result<String> {
    it.next()
        .map(|v| v.to_string())
        .ok_or_else(|| usage(format!("a value is required for '{flag}'")))
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `dirs::data_local_dir()` as smolvm sees it (see the crate docs).
fn data_local_dir(version: SmolvmVersion) -> Result<PathBuf> {
    let var = |k: &str| {
        std::env::var(k)
            .ok()
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
    };
    let missing = || error("could not determine local data directory");
    if cfg!(target_os = "macos") {
        return Ok(var("HOME")
            .ok_or_else(missing)?
            .join("Library/Application Support"));
    }
    if version.honours_data_dir()
        && let Some(root) = var("SMOLVM_DATA_DIR")
    {
        return Ok(root.join(".local/share"));
    }
    match var("XDG_DATA_HOME") {
        Some(xdg) => Ok(xdg),
        None => Ok(var("HOME").ok_or_else(missing)?.join(".local/share")),
    }
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

/// Guest commands, confined to a guest root.
mod sandbox {
    use super::*;
    use nix::mount::{MsFlags, mount};
    use nix::sched::{CloneFlags, unshare};

    const SYSTEM_DIRS: [&str; 7] = ["usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32"];
    const DEVICES: [&str; 4] = ["null", "zero", "random", "urandom"];

    /// Runs `argv` with `root` as `/`. Called only from a single-threaded
    /// process (a user namespace cannot be entered otherwise).
    pub(super) fn run_in_guest(
        root: &Path,
        argv: &[String],
        env: &[(String, String)],
        workdir: Option<&str>,
        stdin: Option<Vec<u8>>,
    ) -> std::result::Result<bottle_core::exec::CommandOutput, String> {
        let root = root
            .canonicalize()
            .map_err(|e| format!("guest root {}: {e}", root.display()))?;
        let uid = nix::unistd::getuid();
        let gid = nix::unistd::getgid();
        unshare(CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWNS)
            .map_err(|e| format!("unshare user and mount namespaces: {e}"))?;
        std::fs::write("/proc/self/setgroups", "deny").map_err(|e| format!("setgroups: {e}"))?;
        std::fs::write("/proc/self/uid_map", format!("0 {uid} 1"))
            .map_err(|e| format!("uid_map: {e}"))?;
        std::fs::write("/proc/self/gid_map", format!("0 {gid} 1"))
            .map_err(|e| format!("gid_map: {e}"))?;
        mount(
            None::<&str>,
            "/",
            None::<&str>,
            MsFlags::MS_REC | MsFlags::MS_PRIVATE,
            None::<&str>,
        )
        .map_err(|e| format!("make mounts private: {e}"))?;

        for dir in SYSTEM_DIRS {
            let host = Path::new("/").join(dir);
            let Ok(meta) = std::fs::symlink_metadata(&host) else {
                continue;
            };
            let guest = root.join(dir);
            if meta.file_type().is_symlink() {
                let target =
                    std::fs::read_link(&host).map_err(|e| format!("{}: {e}", host.display()))?;
                if std::fs::symlink_metadata(&guest).is_err() {
                    std::os::unix::fs::symlink(&target, &guest)
                        .map_err(|e| format!("{}: {e}", guest.display()))?;
                }
                continue;
            }
            if !meta.is_dir() {
                continue;
            }
            std::fs::create_dir_all(&guest).map_err(|e| format!("{}: {e}", guest.display()))?;
            bind_read_only(&host, &guest)?;
        }

        let dev = root.join("dev");
        std::fs::create_dir_all(&dev).map_err(|e| format!("{}: {e}", dev.display()))?;
        for name in DEVICES {
            let host = Path::new("/dev").join(name);
            let guest = dev.join(name);
            if !host.exists() {
                continue;
            }
            if !guest.exists() {
                std::fs::write(&guest, b"").map_err(|e| format!("{}: {e}", guest.display()))?;
            }
            mount(
                Some(&host),
                &guest,
                None::<&str>,
                MsFlags::MS_BIND,
                None::<&str>,
            )
            .map_err(|e| format!("bind {}: {e}", host.display()))?;
        }
        for dir in ["tmp", "root"] {
            std::fs::create_dir_all(root.join(dir)).map_err(|e| format!("{dir}: {e}"))?;
        }

        nix::unistd::chroot(&root).map_err(|e| format!("chroot {}: {e}", root.display()))?;
        std::env::set_current_dir(workdir.unwrap_or("/")).map_err(|e| format!("chdir: {e}"))?;

        let mut spec = CommandSpec::new(&argv[0]).args(&argv[1..]);
        spec = spec
            .env(
                "PATH",
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            )
            .env("HOME", "/root")
            .env("TERM", "xterm-256color");
        for (k, v) in env {
            spec = spec.env(k, v);
        }
        spec.stdin = stdin;
        match SystemRunner.run(&spec) {
            Ok(out) => Ok(out),
            // A missing program is the guest's 127, as a shell would say.
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
                Ok(bottle_core::exec::CommandOutput {
                    code: Some(127),
                    stdout: Vec::new(),
                    stderr: format!("{}: not found\n", argv[0]).into_bytes(),
                })
            }
            Err(err) => Err(format!("run {}: {err}", argv[0])),
        }
    }

    /// Binds `host` onto `guest` read-only. Refuses rather than leave a
    /// writable bind of a host system directory.
    fn bind_read_only(host: &Path, guest: &Path) -> std::result::Result<(), String> {
        mount(
            Some(host),
            guest,
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REC,
            None::<&str>,
        )
        .map_err(|e| format!("bind {}: {e}", host.display()))?;
        // A remount must keep the flags the kernel locked on the original.
        let mut flags = MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY;
        if let Ok(stat) = nix::sys::statvfs::statvfs(host) {
            use nix::sys::statvfs::FsFlags;
            let map = [
                (FsFlags::ST_NOSUID, MsFlags::MS_NOSUID),
                (FsFlags::ST_NODEV, MsFlags::MS_NODEV),
                (FsFlags::ST_NOEXEC, MsFlags::MS_NOEXEC),
                (FsFlags::ST_NOATIME, MsFlags::MS_NOATIME),
                (FsFlags::ST_NODIRATIME, MsFlags::MS_NODIRATIME),
                (FsFlags::ST_RELATIME, MsFlags::MS_RELATIME),
            ];
            for (st, ms) in map {
                if stat.flags().contains(st) {
                    flags |= ms;
                }
            }
        }
        mount(None::<&str>, guest, None::<&str>, flags, None::<&str>).map_err(|e| {
            format!(
                "could not make the bind of {} read-only ({e}); refusing to expose it writable",
                host.display()
            )
        })
    }
}

/// A minimal registry client: enough of the distribution API to pull one
/// image and check every digest.
mod pull {
    use super::*;
    use bytes::Bytes;
    use http_body_util::{BodyExt as _, Empty};

    pub(super) struct Pulled {
        pub manifest_digest: String,
        pub config: String,
        pub layers: Vec<String>,
        pub bytes: u64,
    }

    pub(super) fn pull(reference: &str) -> std::result::Result<Pulled, String> {
        let (host, rest) = reference
            .split_once('/')
            .ok_or_else(|| format!("{reference} names no registry"))?;
        let (repo, tag) = rest
            .rsplit_once(':')
            .ok_or_else(|| format!("{reference} has no tag"))?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        runtime.block_on(async {
            let (status, _, _) = get(host, "/v2/", None).await?;
            if status != 200 {
                return Err(format!("GET /v2/ answered {status}"));
            }
            let accept = "application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json";
            let (status, headers, body) = get(host, &format!("/v2/{repo}/manifests/{tag}"), Some(accept)).await?;
            if status != 200 {
                return Err(format!("manifest {tag} answered {status}"));
            }
            let digest = digest_of(&body);
            if headers.get("docker-content-digest").and_then(|v| v.to_str().ok()) != Some(digest.as_str()) {
                return Err("the manifest's Docker-Content-Digest does not match its body".into());
            }
            let manifest: Value = serde_json::from_slice(&body).map_err(|e| format!("manifest: {e}"))?;
            let mut descriptors = vec![manifest["config"].clone()];
            descriptors.extend(manifest["layers"].as_array().cloned().unwrap_or_default());
            let mut bytes = 0u64;
            let mut digests = Vec::new();
            for descriptor in &descriptors {
                let want = descriptor["digest"].as_str().ok_or("descriptor without digest")?;
                let size = descriptor["size"].as_u64().ok_or("descriptor without size")?;
                let (status, _, blob) = get(host, &format!("/v2/{repo}/blobs/{want}"), None).await?;
                if status != 200 {
                    return Err(format!("blob {want} answered {status}"));
                }
                if digest_of(&blob) != want || blob.len() as u64 != size {
                    return Err(format!("blob {want} does not match its digest or size"));
                }
                bytes += size;
                digests.push(want.to_string());
            }
            let config = digests.remove(0);
            Ok(Pulled {
                manifest_digest: digest,
                config,
                layers: digests,
                bytes,
            })
        })
    }

    fn digest_of(bytes: &[u8]) -> String {
        format!("sha256:{}", hex(&Sha256::digest(bytes)))
    }

    async fn get(
        host: &str,
        path: &str,
        accept: Option<&str>,
    ) -> std::result::Result<(u16, http::HeaderMap, Bytes), String> {
        let stream = tokio::net::TcpStream::connect(host)
            .await
            .map_err(|e| format!("connect {host}: {e}"))?;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .map_err(|e| format!("handshake: {e}"))?;
        tokio::spawn(conn);
        let mut request = http::Request::get(path).header(http::header::HOST, host);
        if let Some(accept) = accept {
            request = request.header(http::header::ACCEPT, accept);
        }
        let request = request
            .body(Empty::<Bytes>::new())
            .map_err(|e| e.to_string())?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| format!("GET {path}: {e}"))?;
        let (parts, body) = response.into_parts();
        let body = body
            .collect()
            .await
            .map_err(|e| format!("GET {path}: {e}"))?
            .to_bytes();
        Ok((parts.status.as_u16(), parts.headers, body))
    }
}
