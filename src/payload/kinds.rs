//! The payloads of the presentation and call tags (spec 003 §3.2.2, §3.3):
//! tool_call, ui_component, media, choice, details, status_bar, and
//! registry tags without a built-in payload.
//!
//! Each function reads one completed element and returns its [`Payload`];
//! none of them sees other elements or changes structure.

use super::tree::{self, ElementNode, Node};
use super::{Payload, diag, object, read_json};
use crate::calls::stream::{ARG_KEYS, NAME_KEYS};
use crate::event::DiagnosticCode;
use crate::event::{Element, Level};
use crate::registry::BodyKind;
use serde_json::{Map, Value, json};

/// An attribute of the element, by any of `names` (case-insensitive).
fn attr<'a>(el: &'a Element, names: &[&str]) -> Option<&'a str> {
    names.iter().find_map(|n| el.attrs.iter().find(|(k, _)| k.eq_ignore_ascii_case(n)).map(|(_, v)| v.as_str()))
}

/// Takes the first key of `names` present in `map` out of it.
fn take(map: &mut Map<String, Value>, names: &[&str]) -> Option<Value> {
    names.iter().find_map(|n| map.shift_remove(*n))
}

/// `<tool_call name="x">{json}</tool_call>`, the Hermes form
/// `<tool_call>{"name": "x", "arguments": {..}}</tool_call>`, Qwen3-Coder's
/// `<tool_call><function=x><parameter=k>v</parameter></function></tool_call>`
/// ([`function_call`]) or GLM's
/// `<tool_call>x<arg_key>k</arg_key><arg_value>v</arg_value></tool_call>`
/// ([`arg_key_call`]): `{name, arguments}`.
pub(crate) fn tool_call(el: &Element) -> Payload {
    if let Some(payload) = function_call(el).or_else(|| arg_key_call(el)) {
        return payload;
    }
    let one = named_json(
        el,
        NamedJson {
            tag: "tool_call",
            name_key: "name",
            name_attrs: NAME_KEYS,
            body_names: NAME_KEYS,
            body_args: ARG_KEYS,
            args_key: "arguments",
            not_object: DiagnosticCode::ArgumentsNotObject,
            without_name: DiagnosticCode::ToolCallWithoutName,
        },
    );
    // Text after the call, or a body that is a list: perhaps several calls
    // in one element (looked at only then: the common body is one call).
    let suspect = one.diagnostics.iter().any(|d| d.code == DiagnosticCode::JsonSurroundingProse)
        || one.value.get("arguments").is_some_and(Value::is_array);
    match suspect.then(|| several_calls(el)).flatten().or_else(|| openai_form(&one)) {
        Some(read) => read,
        None => one,
    }
}

/// The name and arguments of one call object: `{"name", "arguments"}` (or
/// another of the name and argument keys, the arguments as a JSON string
/// too), or OpenAI's wire form `{"type": "function", "function": {"name",
/// "arguments"}}`. `None` when it names no tool.
fn call_parts(mut map: Map<String, Value>, out: &mut Payload) -> Option<(String, Value)> {
    let Some(name) = NAME_KEYS.iter().find_map(|k| map.get(*k).and_then(Value::as_str).map(str::to_string)) else {
        return match map.shift_remove("function") {
            Some(Value::Object(function)) if function.get("name").is_some_and(Value::is_string) => {
                call_parts(function, out)
            }
            _ => None,
        };
    };
    take(&mut map, NAME_KEYS);
    let args = match ARG_KEYS.iter().find(|k| map.contains_key(**k)) {
        Some(k) => unwrap_args(map.shift_remove(*k).unwrap_or(Value::Null), out),
        None => Value::Object(map),
    };
    Some((name, args))
}

/// OpenAI's wire form written inside the tag, `<tool_call>{"type":
/// "function", "function": {"name": "f", "arguments": "{…}"}}</tool_call>`,
/// as the call it describes. `None` for any other payload.
fn openai_form(one: &Payload) -> Option<Payload> {
    if !one.value.get("name").is_some_and(Value::is_null) {
        return None;
    }
    let Some(Value::Object(body)) = one.value.get("arguments") else { return None };
    if !body.get("function").is_some_and(Value::is_object) {
        return None;
    }
    let mut out = Payload::none();
    out.diagnostics =
        one.diagnostics.iter().filter(|d| d.code != DiagnosticCode::ToolCallWithoutName).cloned().collect();
    let (name, args) = call_parts(body.clone(), &mut out)?;
    out.value = object!([("name", Value::String(name)), ("arguments", args)]);
    Some(out)
}

