//! The request side of tool calling: a chat request's `tools` become the
//! protocol's manual in the system message, and the history's native
//! calls and tool results become the protocol's text (see the table in
//! [`super`]). It owns the request JSON only; the texts are
//! [`crate::tools`]'.

use super::CallShape;
use crate::calls::ToolCatalog;
use crate::proxy::error::{ProxyError, ProxyErrorKind};
use crate::tools::{Protocol, call_text, manual, observation_text, place_manual};
use serde_json::{Map, Value, json};
use std::sync::Arc;

/// What the request asked of tools (`tool_choice`, or the legacy
/// `function_call`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ToolChoice {
    /// `"auto"` or absent.
    Auto,
    /// `"none"`.
    None,
    /// `"required"` (not in the legacy API).
    Required,
    /// `{"type": "function", "function": {"name": ...}}` (legacy:
    /// `{"name": ...}`).
    Named(String),
}

/// What the response side needs of a request that carried tools.
#[derive(Debug, Clone)]
pub(crate) struct ToolRequest {
    /// The tools the answer may call (all of them, or the named one).
    pub(crate) catalog: Arc<ToolCatalog>,
    /// The API the request used, which the response speaks.
    pub(crate) shape: CallShape,
}

/// A request after the tool translation.
#[derive(Debug)]
pub(crate) struct Prepared {
    /// The new body; `None` when nothing changed.
    pub(crate) body: Option<Vec<u8>>,
    /// Set when the response's calls are to become `tool_calls`.
    pub(crate) tools: Option<ToolRequest>,
}

/// `body` without a leading UTF-8 byte order mark, which some clients
/// write and JSON readers refuse.
pub(crate) fn without_bom(body: &[u8]) -> &[u8] {
    body.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(body)
}

fn invalid(param: &'static str, message: String) -> ProxyError {
    ProxyError::new(ProxyErrorKind::InvalidTools { param }, message)
}

