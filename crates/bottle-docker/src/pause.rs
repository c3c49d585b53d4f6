//! The agent container's keep-alive program.
//!
//! The agent runs through `exec` (like `smolvm machine exec`), so the
//! container's own main process must do nothing, forever, in any image,
//! including `FROM scratch` images without `sleep`. We write a tiny static
//! ELF into the container for that: one `PT_LOAD` segment whose code blocks
//! in a syscall in a loop. Docker's init (`Init: true`, tini) runs it as its
//! child, so orphaned exec processes are still reaped.
//!
//! The machine code, per architecture:
//! - x86_64: `mov eax, 34 (pause); syscall; jmp -9`.
//! - aarch64 (which has no `pause`): `x0..x3 = 0; x8 = 73 (ppoll); svc 0;
//!   b -6` — `ppoll` with no fds and no timeout blocks until a signal.
//!
//! A gVisor box also gets [`UNAME_PATH`], as tiny and as image-independent:
//! it asks the box's kernel `uname(2)` and writes the answer (the 390 bytes
//! of `struct new_utsname`) to stdout, so launch can tell from inside the
//! box that a kernel other than the host's answers it.

/// Where the keep-alive program lives inside the agent container.
pub const PAUSE_PATH: &str = "/.bottle/pause";

const BASE: u64 = 0x40_0000;
const EHDR_SIZE: u16 = 64;
const PHDR_SIZE: u16 = 56;

const X86_64_CODE: &[u8] = &[
    0xb8, 0x22, 0x00, 0x00, 0x00, // mov eax, 34 (SYS_pause)
    0x0f, 0x05, // syscall
    0xeb, 0xf7, // jmp back to the mov
];

const AARCH64_CODE: [u32; 7] = [
    0xd280_0000, // mov x0, #0
    0xd280_0001, // mov x1, #0
    0xd280_0002, // mov x2, #0
    0xd280_0003, // mov x3, #0
    0xd280_0928, // mov x8, #73 (SYS_ppoll)
    0xd400_0001, // svc #0
    0x17ff_fffa, // b back to the first mov
];

/// Where the kernel-identity program lives inside a gVisor box.
pub const UNAME_PATH: &str = "/.bottle/uname";

/// An empty directory in a gVisor box's `/tmp`, so gVisor does not mount
/// a tmpfs of its own there (it does over an empty `/tmp`, and the host
/// would never see what is in it).
pub const GVISOR_TMP_KEEP: &str = "/tmp/.bottle";

/// The size of `struct new_utsname`: six fields of 65 bytes.
pub const UTSNAME_LEN: usize = 6 * 65;

const X86_64_UNAME: &[u8] = &[
    0x48, 0x81, 0xec, 0x90, 0x01, 0x00, 0x00, // sub rsp, 400
    0x48, 0x89, 0xe7, // mov rdi, rsp
    0xb8, 0x3f, 0x00, 0x00, 0x00, // mov eax, 63 (SYS_uname)
    0x0f, 0x05, // syscall
    0xb8, 0x01, 0x00, 0x00, 0x00, // mov eax, 1 (SYS_write)
    0xbf, 0x01, 0x00, 0x00, 0x00, // mov edi, 1 (stdout)
    0x48, 0x89, 0xe6, // mov rsi, rsp
    0xba, 0x86, 0x01, 0x00, 0x00, // mov edx, 390
    0x0f, 0x05, // syscall
    0xb8, 0x3c, 0x00, 0x00, 0x00, // mov eax, 60 (SYS_exit)
    0x31, 0xff, // xor edi, edi
    0x0f, 0x05, // syscall
];

const AARCH64_UNAME: [u32; 12] = [
    0xd106_43ff, // sub sp, sp, #400
    0x9100_03e0, // mov x0, sp
    0xd280_1408, // mov x8, #160 (SYS_uname)
    0xd400_0001, // svc #0
    0xd280_0020, // mov x0, #1 (stdout)
    0x9100_03e1, // mov x1, sp
    0xd280_30c2, // mov x2, #390
    0xd280_0808, // mov x8, #64 (SYS_write)
    0xd400_0001, // svc #0
    0xd280_0000, // mov x0, #0
    0xd280_0ba8, // mov x8, #93 (SYS_exit)
    0xd400_0001, // svc #0
];

