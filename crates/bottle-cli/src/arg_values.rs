//! The values arguments take, parsed as clap's value parsers: sizes and
//! durations.

use std::time::Duration;

/// The size `--max-size` takes: `1G`, `500m`, `4096` (binary units).
pub(crate) fn parse_max_size(text: &str) -> Result<u64, String> {
    bottle_core::manifest::parse_memory(text)
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("{text:?} is not a size (e.g. 1G, 500m, 4096)"))
}

/// A deadline: a whole number and a unit, `ms`, `s`, `m` or `h`.
pub(crate) fn parse_deadline(text: &str) -> Result<Duration, String> {
    let unit_at = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("{text:?} has no unit: write e.g. 500ms, 60s, 5m or 1h"))?;
    let (number, unit) = text.split_at(unit_at);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} does not start with a whole number"))?;
    let millis = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => return Err(format!("unknown unit {unit:?}: use ms, s, m or h")),
    };
    match number.checked_mul(millis) {
        Some(0) => Err("the deadline must be longer than 0".into()),
        Some(ms) => Ok(Duration::from_millis(ms)),
        None => Err(format!("{text:?} is too long")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_binary() {
        assert_eq!(parse_max_size("1G"), Ok(1 << 30));
        assert_eq!(parse_max_size("500m"), Ok(500 << 20));
        assert!(parse_max_size("0").is_err());
        assert!(parse_max_size("lots").is_err());
    }

    #[test]
    fn deadlines_parse_with_a_unit() {
        assert_eq!(parse_deadline("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_deadline("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_deadline("60").is_err());
        assert!(parse_deadline("0s").is_err());
        assert!(parse_deadline("5d").is_err());
    }
}
