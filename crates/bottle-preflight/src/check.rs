//! The result type every check returns, and the helpers that judge a set.

use std::fmt;

use serde::Serialize;

/// How a check came out.
///
/// Ordered by severity so `max()` over a set of statuses gives the worst.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Not relevant on this host or for the selected backend.
    Skip,
    /// The host meets the requirement.
    Ok,
    /// Works, but something deserves attention (untested version, a backend
    /// that is not selected cannot run).
    Warn,
    /// The selected backend cannot run on this host.
    Fail,
}

impl Status {
    /// The lowercase name used in the table and in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Fail => "fail",
            Status::Skip => "skip",
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One host check's outcome.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    /// Stable identifier (`kvm.device`); scripts match on it.
    pub id: &'static str,
    /// Short human title ("KVM device").
    pub title: &'static str,
    /// The verdict.
    pub status: Status,
    /// What was found, as a lowercase fragment.
    pub message: String,
    /// What the operator should do, when there is something to do. May span
    /// several lines (a NixOS configuration snippet).
    pub remediation: Option<String>,
}

impl Check {
    /// A check result without remediation.
    pub fn new(id: &'static str, title: &'static str, status: Status, message: String) -> Self {
        Check {
            id,
            title,
            status,
            message,
            remediation: None,
        }
    }

    /// Attaches remediation text.
    pub fn with_remediation(mut self, remediation: impl Into<String>) -> Self {
        self.remediation = Some(remediation.into());
        self
    }

    /// Turns a failure into a warning for a requirement of a backend that is
    /// not selected: the host cannot run that backend, but the operator did
    /// not ask for it.
    pub(crate) fn soften(mut self, needed: bool, why: &str) -> Self {
        if !needed && self.status == Status::Fail {
            self.status = Status::Warn;
            self.message = format!("{} ({why})", self.message);
        }
        self
    }
}

/// True when any check failed, i.e. the selected backend cannot run here.
pub fn is_fatal(checks: &[Check]) -> bool {
    checks.iter().any(|check| check.status == Status::Fail)
}

/// How many checks came out with each status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct Summary {
    /// Checks that passed.
    pub ok: usize,
    /// Checks that warned.
    pub warn: usize,
    /// Checks that failed.
    pub fail: usize,
    /// Checks that were skipped.
    pub skip: usize,
}

impl Summary {
    /// Counts `checks` by status.
    pub fn of(checks: &[Check]) -> Self {
        checks.iter().fold(Summary::default(), |mut sum, check| {
            match check.status {
                Status::Ok => sum.ok += 1,
                Status::Warn => sum.warn += 1,
                Status::Fail => sum.fail += 1,
                Status::Skip => sum.skip += 1,
            }
            sum
        })
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} ok, {} warn, {} fail, {} skip",
            self.ok, self.warn, self.fail, self.skip
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(status: Status) -> Check {
        Check::new("x", "X", status, "m".into())
    }

    #[test]
    fn only_fail_is_fatal() {
        assert!(!is_fatal(&[]));
        assert!(!is_fatal(&[
            check(Status::Ok),
            check(Status::Warn),
            check(Status::Skip)
        ]));
        assert!(is_fatal(&[check(Status::Ok), check(Status::Fail)]));
    }

    #[test]
    fn soften_turns_fail_into_warn_only_when_not_needed() {
        let soft = check(Status::Fail).soften(false, "only the docker backend needs it");
        assert_eq!(soft.status, Status::Warn);
        assert_eq!(soft.message, "m (only the docker backend needs it)");
        assert_eq!(check(Status::Fail).soften(true, "x").status, Status::Fail);
        assert_eq!(check(Status::Ok).soften(false, "x"), check(Status::Ok));
    }

    #[test]
    fn status_serialises_lowercase_and_orders_by_severity() {
        let json = serde_json::to_string(&check(Status::Warn).with_remediation("do it")).unwrap();
        assert_eq!(
            json,
            r#"{"id":"x","title":"X","status":"warn","message":"m","remediation":"do it"}"#
        );
        assert!(Status::Skip < Status::Ok && Status::Ok < Status::Warn);
        assert!(Status::Warn < Status::Fail);
    }

    #[test]
    fn summary_counts() {
        let checks = [
            check(Status::Ok),
            check(Status::Ok),
            check(Status::Fail),
            check(Status::Skip),
        ];
        assert_eq!(
            Summary::of(&checks).to_string(),
            "2 ok, 0 warn, 1 fail, 1 skip"
        );
    }
}
