//! The KVM smoke test: create a VM through the KVM API and run a few guest
//! instructions to a clean exit, bounded in time.
//!
//! A `/dev/kvm` that opens is not proof that guests run: on a host whose
//! KVM is emulated or nested without hardware virtualisation, libkrun guests
//! die with `KVM_EXIT_INTERNAL_ERROR` seconds into boot. The guest here
//! starts as libkrun's kernels do, in 64-bit long mode with paging, with the
//! host's supported CPUID, and must write a known value to an I/O port and
//! halt. The CPU flag check (`kvm.cpu`) stays the authoritative verdict: a
//! guest this small can run where a Linux guest cannot.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt as _;
use std::sync::mpsc;
use std::time::Duration;

use bottle_core::BackendKind;

use crate::check::{Check, Status};
use crate::host::{Context, Platform};
use crate::kvm::{ACCESS_ID, DEVICE, DEVICE_ID};

/// Stable id of the guest smoke test.
pub const ID: &str = "kvm.guest";
pub(crate) const TITLE: &str = "kvm guest";

/// How long the test guest may take to reach its exit. It runs three
/// instructions; anything slower is a hypervisor that does not run guests.
pub const GUEST_BOUND: Duration = Duration::from_secs(5);

/// The port and value the test guest writes before it halts.
pub const GUEST_PORT: u16 = 0xe9;
/// See [`GUEST_PORT`].
pub const GUEST_VALUE: u8 = 0x2a;

/// How the test guest ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GuestOutcome {
    /// It wrote [`GUEST_VALUE`] to [`GUEST_PORT`] and halted.
    Clean,
    /// `/dev/kvm` (under the host root) could not be opened: `errno`.
    NoAccess(nix::errno::Errno),
    /// The KVM API refused a step (`what`): not a KVM device, or no VM here.
    Refused {
        /// The step (`KVM_CREATE_VM`).
        what: &'static str,
        /// Why.
        detail: String,
    },
    /// The guest exited some other way (`KVM_EXIT_INTERNAL_ERROR` with its
    /// suberror, a triple fault, an unexpected port write).
    BadExit(String),
    /// No exit within [`GUEST_BOUND`].
    TimedOut,
}

/// Runs the test guest on `/dev/kvm` under the context's root, unless this
/// is not an x86-64 Linux host or the device is missing or closed to this
/// user (the device and access checks say so).
pub fn check_guest(ctx: &Context<'_>) -> Check {
    let needed = ctx.backend == BackendKind::Smolmachines;
    match ctx.platform() {
        Platform::Linux => {}
        Platform::MacOs => {
            return Check::new(
                ID,
                TITLE,
                Status::Skip,
                "not needed on macos: smolvm uses Hypervisor.framework".to_owned(),
            );
        }
        Platform::Other => {
            return Check::new(
                ID,
                TITLE,
                Status::Skip,
                format!("kvm is only checked on linux, this is {}", ctx.os),
            );
        }
    }
    if ctx.arch != "x86_64" || !cfg!(target_arch = "x86_64") {
        return Check::new(
            ID,
            TITLE,
            Status::Skip,
            format!("the test guest is x86-64 code; this is {}", ctx.arch),
        );
    }
    let path = ctx.root.join(DEVICE);
    let check = match run_guest(&path, GUEST_BOUND) {
        GuestOutcome::Clean => Check::new(
            ID,
            TITLE,
            Status::Ok,
            "a minimal 64-bit test guest ran to a clean exit (no proof that a linux guest boots: see kvm.cpu)"
                .to_owned(),
        ),
        GuestOutcome::NoAccess(nix::errno::Errno::ENOENT) => Check::new(
            ID,
            TITLE,
            Status::Skip,
            format!("no {DEVICE} to run a guest on (see {DEVICE_ID})"),
        ),
        GuestOutcome::NoAccess(errno @ (nix::errno::Errno::EACCES | nix::errno::Errno::EPERM)) => {
            Check::new(
                ID,
                TITLE,
                Status::Skip,
                format!("cannot open {DEVICE} to run a guest: {errno} (see {ACCESS_ID})"),
            )
        }
        GuestOutcome::NoAccess(errno) => failed(format!("could not open {DEVICE}: {errno}")),
        GuestOutcome::Refused { what, detail } => {
            failed(format!("{what} failed on {DEVICE}: {detail}"))
        }
        GuestOutcome::BadExit(how) => failed(format!(
            "a 64-bit test guest did not run to its clean exit ({how}): microVM guests cannot run on this kvm"
        )),
        GuestOutcome::TimedOut => failed(format!(
            "a 64-bit test guest did not exit within {}s: microVM guests cannot run on this kvm",
            GUEST_BOUND.as_secs()
        )),
    };
    check.soften(needed, "only the smolmachines backend needs kvm")
}

fn failed(message: String) -> Check {
    Check::new(ID, TITLE, Status::Fail, message).with_remediation(
        "run microVM bottles on a host whose CPU exposes hardware virtualisation (vmx or svm in /proc/cpuinfo; on a VM, enable nested virtualisation on its host), or use the docker backend (`--backend docker`)",
    )
}

