//! A forgiving child-tag tree for structured bodies (status_bar, choice,
//! custom tags): `<mood>anxious</mood><hp max="9">5</hp>` into nodes.
//!
//! Tokens come from [`crate::scan::Scanner`] (the same tag grammar as the
//! rest of the parser); this module only builds the tree. Unclosed tags are
//! closed at the end or by the close of an enclosing tag, stray closes are
//! dropped, comments are skipped, and entities in text and attributes are
//! decoded.

use crate::scan::{ScanLimits, Scanner, TagKind, Token, TokenSink, decode_entities, owned_text};

/// A node of the tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Node {
    /// Text (entities decoded), never empty.
    Text(String),
    /// A child tag.
    Element(ElementNode),
}

/// A child tag and what it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ElementNode {
    /// The name as written.
    pub(crate) name: String,
    /// Attributes in the order written (entities decoded).
    pub(crate) attrs: Vec<(String, String)>,
    /// Children in order.
    pub(crate) children: Vec<Node>,
}

impl ElementNode {
    /// All text below this node, joined.
    pub(crate) fn text_content(&self) -> String {
        let mut out = String::new();
        collect_text(&self.children, &mut out);
        out
    }

    /// All text below this node, joined and trimmed (one allocation for
    /// the common leaf: a single text child).
    pub(crate) fn trimmed_text(&self) -> String {
        match self.children.as_slice() {
            [] => String::new(),
            [Node::Text(t)] => t.trim().to_string(),
            _ => self.text_content().trim().to_string(),
        }
    }

    /// [`ElementNode::trimmed_text`], taking the node: a leaf whose text
    /// needs no trimming gives its string up without a copy.
    pub(crate) fn into_trimmed_text(mut self) -> String {
        match self.children.as_mut_slice() {
            [Node::Text(t)] if t.trim().len() == t.len() => std::mem::take(t),
            _ => self.trimmed_text(),
        }
    }

    /// Whether any child is an element.
    pub(crate) fn has_element_children(&self) -> bool {
        self.children.iter().any(|c| matches!(c, Node::Element(_)))
    }

