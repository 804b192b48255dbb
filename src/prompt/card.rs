//! SillyTavern imports: character cards (V1, Character Card V2 and V3 as
//! JSON, or PNG files with the card base64-encoded in a `chara` or `ccv3`
//! text chunk) and world-info / lorebook JSON, turned into Skein blocks and
//! normalised world-book entries.
//!
//! This module owns reading those formats. A PNG without a card chunk, a
//! chunk that is not base64 JSON, or JSON that is neither a card nor world
//! info is a [`CardError`] that says which.

use super::migrate::migrate;
use super::skein::{Block, Skein};
use super::worldbook::{Normalized, normalize_entry};
use base64::Engine as _;
use serde_json::{Map, Value};

/// Why an import failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CardError {
    /// A PNG that could not be read.
    #[error("not a readable PNG: {0}")]
    Png(String),
    /// A PNG with no `chara`/`ccv3` text chunk.
    #[error("the PNG has no character card (no `chara` or `ccv3` text chunk)")]
    NoCard,
    /// The card chunk is not base64 JSON.
    #[error("the card chunk is corrupt: {0}")]
    Corrupt(String),
    /// JSON that is not a card or world info.
    #[error("not a SillyTavern card or world-info file: {0}")]
    Unknown(String),
}

/// What an import gives.
#[derive(Debug, Clone)]
pub struct Imported {
    /// `card` (V1/V2/V3) or `world_info`.
    pub kind: &'static str,
    /// The card as read, whole, when it was a card: a V1 card as it is, a
    /// V2/V3 card with its `spec`, `spec_version`, `data` and any other
    /// key. Its fields (the `data` of V2/V3) are [`Imported::card_data`].
    pub card: Option<Value>,
    /// The blocks: `<character_card>`, then one `<lorebook_entry>` per entry.
    pub skein: Skein,
    /// The normalised entries (with what was kept as text).
    pub entries: Vec<Normalized>,
    /// Notes for people (skipped entries, macros left in the text).
    pub notes: Vec<String>,
}

impl Imported {
    /// The card's fields: the `data` of a V2/V3 card, a V1 card itself;
    /// `None` for world info.
    pub fn card_data(&self) -> Option<&Value> {
        let card = self.card.as_ref()?;
        if wrapped_spec(card).is_some() { card.get("data") } else { Some(card) }
    }

    /// [`Imported::card_data`], to change in place (`spindle prompt
    /// migrate` converts its text fields and writes the whole card back).
    pub fn card_data_mut(&mut self) -> Option<&mut Value> {
        let card = self.card.as_mut()?;
        if wrapped_spec(card).is_some() { card.get_mut("data") } else { Some(card) }
    }

    /// The card as the `char` variable of a render, under the names the
    /// migrated macros read (spec 003 §2.3.4): `name`, `description`,
    /// `personality`, `scenario`, `version`, `creator_notes`,
    /// `main_prompt` (the card's `system_prompt`), `jailbreak`
    /// (`post_history_instructions`), `depth_prompt`
    /// (`extensions.depth_prompt.prompt`), `examples` and `examples_raw`
    /// (`mes_example`), `first_message`, `alternate_greetings`, `tags`,
    /// `creator`, `nickname`. A field the card does not have is absent (it
    /// prints as nothing). `None` for world info.
    ///
    /// ```
    /// use spindle::prompt::{Renderer, import_bytes, migrate};
    /// use serde_json::json;
    ///
    /// let card = json!({"spec": "chara_card_v2", "data": {"name": "Seraphina",
    ///     "description": "A guardian.", "system_prompt": "Stay in character.",
    ///     "mes_example": "<START>\n{{char}}: Hello."}});
    /// let imported = import_bytes(card.to_string().as_bytes()).unwrap();
    /// let vars = json!({"char": imported.char_vars().unwrap(), "user": "Ann"});
    /// let template = migrate("{{charPrompt}} {{char}}: {{description}}").text;
    /// let text = Renderer::new().render(&template, &vars, &json!({})).unwrap();
    /// assert_eq!(text, "Stay in character. Seraphina: A guardian.");
    /// ```
    pub fn char_vars(&self) -> Option<Value> {
        let data = self.card_data()?;
        let mut vars = Map::new();
        let texts = &[
            ("name", "name"),
            ("description", "description"),
            ("personality", "personality"),
            ("scenario", "scenario"),
            ("character_version", "version"),
            ("creator_notes", "creator_notes"),
            ("system_prompt", "main_prompt"),
            ("post_history_instructions", "jailbreak"),
            ("mes_example", "examples"),
            ("mes_example", "examples_raw"),
            ("first_mes", "first_message"),
            ("creator", "creator"),
            ("nickname", "nickname"),
        ];
        copy_texts(data, texts, &mut vars);
        let depth = data.pointer("/extensions/depth_prompt/prompt").and_then(Value::as_str).map(str::trim);
        if let Some(depth) = depth.filter(|d| !d.is_empty()) {
            vars.insert("depth_prompt".into(), Value::String(depth.to_string()));
        }
        copy_lists(data, &["alternate_greetings", "tags"], &mut vars);
        Some(Value::Object(vars))
    }
}

