//! The `variable_update` payload (spec 003 §3.2.1; also `<state_update>`
//! and the legacy `<UpdateVariable>`): `{analysis, ops, invalid}`.
//!
//! * `analysis`: the text of the optional `<analysis>` child (trimmed), or
//!   `null`.
//! * `ops`: the valid ops, each `[OP, path, value?]` with OP upper-cased.
//! * `invalid`: the entries that are not valid ops, each `{index, op,
//!   error}` (`index` counts all entries, valid or not); each one also gets
//!   an `invalid_op` diagnostic. Always present, usually empty.
//!
//! The ops are read from JSON (leniently, see [`super::json`]): an array of
//! ops, one op without the outer array, several arrays one per line, an
//! `{"ops": [..]}` object, or `{op, path, value}` objects. The MVU /
//! SillyTavern legacy form is read too:
//!
//! ```text
//! _.set('悠纪.好感度', 33, 35);//reason     -> ["SET", "悠纪.好感度", 35]
//! _.set('当前日期', '2000-01-01');         -> ["SET", "当前日期", "2000-01-01"]
//! _.add('gold', 10);                       -> ["ADD", "gold", 10]
//! _.assign('inventory', 'key');            -> ["PUSH", "inventory", "key"]
//! _.assign('achievements', 'FIRST', 'x');  -> ["SET", "achievements.FIRST", "x"]
//! _.remove('temp_marker');                 -> ["DELETE", "temp_marker"]
//! _.remove('inventory', 2);                -> ["DELETE", "inventory[2]"]
//! ```
//!
//! Calls that have no Filament op (`_.assign(path, 0, v)` inserting at an
//! index, `_.remove(path, 'value')` removing by value, arguments that are
//! expressions like `10 + 2`) are listed under `invalid`.

use super::json::{self, Leniency};
use super::{Payload, diag, extract_child, leniency_diagnostics, object};
use crate::event::DiagnosticCode;
use crate::event::{Diagnostic, Element, Level};
use crate::state::{Op, OpCode, OpRef, Path, Segment};
use serde_json::{Value, json};
use std::borrow::Cow;

/// The payload of a completed `variable_update` element.
pub(crate) fn variable_update(el: &Element) -> Payload {
    let mut out = Payload::none();
    let (analysis, ops_text, ops_base) = split_analysis(&el.text, &mut out.diagnostics);
    let mut analysis = analysis;
    let trimmed = ops_text.trim();
    let read = if trimmed.is_empty() {
        out.diagnostics.push(diag(Level::Warning, DiagnosticCode::NoOps, "the variable update holds no ops"));
        ReadOps::default()
    } else if is_mvu(trimmed) {
        out.diagnostics.push(diag(
            Level::Info,
            DiagnosticCode::MvuFormat,
            "ops were read from the MVU/SillyTavern `_.set(...)` form",
        ));
        let (mut candidates, mut invalid) = (Vec::new(), Vec::new());
        mvu_ops(trimmed, &mut candidates, &mut invalid);
        for bad in &invalid {
            let call = bad.get("op").and_then(Value::as_str).unwrap_or_default();
            let error = bad.get("error").and_then(Value::as_str).unwrap_or_default();
            out.diagnostics.push(diag(Level::Warning, DiagnosticCode::InvalidOp, &format!("{call}: {error}")));
        }
        read_ops(candidates, invalid)
    } else {
        // Each attempt is read to the end (its ops built once), so that
        // whether it gave a valid op is known without reading it twice.
        let read_attempt = |attempt: Result<(Vec<Value>, Vec<Diagnostic>), String>| {
            attempt.map(|(list, diags)| (read_ops(list, Vec::new()), diags))
        };
        let mut attempt = read_attempt(json_ops(&ops_text, ops_base, &mut analysis));
        if !gave_an_op(&attempt) {
            // Prose before the ops may hold brackets (`mood [calm] rises`):
            // try the lines that start like JSON, and keep the first that
            // gives valid ops.
            let mut at = 0;
            for line in ops_text.split_inclusive('\n') {
                let line_at = at;
                at += line.len();
                let lead = line.len() - line.trim_start().len();
                if line_at == 0 || !line.trim_start().starts_with(['[', '{']) {
                    continue;
                }
                let from = line_at + lead;
                let mut retry_analysis = analysis.clone();
                let retry = read_attempt(json_ops(&ops_text[from..], ops_base + from, &mut retry_analysis));
                if gave_an_op(&retry) {
                    attempt = retry.map(|(read, mut diags)| {
                        let message = format!(
                            "JSON read leniently: text before the ops was ignored (the ops start at byte {} of the element text)",
                            ops_base + from
                        );
                        diags.insert(0, diag(Level::Warning, DiagnosticCode::JsonSurroundingProse, &message));
                        (read, diags)
                    });
                    analysis = retry_analysis;
                    break;
                }
            }
        }
        match attempt {
            Ok((read, diags)) => {
                out.diagnostics.extend(diags);
                read
            }
            Err(message) => {
                return Payload::failed(out.diagnostics, &message, json!({"analysis": analysis}));
            }
        }
    };
    let ReadOps { ops, diagnostics, mut invalid } = read;
    out.diagnostics.extend(diagnostics);
    invalid.sort_by_key(|v| v.get("index").and_then(Value::as_u64).unwrap_or(0));
    out.value =
        object!([("analysis", json!(analysis)), ("ops", Value::Array(ops)), ("invalid", Value::Array(invalid))]);
    out
}

