//! Tool manuals: the catalog rendered as the text a model reads in its
//! prompt, one form per [`Protocol`] (spec 002 §1.2 "single source of
//! truth", §7.2, §11.2; spec 004 §4.2; spec 001's tool description format),
//! and the two renderings a proxy needs to replay a chat history in a text
//! protocol: an assistant message's `tool_calls` as call text
//! ([`call_text`]) and a `role: "tool"` message as observation text
//! ([`crate::tools::observation_text`]).
//!
//! This module owns text rendering only. It is synchronous (no tokio, no
//! I/O), so the sans-IO core and the proxy can both use it; it must not
//! run tools or read files.
//!
//! # Example
//!
//! ```
//! use spindle::calls::{ToolCatalog, ToolDef};
//! use spindle::tools::{Protocol, manual};
//! use serde_json::json;
//!
//! let mut catalog = ToolCatalog::new();
//! let mut def = ToolDef::new("File.Write", json!({
//!     "type": "object",
//!     "properties": {"file_path": {"type": "string", "description": "Where to write"}},
//!     "required": ["file_path"]
//! }));
//! def.description = Some("Writes a file.".into());
//! catalog.add(def).unwrap();
//! let text = manual(catalog.tools(), Protocol::Tam);
//! assert!(text.contains("- Tool ID: File.Write"));
//! assert!(text.contains("    - file_path (string, required): Where to write"));
//! assert!(text.contains("command:»»»File.Write«««"));
//! ```

use crate::calls::{CatalogError, ToolCatalog, ToolDef};
use serde_json::{Map, Value};
use std::fmt::Write as _;

/// A tool-call notation a model can be told to use.
///
/// Adding a notation (the Hermes/Qwen `<tool_call>{"name", "arguments"}`
/// JSON form is next) means one variant here and one arm in each of
/// [`manual`], [`call_text`], [`crate::tools::observation_text`] and
/// [`crate::tools::feedback_messages`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Protocol {
    /// TAM blocks with `key:»»»value«««` pairs (spec 000).
    Tam,
    /// TAM blocks with the `key:「始」value「末」` delimiters (spec 002 §5).
    TamCjk,
    /// `<ACTION><ToolId><param>..</param></ToolId></ACTION>` (spec 004).
    Action,
    /// ATTP TOML whose `[tool_call]` code calls Python functions (spec 001).
    Attp,
    /// `<tool_call name="id">{json}</tool_call>` (spec 003 §3.2.2).
    Filament,
    /// The Hermes/Qwen form most open-weight models are trained on:
    /// `<tool_call>{"name": "id", "arguments": {…}}</tool_call>`, tools
    /// listed as JSON in `<tools></tools>`, results in
    /// `<tool_response>` (Qwen's chat template).
    Hermes,
    /// The OpenAI `tools` JSON array (manual only: a model that takes
    /// native tool definitions).
    Openai,
}

impl Protocol {
    /// Every protocol, in the order the CLI lists them.
    pub const ALL: [Protocol; 7] = [
        Protocol::Tam,
        Protocol::TamCjk,
        Protocol::Action,
        Protocol::Attp,
        Protocol::Filament,
        Protocol::Hermes,
        Protocol::Openai,
    ];

    /// The protocols a model writes as text (all but `openai`): the ones
    /// the agent loop reads.
    pub const TEXT: [Protocol; 6] =
        [Protocol::Tam, Protocol::TamCjk, Protocol::Action, Protocol::Attp, Protocol::Filament, Protocol::Hermes];

