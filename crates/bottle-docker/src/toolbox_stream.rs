//! The in-box agent's stdin and stdout as one attached Engine API exec,
//! bridged to the blocking [`Write`]/[`Read`] that
//! [`bottle_core::sandbox::Toolbox`] speaks its frames over.
//!
//! The exec's two ends are async (bollard's `input` and `output`), driven
//! by two tasks on the [`Engine`]'s runtime; the blocking side talks to
//! them over bounded channels, so a slow reader holds the agent back
//! instead of buffering without end. Only the agent's stdout becomes
//! frames: its stderr is dropped, never mixed into the channel.
//!
//! Dropping the [`ToolboxStream`] ends the exec: the writer task closes
//! the exec's stdin, the agent sees EOF and exits, and the reader task
//! ends with its output.

use std::io::{self, Read, Write};

use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use bottle_core::sandbox::ToolboxStream;
use futures_util::StreamExt;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

use crate::client::Engine;
use crate::error::DockerError;

/// How many chunks may wait in each direction.
const CHUNKS_IN_FLIGHT: usize = 64;

/// Starts `argv` (the in-box agent, in one of its modes) in `container` as
/// `user` and returns its stdin and stdout; its stderr is dropped.
pub(crate) fn open_argv(
    engine: &Engine,
    container: &str,
    user: &str,
    argv: Vec<String>,
) -> Result<ToolboxStream, DockerError> {
    open_exec(engine, container, user, argv).map(|(stream, _)| stream)
}

/// [`open_argv`], and the exec's ID.
pub(crate) fn open_exec(
    engine: &Engine,
    container: &str,
    user: &str,
    argv: Vec<String>,
) -> Result<(ToolboxStream, String), DockerError> {
    let docker = &engine.docker;
    let (exec, started) = engine.block_on(async {
        let exec = docker
            .create_exec(
                container,
                CreateExecOptions {
                    attach_stdin: Some(true),
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    tty: Some(false),
                    cmd: Some(argv),
                    user: Some(user.to_string()),
                    ..CreateExecOptions::default()
                },
            )
            .await
            .map_err(DockerError::api(format!(
                "create the in-box agent's exec in {container}"
            )))?;
        let started = docker
            .start_exec(
                &exec.id,
                Some(StartExecOptions {
                    detach: false,
                    tty: false,
                    output_capacity: None,
                }),
            )
            .await
            .map_err(DockerError::api(format!(
                "start the in-box agent in {container}"
            )))?;
        Ok::<_, DockerError>((exec.id, started))
    })?;
    let StartExecResults::Attached {
        mut output,
        mut input,
    } = started
    else {
        return Err(DockerError::Terminal {
            action: format!("start the in-box agent in {container}"),
            detail: "the daemon did not attach to the exec".into(),
        });
    };

    let (to_agent, mut chunks_in) = mpsc::channel::<Vec<u8>>(CHUNKS_IN_FLIGHT);
    let runtime = engine.handle();
    runtime.spawn(async move {
        while let Some(chunk) = chunks_in.recv().await {
            if input.write_all(&chunk).await.is_err() || input.flush().await.is_err() {
                return;
            }
        }
        // Every sender is gone: the agent sees EOF on its stdin and exits.
        let _ = input.shutdown().await;
    });

    let (chunks_out, from_agent) = mpsc::channel::<io::Result<Vec<u8>>>(CHUNKS_IN_FLIGHT);
    runtime.spawn(async move {
        while let Some(item) = output.next().await {
            let chunk = match item {
                Ok(LogOutput::StdOut { message }) => Ok(message.to_vec()),
                // The agent's own complaints are not frames.
                Ok(LogOutput::StdErr { .. } | LogOutput::StdIn { .. }) => continue,
                Ok(LogOutput::Console { message }) => Ok(message.to_vec()),
                Err(err) => Err(io::Error::other(err.to_string())),
            };
            let failed = chunk.is_err();
            // A closed receiver: the host let the stream go.
            if chunks_out.send(chunk).await.is_err() || failed {
                return;
            }
        }
    });

    let stream = ToolboxStream {
        to_agent: Box::new(ChunkWriter { chunks: to_agent }),
        from_agent: Box::new(ChunkReader {
            chunks: from_agent,
            current: Vec::new(),
            at: 0,
        }),
    };
    Ok((stream, exec))
}

/// The blocking end of the exec's stdin. Like every blocking call of this
/// crate, it is used from outside the Engine's runtime (the caller of
/// `execute`); tokio refuses a blocking send from inside one.
struct ChunkWriter {
    chunks: mpsc::Sender<Vec<u8>>,
}

impl Write for ChunkWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        self.chunks.blocking_send(buf.to_vec()).map_err(|_| {
            io::Error::new(
                io::ErrorKind::BrokenPipe,
                "the in-box agent's stdin is closed",
            )
        })?;
        Ok(buf.len())
    }

    /// Each write is already on its way to the writer task.
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The blocking end of the exec's stdout.
struct ChunkReader {
    chunks: mpsc::Receiver<io::Result<Vec<u8>>>,
    current: Vec<u8>,
    at: usize,
}

impl Read for ChunkReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.at == self.current.len() {
            match self.chunks.blocking_recv() {
                Some(Ok(chunk)) => {
                    self.current = chunk;
                    self.at = 0;
                }
                Some(Err(err)) => return Err(err),
                // The exec's output ended.
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.current.len() - self.at);
        buf[..n].copy_from_slice(&self.current[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_span_chunks_and_end_when_the_output_ends() {
        let (chunks, receiver) = mpsc::channel(CHUNKS_IN_FLIGHT);
        let mut reader = ChunkReader {
            chunks: receiver,
            current: Vec::new(),
            at: 0,
        };
        let sender = std::thread::spawn(move || {
            for chunk in [&b"\x00\x00"[..], b"\x00\x02", b"{}"] {
                chunks.blocking_send(Ok(chunk.to_vec())).unwrap();
            }
        });
        let mut all = Vec::new();
        reader.read_to_end(&mut all).unwrap();
        sender.join().unwrap();
        assert_eq!(all, b"\x00\x00\x00\x02{}");
        assert_eq!(reader.read(&mut [0; 4]).unwrap(), 0);
    }

    #[test]
    fn a_broken_output_is_an_error_not_an_end() {
        let (chunks, receiver) = mpsc::channel(CHUNKS_IN_FLIGHT);
        let mut reader = ChunkReader {
            chunks: receiver,
            current: Vec::new(),
            at: 0,
        };
        chunks
            .blocking_send(Err(io::Error::other("connection reset")))
            .unwrap();
        assert!(reader.read(&mut [0; 4]).is_err());
    }

    #[test]
    fn writes_after_the_agent_went_away_fail() {
        let (chunks, mut receiver) = mpsc::channel(CHUNKS_IN_FLIGHT);
        let mut writer = ChunkWriter { chunks };
        writer.write_all(b"frame").unwrap();
        assert_eq!(receiver.blocking_recv().unwrap(), b"frame");
        drop(receiver);
        let err = writer.write_all(b"more").unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::BrokenPipe);
    }
}