/// Several calls in one `<tool_call>` body, as models write them: one
/// JSON object after another, or a list of them. The payload is the first
/// call's `{name, arguments}` with the others in `more_calls` (each a
/// `{name, arguments}` too), and an info `several_calls` says so. `None`
/// unless every value is an object that names a tool, there is no name
/// attribute, and there is more than one call or a list.
fn several_calls(el: &Element) -> Option<Payload> {
    if attr(el, NAME_KEYS).is_some() {
        return None;
    }
    let (values, leniencies) = super::json::parse_values(&el.text).ok()?;
    let listed = matches!(values.as_slice(), [Value::Array(_)]);
    let values = match values.as_slice() {
        [Value::Array(items)] => items.clone(),
        _ => values,
    };
    if values.len() < 2 && !listed {
        return None;
    }
    let mut out = Payload::none();
    out.diagnostics.extend(super::leniency_diagnostics(&leniencies, 0));
    let mut calls = Vec::with_capacity(values.len());
    for value in values {
        let Value::Object(map) = value else { return None };
        let (name, args) = call_parts(map, &mut out)?;
        calls.push(object!([("name", Value::String(name)), ("arguments", args)]));
    }
    let message = format!("the <tool_call> body holds {} calls; each is read as a call of its own", calls.len());
    out.diagnostics.push(diag(Level::Info, DiagnosticCode::SeveralCalls, &message));
    let mut calls = calls.into_iter();
    let Some(Value::Object(mut first)) = calls.next() else { return None };
    let more: Vec<Value> = calls.collect();
    if !more.is_empty() {
        first.insert("more_calls".into(), Value::Array(more));
    }
    out.value = Value::Object(first);
    Some(out)
}

/// Qwen3-Coder's call form, the body of a `<tool_call>` without a name
/// attribute that begins with `<function=`:
///
/// ```text
/// <function=get_weather>
/// <parameter=city>
/// Paris
/// </parameter>
/// </function>
/// ```
///
/// Each parameter's value is its text as a string, without the one line
/// break after the open tag and before the close (a tool's schema gives
/// it its type when the call is checked, as Qwen's own template and
/// vLLM's reader do); `<function=x>{json}</function>` has JSON arguments.
/// A missing `</parameter>` ends at the next parameter or the function's
/// end, a missing `</function>` at the body's. `None` for any other body.
fn function_call(el: &Element) -> Option<Payload> {
    const OPEN: &str = "<function=";
    if attr(el, NAME_KEYS).is_some() {
        return None;
    }
    let body = el.text.trim_start().strip_prefix(OPEN)?;
    let (name, rest) = body.split_once('>')?;
    let name = name.trim();
    let inner = rest.split_once("</function>").map_or(rest, |(inner, _)| inner);
    let mut out = Payload::none();
    let args = if inner.trim_start().starts_with('{') {
        match read_json(inner.trim(), 0, &mut out.diagnostics) {
            Ok(value) => value,
            Err(e) => {
                let why =
                    format!("the arguments of <function={}> are not JSON, even read leniently: {e}", cut(name, 60));
                return Some(Payload::failed(out.diagnostics, &why, json!({})));
            }
        }
    } else {
        let mut map = Map::new();
        let mut rest = inner;
        while let Some(start) = rest.find("<parameter=") {
            let after = &rest[start + "<parameter=".len()..];
            let Some((key, value)) = after.split_once('>') else { break };
            let end = [value.find("</parameter>"), value.find("<parameter=")].into_iter().flatten().min();
            let (text, next) = match end {
                Some(end) => (&value[..end], &value[end..]),
                None => (value, ""),
            };
            let text = text.strip_prefix('\n').unwrap_or(text);
            let text = text.strip_suffix('\n').unwrap_or(text);
            map.insert(key.trim().to_string(), Value::String(text.to_string()));
            rest = next.strip_prefix("</parameter>").unwrap_or(next);
        }
        Value::Object(map)
    };
    let mut map = Map::new();
    map.insert("name".into(), if name.is_empty() { Value::Null } else { Value::String(name.to_string()) });
    map.insert("arguments".into(), args);
    out.value = Value::Object(map);
    Some(out)
}

/// Whether a `<tool_call>` body is written in markup rather than JSON
/// (Qwen3-Coder's `<function=…>`, GLM's `name<arg_key>…`): its arguments
/// are strings until a tool's schema types them, so the call is sent
/// whole, not streamed as JSON fragments.
#[cfg(feature = "proxy")]
pub(crate) fn is_markup_call(text: &str) -> bool {
    text.trim_start().starts_with("<function=") || glm_name(text).is_some()
}