/// Runs the test guest on the KVM device at `path`, giving up after
/// `bound`.
///
/// The guest runs on its own thread. A vCPU stuck inside `KVM_RUN` cannot be
/// cancelled from safe code, so past the bound that thread is left behind;
/// preflight runs once per short-lived `bottle` process, which reaps it.
pub fn run_guest(path: &std::path::Path, bound: Duration) -> GuestOutcome {
    let Ok(path) = CString::new(path.as_os_str().as_bytes()) else {
        return GuestOutcome::NoAccess(nix::errno::Errno::EINVAL);
    };
    let (sender, receiver) = mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("kvm-smoke".into())
        .spawn(move || {
            // The receiver may have given up already; nobody is left to tell.
            let _ = sender.send(guest::run(&path));
        });
    if let Err(err) = spawned {
        return GuestOutcome::Refused {
            what: "starting the test thread",
            detail: err.to_string(),
        };
    }
    receiver
        .recv_timeout(bound)
        .unwrap_or(GuestOutcome::TimedOut)
}

#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
mod guest {
    //! The test guest itself, over rust-vmm's `kvm-ioctls`.

    use std::ffi::CStr;

    use kvm_bindings::{KVM_MAX_CPUID_ENTRIES, kvm_regs, kvm_segment, kvm_userspace_memory_region};
    use kvm_ioctls::{Kvm, VcpuExit};

    use super::{GUEST_PORT, GUEST_VALUE, GuestOutcome};

    const PAGE: usize = 4096;
    /// Guest memory: page tables in pages 1 to 3, code in page 8.
    const MEMORY: usize = 16 * PAGE;
    const PML4: usize = 0x1000;
    const PDPT: usize = 0x2000;
    const PD: usize = 0x3000;
    const CODE: usize = 0x8000;
    /// `xor eax, eax; cpuid; mov al, GUEST_VALUE; out GUEST_PORT, al; hlt`.
    const PROGRAM: [u8; 9] = [
        0x31,
        0xc0,
        0x0f,
        0xa2,
        0xb0,
        GUEST_VALUE,
        0xe6,
        GUEST_PORT as u8,
        0xf4,
    ];
    /// More exits than the program can make: a guest that keeps exiting
    /// without reaching `hlt` is not running the program.
    const MAX_EXITS: usize = 8;

    const PRESENT_WRITABLE: u64 = 0b11;
    const HUGE_PAGE: u64 = 1 << 7;
    const CR0_PE_MP_ET_NE_WP_PG: u64 = 0x8005_0033;
    const CR4_PAE: u64 = 1 << 5;
    const EFER_LME_LMA: u64 = 0x500;

    pub(super) fn run(path: &CStr) -> GuestOutcome {
        match run_inner(path) {
            Ok(outcome) | Err(outcome) => outcome,
        }
    }

