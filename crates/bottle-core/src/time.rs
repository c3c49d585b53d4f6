//! Timestamps as RFC 3339 UTC text, the one format bottle writes them in
//! (the request queue, the audit log, `bottle list`), formatted here by
//! hand so bottle-core needs no date crate.

use std::time::{SystemTime, UNIX_EPOCH};

/// Unix seconds as RFC 3339 UTC (`2025-01-02T03:04:05Z`).
pub fn rfc3339(secs: i64) -> String {
    let (date, time) = date_and_time(secs);
    format!("{date}T{time}Z")
}

/// Unix seconds and a millisecond as RFC 3339 UTC
/// (`2025-01-02T03:04:05.678Z`).
pub fn rfc3339_millis(secs: i64, millis: u32) -> String {
    let (date, time) = date_and_time(secs);
    format!("{date}T{time}.{:03}Z", millis.min(999))
}

/// Now, to the second.
pub fn now_rfc3339() -> String {
    let (secs, _) = since_epoch();
    rfc3339(secs)
}

/// Now, to the millisecond (the audit log's precision).
pub fn now_rfc3339_millis() -> String {
    let (secs, millis) = since_epoch();
    rfc3339_millis(secs, millis)
}

fn since_epoch() -> (i64, u32) {
    // A clock before 1970 is reported as the epoch rather than failing.
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or((0, 0), |d| {
            (
                i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
                d.subsec_millis(),
            )
        })
}

/// `YYYY-MM-DD` and `hh:mm:ss` of a Unix time.
fn date_and_time(secs: i64) -> (String, String) {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (
        format!("{year:04}-{month:02}-{day:02}"),
        format!("{:02}:{:02}:{:02}", rem / 3600, rem % 3600 / 60, rem % 60),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_700_000_000), "2023-11-14T22:13:20Z");
        assert_eq!(rfc3339(1_735_787_045), "2025-01-02T03:04:05Z");
        assert_eq!(rfc3339(-1), "1969-12-31T23:59:59Z");
    }

    #[test]
    fn milliseconds_have_three_digits() {
        assert_eq!(rfc3339_millis(1_735_787_045, 7), "2025-01-02T03:04:05.007Z");
        assert_eq!(
            rfc3339_millis(1_735_787_045, 678),
            "2025-01-02T03:04:05.678Z"
        );
    }

    #[test]
    fn now_has_the_shape_of_its_precision() {
        assert_eq!(now_rfc3339().len(), "2025-01-02T03:04:05Z".len());
        assert_eq!(now_rfc3339_millis().len(), "2025-01-02T03:04:05.678Z".len());
    }
}
