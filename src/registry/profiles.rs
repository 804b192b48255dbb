//! The built-in profiles, written in the same form a registry file takes so
//! that `extends = "filament"` and the built-ins share one path.

use super::{BodyKind, Markers, RegistryFile, TagFile};

/// The profile names [`super::Registry::profile`] knows.
pub(super) const NAMES: &[&str] = &["filament", "reasoning", "reasoning-prefilled", "chat", "tam", "action", "attp"];

/// The file form of a built-in profile.
pub(super) fn file_spec(name: &str) -> Option<RegistryFile> {
    match name.to_ascii_lowercase().as_str() {
        "filament" => Some(filament()),
        "reasoning" => Some(reasoning()),
        "reasoning-prefilled" => Some(reasoning_prefilled()),
        "chat" => Some(chat()),
        "tam" => Some(tam()),
        "action" => Some(action()),
        "attp" => Some(attp()),
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
    let tool_call = hermes_tool_call();
    let ui_component = TagFile { fallback_to_content: true, ..tag("ui_component", BodyKind::Json) };
    let choice = TagFile { aliases: vec!["xx".into()], ..tag("choice", BodyKind::Structured) };
    // A status bar's fields are free (spec 003 §3.3.1): a character's
    // `<thinking>` or current `<action>` is a field of it, not a thought
    // or an ACTION call block that ends the bar.
    let status_bar = TagFile {
        children: vec!["thought".into(), "think".into(), "thinking".into(), "action".into()],
        ..tag("status_bar", BodyKind::Structured)
    };
    RegistryFile {
        name: Some("filament".into()),
        extends: None,
        lead: Some("thought".into()),
        default: Some("content".into()),
        lead_prefilled: None,
        without: Vec::new(),
        tags: vec![
            thought,
            content,
            variable_update,
            tool_call,
            status_bar,
            tag("details", BodyKind::Structured),
            choice,
            ui_component,
            tag("media", BodyKind::Void),
            // Tool calls written as text (spec 002 §7.3: an agent's output
            // is scanned for call blocks whatever else it holds).
            tam_tag(),
            action_tag(),
        ],
    }
}

/// Chat-completion content as most OpenAI-compatible servers send it: a
/// plain answer, sometimes with a `<think>…</think>` block inside. Nothing
/// leads, so a plain answer streams as content with no repair; bare text
/// at the start closed by `</think>` is reclassified as a thought (a chat
/// template that already wrote `<think>`).
pub(super) fn chat() -> RegistryFile {
    let thought = TagFile {
        spelling: Some("think".into()),
        aliases: vec!["think".into(), "thinking".into(), "reasoning".into()],
        mergeable: true,
        ..tag("thought", BodyKind::Stream)
    };
    let content = TagFile { mergeable: true, bare: true, ..tag("content", BodyKind::Stream) };
    RegistryFile {
        name: Some("chat".into()),
        extends: None,
        lead: None,
        default: Some("content".into()),
        lead_prefilled: None,
        without: Vec::new(),
        tags: vec![thought, content, hermes_tool_call()],
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
        lead_prefilled: None,
        without: Vec::new(),
        tags: vec![thought, content, hermes_tool_call()],
    }
}

/// `<tool_call>{"name": …, "arguments": {…}}</tool_call>`, the call text of
/// Hermes/Qwen-style models: a JSON body, read leniently, shown as content
/// when even that fails. A `<tool_call>` ends an open thought (the Qwen3
/// behaviour vLLM and SGLang implement): it is top-level.
fn hermes_tool_call() -> TagFile {
    TagFile { fallback_to_content: true, ..tag("tool_call", BodyKind::Json) }
}

/// The `reasoning` profile for chat templates that already wrote `<think>`
/// (Qwen3 thinking, DeepSeek-R1-0528+, QwQ, GLM-4.5, OLMo-3, Nemotron): the
/// output starts inside the thought, and a thought that never closes stays
/// a thought.
pub(super) fn reasoning_prefilled() -> RegistryFile {
    RegistryFile { name: Some("reasoning-prefilled".into()), lead_prefilled: Some(true), ..reasoning() }
}

/// Free text around tool-call blocks: written without tags, opened by bare
/// text and closed silently by the next block (the tool-call profiles'
/// content).
fn bare_content() -> TagFile {
    TagFile { mergeable: true, bare: true, ..tag("content", BodyKind::Stream) }
}

/// The TAM tag (spec 000, spec 002 §5): canonical name `tam`, opened and
/// closed by the special markers `<|[REQUEST_TOOL]|>` / `<|[END_TOOL]|>`
/// (case-insensitive, spaces ignored, `-` for `_`). A registry file with
/// `extends = "filament"` can add the same tag to give Filament output TAM
/// blocks.
fn tam_tag() -> TagFile {
    TagFile {
        markers: Some(Markers { open: "REQUEST_TOOL".into(), close: "END_TOOL".into() }),
        ..tag("tam", BodyKind::Tam)
    }
}

/// Free text with TAM blocks in it (spec 000): the text is content, each
/// block one `tam` element.
pub(super) fn tam() -> RegistryFile {
    RegistryFile {
        name: Some("tam".into()),
        extends: None,
        lead: None,
        default: Some("content".into()),
        lead_prefilled: None,
        without: Vec::new(),
        tags: vec![bare_content(), tam_tag()],
    }
}

/// The ACTION tag (spec 004): `<ACTION> ... </ACTION>`, canonical name
/// `action`.
fn action_tag() -> TagFile {
    TagFile { spelling: Some("ACTION".into()), ..tag("action", BodyKind::Action) }
}

/// Free text with an `<ACTION>` block (spec 004): the text before it is the
/// response text, the block one `action` element.
pub(super) fn action() -> RegistryFile {
    let action = action_tag();
    RegistryFile {
        name: Some("action".into()),
        extends: None,
        lead: None,
        default: Some("content".into()),
        lead_prefilled: None,
        without: Vec::new(),
        tags: vec![bare_content(), action],
    }
}

/// Whole-output ATTP TOML (spec 001): the entire response is one `attp`
/// element, opened by the first non-space byte, closed at the end.
pub(super) fn attp() -> RegistryFile {
    let attp = TagFile { bare: true, ..tag("attp", BodyKind::Attp) };
    RegistryFile {
        name: Some("attp".into()),
        extends: None,
        lead: Some("attp".into()),
        default: Some("attp".into()),
        lead_prefilled: None,
        without: Vec::new(),
        tags: vec![attp],
    }
}