    /// The CLI name (`tam`, `tam-cjk`, `action`, `attp`, `filament`,
    /// `hermes`, `openai`).
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tam => "tam",
            Protocol::TamCjk => "tam-cjk",
            Protocol::Action => "action",
            Protocol::Attp => "attp",
            Protocol::Filament => "filament",
            Protocol::Hermes => "hermes",
            Protocol::Openai => "openai",
        }
    }

    /// One line that says what the model writes (for `--help`).
    pub fn summary(self) -> &'static str {
        match self {
            Protocol::Tam => "TAM blocks: <|[REQUEST_TOOL]|> key:»»»value««« <|[END_TOOL]|>",
            Protocol::TamCjk => "TAM blocks with the key:「始」value「末」 delimiters",
            Protocol::Action => "<ACTION><ToolId><param>…</param></ToolId></ACTION>",
            Protocol::Attp => "ATTP TOML with Python code that calls the tools",
            Protocol::Filament => "Filament <tool_call name=\"…\">{…}</tool_call>",
            Protocol::Hermes => "Hermes/Qwen <tool_call>{\"name\": …, \"arguments\": …}</tool_call>",
            Protocol::Openai => "the OpenAI `tools` JSON array (manual only)",
        }
    }

    /// The protocol of a CLI name (case-insensitive).
    pub fn from_name(name: &str) -> Option<Protocol> {
        Protocol::ALL.into_iter().find(|p| p.as_str().eq_ignore_ascii_case(name.trim()))
    }

    /// The parser profile that reads this protocol's calls (`tam`,
    /// `action`, `attp`, `filament`; `chat` for `hermes`, whose
    /// `<tool_call>` the chat and reasoning profiles read); `None` for
    /// `openai`.
    pub fn profile(self) -> Option<&'static str> {
        match self {
            Protocol::Tam | Protocol::TamCjk => Some("tam"),
            Protocol::Action => Some("action"),
            Protocol::Attp => Some("attp"),
            Protocol::Filament => Some("filament"),
            Protocol::Hermes => Some("chat"),
            Protocol::Openai => None,
        }
    }

    /// The value delimiters of a TAM protocol.
    fn tam_delims(self) -> (&'static str, &'static str) {
        match self {
            Protocol::TamCjk => ("「始」", "「末」"),
            _ => ("»»»", "«««"),
        }
    }
}

impl std::fmt::Display for Protocol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One parameter of a tool, as a manual shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct ParamInfo {
    /// The name.
    pub name: String,
    /// The JSON type(s), `string | integer`; `any` when the schema says none.
    pub ty: String,
    /// Whether it is in `required`.
    pub required: bool,
    /// Its `description`.
    pub description: Option<String>,
    /// Its `default`.
    pub default: Option<Value>,
    /// Its `enum` values.
    pub choices: Vec<Value>,
}

/// The parameters of a tool's schema, required first, each group in
/// schema order.
pub fn params_of(def: &ToolDef) -> Vec<ParamInfo> {
    let schema = &def.parameters;
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut out: Vec<ParamInfo> = schema
        .get("properties")
        .and_then(Value::as_object)
        .map(|props| {
            props
                .iter()
                .map(|(name, s)| ParamInfo {
                    name: name.clone(),
                    ty: type_of(s),
                    required: required.contains(&name.as_str()),
                    description: s.get("description").and_then(Value::as_str).map(one_line),
                    default: s.get("default").cloned(),
                    choices: s.get("enum").and_then(Value::as_array).cloned().unwrap_or_default(),
                })
                .collect()
        })
        .unwrap_or_default();
    out.sort_by_key(|p| !p.required);
    out
}

/// A schema's type for people: `string`, `string | null`, `array of
/// string`, `any`.
fn type_of(schema: &Value) -> String {
    let types: Vec<&str> = match schema.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(list)) => list.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    };
    if types.is_empty() {
        return if schema.get("enum").is_some() { "enum".into() } else { "any".into() };
    }
    types
        .iter()
        .map(|t| match (*t, schema.get("items").map(type_of)) {
            ("array", Some(item)) if item != "any" => format!("array of {item}"),
            (t, _) => t.to_string(),
        })
        .collect::<Vec<_>>()
        .join(" | ")
}

/// Collapses whitespace runs (descriptions sit on one manual line).
fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// An example value for a parameter: its `examples[0]`, `example`,
/// `default` or first `enum` value, else a placeholder of its type.
fn example_value(p: &ParamInfo, schema: Option<&Value>) -> Value {
    let given = schema.and_then(|s| s.get("examples").and_then(|e| e.get(0)).or_else(|| s.get("example")).cloned());
    if let Some(v) = given.or_else(|| p.default.clone()).or_else(|| p.choices.first().cloned()) {
        return v;
    }
    match p.ty.split(" | ").next().unwrap_or("any") {
        "integer" => Value::from(1),
        "number" => Value::from(1.5),
        "boolean" => Value::Bool(true),
        "object" => Value::Object(Map::new()),
        t if t.starts_with("array") => Value::Array(Vec::new()),
        _ => Value::String(format!("<{}>", p.name)),
    }
}

