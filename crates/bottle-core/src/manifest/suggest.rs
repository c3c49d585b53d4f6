//! "Did you mean" suggestions for misspelt keys and values.

/// The candidate closest to `input`, if one is close enough to be what the
/// operator meant. Case-only differences always match.
pub(crate) fn did_you_mean<'a>(input: &str, candidates: &[&'a str]) -> Option<&'a str> {
    if let Some(same) = candidates.iter().find(|c| c.eq_ignore_ascii_case(input)) {
        return Some(same);
    }
    let lower = input.to_ascii_lowercase();
    candidates
        .iter()
        .map(|c| (strsim::jaro_winkler(&lower, c), *c))
        .filter(|(score, _)| *score > 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, c)| c)
}

/// `` `a`, `b`, `c` `` for a "valid keys here" fix.
pub(crate) fn list(candidates: &[&str]) -> String {
    candidates
        .iter()
        .map(|c| format!("`{c}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggests_close_keys_only() {
        let keys = ["image", "build", "command", "env", "egress"];
        assert_eq!(did_you_mean("imgae", &keys), Some("image"));
        assert_eq!(did_you_mean("Image", &keys), Some("image"));
        assert_eq!(did_you_mean("egres", &keys), Some("egress"));
        assert_eq!(did_you_mean("network", &keys), None);
        assert_eq!(list(&["a", "b"]), "`a`, `b`");
    }
}
