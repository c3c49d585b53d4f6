//! The machine verbs that only touch the state database: `create`,
//! `start`, `stop`, `delete`, `ls`.

use std::process::ExitCode;

use clap::Args;
use clap::error::ErrorKind;
use serde_json::{Value, json};

use crate::{Fake, Result, error, usage};

/// `machine create`. The name is `--name` from 1.1.0, a positional before
/// (see `command_line`).
#[derive(Args)]
pub(crate) struct CreateArgs {
    /// The machine's name.
    #[arg(short, long)]
    name: String,
    /// The `.smolmachine` to create it from.
    #[arg(long)]
    from: Option<String>,
    /// Give the machine a network.
    #[arg(long)]
    net: bool,
    /// A CIDR the machine may reach (implies a network).
    #[arg(long = "allow-cidr")]
    allow_cidr: Vec<String>,
    /// The storage disk in GiB, where the workload's writes land.
    #[arg(long, value_name = "GiB")]
    storage: Option<u64>,
    /// The overlay disk in GiB.
    #[arg(long, value_name = "GiB")]
    overlay: Option<u64>,
}

/// smolvm's default disk sizes (`DEFAULT_STORAGE_SIZE_GIB`,
/// `DEFAULT_OVERLAY_SIZE_GIB`).
const DEFAULT_STORAGE_GIB: u64 = 20;
const DEFAULT_OVERLAY_GIB: u64 = 10;

/// `machine start`, `machine stop` and `machine data-dir`.
#[derive(Args)]
pub(crate) struct NameArgs {
    /// The machine's name.
    #[arg(short, long, default_value = "default")]
    name: String,
}

/// `machine delete`. The name is `--name` from 1.1.0, a positional before.
#[derive(Args)]
pub(crate) struct DeleteArgs {
    /// The machine's name.
    #[arg(short, long)]
    name: String,
    /// Delete without asking.
    #[arg(short, long)]
    force: bool,
}

/// `machine ls`.
#[derive(Args)]
pub(crate) struct LsArgs {
    /// Print JSON.
    #[arg(long)]
    json: bool,
    /// Accepted like smolvm's; the fake has nothing more to say.
    #[arg(short, long)]
    verbose: bool,
}

