//! `GET info/refs`: the ref advertisement, after refreshing a mirror from
//! its upstream.

use std::path::Path;
use std::time::Instant;

use http::{Response, StatusCode};

use super::setup::GateRepo;
use super::{Entry, GitGate, git_response};
use crate::audit::Decision;
use crate::body::{BoxBody, full};
use crate::gitgate::command::Service;
use crate::gitgate::{pktline, upstream};

impl GitGate {
    pub(super) async fn info_refs(
        &self,
        repo: &GateRepo,
        service: Service,
        protocol: Option<String>,
        path: &str,
        start: Instant,
    ) -> Response<BoxBody> {
        let name = repo.config.name.as_str();
        let entry = |d, reason: &str| Entry::new(d, name, "advertise", path, reason);
        if service == Service::ReceivePack && !repo.policy.writable() {
            let message = format!(
                "repository {name} is read-only: pushing is not allowed; fix: push nowhere, or ask the operator to make it read-write with a push list"
            );
            return self.refuse(
                entry(Decision::Deny, "read_only"),
                StatusCode::FORBIDDEN,
                &message,
                start,
            );
        }
        let _permit = match self.permit().await {
            Ok(p) => p,
            Err(resp) => return resp,
        };
        if let Some(url) = &repo.config.upstream {
            let _lock = repo.lock.lock().await;
            if let Err(e) = self.refresh(repo, url).await {
                let message = format!(
                    "could not fetch {name} from its upstream: {e}; fix: retry later, or ask the operator to check the upstream and its credential"
                );
                return self.refuse(
                    entry(Decision::Error, "upstream_fetch_failed"),
                    StatusCode::BAD_GATEWAY,
                    &message,
                    start,
                );
            }
        }
        let inv = match service {
            Service::UploadPack => self.git.upload_pack(&repo.path, true, protocol.as_deref()),
            Service::ReceivePack => self.git.receive_pack(
                &repo.path,
                true,
                &repo.policy,
                self.limits.max_push_bytes,
                None,
            ),
        };
        let out = match inv.output().await {
            Ok(o) if o.success() => o,
            Ok(o) => {
                let message = format!(
                    "git {} failed on {name}: {}",
                    service.name(),
                    o.stderr_text().trim()
                );
                return self.refuse(
                    entry(Decision::Error, "git_failed"),
                    StatusCode::INTERNAL_SERVER_ERROR,
                    &message,
                    start,
                );
            }
            Err(e) => {
                let message = format!("could not run git for {name}: {e}");
                return self.refuse(
                    entry(Decision::Error, "git_failed"),
                    StatusCode::INTERNAL_SERVER_ERROR,
                    &message,
                    start,
                );
            }
        };
        // As git http-backend: protocol v2 advertisements carry no
        // `# service=` preamble.
        let v2 = protocol
            .as_deref()
            .is_some_and(|p| p.split(':').any(|kv| kv == "version=2"));
        let mut body = Vec::with_capacity(out.stdout.len() + 40);
        if !v2 {
            body.extend(pktline::pkt(
                format!("# service={}\n", service.name()).as_bytes(),
            ));
            body.extend_from_slice(pktline::FLUSH);
        }
        body.extend_from_slice(&out.stdout);
        let mut e = entry(Decision::Allow, "allowed");
        e.bytes_down = body.len() as u64;
        self.write_audit(e, StatusCode::OK, start);
        git_response(
            &format!("application/x-{}-advertisement", service.name()),
            full(body),
        )
    }

    /// Fetches a mirror's upstream into it, within the upstream timeout.
    async fn refresh(&self, repo: &GateRepo, url: &str) -> Result<(), String> {
        let auth = match &repo.config.credential_file {
            Some(file) => Some(
                upstream::read_auth_header(Path::new(file))
                    .map_err(|e| format!("the credential file cannot be read ({e})"))?,
            ),
            None => None,
        };
        tokio::time::timeout(
            self.limits.upstream_timeout,
            upstream::refresh(&self.git, &repo.path, url, auth.as_deref()),
        )
        .await
        .map_err(|_| "the upstream took too long".to_string())?
    }
}