/// The `spec` of a card whose fields are wrapped in `data`
/// (`chara_card_v2`, `chara_card_v3`).
fn wrapped_spec(json: &Value) -> Option<&str> {
    json.get("spec").and_then(Value::as_str).filter(|s| matches!(*s, "chara_card_v2" | "chara_card_v3"))
}

/// Imports a card or world-info file from its bytes (`name` is for
/// messages and entry names).
///
/// # Errors
///
/// [`CardError`].
pub fn import_bytes(bytes: &[u8]) -> Result<Imported, CardError> {
    let json: Value = if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
        card_from_png(bytes)?
    } else {
        serde_json::from_slice(bytes).map_err(|e| CardError::Unknown(format!("invalid JSON: {e}")))?
    };
    from_json(&json)
}

/// Imports a card or world-info file.
///
/// # Errors
///
/// The file cannot be read ([`CardError::Unknown`] with the cause), or
/// [`import_bytes`]' errors.
pub fn import(path: &std::path::Path) -> Result<Imported, CardError> {
    let bytes = std::fs::read(path).map_err(|e| CardError::Unknown(format!("cannot read {}: {e}", path.display())))?;
    import_bytes(&bytes)
}

fn card_from_png(bytes: &[u8]) -> Result<Value, CardError> {
    let decoder = png::Decoder::new(std::io::Cursor::new(bytes));
    let reader = decoder.read_info().map_err(|e| CardError::Png(e.to_string()))?;
    let info = reader.info();
    let mut chunks: Vec<(String, String)> = Vec::new();
    for t in &info.uncompressed_latin1_text {
        chunks.push((t.keyword.clone(), t.text.clone()));
    }
    for t in &info.compressed_latin1_text {
        if let Ok(text) = t.get_text() {
            chunks.push((t.keyword.clone(), text));
        }
    }
    for t in &info.utf8_text {
        if let Ok(text) = t.get_text() {
            chunks.push((t.keyword.clone(), text));
        }
    }
    // V3's `ccv3` wins over V2's `chara` when both are there.
    let chunk = ["ccv3", "chara"]
        .iter()
        .find_map(|k| chunks.iter().find(|(kw, _)| kw.eq_ignore_ascii_case(k)))
        .ok_or(CardError::NoCard)?;
    let raw = base64::engine::general_purpose::STANDARD
        .decode(chunk.1.trim())
        .map_err(|e| CardError::Corrupt(format!("`{}` is not base64: {e}", chunk.0)))?;
    serde_json::from_slice(&raw).map_err(|e| CardError::Corrupt(format!("`{}` is not JSON: {e}", chunk.0)))
}

/// Copies the card's text fields `from` into `out` as `to` (trimmed; an
/// empty or missing one is left out).
fn copy_texts(data: &Value, names: &[(&str, &str)], out: &mut Map<String, Value>) {
    for (from, to) in names {
        if let Some(t) = text(data, from) {
            out.insert((*to).into(), Value::String(t));
        }
    }
}

/// Copies the card's non-empty lists `keys` into `out`.
fn copy_lists(data: &Value, keys: &[&str], out: &mut Map<String, Value>) {
    for key in keys {
        if let Some(a) = data.get(*key).and_then(Value::as_array).filter(|a| !a.is_empty()) {
            out.insert((*key).into(), Value::Array(a.clone()));
        }
    }
}

fn text(v: &Value, key: &str) -> Option<String> {
    v.get(key).and_then(Value::as_str).map(str::trim).filter(|s| !s.is_empty()).map(str::to_string)
}

