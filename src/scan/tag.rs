//! Reading a tag the candidate machine has already accepted: its name, its
//! kind, and its attributes (parsed lazily, only for tags someone cares
//! about). Every function here works on one finished tag of bounded length.

use super::{Span, is_attr_name_char, is_name_char, is_space};

/// Whether a tag opens, closes, or is self-closing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TagKind {
    /// `<name ...>`
    Open,
    /// `</name>`
    Close,
    /// `<name ... />`
    SelfClosing,
}

/// A complete tag as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TagToken<'a> {
    /// Open, close or self-closing.
    pub kind: TagKind,
    /// The name as written (original case).
    pub name: &'a [u8],
    /// The whole tag as written, brackets included.
    pub raw: &'a [u8],
    /// Where the tag is in the input.
    pub span: Span,
    /// Whether whitespace appears right inside the brackets (`< content >`,
    /// `</ content>`), which only registry tags are allowed.
    pub padded: bool,
    /// Index in `raw` just past the name, where attributes start.
    attrs_at: usize,
}

impl<'a> TagToken<'a> {
    /// A tag with nothing but its name between the brackets (`<name>`,
    /// `</name>`, `<name/>`), the name at `name` in `raw`: what
    /// [`TagToken::from_raw`] reads from it, without reading it again.
    pub(super) fn simple(kind: TagKind, raw: &'a [u8], span: Span, name: std::ops::Range<usize>) -> TagToken<'a> {
        let attrs_at = name.end;
        TagToken { kind, name: raw.get(name).unwrap_or_default(), raw, span, padded: false, attrs_at }
    }

    pub(super) fn from_raw(kind: TagKind, raw: &'a [u8], span: Span) -> TagToken<'a> {
        // raw is `<`, optional spaces, optional `/`, optional spaces, name...
        let mut i = 1;
        let mut padded = false;
        while i < raw.len() && is_space(raw[i]) {
            i += 1;
            padded = true;
        }
        if kind == TagKind::Close {
            i += 1; // the `/`
            while i < raw.len() && is_space(raw[i]) {
                i += 1;
                padded = true;
            }
        }
        let start = i;
        while i < raw.len() && is_name_char(raw[i]) {
            i += 1;
        }
        let name = &raw[start..i];
        if kind == TagKind::Close && raw.len() >= 2 && is_space(raw[raw.len() - 2]) {
            padded = true;
        }
        TagToken { kind, name, raw, span, padded, attrs_at: i }
    }

    /// The attributes, in the order written.
    pub fn attrs(&self) -> Attrs<'a> {
        // Everything between the name and the closing `>`; a self-closing
        // `/` is skipped by the iterator.
        let end = self.raw.len().saturating_sub(1);
        Attrs { rest: &self.raw[self.attrs_at.min(end)..end], self_closing: self.kind == TagKind::SelfClosing }
    }

    /// Whether the tag is written exactly as `<name>`/`</name>` with nothing
    /// else inside the brackets.
    pub fn is_bare(&self) -> bool {
        let extra = match self.kind {
            TagKind::Open => 2,
            TagKind::Close => 3,
            TagKind::SelfClosing => 3,
        };
        self.raw.len() == self.name.len() + extra
    }
}

/// One attribute: `name="value"`, `name='value'`, `name=value` or a bare
/// `name` (whose value is empty).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attr<'a> {
    /// The attribute name as written.
    pub name: &'a [u8],
    /// The value without quotes, entities not decoded.
    pub value: &'a [u8],
}

/// Iterator over a tag's attributes.
#[derive(Debug, Clone)]
pub struct Attrs<'a> {
    rest: &'a [u8],
    self_closing: bool,
}

impl<'a> Iterator for Attrs<'a> {
    type Item = Attr<'a>;

    fn next(&mut self) -> Option<Attr<'a>> {
        let s = self.rest;
        let mut i = 0;
        while i < s.len() && (is_space(s[i]) || s[i] == b'/') {
            i += 1;
        }
        let start = i;
        while i < s.len() && is_attr_name_char(s[i]) {
            i += 1;
        }
        if start == i {
            self.rest = &[];
            return None;
        }
        let name = &s[start..i];
        let mut j = i;
        while j < s.len() && is_space(s[j]) {
            j += 1;
        }
        if j >= s.len() || s[j] != b'=' {
            self.rest = &s[i..];
            return Some(Attr { name, value: &[] });
        }
        j += 1;
        while j < s.len() && is_space(s[j]) {
            j += 1;
        }
        let (value, next) = match s.get(j) {
            Some(&q @ (b'"' | b'\'')) => {
                let body = &s[j + 1..];
                match memchr::memchr(q, body) {
                    Some(end) => (&body[..end], j + 1 + end + 1),
                    None => (body, s.len()),
                }
            }
            Some(_) => {
                let end = s[j..].iter().position(|&b| is_space(b)).map_or(s.len(), |e| j + e);
                let mut value = &s[j..end];
                // `<media src=a.png/>`: the `/` belongs to the tag, not the value.
                if self.self_closing && end == s.len() {
                    value = value.strip_suffix(b"/").unwrap_or(value);
                }
                (value, end)
            }
            None => (&s[j..j], j),
        };
        self.rest = &s[next..];
        Some(Attr { name, value })
    }
}

/// Decodes the XML/HTML character references `&lt; &gt; &amp; &quot;
/// &apos; &nbsp;` and numeric `&#NN;` / `&#xHH;`; anything else (including a
/// bare `&`) is kept as written. Invalid UTF-8 becomes U+FFFD.
///
/// ```
/// assert_eq!(spindle::scan::decode_entities(b"a &lt; b &amp;&#x4e2d; &bogus;"), "a < b &\u{4e2d} &bogus;");
/// ```
pub fn decode_entities(raw: &[u8]) -> String {
    if super::find_byte(b'&', raw).is_none() {
        return super::owned_text(raw);
    }
    let text = String::from_utf8_lossy(raw);
    let mut out = String::with_capacity(text.len());
    let mut rest: &str = &text;
    while let Some(amp) = rest.find('&') {
        out.push_str(&rest[..amp]);
        let after = &rest[amp + 1..];
        let decoded = after.find(';').filter(|&semi| semi <= 10).and_then(|semi| {
            let name = &after[..semi];
            let ch = match name {
                "lt" => Some('<'),
                "gt" => Some('>'),
                "amp" => Some('&'),
                "quot" => Some('"'),
                "apos" => Some('\''),
                "nbsp" => Some('\u{a0}'),
                _ => {
                    let num = name.strip_prefix('#')?;
                    let code = match num.strip_prefix(['x', 'X']) {
                        Some(hex) => u32::from_str_radix(hex, 16).ok()?,
                        None => num.parse::<u32>().ok()?,
                    };
                    char::from_u32(code)
                }
            }?;
            Some((ch, semi))
        });
        match decoded {
            Some((ch, semi)) => {
                out.push(ch);
                rest = &after[semi + 1..];
            }
            None => {
                out.push('&');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}
