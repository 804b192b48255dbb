//! ACTION blocks (spec 004): the XML between `<ACTION>` and `</ACTION>`,
//! read into a [`ToolCall`].
//!
//! This module owns the XML-to-JSON mapping of spec 004 §3.2: each child
//! element of ACTION is one tool call (its name is the tool id), each child
//! of a tool element one parameter. It must not look for the ACTION tags
//! themselves (the machine does).
//!
//! # Mapping
//!
//! | XML | JSON |
//! |---|---|
//! | `<p>text</p>` | `"text"` (entities decoded, trimmed) |
//! | `<p><![CDATA[ raw ]]></p>` | `" raw "` (verbatim; whitespace around the section dropped) |
//! | `<p><a>1</a><b>2</b></p>` | `{"a": "1", "b": "2"}` |
//! | `<p><f>1</f><f>2</f></p>` | `{"f": ["1", "2"]}` (repeated names) |
//! | `<p><item>1</item><item>2</item></p>` | `["1", "2"]` (`item` lists) |
//! | `<p/>`, `<p></p>` | `""` |
//!
//! Values stay strings: XML has no types. [`super::ToolCatalog`] converts
//! them to the types a tool's schema declares when it checks a call.
//!
//! # Why not quick-xml
//!
//! The block is re-read with this crate's own tokenizer ([`crate::scan`]),
//! the one the machine used to find the block: it already treats a `<` or
//! `&` that starts no markup as text (models write `a < b` and `A & B`
//! unescaped), decodes entities leniently, and handles CDATA and comments,
//! so the block is read exactly as it was delimited. quick-xml would reject
//! or need pre-repair of exactly the inputs models produce. What stays
//! strict is the element structure: a closing tag that does not match
//! (or closes nothing) is `Malformed XML in ACTION block` (spec 004 §3.3),
//! reported in the payload, never a panic. Elements still open when the
//! text ends (a block cut off mid-parameter) are closed there, with the
//! warning `unclosed_elements`, so a truncated block keeps what it wrote.

use super::{CallFormat, Findings, Lines, Step, ToolCall};
use crate::event::DiagnosticCode;
use crate::scan::{ScanLimits, Scanner, TagKind, Token, TokenSink, UnfinishedKind, decode_entities};
use serde_json::Value;

/// The observation text for an ACTION block that does not parse (spec 004
/// §3.3).
pub const MALFORMED: &str = "Malformed XML in ACTION block";

/// Deepest element nesting read; deeper is malformed.
pub const MAX_DEPTH: usize = 64;

/// One piece of markup, owned.
#[derive(Debug)]
enum Piece {
    Text { text: String },
    CData { text: String },
    Open { name: String, at: usize, attrs: bool, empty: bool },
    Close { name: String, at: usize },
}

#[derive(Debug, Default)]
struct Collect {
    pieces: Vec<Piece>,
    /// Markup cut off by the end of the text, dropped.
    cut: Option<String>,
}

impl Collect {
    fn text(&mut self, raw: &[u8]) {
        let text = decode_entities(raw);
        match self.pieces.last_mut() {
            Some(Piece::Text { text: t }) => t.push_str(&text),
            _ => self.pieces.push(Piece::Text { text }),
        }
    }
}