    /// The value of an attribute (name matched case-insensitively).
    pub(crate) fn attr(&self, name: &str) -> Option<&str> {
        self.attrs.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

/// All text in `nodes`, joined.
pub(crate) fn collect_text(nodes: &[Node], out: &mut String) {
    for n in nodes {
        match n {
            Node::Text(t) => out.push_str(t),
            Node::Element(e) => collect_text(&e.children, out),
        }
    }
}

/// HTML elements that never have content.
const VOID: &[&str] =
    &["br", "hr", "img", "input", "meta", "link", "wbr", "area", "base", "col", "embed", "source", "track"];

/// How deep a tree goes: tags nested deeper are kept as text. Turning the
/// tree into JSON (and dropping it) recurses once per level; a model that
/// nests a status bar ten thousand deep must not overflow the stack. Real
/// bodies nest a handful of levels.
pub(crate) const MAX_DEPTH: usize = 64;

/// A parsed structured body.
#[derive(Debug, Default)]
pub(crate) struct Tree {
    /// The top-level nodes.
    pub(crate) nodes: Vec<Node>,
    /// Tags nested past [`MAX_DEPTH`], kept as text.
    pub(crate) too_deep: usize,
}

/// Whether a tag name is one of [`VOID`] (any case).
fn is_void(name: &[u8]) -> bool {
    VOID.iter().any(|v| v.as_bytes().eq_ignore_ascii_case(name))
}

/// Parses the children of a structured body.
pub(crate) fn parse(text: &str) -> Tree {
    let mut builder = Builder::default();
    let mut scanner = Scanner::new(ScanLimits::default());
    scanner.feed(text.as_bytes(), &mut builder);
    scanner.finish(&mut builder);
    builder.flush_text();
    while builder.stack.len() > 1 {
        builder.pop();
    }
    let nodes = builder.stack.pop().map(|root| root.children).unwrap_or_default();
    Tree { nodes, too_deep: builder.too_deep }
}

#[derive(Debug)]
struct Builder {
    /// Open elements; the first is a synthetic root.
    stack: Vec<ElementNode>,
    /// Raw text not yet decoded (entities may span text tokens).
    text: Vec<u8>,
    /// Raw text to keep verbatim (CDATA).
    verbatim: bool,
    /// Open tags past [`MAX_DEPTH`] not closed yet (kept as text, as
    /// their closes are).
    excess: usize,
    /// Tags kept as text for their depth.
    too_deep: usize,
}

impl Default for Builder {
    fn default() -> Self {
        // The root and room for three levels of children, and room for
        // four children of the root (an open element gets room for one, a
        // leaf's text): no growth on the usual status bar or choice list
        // (a first push into an empty vector takes the slow growing path).
        let mut stack = Vec::with_capacity(4);
        stack.push(ElementNode { name: String::new(), attrs: Vec::new(), children: Vec::with_capacity(4) });
        Builder { stack, text: Vec::new(), verbatim: false, excess: 0, too_deep: 0 }
    }
}

impl Builder {
    fn push_node(&mut self, node: Node) {
        if let Some(top) = self.stack.last_mut() {
            if let (Node::Text(new), Some(Node::Text(prev))) = (&node, top.children.last_mut()) {
                prev.push_str(new);
                return;
            }
            top.children.push(node);
        }
    }

    fn flush_text(&mut self) {
        if self.text.is_empty() {
            return;
        }
        // The buffer is kept (cleared) for the next run of text.
        let s =
            if self.verbatim { String::from_utf8_lossy(&self.text).into_owned() } else { decode_entities(&self.text) };
        self.text.clear();
        self.verbatim = false;
        self.push_node(Node::Text(s));
    }

    /// Whether `tag` is past [`MAX_DEPTH`] (an open tag there, or the close
    /// of one): kept as text, counted.
    fn too_deep_for(&mut self, tag: &crate::scan::TagToken<'_>) -> bool {
        match tag.kind {
            TagKind::Open if self.stack.len() > MAX_DEPTH => {
                // A void tag (`<br>`) has no close to wait for.
                if !is_void(tag.name) {
                    self.excess += 1;
                }
                self.too_deep += 1;
                true
            }
            TagKind::Close if self.excess > 0 => {
                self.excess -= 1;
                true
            }
            TagKind::SelfClosing if self.stack.len() > MAX_DEPTH => {
                self.too_deep += 1;
                true
            }
            _ => false,
        }
    }

    fn pop(&mut self) {
        if self.stack.len() > 1
            && let Some(done) = self.stack.pop()
        {
            self.push_node(Node::Element(done));
        }
    }
}

impl TokenSink for Builder {
    fn token(&mut self, token: Token<'_>) {
        match token {
            Token::Text { bytes, .. } | Token::Special { raw: bytes, .. } | Token::Unfinished { raw: bytes, .. } => {
                if self.verbatim {
                    self.flush_text();
                }
                self.text.extend_from_slice(bytes);
            }
            Token::CData { body, .. } => {
                self.flush_text();
                self.text.extend_from_slice(body);
                self.verbatim = true;
                self.flush_text();
            }
            Token::Comment { .. } | Token::Notice(_) => {}
            Token::Tag(tag) if self.too_deep_for(&tag) => {
                if self.verbatim {
                    self.flush_text();
                }
                self.text.extend_from_slice(tag.raw);
            }
            Token::Tag(tag) => {
                self.flush_text();
                match tag.kind {
                    TagKind::Open | TagKind::SelfClosing => {
                        let void = is_void(tag.name);
                        let name = owned_text(tag.name);
                        let attrs = tag.attrs().map(|a| (owned_text(a.name), decode_entities(a.value))).collect();
                        if tag.kind == TagKind::SelfClosing || void {
                            self.push_node(Node::Element(ElementNode { name, attrs, children: Vec::new() }));
                        } else {
                            self.stack.push(ElementNode { name, attrs, children: Vec::with_capacity(1) });
                        }
                    }
                    TagKind::Close => {
                        // Close the nearest open element of that name (and
                        // everything inside it); a close with no open
                        // element of its name is dropped.
                        if let Some(i) = self
                            .stack
                            .iter()
                            .rposition(|e| e.name.as_bytes().eq_ignore_ascii_case(tag.name))
                            .filter(|&i| i > 0)
                        {
                            while self.stack.len() > i {
                                self.pop();
                            }
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn el(name: &str, children: Vec<Node>) -> Node {
        Node::Element(ElementNode { name: name.into(), attrs: Vec::new(), children })
    }

    fn t(s: &str) -> Node {
        Node::Text(s.into())
    }

    #[test]
    fn builds_a_forgiving_tree() {
        let table: Vec<(&str, Vec<Node>)> = vec![
            ("<a>1</a><b>2</b>", vec![el("a", vec![t("1")]), el("b", vec![t("2")])]),
            ("<a><b>x</b></a>", vec![el("a", vec![el("b", vec![t("x")])])]),
            ("<a>1<b>2</a>3", vec![el("a", vec![t("1"), el("b", vec![t("2")])]), t("3")]),
            ("<a>open", vec![el("a", vec![t("open")])]),
            ("x</z>y", vec![t("xy")]),
            ("<a>&lt;5 &amp; &#x4e2d;</a>", vec![el("a", vec![t("<5 & \u{4e2d}")])]),
            ("<a><!-- hidden -->v</a>", vec![el("a", vec![t("v")])]),
            ("<a><![CDATA[<raw> &amp;]]></a>", vec![el("a", vec![t("<raw> &amp;")])]),
            ("<a/><br>b", vec![el("a", vec![]), el("br", vec![]), t("b")]),
            ("a < b", vec![t("a < b")]),
        ];
        for (text, want) in table {
            assert_eq!(parse(text).nodes, want, "{text}");
        }
    }

    #[test]
    fn attributes_are_decoded_and_ordered() {
        let nodes = parse("<hp max=\"10\" cur='5' note=a&amp;b>5</hp>").nodes;
        let Some(Node::Element(hp)) = nodes.first() else {
            panic!("no element in {nodes:?}");
        };
        assert_eq!(hp.attrs, [("max".into(), "10".into()), ("cur".into(), "5".into()), ("note".into(), "a&b".into())]);
        assert_eq!(hp.attr("MAX"), Some("10"));
        assert_eq!(hp.text_content(), "5");
    }

    #[test]
    fn tags_past_the_depth_limit_are_kept_as_text() {
        let deep = 10_000;
        let text = format!("{}x{}<after>y</after>", "<a>".repeat(deep), "</a>".repeat(deep));
        let tree = parse(&text);
        assert_eq!(tree.too_deep, deep - MAX_DEPTH);
        // MAX_DEPTH elements, the innermost holding the rest as text.
        let mut node = &tree.nodes[0];
        let mut depth = 0;
        while let Node::Element(e) = node {
            depth += 1;
            node = &e.children[0];
        }
        assert_eq!(depth, MAX_DEPTH);
        let inner = format!("{}x{}", "<a>".repeat(deep - MAX_DEPTH), "</a>".repeat(deep - MAX_DEPTH));
        assert_eq!(node, &t(&inner));
        // The tags after the deep run are read as tags again.
        assert_eq!(tree.nodes[1], el("after", vec![t("y")]));
        // A void tag down there opens nothing.
        let text = format!("{}<br>z{}<b>w</b>", "<a>".repeat(MAX_DEPTH + 1), "</a>".repeat(MAX_DEPTH + 1));
        assert_eq!(parse(&text).nodes[1], el("b", vec![t("w")]));
    }
}
