//! World-book normalisation (spec 003 §2.1.2): every entry becomes
//! "XML around 2-space YAML", whatever it was written in.
//!
//! This module owns the detection of an entry's format (JSON, YAML,
//! Markdown, plain text), the conversion, and the report of what could not
//! be converted (kept as text, never dropped).
//!
//! * JSON: parsed and written as 2-space YAML; invalid JSON is kept as text
//!   and reported.
//! * YAML: re-indented to 2 spaces (parsed and written back, YAML 1.2
//!   booleans only) when that loses no text; YAML that it would change (a
//!   comment, an alias, a number's spelling, a key written twice) is read
//!   line by line as below, and reported.
//! * Markdown: headings become keys (nested by level), lists become
//!   sequences (nested lists under their item), `key: value` and
//!   `**key**: value` lines become mappings; prose under a heading becomes
//!   its text; what fits none of these is kept as text and reported.
//!   Everything stays in the order written: among a section's keys, its
//!   prose is a `text` key and its list an `items` key where they began. A
//!   mapping holds each key once, so prose (or a list, or a key) that comes
//!   again after other keys joins the first one, above them, and that move
//!   is reported too.

use super::yaml::{from_yaml, to_yaml};
use serde_json::{Map, Value};
use std::collections::HashMap;

/// What an entry was written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EntryFormat {
    /// A JSON object or array.
    Json,
    /// A YAML mapping or sequence.
    Yaml,
    /// Markdown (headings, lists, `key: value` lines).
    Markdown,
    /// Prose: kept as it is.
    Text,
}

/// A normalised entry.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Normalized {
    /// The tag around it.
    pub tag: String,
    /// What it was written in.
    pub format: EntryFormat,
    /// The structured value (when it was converted).
    pub value: Option<Value>,
    /// `<tag>` + the body indented by 2 + `</tag>`.
    pub text: String,
    /// What could not be converted as written, by line (1-based), with
    /// why: text kept as text, text moved to join a key written above it.
    /// All of it is still in `text`.
    pub kept: Vec<(usize, String)>,
}

/// Normalises one world-book entry. `tag` names it (`location_forest`);
/// an entry already wrapped in one XML tag keeps that tag.
///
/// ```
/// use spindle::prompt::{EntryFormat, normalize_entry};
///
/// let n = normalize_entry("location_forest", r#"{"name": "Dark Forest", "creatures": ["Shadow Wolves"]}"#);
/// assert_eq!(n.format, EntryFormat::Json);
/// assert_eq!(n.text, "<location_forest>\n  name: Dark Forest\n  creatures:\n    - Shadow Wolves\n</location_forest>");
/// ```
pub fn normalize_entry(tag: &str, text: &str) -> Normalized {
    let (tag, inner) = unwrap_tag(text).unwrap_or((tag.to_string(), text));
    let tag = sanitize_tag(&tag);
    let trimmed = inner.trim();
    let mut kept = Vec::new();
    let (format, value) = if trimmed.starts_with('{') || trimmed.starts_with('[') {
        match serde_json::from_str::<Value>(trimmed) {
            Ok(v) => (EntryFormat::Json, Some(v)),
            Err(e) => {
                kept.push((e.line(), format!("invalid JSON ({e}); the entry is kept as text")));
                (EntryFormat::Text, None)
            }
        }
    } else if looks_like_markdown(trimmed) {
        let (v, notes) = markdown(trimmed);
        kept.extend(notes);
        (EntryFormat::Markdown, Some(v))
    } else {
        // YAML 1.2 booleans (`no` and `y` stay text), `007` as written, a
        // key written twice refused (so that the entry is read line by
        // line and keeps both).
        match from_yaml(trimmed) {
            Ok(v @ (Value::Object(_) | Value::Array(_))) if keeps_every_word(trimmed, &to_yaml(&v)) => {
                (EntryFormat::Yaml, Some(v))
            }
            parsed @ (Ok(_) | Err(_)) if trimmed.lines().any(|l| key_value(l).is_some()) => {
                // Looks like YAML but does not parse, or re-writing it would
                // lose text (a comment, an alias, a number's spelling, a key
                // written twice): read it as Markdown-ish `key: value` lines,
                // keep the rest.
                if parsed.is_ok() {
                    kept.push((1, "YAML that re-indenting would change (a comment, an alias, a number's spelling): read line by line instead".into()));
                }
                let (v, notes) = markdown(trimmed);
                kept.extend(notes);
                (EntryFormat::Markdown, Some(v))
            }
            _ => (EntryFormat::Text, None),
        }
    };
    let body = match &value {
        Some(v) => to_yaml(v),
        None => format!("{}\n", trimmed),
    };
    let indented: String =
        body.lines().map(|l| if l.is_empty() { "\n".to_string() } else { format!("  {l}\n") }).collect();
    let text = format!("<{tag}>\n{indented}</{tag}>");
    Normalized { tag, format, value, text, kept }
}

