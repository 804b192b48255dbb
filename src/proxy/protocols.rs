//! A request's `<use_protocol>` declarations (spec 003 §2.2.1, §11.2: the
//! registry is "generated automatically" from them): the registry its
//! answer is parsed with, in place of the configured one.
//!
//! This module owns finding the declarations in a request body (the
//! system and developer messages of a chat request, Anthropic's `system`,
//! the Responses API's `instructions`) and a small cache of the registries
//! they build ([`crate::registry::registry_for`]). It must not change the
//! body: the request goes upstream as it came. Declarations in user or
//! assistant messages (a card's text pasted by a user, an earlier answer)
//! do not count.

use crate::registry::{Registry, declared_protocols, registry_for};
use serde::Deserialize;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

/// Whether a request's `<use_protocol>` declarations choose its registry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum UseProtocol {
    /// A request whose system prompt declares protocols is parsed with
    /// the registry they build (the default).
    #[default]
    Auto,
    /// Every request is parsed with the configured registry.
    Ignore,
}

/// The most registries kept (one per set of protocols declared); past it
/// the cache starts again.
const MAX_CACHED: usize = 64;

/// The registries built so far, by the protocols that built them.
#[derive(Debug, Default)]
pub(crate) struct Registries {
    built: Mutex<HashMap<Vec<String>, Arc<Registry>>>,
}

impl Registries {
    /// The registry the system prompt of the request `body` (JSON) asks
    /// for, or `None` when it declares nothing (or is not JSON).
    pub(crate) fn for_request(&self, body: &[u8]) -> Option<Arc<Registry>> {
        // Most requests declare nothing: no JSON is read for them.
        memchr::memmem::find(body, b"<use_protocol>")?;
        let request: Request = serde_json::from_slice(body).ok()?;
        let prompt = request.system_prompt();
        let mut protocols: Vec<String> = declared_protocols(&prompt).iter().map(|p| p.to_ascii_lowercase()).collect();
        if protocols.is_empty() {
            return None;
        }
        protocols.sort();
        protocols.dedup();
        let mut built = self.built.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(registry) = built.get(&protocols) {
            return Some(registry.clone());
        }
        // The file is generated from the table: it always builds.
        let registry = Arc::new(registry_for(&prompt).ok()?.registry);
        if built.len() >= MAX_CACHED {
            built.clear();
        }
        built.insert(protocols, registry.clone());
        Some(registry)
    }
}

/// The parts of a request body that hold its system prompt.
#[derive(Deserialize)]
struct Request {
    #[serde(default)]
    messages: Vec<Message>,
    /// Anthropic Messages.
    #[serde(default)]
    system: Option<Value>,
    /// OpenAI Responses.
    #[serde(default)]
    instructions: Option<Value>,
}

#[derive(Deserialize)]
struct Message {
    #[serde(default)]
    role: Option<String>,
    #[serde(default)]
    content: Option<Value>,
}

impl Request {
    /// The text of the system and developer messages, `system` and
    /// `instructions`, one after another.
    fn system_prompt(&self) -> String {
        let mut out = String::new();
        for text in [&self.system, &self.instructions].into_iter().flatten() {
            push_text(text, &mut out);
        }
        for m in &self.messages {
            if matches!(m.role.as_deref(), Some("system" | "developer"))
                && let Some(content) = &m.content
            {
                push_text(content, &mut out);
            }
        }
        out
    }
}

/// A content value's text: a string, or the `text` of its parts.
fn push_text(content: &Value, out: &mut String) {
    match content {
        Value::String(s) => {
            out.push_str(s);
            out.push('\n');
        }
        Value::Array(parts) => {
            for part in parts {
                if let Some(text) = part.get("text").and_then(Value::as_str) {
                    out.push_str(text);
                    out.push('\n');
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tags(r: &Registry) -> Vec<String> {
        r.tags().iter().map(|t| t.name.clone()).collect()
    }

    #[test]
    fn system_developer_system_field_and_instructions_count_and_others_do_not() {
        let registries = Registries::default();
        let declared = "<use_protocol>status_bar</use_protocol>";
        for body in [
            json!({"messages": [{"role": "system", "content": declared}, {"role": "user", "content": "hi"}]}),
            json!({"messages": [{"role": "developer", "content": [{"type": "text", "text": declared}]}]}),
            json!({"system": [{"type": "text", "text": declared}], "messages": []}),
            json!({"instructions": declared, "input": "hi"}),
        ] {
            let r = registries.for_request(body.to_string().as_bytes()).unwrap_or_else(|| panic!("{body}"));
            assert_eq!(tags(&r), ["thought", "content", "status_bar"], "{body}");
        }
        for body in [
            json!({"messages": [{"role": "user", "content": declared}]}),
            json!({"messages": [{"role": "system", "content": "no declarations"}]}),
            json!({"messages": [{"role": "system", "content": "<use_protocol></use_protocol>"}]}),
        ] {
            assert!(registries.for_request(body.to_string().as_bytes()).is_none(), "{body}");
        }
        assert!(registries.for_request(b"<use_protocol>status_bar</use_protocol> not json").is_none());
    }

    #[test]
    fn one_registry_per_set_of_protocols() {
        let registries = Registries::default();
        let body = |p: &str| json!({"messages": [{"role": "system", "content": p}]}).to_string();
        let a = registries.for_request(body("<use_protocol>choice, status_bar</use_protocol>").as_bytes());
        let b = registries
            .for_request(body("<use_protocol>STATUS_BAR</use_protocol><use_protocol>choice</use_protocol>").as_bytes());
        let (Some(a), Some(b)) = (a, b) else { panic!("both declare protocols") };
        assert!(Arc::ptr_eq(&a, &b));
        for i in 0..(MAX_CACHED * 2) {
            let name = format!("<use_protocol>custom_{i}</use_protocol>");
            assert!(registries.for_request(body(&name).as_bytes()).is_some());
        }
        assert!(registries.built.lock().map(|b| b.len()).unwrap_or(0) <= MAX_CACHED);
    }
}
