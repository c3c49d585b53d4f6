//! The API's errors: a stable code, a message and a fix, as JSON with an
//! HTTP status that says whose problem it is.

use bottle_core::Coded;
use bottle_core::sandbox::{ResetReport, SandboxError};
use hyper::StatusCode;
use serde::Serialize;

use crate::failure::Failure;

/// One error answer: `{"error": {"code", "message", "fix"}}`, and for a
/// reset divergence `"report"` beside it.
#[derive(Debug)]
pub(crate) struct ApiError {
    pub status: StatusCode,
    pub code: String,
    pub message: String,
    pub fix: Option<String>,
    pub report: Option<Box<ResetReport>>,
}

#[derive(Serialize)]
struct Body<'a> {
    error: Detail<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    report: Option<&'a ResetReport>,
}

#[derive(Serialize)]
struct Detail<'a> {
    code: &'a str,
    message: &'a str,
    fix: Option<&'a str>,
}

impl ApiError {
    pub(crate) fn new(
        status: StatusCode,
        code: impl Into<String>,
        message: impl Into<String>,
        fix: impl Into<String>,
    ) -> ApiError {
        ApiError {
            status,
            code: code.into(),
            message: message.into(),
            fix: Some(fix.into()),
            report: None,
        }
    }

    /// A request the server cannot read (`BOT-C042`, 400).
    pub(crate) fn bad_request(why: impl Into<String>) -> ApiError {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "BOT-C042",
            format!("bad request: {}", why.into()),
            "send the JSON body docs/SANDBOX.md describes for this endpoint",
        )
    }

    /// The server itself failed (`BOT-C047`, 500).
    pub(crate) fn internal(why: impl Into<String>) -> ApiError {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "BOT-C047",
            format!("the server failed: {}", why.into()),
            "see `bottle serve --verbose` on the host; restart it if this persists",
        )
    }

    /// A CLI failure, with the status its exit code means here.
    pub(crate) fn from_failure(failure: Failure, status: StatusCode) -> ApiError {
        ApiError {
            status,
            code: failure.code.unwrap_or("BOT-C046").to_string(),
            message: failure.message,
            fix: failure.fix,
            report: None,
        }
    }

    /// The JSON body.
    pub(crate) fn body(&self) -> Vec<u8> {
        serde_json::to_vec(&Body {
            error: Detail {
                code: &self.code,
                message: &self.message,
                fix: self.fix.as_deref(),
            },
            report: self.report.as_deref(),
        })
        .unwrap_or_default()
    }
}

impl From<SandboxError> for ApiError {
    fn from(err: SandboxError) -> ApiError {
        let status = match &err {
            SandboxError::ToolTimeout { .. } => StatusCode::GATEWAY_TIMEOUT,
            SandboxError::Reset { .. } | SandboxError::ResetDivergence { .. } => {
                StatusCode::CONFLICT
            }
            SandboxError::NotAvailable { .. }
            | SandboxError::Boot { .. }
            | SandboxError::Tool { .. }
            | SandboxError::Channel { .. } => StatusCode::INTERNAL_SERVER_ERROR,
        };
        let (code, message, fix) = (err.code(), err.to_string(), err.fix());
        ApiError {
            status,
            code: code.to_string(),
            message,
            fix,
            report: match err {
                SandboxError::ResetDivergence { report } => Some(report),
                _ => None,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use bottle_core::sandbox::{Source, SourceCheck};

    use super::*;

    #[test]
    fn a_divergence_is_a_conflict_that_carries_its_report() {
        let report = ResetReport {
            bottle: "bot-bottle-x".into(),
            checks: vec![SourceCheck {
                source: Source::OpenFds,
                expected: "6".into(),
                observed: "7".into(),
                matched: false,
            }],
            verified: false,
            method: bottle_core::sandbox::RevertMethod::Restart,
            revert: Duration::from_millis(300),
            verify: Duration::from_millis(20),
        };
        let err = ApiError::from(SandboxError::ResetDivergence {
            report: Box::new(report),
        });
        assert_eq!(err.status, StatusCode::CONFLICT);
        let body: serde_json::Value = serde_json::from_slice(&err.body()).unwrap();
        assert_eq!(body["error"]["code"], "BOT-X006");
        assert_eq!(body["report"]["checks"][0]["source"], "open_fds");
        assert!(body["error"]["fix"].as_str().unwrap().contains("halted"));
    }

    #[test]
    fn a_timeout_is_a_gateway_timeout_without_a_report() {
        let err = ApiError::from(SandboxError::ToolTimeout {
            bottle: "bot-bottle-x".into(),
            call: "sleep 9".into(),
            deadline: Duration::from_millis(100),
        });
        assert_eq!(err.status, StatusCode::GATEWAY_TIMEOUT);
        let body: serde_json::Value = serde_json::from_slice(&err.body()).unwrap();
        assert_eq!(body["error"]["code"], "BOT-X003");
        assert!(body.get("report").is_none());
    }
}
