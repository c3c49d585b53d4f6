//! `bottle commit`: an image of the agent's filesystem with the original
//! image's configuration and nothing of bottle's.
//!
//! `POST /commit` of the agent's container cannot do it: the Engine merges
//! the container's own configuration into the image's (its environment,
//! which holds the bundle's proxy and CA variables, its labels, which are
//! bottle's), and the container's entrypoint is the keep-alive. So:
//!
//! 1. the container's filesystem is exported (`GET /containers/{id}/export`)
//!    and filtered on its way through ([`scrub_tar`]): `/.bottle`,
//!    `/etc/bottle` (prompt, skills, MCP config, the CA's copy) and
//!    `/.dockerenv` are left out, and so is the bottle's CA wherever the
//!    launch put it: an anchor or hashed-directory file holding exactly the
//!    CA, a symlink to bottle's anchor, and the CA's PEM block in any bundle
//!    under `/etc` (and the anchor directories);
//! 2. the result is imported (`POST /images/create?fromSrc=-`) as an image
//!    with no configuration;
//! 3. a container of that image is created, never started, with the
//!    original image's configuration, and committed (`POST /commit`) with
//!    that same configuration under the operator's name, so the merge has
//!    nothing of bottle's to add; the container is removed.
//!
//! The image is one layer holding the whole filesystem: the layers it
//! started from are not shared. What cannot be filtered is said in the
//! docs: a CA copied into a binary store (a Java keystore), anything the
//! agent itself wrote that names the bundle.

use std::io::{self, Read, Write};

use bollard::models::{ContainerConfig, ContainerCreateBody, HostConfig};
use bollard::query_parameters::{
    CommitContainerOptionsBuilder, CreateContainerOptionsBuilder, CreateImageOptionsBuilder,
    RemoveContainerOptionsBuilder,
};
use bottle_core::backend::CommitReport;
use bottle_core::ca_install::ANCHORS;
use bytes::Bytes;
use futures_util::StreamExt as _;

use crate::client::Engine;
use crate::data::StatePaths;
use crate::error::DockerError;

/// Largest file whose content is looked at for the bottle's CA.
const MAX_SCANNED: u64 = 16 << 20;

/// Largest PAX or GNU long-name record accepted in the export.
const MAX_META: u64 = 1 << 20;

/// What [`scrub_tar`] takes out: the bottle's CA (its PEM text and the
/// base64 body of its certificate).
#[derive(Debug, Clone)]
pub struct Scrub {
    pem: Vec<u8>,
    body: String,
}

impl Scrub {
    /// The scrub of the CA whose PEM certificate is `pem`.
    pub fn new(pem: &[u8]) -> Scrub {
        let text = String::from_utf8_lossy(pem);
        let body = pem_blocks(&text)
            .first()
            .map(|block| block.body.clone())
            .unwrap_or_default();
        Scrub {
            pem: pem.to_vec(),
            body,
        }
    }
}

/// One `BEGIN CERTIFICATE` ... `END CERTIFICATE` block of a text.
struct PemBlock {
    /// Byte range in the text, from the `BEGIN` line's start to the end of
    /// the `END` line (and its newline).
    start: usize,
    end: usize,
    /// The base64 between, whitespace removed.
    body: String,
}

fn pem_blocks(text: &str) -> Vec<PemBlock> {
    const BEGIN: &str = "-----BEGIN CERTIFICATE-----";
    const END: &str = "-----END CERTIFICATE-----";
    let mut blocks = Vec::new();
    let mut from = 0;
    while let Some(begin) = text[from..].find(BEGIN).map(|i| from + i) {
        let Some(end) = text[begin..].find(END).map(|i| begin + i) else {
            break;
        };
        let body: String = text[begin + BEGIN.len()..end]
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect();
        let mut stop = end + END.len();
        if text[stop..].starts_with("\r\n") {
            stop += 2;
        } else if text[stop..].starts_with('\n') {
            stop += 1;
        }
        blocks.push(PemBlock {
            start: begin,
            end: stop,
            body,
        });
        from = stop;
    }
    blocks
}

/// What becomes of one file of the export.
#[derive(Debug, PartialEq, Eq)]
enum FileFate {
    Keep,
    Drop,
    Rewrite(Vec<u8>),
}