impl TokenSink for Collect {
    fn token(&mut self, token: Token<'_>) {
        match token {
            Token::Text { bytes, .. } => self.text(bytes),
            Token::Tag(tag) if !tag.padded => {
                let name = String::from_utf8_lossy(tag.name).into_owned();
                let at = tag.span.start;
                self.pieces.push(match tag.kind {
                    TagKind::Close => Piece::Close { name, at },
                    kind => Piece::Open {
                        name,
                        at,
                        attrs: tag.attrs().next().is_some(),
                        empty: kind == TagKind::SelfClosing,
                    },
                });
            }
            Token::Tag(tag) => self.text(tag.raw),
            Token::CData { body, .. } => {
                self.pieces.push(Piece::CData { text: String::from_utf8_lossy(body).into_owned() })
            }
            Token::Comment { .. } | Token::Notice(_) => {}
            Token::Unfinished { raw, kind, .. } => match kind {
                // A block cut off inside CDATA: the section so far.
                UnfinishedKind::Comment if raw.starts_with(b"<![CDATA[") => {
                    self.pieces.push(Piece::CData { text: String::from_utf8_lossy(&raw[9..]).into_owned() });
                }
                UnfinishedKind::OpenTagName
                | UnfinishedKind::OpenTag
                | UnfinishedKind::CloseTagName
                | UnfinishedKind::CloseTag
                | UnfinishedKind::Comment => {
                    self.cut = Some(String::from_utf8_lossy(raw).into_owned());
                }
                UnfinishedKind::Lt | UnfinishedKind::Special => self.text(raw),
            },
            Token::Special { raw, .. } => self.text(raw),
        }
    }
}

/// An element of the block.
#[derive(Debug, Default)]
struct Node {
    name: String,
    at: usize,
    children: Vec<Node>,
    /// Text and CDATA pieces in order; `true` marks CDATA.
    text: Vec<(String, bool)>,
}

impl Node {
    /// The element's JSON value (spec 004 §3.2.3).
    fn value(&self, f: &mut Findings, path: &NodePath<'_>) -> Value {
        if self.children.is_empty() {
            return Value::String(self.text_value());
        }
        let stray: String = self.text_value();
        if !stray.is_empty() {
            f.warn(
                DiagnosticCode::MixedContent,
                format!("{path} holds both text and elements; the text is kept under \"#text\""),
            );
        }
        let all_items = self.children.iter().all(|c| c.name.eq_ignore_ascii_case("item"));
        if all_items {
            return Value::Array(
                self.children.iter().enumerate().map(|(i, c)| c.value(f, &NodePath::Item(path, i))).collect(),
            );
        }
        let mut map = object_of(&self.children, f, path);
        if !stray.is_empty() {
            map.insert("#text".into(), Value::String(stray));
        }
        Value::Object(map)
    }

    /// Text pieces joined: plain text is trimmed; CDATA is verbatim and the
    /// whitespace-only text around it is dropped.
    fn text_value(&self) -> String {
        if !self.text.iter().any(|(_, cdata)| *cdata) {
            let joined: String = self.text.iter().map(|(t, _)| t.as_str()).collect();
            return joined.trim().to_string();
        }
        let first = self.text.iter().position(|(t, cdata)| *cdata || !t.trim().is_empty()).unwrap_or(0);
        let last = self.text.iter().rposition(|(t, cdata)| *cdata || !t.trim().is_empty()).map_or(0, |i| i + 1);
        let mut out = String::new();
        for (i, (t, cdata)) in self.text.iter().enumerate().take(last).skip(first) {
            if *cdata {
                out.push_str(t);
            } else if i == first {
                out.push_str(t.trim_start());
            } else if i + 1 == last {
                out.push_str(t.trim_end());
            } else {
                out.push_str(t);
            }
        }
        out
    }
}

/// Where a node is in its tool element (`Write.lines[2].text`), for the
/// findings that name it: written out only when one does, not for every
/// node read.
#[derive(Debug, Clone, Copy)]
enum NodePath<'a> {
    /// The tool element.
    Root(&'a str),
    /// A named child.
    Child(&'a NodePath<'a>, &'a str),
    /// The `i`-th `<item>` of a list.
    Item(&'a NodePath<'a>, usize),
}

impl std::fmt::Display for NodePath<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NodePath::Root(name) => f.write_str(name),
            NodePath::Child(parent, name) => write!(f, "{parent}.{name}"),
            NodePath::Item(parent, i) => write!(f, "{parent}[{i}]"),
        }
    }
}