/// Translates a chat request body for a model that speaks `protocol`. A
/// leading byte order mark is read past (and is not in a new body).
///
/// # Errors
///
/// `400 invalid_tools` for tools or a `tool_choice` that cannot be
/// rendered, or both `tools` and the legacy `functions` (see [`super`]).
pub(crate) fn prepare(body: &[u8], protocol: Protocol) -> Result<Prepared, ProxyError> {
    let unchanged = Prepared { body: None, tools: None };
    let mut doc = match serde_json::from_slice::<Value>(without_bom(body)) {
        Ok(Value::Object(doc)) => doc,
        // JSON nested past what the reader takes may hold tools: passed on
        // untranslated, the model would get neither them nor a manual.
        Err(e) if e.to_string().starts_with("recursion limit exceeded") => {
            return Err(invalid(
                "tools",
                "the request nests JSON deeper than 128 levels, which the tool-calling proxy cannot read".into(),
            ));
        }
        // Not a JSON object: the upstream answers it as it would.
        _ => return Ok(unchanged),
    };
    let tools = doc.shift_remove("tools");
    let choice_value = doc.shift_remove("tool_choice");
    let parallel = doc.shift_remove("parallel_tool_calls");
    let functions = doc.shift_remove("functions");
    let function_call = doc.shift_remove("function_call");
    let mut changed = [&tools, &choice_value, &parallel, &functions, &function_call].iter().any(|v| v.is_some());
    let given = |v: &Option<Value>| v.as_ref().is_some_and(|v| !v.is_null());
    let (shape, tools, choice_value) = match (given(&tools), given(&functions)) {
        (true, true) => {
            return Err(invalid(
                "functions",
                "the request has both tools and the legacy functions; send one of them".into(),
            ));
        }
        (false, true) => (CallShape::FunctionCall, functions.map(as_tools), function_call),
        _ => (CallShape::ToolCalls, tools, choice_value),
    };
    let (tools_param, choice_param) = (shape.tools_param(), shape.choice_param());
    let mut catalog = ToolCatalog::new();
    if let Some(tools) = tools.as_ref().filter(|t| !t.is_null()) {
        catalog
            .add_openai_tools(tools)
            .map_err(|e| invalid(tools_param, format!("the request's {tools_param}: {e}")))?;
    }
    let choice = read_choice(choice_value.as_ref(), shape)?;
    let allowed = match &choice {
        ToolChoice::Named(name) => {
            let Some(def) = catalog.get(name) else {
                let hint = catalog.suggest_tool(name).map(|s| format!(" (did you mean {s:?}?)")).unwrap_or_default();
                return Err(invalid(
                    choice_param,
                    format!("{choice_param} names {name:?}, which is not in {tools_param}{hint}"),
                ));
            };
            let mut only = ToolCatalog::new();
            only.add(def.clone()).map_err(|e| invalid(tools_param, e.to_string()))?;
            only
        }
        ToolChoice::Required if catalog.is_empty() => {
            return Err(invalid("tool_choice", "tool_choice is \"required\" but the request has no tools".into()));
        }
        _ => catalog,
    };
    let messages = doc.get_mut("messages").and_then(Value::as_array_mut);
    let mut tools_out = None;
    if let Some(messages) = messages {
        changed |= replay_history(messages, protocol);
        if !allowed.is_empty() && choice != ToolChoice::None {
            let mut text = manual(allowed.tools(), protocol);
            match &choice {
                ToolChoice::Required => text.push_str("\n\nYou must call at least one of these tools in your answer."),
                ToolChoice::Named(name) => {
                    text.push_str(&format!("\n\nYou must call the tool {name} in your answer."));
                }
                _ => {}
            }
            // The legacy API has one call per answer.
            if parallel == Some(Value::Bool(false)) || shape == CallShape::FunctionCall {
                text.push_str("\n\nCall at most one tool per answer.");
            }
            put_manual(messages, &text);
            changed = true;
            tools_out = Some(ToolRequest { catalog: Arc::new(allowed), shape });
        }
    }
    if !changed {
        return Ok(unchanged);
    }
    let body = serde_json::to_vec(&Value::Object(doc)).map_err(|e| invalid("messages", e.to_string()))?;
    Ok(Prepared { body: Some(body), tools: tools_out })
}

/// The legacy `functions` as `tools`: each function wrapped as a function
/// tool (anything but a list is left for the catalog to refuse).
fn as_tools(functions: Value) -> Value {
    match functions {
        Value::Array(list) => {
            Value::Array(list.into_iter().map(|f| json!({"type": "function", "function": f})).collect())
        }
        other => other,
    }
}

/// Reads `tool_choice`, or the legacy `function_call` (which has no
/// `"required"`), by `shape`.
fn read_choice(value: Option<&Value>, shape: CallShape) -> Result<ToolChoice, ProxyError> {
    let param = shape.choice_param();
    Ok(match value {
        None | Some(Value::Null) => ToolChoice::Auto,
        Some(Value::String(s)) => match (s.as_str(), shape) {
            ("auto", _) => ToolChoice::Auto,
            ("none", _) => ToolChoice::None,
            ("required", CallShape::ToolCalls) => ToolChoice::Required,
            (other, _) => {
                let known = match shape {
                    CallShape::ToolCalls => "auto, none, required",
                    CallShape::FunctionCall => "auto, none",
                };
                return Err(invalid(param, format!("unknown {param} {other:?} ({known})")));
            }
        },
        Some(v @ Value::Object(_)) => {
            let name = v.pointer("/function/name").or_else(|| v.get("name")).and_then(Value::as_str);
            match name {
                Some(n) => ToolChoice::Named(n.to_string()),
                None => {
                    let form = match shape {
                        CallShape::ToolCalls => "{\"type\": \"function\", \"function\": {\"name\": ...}}",
                        CallShape::FunctionCall => "{\"name\": ...}",
                    };
                    return Err(invalid(param, format!("{param} {v} names no function ({form})")));
                }
            }
        }
        Some(other) => return Err(invalid(param, format!("{param} {other} is not a string or an object"))),
    })
}

