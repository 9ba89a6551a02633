//! Times on the wire. We write RFC 3339 in UTC; we read what servers write: RFC 3339 with any
//! offset and any number of fraction digits, the same without a zone (read as UTC, as .NET
//! servers write them), and the Microsoft JSON form `/Date(ms)/` or `/Date(ms+hhmm)/` (the
//! milliseconds are UTC; the offset only says where the writer was).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use time::format_description::well_known::Rfc3339;

/// RFC 3339 in UTC with the precision the time has, e.g. `2026-11-21T10:00:00.123456789Z`.
/// Times before 1970 are written as such (`1960-...`), not clamped.
pub fn format_time(t: SystemTime) -> String {
    let dt = match t.duration_since(UNIX_EPOCH) {
        Ok(d) => time::OffsetDateTime::UNIX_EPOCH + d,
        Err(e) => time::OffsetDateTime::UNIX_EPOCH - e.duration(),
    };
    dt.format(&Rfc3339).unwrap_or_default()
}

/// A time in any of the forms above; `None` for anything else.
pub fn parse_time(s: &str) -> Option<SystemTime> {
    let s = s.trim();
    if let Some(inner) = s.strip_prefix("/Date(").and_then(|r| r.strip_suffix(")/")) {
        return parse_ms_date(inner);
    }
    let dt = match time::OffsetDateTime::parse(s, &Rfc3339) {
        Ok(dt) => dt,
        // No zone: the date, then a time without `Z` or an offset after it.
        Err(_) if !has_zone(s) => time::OffsetDateTime::parse(&format!("{s}Z"), &Rfc3339).ok()?,
        Err(_) => return None,
    };
    // Whole seconds and nanoseconds apart: nanoseconds since 1970 overflow a u64 after 2554.
    // Before 1970 the seconds count down and the nanoseconds still count up.
    let secs = dt.unix_timestamp();
    let whole = match u64::try_from(secs) {
        Ok(s) => UNIX_EPOCH + Duration::from_secs(s),
        Err(_) => UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs()),
    };
    Some(whole + Duration::from_nanos(u64::from(dt.nanosecond())))
}

/// Whether the time part of an RFC 3339-like string ends in `Z` or an offset.
fn has_zone(s: &str) -> bool {
    let time = s.split_once(['T', 't', ' ']).map_or("", |(_, t)| t);
    time.ends_with(['Z', 'z']) || time.contains(['+', '-'])
}

/// `1700000000000` or `1700000000000+0100` (the inside of `/Date(...)/`).
fn parse_ms_date(inner: &str) -> Option<SystemTime> {
    // The offset's sign is the first `+` or `-` after the leading sign of the number.
    let end = inner
        .char_indices()
        .skip(1)
        .find(|(_, c)| matches!(c, '+' | '-'))
        .map_or(inner.len(), |(i, _)| i);
    let (ms, offset) = inner.split_at(end);
    let offset_ok =
        offset.is_empty() || (offset.len() == 5 && offset[1..].bytes().all(|c| c.is_ascii_digit()));
    if !offset_ok {
        return None;
    }
    let ms: i64 = ms.parse().ok()?;
    Some(match u64::try_from(ms) {
        Ok(ms) => UNIX_EPOCH + Duration::from_millis(ms),
        Err(_) => UNIX_EPOCH - Duration::from_millis(ms.unsigned_abs()),
    })
}

/// Signed: times a client set may be before 1970.
pub fn ns_to_time(ns: i64) -> SystemTime {
    match u64::try_from(ns) {
        Ok(ns) => UNIX_EPOCH + Duration::from_nanos(ns),
        Err(_) => UNIX_EPOCH - Duration::from_nanos(ns.unsigned_abs()),
    }
}

/// Nanoseconds since 1970, negative before; clamped to what an i64 holds (years 1678..2262).
pub fn time_to_ns(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_nanos()).unwrap_or(i64::MAX),
        Err(e) => i64::try_from(e.duration().as_nanos()).map_or(i64::MIN, |n| -n),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let t = UNIX_EPOCH + Duration::new(1_700_000_000, 123_456_789);
        let s = format_time(t);
        assert_eq!(s, "2023-11-14T22:13:20.123456789Z");
        assert_eq!(parse_time(&s), Some(t));
    }

    #[test]
    fn before_1970_and_after_2038_round_trip() {
        for t in [
            UNIX_EPOCH - Duration::new(1_000_000_000, 0) + Duration::from_nanos(250),
            UNIX_EPOCH - Duration::from_nanos(1),
            UNIX_EPOCH + Duration::new(4_102_444_800, 999_999_999),
        ] {
            assert_eq!(parse_time(&format_time(t)), Some(t), "{}", format_time(t));
        }
        assert_eq!(
            format_time(UNIX_EPOCH - Duration::from_secs(86_400)),
            "1969-12-31T00:00:00Z"
        );
    }

    #[test]
    fn reads_what_servers_write() {
        let at = |secs: u64, nanos: u32| Some(UNIX_EPOCH + Duration::new(secs, nanos));
        for (s, want) in [
            ("2023-11-14T22:13:20Z", at(1_700_000_000, 0)),
            ("2023-11-14T23:13:20+01:00", at(1_700_000_000, 0)),
            (
                "2023-11-14T17:13:20.5-05:00",
                at(1_700_000_000, 500_000_000),
            ),
            (
                "2023-11-14T22:13:20.1234567",
                at(1_700_000_000, 123_456_700),
            ),
            ("2023-11-14T22:13:20", at(1_700_000_000, 0)),
            ("/Date(1700000000123)/", at(1_700_000_000, 123_000_000)),
            ("/Date(1700000000000+0100)/", at(1_700_000_000, 0)),
            ("/Date(1700000000000-0500)/", at(1_700_000_000, 0)),
        ] {
            assert_eq!(parse_time(s), want, "{s}");
        }
        assert_eq!(
            parse_time("/Date(-1000)/"),
            Some(UNIX_EPOCH - Duration::from_secs(1))
        );
        for bad in [
            "",
            "yesterday",
            "2023-13-01T00:00:00Z",
            "/Date(abc)/",
            "/Date(1+1)/",
        ] {
            assert_eq!(parse_time(bad), None, "{bad}");
        }
    }
}