/// Separates the `<analysis>` child from the ops. Returns the analysis, the
/// text around it, and the offset of that text in the element (for
/// diagnostics, exact when the analysis comes first, as the spec writes it).
fn split_analysis<'a>(text: &'a str, diagnostics: &mut Vec<Diagnostic>) -> (Option<String>, Cow<'a, str>, usize) {
    match extract_child(text, "analysis") {
        Some(found) => {
            if !found.closed {
                diagnostics.push(diag(
                    Level::Warning,
                    DiagnosticCode::AnalysisUnclosed,
                    "<analysis> was not closed; it was taken to end where the ops begin",
                ));
            }
            let analysis = dedent(found.inner);
            let analysis = (!analysis.is_empty()).then_some(analysis);
            (analysis, found.rest, found.rest_base)
        }
        None => (None, Cow::Borrowed(text), 0),
    }
}

/// Trims blank lines around the text and the indentation its lines share
/// (an analysis is usually indented inside its tag).
fn dedent(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let first = lines.iter().position(|l| !l.trim().is_empty());
    let last = lines.iter().rposition(|l| !l.trim().is_empty());
    let (Some(first), Some(last)) = (first, last) else {
        return String::new();
    };
    let lines = &lines[first..=last];
    let indent =
        lines.iter().filter(|l| !l.trim().is_empty()).map(|l| l.len() - l.trim_start().len()).min().unwrap_or(0);
    lines
        .iter()
        .map(|l| match l.get(..indent) {
            Some(lead) if lead.trim().is_empty() => &l[indent..],
            _ => l.trim_start(),
        })
        .map(str::trim_end)
        .collect::<Vec<_>>()
        .join("\n")
}

/// Reads JSON ops from `text` (at offset `base` of the element text): the
/// op candidates and the diagnostics of reading them, or why they could not
/// be read.
fn json_ops(text: &str, base: usize, analysis: &mut Option<String>) -> Result<(Vec<Value>, Vec<Diagnostic>), String> {
    let mut diags = Vec::new();
    let values = match serde_json::from_str::<Value>(text.trim()) {
        Ok(v) => vec![v],
        Err(_) => match json::parse_values(text) {
            Ok((values, used)) => {
                diags.extend(leniency_diagnostics(&used, base));
                values
            }
            Err(e) => {
                return Err(format!(
                    "the ops are not JSON, even read leniently: {} at byte {}",
                    e.message,
                    e.at + base
                ));
            }
        },
    };
    let (list, unwrapped) = op_list(values, analysis)?;
    if unwrapped {
        diags.push(diag(
            Level::Warning,
            DiagnosticCode::OpsNotWrapped,
            "the ops were not inside one JSON array; read them one by one",
        ));
    }
    Ok((list, diags))
}