    fn refused(what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> GuestOutcome {
        move |err| GuestOutcome::Refused {
            what,
            detail: err.to_string(),
        }
    }

    fn run_inner(path: &CStr) -> Result<GuestOutcome, GuestOutcome> {
        let kvm = Kvm::new_with_path(path)
            .map_err(|err| GuestOutcome::NoAccess(nix::errno::Errno::from_raw(err.errno())))?;
        let version = kvm.get_api_version();
        if version != 12 {
            return Err(GuestOutcome::Refused {
                what: "KVM_GET_API_VERSION",
                detail: if version < 0 {
                    "not a kvm device".to_owned()
                } else {
                    format!("api version {version}, expected 12")
                },
            });
        }
        // Declared before the VM so it is dropped after it. Over-allocated
        // by a page so a page-aligned window exists: KVM needs page-aligned
        // guest memory, and a Vec is only byte-aligned.
        let mut backing = vec![0u8; MEMORY + PAGE];
        let vm = kvm.create_vm().map_err(refused("KVM_CREATE_VM"))?;

        let start = backing.as_ptr().align_offset(PAGE);
        let memory = backing
            .get_mut(start..start + MEMORY)
            .ok_or(GuestOutcome::Refused {
                what: "allocating guest memory",
                detail: "no page-aligned window".to_owned(),
            })?;
        write_guest(memory);
        let region = kvm_userspace_memory_region {
            slot: 0,
            guest_phys_addr: 0,
            memory_size: MEMORY as u64,
            userspace_addr: memory.as_ptr() as u64,
            flags: 0,
        };
        raw::set_memory(&vm, region).map_err(refused("KVM_SET_USER_MEMORY_REGION"))?;

        let mut vcpu = vm.create_vcpu(0).map_err(refused("KVM_CREATE_VCPU"))?;
        let cpuid = kvm
            .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
            .map_err(refused("KVM_GET_SUPPORTED_CPUID"))?;
        vcpu.set_cpuid2(&cpuid).map_err(refused("KVM_SET_CPUID2"))?;
        let mut sregs = vcpu.get_sregs().map_err(refused("KVM_GET_SREGS"))?;
        let code = kvm_segment {
            base: 0,
            limit: 0xffff_ffff,
            selector: 0x8,
            type_: 0xb,
            present: 1,
            dpl: 0,
            db: 0,
            s: 1,
            l: 1,
            g: 1,
            avl: 0,
            unusable: 0,
            padding: 0,
        };
        let data = kvm_segment {
            selector: 0x10,
            type_: 0x3,
            l: 0,
            db: 1,
            ..code
        };
        sregs.cs = code;
        (sregs.ds, sregs.es, sregs.fs, sregs.gs, sregs.ss) = (data, data, data, data, data);
        sregs.cr3 = PML4 as u64;
        sregs.cr4 = CR4_PAE;
        sregs.cr0 = CR0_PE_MP_ET_NE_WP_PG;
        sregs.efer = EFER_LME_LMA;
        vcpu.set_sregs(&sregs).map_err(refused("KVM_SET_SREGS"))?;
        let regs = kvm_regs {
            rip: CODE as u64,
            rflags: 0x2,
            rsp: CODE as u64,
            ..Default::default()
        };
        vcpu.set_regs(&regs).map_err(refused("KVM_SET_REGS"))?;

        let mut wrote = false;
        for _ in 0..MAX_EXITS {
            let exit = vcpu.run().map_err(refused("KVM_RUN"))?;
            match exit {
                VcpuExit::IoOut(GUEST_PORT, [GUEST_VALUE]) if !wrote => wrote = true,
                VcpuExit::Hlt if wrote => return Ok(GuestOutcome::Clean),
                VcpuExit::Hlt => {
                    return Ok(GuestOutcome::BadExit(
                        "halted before writing its value".to_owned(),
                    ));
                }
                VcpuExit::InternalError => {
                    let suberror = raw::internal_suberror(vcpu.get_kvm_run());
                    return Ok(GuestOutcome::BadExit(format!(
                        "KVM_EXIT_INTERNAL_ERROR, suberror {suberror}"
                    )));
                }
                VcpuExit::FailEntry(reason, _) => {
                    return Ok(GuestOutcome::BadExit(format!(
                        "KVM_EXIT_FAIL_ENTRY, hardware reason {reason:#x}"
                    )));
                }
                VcpuExit::Shutdown => {
                    return Ok(GuestOutcome::BadExit(
                        "KVM_EXIT_SHUTDOWN: the guest triple-faulted".to_owned(),
                    ));
                }
                other => return Ok(GuestOutcome::BadExit(format!("unexpected exit {other:?}"))),
            }
        }
        Ok(GuestOutcome::BadExit(format!(
            "no halt after {MAX_EXITS} exits"
        )))
    }

    /// Identity-maps the first 2 MiB with one huge page and places the
    /// program.
    fn write_guest(memory: &mut [u8]) {
        let entries = [
            (PML4, PDPT as u64 | PRESENT_WRITABLE),
            (PDPT, PD as u64 | PRESENT_WRITABLE),
            (PD, PRESENT_WRITABLE | HUGE_PAGE),
        ];
        for (at, entry) in entries {
            memory[at..at + 8].copy_from_slice(&entry.to_le_bytes());
        }
        memory[CODE..CODE + PROGRAM.len()].copy_from_slice(&PROGRAM);
    }

    #[expect(
        unsafe_code,
        reason = "kvm-ioctls leaves two calls unsafe: registering guest memory and reading kvm_run's exit union"
    )]
    mod raw {
        //! The only unsafe code in bottle's host crates (ARCHITECTURE.md,
        //! invariant 8).

        use kvm_bindings::{kvm_run, kvm_userspace_memory_region};
        use kvm_ioctls::VmFd;

        /// Registers `region` as the VM's guest memory.
        pub(super) fn set_memory(
            vm: &VmFd,
            region: kvm_userspace_memory_region,
        ) -> Result<(), kvm_ioctls::Error> {
            // SAFETY: the region points into a live allocation of exactly
            // `memory_size` bytes owned by the caller (`run_inner`), which
            // drops it only after the VM and its vCPU, so the guest never
            // sees freed memory; nothing else aliases it while the guest runs.
            unsafe { vm.set_user_memory_region(region) }
        }

        /// The suberror of a `KVM_EXIT_INTERNAL_ERROR` exit.
        pub(super) fn internal_suberror(run: &kvm_run) -> u32 {
            // SAFETY: called only right after `KVM_RUN` returned
            // `KVM_EXIT_INTERNAL_ERROR`, for which the kernel fills the
            // union's `internal` member; it is plain integers, so any bits
            // are a valid value.
            unsafe { run.__bindgen_anon_1.internal.suberror }
        }
    }
}

#[cfg(not(all(target_os = "linux", target_arch = "x86_64")))]
mod guest {
    use std::ffi::CStr;

    use super::GuestOutcome;

    pub(super) fn run(_path: &CStr) -> GuestOutcome {
        GuestOutcome::Refused {
            what: "running the test guest",
            detail: "only built for x86-64 linux".to_owned(),
        }
    }
}
