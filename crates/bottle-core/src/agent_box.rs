//! What every box receives before its agent runs, and the one trait a
//! backend implements to put it there (ARCHITECTURE.md invariant 4).
//!
//! [`agent_files`] lists the files: `/etc/bottle`, the MCP config naming
//! supervise, the prompt and the skills. [`crate::ca_install`] adds the
//! CA through the same trait, and the in-box agent is found (and checked
//! static) by [`crate::bundle_binary::find_toolbox`]. A backend decides
//! only *how* a file gets in ([`AgentBox`]): docker packs every file into
//! one archive upload before the box starts, smolmachines copies each with
//! `machine cp`. The environment is not a file here: docker gives it to the
//! container, a microVM gets it with every `machine exec`.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::agent::{AGENT_DIR, AGENT_MCP_CONFIG, AGENT_PROMPT_PATH, AGENT_SKILLS_DIR};

/// What is at a path inside the box, without following a final symlink.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// Nothing.
    Missing,
    /// A directory.
    Dir,
    /// A regular file, its contents and permission bits.
    File {
        /// The file's contents.
        contents: Vec<u8>,
        /// The file's permission bits.
        mode: u32,
    },
    /// A symlink and its target as stored.
    Link(String),
}

/// How running a tool in the box went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolRun {
    /// It exited with this code; stderr kept for a warning.
    Exited {
        /// The exit code.
        code: i32,
        /// What it wrote to stderr.
        stderr: String,
    },
    /// It was still running when the backend's bound passed; it was
    /// abandoned and may still be running.
    TimedOut,
    /// The box could not run it (no such program, no shell for a script).
    CouldNotRun(String),
}

/// The box's refusal of one write (a read-only directory, no room left),
/// with its reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused(pub String);

/// Whose a file put in the box is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileOwner {
    /// root's: the agent may read it, not change it.
    Root,
    /// The agent's user's: its own working material (the prompt, the
    /// skills).
    Agent,
}

/// What a [`BoxFile`] is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Contents {
    /// A directory with these permission bits.
    Dir {
        /// Its permission bits.
        mode: u32,
    },
    /// A file with these bytes and permission bits.
    File {
        /// Its contents.
        bytes: Vec<u8>,
        /// Its permission bits.
        mode: u32,
    },
    /// A file or a directory tree on the host, copied with its modes.
    Host(PathBuf),
}

/// One file (or directory) a box receives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BoxFile {
    /// Where in the box (absolute).
    pub path: String,
    /// What goes there.
    pub contents: Contents,
    /// Whose it is.
    pub owner: FileOwner,
}

/// The primitives a backend provides over its box: what
/// [`crate::ca_install`] and [`provision`] need.
pub trait AgentBox {
    /// The backend's error: the box could not be reached at all.
    type Error;
    /// What is at `path`.
    fn entry(&mut self, path: &str) -> Result<Entry, Self::Error>;
    /// Writes `contents` to `path` as root, creating parent directories;
    /// `Ok(Err(_))` when the box refused this write.
    fn write(
        &mut self,
        path: &str,
        contents: &[u8],
        mode: u32,
    ) -> Result<Result<(), Refused>, Self::Error>;
    /// Puts `file` in the box, creating parent directories as root's;
    /// `Ok(Err(_))` when the box refused it.
    fn put(&mut self, file: &BoxFile) -> Result<Result<(), Refused>, Self::Error>;
    /// Makes `path` a symlink to `target` as root (replacing a file or
    /// link there); `Ok(Err(_))` when the box refused it.
    fn symlink(&mut self, path: &str, target: &str) -> Result<Result<(), Refused>, Self::Error>;
    /// Whether the directory `dir` holds any entry (a missing one holds
    /// none).
    fn dir_has_entries(&mut self, dir: &str) -> Result<bool, Self::Error>;
    /// Runs `argv` as root and waits for it at most `timeout`.
    fn run(&mut self, argv: &[&str], timeout: Duration) -> Result<ToolRun, Self::Error>;
    /// Makes every write, put and link so far take effect, for a box that
    /// holds them back to make them in one go (each costs it a round
    /// trip); `Ok(Err(_))` when the box refused them. A box that writes at
    /// once has nothing to do.
    fn flush(&mut self) -> Result<Result<(), Refused>, Self::Error> {
        Ok(Ok(()))
    }
}

/// What [`agent_files`] is made from.
#[derive(Debug, Clone, Copy)]
pub struct AgentFileInputs<'a> {
    /// The bundle's address on the bottle network, which the MCP config
    /// names.
    pub bundle_address: Ipv4Addr,
    /// The prompt file on the host, if the agent has one.
    pub prompt: Option<&'a Path>,
    /// The skills directories on the host.
    pub skills: &'a [PathBuf],
}

/// The files every box receives, in the order they go in: `/etc/bottle`,
/// the MCP config naming supervise, the prompt at [`AGENT_PROMPT_PATH`],
/// and each skill under [`AGENT_SKILLS_DIR`] by its directory's name.
pub fn agent_files(inputs: &AgentFileInputs<'_>) -> Vec<BoxFile> {
    let root = |path: &str, contents: Contents| BoxFile {
        path: path.to_string(),
        contents,
        owner: FileOwner::Root,
    };
    let mcp = crate::bundle::mcp_config(&inputs.bundle_address.to_string());
    let mut files = vec![
        root(AGENT_DIR, Contents::Dir { mode: 0o755 }),
        root(
            AGENT_MCP_CONFIG,
            Contents::File {
                bytes: mcp.into_bytes(),
                mode: 0o644,
            },
        ),
    ];
    if let Some(prompt) = inputs.prompt {
        files.push(BoxFile {
            path: AGENT_PROMPT_PATH.to_string(),
            contents: Contents::Host(prompt.to_path_buf()),
            owner: FileOwner::Agent,
        });
    }
    if !inputs.skills.is_empty() {
        files.push(root(AGENT_SKILLS_DIR, Contents::Dir { mode: 0o755 }));
    }
    for skill in inputs.skills {
        files.push(BoxFile {
            path: format!("{AGENT_SKILLS_DIR}/{}", skill_name(skill)),
            contents: Contents::Host(skill.clone()),
            owner: FileOwner::Agent,
        });
    }
    files
}