/// The text of a message's `content` (a string, or the text parts).
fn content_text(msg: &Value) -> String {
    match msg.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => {
            parts.iter().filter_map(|p| p.get("text").and_then(Value::as_str)).collect::<Vec<_>>().join("")
        }
        _ => String::new(),
    }
}

/// Rewrites assistant `tool_calls` (and legacy `function_call`) as call
/// text and runs of `role: "tool"` (and legacy `role: "function"`)
/// messages as observation text in a `user` message (see
/// [`put_observations`]). Returns whether anything changed.
fn replay_history(messages: &mut Vec<Value>, protocol: Protocol) -> bool {
    // (id, name, answered), in call order.
    let mut calls: Vec<(String, String, bool)> = Vec::new();
    let mut out: Vec<Value> = Vec::with_capacity(messages.len());
    let mut changed = false;
    let mut pending: Vec<String> = Vec::new();
    let flush = |pending: &mut Vec<String>, out: &mut Vec<Value>, next: Option<Value>| {
        if pending.is_empty() {
            out.extend(next);
        } else {
            put_observations(out, &pending.join("\n"), next);
            pending.clear();
        }
    };
    for mut msg in messages.drain(..) {
        let role = msg.get("role").and_then(Value::as_str).unwrap_or_default().to_string();
        match role.as_str() {
            "tool" | "function" => {
                changed = true;
                let id = msg.get("tool_call_id").and_then(Value::as_str).unwrap_or_default();
                let name = calls
                    .iter_mut()
                    .find(|(i, _, answered)| !*answered && i == id)
                    .map(|c| {
                        c.2 = true;
                        c.1.clone()
                    })
                    .or_else(|| msg.get("name").and_then(Value::as_str).map(str::to_string));
                pending.push(observation_text(protocol, &msg, name.as_deref()));
            }
            _ => {
                if role == "user" {
                    flush(&mut pending, &mut out, Some(msg));
                    continue;
                }
                flush(&mut pending, &mut out, None);
                if role == "assistant"
                    && let Value::Object(m) = &mut msg
                    && let Some(list) = take_calls(m)
                {
                    changed = true;
                    if list.is_empty() {
                        out.push(msg);
                        continue;
                    }
                    for c in &list {
                        let id = c.get("id").and_then(Value::as_str).unwrap_or_default().to_string();
                        let name = c.pointer("/function/name").and_then(Value::as_str).unwrap_or_default().to_string();
                        calls.push((id, name, false));
                    }
                    let text = call_text(protocol, &Value::Array(list));
                    let before = content_text(&Value::Object(m.clone()));
                    let content =
                        if before.trim().is_empty() { text } else { format!("{}\n{text}", before.trim_end()) };
                    m.insert("content".into(), Value::String(content));
                }
                out.push(msg);
            }
        }
    }
    flush(&mut pending, &mut out, None);
    *messages = out;
    changed
}

/// Takes an assistant message's calls out of it: its `tool_calls` list,
/// then its legacy `function_call` as one more entry. `None` when it has
/// neither.
fn take_calls(m: &mut Map<String, Value>) -> Option<Vec<Value>> {
    let mut list = None;
    if matches!(m.get("tool_calls"), Some(Value::Array(_)))
        && let Some(Value::Array(calls)) = m.shift_remove("tool_calls")
    {
        list = Some(calls);
    }
    if matches!(m.get("function_call"), Some(Value::Object(_)))
        && let Some(function) = m.shift_remove("function_call")
    {
        list.get_or_insert_with(Vec::new).push(json!({"type": "function", "function": function}));
    }
    list
}

fn is_user(msg: &Value) -> bool {
    msg.get("role").and_then(Value::as_str) == Some("user")
}