/// Whether every word (run of letters and digits) of `text` is still in
/// `written`, as many times: re-writing the entry lost none of its text
/// (a comment that repeats a word of its line, `name: Bo # Bo`, too).
fn keeps_every_word(text: &str, written: &str) -> bool {
    let have = word_counts(written);
    word_counts(text).into_iter().all(|(w, n)| have.get(w).is_some_and(|&h| h >= n))
}

/// How many times each word (run of letters and digits) is in `text`.
fn word_counts(text: &str) -> HashMap<&str, usize> {
    let mut count = HashMap::new();
    for w in text.split(|c: char| !c.is_alphanumeric()).filter(|w| !w.is_empty()) {
        *count.entry(w).or_default() += 1;
    }
    count
}

/// `<name>…</name>` around the whole text: the name and the inside.
fn unwrap_tag(text: &str) -> Option<(String, &str)> {
    let t = text.trim();
    let rest = t.strip_prefix('<')?;
    let end = rest.find('>')?;
    let name = &rest[..end];
    if name.is_empty() || !name.chars().all(|c| c.is_alphanumeric() || matches!(c, '_' | '-' | '.' | ':')) {
        return None;
    }
    let inner = rest[end + 1..].strip_suffix(&format!("</{name}>"))?;
    Some((name.to_string(), inner))
}

/// A tag name from an entry's name: letters, digits and `_`, lowercase.
fn sanitize_tag(name: &str) -> String {
    let mut out: String = name
        .trim()
        .chars()
        .map(|c| if c.is_alphanumeric() || c == '_' || c == '-' { c.to_ascii_lowercase() } else { '_' })
        .collect();
    if out.is_empty() || out.starts_with(|c: char| c.is_ascii_digit() || c == '-') {
        out.insert_str(0, "entry_");
    }
    out
}

fn looks_like_markdown(t: &str) -> bool {
    t.lines().any(|l| {
        let l = l.trim_start();
        l.starts_with("# ")
            || l.starts_with("## ")
            || l.starts_with("### ")
            || l.starts_with("* ")
            || l.starts_with("**")
            || ordered_item(l).is_some()
    })
}

fn ordered_item(l: &str) -> Option<&str> {
    let digits = l.find(|c: char| !c.is_ascii_digit())?;
    (digits > 0).then(|| l[digits..].strip_prefix(". ")).flatten()
}

/// `key: value` (or `**key**: value`) on one line: the key and the value.
fn key_value(line: &str) -> Option<(String, String)> {
    let l = line.trim();
    let l = l.strip_prefix("- ").unwrap_or(l);
    let (k, v) = l.split_once(':')?;
    let k = k.trim().trim_matches('*').trim();
    if k.is_empty() || k.len() > 60 || k.contains("http") || k.chars().filter(|c| c.is_whitespace()).count() > 4 {
        return None;
    }
    Some((k.to_string(), v.trim().trim_start_matches("**").trim().to_string()))
}

fn list_item(line: &str) -> Option<(usize, &str)> {
    let indent = line.len() - line.trim_start().len();
    let l = line.trim_start();
    let item = l
        .strip_prefix("- ")
        .or_else(|| l.strip_prefix("* "))
        .or_else(|| l.strip_prefix("+ "))
        .or_else(|| ordered_item(l))?;
    Some((indent, item.trim()))
}