pub(crate) fn create(fake: &Fake, args: CreateArgs) -> Result<ExitCode> {
    let CreateArgs {
        name,
        from,
        net,
        allow_cidr: cidrs,
        storage,
        overlay,
    } = args;
    // smolvm's `VmResources::validate`, before anything is written.
    if storage == Some(0) {
        return Err(error("storage disk size must be greater than 0 GiB"));
    }
    if overlay == Some(0) {
        return Err(error("overlay disk size must be greater than 0 GiB"));
    }
    let from = from.ok_or_else(|| {
        usage(
            ErrorKind::MissingRequiredArgument,
            "this fake supports only `machine create --from`",
        )
    })?;
    let artifact: Value = std::fs::read(&from)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .filter(|v: &Value| v["format"] == "fake-smolmachine/1")
        .ok_or_else(|| error(format!("{from} is not a .smolmachine artifact")))?;
    let db = fake.open_db()?;
    if db.get(&name)?.is_some() {
        return Err(error(format!("machine '{name}' already exists")));
    }
    // run_from_smolmachine dropped --allow-cidr until 1.8.0 (#892).
    let allowed_cidrs = if fake.version.from_drops_allow_cidr() || cidrs.is_empty() {
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
        "storage_gb": storage,
        "overlay_gb": overlay,
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
    crate::disk::create(
        &crate::disk::data_dir(fake.version, &name)?,
        &name,
        artifact["image"].as_str().unwrap_or_default(),
        storage.unwrap_or(DEFAULT_STORAGE_GIB),
        overlay.unwrap_or(DEFAULT_OVERLAY_GIB),
    )?;
    if !fake.mode("no-row") {
        db.put(&name, &record)?;
    }
    if fake.mode("revert-db-writes") {
        db.revert_later_writes(&name)?;
    }
    println!("Created machine: {name}");
    Ok(ExitCode::SUCCESS)
}

pub(crate) fn start(fake: &Fake, args: NameArgs) -> Result<ExitCode> {
    let name = args.name;
    let db = fake.open_db()?;
    let mut record = db.require(&name)?;
    // The record stays `created` when the VM cannot start.
    refuse_a_kvm_the_vm_cannot_open()?;
    let started_dir = fake.fake_dir.join("started");
    std::fs::create_dir_all(&started_dir).map_err(|e| error(e.to_string()))?;
    let booted = json!({
        "allowed_cidrs": record["allowed_cidrs"],
        "dns_filter_hosts": record["dns_filter_hosts"],
        "network": record["network"],
    });
    std::fs::write(started_dir.join(format!("{name}.json")), booted.to_string())
        .map_err(|e| error(e.to_string()))?;
    crate::disk::boot(
        &crate::disk::data_dir(fake.version, &name)?,
        &fake.guest_root(&name),
    )?;
    // Last: it leaves this process in the VM's namespaces.
    let vm = crate::vm::boot(fake, &name)?;
    record["state"] = json!("running");
    record["pid"] = json!(vm);
    if fake.mode("start-clears-cidrs") {
        record["allowed_cidrs"] = Value::Null;
    }
    db.put(&name, &record)?;
    println!("Machine '{name}' started");
    Ok(ExitCode::SUCCESS)
}

pub(crate) fn stop(fake: &Fake, args: NameArgs) -> Result<ExitCode> {
    let name = args.name;
    let db = fake.open_db()?;
    let mut record = db.require(&name)?;
    crate::vm::halt(fake, &name)?;
    if record["state"] == "running" {
        crate::disk::flush(
            &crate::disk::data_dir(fake.version, &name)?,
            &fake.guest_root(&name),
        )?;
    }
    record["state"] = json!("stopped");
    record["pid"] = Value::Null;
    db.put(&name, &record)?;
    println!("Machine '{name}' stopped");
    Ok(ExitCode::SUCCESS)
}

pub(crate) fn delete(fake: &Fake, args: DeleteArgs) -> Result<ExitCode> {
    let DeleteArgs { name, force } = args;
    if !force {
        return Err(error("delete needs confirmation; pass -f"));
    }
    let db = fake.open_db()?;
    db.require(&name)?;
    crate::vm::halt(fake, &name)?;
    db.remove(&name)?;
    let _ = std::fs::remove_dir_all(fake.guest_root(&name));
    let _ = std::fs::remove_dir_all(crate::disk::data_dir(fake.version, &name)?);
    let _ = std::fs::remove_file(fake.fake_dir.join("started").join(format!("{name}.json")));
    println!("Deleted machine: {name}");
    Ok(ExitCode::SUCCESS)
}

/// `machine data-dir`: where the machine's disks are; smolvm's "not
/// found" error for an unknown machine.
pub(crate) fn data_dir(fake: &Fake, args: NameArgs) -> Result<ExitCode> {
    fake.open_db()?.require(&args.name)?;
    println!(
        "{}",
        crate::disk::data_dir(fake.version, &args.name)?.display()
    );
    Ok(ExitCode::SUCCESS)
}

pub(crate) fn ls(fake: &Fake, args: LsArgs) -> Result<ExitCode> {
    let machines: Vec<Value> = fake
        .open_db()?
        .records()?
        .iter()
        .map(|r| {
            json!({
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
            })
        })
        .collect();
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&machines).map_err(|e| error(e.to_string()))?
        );
    } else if machines.is_empty() {
        println!("No machines found");
    } else {
        for m in machines {
            println!(
                "{}\t{}",
                m["name"].as_str().unwrap_or(""),
                m["state"].as_str().unwrap_or("")
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// smolvm's error for `exec` and `cp` on a machine that is not running.
pub(crate) fn require_running(fake: &Fake, name: &str) -> Result<()> {
    let record = fake.open_db()?.require(name)?;
    if record["state"] != "running" {
        return Err(error(format!(
            "machine '{name}' is not running; start it with `smolvm machine start --name {name}`"
        )));
    }
    Ok(())
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The device `FAKE_SMOLVM_KVM_DEVICE` names, judged as the real smolvm's
/// VM process meets it after its privilege drop: run as root, the VM keeps
/// only the `kvm` group.
fn refuse_a_kvm_the_vm_cannot_open() -> Result<()> {
    use std::os::unix::fs::MetadataExt as _;

    let Some(device) = std::env::var_os("FAKE_SMOLVM_KVM_DEVICE") else {
        return Ok(());
    };
    if !nix::unistd::geteuid().is_root() {
        return Ok(());
    }
    let meta = std::fs::metadata(&device).map_err(|e| error(e.to_string()))?;
    let kvm_gid = std::fs::read_to_string("/etc/group")
        .unwrap_or_default()
        .lines()
        .find_map(|line| {
            let mut fields = line.split(':');
            (fields.next() == Some("kvm"))
                .then(|| fields.nth(1)?.parse::<u32>().ok())
                .flatten()
        });
    let mode = meta.mode();
    let for_everyone = mode & 0o006 == 0o006;
    let for_kvm = kvm_gid == Some(meta.gid()) && mode & 0o060 == 0o060;
    if for_everyone || for_kvm {
        return Ok(());
    }
    Err(error(
        "start vm: krun_start_enter returned: -13 (KVM inaccessible to the VM process after privilege drop — Cannot access /dev/kvm (permission denied).\nAdd your user to the 'kvm' group:\n\n sudo usermod -aG kvm $USER\n\nThen log out and log back in for the change to take effect.)",
    ))
}
