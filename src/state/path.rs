//! State paths: `a.b[0].c`, any Unicode in keys, `["k.with.dots"]` for keys
//! that hold dots or brackets.

use std::borrow::Cow;
use std::fmt;

/// One step of a [`Path`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Segment {
    /// An object key.
    Key(String),
    /// An array index; negative counts from the end (`[-1]` is the last).
    Index(i64),
}

/// A parsed state path.
///
/// ```
/// use spindle::state::{Path, Segment};
///
/// let p = Path::parse("纯田真奈.物品[0].名称").unwrap();
/// assert_eq!(p.segments(), [
///     Segment::Key("纯田真奈".into()),
///     Segment::Key("物品".into()),
///     Segment::Index(0),
///     Segment::Key("名称".into()),
/// ]);
/// assert_eq!(Path::parse("a[\"x.y\"]").unwrap().segments(), [Segment::Key("a".into()), Segment::Key("x.y".into())]);
/// assert!(Path::parse("a..b").is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Path {
    segments: Vec<Segment>,
}

/// Why a path does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid path {path:?}: {message} at byte {at}")]
pub struct PathError {
    /// The path as given.
    pub path: String,
    /// What is wrong.
    pub message: String,
    /// Byte offset in the path.
    pub at: usize,
}

impl Path {
    /// The root (no segments).
    pub fn root() -> Path {
        Path::default()
    }

    /// Parses a dotted path. The empty string is the root.
    ///
    /// # Errors
    ///
    /// [`PathError`] for an empty key (`a..b`, `a.`, `.a`), an unclosed or
    /// empty `[`, or an index that is not an integer.
    pub fn parse(text: &str) -> Result<Path, PathError> {
        let mut segments = Vec::new();
        read(text, |step| {
            segments.push(match step {
                Step::Key(key) => Segment::Key(key.into_owned()),
                Step::Index(i) => Segment::Index(i),
            })
        })?;
        Ok(Path { segments })
    }

    /// Whether `text` parses, as [`Path::parse`] decides, without building
    /// the path (no allocation for an unquoted path).
    ///
    /// # Errors
    ///
    /// As [`Path::parse`].
    pub(crate) fn check(text: &str) -> Result<(), PathError> {
        read(text, |_| {})
    }

    /// The steps, from the root.
    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// Whether this is the root.
    pub fn is_root(&self) -> bool {
        self.segments.is_empty()
    }

    /// The path of the first `n` segments, written out.
    pub(crate) fn prefix_string(&self, n: usize) -> String {
        Path { segments: self.segments.iter().take(n).cloned().collect() }.to_string()
    }
}

/// One step read from a path: a key as it lies in the text (unquoted) or
/// as unescaped (quoted), or an index.
enum Step<'a> {
    Key(Cow<'a, str>),
    Index(i64),
}

