//! Lowercase hex, the text form of the binary values that travel in environment variables,
//! command lines and request fields (IPC handles, page keys, SGLang tickets).

/// `bytes` as lowercase hex.
pub fn encode(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(2 * bytes.len());
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
    out
}

/// The bytes of `text` (hex, either case); `None` when it is not an even run of hex digits.
pub fn decode(text: &str) -> Option<Vec<u8>> {
    if !text.is_ascii() || !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(&text[i..i + 2], 16).ok()).collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn round_trips_and_refuses_what_is_not_hex() {
        let bytes = [0u8, 1, 0x7f, 0x80, 0xab, 0xff];
        assert_eq!(super::encode(&bytes), "00017f80abff");
        assert_eq!(super::decode("00017F80abff").as_deref(), Some(&bytes[..]));
        assert_eq!(super::decode("abc"), None);
        assert_eq!(super::decode("zz"), None);
        assert_eq!(super::decode("é0"), None);
        assert_eq!(super::decode("").as_deref(), Some(&[][..]));
    }
}