impl Scrub {
    /// A file holding exactly the CA goes; a file holding it among others
    /// loses its block.
    fn file(&self, contents: &[u8]) -> FileFate {
        if self.body.is_empty() {
            return FileFate::Keep;
        }
        if contents.trim_ascii() == self.pem.trim_ascii() {
            return FileFate::Drop;
        }
        let Ok(text) = std::str::from_utf8(contents) else {
            return FileFate::Keep;
        };
        let blocks = pem_blocks(text);
        let ours: Vec<&PemBlock> = blocks.iter().filter(|b| b.body == self.body).collect();
        if ours.is_empty() {
            return FileFate::Keep;
        }
        let mut out = String::with_capacity(text.len());
        let mut at = 0;
        for block in ours {
            out.push_str(&text[at..block.start]);
            at = block.end;
        }
        out.push_str(&text[at..]);
        FileFate::Rewrite(out.into_bytes())
    }
}

/// Where an entry of the export is, without `./`, `/` at either end.
fn normalized(path: &[u8]) -> String {
    let text = String::from_utf8_lossy(path);
    text.trim_start_matches("./")
        .trim_start_matches('/')
        .trim_end_matches('/')
        .to_string()
}

/// Whether the path is one of bottle's own (never the agent's).
fn is_bottles(path: &str) -> bool {
    let under = |dir: &str| path == dir || path.starts_with(&format!("{dir}/"));
    under(".bottle") || under("etc/bottle") || path == ".dockerenv"
}

/// Whether a regular file at `path` may hold the bottle's CA: under `/etc`
/// or an anchor directory.
fn may_hold_the_ca(path: &str) -> bool {
    path.starts_with("etc/")
        || ANCHORS
            .iter()
            .any(|a| path.starts_with(a.dir.trim_start_matches('/')))
}

/// Whether a symlink's target is one of bottle's anchor files.
fn links_to_an_anchor(target: &[u8]) -> bool {
    let target = String::from_utf8_lossy(target);
    let name = target.rsplit('/').next().unwrap_or_default();
    ANCHORS.iter().any(|a| a.file == name)
}