/// The tool name a GLM call body begins with: the text before the first
/// `<arg_key>`, when it is one name (letters, digits, `_ - . :`). A body
/// with no `<arg_key>` is a call without arguments only in the form GLM's
/// template writes it, the name at once and nothing after it but line
/// breaks (`get_time\n`): ` and ` in `use <tool_call> and </tool_call>`
/// is prose.
fn glm_name(text: &str) -> Option<&str> {
    let name = match text.split_once("<arg_key>") {
        Some((name, _)) => name.trim(),
        None if !text.starts_with(char::is_whitespace) => text.trim_end_matches(['\n', '\r']),
        None => return None,
    };
    let is_name = !name.is_empty()
        && name.len() <= 256
        && name.chars().all(|c| c.is_alphanumeric() || matches!(c, '_' | '-' | '.' | ':'));
    is_name.then_some(name)
}

/// GLM-4.5's call form (and its successors'), the body of a `<tool_call>`
/// without a name attribute: the name, then each argument as a key and a
/// value, on lines of their own or not:
///
/// ```text
/// get_weather
/// <arg_key>city</arg_key>
/// <arg_value>Paris</arg_value>
/// ```
///
/// Each value is its text as a string (GLM's template writes a string as
/// it is and anything else as JSON; a tool's schema gives it its type
/// when the call is checked, as for [`function_call`]), without one line
/// break at each end. A missing `</arg_key>` ends at `<arg_value>`, a
/// missing `</arg_value>` at the next `<arg_key>` or the body's end. A
/// body that is one name is a call without arguments. `None` for any
/// other body.
fn arg_key_call(el: &Element) -> Option<Payload> {
    const KEY: &str = "<arg_key>";
    const VALUE: &str = "<arg_value>";
    if attr(el, NAME_KEYS).is_some() {
        return None;
    }
    let name = glm_name(&el.text)?;
    let mut args = Map::new();
    let mut rest = el.text.split_once(KEY).map_or("", |(_, after)| after.trim_end());
    while !rest.is_empty() {
        // The key ends at `</arg_key>`, or at `<arg_value>` without it.
        let (key, after) = match [rest.find("</arg_key>"), rest.find(VALUE)].into_iter().flatten().min() {
            Some(end) => (&rest[..end], rest[end..].strip_prefix("</arg_key>").unwrap_or(&rest[end..])),
            None => (rest, ""),
        };
        let after = after.trim_start();
        let after = after.strip_prefix(VALUE).unwrap_or(after);
        let end = [after.find("</arg_value>"), after.find(KEY)].into_iter().flatten().min().unwrap_or(after.len());
        let value = &after[..end];
        let value = value.strip_prefix('\n').unwrap_or(value);
        let value = value.strip_suffix('\n').unwrap_or(value);
        let key = key.trim();
        if !key.is_empty() {
            args.insert(key.to_string(), Value::String(value.to_string()));
        }
        let next = &after[end..];
        let next = next.strip_prefix("</arg_value>").unwrap_or(next);
        rest = next.split_once(KEY).map_or("", |(_, after)| after);
    }
    let mut map = Map::new();
    map.insert("name".into(), Value::String(name.to_string()));
    map.insert("arguments".into(), Value::Object(args));
    Some(Payload { value: Value::Object(map), ..Payload::none() })
}

/// `<ui_component view="ns.widget">{props}</ui_component>`: `{view, props}`.
/// A `view` that is not `namespace.component` (spec 003 §6.3) is kept and
/// reported (`ui_component_view_invalid`).
pub(crate) fn ui_component(el: &Element) -> Payload {
    let mut out = named_json(
        el,
        NamedJson {
            tag: "ui_component",
            name_key: "view",
            name_attrs: &["view", "name", "component"],
            body_names: &["view", "component"],
            body_args: &["props", "properties", "data"],
            args_key: "props",
            not_object: DiagnosticCode::PropsNotObject,
            without_name: DiagnosticCode::UiComponentWithoutView,
        },
    );
    if let Some(view) = out.value.get("view").and_then(Value::as_str)
        && !is_namespaced_view(view)
    {
        let message = format!(
            "ui_component view {:?} is not `namespace.component` (spec 003 §6.3), e.g. \"rpg.inventory\"",
            cut(view, 60)
        );
        out.diagnostics.push(diag(Level::Warning, DiagnosticCode::UiComponentViewInvalid, &message));
    }
    out
}

/// `namespace.component`: two or more dot-separated identifiers
/// (letters, digits, `_`, `-`; not starting with a digit or `-`).
fn is_namespaced_view(view: &str) -> bool {
    let mut parts = 0;
    for part in view.split('.') {
        let mut chars = part.chars();
        let starts_well = chars.next().is_some_and(|c| c.is_alphabetic() || c == '_');
        if !starts_well || !chars.all(|c| c.is_alphanumeric() || c == '_' || c == '-') {
            return false;
        }
        parts += 1;
    }
    parts >= 2
}

/// Reads an element's whole text as (lenient) JSON; when even that fails,
/// the failed payload to return, built on `partial`.
fn json_body(el: &Element, tag: &str, out: &mut Payload, partial: Value) -> Result<Value, Box<Payload>> {
    read_json(&el.text, 0, &mut out.diagnostics).map_err(|e| {
        Box::new(Payload::failed(
            std::mem::take(&mut out.diagnostics),
            &format!("the <{tag}> body is not JSON, even read leniently: {e}"),
            partial,
        ))
    })
}