/// Whether an attempt read at least one valid op.
fn gave_an_op(attempt: &Result<(ReadOps, Vec<Diagnostic>), String>) -> bool {
    attempt.as_ref().is_ok_and(|(read, _)| !read.ops.is_empty())
}

/// Op candidates read: the valid ops (normalised JSON), the diagnostics
/// of reading them, and the invalid ones.
#[derive(Default)]
struct ReadOps {
    ops: Vec<Value>,
    diagnostics: Vec<Diagnostic>,
    invalid: Vec<Value>,
}

/// Reads op candidates (`Null` is a placeholder for an MVU call already
/// in `listed_invalid`), in order; invalid ones are listed with their
/// index.
fn read_ops(candidates: Vec<Value>, listed_invalid: Vec<Value>) -> ReadOps {
    let mut read = ReadOps { ops: Vec::new(), diagnostics: Vec::new(), invalid: listed_invalid };
    for (index, candidate) in candidates.into_iter().enumerate() {
        if matches!(candidate, Value::Null) {
            continue; // a placeholder for an MVU call already listed as invalid
        }
        let (candidate, alias) = normalise_alias(candidate);
        if let Some((from, to)) = alias {
            read.diagnostics.push(diag(Level::Warning, DiagnosticCode::OpAlias, &format!("op {from:?} read as {to}")));
        }
        match Op::read_json(&candidate) {
            // An op already written as `[OP, path, value?]` in the
            // canonical spelling is its own normalised form: kept as read
            // (no copy of its path and value).
            Ok(op) if is_canonical(&candidate, &op) => read.ops.push(candidate),
            Ok(op) => read.ops.push(op.to_op().into_json()),
            Err(e) => {
                read.diagnostics.push(diag(
                    Level::Warning,
                    DiagnosticCode::InvalidOp,
                    &format!("op {index} {candidate}: {e}"),
                ));
                read.invalid.push(json!({"index": index, "op": candidate, "error": e.to_string()}));
            }
        }
    }
    read
}

/// Whether `candidate` is exactly what `op.into_json()` gives: an array of
/// the canonical op name, the path and the value (if the op takes one).
fn is_canonical(candidate: &Value, op: &OpRef<'_>) -> bool {
    match candidate.as_array().map(Vec::as_slice) {
        Some([Value::String(code), Value::String(path), rest @ ..]) => {
            code == op.code.as_str() && *path == op.path && rest.len() == usize::from(op.value.is_some())
        }
        _ => false,
    }
}

/// Turns the JSON documents into the list of op candidates. The flag says
/// whether they were not wrapped in one array.
fn op_list(values: Vec<Value>, analysis: &mut Option<String>) -> Result<(Vec<Value>, bool), String> {
    let single = values.len() == 1;
    let mut list = Vec::new();
    let mut unwrapped = !single;
    for value in values {
        match value {
            Value::Array(items) if items.first().is_some_and(Value::is_string) => {
                // One op: `["SET", "a", 1]`.
                if single {
                    unwrapped = true;
                }
                list.push(Value::Array(items));
            }
            Value::Array(items) => list.extend(items),
            Value::Object(mut map) => {
                if analysis.is_none()
                    && let Some(Value::String(a)) = map.get("analysis")
                {
                    *analysis = Some(a.trim().to_string());
                }
                let nested = ["ops", "operations", "updates", "changes", "opcodes"].iter().find_map(|k| {
                    match map.shift_remove(*k) {
                        Some(Value::Array(items)) => Some(items),
                        _ => None,
                    }
                });
                match nested {
                    Some(items) => list.extend(items),
                    None if map.contains_key("op") || map.contains_key("operation") => list.push(Value::Object(map)),
                    None => return Err("the ops are a JSON object without an \"ops\" array".into()),
                }
            }
            other => {
                return Err(format!("the ops must be a JSON array, found {}", crate::state::type_name(&other)));
            }
        }
    }
    Ok((list, unwrapped))
}

