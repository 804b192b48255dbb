//! The built-in profiles, written in the same form a registry file takes so
//! that `extends = "filament"` and the built-ins share one path.

use super::{BodyKind, RegistryFile, TagFile};

/// The profile names [`super::Registry::profile`] knows.
pub(super) const NAMES: &[&str] = &["filament", "reasoning"];

/// The file form of a built-in profile.
pub(super) fn file_spec(name: &str) -> Option<RegistryFile> {
    match name.to_ascii_lowercase().as_str() {
        "filament" => Some(filament()),
        "reasoning" => Some(reasoning()),
        _ => None,
    }
}

fn tag(name: &str, body: BodyKind) -> TagFile {
    TagFile::new(name, body)
}

/// Spec 003 §3 with the legacy names of §5 and §6.2.
pub(super) fn filament() -> RegistryFile {
    let thought = TagFile {
        aliases: vec!["think".into(), "thinking".into()],
        mergeable: true,
        ..tag("thought", BodyKind::Stream)
    };
    let content = TagFile { mergeable: true, mandatory: true, ..tag("content", BodyKind::Stream) };
    let variable_update = TagFile {
        aliases: vec!["state_update".into(), "UpdateVariable".into()],
        after: vec!["content".into()],
        children: vec!["analysis".into()],
        fallback_to_content: true,
        ..tag("variable_update", BodyKind::Structured)
    };
    let tool_call = TagFile { fallback_to_content: true, ..tag("tool_call", BodyKind::Json) };
    let ui_component = TagFile { fallback_to_content: true, ..tag("ui_component", BodyKind::Json) };
    let choice = TagFile { aliases: vec!["xx".into()], ..tag("choice", BodyKind::Structured) };
    RegistryFile {
        name: Some("filament".into()),
        extends: None,
        lead: Some("thought".into()),
        default: Some("content".into()),
        tags: vec![
            thought,
            content,
            variable_update,
            tool_call,
            tag("status_bar", BodyKind::Structured),
            tag("details", BodyKind::Structured),
            choice,
            ui_component,
            tag("media", BodyKind::Void),
        ],
    }
}

/// DeepSeek-R1 style: `<think>` leads (and is often missing because the chat
/// template already wrote it), the answer follows `</think>` untagged.
pub(super) fn reasoning() -> RegistryFile {
    let thought = TagFile {
        spelling: Some("think".into()),
        aliases: vec!["think".into(), "thinking".into(), "reasoning".into()],
        mergeable: true,
        ..tag("thought", BodyKind::Stream)
    };
    let content = TagFile { mergeable: true, mandatory: true, bare: true, ..tag("content", BodyKind::Stream) };
    RegistryFile {
        name: Some("reasoning".into()),
        extends: None,
        lead: Some("thought".into()),
        default: Some("content".into()),
        tags: vec![thought, content],
    }
}
