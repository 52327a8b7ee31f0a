//! Terminal columns of text, for the tables the commands print: a Chinese, Japanese or Korean
//! header takes two columns a character, so padding by character count would skew every
//! column after it.

/// Whether a terminal shows `c` two columns wide: the East Asian wide and fullwidth blocks
/// (Hangul, kana, CJK ideographs and punctuation, fullwidth forms).
fn wide(c: char) -> bool {
    matches!(
        u32::from(c),
        0x1100..=0x115F
            | 0x2E80..=0x303E
            | 0x3041..=0x33FF
            | 0x3400..=0x4DBF
            | 0x4E00..=0x9FFF
            | 0xA000..=0xA4CF
            | 0xAC00..=0xD7A3
            | 0xF900..=0xFAFF
            | 0xFE30..=0xFE4F
            | 0xFF00..=0xFF60
            | 0xFFE0..=0xFFE6
            | 0x20000..=0x3FFFD
    )
}

/// The columns `text` takes in a terminal.
pub(crate) fn width(text: &str) -> usize {
    text.chars().map(|c| if wide(c) { 2 } else { 1 }).sum()
}

/// `text` padded with spaces to `columns`: after it (left-aligned) or before it.
pub(crate) fn pad(text: &str, columns: usize, left: bool) -> String {
    let fill = " ".repeat(columns.saturating_sub(width(text)));
    if left { format!("{text}{fill}") } else { format!("{fill}{text}") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wide_characters_take_two_columns() {
        assert_eq!(width("REPLICAS"), 8);
        assert_eq!(width("レプリカ"), 8);
        assert_eq!(width("副本"), 4);
        assert_eq!(width("레플리카"), 8);
        assert_eq!(width("首词元 P50（毫秒）"), 18);
        assert_eq!(width("РЕПЛИКИ"), 7);
        assert_eq!(width("RÉPLICAS"), 8);
        assert_eq!(pad("名前", 6, true), "名前  ");
        assert_eq!(pad("7", 3, false), "  7");
        assert_eq!(pad("longer", 2, true), "longer");
    }
}
