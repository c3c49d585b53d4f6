//! `POST git-receive-pack`: a push. The request's framing is read in full
//! and every ref update in it checked against the push rules before
//! receive-pack runs (signed pushes and push options are refused); what
//! passes goes to receive-pack with the `pre-receive` hook, whose result
//! (with receive-pack's report-status) makes the audit line.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use bottle_core::bundle::BundleGitRepo;
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;

use super::pipe::{BodyInput, PipeDone, pipe};
use super::setup::GateRepo;
use super::{Entry, GitGate, git_response};
use crate::audit::Decision;
use crate::body::{BoxBody, full};
use crate::gitgate::command::Service;
use crate::gitgate::hook::{HookResult, HookSpec};
use crate::gitgate::pktline;
use crate::gitgate::push_request::{self, Malformed, PushRequest};
use crate::gitgate::push_rules::{Refusal, RefusalKind, RepoPolicy, merged_repo};

impl GitGate {
    /// A repository's rules with the operator's run-time approvals merged
    /// in: the config goes to the hook, the policy checks the command list.
    fn effective_rules(&self, repo: &GateRepo) -> (BundleGitRepo, RepoPolicy) {
        let merged = merged_repo(&repo.config, &self.push_rules);
        if merged.push.len() == repo.config.push.len() {
            return (merged, repo.policy.clone());
        }
        match RepoPolicy::new(&merged) {
            Ok(policy) => (merged, policy),
            // Approved refs are escaped into literal globs, so this is not
            // expected; the manifest's rules still hold.
            Err(e) => {
                crate::log!("git-gate: ignoring run-time push approvals: {e}");
                (repo.config.clone(), repo.policy.clone())
            }
        }
    }

    /// Answers a request whose framing the gate does not accept: in
    /// git's report-status when the client asked for one (so `git push`
    /// shows the reason), else as an `ERR` packet.
    async fn refuse_malformed(
        &self,
        malformed: Malformed,
        input: &mut BodyInput,
        deny: impl Fn(&str) -> Entry,
        start: Instant,
    ) -> Response<BoxBody> {
        let Malformed { error, partial } = malformed;
        let message = format!("the push request is malformed: {error}");
        let body = if partial.wants_report() {
            let refusals = request_refusals(&partial, RefusalKind::Malformed, &message);
            pktline::refusal_response(&partial, &refusals)
        } else {
            pktline::error_packet(&message)
        };
        let mut e = deny(RefusalKind::Malformed.as_str());
        e.refs = partial.refs();
        self.answer_refusal(e, body, input, start).await
    }

    /// Sends a refusal in git's framing after reading the rest of the
    /// request, so the client sees the answer rather than a broken pipe
    /// (the size cap and the idle timeout bound the reading).
    async fn answer_refusal(
        &self,
        mut e: Entry,
        body: Vec<u8>,
        input: &mut BodyInput,
        start: Instant,
    ) -> Response<BoxBody> {
        while let Ok(Some(_)) = input.next().await {}
        e.bytes_up = input.seen;
        e.bytes_down = body.len() as u64;
        self.write_audit(e, StatusCode::OK, start);
        git_response(
            &format!("application/x-{}-result", Service::ReceivePack.name()),
            full(body),
        )
    }