/// Puts a run of observations (`text`) into the history, then `next`, so
/// that no two user turns follow each other (the chat templates of
/// Mistral, Gemma and Llama 2 raise on that):
///
/// - after a user message (a client that sent tool results with no
///   assistant turn): at the end of its content;
/// - before a user message (`next`): at the start of its content;
/// - between two user messages: all in the first (its fields, and those
///   of the second it lacks);
/// - else: a user message of its own.
///
/// A blank line separates the observations from a user's text; the user
/// message's other fields (`name`) stay.
fn put_observations(out: &mut Vec<Value>, text: &str, next: Option<Value>) {
    let next_user = next.as_ref().is_some_and(is_user);
    match out.last_mut() {
        Some(Value::Object(before)) if before.get("role").and_then(Value::as_str) == Some("user") => {
            let content = add_text(before.shift_remove("content"), text, End::After);
            before.insert("content".into(), content);
            match next {
                Some(Value::Object(after)) if next_user => {
                    for (key, value) in after {
                        if key == "content" {
                            let content = joined(before.shift_remove("content"), value);
                            before.insert(key, content);
                        } else {
                            before.entry(key).or_insert(value);
                        }
                    }
                }
                next => out.extend(next),
            }
        }
        _ => match next {
            Some(Value::Object(mut after)) if next_user => {
                let content = add_text(after.shift_remove("content"), text, End::Before);
                after.insert("content".into(), content);
                out.push(Value::Object(after));
            }
            next => {
                out.push(json!({"role": "user", "content": text}));
                out.extend(next);
            }
        },
    }
}

/// Where [`add_text`] puts its text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// Before the content.
    Before,
    /// After the content.
    After,
}

/// A message's `content` with `text` added at one end, a blank line
/// between: a string stays a string; a list of parts gets a text part
/// (image and other parts stay as they are).
fn add_text(content: Option<Value>, text: &str, end: End) -> Value {
    match content {
        None | Some(Value::Null) => Value::String(text.to_string()),
        Some(Value::String(s)) if s.is_empty() => Value::String(text.to_string()),
        Some(Value::Array(mut parts)) => {
            let part = match (end, parts.is_empty()) {
                (_, true) => text.to_string(),
                (End::Before, false) => format!("{text}\n\n"),
                (End::After, false) => format!("\n\n{text}"),
            };
            let part = json!({"type": "text", "text": part});
            match end {
                End::Before => parts.insert(0, part),
                End::After => parts.push(part),
            }
            Value::Array(parts)
        }
        Some(other) => {
            let s = match other {
                Value::String(s) => s,
                other => other.to_string(),
            };
            Value::String(match end {
                End::Before => format!("{text}\n\n{s}"),
                End::After => format!("{s}\n\n{text}"),
            })
        }
    }
}

/// Two user messages' contents as one, a blank line between.
fn joined(first: Option<Value>, second: Value) -> Value {
    match second {
        Value::Null => first.unwrap_or(Value::Null),
        Value::String(s) if s.is_empty() => first.unwrap_or(Value::Null),
        Value::String(s) => add_text(first, &s, End::After),
        Value::Array(mut parts) => match first {
            Some(Value::Array(mut before)) => {
                if !before.is_empty() && !parts.is_empty() {
                    before.push(json!({"type": "text", "text": "\n\n"}));
                }
                before.append(&mut parts);
                Value::Array(before)
            }
            None | Some(Value::Null) => Value::Array(parts),
            Some(Value::String(s)) if s.is_empty() => Value::Array(parts),
            Some(other) => {
                let s = match other {
                    Value::String(s) => s,
                    other => other.to_string(),
                };
                add_text(Some(Value::Array(parts)), &s, End::Before)
            }
        },
        other => add_text(first, &other.to_string(), End::After),
    }
}

