//! Bottle names and slugs.
//!
//! A slug is what every resource a bottle creates is named after
//! (`bot-bottle-<slug>`), so it must be a valid Docker object name, a valid
//! smolvm machine name and a valid path component all at once.

use thiserror::Error;

use crate::error::Coded;

/// The prefix of every resource a bottle creates.
pub const RESOURCE_PREFIX: &str = "bot-bottle-";

/// The longest slug we produce: Docker names allow more, but the network
/// interface names derived from them do not.
pub const MAX_SLUG_LEN: usize = 40;

/// A name that cannot become a slug.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum SlugError {
    /// Nothing usable was left after normalising.
    #[error("bottle name {0:?} has no letters or digits")]
    Empty(String),
}

impl Coded for SlugError {
    fn code(&self) -> &'static str {
        "BOT-S001"
    }

    fn fix(&self) -> Option<String> {
        Some("give the bottle a name with letters or digits (--name)".into())
    }
}

/// Turns a free-form name into a slug: lowercase ASCII letters, digits and
/// single dashes, no leading or trailing dash, at most [`MAX_SLUG_LEN`].
pub fn slugify(name: &str) -> Result<String, SlugError> {
    let mut slug = String::with_capacity(name.len());
    let mut pending_dash = false;
    for ch in name.chars() {
        if ch.is_ascii_alphanumeric() {
            if pending_dash && !slug.is_empty() {
                slug.push('-');
            }
            pending_dash = false;
            slug.push(ch.to_ascii_lowercase());
        } else {
            pending_dash = true;
        }
    }
    if slug.is_empty() {
        return Err(SlugError::Empty(name.to_string()));
    }
    slug.truncate(MAX_SLUG_LEN);
    while slug.ends_with('-') {
        slug.pop();
    }
    Ok(slug)
}

/// `bot-bottle-<slug>`: the bottle's name and the base of its resources.
pub fn bottle_name(slug: &str) -> String {
    format!("{RESOURCE_PREFIX}{slug}")
}

/// The slug of a bottle name, accepting either form (`x` or `bot-bottle-x`).
pub fn slug_of(name: &str) -> &str {
    name.strip_prefix(RESOURCE_PREFIX).unwrap_or(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slug_rules() {
        let cases = [
            ("claude", "claude"),
            ("Claude Code", "claude-code"),
            ("  my__agent--2 ", "my-agent-2"),
            ("ÄgentX", "gentx"),
            ("a/b\\c", "a-b-c"),
            ("-lead-and-trail-", "lead-and-trail"),
        ];
        for (input, want) in cases {
            assert_eq!(slugify(input).as_deref(), Ok(want), "{input:?}");
        }
    }

    #[test]
    fn slug_is_bounded_and_never_ends_in_a_dash() {
        let long = format!("{}-{}", "a".repeat(39), "b".repeat(10));
        let slug = slugify(&long).unwrap();
        assert!(slug.len() <= MAX_SLUG_LEN);
        assert!(!slug.ends_with('-'));
    }

    #[test]
    fn empty_names_are_refused() {
        assert_eq!(slugify("--"), Err(SlugError::Empty("--".into())));
        assert!(slugify("").is_err());
    }

    #[test]
    fn names_round_trip() {
        assert_eq!(bottle_name("x"), "bot-bottle-x");
        assert_eq!(slug_of("bot-bottle-x"), "x");
        assert_eq!(slug_of("x"), "x");
    }
}
