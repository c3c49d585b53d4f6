//! `POST git-upload-pack`: a fetch (or `ls-refs`), streamed through.

use std::sync::Arc;
use std::time::Instant;

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;

use super::pipe::{BodyInput, PipeDone, pipe};
use super::setup::GateRepo;
use super::{Entry, GitGate, git_response};
use crate::audit::Decision;
use crate::body::BoxBody;
use crate::gitgate::command::Service;

impl GitGate {
    pub(super) async fn upload_pack(
        self: Arc<Self>,
        repo: Arc<GateRepo>,
        req: Request<Incoming>,
        protocol: Option<String>,
        path: String,
        start: Instant,
    ) -> Response<BoxBody> {
        let name = repo.config.name.clone();
        let input = match BodyInput::new(req, Service::UploadPack, self.limits.max_request_bytes) {
            Ok(i) => i,
            Err((status, message)) => {
                let entry = Entry::new(Decision::Deny, &name, "fetch", &path, "bad_request");
                return self.refuse(entry, status, &message, start);
            }
        };
        let permit = match self.permit().await {
            Ok(p) => p,
            Err(resp) => return resp,
        };
        let inv = self.git.upload_pack(&repo.path, false, protocol.as_deref());
        let gate = self.clone();
        let p = path.clone();
        let done = move |d: PipeDone| {
            let method = if contains(&d.sniff, b"command=ls-refs") {
                "ls-refs"
            } else {
                "fetch"
            };
            let (decision, reason) = match (&d.input_error, d.code) {
                (Some(e), _) => (Decision::Error, format!("request_failed: {e}")),
                (None, Some(0)) => (Decision::Allow, "allowed".to_string()),
                (None, code) => (
                    Decision::Error,
                    format!(
                        "upload_pack_failed: exit {code:?}: {}",
                        String::from_utf8_lossy(&d.stderr).trim()
                    ),
                ),
            };
            let mut e = Entry::new(decision, &name, method, &p, &reason);
            e.bytes_up = d.bytes_in;
            e.bytes_down = d.bytes_out;
            gate.write_audit(e, StatusCode::OK, start);
        };
        match pipe(&inv, Vec::new(), input, true, (permit, None), done) {
            Ok(body) => git_response(
                &format!("application/x-{}-result", Service::UploadPack.name()),
                body,
            ),
            Err(e) => {
                let entry = Entry::new(
                    Decision::Error,
                    &repo.config.name,
                    "fetch",
                    &path,
                    "git_failed",
                );
                self.refuse(
                    entry,
                    StatusCode::INTERNAL_SERVER_ERROR,
                    &format!("could not run git upload-pack: {e}"),
                    start,
                )
            }
        }
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}
