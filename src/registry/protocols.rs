//! `<use_protocol>` → the expected-structure registry (spec 003 §2.2.1,
//! §11.2 "generated automatically"): the protocols a prompt tells the
//! model to use decide which tags the parser expects in its answer.
//!
//! This module owns the protocol name table and the registry it builds (a
//! normal registry file: `extends = "filament"` with the tags of the
//! protocols the prompt did not declare left out, printable as TOML and
//! loadable with `spindle parse --registry`). It lives with the registry,
//! in the core, so that the proxy reads a request's declarations without
//! the prompt side; [`crate::prompt`] re-exports it.
//!
//! # Protocol names
//!
//! `thought` and `content` are always expected (`content` is mandatory).
//!
//! | `<use_protocol>` | tags it contributes |
//! |---|---|
//! | `variable_update_v2`, `variable_update`, `variable_update_v1` | `variable_update` |
//! | `tool_call`, `filament_tool_call`, `tool_call_v2`, `hermes`, `hermes_tool_call` | `tool_call` |
//! | `tam`, `tam_v1`, `tool_tam` | `tam` (`<\|[REQUEST_TOOL]\|>` blocks) |
//! | `action`, `action_v1`, `tool_action` | `action` (`<ACTION>` blocks) |
//! | `status_bar`, `status_bar_v1` | `status_bar` |
//! | `details` | `details` |
//! | `choice`, `choice_menu` | `choice` |
//! | `ui_component` | `ui_component` |
//! | `media` | `media` |
//! | `thought`, `cot`, `thinking`, `content` | nothing more (always there) |
//! | `attp` | the whole `attp` profile (ATTP is a whole-output format; it cannot be mixed with the others) |
//!
//! An unknown name contributes nothing and is reported.

use super::{Registry, RegistryError};

/// The protocol names, the tags each contributes, and a description.
pub const PROTOCOLS: &[(&str, &[&str], &str)] = &[
    ("variable_update_v2", &["variable_update"], "state changes as <variable_update> ops"),
    ("variable_update", &["variable_update"], "state changes as <variable_update> ops"),
    ("variable_update_v1", &["variable_update"], "state changes as <variable_update> ops"),
    ("tool_call", &["tool_call"], "Filament <tool_call> JSON calls"),
    ("filament_tool_call", &["tool_call"], "Filament <tool_call> JSON calls"),
    ("tool_call_v2", &["tool_call"], "Filament <tool_call> JSON calls"),
    ("hermes", &["tool_call"], "Hermes/Qwen <tool_call>{name, arguments}"),
    ("hermes_tool_call", &["tool_call"], "Hermes/Qwen <tool_call>{name, arguments}"),
    ("tam", &["tam"], "TAM <|[REQUEST_TOOL]|> blocks"),
    ("tam_v1", &["tam"], "TAM <|[REQUEST_TOOL]|> blocks"),
    ("tool_tam", &["tam"], "TAM <|[REQUEST_TOOL]|> blocks"),
    ("action", &["action"], "<ACTION> blocks"),
    ("action_v1", &["action"], "<ACTION> blocks"),
    ("tool_action", &["action"], "<ACTION> blocks"),
    ("status_bar", &["status_bar"], "a <status_bar>"),
    ("status_bar_v1", &["status_bar"], "a <status_bar>"),
    ("details", &["details"], "<details> summaries"),
    ("choice", &["choice"], "a <choice> menu"),
    ("choice_menu", &["choice"], "a <choice> menu"),
    ("ui_component", &["ui_component"], "embedded <ui_component>s"),
    ("media", &["media"], "<media> references"),
    ("thought", &[], "always expected"),
    ("cot", &[], "always expected"),
    ("thinking", &[], "always expected"),
    ("content", &[], "always expected"),
    ("attp", &[], "the whole attp profile"),
];

/// The registry a prompt's `<use_protocol>` lines build.
#[derive(Debug)]
pub struct ProtocolRegistry {
    /// The protocols declared, in order, as written.
    pub protocols: Vec<String>,
    /// Declared names the table does not know (they contribute nothing).
    pub unknown: Vec<String>,
    /// The registry file (TOML).
    pub toml: String,
    /// The registry.
    pub registry: Registry,
}

/// The protocol names of a prompt's `<use_protocol>` elements (several
/// names in one element may be separated by commas or whitespace).
pub fn declared_protocols(prompt: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = prompt;
    while let Some(i) = rest.find("<use_protocol>") {
        rest = &rest[i + "<use_protocol>".len()..];
        let end = rest.find("</use_protocol>").unwrap_or(rest.len());
        for name in rest[..end].split(|c: char| c == ',' || c.is_whitespace()) {
            let name = name.trim();
            if !name.is_empty() && !out.iter().any(|n| n == name) {
                out.push(name.to_string());
            }
        }
        rest = &rest[end..];
    }
    out
}

