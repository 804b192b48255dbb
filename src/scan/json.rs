//! Where a JSON text has got to with respect to its strings: the one fact
//! both the state machine (is this `<` inside a string of a JSON body?) and
//! the tool-call argument stream (is this `}` the end of the value?) need.
//!
//! This module owns that three-state tracker and nothing else: nesting,
//! values and leniency belong to its users. Hand-written: a JSON reader
//! would read the values too, and the text may be lenient JSON that no
//! strict reader follows to its end.

/// Where a JSON text is: between values, inside a `"..."` string, or just
/// after a backslash inside one. Only `"` and `\` move it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum JsonString {
    /// Between values (or not JSON yet).
    #[default]
    Out,
    /// Inside a `"..."` string.
    In,
    /// Inside a string, just after a backslash.
    Escape,
}

impl JsonString {
    /// The state after one more byte.
    #[inline]
    pub(crate) fn step(self, b: u8) -> JsonString {
        match (self, b) {
            (JsonString::Out, b'"') => JsonString::In,
            (JsonString::Out, _) => JsonString::Out,
            (JsonString::In, b'"') => JsonString::Out,
            (JsonString::In, b'\\') => JsonString::Escape,
            (JsonString::In, _) => JsonString::In,
            (JsonString::Escape, _) => JsonString::In,
        }
    }

    /// How many bytes of `bytes` leave the state unchanged while inside a
    /// string (none outside one): up to the next `"` or `\`, found with
    /// `memchr`, so that a long string costs one search.
    #[inline]
    pub(crate) fn unchanged_run(self, bytes: &[u8]) -> usize {
        match self {
            JsonString::In => memchr::memchr2(b'"', b'\\', bytes).unwrap_or(bytes.len()),
            JsonString::Out | JsonString::Escape => 0,
        }
    }

    /// The state after `bytes`, skipping with `memchr` to the bytes that
    /// matter.
    pub(crate) fn after(mut self, bytes: &[u8]) -> JsonString {
        let mut rest = bytes;
        loop {
            match self {
                JsonString::Out => match memchr::memchr(b'"', rest) {
                    Some(i) => {
                        self = JsonString::In;
                        rest = &rest[i + 1..];
                    }
                    None => return self,
                },
                JsonString::In => match memchr::memchr2(b'"', b'\\', rest) {
                    Some(i) => {
                        self = if rest[i] == b'"' { JsonString::Out } else { JsonString::Escape };
                        rest = &rest[i + 1..];
                    }
                    None => return self,
                },
                JsonString::Escape => match rest.split_first() {
                    Some((_, tail)) => {
                        self = JsonString::In;
                        rest = tail;
                    }
                    None => return self,
                },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::JsonString;

    #[test]
    fn after_agrees_with_stepping_byte_by_byte_at_every_split() {
        let text = br#"{"a": "x \"<think>\" \\", "b": ["\\\"", 1], "c": "open"#;
        let stepped = text.iter().fold(JsonString::Out, |s, &b| s.step(b));
        assert_eq!(stepped, JsonString::In);
        for cut in 0..=text.len() {
            let (head, tail) = text.split_at(cut);
            let by_bytes = head.iter().fold(JsonString::Out, |s, &b| s.step(b));
            assert_eq!(JsonString::Out.after(head), by_bytes, "cut at {cut}");
            assert_eq!(JsonString::Out.after(head).after(tail), stepped, "cut at {cut}");
        }
    }

    #[test]
    fn an_unchanged_run_stops_at_a_quote_or_backslash_inside_a_string_only() {
        assert_eq!(JsonString::In.unchanged_run(b"abc\\\"d"), 3);
        assert_eq!(JsonString::In.unchanged_run(b"abc"), 3);
        assert_eq!(JsonString::Out.unchanged_run(b"abc"), 0);
        assert_eq!(JsonString::Escape.unchanged_run(b"abc"), 0);
    }
}
