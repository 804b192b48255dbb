//! The `style` attribute of `<span>`: only declarations of safe,
//! URL-free properties with plain values survive (spec 003 §3.1.3).

use crate::scan::{decode_entities, find_byte};

/// Properties a span may style. None of them takes a URL.
const SAFE_PROPERTIES: &[&str] = &[
    "color",
    "background-color",
    "font-weight",
    "font-style",
    "font-size",
    "font-family",
    "font-variant",
    "font-stretch",
    "text-decoration",
    "text-decoration-line",
    "text-decoration-color",
    "text-decoration-style",
    "text-decoration-thickness",
    "text-emphasis",
    "text-emphasis-color",
    "text-emphasis-style",
    "text-transform",
    "text-shadow",
    "letter-spacing",
    "word-spacing",
    "line-height",
    "opacity",
    "vertical-align",
    "white-space",
];

/// CSS functions a value may call (colours only).
const SAFE_FUNCTIONS: &[&str] = &["rgb", "rgba", "hsl", "hsla"];

/// What to do with a style attribute.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StyleVerdict {
    /// Every declaration is safe and written plainly: keep the attribute
    /// byte for byte.
    Keep,
    /// Some declarations are safe: replace the attribute with these.
    Rewrite(String),
    /// Nothing safe: remove the attribute.
    Drop,
}

/// Judges a style attribute value as written (entities not decoded).
pub(crate) fn filter_style(raw: &str) -> StyleVerdict {
    let decoded = decode_entities(raw.as_bytes());
    let mut changed = decoded != raw || raw.contains(['\\', '<', '>']);
    let mut kept: Vec<String> = Vec::new();
    for decl in decoded.split(';') {
        if trim(decl).is_empty() {
            continue;
        }
        match safe_declaration(decl) {
            Some((prop, value)) => {
                kept.push(format!("{}: {}", prop.to_ascii_lowercase(), value.replace('"', "'")));
            }
            None => changed = true,
        }
    }
    if kept.is_empty() {
        StyleVerdict::Drop
    } else if !changed {
        StyleVerdict::Keep
    } else {
        StyleVerdict::Rewrite(kept.join("; "))
    }
}

/// Whether a raw style value, as it will be sent, is entirely safe (used by
/// the final safety net on the filtered output, and by the HTML filter to
/// let a span keep its style without the rewriter). It allocates nothing.
pub(crate) fn style_is_safe(raw: &str) -> bool {
    !raw.bytes().any(|b| matches!(b, b'&' | b'\\' | b'<' | b'>'))
        && raw.split(';').all(|d| trim(d).is_empty() || safe_declaration(d).is_some())
}

/// A declaration `prop: value` whose property is allowed and whose value is
/// plain: returns the property (trimmed, as written) and the trimmed value.
fn safe_declaration(decl: &str) -> Option<(&str, &str)> {
    let colon = find_byte(b':', decl.as_bytes())?;
    let prop = trim(&decl[..colon]);
    let value = trim(&decl[colon + 1..]);
    if !SAFE_PROPERTIES.iter().any(|p| p.eq_ignore_ascii_case(prop)) || !safe_value(prop, value) {
        return None;
    }
    Some((prop, value))
}

/// `str::trim`, with ASCII whitespace (all a declaration usually has
/// around it) stripped byte by byte; only ends that are not ASCII go to
/// the Unicode-aware trim.
fn trim(s: &str) -> &str {
    // The ASCII characters `char::is_whitespace` holds.
    let space = |c: &u8| matches!(c, b' ' | b'\t' | b'\n' | b'\x0b' | b'\x0c' | b'\r');
    let bytes = s.as_bytes();
    let start = bytes.iter().position(|c| !space(c)).unwrap_or(bytes.len());
    let end = bytes.iter().rposition(|c| !space(c)).map_or(start, |e| e + 1);
    // Both cuts are after or before an ASCII byte: char boundaries.
    let t = s.get(start..end).unwrap_or_default();
    let ascii_ends = t.as_bytes().first().is_none_or(u8::is_ascii) && t.as_bytes().last().is_none_or(u8::is_ascii);
    if ascii_ends { t } else { t.trim() }
}

/// Whether `value` holds a word no style value may hold (`url`,
/// `expression`, a script scheme, `behavior`, `binding`, a comment),
/// ignoring ASCII case: one pass, each position tried against the words
/// that begin with its letter.
fn has_banned_word(value: &[u8]) -> bool {
    let starts = |rest: &[u8], word: &[u8]| rest.get(..word.len()).is_some_and(|w| w.eq_ignore_ascii_case(word));
    (0..value.len()).any(|i| {
        let rest = &value[i..];
        match rest[0].to_ascii_lowercase() {
            b'e' => starts(rest, b"expression"),
            b'u' => starts(rest, b"url"),
            b'j' => starts(rest, b"javascript"),
            b'v' => starts(rest, b"vbscript"),
            b'b' => starts(rest, b"behavior") || starts(rest, b"binding"),
            b'/' => rest.get(1) == Some(&b'*'),
            _ => false,
        }
    })
}