/// The keep-alive ELF for a Docker architecture name (`x86_64`/`amd64`,
/// `aarch64`/`arm64`), or `None` if we have none.
pub fn pause_elf(arch: &str) -> Option<Vec<u8>> {
    match arch {
        "x86_64" | "amd64" => elf(0x3e, X86_64_CODE.to_vec()),
        "aarch64" | "arm64" => elf(
            0xb7,
            AARCH64_CODE.iter().flat_map(|i| i.to_le_bytes()).collect(),
        ),
        _ => None,
    }
}

/// The kernel-identity ELF ([`UNAME_PATH`]) for a Docker architecture
/// name, or `None` if we have none.
pub fn uname_elf(arch: &str) -> Option<Vec<u8>> {
    match arch {
        "x86_64" | "amd64" => elf(0x3e, X86_64_UNAME.to_vec()),
        "aarch64" | "arm64" => elf(
            0xb7,
            AARCH64_UNAME.iter().flat_map(|i| i.to_le_bytes()).collect(),
        ),
        _ => None,
    }
}

/// What the box's kernel says it is, from [`UNAME_PATH`]'s output: the
/// `release` and `version` fields, or `None` when the output is not a
/// `struct new_utsname`.
pub fn parse_utsname(out: &[u8]) -> Option<(String, String)> {
    if out.len() != UTSNAME_LEN {
        return None;
    }
    let field = |i: usize| {
        let raw = &out[i * 65..(i + 1) * 65];
        let end = raw.iter().position(|b| *b == 0)?;
        std::str::from_utf8(&raw[..end]).ok().map(str::to_string)
    };
    if field(0)? != "Linux" {
        return None;
    }
    Some((field(2)?, field(3)?))
}

/// A static ELF for `machine` whose one segment is `code`, entered at its
/// first byte.
fn elf(machine: u16, code: Vec<u8>) -> Option<Vec<u8>> {
    let code_offset = u64::from(EHDR_SIZE + PHDR_SIZE);
    let total = code_offset + code.len() as u64;
    let mut elf = Vec::with_capacity(usize::try_from(total).ok()?);
    // ELF header.
    elf.extend_from_slice(&[0x7f, b'E', b'L', b'F', 2, 1, 1, 0]);
    elf.extend_from_slice(&[0; 8]);
    elf.extend_from_slice(&2u16.to_le_bytes()); // ET_EXEC
    elf.extend_from_slice(&machine.to_le_bytes());
    elf.extend_from_slice(&1u32.to_le_bytes()); // EV_CURRENT
    elf.extend_from_slice(&(BASE + code_offset).to_le_bytes()); // e_entry
    elf.extend_from_slice(&u64::from(EHDR_SIZE).to_le_bytes()); // e_phoff
    elf.extend_from_slice(&0u64.to_le_bytes()); // e_shoff
    elf.extend_from_slice(&0u32.to_le_bytes()); // e_flags
    elf.extend_from_slice(&EHDR_SIZE.to_le_bytes());
    elf.extend_from_slice(&PHDR_SIZE.to_le_bytes());
    elf.extend_from_slice(&1u16.to_le_bytes()); // e_phnum
    elf.extend_from_slice(&0u16.to_le_bytes()); // e_shentsize
    elf.extend_from_slice(&0u16.to_le_bytes()); // e_shnum
    elf.extend_from_slice(&0u16.to_le_bytes()); // e_shstrndx
    // One PT_LOAD, read + execute, covering the whole file.
    elf.extend_from_slice(&1u32.to_le_bytes()); // PT_LOAD
    elf.extend_from_slice(&5u32.to_le_bytes()); // PF_R | PF_X
    elf.extend_from_slice(&0u64.to_le_bytes()); // p_offset
    elf.extend_from_slice(&BASE.to_le_bytes()); // p_vaddr
    elf.extend_from_slice(&BASE.to_le_bytes()); // p_paddr
    elf.extend_from_slice(&total.to_le_bytes()); // p_filesz
    elf.extend_from_slice(&total.to_le_bytes()); // p_memsz
    elf.extend_from_slice(&0x1000u64.to_le_bytes()); // p_align
    elf.extend_from_slice(&code);
    Some(elf)
}