/// One thing a section holds, as written.
enum Part {
    /// A `key: value` line, or a heading's section under its name.
    Field(String, Value),
    /// A list item (with the items nested under it).
    Item(Value),
    /// A line of prose.
    Text(String),
}

/// One section under construction: its fields, list items and prose, in
/// the order written, each with its 1-based line.
#[derive(Default)]
struct Section {
    parts: Vec<(usize, Part)>,
}

impl Section {
    /// The list item just before, if the last thing written was one (a
    /// more indented item nests under it).
    fn last_item(&mut self) -> Option<&mut Value> {
        match self.parts.last_mut() {
            Some((_, Part::Item(v))) => Some(v),
            _ => None,
        }
    }

    /// The section as a value: its prose alone as text, its items alone as
    /// a sequence, else a mapping in the order written, where each run of
    /// items is `items` and each run of prose `text`, in its place among
    /// the keys. A key a mapping already has (a run of prose after other
    /// keys, a key written twice) joins the first one, above the keys
    /// between them: that move is reported in `notes`.
    fn into_value(self, notes: &mut Vec<(usize, String)>) -> Value {
        let only = |f: fn(&Part) -> bool| self.parts.iter().all(|(_, p)| f(p));
        if self.parts.is_empty() {
            return Value::Null;
        }
        if only(|p| matches!(p, Part::Text(_))) {
            let lines: Vec<String> = self
                .parts
                .into_iter()
                .filter_map(|(_, p)| if let Part::Text(t) = p { Some(t) } else { None })
                .collect();
            return Value::String(lines.join("\n"));
        }
        if only(|p| matches!(p, Part::Item(_))) {
            return Value::Array(
                self.parts
                    .into_iter()
                    .filter_map(|(_, p)| if let Part::Item(v) = p { Some(v) } else { None })
                    .collect(),
            );
        }
        let mut map = Map::new();
        let mut last: Option<String> = None;
        let mut put = |key: String, value: Value, line: usize, what: &str| {
            let moved = !value.is_null() && map.contains_key(&key) && last.as_deref() != Some(key.as_str());
            if moved {
                notes.push((line, format!("{what} after other keys: joins the `{key}` above them")));
            }
            insert_keeping(&mut map, key.clone(), value);
            last = Some(key);
        };
        let mut parts = self.parts.into_iter().peekable();
        while let Some((line, part)) = parts.next() {
            match part {
                Part::Field(k, v) => {
                    let what = format!("`{k}` written again");
                    put(k, v, line, &what);
                }
                Part::Item(v) => {
                    let mut run = vec![v];
                    while let Some((_, Part::Item(_))) = parts.peek() {
                        if let Some((_, Part::Item(v))) = parts.next() {
                            run.push(v);
                        }
                    }
                    put("items".into(), Value::Array(run), line, "a list");
                }
                Part::Text(t) => {
                    let mut run = vec![t];
                    while let Some((_, Part::Text(_))) = parts.peek() {
                        if let Some((_, Part::Text(t))) = parts.next() {
                            run.push(t);
                        }
                    }
                    put("text".into(), Value::String(run.join("\n")), line, "text");
                }
            }
        }
        Value::Object(map)
    }
}

/// Puts `value` under `key`, losing nothing when the key is there already
/// (a heading or a `key: value` line written twice, a `text:` key beside
/// prose): two mappings merge (by the same rule), a list takes the value
/// in, anything else becomes a list of both. A key without a value
/// (`null`) gives way.
fn insert_keeping(map: &mut Map<String, Value>, key: String, value: Value) {
    match map.get_mut(&key) {
        None => {
            map.insert(key, value);
        }
        Some(old) => match (old, value) {
            (_, Value::Null) => {}
            (old @ Value::Null, value) => *old = value,
            (Value::Object(old), Value::Object(new)) => {
                for (k, v) in new {
                    insert_keeping(old, k, v);
                }
            }
            (Value::Array(old), Value::Array(new)) => old.extend(new),
            (Value::Array(old), value) => old.push(value),
            (old, value) => *old = Value::Array(vec![std::mem::take(old), value]),
        },
    }
}

