//! `strftime_now`: the current time as Python's `strftime` formats it, without a time-zone
//! database (UTC) or a date library.

use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

/// `strftime_now(format)`: the current time, formatted like Python's `strftime`. Llama 3.x
/// templates put today's date in the system prompt with it.
///
/// transformers uses the local time zone; servers run in UTC as a rule, and UTC keeps the
/// prompt independent of the host's configuration, so UTC is used here.
pub(super) fn strftime_now(format: &str) -> String {
    let secs = match SystemTime::now().duration_since(UNIX_EPOCH) {
        Ok(elapsed) => i64::try_from(elapsed.as_secs()).unwrap_or(i64::MAX),
        Err(before) => i64::try_from(before.duration().as_secs()).map_or(i64::MIN, |s| -s),
    };
    format_time(format, secs)
}

/// English names, as the C locale that `strftime` uses by default.
const WEEKDAYS: [&str; 7] = ["Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"];
const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

/// A broken-down UTC time.
struct CivilTime {
    year: i64,
    /// 1..=12.
    month: u32,
    /// 1..=31.
    day: u32,
    /// 0 = Sunday.
    weekday: u32,
    /// 1..=366.
    day_of_year: u32,
    hour: u32,
    minute: u32,
    second: u32,
}

impl CivilTime {
    /// Splits seconds since the Unix epoch (UTC); no time-zone or leap-second data is needed.
    fn from_unix(secs: i64) -> Self {
        let days = secs.div_euclid(86_400);
        let rem = secs.rem_euclid(86_400);
        let (year, month, day) = civil_from_days(days);
        let day_of_year = days - days_from_civil(year, 1, 1) + 1;
        Self {
            year,
            month,
            day,
            // 1970-01-01 was a Thursday.
            weekday: to_u32((days + 4).rem_euclid(7)),
            day_of_year: to_u32(day_of_year),
            hour: to_u32(rem / 3600),
            minute: to_u32(rem / 60 % 60),
            second: to_u32(rem % 60),
        }
    }
}

/// Narrows a value that is in range by construction (a calendar field).
fn to_u32(v: i64) -> u32 {
    u32::try_from(v).unwrap_or(0)
}

/// Howard Hinnant's `civil_from_days`: proleptic Gregorian date of a day count since 1970-01-01.
pub(super) fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, to_u32(month), to_u32(day))
}

/// The inverse of [`civil_from_days`].
pub(super) fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = i64::from(month);
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Python/C `strftime` in the C locale for the directives templates use; `%-d` style flags
/// (glibc) drop the padding. Unknown directives are copied as they are, like glibc does.
pub(super) fn format_time(format: &str, unix_secs: i64) -> String {
    let t = CivilTime::from_unix(unix_secs);
    let mut out = String::with_capacity(format.len() + 16);
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let mut spec = chars.next();
        let pad = if spec == Some('-') {
            spec = chars.next();
            false
        } else {
            true
        };
        let num = |out: &mut String, v: i64, width: usize| {
            let _ = if pad { write!(out, "{v:0width$}") } else { write!(out, "{v}") };
        };
        let weekday = WEEKDAYS[t.weekday as usize % 7];
        let month = MONTHS[(t.month as usize + 11) % 12];
        let hour12 = if t.hour.is_multiple_of(12) { 12 } else { t.hour % 12 };
        match spec {
            Some('a') => out.push_str(&weekday[..3]),
            Some('A') => out.push_str(weekday),
            Some('b' | 'h') => out.push_str(&month[..3]),
            Some('B') => out.push_str(month),
            Some('d') => num(&mut out, t.day.into(), 2),
            Some('e') => {
                let _ = if pad { write!(out, "{:2}", t.day) } else { write!(out, "{}", t.day) };
            }
            Some('H') => num(&mut out, t.hour.into(), 2),
            Some('I') => num(&mut out, hour12.into(), 2),
            Some('j') => num(&mut out, t.day_of_year.into(), 3),
            Some('m') => num(&mut out, t.month.into(), 2),
            Some('M') => num(&mut out, t.minute.into(), 2),
            Some('S') => num(&mut out, t.second.into(), 2),
            Some('p') => out.push_str(if t.hour < 12 { "AM" } else { "PM" }),
            Some('y') => num(&mut out, t.year.rem_euclid(100), 2),
            Some('Y') => {
                let _ = write!(out, "{}", t.year);
            }
            Some('u') => {
                let _ = write!(out, "{}", if t.weekday == 0 { 7 } else { t.weekday });
            }
            Some('w') => {
                let _ = write!(out, "{}", t.weekday);
            }
            Some('F') => out.push_str(&format_time("%Y-%m-%d", unix_secs)),
            Some('D' | 'x') => out.push_str(&format_time("%m/%d/%y", unix_secs)),
            Some('T' | 'X') => out.push_str(&format_time("%H:%M:%S", unix_secs)),
            Some('R') => out.push_str(&format_time("%H:%M", unix_secs)),
            Some('c') => out.push_str(&format_time("%a %b %e %H:%M:%S %Y", unix_secs)),
            Some('Z') => out.push_str("UTC"),
            Some('z') => out.push_str("+0000"),
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                if !pad {
                    out.push('-');
                }
                out.push(other);
            }
            None => {
                out.push('%');
                if !pad {
                    out.push('-');
                }
            }
        }
    }
    out
}