/// Copies the tar stream `input` to `output` block by block, leaving out
/// bottle's files and its CA (the module says which); every other entry,
/// with its PAX and GNU records, passes through byte for byte. Returns one
/// line per path left out or rewritten.
pub fn scrub_tar<R: Read, W: Write>(
    mut input: R,
    mut output: W,
    scrub: &Scrub,
) -> io::Result<Vec<String>> {
    let mut done = Vec::new();
    let mut pending: Vec<u8> = Vec::new();
    let mut long_path: Option<Vec<u8>> = None;
    let mut long_link: Option<Vec<u8>> = None;
    let mut pax_size = false;
    let mut block = [0u8; 512];
    loop {
        input.read_exact(&mut block)?;
        if block.iter().all(|b| *b == 0) {
            // The end: this block, the next, and whatever padding follows.
            output.write_all(&pending)?;
            output.write_all(&block)?;
            io::copy(&mut input, &mut output)?;
            output.flush()?;
            return Ok(done);
        }
        let header = tar::Header::from_byte_slice(&block).clone();
        let size = header.entry_size()?;
        let padded = size.div_ceil(512) * 512;
        let kind = header.entry_type();
        if kind.is_pax_local_extensions() || kind.is_gnu_longname() || kind.is_gnu_longlink() {
            if size > MAX_META {
                return Err(io::Error::other(format!(
                    "a {size}-byte tar record of the export"
                )));
            }
            let mut data = vec![0u8; usize::try_from(padded).unwrap_or(0)];
            input.read_exact(&mut data)?;
            let record = &data[..usize::try_from(size).unwrap_or(0)];
            if kind.is_pax_local_extensions() {
                for (key, value) in pax_records(record) {
                    match key {
                        b"path" => long_path = Some(value.to_vec()),
                        b"linkpath" => long_link = Some(value.to_vec()),
                        b"size" => pax_size = true,
                        _ => {}
                    }
                }
            } else {
                let name = record
                    .split(|b| *b == 0)
                    .next()
                    .unwrap_or_default()
                    .to_vec();
                if kind.is_gnu_longname() {
                    long_path = Some(name);
                } else {
                    long_link = Some(name);
                }
            }
            pending.extend_from_slice(&block);
            pending.extend_from_slice(&data);
            continue;
        }
        let path = normalized(
            &long_path
                .take()
                .unwrap_or_else(|| header.path_bytes().into_owned()),
        );
        let link = long_link
            .take()
            .or_else(|| header.link_name_bytes().map(|l| l.into_owned()));
        let meta = std::mem::take(&mut pending);
        let sized_by_pax = std::mem::take(&mut pax_size);

        // bottle's own files, and a link the CA survey pointed at its anchor.
        let fate = if is_bottles(&path)
            || (kind.is_symlink() && link.as_deref().is_some_and(links_to_an_anchor))
        {
            FileFate::Drop
        } else {
            FileFate::Keep
        };
        let scan = fate == FileFate::Keep
            && kind.is_file()
            && !sized_by_pax
            && size <= MAX_SCANNED
            && may_hold_the_ca(&path);
        if fate == FileFate::Drop {
            io::copy(&mut (&mut input).take(padded), &mut io::sink())?;
            if !path.starts_with(".bottle") && path != ".dockerenv" {
                done.push(format!("/{path}"));
            }
            continue;
        }
        if !scan {
            output.write_all(&meta)?;
            output.write_all(&block)?;
            let copied = io::copy(&mut (&mut input).take(padded), &mut output)?;
            if copied != padded {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            continue;
        }
        let mut data = vec![0u8; usize::try_from(padded).unwrap_or(0)];
        input.read_exact(&mut data)?;
        data.truncate(usize::try_from(size).unwrap_or(0));
        match scrub.file(&data) {
            FileFate::Keep => {
                output.write_all(&meta)?;
                output.write_all(&block)?;
                write_padded(&mut output, &data)?;
            }
            FileFate::Drop => done.push(format!("/{path} (the bottle's CA)")),
            FileFate::Rewrite(new) => {
                let mut header = header.clone();
                header.set_size(new.len() as u64);
                header.set_cksum();
                output.write_all(&meta)?;
                output.write_all(header.as_bytes())?;
                write_padded(&mut output, &new)?;
                done.push(format!("the bottle's CA from /{path}"));
            }
        }
    }
}

fn write_padded<W: Write>(output: &mut W, data: &[u8]) -> io::Result<()> {
    output.write_all(data)?;
    let pad = data.len().div_ceil(512) * 512 - data.len();
    output.write_all(&vec![0u8; pad])
}

/// The `key=value` records of a PAX extended header (`<len> key=value\n`).
fn pax_records(data: &[u8]) -> Vec<(&[u8], &[u8])> {
    let mut records = Vec::new();
    let mut rest = data;
    while !rest.is_empty() {
        let Some(space) = rest.iter().position(|b| *b == b' ') else {
            break;
        };
        let Some(len) = std::str::from_utf8(&rest[..space])
            .ok()
            .and_then(|n| n.parse::<usize>().ok())
        else {
            break;
        };
        if len <= space + 1 || len > rest.len() {
            break;
        }
        let record = &rest[space + 1..len - 1];
        if let Some(eq) = record.iter().position(|b| *b == b'=') {
            records.push((&record[..eq], &record[eq + 1..]));
        }
        rest = &rest[len..];
    }
    records
}

/// `name:tag` as the Engine's repository and tag (`latest` when none).
pub fn split_reference(image: &str) -> Result<(String, String), DockerError> {
    let bad = |why: &str| DockerError::BadImageName {
        image: image.to_string(),
        why: why.to_string(),
    };
    if image.is_empty() || image.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(bad("it is empty or holds whitespace"));
    }
    if image.contains('@') {
        return Err(bad("a digest names an image that exists; give a name:tag"));
    }
    let last = image.rsplit('/').next().unwrap_or(image);
    Ok(match last.rsplit_once(':') {
        Some((_, tag)) => {
            let repo = &image[..image.len() - tag.len() - 1];
            (repo.to_string(), tag.to_string())
        }
        None => (image.to_string(), "latest".to_string()),
    })
}

/// The original image's configuration as a container's.
fn as_container_config(config: &bollard::models::ImageConfig) -> ContainerConfig {
    ContainerConfig {
        user: config.user.clone(),
        exposed_ports: config.exposed_ports.clone(),
        env: config.env.clone(),
        cmd: config.cmd.clone(),
        healthcheck: config.healthcheck.clone(),
        args_escaped: config.args_escaped,
        volumes: config.volumes.clone(),
        working_dir: config.working_dir.clone(),
        entrypoint: config.entrypoint.clone(),
        on_build: config.on_build.clone(),
        labels: config.labels.clone(),
        stop_signal: config.stop_signal.clone(),
        shell: config.shell.clone(),
        ..ContainerConfig::default()
    }
}

/// The bottle a commit is made of.
pub(crate) struct CommitSource<'a> {
    /// The Engine the bottle runs on.
    pub engine: &'a Engine,
    /// Its agent container.
    pub container: &'a str,
    /// The image it was started from, as the operator named it.
    pub image: &'a str,
    /// Its state dir (where its CA is).
    pub state_dir: &'a std::path::Path,
}