/// How a "name plus JSON object" tag is read.
struct NamedJson {
    tag: &'static str,
    /// Payload key of the name (`name`, `view`).
    name_key: &'static str,
    /// Attributes that give the name.
    name_attrs: &'static [&'static str],
    /// Body keys that give the name when no attribute does.
    body_names: &'static [&'static str],
    /// Body keys that hold the arguments in the wrapped form.
    body_args: &'static [&'static str],
    /// Payload key of the arguments (`arguments`, `props`).
    args_key: &'static str,
    /// The diagnostic when the arguments are not an object.
    not_object: DiagnosticCode,
    /// The diagnostic when no name is given.
    without_name: DiagnosticCode,
}

fn named_json(el: &Element, how: NamedJson) -> Payload {
    let mut out = Payload::none();
    let mut name = attr(el, how.name_attrs).map(|s| Value::String(s.trim().to_string()));
    let body = el.text.trim();
    let args = if body.is_empty() {
        Value::Object(Map::new())
    } else {
        let value = match json_body(el, how.tag, &mut out, json!({})) {
            Ok(v) => v,
            Err(failed) => return *failed,
        };
        // A body that is one JSON string holding the object (double-encoded).
        let value = match value {
            Value::String(s) if s.trim_start().starts_with('{') => unwrap_args(Value::String(s), &mut out),
            v => v,
        };
        match value {
            Value::Object(mut map) => {
                let body_name =
                    how.body_names.iter().find_map(|k| map.get(*k).and_then(Value::as_str).map(str::to_string));
                let wrapped_args = how.body_args.iter().find(|k| map.contains_key(**k)).copied();
                match (&name, body_name) {
                    // `{"name": "x", "arguments": {..}}` with no attribute,
                    // or the same name as the attribute.
                    (None, Some(n)) => {
                        name = Some(Value::String(n));
                        take(&mut map, how.body_names);
                        match wrapped_args {
                            Some(k) => unwrap_args(map.shift_remove(k).unwrap_or(Value::Null), &mut out),
                            None => Value::Object(map),
                        }
                    }
                    (Some(Value::String(a)), Some(n)) if *a == n && wrapped_args.is_some() && map.len() == 2 => {
                        take(&mut map, how.body_names);
                        let k = wrapped_args.unwrap_or_default();
                        unwrap_args(map.shift_remove(k).unwrap_or(Value::Null), &mut out)
                    }
                    // `<tool_call name="x">{"arguments": {..}}</tool_call>`
                    (Some(_), None) if wrapped_args.is_some() && map.len() == 1 => {
                        let k = wrapped_args.unwrap_or_default();
                        unwrap_args(map.shift_remove(k).unwrap_or(Value::Null), &mut out)
                    }
                    _ => Value::Object(map),
                }
            }
            Value::String(s) if !el.text.trim_start().starts_with(['"', '\'', '\u{201c}']) => {
                return Payload::failed(
                    out.diagnostics,
                    &format!("the <{}> body is text, not a JSON object: {:?}", how.tag, cut(&s, 60)),
                    json!({}),
                );
            }
            other => {
                out.diagnostics.push(diag(
                    Level::Warning,
                    how.not_object,
                    &format!(
                        "the <{}> body is {}, not a JSON object; kept as it is",
                        how.tag,
                        crate::state::type_name(&other)
                    ),
                ));
                other
            }
        }
    };
    if name.is_none() {
        out.diagnostics.push(diag(
            Level::Warning,
            how.without_name,
            &format!(
                "the <{}> has no {} (no attribute and no {:?} key in its body)",
                how.tag, how.name_key, how.name_key
            ),
        ));
    }
    let mut map = Map::new();
    map.insert(how.name_key.into(), name.unwrap_or(Value::Null));
    map.insert(how.args_key.into(), args);
    out.value = Value::Object(map);
    out
}

/// Arguments given as a JSON string (the OpenAI wire form) are parsed.
fn unwrap_args(args: Value, out: &mut Payload) -> Value {
    match args {
        Value::String(s) if s.trim_start().starts_with(['{', '[']) => match read_json(&s, 0, &mut out.diagnostics) {
            Ok(v) => {
                out.diagnostics.push(diag(
                    Level::Info,
                    DiagnosticCode::ArgumentsString,
                    "the arguments were a JSON string; parsed",
                ));
                v
            }
            Err(_) => Value::String(s),
        },
        other => other,
    }
}

fn cut(s: &str, n: usize) -> String {
    s.chars().take(n).collect()
}

