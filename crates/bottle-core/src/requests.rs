//! The supervise request queue: what the agent asked the operator for, and
//! what the operator answered.
//!
//! One directory per bottle, `<state_dir>/requests/` on the host, mounted
//! into the bundle. Each side writes only its own files, so there is no
//! locking and no read-modify-write race:
//!
//! - the bundle's supervise daemon writes `<id>.json`, a [`Request`], once;
//! - the operator's `bottle approve` / `bottle deny` writes
//!   `<id>.decision.json`, a [`DecisionRecord`], once (never twice).
//!
//! A request without a decision file is pending; nothing approves it by
//! default or by timeout. Both files are written to a temporary name and
//! renamed, so a reader never sees half a file. Ids are `<slug>-<n>`, so
//! they are unique across the bottles of one host and short enough to type.
//!
//! Format version 1 (field `v` in both files).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::error::Coded;
use crate::time::now_rfc3339;

/// Version written in every request and decision file.
pub const REQUESTS_VERSION: u32 = 1;
/// The queue's directory name inside a bottle's state dir.
pub const REQUESTS_DIR_NAME: &str = "requests";
/// Largest request or decision file read; bigger files are skipped.
pub const MAX_FILE_BYTES: u64 = 64 * 1024;
/// Most entries of one queue directory looked at (bounds every scan).
pub const MAX_ENTRIES: usize = 10_000;
/// Longest free text (reason, message) kept in a request.
pub const MAX_TEXT_CHARS: usize = 2_000;

const REQUEST_SUFFIX: &str = ".json";
const DECISION_SUFFIX: &str = ".decision.json";

/// The queue directory of the bottle whose state dir is `state_dir`.
pub fn requests_dir(state_dir: &Path) -> PathBuf {
    state_dir.join(REQUESTS_DIR_NAME)
}

/// What the agent asks for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "detail", rename_all = "snake_case")]
pub enum Ask {
    /// Allow a new egress host for this bottle.
    Egress {
        /// The host (normalised by the bundle).
        host: String,
    },
    /// Allow a push.
    Push {
        /// The repository's name behind git-gate.
        repo: String,
        /// The ref to push.
        #[serde(rename = "ref")]
        git_ref: String,
    },
    /// Show the operator a message (approving acknowledges it).
    Notify {
        /// The message.
        message: String,
    },
}

impl Ask {
    /// `egress`, `push` or `notify`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Egress { .. } => "egress",
            Self::Push { .. } => "push",
            Self::Notify { .. } => "notify",
        }
    }

    /// One line for tables: the host, `repo ref`, or the message.
    pub fn summary(&self) -> String {
        match self {
            Self::Egress { host } => host.clone(),
            Self::Push { repo, git_ref } => format!("{repo} {git_ref}"),
            Self::Notify { message } => message.clone(),
        }
    }
}

/// Where a request stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Waiting for the operator.
    Pending,
    /// The operator approved it.
    Approved,
    /// The operator denied it.
    Denied,
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Pending => "pending",
            Self::Approved => "approved",
            Self::Denied => "denied",
        })
    }
}

/// One request (`<id>.json`). `status` and `decision_reason` are filled
/// from the decision file when read; the file itself always says pending.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    /// [`REQUESTS_VERSION`].
    pub v: u32,
    /// `<slug>-<n>`.
    pub id: String,
    /// The bottle that asked.
    pub bottle: String,
    /// What it asks for.
    #[serde(flatten)]
    pub ask: Ask,
    /// Why, in the agent's words.
    #[serde(default)]
    pub reason: String,
    /// RFC 3339 UTC time it was asked.
    pub created: String,
    /// Where it stands.
    pub status: Status,
    /// The operator's reason, once decided.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision_reason: Option<String>,
}

/// The operator's answer (`<id>.decision.json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DecisionRecord {
    /// [`REQUESTS_VERSION`].
    pub v: u32,
    /// The request's id.
    pub id: String,
    /// [`Status::Approved`] or [`Status::Denied`].
    pub decision: Status,
    /// The operator's reason, if given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// RFC 3339 UTC time of the decision.
    pub decided: String,
}

/// What went wrong with the request queue.
#[derive(Debug, Error)]
pub enum RequestError {
    /// No request has this id.
    #[error("no request {id}")]
    Unknown {
        /// The id asked for.
        id: String,
    },
    /// The id is not of the form `<slug>-<n>`.
    #[error("{id:?} is not a request id")]
    BadId {
        /// The id given.
        id: String,
    },
    /// The request has already been answered.
    #[error("request {id} was already {status}")]
    AlreadyDecided {
        /// The id.
        id: String,
        /// The earlier decision.
        status: Status,
    },
    /// A file of the queue could not be read or written.
    #[error("cannot {action} {path}: {source}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// The file or directory.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A file of the queue is not valid.
    #[error("{path} is not a valid request file: {detail}")]
    Invalid {
        /// The file.
        path: String,
        /// The parse error.
        detail: String,
    },
}