/// Commits the agent container of `bottle` as `image` (the module says how).
pub(crate) fn commit(bottle: &CommitSource<'_>, image: &str) -> Result<CommitReport, DockerError> {
    let (repo, tag) = split_reference(image)?;
    let engine = bottle.engine;
    let container = engine
        .block_on(engine.docker.inspect_container(bottle.container, None))
        .map_err(DockerError::api(format!("inspect {}", bottle.container)))?;
    let original = container.image.clone().unwrap_or_default();
    let config = engine
        .block_on(engine.docker.inspect_image(&original))
        .map_err(DockerError::api(format!("inspect image {original}")))?
        .config
        .unwrap_or_default();
    if config.cmd.as_ref().is_none_or(Vec::is_empty)
        && config.entrypoint.as_ref().is_none_or(Vec::is_empty)
    {
        return Err(DockerError::CommitNoCommand {
            image: bottle.image.to_string(),
        });
    }
    let ca_path = StatePaths::new(bottle.state_dir).ca_cert();
    let ca = std::fs::read(&ca_path).map_err(DockerError::io("read", &ca_path))?;
    let scrub = Scrub::new(&ca);

    let (imported, removed) = export_scrubbed(engine, bottle.container, &scrub)?;
    let result = configure(engine, &imported, &config, &repo, &tag);
    // The configured image's parent stays; the bare import has no name.
    result.map(|id| CommitReport {
        image: format!("{repo}:{tag}"),
        id,
        removed,
    })
}

/// Exports `container`, scrubbed, into an image with no configuration;
/// returns its ID and what was left out.
fn export_scrubbed(
    engine: &Engine,
    container: &str,
    scrub: &Scrub,
) -> Result<(String, Vec<String>), DockerError> {
    let (in_tx, in_rx) = tokio::sync::mpsc::channel::<Result<Bytes, String>>(16);
    let (out_tx, out_rx) = tokio::sync::mpsc::channel::<Result<Bytes, io::Error>>(16);
    let docker = engine.docker.clone();
    let name = container.to_string();
    let reading = engine.spawn(async move {
        let mut export = docker.export_container(&name);
        while let Some(chunk) = export.next().await {
            let failed = chunk.is_err();
            if in_tx.send(chunk.map_err(|e| e.to_string())).await.is_err() || failed {
                break;
            }
        }
    });
    let scrub = scrub.clone();
    let filtering = std::thread::spawn(move || {
        let reader = ChannelReader {
            rx: in_rx,
            chunk: Bytes::new(),
        };
        let writer = ChannelWriter { tx: out_tx.clone() };
        let result = scrub_tar(reader, writer, &scrub);
        if let Err(err) = &result {
            let _ = out_tx.blocking_send(Err(io::Error::other(err.to_string())));
        }
        result
    });
    let body = futures_util::stream::unfold(out_rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    let options = CreateImageOptionsBuilder::default().from_src("-").build();
    let imported = engine.block_on(async {
        let mut stream =
            engine
                .docker
                .create_image(Some(options), Some(bollard::body_try_stream(body)), None);
        let mut id = None;
        while let Some(info) = stream.next().await {
            let info = info?;
            if let Some(status) = info.status.filter(|s| s.starts_with("sha256:")) {
                id = Some(status);
            }
        }
        Ok::<_, bollard::errors::Error>(id)
    });
    let _ = engine.block_on(reading);
    let filtered = filtering.join().map_err(|_| DockerError::Commit {
        detail: "filtering the export panicked".into(),
    })?;
    let removed = filtered.map_err(|err| DockerError::Commit {
        detail: format!("the export of {container} could not be read: {err}"),
    })?;
    let id = imported
        .map_err(DockerError::api(format!(
            "import the filesystem of {container}"
        )))?
        .ok_or_else(|| DockerError::Commit {
            detail: "the Engine did not say which image it imported".into(),
        })?;
    Ok((id, dedup(removed)))
}

fn dedup(mut lines: Vec<String>) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    lines.retain(|line| seen.insert(line.clone()));
    lines
}