/// `<media type="image" src=".." alt=".."/>` (or with a body): `{type,
/// src, alt}`. A missing type is inferred from the file extension; a
/// source with a script-capable scheme is refused.
pub(crate) fn media(el: &Element) -> Payload {
    let mut out = Payload::none();
    let mut kind = attr(el, &["type", "kind", "media_type"]).map(str::to_string);
    let mut src = attr(el, &["src", "url", "href", "source"]).map(str::to_string);
    let mut alt = attr(el, &["alt", "title", "caption", "description"]).map(str::to_string);
    let body = el.text.trim();
    if body.starts_with('{') {
        if let Ok(Value::Object(map)) = read_json(body, 0, &mut out.diagnostics) {
            let field =
                |names: &[&str]| names.iter().find_map(|n| map.get(*n).and_then(Value::as_str).map(str::to_string));
            kind = kind.or_else(|| field(&["type", "kind"]));
            src = src.or_else(|| field(&["src", "url", "href"]));
            alt = alt.or_else(|| field(&["alt", "title", "caption"]));
        }
    } else if !body.is_empty() {
        if src.is_none() && !body.contains(char::is_whitespace) {
            src = Some(body.to_string());
        } else if alt.is_none() {
            alt = Some(body.to_string());
        }
    }
    if let Some(s) = &src
        && !safe_src(s)
    {
        out.diagnostics.push(diag(
            Level::Warning,
            DiagnosticCode::MediaSrcRefused,
            &format!("media source {:?} uses a scheme that can run script; src set to null", cut(s, 80)),
        ));
        src = None;
    }
    if kind.is_none()
        && let Some(k) = src.as_deref().and_then(infer_type)
    {
        out.diagnostics.push(diag(
            Level::Info,
            DiagnosticCode::MediaTypeInferred,
            &format!("media type {k:?} inferred from the source's extension"),
        ));
        kind = Some(k.to_string());
    }
    if src.is_none() {
        out.diagnostics.push(diag(
            Level::Warning,
            DiagnosticCode::MediaWithoutSrc,
            "the <media> element has no usable src",
        ));
    }
    out.value = json!({"type": kind, "src": src, "alt": alt});
    out
}

/// Whether a media source is a relative path, http(s), or a media `data:`
/// URL (after removing the whitespace and control characters browsers
/// ignore in schemes).
fn safe_src(src: &str) -> bool {
    let squeezed: String =
        src.chars().filter(|c| !c.is_whitespace() && !c.is_control()).collect::<String>().to_ascii_lowercase();
    let Some(colon) = squeezed.find(':') else {
        return true;
    };
    let scheme = &squeezed[..colon];
    if squeezed[..colon].contains(['/', '?', '#']) {
        return true; // the colon is after the path started: relative
    }
    match scheme {
        "http" | "https" => true,
        "data" => {
            ["data:image/", "data:audio/", "data:video/"].iter().any(|p| squeezed.starts_with(p))
                && !squeezed.starts_with("data:image/svg")
        }
        _ => false,
    }
}

fn infer_type(src: &str) -> Option<&'static str> {
    let path = src.split(['?', '#']).next().unwrap_or(src);
    let ext = path.rsplit_once('.')?.1.to_ascii_lowercase();
    Some(match ext.as_str() {
        "png" | "jpg" | "jpeg" | "gif" | "webp" | "bmp" | "avif" | "svg" | "ico" | "tif" | "tiff" => "image",
        "mp3" | "wav" | "ogg" | "oga" | "flac" | "m4a" | "aac" | "opus" => "audio",
        "mp4" | "webm" | "mov" | "mkv" | "avi" | "m4v" | "ogv" => "video",
        _ => return None,
    })
}

/// `<choice><prompt>..</prompt><options><option id="a">..</option>..`
/// (or the legacy `<xx>`, or plain `1. foo` lines): `{prompt, options:
/// [{id, label}]}`.
pub(crate) fn choice(el: &Element) -> Payload {
    let mut out = Payload::none();
    let nodes = tree_of(&el.text, &mut out);
    let mut prompt = find_element(&nodes, &["prompt", "question", "title"]).map(ElementNode::trimmed_text);
    let mut options = Vec::new();
    collect_options(&nodes, &mut options);
    if options.is_empty() {
        // Plain lines: `1. foo`, `- foo`, `A) foo`, or one option per line.
        let mut text = String::new();
        plain_text(&nodes, &mut text);
        let (lead, lines) = option_lines(&text);
        if prompt.is_none() && !lead.is_empty() {
            prompt = Some(lead);
        }
        if !lines.is_empty() {
            out.diagnostics.push(diag(
                Level::Info,
                DiagnosticCode::ChoicePlainLines,
                "options were read from plain lines (no <option> tags)",
            ));
        }
        options = lines;
    }
    if options.is_empty() {
        out.diagnostics.push(diag(
            Level::Warning,
            DiagnosticCode::ChoiceWithoutOptions,
            "the <choice> element has no options",
        ));
    }
    let options: Vec<Value> = options
        .into_iter()
        .map(|(id, label)| object!([("id", Value::String(id)), ("label", Value::String(label))]))
        .collect();
    let prompt = prompt.filter(|p| !p.is_empty()).map_or(Value::Null, Value::String);
    out.value = object!([("prompt", prompt), ("options", Value::Array(options))]);
    out
}

