//! Skein blocks (spec 003 §2.1.1, §2.2): a prompt as a sequence of XML
//! tags whose bodies are 2-space YAML (or text), with the metadata wrappers
//! `<block role>`, `<format type>` and `<priority level>`.
//!
//! This module owns the block model and its deterministic rendering (keys
//! in the order given, 2-space YAML, one blank line between blocks), so that
//! prompts can be cached and diffed.

use super::yaml::to_yaml;
use serde_json::Value;
use std::borrow::Cow;

/// One block of a Skein.
#[derive(Debug, Clone, PartialEq)]
pub struct Block {
    /// The tag (`system_instruction`, `character_card`, `world_state`,
    /// `lorebook_entry`, `conversation_history`, `use_protocol`, or a
    /// world-book entry's own name).
    pub tag: String,
    /// Attributes of the opening tag, in order.
    pub attrs: Vec<(String, String)>,
    /// The body: YAML of a structured value, or text as it is.
    pub body: Body,
    /// Metadata wrappers, outermost first (`block role`, `format type`,
    /// `priority level`).
    pub wrappers: Vec<(String, String, String)>,
}

/// A block's body.
#[derive(Debug, Clone, PartialEq)]
pub enum Body {
    /// Written as 2-space YAML.
    Yaml(Value),
    /// Written as it is (trailing whitespace trimmed).
    Text(String),
}

impl Block {
    /// A block whose body is `value` as YAML.
    pub fn yaml(tag: impl Into<String>, value: Value) -> Block {
        Block { tag: tag.into(), attrs: Vec::new(), body: Body::Yaml(value), wrappers: Vec::new() }
    }

    /// A block whose body is text.
    pub fn text(tag: impl Into<String>, text: impl Into<String>) -> Block {
        Block { tag: tag.into(), attrs: Vec::new(), body: Body::Text(text.into()), wrappers: Vec::new() }
    }

    /// Adds an attribute to the opening tag.
    pub fn attr(mut self, name: impl Into<String>, value: impl Into<String>) -> Block {
        self.attrs.push((name.into(), value.into()));
        self
    }

    /// Wraps the block in `<block role="ROLE">`.
    pub fn role(mut self, role: impl Into<String>) -> Block {
        self.wrappers.push(("block".into(), "role".into(), role.into()));
        self
    }

    /// Wraps the block in `<format type="TYPE">`.
    pub fn format(mut self, kind: impl Into<String>) -> Block {
        self.wrappers.push(("format".into(), "type".into(), kind.into()));
        self
    }

    /// Wraps the block in `<priority level="LEVEL">`.
    pub fn priority(mut self, level: impl Into<String>) -> Block {
        self.wrappers.push(("priority".into(), "level".into(), level.into()));
        self
    }

    /// The block's text.
    pub fn render(&self) -> String {
        let mut attrs = String::new();
        for (k, v) in &self.attrs {
            attrs.push_str(&format!(" {k}=\"{}\"", escape_attr(v)));
        }
        let body = match &self.body {
            Body::Yaml(v) => to_yaml(v),
            Body::Text(t) => {
                let t = t.trim_end();
                if t.is_empty() { String::new() } else { format!("{t}\n") }
            }
        };
        let enclosing: Vec<&str> =
            std::iter::once(self.tag.as_str()).chain(self.wrappers.iter().map(|(tag, ..)| tag.as_str())).collect();
        let body = guard_close_tags(&body, &enclosing);
        let mut out = format!("<{}{attrs}>\n{body}</{}>", self.tag, self.tag);
        for (tag, attr, value) in self.wrappers.iter().rev() {
            out = format!("<{tag} {attr}=\"{}\">\n{out}\n</{tag}>", escape_attr(value));
        }
        out
    }
}