/// Letters, digits, `#`, `%`, `.`, `,`, `-`, `+`, spaces, `!important`,
/// colour functions; quotes and non-ASCII letters in `font-family` only.
/// No `url(`, `expression(`, escapes, comments or `:`. ASCII case is
/// ignored throughout (compared in place: a value is judged once per styled
/// span, so it allocates nothing).
fn safe_value(prop: &str, value: &str) -> bool {
    if value.is_empty() || value.len() > 200 {
        return false;
    }
    let bytes = value.as_bytes();
    if has_banned_word(bytes) {
        return false;
    }
    let family = prop.eq_ignore_ascii_case("font-family");
    let mut in_function = false;
    for (i, c) in value.char_indices() {
        let ok = match c.to_ascii_lowercase() {
            'a'..='z' | '0'..='9' | ' ' | '#' | '%' | '.' | ',' | '-' | '+' => true,
            '\'' | '"' => family,
            '!' => bytes.get(i..i + 10).is_some_and(|w| w.eq_ignore_ascii_case(b"!important")),
            '(' => {
                let ident_start = value[..i]
                    .char_indices()
                    .rev()
                    .find(|(_, ch)| !ch.is_ascii_alphabetic())
                    .map_or(0, |(p, ch)| p + ch.len_utf8());
                let ident = &value[ident_start..i];
                let ok = !in_function && SAFE_FUNCTIONS.iter().any(|f| f.eq_ignore_ascii_case(ident));
                in_function = true;
                ok
            }
            ')' => {
                let ok = in_function;
                in_function = false;
                ok
            }
            c if family && c.is_alphanumeric() => true,
            _ => false,
        };
        if !ok {
            return false;
        }
    }
    // Balanced quotes in font-family.
    !in_function
        && bytes.iter().filter(|&&b| b == b'\'').count() % 2 == 0
        && bytes.iter().filter(|&&b| b == b'"').count() % 2 == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts() {
        use StyleVerdict::*;
        let table: &[(&str, StyleVerdict)] = &[
            ("color: red", Keep),
            ("color:red;", Keep),
            ("color: #ff0000; font-weight: bold", Keep),
            ("color: rgb(255, 0, 0)", Keep),
            ("font-family: 'Noto Serif', serif", Keep),
            ("font-family: 微软雅黑", Keep),
            ("font-family: 微(x)", Drop),
            ("color: 红(", Drop),
            ("text-decoration: underline !important", Keep),
            ("COLOR: Red", Keep),
            ("Color: RGB(1, 2, 3) !IMPORTANT", Keep),
            ("color: URL(x)", Drop),
            ("color: Expression(x)", Drop),
            ("color: red !importan", Drop),
            ("color: RGBA(1, 2, 3, .5)", Keep),
            ("color: calc(1)", Drop),
            ("font-family: \"A\" ; Color: Red", Keep),
            ("color: red; background: url(x.png)", Rewrite("color: red".into())),
            ("color: red; position: fixed", Rewrite("color: red".into())),
            ("color: &#114;ed", Rewrite("color: red".into())),
            ("width: expression(alert(1))", Drop),
            ("background-image: url(javascript:alert(1))", Drop),
            ("color: expression(alert(1))", Drop),
            ("color: red\\;x", Drop),
            ("color: r/**/ed", Drop),
            ("-moz-binding: url(x)", Drop),
            ("behavior: url(x.htc)", Drop),
            ("color: var(--x)", Drop),
            ("font-family: \"x", Drop),
            ("", Drop),
        ];
        for (style, want) in table {
            assert_eq!(&filter_style(style), want, "{style}");
        }
    }

    proptest::proptest! {
        #[test]
        fn trim_is_str_trim(s in "[ \t\n\x0b\x0c\r\u{85}\u{a0}\u{3000}\u{200b}a-c;:é]{0,12}") {
            proptest::prop_assert_eq!(trim(&s), s.trim());
        }
    }

    #[test]
    fn banned_words_are_found_in_any_case_anywhere() {
        for word in ["expression", "url", "javascript", "vbscript", "behavior", "binding", "/*"] {
            for (before, after) in [("", ""), ("x ", ""), ("", " y"), ("ab", "cd")] {
                let upper = format!("{before}{}{after}", word.to_ascii_uppercase());
                assert!(has_banned_word(upper.as_bytes()), "{upper}");
                let lower = format!("{before}{word}{after}");
                assert!(has_banned_word(lower.as_bytes()), "{lower}");
            }
            assert!(!has_banned_word(&word.as_bytes()[..word.len() - 1]), "{word}");
        }
    }

    #[test]
    fn net_check_agrees() {
        assert!(style_is_safe("color: red"));
        assert!(style_is_safe("color: red; font-weight: bold;"));
        assert!(!style_is_safe("color: &#114;ed"));
        assert!(!style_is_safe("background: url(x)"));
        assert!(!style_is_safe("x: y"));
    }
}