/// The example arguments of a tool: every required parameter (or the
/// first one when none is required).
fn example_args(def: &ToolDef) -> Map<String, Value> {
    let params = params_of(def);
    let props = def.parameters.get("properties");
    let mut out = Map::new();
    let required: Vec<&ParamInfo> = params.iter().filter(|p| p.required).collect();
    let chosen: Vec<&ParamInfo> = if required.is_empty() { params.iter().take(1).collect() } else { required };
    for p in chosen {
        out.insert(p.name.clone(), example_value(p, props.and_then(|s| s.get(&p.name))));
    }
    out
}

/// A value as TAM or ACTION text: strings as they are, anything else as
/// compact JSON.
fn as_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Renders tools as the manual for `protocol`.
///
/// The TAM manuals follow spec 002 §11.2 (`- Tool ID:` entries) with the
/// block syntax, multi-step `command_N`, `on_error_N`, `retry_N` and
/// `common_*`; ACTION follows spec 004 §4.2; ATTP gives Python signatures
/// with docstrings and an example call (spec 001); Filament shows each
/// tool's JSON Schema and a `<tool_call name>` example; Hermes is the tools
/// section of Qwen's chat template (one OpenAI function object per line in
/// `<tools></tools>`, then the `<tool_call>` instruction); `openai` is the
/// `tools` JSON array.
pub fn manual<'a>(tools: impl IntoIterator<Item = &'a ToolDef>, protocol: Protocol) -> String {
    let tools: Vec<&ToolDef> = tools.into_iter().collect();
    match protocol {
        Protocol::Tam | Protocol::TamCjk => tam_manual(&tools, protocol),
        Protocol::Action => action_manual(&tools),
        Protocol::Attp => attp_manual(&tools),
        Protocol::Filament => filament_manual(&tools),
        Protocol::Hermes => hermes_manual(&tools),
        Protocol::Openai => {
            // For OpenAI's API itself: names in the alphabet it takes.
            let mut list = openai_tools(tools.iter().copied());
            for t in list.as_array_mut().into_iter().flatten() {
                if let Some(Value::String(name)) = t.pointer_mut("/function/name") {
                    *name = crate::calls::openai_function_name(name).into_owned();
                }
            }
            serde_json::to_string_pretty(&list).unwrap_or_default()
        }
    }
}

/// The tools of `catalog` whose ids are in `only` (all when `only` is
/// empty), in catalog order: an agent's `tool_ids_inventory` (spec 002
/// §4.4.1).
///
/// # Errors
///
/// An id in `only` that the catalog does not have, with the closest known
/// id when one is close.
pub fn select<'a>(catalog: &'a ToolCatalog, only: &[String]) -> Result<Vec<&'a ToolDef>, String> {
    catalog.check_ids(only).map_err(|e| e.to_string())?;
    Ok(catalog.tools().filter(|t| only.is_empty() || only.contains(&t.id)).collect())
}

/// The OpenAI `tools` array of some tools:
/// `[{"type": "function", "function": {"name", "description", "parameters"}}]`.
pub fn openai_tools<'a>(tools: impl IntoIterator<Item = &'a ToolDef>) -> Value {
    Value::Array(
        tools
            .into_iter()
            .map(|t| {
                let mut f = Map::new();
                f.insert("name".into(), Value::String(t.id.clone()));
                if let Some(d) = &t.description {
                    f.insert("description".into(), Value::String(d.clone()));
                }
                f.insert("parameters".into(), t.parameters.clone());
                serde_json::json!({"type": "function", "function": f})
            })
            .collect(),
    )
}

/// The manual of a chat request's OpenAI `tools` array in `protocol`.
///
/// # Errors
///
/// As [`ToolCatalog::add_openai_tools`]: an entry that is not a function
/// tool, a schema that does not compile, a name given twice.
pub fn manual_for_openai_tools(tools: &Value, protocol: Protocol) -> Result<String, CatalogError> {
    let mut catalog = ToolCatalog::new();
    catalog.add_openai_tools(tools)?;
    Ok(manual(catalog.tools(), protocol))
}

/// The placeholders a prompt may hold for the manual: spec 002 §7.2's
/// `{{{system:available_tools}}}` and spec 001's `{{AVAILABLE_TOOLS}}`.
pub const PLACEHOLDERS: [&str; 2] = ["{{{system:available_tools}}}", "{{AVAILABLE_TOOLS}}"];