fn find_element<'a>(nodes: &'a [Node], names: &[&str]) -> Option<&'a ElementNode> {
    nodes.iter().find_map(|n| match n {
        Node::Element(e) if names.iter().any(|x| e.name.eq_ignore_ascii_case(x)) => Some(e),
        Node::Element(e) => find_element(&e.children, names),
        Node::Text(_) => None,
    })
}

fn collect_options(nodes: &[Node], out: &mut Vec<(String, String)>) {
    for n in nodes {
        if let Node::Element(e) = n {
            if ["option", "opt", "item", "choice"].iter().any(|x| e.name.eq_ignore_ascii_case(x)) {
                let label = e.trimmed_text();
                let id = e
                    .attr("id")
                    .or_else(|| e.attr("value"))
                    .or_else(|| e.attr("key"))
                    .map(str::to_string)
                    .unwrap_or_else(|| (out.len() + 1).to_string());
                out.push((id, label));
            } else if !["prompt", "question", "title"].iter().any(|x| e.name.eq_ignore_ascii_case(x)) {
                collect_options(&e.children, out);
            }
        }
    }
}

/// Text outside the prompt element.
fn plain_text(nodes: &[Node], out: &mut String) {
    for n in nodes {
        match n {
            Node::Text(t) => out.push_str(t),
            Node::Element(e) if ["prompt", "question", "title"].iter().any(|x| e.name.eq_ignore_ascii_case(x)) => {
                out.push('\n')
            }
            Node::Element(e) => {
                plain_text(&e.children, out);
                out.push('\n');
            }
        }
    }
}

/// Splits plain text into a lead (prompt) and option lines. With list
/// markers, lines before the first marker are the lead and unmarked lines
/// after one continue the previous option; without markers, every line is
/// an option.
fn option_lines(text: &str) -> (String, Vec<(String, String)>) {
    let lines: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    let marked: Vec<Option<(Option<String>, &str)>> = lines.iter().map(|l| list_marker(l)).collect();
    if marked.iter().all(Option::is_none) {
        let opts = lines.iter().enumerate().map(|(i, l)| ((i + 1).to_string(), l.to_string())).collect();
        return (String::new(), opts);
    }
    let mut lead = Vec::new();
    let mut opts: Vec<(String, String)> = Vec::new();
    for (line, m) in lines.iter().zip(marked) {
        match m {
            Some((id, label)) => {
                let id = id.unwrap_or_else(|| (opts.len() + 1).to_string());
                opts.push((id, label.to_string()));
            }
            None => match opts.last_mut() {
                Some((_, label)) => {
                    label.push(' ');
                    label.push_str(line);
                }
                None => lead.push(*line),
            },
        }
    }
    (lead.join("\n"), opts)
}

/// A list marker at the start of a line: `1.`, `1)`, `1、`, `(1)`, `[1]`,
/// `A.`, `a)`, `-`, `*`, `•`, `①`. Returns the id it gives (numbers and
/// letters) and the rest of the line.
fn list_marker(line: &str) -> Option<(Option<String>, &str)> {
    let rest_after = |i: usize| line.get(i..).map(str::trim_start).filter(|r| !r.is_empty());
    let first = line.chars().next()?;
    if matches!(first, '-' | '*' | '•' | '+' | '·') {
        let after = first.len_utf8();
        if line[after..].starts_with(char::is_whitespace) {
            return rest_after(after).map(|r| (None, r));
        }
        return None;
    }
    if let Some(n) = ('\u{2460}'..='\u{2473}').position(|c| c == first) {
        return rest_after(first.len_utf8()).map(|r| (Some((n + 1).to_string()), r));
    }
    // `(1)`, `[1]`, `【1】`
    for (open, close) in [("(", ")"), ("[", "]"), ("\u{3010}", "\u{3011}"), ("\u{ff08}", "\u{ff09}")] {
        if let Some(inner) = line.strip_prefix(open)
            && let Some(end) = inner.find(close)
        {
            let id = &inner[..end];
            if !id.is_empty() && id.len() <= 3 && id.chars().all(|c| c.is_ascii_alphanumeric()) {
                return rest_after(open.len() + end + close.len()).map(|r| (Some(id.to_string()), r));
            }
        }
    }
    let digits = line.bytes().take_while(u8::is_ascii_digit).count();
    let (id_len, is_letter) = if digits > 0 && digits <= 3 {
        (digits, false)
    } else if first.is_ascii_alphabetic() && line.len() > 1 {
        (1, true)
    } else {
        return None;
    };
    let after = &line[id_len..];
    let sep =
        ['.', ')', '\u{3001}', ':', '\u{ff0e}', '\u{ff09}', '\u{ff1a}'].into_iter().find(|s| after.starts_with(*s))?;
    let rest = &after[sep.len_utf8()..];
    // `A.` needs a space after it (so that `e.g.` is not an option);
    // `1.` and `1、` do not.
    if is_letter && !rest.starts_with(char::is_whitespace) {
        return None;
    }
    if !is_letter && sep == '.' && rest.starts_with(|c: char| c.is_ascii_digit()) {
        return None; // `1.5 kg`
    }
    rest_after(id_len + sep.len_utf8()).map(|r| (Some(line[..id_len].to_string()), r))
}

