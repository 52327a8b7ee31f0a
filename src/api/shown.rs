//! Client-supplied text as xinf shows it back, in error messages and in its log: clipped, so a
//! 3 MB model name does not come back as a 6 MB answer or a 3 MB log line, and, in the log,
//! escaped, so a name with a newline cannot forge a log line.

use std::borrow::Cow;
use std::fmt;

/// The most characters of a client's value shown back.
const SHOWN_CHARS: usize = 256;

/// `s` as an answer shows it: its first [`SHOWN_CHARS`] characters, and `…` if there were more.
pub(crate) fn clip(s: &str) -> Cow<'_, str> {
    match s.char_indices().nth(SHOWN_CHARS) {
        None => Cow::Borrowed(s),
        Some((end, _)) => Cow::Owned(format!("{}…", &s[..end])),
    }
}

/// A client's value as a log field: clipped, with control characters, quotes and backslashes
/// escaped (`%Logged(name)`).
pub(crate) struct Logged<'a>(pub(crate) &'a str);

impl fmt::Display for Logged<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", clip(self.0).escape_debug())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_values_are_clipped_and_log_fields_escaped() {
        assert_eq!(clip("smollm2"), "smollm2");
        let long = "é".repeat(SHOWN_CHARS + 10);
        assert_eq!(clip(&long), format!("{}…", "é".repeat(SHOWN_CHARS)));
        assert_eq!(clip(&"x".repeat(SHOWN_CHARS)), "x".repeat(SHOWN_CHARS));
        let forged = "zz\n2026-12-07T23:59:59Z ERROR forged";
        assert_eq!(Logged(forged).to_string(), "zz\\n2026-12-07T23:59:59Z ERROR forged");
        assert!(!Logged(forged).to_string().contains('\n'));
    }
}