/// Replaces every manual placeholder ([`PLACEHOLDERS`]) in a prompt text
/// with `manual`; returns the text and whether any was found. An ATTP
/// manual fills it with its tools alone: a prompt with a placeholder
/// states the format around it, as spec 001's template does.
///
/// ```
/// let (text, found) = spindle::tools::fill_placeholders("Tools:\n{{AVAILABLE_TOOLS}}\nGo.", "- a");
/// assert_eq!((text.as_str(), found), ("Tools:\n- a\nGo.", true));
/// ```
pub fn fill_placeholders(prompt: &str, manual: &str) -> (String, bool) {
    // Spec 001's template states ATTP's rules around its placeholder: the
    // placeholder takes the tools alone.
    let manual = manual.strip_prefix(ATTP_RULES).unwrap_or(manual);
    let mut out = prompt.to_string();
    let mut found = false;
    for p in PLACEHOLDERS {
        if out.contains(p) {
            found = true;
            out = out.replace(p, manual);
        }
    }
    (out, found)
}

/// How [`place_manual`] put the manual into a prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ManualPlace {
    /// In place of the prompt's placeholders.
    Placeholders,
    /// After the prompt, which has no placeholder (a blank line between).
    Appended,
    /// Alone: the prompt was empty.
    Alone,
}

/// The prompt with the manual in it: in place of its placeholders
/// ([`fill_placeholders`]), else after it, else alone. The one rule the
/// agent, the proxy's tool calling and `spindle tools manual --prompt`
/// follow.
///
/// ```
/// use spindle::tools::{ManualPlace, place_manual};
/// assert_eq!(place_manual("Be brief.\n", "- a"), ("Be brief.\n\n- a".to_string(), ManualPlace::Appended));
/// assert_eq!(place_manual("Tools: {{AVAILABLE_TOOLS}}", "- a").1, ManualPlace::Placeholders);
/// assert_eq!(place_manual(" ", "- a"), ("- a".to_string(), ManualPlace::Alone));
/// ```
pub fn place_manual(prompt: &str, manual: &str) -> (String, ManualPlace) {
    match fill_placeholders(prompt, manual) {
        (filled, true) => (filled, ManualPlace::Placeholders),
        _ if prompt.trim().is_empty() => (manual.to_string(), ManualPlace::Alone),
        _ => (format!("{}\n\n{manual}", prompt.trim_end()), ManualPlace::Appended),
    }
}

fn tam_manual(tools: &[&ToolDef], protocol: Protocol) -> String {
    let (open, close) = protocol.tam_delims();
    let mut s = String::new();
    let _ = writeln!(
        s,
        "To call a tool, write a TAM block. Each line is key:{open}value{close}; a value needs no escaping and may span several lines.\n"
    );
    let _ = writeln!(
        s,
        "<|[REQUEST_TOOL]|>\ncommand:{open}ToolID{close}\nparameter_name:{open}value{close}\n<|[END_TOOL]|>\n"
    );
    let _ = writeln!(
        s,
        "To run several tools in order in one block, number them: command_1 with its parameters suffixed _1 \
(file_path_1), then command_2, and so on. Steps run in ascending order. on_error_N:{open}continue{close} goes on \
after step N fails (the default, stop, ends the block); retry_N:{open}2{close} retries step N; common_NAME sets \
parameter NAME for every step. Results come back as lines starting with \"Observation:\".\n"
    );
    s.push_str("Available tools:\n");
    for t in tools {
        let _ = write!(s, "\n- Tool ID: {}\n", t.id);
        if let Some(d) = t.description.as_deref().or(t.display_name.as_deref()) {
            let _ = writeln!(s, "  - Description: {}", one_line(d));
        }
        let params = params_of(t);
        if params.is_empty() {
            s.push_str("  - Parameters: none\n");
        } else {
            s.push_str("  - Parameters:\n");
            for p in &params {
                let _ = writeln!(s, "    - {}", param_line(p));
            }
        }
        s.push_str("  - Example:\n    <|[REQUEST_TOOL]|>\n");
        let _ = writeln!(s, "    command:{open}{}{close}", t.id);
        for (k, v) in example_args(t) {
            let _ = writeln!(s, "    {k}:{open}{}{close}", as_text(&v));
        }
        s.push_str("    <|[END_TOOL]|>\n");
    }
    s
}