/// Gives the imported image `imported` the original `config` and the
/// operator's name: a container of it, never started, committed.
fn configure(
    engine: &Engine,
    imported: &str,
    config: &bollard::models::ImageConfig,
    repo: &str,
    tag: &str,
) -> Result<String, DockerError> {
    let wanted = as_container_config(config);
    let body = ContainerCreateBody {
        image: Some(imported.to_string()),
        user: wanted.user.clone(),
        exposed_ports: wanted.exposed_ports.clone(),
        env: wanted.env.clone(),
        cmd: wanted.cmd.clone(),
        healthcheck: wanted.healthcheck.clone(),
        volumes: wanted.volumes.clone(),
        working_dir: wanted.working_dir.clone(),
        entrypoint: wanted.entrypoint.clone(),
        on_build: wanted.on_build.clone(),
        labels: wanted.labels.clone(),
        stop_signal: wanted.stop_signal.clone(),
        shell: wanted.shell.clone(),
        network_disabled: Some(true),
        host_config: Some(HostConfig {
            network_mode: Some("none".into()),
            ..HostConfig::default()
        }),
        ..ContainerCreateBody::default()
    };
    let created = engine
        .block_on(
            engine
                .docker
                .create_container(Some(CreateContainerOptionsBuilder::default().build()), body),
        )
        .map_err(DockerError::api(format!(
            "create a container of {imported}"
        )))?;
    let options = CommitContainerOptionsBuilder::default()
        .container(&created.id)
        .repo(repo)
        .tag(tag)
        .comment("bottle commit")
        .pause(false)
        .build();
    let committed = engine.block_on(engine.docker.commit_container(options, wanted));
    let remove = RemoveContainerOptionsBuilder::default().force(true).build();
    let _ = engine.block_on(engine.docker.remove_container(&created.id, Some(remove)));
    let committed = committed.map_err(DockerError::api(format!("commit {repo}:{tag}")))?;
    Ok(committed.id)
}

/// The export's chunks as a blocking reader.
struct ChannelReader {
    rx: tokio::sync::mpsc::Receiver<Result<Bytes, String>>,
    chunk: Bytes,
}

impl Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.chunk.is_empty() {
            match self.rx.blocking_recv() {
                Some(Ok(chunk)) => self.chunk = chunk,
                Some(Err(err)) => return Err(io::Error::other(err)),
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.chunk.len());
        buf[..n].copy_from_slice(&self.chunk.split_to(n));
        Ok(n)
    }
}

/// The import's body as a blocking writer.
struct ChannelWriter {
    tx: tokio::sync::mpsc::Sender<Result<Bytes, io::Error>>,
}