/// Reads the steps of a path in order, handing each to `each` (the parser
/// of [`Path::parse`] and [`Path::check`]).
fn read(text: &str, mut each: impl FnMut(Step<'_>)) -> Result<(), PathError> {
    let err = |message: &str, at: usize| PathError { path: text.to_string(), message: message.to_string(), at };
    let bytes = text.as_bytes();
    let mut i = 0;
    if text.is_empty() {
        return Ok(());
    }
    // Whether a key must come next (at the start, or after a dot).
    let mut want_key = bytes.first() != Some(&b'[');
    while i < bytes.len() {
        if want_key {
            let start = i;
            while i < bytes.len() && !matches!(bytes[i], b'.' | b'[' | b']') {
                i += 1;
            }
            if i == start {
                return Err(err("empty key", start));
            }
            each(Step::Key(Cow::Borrowed(&text[start..i])));
            want_key = false;
            continue;
        }
        match bytes[i] {
            b'.' => {
                i += 1;
                want_key = true;
                if i == bytes.len() {
                    return Err(err("empty key", i));
                }
            }
            b'[' => {
                let open = i;
                i += 1;
                let (segment, next) = match bytes.get(i) {
                    Some(&q @ (b'"' | b'\'')) => {
                        let mut key = String::new();
                        let mut j = i + 1;
                        let mut closed = false;
                        while j < bytes.len() {
                            let c = bytes[j];
                            if c == b'\\' && j + 1 < bytes.len() {
                                let ch_len = char_len(&text[j + 1..]);
                                key.push_str(&text[j + 1..j + 1 + ch_len]);
                                j += 1 + ch_len;
                                continue;
                            }
                            if c == q {
                                closed = true;
                                j += 1;
                                break;
                            }
                            let ch_len = char_len(&text[j..]);
                            key.push_str(&text[j..j + ch_len]);
                            j += ch_len;
                        }
                        if !closed {
                            return Err(err("unclosed quoted key", open));
                        }
                        (Step::Key(Cow::Owned(key)), j)
                    }
                    _ => {
                        let start = i;
                        let mut j = i;
                        while j < bytes.len() && bytes[j] != b']' {
                            j += 1;
                        }
                        let inner = text[start..j].trim();
                        let index = inner.parse::<i64>().map_err(|_| err("an index must be an integer", start))?;
                        (Step::Index(index), j)
                    }
                };
                if bytes.get(next) != Some(&b']') {
                    return Err(err("unclosed '['", open));
                }
                each(segment);
                i = next + 1;
            }
            _ => return Err(err("expected '.' or '['", i)),
        }
    }
    Ok(())
}

fn char_len(s: &str) -> usize {
    s.chars().next().map_or(1, char::len_utf8)
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (n, seg) in self.segments.iter().enumerate() {
            match seg {
                Segment::Key(k) if k.contains(['.', '[', ']']) || k.is_empty() => {
                    write!(f, "[\"{}\"]", k.replace('\\', "\\\\").replace('"', "\\\""))?
                }
                Segment::Key(k) => {
                    if n > 0 {
                        f.write_str(".")?;
                    }
                    f.write_str(k)?;
                }
                Segment::Index(i) => write!(f, "[{i}]")?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(p: &str) -> Vec<Segment> {
        Path::parse(p).unwrap_or_else(|e| panic!("{e}")).segments().to_vec()
    }

    #[test]
    fn parses_and_prints_back() {
        use Segment::{Index as I, Key as K};
        let table: &[(&str, Vec<Segment>)] = &[
            ("a", vec![K("a".into())]),
            ("a.b.c", vec![K("a".into()), K("b".into()), K("c".into())]),
            ("纯田真奈.好感度", vec![K("纯田真奈".into()), K("好感度".into())]),
            ("items[2].name", vec![K("items".into()), I(2), K("name".into())]),
            ("m[0][1]", vec![K("m".into()), I(0), I(1)]),
            ("list[-1]", vec![K("list".into()), I(-1)]),
            ("[3]", vec![I(3)]),
            ("a['x.y'].z", vec![K("a".into()), K("x.y".into()), K("z".into())]),
            ("a[\"q\\\"uote\"]", vec![K("a".into()), K("q\"uote".into())]),
            ("key with space.x", vec![K("key with space".into()), K("x".into())]),
        ];
        for (text, want) in table {
            assert_eq!(&keys(text), want, "{text}");
            let printed = Path::parse(text).map(|p| p.to_string()).unwrap_or_default();
            assert_eq!(&keys(&printed), want, "round trip of {text} via {printed}");
        }
    }

    proptest::proptest! {
        /// The check without building decides as the parser does, with the
        /// same error.
        #[test]
        fn check_decides_as_parse_does(text in "[a.\\[\\]'\"\\\\0-9 -]{0,12}") {
            proptest::prop_assert_eq!(Path::check(&text), Path::parse(&text).map(|_| ()));
        }
    }

    #[test]
    fn rejects_bad_paths() {
        for bad in ["a..b", "a.", ".a", "a[", "a[x]", "a[1", "a['x]", "a]b", "a[1]b"] {
            let e = Path::parse(bad).expect_err(bad);
            assert_eq!(Path::check(bad), Err(e.clone()), "{bad}");
            assert!(e.at <= bad.len(), "{e}");
        }
    }
}