impl Coded for RequestError {
    fn code(&self) -> &'static str {
        match self {
            Self::Unknown { .. } => "BOT-Q001",
            Self::BadId { .. } => "BOT-Q002",
            Self::AlreadyDecided { .. } => "BOT-Q003",
            Self::Io { .. } => "BOT-Q004",
            Self::Invalid { .. } => "BOT-Q005",
        }
    }

    fn fix(&self) -> Option<String> {
        let fix = match self {
            Self::Unknown { .. } => {
                "run `bottle requests` to see the pending requests and their ids"
            }
            Self::BadId { .. } => "copy the id from `bottle requests` (like `claude-3`)",
            Self::AlreadyDecided { .. } => {
                "nothing to do (a decision is final; the agent can ask again)"
            }
            Self::Io { .. } => "check that the directory exists and is writable by you",
            Self::Invalid { .. } => "remove it (the agent can ask again)",
        };
        Some(fix.into())
    }
}

fn io_err(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> RequestError {
    let path = path.display().to_string();
    move |source| RequestError::Io {
        action,
        path,
        source,
    }
}

/// Whether `id` is a well-formed request id: `<slug>-<n>`, lower-case
/// ASCII letters, digits and `-`, at most 80 characters. Checked before any
/// id becomes part of a path.
pub fn valid_id(id: &str) -> bool {
    let Some((slug, n)) = id.rsplit_once('-') else {
        return false;
    };
    id.len() <= 80
        && !slug.is_empty()
        && !n.is_empty()
        && n.bytes().all(|b| b.is_ascii_digit())
        && slug
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !slug.starts_with('-')
}

fn check_id(id: &str) -> Result<(), RequestError> {
    if valid_id(id) {
        Ok(())
    } else {
        Err(RequestError::BadId { id: id.to_string() })
    }
}

/// Writes `data` to `path` through a temporary file and a rename.
fn write_atomic(path: &Path, data: &[u8]) -> Result<(), RequestError> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, data).map_err(io_err("write", &tmp))?;
    std::fs::rename(&tmp, path).map_err(io_err("rename into", path))
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<Option<T>, RequestError> {
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_err("read", path)(e)),
    };
    if meta.len() > MAX_FILE_BYTES {
        return Err(RequestError::Invalid {
            path: path.display().to_string(),
            detail: format!("larger than {MAX_FILE_BYTES} bytes"),
        });
    }
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_err("read", path)(e)),
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| RequestError::Invalid {
            path: path.display().to_string(),
            detail: e.to_string(),
        })
}

/// Clips free text to [`MAX_TEXT_CHARS`] characters.
pub fn clip(text: &str) -> String {
    text.chars().take(MAX_TEXT_CHARS).collect()
}

/// Writes a new request (the bundle's side). Refuses to overwrite one.
pub fn write_request(dir: &Path, request: &Request) -> Result<(), RequestError> {
    check_id(&request.id)?;
    let path = dir.join(format!("{}{REQUEST_SUFFIX}", request.id));
    if path.exists() {
        return Err(io_err("create", &path)(std::io::Error::from(
            std::io::ErrorKind::AlreadyExists,
        )));
    }
    let mut stored = request.clone();
    stored.status = Status::Pending;
    stored.decision_reason = None;
    let data = serde_json::to_vec_pretty(&stored).map_err(|e| RequestError::Invalid {
        path: path.display().to_string(),
        detail: e.to_string(),
    })?;
    write_atomic(&path, &data)
}

/// The operator's decision on `id`, if there is one.
pub fn read_decision(dir: &Path, id: &str) -> Result<Option<DecisionRecord>, RequestError> {
    check_id(id)?;
    read_json(&dir.join(format!("{id}{DECISION_SUFFIX}")))
}

/// The request `id` with its current status, or `None`.
pub fn read_request(dir: &Path, id: &str) -> Result<Option<Request>, RequestError> {
    check_id(id)?;
    let Some(mut request) = read_json::<Request>(&dir.join(format!("{id}{REQUEST_SUFFIX}")))?
    else {
        return Ok(None);
    };
    request.status = Status::Pending;
    request.decision_reason = None;
    if let Some(d) = read_decision(dir, id)? {
        request.status = d.decision;
        request.decision_reason = d.reason;
    }
    Ok(Some(request))
}