/// `text` with every close tag of one of `tags` (`</lorebook_entry>`,
/// `</Block `, matched as a reader of tags matches them: ASCII case
/// ignored, the name ending at anything but a name character) written
/// with `&lt;` instead of `<`, so that a body (a card's text, a
/// world-book entry) cannot end its block, or a wrapper around it, before
/// its end. Every other byte is kept.
fn guard_close_tags<'a>(text: &'a str, tags: &[&str]) -> Cow<'a, str> {
    let bytes = text.as_bytes();
    let closes_one = |at: usize| {
        let rest = &bytes[at + 2..];
        tags.iter().any(|tag| {
            rest.len() >= tag.len()
                && rest[..tag.len()].eq_ignore_ascii_case(tag.as_bytes())
                && !rest
                    .get(tag.len())
                    .is_some_and(|&b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b':'))
        })
    };
    let mut out = String::new();
    let mut written = 0;
    for (at, _) in text.match_indices("</") {
        if closes_one(at) {
            out.push_str(&text[written..at]);
            out.push_str("&lt;");
            written = at + 1;
        }
    }
    if written == 0 {
        return Cow::Borrowed(text);
    }
    out.push_str(&text[written..]);
    Cow::Owned(out)
}

fn escape_attr(v: &str) -> String {
    v.replace('&', "&amp;").replace('"', "&quot;").replace('<', "&lt;")
}

/// A prompt as Skein blocks, rendered in order.
///
/// ```
/// use spindle::prompt::{Block, Skein};
/// use serde_json::json;
///
/// let prompt = Skein::new()
///     .block(Block::yaml("system_instruction", json!({"role": "Dungeon Master", "rules": ["permadeath"]})))
///     .use_protocol("variable_update_v2")
///     .render();
/// assert_eq!(prompt, "<system_instruction>\nrole: Dungeon Master\nrules:\n  - permadeath\n</system_instruction>\n\n<use_protocol>variable_update_v2</use_protocol>\n");
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Skein {
    blocks: Vec<Block>,
}

impl Skein {
    /// No blocks.
    pub fn new() -> Skein {
        Skein::default()
    }

    /// Appends a block.
    pub fn block(mut self, block: Block) -> Skein {
        self.blocks.push(block);
        self
    }

    /// Appends `<system_instruction>` with `value` as YAML.
    pub fn system_instruction(self, value: Value) -> Skein {
        self.block(Block::yaml("system_instruction", value))
    }

    /// Appends `<character_card>`.
    pub fn character_card(self, value: Value) -> Skein {
        self.block(Block::yaml("character_card", value))
    }

    /// Appends `<world_state>`.
    pub fn world_state(self, value: Value) -> Skein {
        self.block(Block::yaml("world_state", value))
    }

    /// Appends `<lorebook_entry>`.
    pub fn lorebook_entry(self, value: Value) -> Skein {
        self.block(Block::yaml("lorebook_entry", value))
    }

    /// Appends `<conversation_history>` (a list of `{role, content}`).
    pub fn conversation_history(self, messages: Value) -> Skein {
        self.block(Block::yaml("conversation_history", messages))
    }

    /// Appends `<use_protocol>NAME</use_protocol>` (one line).
    pub fn use_protocol(mut self, name: &str) -> Skein {
        self.blocks.push(Block::text("use_protocol", name));
        self
    }

    /// The blocks.
    pub fn blocks(&self) -> &[Block] {
        &self.blocks
    }