/// The registry for a prompt: `filament` without the tags of protocols the
/// prompt does not declare (or `attp` alone).
///
/// # Errors
///
/// The registry could not be built (a bug: the file is generated).
///
/// ```
/// use spindle::registry::registry_for;
///
/// let r = registry_for("<use_protocol>variable_update_v2</use_protocol>\n<use_protocol>status_bar</use_protocol>").unwrap();
/// let tags: Vec<&str> = r.registry.tags().iter().map(|t| t.name.as_str()).collect();
/// assert_eq!(tags, ["thought", "content", "variable_update", "status_bar"]);
/// ```
pub fn registry_for(prompt: &str) -> Result<ProtocolRegistry, RegistryError> {
    let protocols = declared_protocols(prompt);
    let mut unknown = Vec::new();
    let mut wanted: Vec<&str> = vec!["thought", "content"];
    let mut attp = false;
    for p in &protocols {
        let key = p.to_ascii_lowercase();
        match PROTOCOLS.iter().find(|(name, _, _)| *name == key) {
            Some(("attp", _, _)) => attp = true,
            Some((_, tags, _)) => wanted.extend(tags.iter().copied()),
            None => unknown.push(p.clone()),
        }
    }
    let names: Vec<String> = protocols.iter().map(|p| format!("{p:?}")).collect();
    let mut toml = format!(
        "# The expected structure of the answer to a prompt that declares\n# <use_protocol> {}\n",
        if names.is_empty() { "nothing".to_string() } else { names.join(", ") }
    );
    if !unknown.is_empty() {
        // Quoted as the declared names are: a control character written
        // as is would end the comment, and TOML refuses one there.
        let quoted: Vec<String> = unknown.iter().map(|u| format!("{u:?}")).collect();
        toml.push_str(&format!("# unknown protocols (nothing added): {}\n", quoted.join(", ")));
    }
    if attp && wanted.len() == 2 {
        toml.push_str("name = \"prompt\"\nextends = \"attp\"\n");
    } else {
        if attp {
            unknown.push("attp (a whole-output format; it cannot be mixed with the others, left out)".into());
            toml.push_str("# attp left out: it is a whole-output format and cannot be mixed with the others\n");
        }
        let without: Vec<String> = Registry::filament()
            .tags()
            .iter()
            .map(|t| t.name.clone())
            .filter(|n| !wanted.contains(&n.as_str()))
            .map(|n| format!("{n:?}"))
            .collect();
        toml.push_str(&format!("name = \"prompt\"\nextends = \"filament\"\nwithout = [{}]\n", without.join(", ")));
    }
    let registry = Registry::from_toml_str(&toml)?;
    Ok(ProtocolRegistry { protocols, unknown, toml, registry })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn declared_names_and_unknown_ones() {
        let p = "<use_protocol>variable_update_v2, tam</use_protocol>\n<use_protocol>sparkle</use_protocol><use_protocol>tam</use_protocol>";
        assert_eq!(declared_protocols(p), ["variable_update_v2", "tam", "sparkle"]);
        let r = registry_for(p).unwrap();
        assert_eq!(r.unknown, ["sparkle"]);
        let tags: Vec<&str> = r.registry.tags().iter().map(|t| t.name.as_str()).collect();
        assert_eq!(tags, ["thought", "content", "variable_update", "tam"]);
        assert!(Registry::from_toml_str(&r.toml).is_ok());
    }

    /// Whatever the declared names hold, the file is valid TOML.
    #[test]
    fn control_characters_in_names_stay_out_of_the_toml() {
        for p in [
            "<use_protocol>a\u{1}b tam</use_protocol>",
            "<use_protocol>a\u{7f}b</use_protocol>",
            "<use_protocol>\u{2028}x\u{85}</use_protocol>",
        ] {
            let r = registry_for(p);
            assert!(r.is_ok(), "{p:?}: {r:?}");
        }
    }

    #[test]
    fn nothing_declared_is_thought_and_content_and_attp_is_its_own() {
        let r = registry_for("no protocols here").unwrap();
        assert_eq!(r.registry.tags().len(), 2);
        let r = registry_for("<use_protocol>attp</use_protocol>").unwrap();
        assert!(r.toml.contains("extends = \"attp\""));
    }
}