/// The tree of a structured body; tags nested past
/// [`tree::MAX_DEPTH`] are kept as text, and a diagnostic says so.
fn tree_of(text: &str, out: &mut Payload) -> Vec<Node> {
    let tree = tree::parse(text);
    if tree.too_deep > 0 {
        let message = format!(
            "{} tags nested deeper than {} levels were kept as text in the payload",
            tree.too_deep,
            tree::MAX_DEPTH
        );
        out.diagnostics.push(diag(Level::Warning, DiagnosticCode::PayloadTooDeep, &message));
    }
    tree.nodes
}

/// `<details><summary>..</summary>body</details>`: `{summary, body}`, the
/// body filtered to content's HTML allowlist, the summary its text.
pub(crate) fn details(el: &Element) -> Payload {
    let mut out = Payload::none();
    let (summary, body) = match super::extract_child(&el.text, "summary") {
        Some(found) => {
            let summary_nodes = tree_of(found.inner, &mut out);
            let mut s = String::new();
            tree::collect_text(&summary_nodes, &mut s);
            (Some(s.trim().to_string()), found.rest.into_owned())
        }
        None => {
            out.diagnostics.push(diag(
                Level::Info,
                DiagnosticCode::DetailsWithoutSummary,
                "the <details> element has no <summary>",
            ));
            (None, el.text.clone())
        }
    };
    // A UI shows the body as HTML (spec 003 §3.3.2: standard HTML
    // behaviour), so it gets content's allowlist (§3.1.3).
    let clean = super::html::sanitize(body.trim());
    if !clean.report.is_clean_but_comments() {
        let message = format!("details body HTML filtered: {}", clean.report.summary());
        out.diagnostics.push(diag(Level::Warning, DiagnosticCode::HtmlFiltered, &message));
    }
    out.value = json!({"summary": summary, "body": clean.html});
    out
}

/// `<status_bar><mood>calm</mood><hp max="9">5</hp></status_bar>`: an
/// ordered object of child tag to value. Nested tags give nested objects,
/// attributes `@name` keys, mixed text a `#text` key, and a repeated tag an
/// array. A body of `key: value` lines is read the same way.
pub(crate) fn status_bar(el: &Element) -> Payload {
    let mut out = Payload::none();
    let nodes = tree_of(&el.text, &mut out);
    if nodes.iter().any(|n| matches!(n, Node::Element(_))) {
        out.value = Value::Object(node_map(nodes));
        return out;
    }
    let mut text = String::new();
    tree::collect_text(&nodes, &mut text);
    let mut map = Map::new();
    let mut loose = Vec::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let line = line.trim_start_matches(['-', '*', '\u{2022}']).trim_start();
        match line.split_once([':', '\u{ff1a}']) {
            Some((k, v)) if !k.trim().is_empty() && k.chars().count() <= 40 => {
                insert_repeat(&mut map, k.trim().to_string(), Value::String(v.trim().to_string()));
            }
            _ => loose.push(line),
        }
    }
    if !map.is_empty() {
        out.diagnostics.push(diag(
            Level::Info,
            DiagnosticCode::StatusBarLines,
            "the status bar was read from `key: value` lines (no child tags)",
        ));
    }
    if !loose.is_empty() {
        map.insert("#text".into(), Value::String(loose.join("\n")));
    }
    out.value = Value::Object(map);
    out
}

fn insert_repeat(map: &mut Map<String, Value>, key: String, value: Value) {
    match map.entry(key) {
        serde_json::map::Entry::Vacant(slot) => {
            slot.insert(value);
        }
        // Leaf values are strings or objects, so an array here was made by
        // an earlier repetition.
        serde_json::map::Entry::Occupied(mut slot) => match slot.get_mut() {
            Value::Array(items) => items.push(value),
            prev => {
                let first = std::mem::take(prev);
                *prev = Value::Array(vec![first, value]);
            }
        },
    }
}