fn from_json(json: &Value) -> Result<Imported, CardError> {
    if let Some(spec) = wrapped_spec(json) {
        let data = json.get("data").ok_or_else(|| CardError::Unknown(format!("a {spec} card without `data`")))?;
        return Ok(card(json, data, if spec == "chara_card_v3" { "card_v3" } else { "card_v2" }));
    }
    if json.get("entries").is_some() && json.get("first_mes").is_none() {
        let mut notes = Vec::new();
        let entries = world_entries(json, &mut notes);
        let mut skein = Skein::new();
        for (block, _) in &entries {
            skein = skein.block(block.clone());
        }
        return Ok(Imported {
            kind: "world_info",
            card: None,
            skein,
            entries: entries.into_iter().map(|(_, n)| n).collect(),
            notes,
        });
    }
    if json.get("name").is_some() && (json.get("description").is_some() || json.get("first_mes").is_some()) {
        return Ok(card(json, json, "card_v1"));
    }
    Err(CardError::Unknown(
        "expected a card (name, description, first_mes; or spec chara_card_v2/v3) or world info (entries)".into(),
    ))
}

/// A card's import: `whole` as read, `data` its fields (`whole` itself
/// for V1).
fn card(whole: &Value, data: &Value, kind: &'static str) -> Imported {
    let mut fields = Map::new();
    let texts = &[
        ("name", "name"),
        ("description", "description"),
        ("personality", "personality"),
        ("scenario", "scenario"),
        ("first_mes", "first_message"),
        ("mes_example", "example_dialogue"),
        ("creator_notes", "creator_notes"),
        ("system_prompt", "system_prompt"),
        ("post_history_instructions", "post_history_instructions"),
        ("creator", "creator"),
        ("character_version", "version"),
        ("nickname", "nickname"),
    ];
    copy_texts(data, texts, &mut fields);
    copy_lists(data, &["alternate_greetings", "tags", "group_only_greetings"], &mut fields);
    let mut notes = Vec::new();
    let macros: usize = fields.values().map(macros_to_migrate).sum();
    if macros > 0 {
        notes.push(format!(
            "{macros} SillyTavern macro(s) left in the card text; `spindle prompt migrate` converts them to Jinja2"
        ));
    }
    let mut skein = Skein::new().character_card(Value::Object(fields));
    let mut entries = Vec::new();
    if let Some(book) = data.get("character_book") {
        for (block, n) in world_entries(book, &mut notes) {
            skein = skein.block(block);
            entries.push(n);
        }
    }
    Imported { kind, card: Some(whole.clone()), skein, entries, notes }
}

/// How many macros of a card field (text, or a list of texts) `spindle
/// prompt migrate` would change: the migrator's own reading, so that text
/// already migrated (`{{ user }}`) counts none.
fn macros_to_migrate(v: &Value) -> usize {
    match v {
        Value::String(s) => migrate(s).notes.iter().filter(|n| n.changes_text()).count(),
        Value::Array(a) => a.iter().map(macros_to_migrate).sum(),
        _ => 0,
    }
}