impl Write for ChannelWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.tx
            .blocking_send(Ok(Bytes::copy_from_slice(buf)))
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "the import ended"))?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Whether `path` exists in the image `image` (a container of it is made
/// and removed): for tests and checks of what a commit left out.
pub fn image_has_path(engine: &Engine, image: &str, path: &str) -> Result<bool, DockerError> {
    let body = ContainerCreateBody {
        image: Some(image.to_string()),
        cmd: Some(vec!["/".to_string()]),
        network_disabled: Some(true),
        ..ContainerCreateBody::default()
    };
    let created = engine
        .block_on(
            engine
                .docker
                .create_container(Some(CreateContainerOptionsBuilder::default().build()), body),
        )
        .map_err(DockerError::api(format!("create a container of {image}")))?;
    let found = crate::archive::container_entry(engine, &created.id, path);
    let remove = RemoveContainerOptionsBuilder::default().force(true).build();
    let _ = engine.block_on(engine.docker.remove_container(&created.id, Some(remove)));
    Ok(!matches!(found?, bottle_core::agent_box::Entry::Missing))
}

#[cfg(test)]
mod tests {
    use super::*;

    const CA: &str = "-----BEGIN CERTIFICATE-----\nQUJDREVG\nR0hJSktM\n-----END CERTIFICATE-----\n";
    const OTHER: &str = "-----BEGIN CERTIFICATE-----\nWFlaV1ZV\n-----END CERTIFICATE-----\n";

    fn tar_of(entries: &[(&str, tar::EntryType, &[u8], Option<&str>)]) -> Vec<u8> {
        let mut builder = tar::Builder::new(Vec::new());
        for (path, kind, data, link) in entries {
            let mut header = tar::Header::new_gnu();
            header.set_entry_type(*kind);
            header.set_mode(0o644);
            header.set_size(data.len() as u64);
            if let Some(link) = link {
                builder.append_link(&mut header, path, link).unwrap();
            } else {
                builder.append_data(&mut header, path, *data).unwrap();
            }
        }
        builder.into_inner().unwrap()
    }

    fn entries(tar: &[u8]) -> Vec<(String, Vec<u8>)> {
        let mut archive = tar::Archive::new(tar);
        archive
            .entries()
            .unwrap()
            .map(|e| {
                let mut e = e.unwrap();
                let path = e.path().unwrap().display().to_string();
                let mut data = Vec::new();
                e.read_to_end(&mut data).unwrap();
                (path, data)
            })
            .collect()
    }

    #[test]
    fn bottles_files_and_ca_go_and_everything_else_passes_byte_for_byte() {
        use tar::EntryType::{Directory, Regular, Symlink};
        let bundle = format!("{OTHER}{CA}");
        let long = format!("home/agent/{}/file", "d".repeat(150));
        let input = tar_of(&[
            (".bottle/", Directory, b"", None),
            (".dockerenv", Regular, b"", None),
            ("etc/bottle/", Directory, b"", None),
            ("etc/bottle/mcp.json", Regular, b"{}", None),
            ("etc/bottle/ca.pem", Regular, CA.as_bytes(), None),
            (
                "etc/ssl/certs/ca-certificates.crt",
                Regular,
                bundle.as_bytes(),
                None,
            ),
            ("etc/ssl/certs/ab12cd34.0", Regular, CA.as_bytes(), None),
            (
                "etc/ssl/certs/bottle.pem",
                Symlink,
                b"",
                Some("/usr/local/share/ca-certificates/bottle.crt"),
            ),
            ("etc/ssl/certs/ef56.0", Symlink, b"", Some("bottle.pem")),
            (
                "usr/local/share/ca-certificates/bottle.crt",
                Regular,
                CA.as_bytes(),
                None,
            ),
            ("etc/ssl/certs/other.pem", Regular, OTHER.as_bytes(), None),
            ("home/agent/note.txt", Regular, b"the agent's", None),
            (long.as_str(), Regular, b"deep", None),
            ("usr/local/bin/tool", Regular, CA.as_bytes(), None),
        ]);
        let mut output = Vec::new();
        let removed = scrub_tar(&input[..], &mut output, &Scrub::new(CA.as_bytes())).unwrap();
        let kept = entries(&output);
        let names: Vec<&str> = kept.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(
            names,
            [
                "etc/ssl/certs/ca-certificates.crt",
                "etc/ssl/certs/other.pem",
                "home/agent/note.txt",
                long.as_str(),
                "usr/local/bin/tool",
            ]
        );
        assert_eq!(kept[0].1, OTHER.as_bytes());
        assert_eq!(kept[1].1, OTHER.as_bytes());
        assert_eq!(kept[3].1, b"deep");
        // Outside /etc and the anchors, the agent's own files are its own.
        assert_eq!(kept[4].1, CA.as_bytes());
        assert!(removed.contains(&"/etc/bottle".to_string()), "{removed:?}");
        assert!(
            removed
                .contains(&"the bottle's CA from /etc/ssl/certs/ca-certificates.crt".to_string()),
            "{removed:?}"
        );
        assert!(
            removed.contains(
                &"/usr/local/share/ca-certificates/bottle.crt (the bottle's CA)".to_string()
            ),
            "{removed:?}"
        );
    }

    #[test]
    fn a_bundle_without_the_ca_is_not_rewritten() {
        let scrub = Scrub::new(CA.as_bytes());
        assert_eq!(scrub.file(OTHER.as_bytes()), FileFate::Keep);
        assert_eq!(scrub.file(b"\xff\xfe not text"), FileFate::Keep);
        assert_eq!(scrub.file(CA.as_bytes()), FileFate::Drop);
        assert_eq!(
            scrub.file(format!("{CA}{OTHER}").as_bytes()),
            FileFate::Rewrite(OTHER.as_bytes().to_vec())
        );
        // With no CA to look for, nothing is touched.
        assert_eq!(Scrub::new(b"").file(CA.as_bytes()), FileFate::Keep);
    }

    #[test]
    fn image_names_split_into_repository_and_tag() {
        assert_eq!(
            split_reference("my-env:v2").unwrap(),
            ("my-env".to_string(), "v2".to_string())
        );
        assert_eq!(
            split_reference("localhost:5000/team/env").unwrap(),
            ("localhost:5000/team/env".to_string(), "latest".to_string())
        );
        assert_eq!(
            split_reference("localhost:5000/env:1").unwrap(),
            ("localhost:5000/env".to_string(), "1".to_string())
        );
        assert!(split_reference("").is_err());
        assert!(split_reference("a b").is_err());
        assert!(split_reference("env@sha256:abc").is_err());
    }
}