/// The nodes as an ordered object (taking them: names and texts move into
/// the map).
fn node_map(nodes: Vec<Node>) -> Map<String, Value> {
    // Sized once: a map grows its entries and its index table apart.
    let mut map = Map::with_capacity(nodes.len());
    let mut loose = String::new();
    for n in nodes {
        match n {
            Node::Text(t) => loose.push_str(&t),
            Node::Element(mut e) => {
                let name = std::mem::take(&mut e.name);
                insert_repeat(&mut map, name, element_value(e));
            }
        }
    }
    let loose = loose.trim();
    if !loose.is_empty() {
        map.insert("#text".into(), Value::String(loose.to_string()));
    }
    map
}

fn element_value(e: ElementNode) -> Value {
    if e.attrs.is_empty() && !e.has_element_children() {
        return Value::String(e.into_trimmed_text());
    }
    let mut map = Map::with_capacity(e.attrs.len() + e.children.len());
    for (k, v) in e.attrs {
        map.insert(format!("@{k}"), Value::String(v));
    }
    for (k, v) in node_map(e.children) {
        map.insert(k, v);
    }
    Value::Object(map)
}

/// A registry tag with no built-in payload: `{attrs, children}` (a JSON
/// body gives `{attrs, value}`, a raw body `{attrs, text}`).
pub(crate) fn custom(el: &Element, body: BodyKind) -> Payload {
    let mut out = Payload::none();
    let attrs: Map<String, Value> = el.attrs.iter().map(|(k, v)| (k.clone(), Value::String(v.clone()))).collect();
    out.value = match body {
        BodyKind::Json => {
            let value = if el.text.trim().is_empty() {
                Value::Null
            } else {
                match json_body(el, &el.tag, &mut out, json!({"attrs": attrs})) {
                    Ok(v) => v,
                    Err(failed) => return *failed,
                }
            };
            object!([("attrs", Value::Object(attrs)), ("value", value)])
        }
        BodyKind::Raw => object!([("attrs", Value::Object(attrs)), ("text", Value::String(el.text.clone()))]),
        _ => {
            let nodes = tree_of(&el.text, &mut out);
            object!([("attrs", Value::Object(attrs)), ("children", Value::Array(nodes_json(&nodes)))])
        }
    };
    out
}

/// Nodes as JSON: text as strings (trimmed, blank ones left out), elements
/// as `{tag, attrs, children}`.
fn nodes_json(nodes: &[Node]) -> Vec<Value> {
    nodes
        .iter()
        .filter_map(|n| match n {
            Node::Text(t) => Some(t.trim()).filter(|t| !t.is_empty()).map(|t| Value::String(t.to_string())),
            Node::Element(e) => {
                let attrs: Map<String, Value> =
                    e.attrs.iter().map(|(k, v)| (k.clone(), Value::String(v.clone()))).collect();
                Some(object!([
                    ("tag", Value::String(e.name.clone())),
                    ("attrs", Value::Object(attrs)),
                    ("children", Value::Array(nodes_json(&e.children))),
                ]))
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_markers() {
        type Marker<'a> = Option<(Option<&'a str>, &'a str)>;
        let table: &[(&str, Marker<'_>)] = &[
            ("1. go north", Some((Some("1"), "go north"))),
            ("2) rest", Some((Some("2"), "rest"))),
            ("3、离开", Some((Some("3"), "离开"))),
            ("A. fight", Some((Some("A"), "fight"))),
            ("b) flee", Some((Some("b"), "flee"))),
            ("(4) wait", Some((Some("4"), "wait"))),
            ("[5] sleep", Some((Some("5"), "sleep"))),
            ("【6】调查", Some((Some("6"), "调查"))),
            ("- bullet", Some((None, "bullet"))),
            ("• dot", Some((None, "dot"))),
            ("① 圆", Some((Some("1"), "圆"))),
            ("1.5 kg of gold", None),
            ("e.g. this", None),
            ("Choose one:", None),
            ("-dash", None),
        ];
        for (line, want) in table {
            let got = list_marker(line).map(|(id, r)| (id, r.to_string()));
            let want = want.map(|(id, r)| (id.map(str::to_string), r.to_string()));
            assert_eq!(got, want, "{line}");
        }
    }

    #[test]
    fn safe_sources() {
        for ok in ["assets/a.png", "https://x.y/a.jpg", "/a/b.mp3", "data:image/png;base64,AAA", "dir/a:b.png"] {
            assert!(safe_src(ok), "{ok}");
        }
        for bad in [
            "javascript:alert(1)",
            " JaVa\tScRiPt:alert(1)",
            "vbscript:x",
            "data:text/html,<script>",
            "data:image/svg+xml,<svg onload=x>",
            "file:///etc/passwd",
        ] {
            assert!(!safe_src(bad), "{bad}");
        }
    }
}