    pub(super) async fn receive_pack(
        self: Arc<Self>,
        repo: Arc<GateRepo>,
        req: Request<Incoming>,
        path: String,
        start: Instant,
    ) -> Response<BoxBody> {
        let name = repo.config.name.clone();
        let deny = |reason: &str| Entry::new(Decision::Deny, &name, "push", &path, reason);
        if !repo.policy.writable() {
            let message = format!(
                "repository {name} is read-only: pushing is not allowed; fix: push nowhere, or ask the operator to make it read-write with a push list"
            );
            return self.refuse(deny("read_only"), StatusCode::FORBIDDEN, &message, start);
        }
        let mut input = match BodyInput::new(req, Service::ReceivePack, self.limits.max_push_bytes)
        {
            Ok(i) => i,
            Err((status, message)) => {
                return self.refuse(deny("bad_request"), status, &message, start);
            }
        };
        let permit = match self.permit().await {
            Ok(p) => p,
            Err(resp) => return resp,
        };
        let mut head = Vec::new();
        let mut ended = false;
        // Parsing starts over from the first byte, so it runs again only
        // once the buffer has doubled (or the body ended): linear in all.
        let mut parse_at = 1;
        let req = loop {
            if ended || head.len() >= parse_at {
                parse_at = head.len() * 2;
                match push_request::parse_push_request(&head, ended) {
                    Ok(Some(req)) => break req,
                    Ok(None) => {}
                    Err(malformed) => {
                        return self
                            .refuse_malformed(malformed, &mut input, deny, start)
                            .await;
                    }
                }
            }
            if head.len() > self.limits.max_command_bytes {
                let message = format!(
                    "the push's command list is over {} bytes; fix: push fewer refs at once",
                    self.limits.max_command_bytes
                );
                return self.refuse(
                    deny(RefusalKind::Malformed.as_str()),
                    StatusCode::PAYLOAD_TOO_LARGE,
                    &message,
                    start,
                );
            }
            match input.next().await {
                Ok(Some(chunk)) => head.extend_from_slice(&chunk),
                Ok(None) => ended = true,
                Err(e) => {
                    return self.refuse(
                        deny(RefusalKind::Malformed.as_str()),
                        StatusCode::BAD_REQUEST,
                        &e,
                        start,
                    );
                }
            }
        };
        let refs = req.refs();
        if !req.wants_report() {
            let mut e = deny(RefusalKind::Malformed.as_str());
            e.refs = refs;
            let body = pktline::error_packet(
                "the push does not ask for report-status; fix: push with a git client",
            );
            return self.answer_refusal(e, body, &mut input, start).await;
        }
        let mut refusals = Vec::new();
        if req.signed {
            refusals.extend(request_refusals(
                &req,
                RefusalKind::SignedPush,
                "signed pushes are not accepted: the gate does not verify push certificates; fix: push without --signed",
            ));
        }
        if req.has_cap("push-options") {
            refusals.extend(request_refusals(
                &req,
                RefusalKind::PushOptions,
                "push options are not accepted; fix: push without -o/--push-option",
            ));
        }
        let (rules, policy) = self.effective_rules(&repo);
        refusals.extend(req.updates.iter().filter_map(|u| policy.check(u).err()));
        if let Some(first) = refusals.first() {
            let mut e = deny(&refusal_reason(first));
            e.refs = refs;
            let body = pktline::refusal_response(&req, &refusals);
            return self.answer_refusal(e, body, &mut input, start).await;
        }
        let lock = match &repo.config.upstream {
            Some(_) => Some(repo.lock.clone().lock_owned().await),
            None => None,
        };
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let result_file = self.results_dir.join(format!("{seq}.json"));
        let spec = HookSpec {
            repo: rules,
            git: self.git.program.clone(),
            result_file: result_file.clone(),
        };
        let spec = match serde_json::to_string(&spec) {
            Ok(s) => s,
            Err(e) => {
                return self.refuse(
                    Entry::new(Decision::Error, &name, "push", &path, "internal"),
                    StatusCode::INTERNAL_SERVER_ERROR,
                    &format!("could not encode the hook's instructions: {e}"),
                    start,
                );
            }
        };
        let inv = self.git.receive_pack(
            &repo.path,
            false,
            &policy,
            self.limits.max_push_bytes,
            Some(&spec),
        );
        let sideband = req.sideband().is_some();
        let gate = self.clone();
        let p = path.clone();
        let n = name.clone();
        let r = refs.clone();
        let done = move |d: PipeDone| {
            let hook: Option<HookResult> = std::fs::read(&result_file)
                .ok()
                .and_then(|b| serde_json::from_slice(&b).ok());
            let _ = std::fs::remove_file(&result_file);
            let report = pktline::parse_report(&d.tee, sideband);
            let (decision, reason) = push_verdict(&d, hook.as_ref(), &report);
            let mut e = Entry::new(decision, &n, "push", &p, &reason);
            e.refs = r;
            e.bytes_up = d.bytes_in;
            e.bytes_down = d.bytes_out;
            gate.write_audit(e, StatusCode::OK, start);
        };
        match pipe(&inv, head, input, false, (permit, lock), done) {
            Ok(body) => git_response(
                &format!("application/x-{}-result", Service::ReceivePack.name()),
                body,
            ),
            Err(e) => {
                let mut entry = Entry::new(Decision::Error, &name, "push", &path, "git_failed");
                entry.refs = refs;
                self.refuse(
                    entry,
                    StatusCode::INTERNAL_SERVER_ERROR,
                    &format!("could not run git receive-pack: {e}"),
                    start,
                )
            }
        }
    }
}