    /// The prompt text: blocks separated by a blank line, a final newline.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for (i, b) in self.blocks.iter().enumerate() {
            if i > 0 {
                out.push_str("\n\n");
            }
            if b.tag == "use_protocol"
                && b.wrappers.is_empty()
                && let Body::Text(t) = &b.body
            {
                out.push_str(&format!(
                    "<use_protocol>{}</use_protocol>",
                    guard_close_tags(t.trim(), &["use_protocol"])
                ));
            } else {
                out.push_str(&b.render());
            }
        }
        if !out.is_empty() {
            out.push('\n');
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Spec 003 §2.1.1, as the spec shows it.
    #[test]
    fn the_spec_example() {
        let prompt = Skein::new()
            .system_instruction(
                json!({"role": "Dungeon Master", "tone": "Dark Fantasy", "rules": ["strict_physics", "permadeath"]}),
            )
            .character_card(json!({"name": "Seraphina", "class": "Mage", "attributes": {"int": 18, "str": 4}}))
            .world_state(json!({"location": "Ancient Ruins", "time": "Midnight", "weather": "Stormy"}))
            .render();
        let want = "<system_instruction>\nrole: Dungeon Master\ntone: Dark Fantasy\nrules:\n  - strict_physics\n  - permadeath\n</system_instruction>\n\n<character_card>\nname: Seraphina\nclass: Mage\nattributes:\n  int: 18\n  str: 4\n</character_card>\n\n<world_state>\nlocation: Ancient Ruins\ntime: Midnight\nweather: Stormy\n</world_state>\n";
        assert_eq!(prompt, want);
    }

    #[test]
    fn metadata_wrappers_nest_outermost_first() {
        let b = Block::text("lorebook_entry", "x").role("system").priority("high");
        assert_eq!(
            b.render(),
            "<block role=\"system\">\n<priority level=\"high\">\n<lorebook_entry>\nx\n</lorebook_entry>\n</priority>\n</block>"
        );
        let b = Block::yaml("world_state", json!({"a": 1})).attr("id", "w\"1").format("yaml");
        assert_eq!(
            b.render(),
            "<format type=\"yaml\">\n<world_state id=\"w&quot;1\">\na: 1\n</world_state>\n</format>"
        );
    }

    /// The block's close tags in `text`: `</NAME` with ASCII case ignored
    /// and the name ending at a character no tag name holds.
    fn closes(text: &str, name: &str) -> usize {
        let lower = text.to_ascii_lowercase();
        lower
            .match_indices(&format!("</{name}"))
            .filter(|(at, m)| {
                !lower[at + m.len()..].chars().next().is_some_and(|c| c.is_ascii_alphanumeric() || "_-.:".contains(c))
            })
            .count()
    }

    #[test]
    fn a_body_cannot_close_its_block_early() {
        let b =
            Block::text("lorebook_entry", "Ends </lorebook_entry> here </LOREBOOK_ENTRY >, </lorebook_entry_2> stays")
                .role("system");
        assert_eq!(
            b.render(),
            "<block role=\"system\">\n<lorebook_entry>\nEnds &lt;/lorebook_entry> here &lt;/LOREBOOK_ENTRY >, \
             </lorebook_entry_2> stays\n</lorebook_entry>\n</block>"
        );
        let card = Skein::new().character_card(json!({"description": "a </character_card> b </block>"})).render();
        assert_eq!(card, "<character_card>\ndescription: a &lt;/character_card> b </block>\n</character_card>\n");
        let p = Skein::new().use_protocol("x</use_protocol><use_protocol>y").render();
        assert_eq!(closes(&p, "use_protocol"), 1, "{p}");
    }

    proptest::proptest! {
        /// Whatever a text body holds, the rendered block closes each of
        /// its tags once, at its end, and holds every byte of the body
        /// (a guarded `<` written `&lt;`).
        #[test]
        fn a_block_closes_once(pieces in proptest::collection::vec(proptest::sample::select(vec![
            "</lorebook_entry>", "</Lorebook_Entry\n>", "</lorebook_entryx>", "</block>", "</BLOCK", "</priority ",
            "</", "<", "/", ">", "lorebook_entry", " text ", "\n", "\u{3000}", "é",
        ]), 0..16)) {
            let body = pieces.concat();
            let block = Block::text("lorebook_entry", body.clone()).role("system").priority("high");
            let rendered = block.render();
            for tag in ["lorebook_entry", "block", "priority"] {
                proptest::prop_assert_eq!(closes(&rendered, tag), 1, "{}: {:?}", tag, rendered);
            }
            let trimmed = body.trim_end();
            let inner = if trimmed.is_empty() { String::new() } else { format!("{trimmed}\n") };
            let plain = format!(
                "<block role=\"system\">\n<priority level=\"high\">\n<lorebook_entry>\n{inner}</lorebook_entry>\n</priority>\n</block>"
            );
            proptest::prop_assert_eq!(rendered.replace("&lt;/", "</"), plain);
        }
    }
}