/// The ids of `dir`'s requests (at most [`MAX_ENTRIES`] entries looked at),
/// in creation order. A missing directory holds none.
pub fn ids(dir: &Path) -> Result<Vec<String>, RequestError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_err("list", dir)(e)),
    };
    let mut ids: Vec<(u64, String)> = entries
        .take(MAX_ENTRIES)
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|name| !name.ends_with(DECISION_SUFFIX))
        .filter_map(|name| name.strip_suffix(REQUEST_SUFFIX).map(str::to_string))
        .filter(|id| valid_id(id))
        .map(|id| (sequence(&id), id))
        .collect();
    ids.sort();
    Ok(ids.into_iter().map(|(_, id)| id).collect())
}

/// The ids of `dir`'s decision files (at most [`MAX_ENTRIES`] looked at).
pub fn decided_ids(dir: &Path) -> Result<Vec<String>, RequestError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_err("list", dir)(e)),
    };
    let mut ids: Vec<String> = entries
        .take(MAX_ENTRIES)
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().into_string().ok())
        .filter_map(|name| name.strip_suffix(DECISION_SUFFIX).map(str::to_string))
        .filter(|id| valid_id(id))
        .collect();
    ids.sort_by_key(|id| sequence(id));
    Ok(ids)
}

/// The `<n>` of `<slug>-<n>` (0 when absent).
pub fn sequence(id: &str) -> u64 {
    id.rsplit_once('-')
        .and_then(|(_, n)| n.parse().ok())
        .unwrap_or(0)
}

