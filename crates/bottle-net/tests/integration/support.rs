//! A command runner that records argv and answers with canned output.

use std::io;
use std::sync::{Arc, Mutex};

use bottle_core::exec::{CommandOutput, CommandRunner, CommandSpec};

type Respond = dyn Fn(&CommandSpec) -> io::Result<CommandOutput> + Send + Sync;

/// Records every command it is asked to run.
pub struct RecordingRunner {
    calls: Mutex<Vec<Vec<String>>>,
    respond: Box<Respond>,
}

impl RecordingRunner {
    /// A runner whose commands all succeed.
    pub fn succeeding() -> Arc<RecordingRunner> {
        RecordingRunner::with(|_| Ok(exit(0, "")))
    }

    /// A runner answering with `respond`.
    pub fn with(
        respond: impl Fn(&CommandSpec) -> io::Result<CommandOutput> + Send + Sync + 'static,
    ) -> Arc<RecordingRunner> {
        Arc::new(RecordingRunner {
            calls: Mutex::new(Vec::new()),
            respond: Box::new(respond),
        })
    }

    /// The argv of every call so far.
    pub fn calls(&self) -> Vec<Vec<String>> {
        self.calls.lock().unwrap().clone()
    }
}

impl CommandRunner for RecordingRunner {
    fn run(&self, spec: &CommandSpec) -> io::Result<CommandOutput> {
        self.calls.lock().unwrap().push(spec.argv());
        (self.respond)(spec)
    }
}

/// A finished process with `code` and `stderr`.
pub fn exit(code: i32, stderr: &str) -> CommandOutput {
    CommandOutput {
        code: Some(code),
        stdout: Vec::new(),
        stderr: stderr.as_bytes().to_vec(),
    }
}
