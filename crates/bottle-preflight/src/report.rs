//! Renders checks as a fixed-width table. Pure: no colour, no terminal
//! queries; the CLI decides how to print it.

use std::fmt;

use crate::check::Check;

/// A table of checks: status, id and message, with remediation indented
/// under the message.
///
/// ```text
/// STATUS  CHECK        MESSAGE
/// ok      platform     linux x86_64
/// fail    kvm.device   no /dev/kvm: kvm is not available on this host
///                      fix: load the kvm module for this CPU: `sudo modprobe kvm_intel`
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Report<'a> {
    checks: &'a [Check],
}

impl<'a> Report<'a> {
    /// A report over `checks`, in their order.
    pub fn new(checks: &'a [Check]) -> Self {
        Report { checks }
    }
}

const STATUS_HEADER: &str = "STATUS";
const ID_HEADER: &str = "CHECK";
const FIX: &str = "fix: ";

impl fmt::Display for Report<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let status_width = STATUS_HEADER.len();
        let id_width = self
            .checks
            .iter()
            .map(|check| check.id.len())
            .chain([ID_HEADER.len()])
            .max()
            .unwrap_or(ID_HEADER.len());
        writeln!(
            f,
            "{STATUS_HEADER:status_width$}  {ID_HEADER:id_width$}  MESSAGE"
        )?;
        let indent = " ".repeat(status_width + 2 + id_width + 2);
        for check in self.checks {
            writeln!(
                f,
                "{:status_width$}  {:id_width$}  {}",
                check.status.as_str(),
                check.id,
                check.message
            )?;
            if let Some(remediation) = &check.remediation {
                for (n, line) in remediation.lines().enumerate() {
                    let lead = if n == 0 { FIX } else { "     " };
                    writeln!(f, "{indent}{lead}{line}")?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::Status;

    #[test]
    fn renders_a_fixed_width_table() {
        let checks = [
            Check::new("platform", "platform", Status::Ok, "linux x86_64".into()),
            Check::new(
                "kvm.access",
                "kvm access",
                Status::Fail,
                "user alice (uid 1000) cannot read and write /dev/kvm".into(),
            )
            .with_remediation(
                "add to /etc/nixos/configuration.nix:\n  users.users.alice.extraGroups = [ \"kvm\" ];\nthen run `sudo nixos-rebuild switch`",
            ),
            Check::new("smolvm.version", "smolvm", Status::Skip, "not needed".into()),
        ];
        expect_test::expect![[r#"
            STATUS  CHECK           MESSAGE
            ok      platform        linux x86_64
            fail    kvm.access      user alice (uid 1000) cannot read and write /dev/kvm
                                    fix: add to /etc/nixos/configuration.nix:
                                           users.users.alice.extraGroups = [ "kvm" ];
                                         then run `sudo nixos-rebuild switch`
            skip    smolvm.version  not needed
        "#]]
        .assert_eq(&Report::new(&checks).to_string());
    }

    #[test]
    fn empty_report_is_just_the_header() {
        assert_eq!(Report::new(&[]).to_string(), "STATUS  CHECK  MESSAGE\n");
    }
}
