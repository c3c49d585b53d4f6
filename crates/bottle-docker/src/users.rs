//! Which numeric owner a container's configured user maps to, read from the
//! image's own `/etc/passwd` and `/etc/group`.
//!
//! Files copied in for the agent (prompt, skills, `copy_in`) must belong to
//! the agent's user. The daemon's `copyUIDGID` would do this, but Docker
//! 20.10 resolves names with the *host's* `getent`, so we resolve them
//! ourselves against the container's files.

use crate::error::DockerError;
use crate::tarball::Ownership;

/// Resolves a Docker `User` value (`""`, `name`, `uid`, `name:group`,
/// `uid:gid`) against the container's passwd and group files.
pub fn resolve_owner(user: &str, passwd: &str, group: &str) -> Result<Ownership, DockerError> {
    let (user_part, group_part) = match user.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (user, None),
    };
    let unknown = |what: &str, name: &str| DockerError::BadOption {
        option: "image user".into(),
        detail: format!(
            "{what} {name:?} is not in the image's /etc/{}",
            if what == "user" { "passwd" } else { "group" }
        ),
    };
    // (uid, primary gid) of a passwd line matching by name or uid.
    let find_user = |key: &str| {
        passwd.lines().find_map(|line| {
            let fields: Vec<&str> = line.split(':').collect();
            if fields.len() < 4 || (fields[0] != key && fields[2] != key) {
                return None;
            }
            Some((
                fields[2].parse::<u64>().ok()?,
                fields[3].parse::<u64>().ok()?,
            ))
        })
    };
    let (uid, primary_gid) = if user_part.is_empty() {
        (0, 0)
    } else if let Some(found) = find_user(user_part) {
        found
    } else if let Ok(uid) = user_part.parse::<u64>() {
        // A numeric user without a passwd entry runs with group 0.
        (uid, 0)
    } else {
        return Err(unknown("user", user_part));
    };
    let gid = match group_part {
        None | Some("") => primary_gid,
        Some(g) => match g.parse::<u64>() {
            Ok(gid) => gid,
            Err(_) => group
                .lines()
                .find_map(|line| {
                    let fields: Vec<&str> = line.split(':').collect();
                    (fields.len() >= 3 && fields[0] == g).then(|| fields[2].parse::<u64>().ok())?
                })
                .ok_or_else(|| unknown("group", g))?,
        },
    };
    Ok(Ownership { uid, gid })
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWD: &str = "root:x:0:0:root:/root:/bin/sh\nagent:x:1000:1001:a:/home/agent:/bin/sh\n";
    const GROUP: &str = "root:x:0:\nagent:x:1001:\nstaff:x:50:\n";

    fn owner(user: &str) -> Result<(u64, u64), DockerError> {
        resolve_owner(user, PASSWD, GROUP).map(|o| (o.uid, o.gid))
    }

    #[test]
    fn user_forms() {
        assert_eq!(owner("").unwrap(), (0, 0));
        assert_eq!(owner("agent").unwrap(), (1000, 1001));
        assert_eq!(owner("1000").unwrap(), (1000, 1001));
        assert_eq!(owner("4242").unwrap(), (4242, 0));
        assert_eq!(owner("agent:staff").unwrap(), (1000, 50));
        assert_eq!(owner("agent:7").unwrap(), (1000, 7));
        assert_eq!(owner("4242:4243").unwrap(), (4242, 4243));
    }

    #[test]
    fn unknown_names_are_errors() {
        assert!(
            owner("nobody-here")
                .unwrap_err()
                .to_string()
                .contains("passwd")
        );
        assert!(
            owner("agent:wheel")
                .unwrap_err()
                .to_string()
                .contains("group")
        );
    }
}