/// What [`UNAME_PATH`] prints in a gVisor box of 20221219: `uname(2)`'s
/// six 65-byte fields, four of them set.
#[cfg(test)]
pub(crate) fn gvisor_utsname() -> Vec<u8> {
    let mut out = vec![0u8; UTSNAME_LEN];
    for (i, text) in [
        "Linux",
        "bottle",
        "4.4.0",
        "#1 SMP Sun Jan 10 15:06:54 PST 2016",
    ]
    .iter()
    .enumerate()
    {
        out[i * 65..i * 65 + text.len()].copy_from_slice(text.as_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_are_consistent() {
        for (arch, machine) in [("x86_64", 0x3e), ("arm64", 0xb7)] {
            let elf = pause_elf(arch).unwrap();
            assert_eq!(&elf[..4], b"\x7fELF");
            assert_eq!(u16::from_le_bytes([elf[18], elf[19]]), machine);
            let entry = u64::from_le_bytes(elf[24..32].try_into().unwrap());
            assert_eq!(entry, BASE + 120);
            let filesz = u64::from_le_bytes(elf[96..104].try_into().unwrap());
            assert_eq!(filesz, elf.len() as u64);
            // aarch64 instructions must be 4-byte aligned.
            assert_eq!((entry - BASE) % 4, 0);
        }
        assert_eq!(pause_elf("s390x"), None);
        for arch in ["x86_64", "arm64"] {
            let elf = uname_elf(arch).unwrap();
            let filesz = u64::from_le_bytes(elf[96..104].try_into().unwrap());
            assert_eq!(filesz, elf.len() as u64);
        }
        assert_eq!(uname_elf("s390x"), None);
    }

    #[test]
    fn utsname_output_is_read_field_by_field() {
        let mut out = gvisor_utsname();
        assert_eq!(
            parse_utsname(&out),
            Some(("4.4.0".into(), "#1 SMP Sun Jan 10 15:06:54 PST 2016".into()))
        );
        assert_eq!(parse_utsname(&out[..100]), None);
        out[0] = b'X';
        assert_eq!(parse_utsname(&out), None);
    }

    #[test]
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    fn the_x86_64_uname_program_prints_this_kernel() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("uname");
        std::fs::write(&path, uname_elf("x86_64").unwrap()).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        #[expect(
            clippy::disallowed_methods,
            reason = "the test runs the generated program itself"
        )]
        let out = std::process::Command::new(&path).output().unwrap();
        assert!(out.status.success(), "{out:?}");
        let (release, version) = parse_utsname(&out.stdout).expect("a utsname");
        let host = |f: &str| {
            std::fs::read_to_string(format!("/proc/sys/kernel/{f}"))
                .unwrap()
                .trim()
                .to_string()
        };
        assert_eq!(release, host("osrelease"));
        assert_eq!(version, host("version"));
    }

    #[test]
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    fn the_x86_64_program_blocks_until_killed() {
        use std::os::unix::fs::PermissionsExt;
        use std::os::unix::process::ExitStatusExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pause");
        std::fs::write(&path, pause_elf("x86_64").unwrap()).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        #[expect(
            clippy::disallowed_methods,
            reason = "the test runs the generated program itself"
        )]
        let mut child = std::process::Command::new(&path).spawn().unwrap();
        // Once it leaves the run queue and the exec's own waits (`D`: the
        // kernel reading the file in on a busy disk) it is either asleep in
        // pause(2) or dead (a zombie, as nobody has reaped it yet).
        let stat = format!("/proc/{}/stat", child.id());
        let state = bottle_test_support::wait_for(
            "the program to block or die",
            std::time::Duration::from_secs(10),
            || {
                let stat = std::fs::read_to_string(&stat).ok()?;
                let state = stat.rsplit_once(") ")?.1.chars().next()?;
                (!matches!(state, 'R' | 'D')).then_some(state)
            },
        );
        assert_eq!(state, 'S', "it did not block in pause(2)");
        assert!(child.try_wait().unwrap().is_none());
        child.kill().unwrap();
        let status = child.wait().unwrap();
        assert_eq!(status.signal(), Some(9));
    }
}