/// The name a skill's directory gets in the box: its own.
fn skill_name(skill: &Path) -> String {
    skill
        .file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_else(|| "skill".into())
}

/// Puts every file in `files` in `target`, in order, and flushes; the
/// first refusal ends it.
pub fn provision<B: AgentBox>(
    target: &mut B,
    files: &[BoxFile],
) -> Result<Result<(), Refused>, B::Error> {
    for file in files {
        if let Err(refused) = target.put(file)? {
            return Ok(Err(refused));
        }
    }
    target.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A box that records what is put in it.
    #[derive(Default)]
    struct Recorder {
        put: Vec<BoxFile>,
        flushes: usize,
        refuse: Option<&'static str>,
    }

    impl AgentBox for Recorder {
        type Error = std::convert::Infallible;
        fn entry(&mut self, _: &str) -> Result<Entry, Self::Error> {
            Ok(Entry::Missing)
        }
        fn write(&mut self, _: &str, _: &[u8], _: u32) -> Result<Result<(), Refused>, Self::Error> {
            Ok(Ok(()))
        }
        fn put(&mut self, file: &BoxFile) -> Result<Result<(), Refused>, Self::Error> {
            if let Some(why) = self.refuse.filter(|_| file.path == AGENT_PROMPT_PATH) {
                return Ok(Err(Refused(why.into())));
            }
            self.put.push(file.clone());
            Ok(Ok(()))
        }
        fn symlink(&mut self, _: &str, _: &str) -> Result<Result<(), Refused>, Self::Error> {
            Ok(Ok(()))
        }
        fn dir_has_entries(&mut self, _: &str) -> Result<bool, Self::Error> {
            Ok(false)
        }
        fn run(&mut self, _: &[&str], _: Duration) -> Result<ToolRun, Self::Error> {
            Ok(ToolRun::CouldNotRun("no tools here".into()))
        }
        fn flush(&mut self) -> Result<Result<(), Refused>, Self::Error> {
            self.flushes += 1;
            Ok(Ok(()))
        }
    }

    const BUNDLE: Ipv4Addr = Ipv4Addr::new(10, 243, 0, 2);

    #[test]
    fn every_box_gets_its_dir_the_mcp_config_the_prompt_and_the_skills() {
        let skills = [PathBuf::from("/work/skills/review"), PathBuf::from("/")];
        let files = agent_files(&AgentFileInputs {
            bundle_address: BUNDLE,
            prompt: Some(Path::new("/work/prompt.md")),
            skills: &skills,
        });
        let shape: Vec<(&str, FileOwner)> = files
            .iter()
            .map(|file| (file.path.as_str(), file.owner))
            .collect();
        assert_eq!(
            shape,
            [
                ("/etc/bottle", FileOwner::Root),
                ("/etc/bottle/mcp.json", FileOwner::Root),
                ("/etc/bottle/prompt.md", FileOwner::Agent),
                ("/etc/bottle/skills", FileOwner::Root),
                ("/etc/bottle/skills/review", FileOwner::Agent),
                ("/etc/bottle/skills/skill", FileOwner::Agent),
            ]
        );
        let Contents::File { bytes, mode } = &files[1].contents else {
            panic!("{:?}", files[1]);
        };
        assert_eq!(*mode, 0o644);
        assert_eq!(
            String::from_utf8_lossy(bytes),
            crate::bundle::mcp_config("10.243.0.2")
        );
        assert_eq!(
            files[2].contents,
            Contents::Host(PathBuf::from("/work/prompt.md"))
        );
    }

    #[test]
    fn without_a_prompt_or_skills_a_box_gets_its_dir_and_the_mcp_config() {
        let files = agent_files(&AgentFileInputs {
            bundle_address: BUNDLE,
            prompt: None,
            skills: &[],
        });
        let paths: Vec<&str> = files.iter().map(|file| file.path.as_str()).collect();
        assert_eq!(paths, ["/etc/bottle", "/etc/bottle/mcp.json"]);
    }

    #[test]
    fn provisioning_puts_every_file_in_order_then_flushes_once() {
        let files = agent_files(&AgentFileInputs {
            bundle_address: BUNDLE,
            prompt: Some(Path::new("/work/prompt.md")),
            skills: &[],
        });
        let mut target = Recorder::default();
        assert_eq!(provision(&mut target, &files), Ok(Ok(())));
        assert_eq!(target.put, files);
        assert_eq!(target.flushes, 1);
    }

    #[test]
    fn a_refused_file_ends_provisioning_with_the_reason() {
        let files = agent_files(&AgentFileInputs {
            bundle_address: BUNDLE,
            prompt: Some(Path::new("/work/prompt.md")),
            skills: &[PathBuf::from("/work/skills/review")],
        });
        let mut target = Recorder {
            refuse: Some("Read-only file system"),
            ..Recorder::default()
        };
        assert_eq!(
            provision(&mut target, &files),
            Ok(Err(Refused("Read-only file system".into())))
        );
        assert_eq!(target.put.len(), 2, "nothing after the refusal goes in");
        assert_eq!(target.flushes, 0);
    }
}
