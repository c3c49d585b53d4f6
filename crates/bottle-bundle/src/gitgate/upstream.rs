//! Mirror mode: a bare mirror of a remote, refreshed from the upstream
//! before it is served, with the upstream's credential injected as an HTTP
//! header that only the gate's own git processes ever see.

use std::path::Path;

use super::command::Git;

/// The `Authorization` header line for a credential file's content.
///
/// The first non-empty line is read as: a whole `Authorization: ...` header
/// (used as is), `user:token` (HTTP Basic), or a bare token (HTTP Basic
/// with user `x-access-token`, which GitHub expects for tokens; write
/// `oauth2:<token>` for GitLab).
pub fn auth_header(secret: &str) -> Result<String, String> {
    let line = secret
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .ok_or_else(|| "the file is empty".to_string())?;
    if line.bytes().any(|b| b.is_ascii_control()) {
        return Err("the credential contains control characters".into());
    }
    if line
        .get(..14)
        .is_some_and(|p| p.eq_ignore_ascii_case("authorization:"))
    {
        return Ok(line.to_string());
    }
    let pair = if line.contains(':') {
        line.to_string()
    } else {
        format!("x-access-token:{line}")
    };
    Ok(format!("Authorization: Basic {}", base64(pair.as_bytes())))
}

/// Reads a credential file and builds its header.
pub fn read_auth_header(path: &Path) -> Result<String, String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    auth_header(&text)
}

/// Standard base64 with padding.
pub fn base64(data: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                let idx = usize::try_from((n >> (18 - 6 * i)) & 63).unwrap_or(0);
                out.push(char::from(ALPHABET[idx]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Git's stderr, shortened for a message.
fn tail(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let text = text.trim();
    let start = text.len().saturating_sub(600);
    let start = (start..text.len())
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(text.len());
    text[start..].replace('\n', "; ")
}

/// Creates the mirror if it does not exist yet.
pub async fn ensure_mirror(git: &Git, path: &Path) -> Result<(), String> {
    if path.join("HEAD").is_file() {
        return Ok(());
    }
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|e| format!("could not create {}: {e}", parent.display()))?;
    }
    let out = git
        .init_bare(path)
        .output()
        .await
        .map_err(|e| format!("could not run git init: {e}"))?;
    if out.success() {
        Ok(())
    } else {
        Err(format!("git init failed: {}", tail(&out.stderr)))
    }
}

/// Fetches the upstream into the mirror and points the mirror's `HEAD` at
/// the upstream's default branch when it does not resolve yet.
pub async fn refresh(git: &Git, path: &Path, url: &str, auth: Option<&str>) -> Result<(), String> {
    ensure_mirror(git, path).await?;
    let out = git
        .fetch_mirror(path, url, auth)
        .output()
        .await
        .map_err(|e| format!("could not run git fetch: {e}"))?;
    if !out.success() {
        return Err(format!("git fetch failed: {}", tail(&out.stderr)));
    }
    let head_ok = git
        .verify(path, "HEAD")
        .output()
        .await
        .map_err(|e| format!("could not run git rev-parse: {e}"))?
        .success();
    if head_ok {
        return Ok(());
    }
    let out = git
        .ls_remote_head(path, url, auth)
        .output()
        .await
        .map_err(|e| format!("could not run git ls-remote: {e}"))?;
    if !out.success() {
        return Err(format!("git ls-remote failed: {}", tail(&out.stderr)));
    }
    let target = out.stdout_text().lines().find_map(|l| {
        l.strip_prefix("ref: ")
            .and_then(|rest| rest.strip_suffix("\tHEAD"))
            .map(str::to_string)
    });
    if let Some(target) = target.filter(|t| t.starts_with("refs/heads/")) {
        let out = git
            .set_head(path, &target)
            .output()
            .await
            .map_err(|e| format!("could not run git symbolic-ref: {e}"))?;
        if !out.success() {
            return Err(format!("git symbolic-ref failed: {}", tail(&out.stderr)));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_rfc4648_vectors() {
        for (input, want) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(input.as_bytes()), want, "{input:?}");
        }
    }

    #[test]
    fn credential_forms() {
        assert_eq!(
            auth_header("\n  user:pw \n").unwrap(),
            format!("Authorization: Basic {}", base64(b"user:pw"))
        );
        assert_eq!(
            auth_header("ghp_abc\n").unwrap(),
            format!("Authorization: Basic {}", base64(b"x-access-token:ghp_abc"))
        );
        assert_eq!(
            auth_header("authorization: Bearer t").unwrap(),
            "authorization: Bearer t"
        );
        assert!(auth_header("\n \n").is_err());
        assert!(auth_header("a\u{1b}b").is_err());
    }

    #[test]
    fn tail_keeps_the_end_on_a_char_boundary() {
        let long = format!("{}é\nfatal: the end", "x".repeat(700));
        let t = tail(long.as_bytes());
        assert!(t.ends_with("fatal: the end"), "{t}");
        assert!(t.len() <= 620);
    }
}