/// `name (type, required): description [default: ..] [one of: ..]`.
fn param_line(p: &ParamInfo) -> String {
    let mut line = format!("{} ({}, {})", p.name, p.ty, if p.required { "required" } else { "optional" });
    if let Some(d) = &p.description {
        let _ = write!(line, ": {d}");
    }
    if let Some(d) = &p.default {
        let _ = write!(line, " (default: {d})");
    }
    if !p.choices.is_empty() {
        let list: Vec<String> = p.choices.iter().map(Value::to_string).collect();
        let _ = write!(line, " (one of: {})", list.join(", "));
    }
    line
}

fn action_manual(tools: &[&ToolDef]) -> String {
    let mut s = String::from("You have access to the following tools:\n\n**Tools (direct function calls):**\n\n");
    for t in tools {
        let desc = t.description.as_deref().or(t.display_name.as_deref()).map(one_line).unwrap_or_default();
        let _ = writeln!(s, "*   `<{}>`: {desc}", t.id);
        let params = params_of(t);
        if params.is_empty() {
            s.push_str("    *   Parameters: none\n");
            continue;
        }
        s.push_str("    *   Parameters:\n");
        for p in &params {
            let mut line = param_line(p);
            line.replace_range(..p.name.len(), &format!("`<{}>`", p.name));
            let _ = writeln!(s, "        *   {line}");
        }
    }
    s.push_str(
        "\nWhen you decide to use a tool, first explain your reasoning, then output one <ACTION> block with the chosen \
tool ID as the main tag and its parameters as child tags, for example:\n\n",
    );
    if let Some(t) = tools.first() {
        let _ = writeln!(s, "{}\n", action_block(&t.id, &example_args(t)));
    }
    s.push_str(
        "Wrap a value that holds <, & or several lines in <![CDATA[...]]>. Write at most one <ACTION> block per \
answer: only the first one runs. The result comes back as a line starting with \"Observation:\". If no action is \
needed, just give your textual response without an <ACTION> block.\n",
    );
    s
}

/// An `<ACTION>` block calling `id` with `args`.
fn action_block(id: &str, args: &Map<String, Value>) -> String {
    let mut s = format!("<ACTION>\n    <{id}>\n");
    for (k, v) in args {
        let _ = writeln!(s, "        <{k}>{}</{k}>", xml_value(v));
    }
    let _ = write!(s, "    </{id}>\n</ACTION>");
    s
}

/// A value as ACTION parameter text: CDATA when it holds markup or lines.
fn xml_value(v: &Value) -> String {
    let text = as_text(v);
    if text.contains(['<', '&', '\n']) || !v.is_string() && (v.is_object() || v.is_array()) {
        format!("<![CDATA[{}]]>", text.replace("]]>", "]]]]><![CDATA[>"))
    } else {
        text
    }
}

/// The Python name of one tool in ATTP code, alone: the id when it is an
/// identifier, else its part after the last `:` or `.`. Among other tools
/// the names can differ (two tools named `get`); the manual and the checks
/// use [`python_names`](crate::calls::attp::python_names) over the whole
/// list.
pub fn python_name(id: &str) -> String {
    crate::calls::attp::python_names(&[id]).pop().unwrap_or_default()
}

fn python_type(ty: &str) -> &'static str {
    match ty.split(" | ").next().unwrap_or("") {
        "string" => "str",
        "integer" => "int",
        "number" => "float",
        "boolean" => "bool",
        "object" => "dict",
        t if t.starts_with("array") => "list",
        _ => "Any",
    }
}