/// Child elements as an object: repeated names become arrays.
fn object_of(children: &[Node], f: &mut Findings, path: &NodePath<'_>) -> serde_json::Map<String, Value> {
    let mut counts: std::collections::BTreeMap<&str, usize> = std::collections::BTreeMap::new();
    for c in children {
        *counts.entry(c.name.as_str()).or_default() += 1;
    }
    let mut map = serde_json::Map::new();
    for c in children {
        let v = c.value(f, &NodePath::Child(path, &c.name));
        if counts.get(c.name.as_str()).copied().unwrap_or(0) > 1 {
            if let Value::Array(list) = map.entry(c.name.clone()).or_insert_with(|| Value::Array(Vec::new())) {
                list.push(v);
            }
        } else {
            map.insert(c.name.clone(), v);
        }
    }
    map
}

/// Builds the element tree; `Err` says why the XML is malformed.
fn tree(text: &str, pieces: Vec<Piece>, f: &mut Findings) -> Result<Node, String> {
    let lines = Lines::new(text);
    let line_of = |_: &str, at: usize| lines.line(at);
    let mut stack: Vec<Node> = vec![Node::default()];
    for piece in pieces {
        match piece {
            Piece::Text { text: t } => {
                if let Some(top) = stack.last_mut() {
                    top.text.push((t, false));
                }
            }
            Piece::CData { text: t } => {
                if let Some(top) = stack.last_mut() {
                    top.text.push((t, true));
                }
            }
            Piece::Open { name, at, attrs, empty } => {
                if attrs {
                    f.warn(
                        DiagnosticCode::AttributesIgnored,
                        format!(
                            "line {}: the attributes of <{name}> were ignored (parameters are child elements)",
                            line_of(text, at)
                        ),
                    );
                }
                if stack.len() > MAX_DEPTH {
                    return Err(format!("elements nest deeper than {MAX_DEPTH} levels (line {})", line_of(text, at)));
                }
                let node = Node { name, at, ..Node::default() };
                if empty {
                    if let Some(top) = stack.last_mut() {
                        top.children.push(node);
                    }
                } else {
                    stack.push(node);
                }
            }
            Piece::Close { name, at } => {
                let line = line_of(text, at);
                if stack.len() < 2 {
                    return Err(format!("closing tag </{name}> at line {line} has no opening tag"));
                }
                let open = stack.last().map(|n| n.name.clone()).unwrap_or_default();
                if open != name {
                    if open.eq_ignore_ascii_case(&name) {
                        f.warn(
                            DiagnosticCode::CloseTagCaseMismatch,
                            format!("line {line}: </{name}> closes <{open}> (different case)"),
                        );
                    } else {
                        return Err(format!("closing tag </{name}> at line {line} does not match the open <{open}>"));
                    }
                }
                let Some(done) = stack.pop() else { break };
                if let Some(parent) = stack.last_mut() {
                    parent.children.push(done);
                }
            }
        }
    }
    if stack.len() > 1 {
        // The text ended inside elements (a block cut off mid-parameter):
        // close them there and keep what was written.
        let open: Vec<String> =
            stack.iter().skip(1).map(|n| format!("<{}> (line {})", n.name, line_of(text, n.at))).collect();
        f.warn(
            DiagnosticCode::UnclosedElements,
            format!("{} never closed; closed at the end of the block", open.join(", ")),
        );
        while stack.len() > 1 {
            let Some(done) = stack.pop() else { break };
            if let Some(parent) = stack.last_mut() {
                parent.children.push(done);
            }
        }
    }
    stack.pop().ok_or_else(|| "empty".to_string())
}

/// Whether top-level text is only a code fence (```` ```xml ````) or
/// whitespace.
fn is_fence_or_space(text: &str) -> bool {
    text.lines().all(|l| {
        let l = l.trim();
        l.is_empty() || (l.starts_with("```") && !l[3..].contains('`'))
    })
}