/// A refusal of the whole request, once per ref it names (so each gets
/// its `ng`), or once with no ref when it names none.
fn request_refusals(req: &PushRequest, kind: RefusalKind, message: &str) -> Vec<Refusal> {
    let refusal = |refname: &str| Refusal {
        kind,
        refname: refname.to_string(),
        message: message.to_string(),
    };
    if req.updates.is_empty() {
        return vec![refusal("")];
    }
    req.updates.iter().map(|u| refusal(&u.refname)).collect()
}

/// The audit reason for a refusal: its kind, then the ref it names.
fn refusal_reason(r: &Refusal) -> String {
    if r.refname.is_empty() {
        r.kind.as_str().to_string()
    } else {
        format!("{}: {}", r.kind.as_str(), r.refname)
    }
}

/// The audit decision for a push that went to receive-pack.
fn push_verdict(
    d: &PipeDone,
    hook: Option<&HookResult>,
    report: &pktline::Report,
) -> (Decision, String) {
    if let Some(first) = hook.and_then(|h| h.refused.first()) {
        let decision = if first.kind == RefusalKind::UpstreamPushFailed {
            Decision::Error
        } else {
            Decision::Deny
        };
        return (
            decision,
            format!("{}: {}", first.kind.as_str(), first.refname),
        );
    }
    if let Some((refname, Some(why))) = report.refs.iter().find(|(_, ng)| ng.is_some()) {
        return (Decision::Deny, format!("receive_pack: {why}: {refname}"));
    }
    if let Some(e) = &d.input_error {
        return (Decision::Error, format!("request_failed: {e}"));
    }
    match report.unpack.as_deref() {
        Some("ok") => {}
        Some(other) => return (Decision::Error, format!("unpack_failed: {other}")),
        None if report.refs.is_empty() && d.code == Some(0) => {
            // Nothing to report: a push with no updates.
            return (Decision::Allow, "allowed".into());
        }
        None => {
            return (
                Decision::Error,
                format!(
                    "receive_pack_failed: exit {:?}: {}",
                    d.code,
                    String::from_utf8_lossy(&d.stderr).trim()
                ),
            );
        }
    }
    if d.code != Some(0) {
        return (
            Decision::Error,
            format!("receive_pack_failed: exit {:?}", d.code),
        );
    }
    let forwarded = hook.is_some_and(|h| h.forwarded);
    (
        Decision::Allow,
        if forwarded {
            "allowed: forwarded upstream".into()
        } else {
            "allowed".into()
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gitgate::hook;

    #[test]
    fn verdicts() {
        let ok = PipeDone {
            code: Some(0),
            ..PipeDone::default()
        };
        let report = pktline::Report {
            unpack: Some("ok".into()),
            refs: vec![("refs/heads/a".into(), None)],
            messages: String::new(),
        };
        assert_eq!(
            push_verdict(&ok, None, &report),
            (Decision::Allow, "allowed".into())
        );
        let hook = HookResult {
            refused: vec![hook::HookRefusal {
                refname: "refs/heads/a".into(),
                kind: RefusalKind::NonFastForward,
                message: String::new(),
            }],
            forwarded: false,
        };
        assert_eq!(
            push_verdict(&ok, Some(&hook), &report),
            (Decision::Deny, "non_fast_forward: refs/heads/a".into())
        );
        let ng = pktline::Report {
            unpack: Some("ok".into()),
            refs: vec![("refs/heads/a".into(), Some("failed to lock".into()))],
            messages: String::new(),
        };
        assert_eq!(push_verdict(&ok, None, &ng).0, Decision::Deny);
        let bad = pktline::Report {
            unpack: Some("index-pack abnormal exit".into()),
            ..pktline::Report::default()
        };
        assert_eq!(push_verdict(&ok, None, &bad).0, Decision::Error);
    }
}