/// A JSON value as a Python literal (`true` -> `True`, `null` -> `None`;
/// strings as JSON string literals, which Python reads the same).
pub fn python_literal(v: &Value) -> String {
    match v {
        Value::Null => "None".into(),
        Value::Bool(true) => "True".into(),
        Value::Bool(false) => "False".into(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => Value::String(s.clone()).to_string(),
        Value::Array(items) => format!("[{}]", items.iter().map(python_literal).collect::<Vec<_>>().join(", ")),
        Value::Object(map) => format!(
            "{{{}}}",
            map.iter()
                .map(|(k, v)| format!("{}: {}", Value::String(k.clone()), python_literal(v)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// A Python call expression: `name(a="x", b=2)`.
fn python_call(name: &str, args: &Map<String, Value>) -> String {
    let list: Vec<String> = args.iter().map(|(k, v)| format!("{k}={}", python_literal(v))).collect();
    format!("{name}({})", list.join(", "))
}

/// Spec 001's system prompt: the output format, before the tool stubs.
const ATTP_RULES: &str = "Answer in ATTP (Agentic TOML Tool-use Protocol): your whole response is one valid TOML \
document.

- `thought`: your reasoning, as a multi-line string: what the user wants, which tools you need and why, that they \
are in the list of available tools below, and your plan.
- `[tool_call]` to use tools: `status = \"success\"`, `target` (what the calls are for) and `code`: Python that \
calls the tool functions below (several in one block if needed) and assigns what you want back to `__result__`. \
These libraries are already there: math, json, datetime, re, random, statistics (importing them is allowed, not \
needed); import nothing else.
- When the request is beyond what the tools can do: `status = \"fail\"` and a `message` that says why and offers an \
alternative.

Only the functions listed below exist. Results come back as lines starting with \"Observation:\".

```toml
thought = \"\"\"
1. The request: ...
2. Tools: ...
3. Plan: ...
\"\"\"

[tool_call]
status = \"success\"
target = \"...\"
code = '''
__result__ = {\"answer\": some_tool(arg=1)}
'''
```

Available tools:

";

fn attp_manual(tools: &[&ToolDef]) -> String {
    let mut s = String::from(ATTP_RULES);
    s.push_str("```python\n# ===== Available tools =====\n");
    let ids: Vec<&str> = tools.iter().map(|t| t.id.as_str()).collect();
    for (t, name) in tools.iter().zip(crate::calls::attp::python_names(&ids)) {
        let params = params_of(t);
        let sig: Vec<String> = params
            .iter()
            .map(|p| {
                let ty = python_type(&p.ty);
                match (&p.default, p.required) {
                    (_, true) => format!("{}: {ty}", p.name),
                    (Some(d), false) => format!("{}: {ty} = {}", p.name, python_literal(d)),
                    (None, false) => format!("{}: {ty} | None = None", p.name),
                }
            })
            .collect();
        let _ = writeln!(s, "\ndef {name}({}) -> Any:\n    \"\"\"", sig.join(", "));
        if let Some(d) = t.description.as_deref().or(t.display_name.as_deref()) {
            let _ = writeln!(s, "    {}\n", one_line(d));
        }
        if !params.is_empty() {
            s.push_str("    Args:\n");
            for p in &params {
                let d = p.description.as_deref().unwrap_or("");
                let req = if p.required { "" } else { " (optional)" };
                let _ = writeln!(s, "        {}: {d}{req}", p.name);
            }
            s.push('\n');
        }
        let _ = writeln!(
            s,
            "    Example:\n        >>> __result__ = {}\n    \"\"\"\n    pass",
            python_call(&name, &example_args(t))
        );
    }
    s.push_str("```\n");
    s
}

fn filament_manual(tools: &[&ToolDef]) -> String {
    let mut s = String::from(
        "To call a tool, write a <tool_call> element: its name attribute is the tool ID and its body is a JSON object \
of the arguments, for example:\n\n",
    );
    if let Some(t) = tools.first() {
        let _ = writeln!(s, "{}\n", filament_call_text(&t.id, &example_args(t)));
    }
    s.push_str("The result comes back in a <tool_result> element. Available tools:\n");
    for t in tools {
        let _ = write!(s, "\n- {}", t.id);
        if let Some(d) = t.description.as_deref().or(t.display_name.as_deref()) {
            let _ = write!(s, ": {}", one_line(d));
        }
        s.push('\n');
        let params = params_of(t);
        if params.is_empty() {
            s.push_str("  Arguments: none ({})\n");
        } else {
            s.push_str("  Arguments:\n");
            for p in &params {
                let _ = writeln!(s, "  - {}", param_line(p));
            }
        }
        let _ = writeln!(s, "  Parameters schema: {}", t.parameters);
    }
    s
}

/// `<tool_call name="id">{args}</tool_call>`.
/// The tools section Qwen2.5/Qwen3's chat template writes into the system
/// message (the text Hermes-format models were trained on), word for word.
fn hermes_manual(tools: &[&ToolDef]) -> String {
    let mut s = String::from(
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with \
function signatures within <tools></tools> XML tags:\n<tools>",
    );
    if let Value::Array(list) = openai_tools(tools.iter().copied()) {
        for t in list {
            s.push('\n');
            s.push_str(&t.to_string());
        }
    }
    s.push_str(
        "\n</tools>\n\nFor each function call, return a json object with function name and arguments within \
<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>",
    );
    s
}

/// One call in the Hermes form, as Qwen's template writes an assistant's
/// `tool_calls` back: `<tool_call>\n{"name": …, "arguments": …}\n</tool_call>`.
fn hermes_call_text(id: &str, args: &Map<String, Value>) -> String {
    let body = serde_json::json!({"name": id, "arguments": Value::Object(args.clone())});
    format!("<tool_call>\n{body}\n</tool_call>")
}

fn filament_call_text(id: &str, args: &Map<String, Value>) -> String {
    let name = id.replace('&', "&amp;").replace('"', "&quot;");
    format!("<tool_call name=\"{name}\">{}</tool_call>", Value::Object(args.clone()))
}

/// The name and arguments object of one OpenAI `tool_calls` entry
/// (`{"id", "type": "function", "function": {"name", "arguments": "<json>"}}`);
/// arguments that are not a JSON object are kept under `"arguments"`.
fn openai_call(entry: &Value) -> (String, Map<String, Value>) {
    let function = entry.get("function").unwrap_or(entry);
    let name = function.get("name").and_then(Value::as_str).unwrap_or_default().to_string();
    let args = match function.get("arguments") {
        Some(Value::String(s)) => match serde_json::from_str::<Value>(s) {
            Ok(Value::Object(m)) => m,
            Ok(other) => Map::from_iter([("arguments".to_string(), other)]),
            Err(_) if s.trim().is_empty() => Map::new(),
            Err(_) => Map::from_iter([("arguments".to_string(), Value::String(s.clone()))]),
        },
        Some(Value::Object(m)) => m.clone(),
        Some(Value::Null) | None => Map::new(),
        Some(other) => Map::from_iter([("arguments".to_string(), other.clone())]),
    };
    (name, args)
}

/// An assistant message's OpenAI `tool_calls` array written as the call
/// text of `protocol`, so that a replayed chat history shows the model its
/// own calls in the notation it was told to use.
///
/// * TAM: one block; several calls become steps `command_1`, `command_2`, ...
/// * ACTION: one `<ACTION>` block per call (only the first of an answer
///   runs, so a history with several calls shows several blocks).
/// * ATTP: a TOML document whose code calls each tool, results in
///   `__result__`.
/// * Filament: one `<tool_call name>` element per call.
/// * Hermes: one `<tool_call>{"name", "arguments"}</tool_call>` per call,
///   one per line (Qwen's template).
/// * `openai`: the array as JSON.
///
/// ```
/// use spindle::tools::{call_text, Protocol};
/// use serde_json::json;
///
/// let calls = json!([{"id": "call_1", "type": "function",
///     "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]);
/// assert_eq!(
///     call_text(Protocol::Tam, &calls),
///     "<|[REQUEST_TOOL]|>\ncommand:»»»get_weather«««\ncity:»»»Oslo«««\n<|[END_TOOL]|>"
/// );
/// assert_eq!(call_text(Protocol::Filament, &calls), "<tool_call name=\"get_weather\">{\"city\":\"Oslo\"}</tool_call>");
/// ```
pub fn call_text(protocol: Protocol, tool_calls: &Value) -> String {
    let calls: Vec<(String, Map<String, Value>)> = match tool_calls {
        Value::Array(list) => list.iter().map(openai_call).collect(),
        single @ Value::Object(_) => vec![openai_call(single)],
        _ => Vec::new(),
    };
    match protocol {
        Protocol::Tam | Protocol::TamCjk => {
            let (open, close) = protocol.tam_delims();
            let mut s = String::from("<|[REQUEST_TOOL]|>\n");
            let numbered = calls.len() > 1;
            for (i, (name, args)) in calls.iter().enumerate() {
                let suffix = if numbered { format!("_{}", i + 1) } else { String::new() };
                let _ = writeln!(s, "command{suffix}:{open}{name}{close}");
                for (k, v) in args {
                    let _ = writeln!(s, "{k}{suffix}:{open}{}{close}", as_text(v));
                }
            }
            s.push_str("<|[END_TOOL]|>");
            s
        }
        Protocol::Action => calls.iter().map(|(n, a)| action_block(n, a)).collect::<Vec<_>>().join("\n"),
        Protocol::Attp => {
            let mut code = String::new();
            if calls.len() == 1 {
                let _ = writeln!(code, "__result__ = {}", python_call(&python_name(&calls[0].0), &calls[0].1));
            } else {
                let mut names = Vec::new();
                for (i, (n, a)) in calls.iter().enumerate() {
                    let _ = writeln!(code, "result{} = {}", i + 1, python_call(&python_name(n), a));
                    names.push(format!("\"result{0}\": result{0}", i + 1));
                }
                let _ = writeln!(code, "__result__ = {{{}}}", names.join(", "));
            }
            let target: Vec<&str> = calls.iter().map(|(n, _)| n.as_str()).collect();
            format!(
                "thought = \"\"\"\nCalling {}.\n\"\"\"\n\n[tool_call]\nstatus = \"success\"\ntarget = {}\ncode = '''\n{code}'''",
                target.join(", "),
                Value::String(format!("call {}", target.join(", ")))
            )
        }
        Protocol::Filament => calls.iter().map(|(n, a)| filament_call_text(n, a)).collect::<Vec<_>>().join("\n"),
        Protocol::Hermes => calls.iter().map(|(n, a)| hermes_call_text(n, a)).collect::<Vec<_>>().join("\n"),
        Protocol::Openai => tool_calls.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn catalog() -> ToolCatalog {
        let mut c = ToolCatalog::new();
        let mut d = ToolDef::new(
            "Weather:get",
            json!({"type": "object", "properties": {
                "city": {"type": "string", "description": "City name"},
                "days": {"type": "integer", "default": 1},
                "units": {"enum": ["c", "f"]}
            }, "required": ["city"]}),
        );
        d.description = Some("Forecast\n for a city.".into());
        c.add(d).unwrap_or_else(|e| panic!("{e}"));
        c
    }

    #[test]
    fn every_protocol_names_every_parameter() {
        let c = catalog();
        for p in Protocol::ALL {
            let text = manual(c.tools(), p);
            for needle in ["city", "days", "units"] {
                assert!(text.contains(needle), "{p}: no {needle} in\n{text}");
            }
            // (OpenAI's API takes `Weather_get` for the id.)
            let named = ["Weather:get", "def get(", "\"Weather_get\""].iter().any(|n| text.contains(n));
            assert!(named, "{p}: no tool in\n{text}");
        }
    }

    #[test]
    fn attp_signature_and_example() {
        let text = manual(catalog().tools(), Protocol::Attp);
        assert!(text.contains("def get(city: str, days: int = 1, units: Any | None = None) -> Any:"), "{text}");
        assert!(text.contains(">>> __result__ = get(city=\"<city>\")"), "{text}");
    }

    #[test]
    fn tam_cjk_uses_cjk_delimiters() {
        let text = manual(catalog().tools(), Protocol::TamCjk);
        assert!(text.contains("command:「始」Weather:get「末」"), "{text}");
        assert!(!text.contains("»»»"));
    }

    #[test]
    fn openai_round_trip() {
        let c = catalog();
        let tools = openai_tools(c.tools());
        let mut back = ToolCatalog::new();
        assert_eq!(back.add_openai_tools(&tools).unwrap_or_default(), ["Weather:get"]);
        assert_eq!(manual(back.tools(), Protocol::Tam), manual(c.tools(), Protocol::Tam));
    }

    #[test]
    fn call_text_in_every_protocol_parses_back() {
        let calls = json!([
            {"id": "a", "type": "function", "function": {"name": "Weather:get", "arguments": "{\"city\": \"Oslo <N>\", \"days\": 2}"}},
            {"id": "b", "type": "function", "function": {"name": "Weather:get", "arguments": "{\"city\": \"Rome\"}"}}
        ]);
        let tam = call_text(Protocol::Tam, &calls);
        assert!(tam.contains("command_2:»»»Weather:get«««\ncity_2:»»»Rome«««"), "{tam}");
        let action = call_text(Protocol::Action, &calls);
        assert!(action.contains("<city><![CDATA[Oslo <N>]]></city>"), "{action}");
        let attp = call_text(Protocol::Attp, &calls);
        assert!(attp.contains("result1 = get(city=\"Oslo <N>\", days=2)"), "{attp}");
        assert!(toml::from_str::<toml::Value>(&attp).is_ok(), "{attp}");
    }
}