/// Markdown to a value, with the lines kept as text (and text moved to
/// join a key written above it).
fn markdown(text: &str) -> (Value, Vec<(usize, String)>) {
    // A stack of (heading level, key, heading line, section); level 0 is
    // the root.
    let mut stack: Vec<(usize, String, usize, Section)> = vec![(0, String::new(), 0, Section::default())];
    let mut notes = Vec::new();
    let close = |stack: &mut Vec<(usize, String, usize, Section)>, notes: &mut Vec<(usize, String)>| {
        if stack.len() > 1
            && let Some((_, key, line, section)) = stack.pop()
            && let Some((_, _, _, parent)) = stack.last_mut()
        {
            parent.parts.push((line, Part::Field(key, section.into_value(notes))));
        }
    };
    for (n, line) in text.lines().enumerate() {
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.chars().all(|c| c == '-' || c == '=' || c == '*') {
            continue;
        }
        let hashes = trimmed.chars().take_while(|&c| c == '#').count();
        if hashes > 0 && trimmed[hashes..].starts_with(' ') {
            while stack.last().is_some_and(|(level, _, _, _)| *level >= hashes) && stack.len() > 1 {
                close(&mut stack, &mut notes);
            }
            let key = trimmed[hashes..].trim().trim_matches('*').trim().to_string();
            stack.push((hashes, key, n + 1, Section::default()));
            continue;
        }
        let Some((_, _, _, section)) = stack.last_mut() else { continue };
        if let Some((indent, item)) = list_item(line) {
            let value = match key_value(item) {
                Some((k, v)) if !v.is_empty() => {
                    let mut m = Map::new();
                    m.insert(k, Value::String(v));
                    Value::Object(m)
                }
                _ => Value::String(item.trim_matches('*').to_string()),
            };
            match section.last_item() {
                // A nested item: under the previous one.
                Some(last) if indent >= 2 => match last {
                    Value::Object(m) if m.len() == 1 => {
                        if let Some((_, v)) = m.iter_mut().next() {
                            match v {
                                Value::Array(a) => a.push(value),
                                other => *other = Value::Array(vec![std::mem::take(other), value]),
                            }
                        }
                    }
                    Value::String(s) => {
                        let mut m = Map::new();
                        m.insert(std::mem::take(s), Value::Array(vec![value]));
                        *last = Value::Object(m);
                    }
                    _ => section.parts.push((n + 1, Part::Item(value))),
                },
                _ => section.parts.push((n + 1, Part::Item(value))),
            }
        } else if let Some((k, v)) = key_value(line) {
            section.parts.push((n + 1, Part::Field(k, if v.is_empty() { Value::Null } else { Value::String(v) })));
        } else {
            notes.push((n + 1, format!("kept as text: {trimmed}")));
            section.parts.push((n + 1, Part::Text(trimmed.to_string())));
        }
    }
    while stack.len() > 1 {
        close(&mut stack, &mut notes);
    }
    let root = stack.pop().map(|(_, _, _, s)| s.into_value(&mut notes)).unwrap_or(Value::Null);
    // In line order (a move is noted when its section closes).
    notes.sort_by_key(|(line, _)| *line);
    (root, notes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A line of a world-book entry in Markdown or `key: value` form.
    fn line() -> impl Strategy<Value = String> {
        let word = "[a-z]{1,5}";
        prop_oneof![
            (1..4usize, word).prop_map(|(n, w)| format!("{} {w}", "#".repeat(n))),
            (prop_oneof![Just(""), Just("  "), Just("    ")], prop_oneof![Just("- "), Just("* "), Just("+ ")], word)
                .prop_map(|(i, m, w)| format!("{i}{m}{w}")),
            (word, word).prop_map(|(k, v)| format!("{k}: {v}")),
            (word, word).prop_map(|(k, v)| format!("**{k}**: {v}")),
            (word, word).prop_map(|(k, v)| format!("- {k}: {v}")),
            (prop_oneof![Just("text"), Just("items")], word).prop_map(|(k, v)| format!("{k}: {v}")),
            word.prop_map(|w| format!("{w} {w}x.")),
            word.prop_map(|w| format!("{w}:")),
            // What YAML would re-spell or drop: 1.1 booleans, number
            // spellings, comments, anchors and aliases.
            (
                word,
                prop_oneof![Just("1.10"), Just("007"), Just("y"), Just("no"), Just("1_000"), Just("on"), Just("0x1f")]
            )
                .prop_map(|(k, v)| format!("{k}: {v}")),
            (word, word, word).prop_map(|(k, v, c)| format!("{k}: {v} # {c}")),
            (word, word).prop_map(|(k, a)| format!("{k}: &{a} val")),
            (word, word).prop_map(|(k, a)| format!("{k}: *{a}")),
            Just(String::new()),
        ]
    }

    proptest! {
        /// "Kept as text, never dropped": every word of an entry is in its
        /// normalised text, whatever the entry repeats.
        #[test]
        fn no_word_is_lost(lines in proptest::collection::vec(line(), 1..12)) {
            let entry = lines.join("\n");
            let n = normalize_entry("e", &entry);
            for w in entry.split(|c: char| !c.is_alphanumeric()).filter(|w| !w.is_empty()) {
                prop_assert!(n.text.contains(w), "{w:?} lost from {entry:?}:\n{}", n.text);
            }
        }

        /// "Never moved silently": unless a move is reported, the prose,
        /// list items and values of an entry are in its normalised text in
        /// the order written. (Keys are left out: a key written twice in a
        /// row is written once, and `text`/`items` go where the normalised
        /// prose and lists are.)
        #[test]
        fn no_text_moves_unreported(lines in proptest::collection::vec(line(), 1..12)) {
            let entry = lines.join("\n");
            let n = normalize_entry("e", &entry);
            if n.kept.iter().any(|(_, why)| why.contains("joins the")) {
                // A move, reported: nothing more to check.
                return Ok(());
            }
            let mut at = 0;
            for line in entry.lines().filter(|l| !l.trim_start().starts_with('#')) {
                let said = match list_item(line) {
                    Some((_, item)) => key_value(item).map_or(item.to_string(), |(_, v)| v),
                    None => key_value(line).map_or(line.to_string(), |(_, v)| v),
                };
                for w in said.split(|c: char| !c.is_alphanumeric()).filter(|w| !w.is_empty()) {
                    let found = n.text.get(at..).and_then(|rest| rest.find(w));
                    prop_assert!(found.is_some(), "{w:?} moved in {entry:?}:\n{}\n{:?}", n.text, n.kept);
                    at += found.unwrap_or_default() + w.len();
                }
            }
        }
    }

    const FOREST: &str = "<location_forest>\n  name: Dark Forest\n  atmosphere: Eerie, misty\n  creatures:\n    - Shadow Wolves\n    - Forest Spirits\n  loot:\n    - Ancient Bark\n    - Moon Petals\n</location_forest>";

    /// Spec 003 §2.1.2: the same entry from JSON, badly indented YAML and
    /// Markdown.
    #[test]
    fn the_spec_example_from_every_format() {
        let json = r#"{"name": "Dark Forest", "atmosphere": "Eerie, misty", "creatures": ["Shadow Wolves", "Forest Spirits"], "loot": ["Ancient Bark", "Moon Petals"]}"#;
        let n = normalize_entry("location_forest", json);
        assert_eq!((n.format, n.text.as_str()), (EntryFormat::Json, FOREST));
        let yaml = "name: Dark Forest\natmosphere: Eerie, misty\ncreatures:\n    - Shadow Wolves\n    - Forest Spirits\nloot:\n- Ancient Bark\n- Moon Petals\n";
        let n = normalize_entry("location_forest", yaml);
        assert_eq!((n.format, n.text.as_str()), (EntryFormat::Yaml, FOREST));
        let md = "**name**: Dark Forest\n**atmosphere**: Eerie, misty\n## creatures\n- Shadow Wolves\n- Forest Spirits\n## loot\n* Ancient Bark\n* Moon Petals\n";
        let n = normalize_entry("location_forest", md);
        assert_eq!((n.format, n.text.as_str()), (EntryFormat::Markdown, FOREST), "{:?}", n.kept);
        assert!(n.kept.is_empty());
        let wrapped = format!("<location_forest>{json}</location_forest>");
        assert_eq!(normalize_entry("other", &wrapped).text, FOREST);
    }

    /// Prose among `key: value` lines stays in its place: an opening line
    /// is not moved after the fields.
    #[test]
    fn prose_keeps_its_place_among_the_fields() {
        let n = normalize_entry("inn", "The Snow Inn.\nkeeper: Old Bo\nrooms: 3");
        assert_eq!(n.format, EntryFormat::Markdown);
        assert_eq!(n.text, "<inn>\n  text: The Snow Inn.\n  keeper: Old Bo\n  rooms: \"3\"\n</inn>");
        assert_eq!(n.kept, [(1, "kept as text: The Snow Inn.".to_string())]);
        // Prose and lists after other keys join the first `text` and
        // `items`, and say so.
        let n = normalize_entry("inn", "The Snow Inn.\nkeeper: Old Bo\n- bed\nIt is cold.\nrooms: 3\n- hearth");
        assert_eq!(
            n.text,
            "<inn>\n  text:\n    - The Snow Inn.\n    - It is cold.\n  keeper: Old Bo\n  items:\n    - bed\n    - hearth\n  rooms: \"3\"\n</inn>"
        );
        assert_eq!(
            n.kept,
            [
                (1, "kept as text: The Snow Inn.".to_string()),
                (4, "kept as text: It is cold.".to_string()),
                (4, "text after other keys: joins the `text` above them".to_string()),
                (6, "a list after other keys: joins the `items` above them".to_string()),
            ]
        );
    }

    #[test]
    fn what_cannot_be_converted_is_kept_and_reported() {
        let n = normalize_entry("lore", "{\"name\": \"x\",");
        assert_eq!(n.format, EntryFormat::Text);
        assert!(n.text.contains("{\"name\": \"x\","));
        assert!(n.kept[0].1.contains("invalid JSON"));
        let n = normalize_entry("lore", "# Town\nThe town is old.\n- market\n  - fish stall\nmayor: Orin\n");
        assert_eq!(n.format, EntryFormat::Markdown);
        assert_eq!(
            n.value,
            Some(
                serde_json::json!({"Town": {"mayor": "Orin", "items": [{"market": ["fish stall"]}], "text": "The town is old."}})
            )
        );
        assert_eq!(n.kept, [(2, "kept as text: The town is old.".to_string())]);
        // In the order written: the prose first, where it was.
        assert_eq!(
            n.text,
            "<lore>\n  Town:\n    text: The town is old.\n    items:\n      - market:\n          - fish stall\n    mayor: Orin\n</lore>"
        );
        // A heading or key written twice, a `text:` key beside prose:
        // nothing is lost, and what joins a key above is reported.
        let n = normalize_entry("lore", "## A\n### B\nbee\n## A\nagain\nkey: one\nkey: two\ntext: three\nprose\n");
        assert_eq!(
            n.value,
            Some(serde_json::json!({"A": {"B": "bee", "text": ["again", "three", "prose"], "key": ["one", "two"]}}))
        );
        assert!(n.kept.contains(&(8, "`text` written again after other keys: joins the `text` above them".into())));
        // YAML that re-writing would change is read line by line.
        let n = normalize_entry("lore", "alive: y\nversion: 1.10 # the old one\n");
        assert_eq!(n.value, Some(serde_json::json!({"alive": "y", "version": "1.10 # the old one"})));
        assert!(n.kept[0].1.contains("re-indenting would change"), "{:?}", n.kept);
        // A comment that repeats a word of its line is text too.
        let n = normalize_entry("lore", "name: Bo # Bo\n");
        assert_eq!((n.format, n.value), (EntryFormat::Markdown, Some(serde_json::json!({"name": "Bo # Bo"}))));
        let n = normalize_entry("lore", "alive: y\nage: 007\n");
        assert_eq!((n.format, n.value), (EntryFormat::Yaml, Some(serde_json::json!({"alive": "y", "age": "007"}))));
        let n = normalize_entry("9 lives!", "Just a sentence.");
        assert_eq!((n.format, n.tag.as_str()), (EntryFormat::Text, "entry_9_lives_"));
        assert_eq!(n.text, "<entry_9_lives_>\n  Just a sentence.\n</entry_9_lives_>");
    }
}
