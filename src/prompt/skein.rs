//! Skein blocks (spec 003 §2.1.1, §2.2): a prompt as a sequence of XML
//! tags whose bodies are 2-space YAML (or text), with the metadata wrappers
//! `<block role>`, `<format type>` and `<priority level>`.
//!
//! This module owns the block model and its deterministic rendering (keys
//! in the order given, 2-space YAML, one blank line between blocks), so that
//! prompts can be cached and diffed.

use super::yaml::to_yaml;
use serde_json::Value;

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
        let mut out = format!("<{}{attrs}>\n{body}</{}>", self.tag, self.tag);
        for (tag, attr, value) in self.wrappers.iter().rev() {
            out = format!("<{tag} {attr}=\"{}\">\n{out}\n</{tag}>", escape_attr(value));
        }
        out
    }
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
                out.push_str(&format!("<use_protocol>{}</use_protocol>", t.trim()));
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
}