/// The entries of world info (`entries` as an object keyed by uid or as
/// an array), each as a `<lorebook_entry>` holding its normalised form.
fn world_entries(book: &Value, notes: &mut Vec<String>) -> Vec<(Block, Normalized)> {
    let list: Vec<&Value> = match book.get("entries") {
        Some(Value::Object(m)) => m.values().collect(),
        Some(Value::Array(a)) => a.iter().collect(),
        _ => {
            notes.push("world info without `entries`".into());
            Vec::new()
        }
    };
    let mut out = Vec::new();
    for (i, e) in list.into_iter().enumerate() {
        let Some(content) = e.get("content").and_then(Value::as_str) else {
            notes.push(format!("entry {i} has no `content`; skipped"));
            continue;
        };
        let keys: Vec<String> = ["key", "keys"]
            .iter()
            .filter_map(|k| e.get(*k).and_then(Value::as_array))
            .flatten()
            .filter_map(Value::as_str)
            .map(str::to_string)
            .collect();
        let name = text(e, "comment").or_else(|| text(e, "name")).or_else(|| keys.first().cloned());
        let name = name.unwrap_or_else(|| format!("entry_{i}"));
        let n = normalize_entry(&name, content);
        for (line, why) in &n.kept {
            notes.push(format!("entry {name:?}, line {line}: {why}"));
        }
        let mut block = Block::text("lorebook_entry", n.text.clone()).attr("name", name.clone());
        if !keys.is_empty() {
            block = block.attr("keys", keys.join(", "));
        }
        let disabled = e.get("disable").and_then(Value::as_bool) == Some(true)
            || e.get("enabled").and_then(Value::as_bool) == Some(false);
        if disabled {
            block = block.attr("enabled", "false");
        }
        if e.get("constant").and_then(Value::as_bool) == Some(true) {
            block = block.attr("constant", "true");
        }
        out.push((block, n));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A V2 card as JSON.
    fn sample_card_v2() -> Value {
        json!({"spec": "chara_card_v2", "spec_version": "2.0", "data": {
            "name": "Seraphina", "description": "A mage of {{user}}'s order.", "personality": "calm",
            "scenario": "Ancient ruins", "first_mes": "Hello, {{user}}.", "mes_example": "<START>\n{{char}}: Hi.",
            "tags": ["fantasy"],
            "character_book": {"entries": [
                {"keys": ["forest"], "comment": "location_forest", "content": "{\"name\": \"Dark Forest\", \"creatures\": [\"Shadow Wolves\"]}"},
                {"keys": ["town"], "content": "# Town\nmayor: Orin"}
            ]}
        }})
    }

    fn png_with(chunks: &[(&str, &str)]) -> Vec<u8> {
        let mut out = Vec::new();
        {
            let mut enc = png::Encoder::new(&mut out, 1, 1);
            enc.set_color(png::ColorType::Grayscale);
            enc.set_depth(png::BitDepth::Eight);
            for (k, v) in chunks {
                let _ = enc.add_text_chunk((*k).to_string(), (*v).to_string());
            }
            if let Ok(mut w) = enc.write_header() {
                let _ = w.write_image_data(&[0]);
            }
        }
        out
    }

    #[test]
    fn cards_from_json_and_png() {
        let card = sample_card_v2();
        let from_json = import_bytes(card.to_string().as_bytes()).unwrap();
        assert_eq!(from_json.kind, "card_v2");
        // The card is kept whole (its `spec` wrapper too); its fields are `data`.
        assert_eq!(from_json.card.as_ref(), Some(&card));
        assert_eq!(from_json.card_data(), Some(&card["data"]));
        let text = from_json.skein.render();
        assert!(text.starts_with("<character_card>\nname: Seraphina\n"), "{text}");
        assert!(text.contains("<lorebook_entry name=\"location_forest\" keys=\"forest\">\n<location_forest>\n  name: Dark Forest\n  creatures:\n    - Shadow Wolves\n</location_forest>\n</lorebook_entry>"), "{text}");
        assert!(from_json.notes.iter().any(|n| n.contains("macro")));
        let b64 = base64::engine::general_purpose::STANDARD.encode(card.to_string());
        let png = png_with(&[("chara", &b64)]);
        assert_eq!(import_bytes(&png).unwrap().skein.render(), text);
        let v3 = json!({"spec": "chara_card_v3", "data": card["data"].clone()});
        let png =
            png_with(&[("chara", &b64), ("ccv3", &base64::engine::general_purpose::STANDARD.encode(v3.to_string()))]);
        assert_eq!(import_bytes(&png).unwrap().kind, "card_v3");
    }

    #[test]
    fn broken_inputs_say_what_is_wrong() {
        assert!(matches!(import_bytes(&png_with(&[("Software", "x")])), Err(CardError::NoCard)));
        assert!(
            matches!(import_bytes(&png_with(&[("chara", "%%%")])), Err(CardError::Corrupt(m)) if m.contains("base64"))
        );
        let not_json = base64::engine::general_purpose::STANDARD.encode("{nope");
        assert!(
            matches!(import_bytes(&png_with(&[("chara", &not_json)])), Err(CardError::Corrupt(m)) if m.contains("JSON"))
        );
        assert!(matches!(import_bytes(b"\x89PNG\r\n\x1a\nbroken"), Err(CardError::Png(_))));
        assert!(matches!(import_bytes(b"{\"hello\": 1}"), Err(CardError::Unknown(_))));
        let world = json!({"entries": {"0": {"key": ["a"], "content": "{\"x\": "}, "1": {"key": ["b"]}}});
        let w = import_bytes(world.to_string().as_bytes()).unwrap();
        assert_eq!(w.kind, "world_info");
        assert!(
            w.notes.iter().any(|n| n.contains("invalid JSON")) && w.notes.iter().any(|n| n.contains("no `content`"))
        );
    }
}