/// Every request in `dir` with its status, in creation order. Files that
/// cannot be parsed are skipped (the agent's side wrote them).
pub fn list(dir: &Path) -> Result<Vec<Request>, RequestError> {
    let mut out = Vec::new();
    for id in ids(dir)? {
        match read_request(dir, &id) {
            Ok(Some(r)) => out.push(r),
            Ok(None) | Err(RequestError::Invalid { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// The pending requests in `dir`.
pub fn pending(dir: &Path) -> Result<Vec<Request>, RequestError> {
    Ok(list(dir)?
        .into_iter()
        .filter(|r| r.status == Status::Pending)
        .collect())
}

/// Records the operator's decision on `id` in `dir` (the host's side).
/// Refuses an unknown id and a request that was already decided.
pub fn decide(
    dir: &Path,
    id: &str,
    decision: Status,
    reason: Option<&str>,
) -> Result<Request, RequestError> {
    check_id(id)?;
    let Some(mut request) = read_request(dir, id)? else {
        return Err(RequestError::Unknown { id: id.to_string() });
    };
    if request.status != Status::Pending {
        return Err(RequestError::AlreadyDecided {
            id: id.to_string(),
            status: request.status,
        });
    }
    let record = DecisionRecord {
        v: REQUESTS_VERSION,
        id: id.to_string(),
        decision,
        reason: reason.map(clip),
        decided: now_rfc3339(),
    };
    let path = dir.join(format!("{id}{DECISION_SUFFIX}"));
    let data = serde_json::to_vec_pretty(&record).map_err(|e| RequestError::Invalid {
        path: path.display().to_string(),
        detail: e.to_string(),
    })?;
    write_atomic(&path, &data)?;
    request.status = decision;
    request.decision_reason = record.reason;
    Ok(request)
}

/// The queue directories under a state root: `(slug, dir)` for every
/// bottle state dir that has one.
pub fn bottle_dirs(state_root: &Path) -> Result<Vec<(String, PathBuf)>, RequestError> {
    let entries = match std::fs::read_dir(state_root) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_err("list", state_root)(e)),
    };
    let mut out: Vec<(String, PathBuf)> = entries
        .take(MAX_ENTRIES)
        .filter_map(Result::ok)
        .filter_map(|e| {
            let slug = e.file_name().into_string().ok()?;
            let dir = requests_dir(&e.path());
            dir.is_dir().then_some((slug, dir))
        })
        .collect();
    out.sort();
    Ok(out)
}

/// Every request of every bottle under `state_root`, pending only unless
/// `all`; bottles in name order, requests in creation order.
pub fn list_all(state_root: &Path, all: bool) -> Result<Vec<Request>, RequestError> {
    let mut out = Vec::new();
    for (_, dir) in bottle_dirs(state_root)? {
        let requests = list(&dir)?;
        out.extend(
            requests
                .into_iter()
                .filter(|r| all || r.status == Status::Pending),
        );
    }
    Ok(out)
}

/// The queue directory under `state_root` that holds request `id`.
pub fn find(state_root: &Path, id: &str) -> Result<PathBuf, RequestError> {
    check_id(id)?;
    for (_, dir) in bottle_dirs(state_root)? {
        if dir.join(format!("{id}{REQUEST_SUFFIX}")).is_file() {
            return Ok(dir);
        }
    }
    Err(RequestError::Unknown { id: id.to_string() })
}

/// Decides request `id` wherever under `state_root` it is.
pub fn decide_in(
    state_root: &Path,
    id: &str,
    decision: Status,
    reason: Option<&str>,
) -> Result<Request, RequestError> {
    let dir = find(state_root, id)?;
    decide(&dir, id, decision, reason)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(id: &str, ask: Ask) -> Request {
        Request {
            v: REQUESTS_VERSION,
            id: id.into(),
            bottle: "bot-bottle-claude".into(),
            ask,
            reason: "need docs".into(),
            created: now_rfc3339(),
            status: Status::Pending,
            decision_reason: None,
        }
    }

    #[test]
    fn ids_are_checked_before_they_touch_a_path() {
        for good in ["claude-1", "my-agent-42", "a1-0"] {
            assert!(valid_id(good), "{good}");
        }
        for bad in [
            "", "claude", "-1", "claude-", "../x-1", "Claude-1", "a/b-1", "a-1x", "a.b-1",
        ] {
            assert!(!valid_id(bad), "{bad}");
        }
    }

    #[test]
    fn the_file_format_is_stable() {
        let r = request(
            "claude-3",
            Ask::Push {
                repo: "app".into(),
                git_ref: "refs/heads/agent/x".into(),
            },
        );
        let v: serde_json::Value = serde_json::to_value(&r).unwrap();
        assert_eq!(v["kind"], "push");
        assert_eq!(v["detail"]["repo"], "app");
        assert_eq!(v["detail"]["ref"], "refs/heads/agent/x");
        assert_eq!(v["status"], "pending");
        assert_eq!(v["v"], 1);
        // Version 1 as written by the bundle.
        let text = r#"{"v":1,"id":"claude-1","bottle":"bot-bottle-claude","kind":"egress","detail":{"host":"docs.rs"},"reason":"docs","created":"2025-01-02T03:04:05Z","status":"pending"}"#;
        let parsed: Request = serde_json::from_str(text).unwrap();
        assert_eq!(
            parsed.ask,
            Ask::Egress {
                host: "docs.rs".into()
            }
        );
    }

    #[test]
    fn approve_once_then_final() {
        let dir = tempfile::tempdir().unwrap();
        let r = request(
            "claude-1",
            Ask::Egress {
                host: "docs.rs".into(),
            },
        );
        write_request(dir.path(), &r).unwrap();
        assert!(write_request(dir.path(), &r).is_err(), "never overwritten");
        assert_eq!(pending(dir.path()).unwrap().len(), 1);
        let done = decide(dir.path(), "claude-1", Status::Approved, Some("ok")).unwrap();
        assert_eq!(done.status, Status::Approved);
        assert!(pending(dir.path()).unwrap().is_empty());
        let again = decide(dir.path(), "claude-1", Status::Denied, None).unwrap_err();
        assert_eq!(again.code(), "BOT-Q003");
        let read = read_request(dir.path(), "claude-1").unwrap().unwrap();
        assert_eq!(read.status, Status::Approved);
        assert_eq!(read.decision_reason.as_deref(), Some("ok"));
        let unknown = decide(dir.path(), "claude-2", Status::Denied, None).unwrap_err();
        assert_eq!(unknown.code(), "BOT-Q001");
    }

    #[test]
    fn ids_sort_numerically_and_across_bottles() {
        let root = tempfile::tempdir().unwrap();
        for (slug, n) in [("b", 10), ("b", 9), ("a", 1)] {
            let dir = requests_dir(&root.path().join(slug));
            std::fs::create_dir_all(&dir).unwrap();
            let id = format!("{slug}-{n}");
            write_request(
                &dir,
                &request(
                    &id,
                    Ask::Notify {
                        message: "hi".into(),
                    },
                ),
            )
            .unwrap();
        }
        let all: Vec<String> = list_all(root.path(), false)
            .unwrap()
            .into_iter()
            .map(|r| r.id)
            .collect();
        assert_eq!(all, ["a-1", "b-9", "b-10"]);
        assert_eq!(
            find(root.path(), "b-9").unwrap(),
            root.path().join("b/requests")
        );
        decide_in(root.path(), "b-9", Status::Denied, None).unwrap();
        assert_eq!(list_all(root.path(), false).unwrap().len(), 2);
        assert_eq!(list_all(root.path(), true).unwrap().len(), 3);
        assert_eq!(
            decided_ids(&root.path().join("b/requests")).unwrap(),
            ["b-9"]
        );
        assert_eq!(find(root.path(), "c-1").unwrap_err().code(), "BOT-Q001");
    }
}