/// Reads an ACTION block's inner text into a call.
///
/// ```
/// use spindle::calls::action::parse_action;
///
/// let (call, _) = parse_action("<read_file><args><file><path>a.ts</path></file><file><path>b.ts</path></file></args></read_file>");
/// assert_eq!(call.steps[0].tool_id, "read_file");
/// assert_eq!(call.steps[0].params["args"]["file"][1]["path"], "b.ts");
/// ```
pub fn parse_action(text: &str) -> (ToolCall, Findings) {
    let mut f = Findings::default();
    let mut call = ToolCall::new(CallFormat::Action);
    let limits = ScanLimits { max_comment_len: text.len().saturating_add(16), ..ScanLimits::default() };
    let mut scanner = Scanner::new(limits);
    let mut sink = Collect::default();
    scanner.feed(text.as_bytes(), &mut sink);
    scanner.finish(&mut sink);
    if let Some(cut) = sink.cut.take() {
        f.warn(DiagnosticCode::TruncatedMarkup, format!("the block ends inside a tag or comment; {cut:?} was dropped"));
    }
    let root = match tree(text, sink.pieces, &mut f) {
        Ok(root) => root,
        Err(detail) => {
            malformed(&mut call, &mut f, &detail);
            return (call, f);
        }
    };
    let stray: String = root.text.iter().map(|(t, _)| t.as_str()).collect();
    if !is_fence_or_space(&stray) {
        f.warn(
            DiagnosticCode::StrayText,
            format!("text inside ACTION outside any tool element was ignored: {:?}", stray.trim()),
        );
    }
    if root.children.is_empty() {
        malformed(&mut call, &mut f, "the block holds no tool element");
        return (call, f);
    }
    if root.children.len() > 1 {
        f.warn(
            DiagnosticCode::MultipleTools,
            format!(
                "the ACTION block holds {} tool elements; spec 004 suggests one. They run in order",
                root.children.len()
            ),
        );
    }
    for tool in &root.children {
        let mut step = Step::new(tool.name.clone());
        let text = tool.text_value();
        if !text.is_empty() {
            f.warn(
                DiagnosticCode::ToolTextIgnored,
                format!("text directly inside <{}> (not in a parameter element) was ignored: {text:?}", tool.name),
            );
        }
        step.params = object_of(&tool.children, &mut f, &NodePath::Root(&tool.name));
        call.steps.push(step);
    }
    (call, f)
}

fn malformed(call: &mut ToolCall, f: &mut Findings, detail: &str) {
    f.error(DiagnosticCode::MalformedXml, format!("{MALFORMED}: {detail}"));
    call.error = Some(format!("{MALFORMED}: {detail}"));
    call.observation = Some(format!("Observation: Error - {MALFORMED}: {detail}"));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cdata_is_verbatim_and_text_is_decoded() {
        let (call, f) =
            parse_action("<T><a> x &amp; y &lt; z </a><b>\n  <![CDATA[ <raw> & ]] ]]>\n</b><c>a < b && c</c></T>");
        assert!(f.warnings.is_empty(), "{:?}", f.warnings);
        let p = &call.steps[0].params;
        assert_eq!(p["a"], "x & y < z");
        assert_eq!(p["b"], " <raw> & ]] ");
        assert_eq!(p["c"], "a < b && c");
    }

    #[test]
    fn unclosed_elements_at_the_end_are_closed() {
        let (call, f) = parse_action("<T><a>1</a><b><c>2");
        assert!(call.error.is_none());
        assert_eq!(call.steps[0].params["a"], "1");
        assert_eq!(call.steps[0].params["b"]["c"], "2");
        assert_eq!(f.warnings, ["unclosed_elements"]);
        let (call, f) = parse_action("<T><a><![CDATA[x < y");
        assert_eq!(call.steps[0].params["a"], "x < y");
        assert_eq!(f.warnings, ["unclosed_elements"]);
        let (call, f) = parse_action("<T><a>1</a><b");
        assert_eq!(serde_json::Value::Object(call.steps[0].params.clone()), serde_json::json!({"a": "1"}));
        assert_eq!(f.warnings, ["truncated_markup", "unclosed_elements"]);
    }

    #[test]
    fn structure_errors_are_malformed() {
        for bad in ["<T><a>1</b></T>", "<T></a></T>", "</T>", "", "just text"] {
            let (call, _) = parse_action(bad);
            let err = call.error.unwrap_or_default();
            assert!(err.starts_with(MALFORMED), "{bad:?} gave {err:?}");
            assert!(call.steps.is_empty());
        }
    }
}