/// Op names models use for the spec's ops.
const ALIASES: &[(&str, OpCode)] = &[
    ("REMOVE", OpCode::Delete),
    ("DEL", OpCode::Delete),
    ("UNSET", OpCode::Delete),
    ("APPEND", OpCode::Push),
    ("INSERT", OpCode::Push),
    ("ASSIGN", OpCode::Set),
    ("UPDATE", OpCode::Set),
    ("INC", OpCode::Add),
    ("INCR", OpCode::Add),
    ("INCREMENT", OpCode::Add),
    ("DEC", OpCode::Sub),
    ("DECR", OpCode::Sub),
    ("DECREMENT", OpCode::Sub),
    ("SUBTRACT", OpCode::Sub),
    ("MULTIPLY", OpCode::Mul),
    ("DIVIDE", OpCode::Div),
];

/// Replaces an aliased op name (`REMOVE`) by the spec's (`DELETE`).
fn normalise_alias(candidate: Value) -> (Value, Option<(String, OpCode)>) {
    let Value::Array(mut items) = candidate else {
        return (candidate, None);
    };
    let alias = items.first().and_then(Value::as_str).and_then(|name| {
        let name = name.trim();
        ALIASES.iter().find(|(a, _)| a.eq_ignore_ascii_case(name)).map(|(_, code)| (name.to_string(), *code))
    });
    if let (Some((_, code)), Some(first)) = (&alias, items.first_mut()) {
        *first = Value::String(code.as_str().into());
    }
    (Value::Array(items), alias)
}

// ----- the MVU legacy form ---------------------------------------------

/// The MVU commands.
const MVU_CALLS: &[&str] = &["set", "add", "assign", "insert", "remove", "unset", "delete"];

/// Whether the ops text is in the MVU `_.set(...)` form rather than JSON.
fn is_mvu(text: &str) -> bool {
    // Not `trim_start_matches("```")`: a `&str` pattern builds a two-way
    // searcher (~350 instructions), paid by every update, fenced or not.
    let mut body = text;
    while let Some(rest) = body.strip_prefix("```") {
        body = rest;
    }
    let body = body.trim_start();
    if body.starts_with(['[', '{']) {
        return false;
    }
    next_call(text, 0).is_some()
}