/// Puts the manual into the first system (or developer) message: in place
/// of a `{{AVAILABLE_TOOLS}}` placeholder when it has one, else after its
/// text; a new system message first when there is none.
fn put_manual(messages: &mut Vec<Value>, manual: &str) {
    let system =
        messages.iter_mut().find(|m| matches!(m.get("role").and_then(Value::as_str), Some("system" | "developer")));
    let Some(Value::Object(sys)) = system else {
        messages.insert(0, json!({"role": "system", "content": manual}));
        return;
    };
    match sys.get_mut("content") {
        Some(Value::String(text)) => *text = place_manual(text, manual).0,
        Some(Value::Array(parts)) => parts.push(json!({"type": "text", "text": format!("\n\n{manual}")})),
        _ => {
            sys.insert("content".into(), Value::String(manual.to_string()));
        }
    }
}

/// The tools a request names, for tests and logs.
#[cfg(test)]
fn names(catalog: &ToolCatalog) -> Vec<String> {
    catalog.tools().map(|t| t.id.clone()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weather() -> Value {
        json!([{"type": "function", "function": {"name": "get_weather", "description": "Weather now",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
            {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}])
    }

    fn run(body: Value, protocol: Protocol) -> Result<(Value, Option<ToolRequest>), ProxyError> {
        let bytes = serde_json::to_vec(&body).unwrap_or_default();
        let p = prepare(&bytes, protocol)?;
        let out = p.body.map_or(body, |b| serde_json::from_slice(&b).unwrap_or(Value::Null));
        Ok((out, p.tools))
    }

    #[test]
    fn no_tools_no_change() {
        let body = br#"{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}"#;
        let p = prepare(body, Protocol::Hermes).unwrap_or_else(|e| panic!("{e}"));
        assert!(p.body.is_none() && p.tools.is_none());
    }

    #[test]
    fn a_byte_order_mark_is_read_past() {
        let body = json!({"model": "m", "tools": weather(), "messages": [{"role": "user", "content": "hi"}]});
        let mut bytes = b"\xEF\xBB\xBF".to_vec();
        bytes.extend(serde_json::to_vec(&body).unwrap_or_default());
        let p = prepare(&bytes, Protocol::Hermes).unwrap_or_else(|e| panic!("{e}"));
        let sent = p.body.unwrap_or_default();
        assert!(sent.starts_with(b"{"), "the new body has no BOM");
        let sent: Value = serde_json::from_slice(&sent).unwrap_or_default();
        assert!(sent.get("tools").is_none() && sent["messages"][0]["role"] == "system", "{sent}");
        assert!(p.tools.is_some());
    }

    #[test]
    fn hermes_manual_goes_into_a_new_system_message() {
        let body = json!({"model": "m", "tools": weather(), "tool_choice": "auto",
            "messages": [{"role": "user", "content": "Weather in Oslo?"}]});
        let (out, tools) = run(body, Protocol::Hermes).unwrap_or_else(|e| panic!("{e}"));
        assert!(out.get("tools").is_none() && out.get("tool_choice").is_none());
        let sys = out["messages"][0]["content"].as_str().unwrap_or_default();
        assert_eq!(out["messages"][0]["role"], "system");
        assert!(sys.contains("<tools>\n{\"type\":\"function\",\"function\":{\"name\":\"get_weather\""), "{sys}");
        assert!(
            sys.contains("<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>")
        );
        assert_eq!(out["messages"][1]["content"], "Weather in Oslo?");
        assert_eq!(names(&tools.map(|t| t.catalog).unwrap_or_default()), ["get_weather", "get_time"]);
    }

    #[test]
    fn manual_appends_to_the_system_message_or_fills_its_placeholder() {
        let body = json!({"model": "m", "tools": weather(),
            "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]});
        let (out, _) = run(body, Protocol::Tam).unwrap_or_else(|e| panic!("{e}"));
        let sys = out["messages"][0]["content"].as_str().unwrap_or_default();
        assert!(sys.starts_with("Be brief.\n\n") && sys.contains("- Tool ID: get_weather"), "{sys}");
        assert_eq!(out["messages"].as_array().map(Vec::len), Some(2));
        let body = json!({"model": "m", "tools": weather(),
            "messages": [{"role": "system", "content": "Tools:\n{{AVAILABLE_TOOLS}}\nEnd."}]});
        let (out, _) = run(body, Protocol::Action).unwrap_or_else(|e| panic!("{e}"));
        let sys = out["messages"][0]["content"].as_str().unwrap_or_default();
        assert!(
            sys.starts_with("Tools:\n") && sys.ends_with("\nEnd.") && !sys.contains("{{AVAILABLE_TOOLS}}"),
            "{sys}"
        );
    }

    #[test]
    fn history_becomes_call_and_observation_text() {
        let body = json!({"model": "m", "tools": weather(), "messages": [
            {"role": "user", "content": "Weather in Oslo and the time?"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"}},
                {"id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
            {"role": "tool", "tool_call_id": "call_1", "content": "12:00"}]});
        let (out, _) = run(body.clone(), Protocol::Hermes).unwrap_or_else(|e| panic!("{e}"));
        let msgs = out["messages"].as_array().cloned().unwrap_or_default();
        assert_eq!(msgs.len(), 4, "{msgs:?}");
        assert_eq!(msgs[2]["role"], "assistant");
        assert!(msgs[2].get("tool_calls").is_none());
        assert_eq!(
            msgs[2]["content"],
            "<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Oslo\"}}\n</tool_call>\n<tool_call>\n{\"name\":\"get_time\",\"arguments\":{}}\n</tool_call>"
        );
        assert_eq!(msgs[3]["role"], "user");
        assert_eq!(
            msgs[3]["content"],
            "<tool_response>\nsunny\n</tool_response>\n<tool_response>\n12:00\n</tool_response>"
        );
        // Two calls with one id: the results answer them in order.
        let (out, _) = run(body, Protocol::Action).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            out["messages"][3]["content"],
            "Observation: Tool get_weather executed successfully. Result: sunny\nObservation: Tool get_time executed successfully. Result: 12:00"
        );
    }

    /// The roles of a translated history, in order.
    fn roles(out: &Value) -> Vec<String> {
        let msgs = out["messages"].as_array().cloned().unwrap_or_default();
        msgs.iter().map(|m| m["role"].as_str().unwrap_or_default().to_string()).collect()
    }

    #[test]
    fn observations_merge_with_a_user_message_next_to_them() {
        let call = json!({"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
            "function": {"name": "get_time", "arguments": "{}"}}]});
        let result = json!({"role": "tool", "tool_call_id": "c1", "content": "12:00"});
        let obs = "<tool_response>\n12:00\n</tool_response>";
        // A user message after the run: one user turn, the observation first.
        let body = json!({"tools": weather(), "messages": [{"role": "user", "content": "Time?"}, call, result,
            {"role": "user", "name": "ann", "content": "And in Oslo?"}]});
        let (out, _) = run(body, Protocol::Hermes).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(roles(&out), ["system", "user", "assistant", "user"]);
        assert_eq!(
            out["messages"][3],
            json!({"role": "user", "name": "ann", "content": format!("{obs}\n\nAnd in Oslo?")})
        );
        // Content parts: a text part first, the image kept.
        let image = json!({"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}});
        let body = json!({"tools": weather(), "messages": [call, result,
            {"role": "user", "content": [{"type": "text", "text": "What is this?"}, image]}]});
        let (out, _) = run(body, Protocol::Hermes).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(roles(&out), ["system", "assistant", "user"]);
        assert_eq!(
            out["messages"][2]["content"],
            json!([{"type": "text", "text": format!("{obs}\n\n")}, {"type": "text", "text": "What is this?"}, image])
        );
        // Tool results with no assistant turn, after a user message: after its text.
        let body = json!({"tools": weather(), "messages": [{"role": "user", "content": "Time?"}, result]});
        let (out, _) = run(body, Protocol::Hermes).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(roles(&out), ["system", "user"]);
        assert_eq!(out["messages"][1]["content"], format!("Time?\n\n{obs}"));
        let body = json!({"tools": weather(), "messages": [{"role": "user", "content": [image]}, result]});
        let (out, _) = run(body, Protocol::Hermes).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(out["messages"][1]["content"], json!([image, {"type": "text", "text": format!("\n\n{obs}")}]));
        // A user message on each side: one message.
        let body = json!({"tools": weather(), "messages": [{"role": "user", "content": "Time?"}, result,
            {"role": "user", "name": "ann", "content": "Thanks."}]});
        let (out, _) = run(body, Protocol::Hermes).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(roles(&out), ["system", "user"]);
        assert_eq!(
            out["messages"][1],
            json!({"role": "user", "content": format!("Time?\n\n{obs}\n\nThanks."), "name": "ann"})
        );
        // Next to no user message: a user message of its own.
        let body = json!({"tools": weather(), "messages": [{"role": "system", "content": "Hi."}, call,
            result, {"role": "assistant", "content": "Noon."}]});
        let (out, _) = run(body, Protocol::Hermes).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(roles(&out), ["system", "assistant", "user", "assistant"]);
        assert_eq!(out["messages"][2], json!({"role": "user", "content": obs}));
    }

    /// The legacy functions of `weather()`.
    fn functions() -> Value {
        Value::Array(weather().as_array().into_iter().flatten().map(|t| t["function"].clone()).collect())
    }

    #[test]
    fn legacy_functions_are_tools() {
        let msgs = json!([{"role": "user", "content": "hi"}]);
        for choice in [None, Some(json!("auto"))] {
            let mut body = json!({"model": "m", "functions": functions(), "messages": msgs});
            if let Some(choice) = choice {
                body["function_call"] = choice;
            }
            let (out, tools) = run(body, Protocol::Hermes).unwrap_or_else(|e| panic!("{e}"));
            assert!(out.get("functions").is_none() && out.get("function_call").is_none(), "{out}");
            let sys = out["messages"][0]["content"].as_str().unwrap_or_default();
            assert!(sys.contains("\"name\":\"get_weather\"") && sys.contains("get_time"), "{sys}");
            assert!(sys.ends_with("Call at most one tool per answer."), "one call per answer: {sys}");
            let tools = tools.unwrap_or_else(|| panic!("no tools"));
            assert_eq!(tools.shape, CallShape::FunctionCall);
            assert_eq!(names(&tools.catalog), ["get_weather", "get_time"]);
        }
        let named = json!({"functions": functions(), "function_call": {"name": "get_time"}, "messages": msgs});
        let (out, tools) = run(named, Protocol::Hermes).unwrap_or_else(|e| panic!("{e}"));
        let sys = out["messages"][0]["content"].as_str().unwrap_or_default();
        assert!(sys.contains("You must call the tool get_time") && !sys.contains("get_weather"), "{sys}");
        assert_eq!(names(&tools.map(|t| t.catalog).unwrap_or_default()), ["get_time"]);
        let none = json!({"functions": functions(), "function_call": "none", "messages": msgs});
        let (out, tools) = run(none, Protocol::Hermes).unwrap_or_else(|e| panic!("{e}"));
        assert!(tools.is_none() && out.get("functions").is_none() && out.get("function_call").is_none());
        assert_eq!(out["messages"], msgs, "no manual for none");
        // Native requests keep their shape.
        let (_, tools) =
            run(json!({"tools": weather(), "messages": msgs}), Protocol::Hermes).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(tools.map(|t| t.shape), Some(CallShape::ToolCalls));
        for (body, param) in [
            (json!({"tools": weather(), "functions": functions(), "messages": msgs}), "functions"),
            (json!({"functions": functions(), "function_call": "required", "messages": msgs}), "function_call"),
            (
                json!({"functions": functions(), "function_call": {"name": "get_wether"}, "messages": msgs}),
                "function_call",
            ),
            (json!({"functions": functions(), "function_call": {"nom": "x"}, "messages": msgs}), "function_call"),
            (json!({"functions": [{"description": "no name"}], "messages": msgs}), "functions"),
            (json!({"functions": {"name": "f"}, "messages": msgs}), "functions"),
        ] {
            let err = run(body.clone(), Protocol::Hermes).err().unwrap_or_else(|| panic!("accepted {body}"));
            assert_eq!((err.status(), err.code()), (400, "invalid_tools"), "{body}");
            assert_eq!(err.to_json()["error"]["param"], param, "{body}: {err}");
        }
    }

    #[test]
    fn legacy_function_call_history_replays_as_call_text() {
        let body = json!({"functions": functions(), "messages": [
            {"role": "user", "content": "Weather in Oslo?"},
            {"role": "assistant", "content": null,
                "function_call": {"name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"}},
            {"role": "function", "name": "get_weather", "content": "sunny"},
            {"role": "assistant", "content": "Sunny."}]});
        let (out, _) = run(body.clone(), Protocol::Hermes).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(roles(&out), ["system", "user", "assistant", "user", "assistant"]);
        let call = &out["messages"][2];
        assert!(call.get("function_call").is_none(), "{call}");
        assert_eq!(
            call["content"],
            "<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Oslo\"}}\n</tool_call>"
        );
        assert_eq!(out["messages"][3]["content"], "<tool_response>\nsunny\n</tool_response>");
        let (out, _) = run(body, Protocol::Tam).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            out["messages"][2]["content"],
            "<|[REQUEST_TOOL]|>\ncommand:»»»get_weather«««\ncity:»»»Oslo«««\n<|[END_TOOL]|>"
        );
        assert_eq!(out["messages"][3]["content"], "Observation: Tool get_weather executed successfully. Result: sunny");
    }

    #[test]
    fn tool_choice_cases() {
        let msgs = json!([{"role": "user", "content": "hi"}]);
        let (out, tools) = run(json!({"tools": weather(), "tool_choice": "none", "messages": msgs}), Protocol::Hermes)
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(tools.is_none() && out.get("tools").is_none());
        assert_eq!(out["messages"].as_array().map(Vec::len), Some(1), "no manual for none");
        let (out, _) = run(json!({"tools": weather(), "tool_choice": "required", "messages": msgs}), Protocol::Hermes)
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            out["messages"][0]["content"]
                .as_str()
                .unwrap_or_default()
                .ends_with("at least one of these tools in your answer.")
        );
        let named = json!({"type": "function", "function": {"name": "get_time"}});
        let (out, tools) = run(json!({"tools": weather(), "tool_choice": named, "messages": msgs}), Protocol::Hermes)
            .unwrap_or_else(|e| panic!("{e}"));
        let sys = out["messages"][0]["content"].as_str().unwrap_or_default();
        assert!(sys.contains("get_time") && !sys.contains("get_weather"), "{sys}");
        assert_eq!(names(&tools.map(|t| t.catalog).unwrap_or_default()), ["get_time"]);
        for (body, param) in [
            (
                json!({"tools": weather(), "tool_choice": {"type": "function", "function": {"name": "get_wether"}}, "messages": msgs}),
                "tool_choice",
            ),
            (json!({"tool_choice": "required", "messages": msgs}), "tool_choice"),
            (json!({"tools": weather(), "tool_choice": "sometimes", "messages": msgs}), "tool_choice"),
            (
                json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": 17}}}}}], "messages": msgs}),
                "tools",
            ),
            (json!({"tools": [{"type": "retrieval"}], "messages": msgs}), "tools"),
            (json!({"tools": [weather()[0].clone(), weather()[0].clone()], "messages": msgs}), "tools"),
        ] {
            let err = run(body.clone(), Protocol::Hermes).err().unwrap_or_else(|| panic!("accepted {body}"));
            assert_eq!(err.status(), 400);
            assert_eq!(err.to_json()["error"]["param"], param, "{body}: {err}");
            assert_eq!(err.code(), "invalid_tools");
        }
    }
}
