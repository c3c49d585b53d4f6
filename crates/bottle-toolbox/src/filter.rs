//! `bottle-toolbox filtered -- ARGV…`: starts `ARGV` under bottle's
//! system-call filter.
//!
//! Under runc the Engine applies the container's seccomp profile to every
//! process it starts in the box, execs included. gVisor 20221219, even with
//! `--oci-seccomp`, applies it to the container's first process only, and
//! the agent's processes all come from execs; the docker backend therefore
//! starts each of them through this mode in a gVisor box. The filter
//! refuses (`EPERM`) what Docker's default profile refuses a container
//! without capabilities: new namespaces (`unshare`, `setns`, `clone` with
//! a namespace flag), mounts, keyrings, BPF, perf events, `userfaultfd`,
//! kernel modules and `kexec`, handle-based opens, swap, reboot, clock and
//! accounting changes; `clone3`, whose flags a filter cannot read, answers
//! `ENOSYS` so libcs fall back to `clone`. A foreign architecture's or the
//! x32 ABI's calls are refused whole. It is inherited by everything the
//! program starts and cannot be removed.

/// Installs the filter on this process (`no_new_privs` first, which the
/// kernel requires) and replaces it with `argv`. Returns only on failure,
/// saying why.
pub(crate) fn exec_filtered(argv: &[String]) -> String {
    let Some((program, args)) = argv.split_first() else {
        return "no program to start".into();
    };
    if let Err(why) = install() {
        return why;
    }
    use std::os::unix::process::CommandExt as _;
    #[expect(
        clippy::disallowed_methods,
        reason = "this replaces the in-box agent with the agent's program inside the box; bottle-core's runner is for the host"
    )]
    let err = std::process::Command::new(program).args(args).exec();
    format!("cannot start {program:?}: {err}")
}

/// Puts the filter on this process for good.
fn install() -> Result<(), String> {
    nix::sys::prctl::set_no_new_privs().map_err(|err| format!("cannot set no_new_privs: {err}"))?;
    let program = program()?;
    let fprog = libc::sock_fprog {
        len: u16::try_from(program.len()).map_err(|_| "the filter is too long".to_string())?,
        filter: program.as_ptr().cast_mut(),
    };
    #[expect(
        unsafe_code,
        reason = "installing a seccomp filter has no safe wrapper; the pointer is to a live local program"
    )]
    // SAFETY: `fprog` and the instructions it points to outlive the call;
    // the kernel copies the program before prctl returns.
    let rc = unsafe {
        libc::prctl(
            libc::PR_SET_SECCOMP,
            libc::SECCOMP_MODE_FILTER,
            &raw const fprog,
            0,
            0,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(format!(
            "cannot install the system-call filter: {}",
            std::io::Error::last_os_error()
        ))
    }
}

/// The calls refused with `EPERM`, by number.
#[cfg(target_arch = "x86_64")]
const REFUSED: &[libc::c_long] = &[
    libc::SYS_unshare,
    libc::SYS_setns,
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_move_mount,
    libc::SYS_open_tree,
    libc::SYS_fsopen,
    libc::SYS_fsconfig,
    libc::SYS_fsmount,
    libc::SYS_fspick,
    libc::SYS_mount_setattr,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_userfaultfd,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_open_by_handle_at,
    libc::SYS_name_to_handle_at,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_reboot,
    libc::SYS_acct,
    libc::SYS_quotactl,
    libc::SYS_lookup_dcookie,
    libc::SYS_iopl,
    libc::SYS_ioperm,
    libc::SYS_syslog,
    libc::SYS_settimeofday,
    libc::SYS_clock_settime,
    libc::SYS_clock_adjtime,
    libc::SYS_adjtimex,
    libc::SYS_vhangup,
    libc::SYS_uselib,
    libc::SYS_ustat,
    libc::SYS_sysfs,
    libc::SYS__sysctl,
    libc::SYS_fanotify_init,
];

/// `clone` flags that make a new namespace.
const NAMESPACE_FLAGS: u32 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWCGROUP
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET) as u32;

/// `AUDIT_ARCH_X86_64`: the architecture the filter's numbers are for.
#[cfg(target_arch = "x86_64")]
const ARCH: u32 = 0xC000_003E;

/// Where `seccomp_data` keeps the call's number, its architecture and
/// the low half of its first argument (little-endian).
const OFFSET_NR: u32 = 0;
const OFFSET_ARCH: u32 = 4;
const OFFSET_ARG0_LOW: u32 = 16;

/// The x32 ABI's calls carry this bit.
const X32_BIT: u32 = 0x4000_0000;

fn statement(code: u32, k: u32) -> libc::sock_filter {
    libc::sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u32, k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    }
}

/// The filter program.
#[cfg(target_arch = "x86_64")]
fn program() -> Result<Vec<libc::sock_filter>, String> {
    const LOAD: u32 = libc::BPF_LD | libc::BPF_W | libc::BPF_ABS;
    const EQUAL: u32 = libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K;
    const AT_LEAST: u32 = libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K;
    const ANY_BIT: u32 = libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K;
    const RETURN: u32 = libc::BPF_RET | libc::BPF_K;
    let refuse = libc::SECCOMP_RET_ERRNO | libc::EPERM as u32;
    let absent = libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32;
    let number = |nr: libc::c_long| u32::try_from(nr).map_err(|_| format!("call {nr}"));

    let mut program = vec![
        statement(LOAD, OFFSET_ARCH),
        jump(EQUAL, ARCH, 1, 0),
        statement(RETURN, libc::SECCOMP_RET_KILL_PROCESS),
        statement(LOAD, OFFSET_NR),
        jump(AT_LEAST, X32_BIT, 0, 1),
        statement(RETURN, refuse),
    ];
    for nr in REFUSED {
        program.push(jump(EQUAL, number(*nr)?, 0, 1));
        program.push(statement(RETURN, refuse));
    }
    program.push(jump(EQUAL, number(libc::SYS_clone3)?, 0, 1));
    program.push(statement(RETURN, absent));
    // clone: refused when its flags ask for a namespace.
    program.push(jump(EQUAL, number(libc::SYS_clone)?, 0, 3));
    program.push(statement(LOAD, OFFSET_ARG0_LOW));
    program.push(jump(ANY_BIT, NAMESPACE_FLAGS, 0, 1));
    program.push(statement(RETURN, refuse));
    program.push(statement(RETURN, libc::SECCOMP_RET_ALLOW));
    Ok(program)
}

#[cfg(not(target_arch = "x86_64"))]
fn program() -> Result<Vec<libc::sock_filter>, String> {
    Err("bottle's system-call filter is written for x86_64 only".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_jump_lands_inside_the_program_which_ends_allowing() {
        let program = program().unwrap();
        let is_jump = |code: u16| u32::from(code) & 0x07 == libc::BPF_JMP;
        for (i, instruction) in program.iter().enumerate() {
            if is_jump(instruction.code) {
                for offset in [instruction.jt, instruction.jf] {
                    assert!(
                        i + 1 + usize::from(offset) < program.len(),
                        "instruction {i}"
                    );
                }
            }
        }
        assert_eq!(program.last().map(|i| i.k), Some(libc::SECCOMP_RET_ALLOW));
    }
}