/// The next `_.name(` at or after `from`: (start of `_`, name, offset after
/// `(`).
fn next_call(text: &str, from: usize) -> Option<(usize, String, usize)> {
    let bytes = text.as_bytes();
    let mut i = from;
    while let Some(rel) = text.get(i..)?.find("_.") {
        let start = i + rel;
        let mut j = start + 2;
        while j < bytes.len() && bytes[j] == b' ' {
            j += 1;
        }
        let name_start = j;
        while j < bytes.len() && bytes[j].is_ascii_alphabetic() {
            j += 1;
        }
        let name = text[name_start..j].to_ascii_lowercase();
        while j < bytes.len() && bytes[j] == b' ' {
            j += 1;
        }
        let prev_ok = start == 0 || !(bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_');
        if prev_ok && bytes.get(j) == Some(&b'(') && MVU_CALLS.contains(&name.as_str()) {
            return Some((start, name, j + 1));
        }
        i = start + 2;
    }
    None
}

/// The offset of the `)` that closes a call whose arguments start at
/// `from` (quotes and brackets respected).
fn call_end(text: &str, from: usize) -> Option<usize> {
    let bytes = text.as_bytes();
    let mut depth = 0usize;
    let mut quote: Option<u8> = None;
    let mut i = from;
    while i < bytes.len() {
        let b = bytes[i];
        match quote {
            Some(q) => {
                if b == b'\\' {
                    i += 1;
                } else if b == q {
                    quote = None;
                }
            }
            None => match b {
                b'\'' | b'"' | b'`' => quote = Some(b),
                b'(' | b'[' | b'{' => depth += 1,
                b')' if depth == 0 => return Some(i),
                b')' | b']' | b'}' => depth = depth.saturating_sub(1),
                _ => {}
            },
        }
        i += 1;
    }
    None
}

/// Reads every MVU call. Valid translations go to `candidates`; calls with
/// no Filament op get a `null` placeholder there (so that indexes count
/// every call) and an entry in `invalid`.
fn mvu_ops(text: &str, candidates: &mut Vec<Value>, invalid: &mut Vec<Value>) {
    let mut from = 0;
    while let Some((start, name, args_at)) = next_call(text, from) {
        let index = candidates.len();
        let Some(end) = call_end(text, args_at) else {
            let call = text[start..].lines().next().unwrap_or_default().to_string();
            invalid.push(json!({"index": index, "op": call, "error": "the call is not closed with ')'"}));
            candidates.push(Value::Null);
            break;
        };
        let call = text[start..=end].to_string();
        from = end + 1;
        match mvu_op(&name, &text[args_at..end]) {
            Ok(op) => candidates.push(op),
            Err(error) => {
                invalid.push(json!({"index": index, "op": call, "error": error}));
                candidates.push(Value::Null);
            }
        }
    }
}

/// Leniencies an MVU argument list may need (JavaScript literals); any
/// other means the arguments are not literal values (`10 + 2`).
const MVU_OK: &[Leniency] = &[
    Leniency::SingleQuotes,
    Leniency::SmartQuotes,
    Leniency::TrailingComma,
    Leniency::UnquotedKey,
    Leniency::PythonLiteral,
    Leniency::JsLiteral,
    Leniency::Comment,
    Leniency::ControlCharacter,
];

/// Translates one call into an op candidate.
fn mvu_op(name: &str, args: &str) -> Result<Value, String> {
    let wrapped = format!("[{args}]");
    let not_literal =
        || format!("the arguments ({}) are not literal values; expressions are not evaluated", args.trim());
    let read = json::parse(&wrapped).map_err(|_| not_literal())?;
    if read.leniencies.iter().any(|u| !MVU_OK.contains(&u.kind)) {
        return Err(not_literal());
    }
    let Value::Array(args) = read.value else {
        return Err("the arguments do not parse".into());
    };
    let path = match args.first() {
        Some(Value::String(p)) => p.clone(),
        Some(other) => {
            return Err(format!("the path must be a string, found {}", crate::state::type_name(other)));
        }
        None => return Err("the call has no arguments".into()),
    };
    let rest = args.get(1..).unwrap_or_default();
    match (name, rest) {
        ("set", [new]) | ("set", [_, new]) => Ok(json!(["SET", path, new])),
        ("add", [delta]) => Ok(json!(["ADD", path, delta])),
        ("assign" | "insert", [value]) => Ok(json!(["PUSH", path, value])),
        ("assign" | "insert", [Value::String(key), value]) => Ok(json!(["SET", child_path(&path, Segment::Key(key.clone())), value])),
        ("assign" | "insert", [Value::Number(_), _]) => Err("inserting at an array index has no Filament op".into()),
        ("remove" | "unset" | "delete", []) => Ok(json!(["DELETE", path])),
        ("remove" | "unset" | "delete", [Value::Number(n)]) => match n.as_i64() {
            Some(i) => Ok(json!(["DELETE", child_path(&path, Segment::Index(i))])),
            None => Err("the index is not an integer".into()),
        },
        ("remove" | "unset" | "delete", [Value::String(_)]) => {
            Err("removing by key or value is ambiguous without the state (key of an object, or value in an array); write [\"DELETE\", \"path.key\"]".into())
        }
        _ => Err(format!("_.{name} does not take {} argument(s) here", args.len())),
    }
}

/// `path` extended by one step, written so that [`Path::parse`] reads it
/// back (keys with dots are quoted).
fn child_path(path: &str, seg: Segment) -> String {
    let base = Path::parse(path).map(|p| p.segments().to_vec()).unwrap_or_default();
    if base.is_empty() && !path.is_empty() {
        // Unparsable base: append textually, the op check will report it.
        return match seg {
            Segment::Key(k) => format!("{path}.{k}"),
            Segment::Index(i) => format!("{path}[{i}]"),
        };
    }
    let mut text = Path::parse(path).map(|p| p.to_string()).unwrap_or_default();
    match seg {
        Segment::Key(k) if k.contains(['.', '[', ']']) || k.is_empty() => {
            text.push_str(&format!("[\"{}\"]", k.replace('\\', "\\\\").replace('"', "\\\"")));
        }
        Segment::Key(k) if text.is_empty() => text.push_str(&k),
        Segment::Key(k) => {
            text.push('.');
            text.push_str(&k);
        }
        Segment::Index(i) => text.push_str(&format!("[{i}]")),
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An op is valid as written exactly when it is valid after its alias
    /// is normalised (no alias is an op name), so reading each candidate
    /// once, normalised, decides whether an attempt gave valid ops as
    /// reading it as written first did.
    #[test]
    fn no_alias_is_an_op_name() {
        for (alias, code) in ALIASES {
            assert_eq!(OpCode::parse(alias), None, "{alias}");
            assert_ne!(alias.to_ascii_uppercase(), code.as_str());
        }
    }

    #[test]
    fn mvu_calls_translate() {
        let table: &[(&str, Value)] = &[
            ("_.set('悠纪.好感度', 33,35);//开心", json!(["SET", "悠纪.好感度", 35])),
            ("_.set('当前日期', '2000-01-01');", json!(["SET", "当前日期", "2000-01-01"])),
            ("_.set(\"a\", \"空\", \"地点：x\");", json!(["SET", "a", "地点：x"])),
            ("_.add('gold', -5);", json!(["ADD", "gold", -5])),
            ("_.assign('inventory', '钥匙');", json!(["PUSH", "inventory", "钥匙"])),
            ("_.assign('ach', 'FIRST', {\"a\": 1});", json!(["SET", "ach.FIRST", {"a": 1}])),
            ("_.assign('', '新角色', {});", json!(["SET", "新角色", {}])),
            ("_.assign('a', 'x.y', 1);", json!(["SET", "a[\"x.y\"]", 1])),
            ("_.remove('temp');", json!(["DELETE", "temp"])),
            ("_.remove('inv', 2);", json!(["DELETE", "inv[2]"])),
            ("_.set('flag', True);", json!(["SET", "flag", true])),
        ];
        for (call, want) in table {
            let mut c = Vec::new();
            let mut inv = Vec::new();
            mvu_ops(call, &mut c, &mut inv);
            assert!(inv.is_empty(), "{call}: {inv:?}");
            assert_eq!(c, std::slice::from_ref(want), "{call}");
        }
    }

    #[test]
    fn mvu_calls_without_an_op_are_invalid() {
        for call in [
            "_.set('hp', 10, 10 + 2);",
            "_.set('x', 1, math.pow(2, 3));",
            "_.assign('inv', 0, 'scroll');",
            "_.remove('inv', 'potion');",
            "_.add('a', 1, 2);",
            "_.set('a'",
        ] {
            let mut c = Vec::new();
            let mut inv = Vec::new();
            mvu_ops(call, &mut c, &mut inv);
            assert_eq!(inv.len(), 1, "{call}: {c:?}");
            assert_eq!(c, [Value::Null], "{call}");
        }
    }

    #[test]
    fn call_detection() {
        assert!(is_mvu("_.set('a', 1);"));
        assert!(is_mvu("_. add('a', 1)"));
        assert!(!is_mvu("[[\"SET\", \"a\", \"_.set('x', 1)\"]]"));
        assert!(!is_mvu("my_.set(1)"));
        // A fence (one or more) before the ops is looked past.
        assert!(!is_mvu("```[[\"SET\", \"a\", \"_.set('x', 1)\"]]```"));
        assert!(!is_mvu("``````\n{\"op\": \"_.set('x', 1)\"}"));
        assert!(is_mvu("```js\n_.set('a', 1);\n```"));
        assert!(is_mvu("``_.set('a', 1);"));
    }
}
