//! ATTP documents (spec 001): the whole output is TOML with a `thought`
//! string and a `[tool_call]` table holding Python code.
//!
//! This module owns three things: [`parse_attp`], which reads the complete
//! document with the `toml` crate into a [`ToolCall`]; [`check_code`], the
//! code policy of spec 001 ("安全边界"); and [`ThoughtStream`], which pulls
//! the `thought` string out of the document *while it streams*, so that a
//! UI can show the model's reasoning before the document is complete. It
//! runs no code.
//!
//! # Code policy
//!
//! [`check_code`] tokenizes the Python (comments and string literals are
//! not code; the `{...}` parts of f-strings are) and reports:
//!
//! | rule | what |
//! |---|---|
//! | `import` | an `import` of anything but the pre-injected libraries ([`LIBRARIES`]), a relative or dotted import, or a name that starts with `_` (`import math`, `from datetime import datetime, timedelta` and `import json as j` are allowed: the names are already there) |
//! | `forbidden_call` | `open`, `exec`, `eval`, `compile`, `__import__` |
//! | `forbidden_module` | `os`, `subprocess`, `socket`, `requests`, `http`, `pathlib` (spec 001), and the siblings `sys`, `shutil`, `urllib`, `importlib`, `ctypes`, `builtins` |
//! | `sandbox_escape` | `__builtins__`, `__subclasses__`, `__globals__`, `__code__`, `__bases__`, `__mro__` |
//!
//! Names are matched as bare names only: `x.open()` (a method of a tool's
//! result) and `f(open=True)` (a keyword argument) are allowed.

use super::{AttpCall, CallFormat, Findings, Step, ToolCall};
use crate::event::DiagnosticCode;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The tool id of an ATTP step: its `code` runs as Python.
pub const PYTHON_TOOL: &str = "python";

/// One breach of the code policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Violation {
    /// The rule (`import`, `forbidden_call`, `forbidden_module`,
    /// `sandbox_escape`).
    pub rule: String,
    /// The offending name, when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// 1-based line in the code.
    pub line: usize,
    /// A sentence for people (and for the model's next turn).
    pub message: String,
}

const FORBIDDEN_CALLS: &[&str] = &["open", "exec", "eval", "compile", "__import__"];
const FORBIDDEN_MODULES: &[&str] = &[
    "os",
    "subprocess",
    "socket",
    "requests",
    "http",
    "pathlib",
    "sys",
    "shutil",
    "urllib",
    "importlib",
    "ctypes",
    "builtins",
];
/// Names that reach outside the code's namespace: the classic
/// `__subclasses__` walk, and the frames of generators, coroutines and
/// tracebacks, whose callers' globals hold the host's modules.
const ESCAPES: &[&str] = &[
    "__builtins__",
    "__subclasses__",
    "__globals__",
    "__code__",
    "__bases__",
    "__mro__",
    "__base__",
    "__dict__",
    "__getattribute__",
    "__reduce__",
    "__reduce_ex__",
    "__self__",
    "__func__",
    "__closure__",
    "__loader__",
    "__spec__",
    "__traceback__",
    "__frame__",
    "gi_frame",
    "gi_code",
    "cr_frame",
    "cr_code",
    "ag_frame",
    "ag_code",
    "tb_frame",
    "tb_next",
    "f_back",
    "f_globals",
    "f_locals",
    "f_builtins",
    "f_code",
];
const KEYWORDS: &[&str] = &[
    "False", "None", "True", "and", "as", "assert", "async", "await", "break", "class", "continue", "def", "del",
    "elif", "else", "except", "finally", "for", "from", "global", "if", "import", "in", "is", "lambda", "nonlocal",
    "not", "or", "pass", "raise", "return", "try", "while", "with", "yield", "match", "case", "print",
];
/// Python builtins and the pre-injected libraries of spec 001: calls to
/// these are not tool calls.
const BUILTINS: &[&str] = &[
    "abs",
    "all",
    "any",
    "ascii",
    "bin",
    "bool",
    "bytearray",
    "bytes",
    "callable",
    "chr",
    "dict",
    "dir",
    "divmod",
    "enumerate",
    "filter",
    "float",
    "format",
    "frozenset",
    "getattr",
    "hasattr",
    "hash",
    "hex",
    "id",
    "int",
    "isinstance",
    "issubclass",
    "iter",
    "len",
    "list",
    "map",
    "max",
    "min",
    "next",
    "object",
    "oct",
    "ord",
    "pow",
    "print",
    "range",
    "repr",
    "reversed",
    "round",
    "set",
    "setattr",
    "slice",
    "sorted",
    "str",
    "sum",
    "super",
    "tuple",
    "type",
    "zip",
    "Exception",
    "ValueError",
    "TypeError",
    "KeyError",
    "IndexError",
    "RuntimeError",
];

/// The libraries spec 001 injects into the code's namespace. Importing one
/// is redundant, not a breach: the spec's own system prompt says "import
/// nothing but these", and models write `import math` out of habit.
pub const LIBRARIES: &[&str] = &["math", "json", "datetime", "re", "random", "statistics"];

/// Whether `name` is a Python identifier (letters, digits and `_`, not
/// starting with a digit; the names a tool function may have).
fn is_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_alphabetic() || c == '_') && chars.all(|c| c.is_alphanumeric() || c == '_')
}

/// Whether a function called `name` could not be a tool in ATTP code: a
/// keyword, a builtin or pre-injected library (a call to it is not read
/// as a tool call, and a tool of that name would shadow it), or a name the
/// policy forbids.
fn is_reserved(name: &str) -> bool {
    KEYWORDS.contains(&name)
        || BUILTINS.contains(&name)
        || LIBRARIES.contains(&name)
        || FORBIDDEN_CALLS.contains(&name)
        || FORBIDDEN_MODULES.contains(&name)
        || ESCAPES.contains(&name)
        || name == "__result__"
}

/// The part of a tool id after its last `:` or `.` (`get` for
/// `Weather:get`).
pub(crate) fn id_tail(id: &str) -> &str {
    id.rsplit([':', '.']).next().unwrap_or(id)
}

/// The Python function name of each tool id, in order, for ATTP code
/// (spec 001: the tools are functions injected into the sandbox). Each
/// name is unique within `ids`:
///
/// - an id that is already an identifier is its own name (`search_web`);
/// - otherwise the part after the last `:` or `.`, when it is an
///   identifier no other tool's id or part has (`Math.Add` -> `Add`);
/// - otherwise, and for a name Python already gives a meaning (`list`,
///   `open`, `print`), the whole id with `_` for every character that
///   cannot be in an identifier: `Weather:get` and `Stock:get` become
///   `Weather_get` and `Stock_get`, so that neither hides the other.
///
/// A name still taken after that gets `_2`, `_3`, ...
///
/// ```
/// use spindle::calls::attp::python_names;
///
/// assert_eq!(python_names(&["Math.Add", "search_web"]), ["Add", "search_web"]);
/// assert_eq!(python_names(&["Weather:get", "Stock:get", "Files.list"]), ["Weather_get", "Stock_get", "Files_list"]);
/// ```
pub fn python_names(ids: &[&str]) -> Vec<String> {
    // How many tools could claim each plain name (an identifier id, or a tail).
    let mut claims: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for id in ids {
        *claims.entry(if is_identifier(id) { id } else { id_tail(id) }).or_default() += 1;
    }
    let mut taken: std::collections::HashSet<String> = std::collections::HashSet::new();
    ids.iter()
        .map(|id| {
            let plain = if is_identifier(id) { *id } else { id_tail(id) };
            let mut name = if is_identifier(plain)
                && !is_reserved(plain)
                && (is_identifier(id) || claims.get(plain) == Some(&1))
            {
                plain.to_string()
            } else {
                let mut s: String = id.chars().map(|c| if c.is_alphanumeric() { c } else { '_' }).collect();
                if !s.starts_with(|c: char| c.is_alphabetic() || c == '_') {
                    s.insert(0, '_');
                }
                if is_reserved(&s) {
                    s.push_str("_tool");
                }
                s
            };
            if taken.contains(&name) {
                let base = name.clone();
                let mut n = 2;
                while taken.contains(&name) {
                    name = format!("{base}_{n}");
                    n += 1;
                }
            }
            taken.insert(name.clone());
            name
        })
        .collect()
}

/// A Python token, as far as the policy needs: a slice of the code.
#[derive(Debug, Clone, PartialEq)]
enum Tok<'a> {
    Name { text: &'a str, line: usize, after_dot: bool },
    Op { text: &'a str },
}

/// The two-character operators the policy distinguishes.
const TWO_CHAR_OPS: [&str; 16] =
    ["==", "!=", "<=", ">=", ":=", "+=", "-=", "*=", "/=", "%=", "&=", "|=", "^=", "->", "**", "//"];

/// The character at byte `at` of `code`, if any.
fn char_at(code: &str, at: usize) -> Option<char> {
    code.get(at..)?.chars().next()
}

/// The byte after the run of characters from `at` that `keep` accepts.
fn run_end(code: &str, at: usize, keep: impl Fn(char) -> bool) -> usize {
    let rest = code.get(at..).unwrap_or_default();
    at + rest.char_indices().find(|&(_, c)| !keep(c)).map_or(rest.len(), |(n, _)| n)
}

/// How many line ends `text` holds.
fn line_ends(text: &[u8]) -> usize {
    text.iter().filter(|&&b| b == b'\n').count()
}

/// Tokenizes Python enough for the policy: names and operators, with
/// comments and string literals removed (f-string `{}` parts are lexed as
/// code, on the line where the string starts). Tokens are slices of `code`
/// (no string per token), read by byte offsets; names may be any Unicode
/// letters, as Python's are.
fn lex<'a>(code: &'a str, first_line: usize, out: &mut Vec<Tok<'a>>, depth: usize) {
    let bytes = code.as_bytes();
    let mut i = 0;
    let mut line = first_line;
    let mut last_dot = false;
    while let Some(c) = char_at(code, i) {
        if c == '\n' {
            line += 1;
            i += 1;
            continue;
        }
        if c.is_whitespace() || c == '\\' {
            i += c.len_utf8();
            continue;
        }
        if c == '#' {
            i = crate::scan::find_byte(b'\n', &bytes[i..]).map_or(bytes.len(), |n| i + n);
            continue;
        }
        if c.is_alphabetic() || c == '_' {
            let start = i;
            i = run_end(code, i, |c| c.is_alphanumeric() || c == '_');
            let text = &code[start..i];
            let is_prefix =
                text.len() <= 2 && text.bytes().all(|b| matches!(b.to_ascii_lowercase(), b'r' | b'b' | b'u' | b'f'));
            if is_prefix && matches!(bytes.get(i), Some(b'"' | b'\'')) {
                let fstring = text.bytes().any(|b| b.eq_ignore_ascii_case(&b'f'));
                let (end, body) = string_at(code, i);
                if fstring && depth < 4 {
                    for expr in fstring_exprs(body) {
                        lex(expr, line, out, depth + 1);
                    }
                }
                line += line_ends(&bytes[i..end]);
                i = end;
                last_dot = false;
                continue;
            }
            out.push(Tok::Name { text, line, after_dot: last_dot });
            last_dot = false;
            continue;
        }
        if matches!(c, '"' | '\'') {
            let (end, _) = string_at(code, i);
            line += line_ends(&bytes[i..end]);
            i = end;
            last_dot = false;
            continue;
        }
        if c.is_ascii_digit() {
            i = run_end(code, i, |c| c.is_alphanumeric() || c == '.' || c == '_');
            last_dot = false;
            continue;
        }
        // Operators: the two-character ones the policy distinguishes, else
        // the one character.
        let op = match code.get(i..i + 2) {
            Some(two) if TWO_CHAR_OPS.contains(&two) => two,
            _ => &code[i..i + c.len_utf8()],
        };
        i += op.len();
        last_dot = op == ".";
        out.push(Tok::Op { text: op });
    }
}

/// The end (exclusive) and body of the string literal whose quote is at
/// byte `at` of `code`; an unterminated string runs to the end. Read by
/// bytes: the quote, `\\` and the line end are ASCII, and no byte of a
/// multi-byte character is one of them, so an escape that skips only the
/// first byte of one skips it all the same.
fn string_at(code: &str, at: usize) -> (usize, &str) {
    let bytes = code.as_bytes();
    let q = bytes[at];
    let triple = bytes.get(at + 1) == Some(&q) && bytes.get(at + 2) == Some(&q);
    let mut i = at + if triple { 3 } else { 1 };
    let start = i;
    while let Some(&c) = bytes.get(i) {
        if c == b'\\' {
            // An escape, in a raw string too (it still cannot end on an
            // escaped quote): the next character is not looked at.
            i += 2;
            continue;
        }
        if !triple && c == b'\n' {
            return (i, &code[start..i]);
        }
        if c == q && (!triple || (bytes.get(i + 1) == Some(&q) && bytes.get(i + 2) == Some(&q))) {
            return (i + if triple { 3 } else { 1 }, &code[start..i]);
        }
        i += 1;
    }
    (bytes.len(), code.get(start..).unwrap_or_default())
}

/// The `{...}` expressions of an f-string body (`{{` is a literal brace),
/// as slices of it.
fn fstring_exprs(body: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut depth = 0usize;
    // Where the expression being read starts.
    let mut start = 0;
    let mut chars = body.char_indices().peekable();
    while let Some((at, c)) = chars.next() {
        match (depth, c) {
            (0, '{') if chars.peek().map(|&(_, next)| next) == Some('{') => {
                chars.next();
            }
            (0, '{') => {
                depth = 1;
                start = at + 1;
            }
            (0, _) => {}
            (_, '{') => depth += 1,
            (1, '}') => {
                depth = 0;
                out.push(&body[start..at]);
            }
            (_, '}') => depth -= 1,
            _ => {}
        }
    }
    if depth > 0 && start < body.len() {
        out.push(&body[start..]);
    }
    out
}

/// What one `import` statement brings in, as [`check_code`] reads it.
#[derive(Debug, Default)]
struct ImportStatement<'a> {
    /// The names it binds in the code (`sqrt` of `from math import sqrt`,
    /// `j` of `import json as j`): calls to them are not tool calls.
    binds: Vec<&'a str>,
    /// The first thing it may not import, when there is one.
    refused: Option<Refused>,
    /// The token after the statement: its names are read here, not again
    /// as code.
    end: usize,
}

/// An import the policy refuses: the name as written, and why.
#[derive(Debug)]
struct Refused {
    name: String,
    why: String,
}

/// Tokens as written, without the spaces between them (`os.path`).
fn spelled(toks: &[Tok<'_>]) -> String {
    toks.iter()
        .map(|t| match t {
            Tok::Name { text, .. } | Tok::Op { text } => *text,
        })
        .collect()
}

/// Reads the `import` statement whose `import` keyword is token `at`:
/// `import a [as b], ...` or `from a import x [as y], ...` (in
/// parentheses or not, `*` too). Only a pre-injected library, named
/// whole, may be imported, and no name that starts with `_`: the sandbox
/// answers such an import with the library it already holds.
fn import_statement<'a>(toks: &[Tok<'a>], at: usize) -> ImportStatement<'a> {
    let name = |t: Option<&Tok<'a>>| match t {
        Some(Tok::Name { text, .. }) => Some(*text),
        _ => None,
    };
    let line_of = |t: &Tok<'a>| match t {
        Tok::Name { line, .. } => Some(*line),
        Tok::Op { .. } => None,
    };
    let line = toks.get(at).and_then(line_of).unwrap_or(0);
    let libraries = LIBRARIES.join(", ");
    let not_a_library = |module: &str| Refused {
        name: module.to_string(),
        why: format!("`{module}` cannot be imported: only the pre-injected libraries can ({libraries})"),
    };
    let mut out = ImportStatement::default();
    // `from MODULE import ...`: the module is what lies between `from`
    // and `import`, on the same line (dots and names only).
    let mut from = None;
    for j in (0..at).rev() {
        match &toks[j] {
            Tok::Name { text: "from", line: l, .. } if *l == line => {
                from = Some(j);
                break;
            }
            Tok::Name { text: "import", .. } => break,
            Tok::Name { line: l, .. } if *l != line => break,
            Tok::Op { text: "." } | Tok::Name { .. } => {}
            Tok::Op { .. } => break,
        }
    }
    // The statement's end: `;`, a name on a later line (outside
    // parentheses), or the end of the code.
    let mut depth = 0usize;
    let mut end = at + 1;
    while let Some(t) = toks.get(end) {
        match t {
            Tok::Op { text: "(" } => depth += 1,
            Tok::Op { text: ")" } => depth = depth.saturating_sub(1),
            Tok::Op { text: ";" } if depth == 0 => break,
            t if depth == 0 && line_of(t).is_some_and(|l| l != line) => break,
            _ => {}
        }
        end += 1;
    }
    out.end = end;
    let tail = &toks[at + 1..end];
    match from {
        Some(j) => {
            let module = spelled(&toks[j + 1..at]);
            if !LIBRARIES.contains(&module.as_str()) {
                out.refused = Some(if module.is_empty() || module.starts_with('.') {
                    Refused { name: module, why: "relative imports are not allowed".into() }
                } else {
                    not_a_library(&module)
                });
            }
            // `x`, `x as y`: the last name of each part is what is bound.
            for part in tail.split(|t| matches!(t, Tok::Op { text: "," })) {
                let names: Vec<&str> = part.iter().filter_map(|t| name(Some(t))).filter(|n| *n != "as").collect();
                if let Some(first) = names.first()
                    && first.starts_with('_')
                    && out.refused.is_none()
                {
                    out.refused = Some(Refused {
                        name: first.to_string(),
                        why: format!("`{first}`: names that start with `_` cannot be imported"),
                    });
                }
                out.binds.extend(names.last());
            }
        }
        None => {
            for part in tail.split(|t| matches!(t, Tok::Op { text: "," })) {
                let mut parts = part.splitn(2, |t| matches!(t, Tok::Name { text: "as", .. }));
                let module = spelled(parts.next().unwrap_or_default());
                if !LIBRARIES.contains(&module.as_str()) && out.refused.is_none() {
                    out.refused = Some(not_a_library(if module.is_empty() { "import" } else { &module }));
                }
                match parts.next().and_then(|alias| name(alias.first())) {
                    Some(alias) => out.binds.push(alias),
                    None => out.binds.extend(name(part.first())),
                }
            }
        }
    }
    out
}

/// What [`check_code`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CodeReport {
    /// Policy breaches, in order.
    pub violations: Vec<Violation>,
    /// Functions called by bare name that are not Python builtins, the
    /// pre-injected libraries or defined in the code: the tools the code
    /// uses. In order of first call.
    pub calls: Vec<String>,
    /// Whether the code assigns `__result__`. Code that does not is still
    /// run (a `no_result` warning): the value of its last expression, or
    /// else what it printed, is its result, as in a notebook.
    pub assigns_result: bool,
}

/// Checks ATTP code against the policy of spec 001.
///
/// ```
/// use spindle::calls::attp::check_code;
///
/// let ok = check_code("# no import here\nr = search_web('import os', max_results=3)\n__result__ = r");
/// assert!(ok.violations.is_empty());
/// assert_eq!(ok.calls, ["search_web"]);
///
/// let bad = check_code("import os\nprint(eval('1'))");
/// let rules: Vec<&str> = bad.violations.iter().map(|v| v.rule.as_str()).collect();
/// assert_eq!(rules, ["import", "forbidden_call"]);
/// assert!(!bad.assigns_result);
/// ```
pub fn check_code(code: &str) -> CodeReport {
    let mut toks = Vec::new();
    lex(code, 1, &mut toks, 0);
    let mut report = CodeReport::default();
    let mut assigned = false;
    let mut defined: Vec<&str> = Vec::new();
    let mut paren = 0usize;
    // The end of the last import statement read.
    let mut imported_to = 0;
    for (i, t) in toks.iter().enumerate() {
        if i < imported_to {
            continue;
        }
        let (text, line, after_dot) = match t {
            Tok::Op { text } => {
                match *text {
                    "(" | "[" | "{" => paren += 1,
                    ")" | "]" | "}" => paren = paren.saturating_sub(1),
                    _ => {}
                }
                continue;
            }
            Tok::Name { text, line, after_dot } => (*text, *line, *after_dot),
        };
        let next = toks.get(i + 1);
        let next_op = match next {
            Some(Tok::Op { text }) => Some(*text),
            _ => None,
        };
        let prev_name = match i.checked_sub(1).and_then(|p| toks.get(p)) {
            Some(Tok::Name { text, .. }) => Some(*text),
            _ => None,
        };
        let mut push = |rule: &str, message: String| {
            report.violations.push(Violation { rule: rule.into(), name: Some(text.to_string()), line, message });
        };
        if text == "import" {
            // A keyword, never an attribute (`from . import x` reads it
            // after a dot).
            let statement = import_statement(&toks, i);
            imported_to = statement.end;
            defined.extend(statement.binds);
            // `from os import x` was reported at `os` already.
            if let Some(refused) = statement
                .refused
                .filter(|r| !FORBIDDEN_MODULES.contains(&r.name.as_str()) || prev_name != Some(r.name.as_str()))
            {
                report.violations.push(Violation {
                    rule: "import".into(),
                    name: Some(refused.name),
                    line,
                    message: format!("line {line}: {}", refused.why),
                });
            }
            continue;
        }
        if ESCAPES.contains(&text) {
            push("sandbox_escape", format!("line {line}: `{text}` reaches outside the sandbox"));
            continue;
        }
        if after_dot && text.starts_with('_') {
            // A library's private parts (`random._os`) and every dunder
            // attribute: the way out of a namespace.
            push("sandbox_escape", format!("line {line}: `.{text}`: attributes that start with `_` are not allowed"));
            continue;
        }
        if after_dot {
            continue;
        }
        let kwarg = paren > 0 && next_op == Some("=");
        if FORBIDDEN_CALLS.contains(&text) && !kwarg {
            push(
                "forbidden_call",
                format!("line {line}: `{text}` is not allowed (file access / dynamic code execution)"),
            );
        } else if FORBIDDEN_MODULES.contains(&text) && !kwarg && prev_name != Some("import") {
            push("forbidden_module", format!("line {line}: `{text}` is not allowed (system, file or network access)"));
        }
        if text == "__result__" {
            let target =
                matches!(next_op, Some("=" | ":=" | "+=" | "-=" | "*=" | "/=" | "%=" | "&=" | "|=" | "^=" | ":" | ","))
                    || matches!(prev_name, Some("for" | "as"));
            assigned |= target && !kwarg;
        }
        let defines = matches!(prev_name, Some("def" | "class")) || (next_op == Some("=") && paren == 0);
        if defines {
            defined.push(text);
        } else if next_op == Some("(")
            && !KEYWORDS.contains(&text)
            && !BUILTINS.contains(&text)
            && !LIBRARIES.contains(&text)
            && !FORBIDDEN_CALLS.contains(&text)
            && !report.calls.iter().any(|c| c == text)
        {
            report.calls.push(text.to_string());
        }
    }
    report.calls.retain(|c| !defined.contains(&c.as_str()));
    report.assigns_result = assigned;
    report
}

/// Splits a possibly fenced document: `(toml, text outside the fence,
/// whether the fence is left open)`. Only a fence line outside TOML's
/// multi-line strings counts: a ```` ```python ```` line inside `code`
/// is the code's (see [`unfence_code`]).
fn unfence(text: &str) -> (String, String, bool) {
    let lines: Vec<&str> = text.split('\n').collect();
    let mut fences = Vec::new();
    let mut inside: Option<&str> = None;
    for (i, line) in lines.iter().enumerate() {
        if inside.is_none() && line.trim_start().starts_with("```") {
            fences.push(i);
            continue;
        }
        // Where the line leaves the `'''` / `"""` strings it opens or
        // closes (a line break ends no other TOML string).
        let mut rest = *line;
        while let Some(at) = rest.find(['\'', '"']) {
            let after = &rest[at..];
            match inside {
                Some(q) if after.starts_with(q) => {
                    inside = None;
                    rest = &after[3..];
                }
                None if after.starts_with("'''") || after.starts_with("\"\"\"") => {
                    inside = Some(&after[..3]);
                    rest = &after[3..];
                }
                _ => rest = &after[1..],
            }
        }
    }
    let Some(&open) = fences.first() else {
        return (text.to_string(), String::new(), false);
    };
    let close = fences.iter().skip(1).rev().find(|i| lines[**i].trim() == "```").copied();
    let end = close.unwrap_or(lines.len());
    let doc = lines[open + 1..end].join("\n");
    let mut outside: Vec<&str> = lines[..open].to_vec();
    if let Some(c) = close {
        outside.extend(&lines[c + 1..]);
    }
    let outside = outside.join("\n").trim().to_string();
    (doc, outside, close.is_none())
}

/// `code` without the Markdown fence a model wrapped it in (```` ```python ````
/// and a closing ```` ``` ````, each on a line of its own): no Python line
/// begins with ```` ``` ````. `None` when the code is not fenced.
fn unfence_code(code: &str) -> Option<String> {
    let body = code.trim_start_matches(['\n', '\r', ' ', '\t']);
    let first = body.lines().next()?;
    let lang = first.trim().strip_prefix("```")?;
    if !lang.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '+') {
        return None;
    }
    let rest = body.get(first.len()..)?.strip_prefix(['\n', '\r']).unwrap_or("");
    let rest = rest.strip_prefix('\n').unwrap_or(rest);
    let trimmed = rest.trim_end();
    let inner = match trimmed.strip_suffix("```") {
        Some(before) if before.is_empty() || before.ends_with('\n') => before,
        _ => rest,
    };
    Some(inner.to_string())
}

/// The `code` string of a parsed document's `[tool_call]`, if any (keys
/// in any case).
fn code_of(table: &toml::Table) -> Option<&str> {
    // The key-case warnings come when the document is read for real.
    let quiet = &mut Findings::default();
    get_ci(get_ci(table, "tool_call", quiet)?.as_table()?, "code", quiet)?.as_str()
}

/// Whether Python code has a one-line string literal that a line break
/// cuts ("unterminated string literal"): what TOML's reading of `"\n"` in
/// a `"""` string makes of Python's `"\n".join(lines)`.
fn has_cut_string(code: &str) -> bool {
    let bytes = code.as_bytes();
    let mut i = 0;
    while let Some(&c) = bytes.get(i) {
        match c {
            b'#' => i = crate::scan::find_byte(b'\n', &bytes[i..]).map_or(bytes.len(), |n| i + n),
            b'"' | b'\'' => {
                let triple = bytes.get(i + 1) == Some(&c) && bytes.get(i + 2) == Some(&c);
                if !triple {
                    let mut j = i + 1;
                    loop {
                        match bytes.get(j) {
                            Some(b'\\') => j += 2,
                            Some(&q) if q == c => break,
                            Some(b'\n') => return true,
                            Some(_) => j += 1,
                            None => return false,
                        }
                    }
                    i = j + 1;
                } else {
                    i = string_at(code, i).0;
                }
            }
            _ => i += 1,
        }
    }
    false
}

/// The document with its `code = """…"""` rewritten as `code = '''…'''`,
/// when that changes what `code` says: the string has a backslash (TOML
/// reads `\n` in a `"""` string as a line break, `\d` as an error) and
/// holds no `'''` (a literal string cannot). Spec 001 writes `code` in
/// `'''`; a model that writes `"""` still writes Python's escapes
/// (`"\n".join(lines)`, `re.findall(r"\d+", s)`), not TOML's. `None` when
/// there is nothing to rewrite.
fn code_as_literal(doc: &str) -> Option<String> {
    const QUOTES: &str = "\"\"\"";
    // The `code` key at the start of a line, then `=` and `"""`: after the
    // `[tool_call]` header when there is one (the thought before it may
    // quote such a line).
    let header = doc.split('\n').scan(0, |at, line| {
        let start = *at;
        *at += line.len() + 1;
        Some((start, line))
    });
    let mut at = header
        .filter(|(_, line)| line.trim().eq_ignore_ascii_case("[tool_call]"))
        .map(|(start, line)| start + line.len())
        .next()
        .unwrap_or(0)
        .min(doc.len());
    let open = loop {
        let line_end = doc[at..].find('\n').map_or(doc.len(), |n| at + n);
        let after = doc[at..line_end]
            .trim_start()
            .strip_prefix("code")
            .map(str::trim_start)
            .and_then(|r| r.strip_prefix('='))
            .map(str::trim_start);
        if let Some(after) = after
            && after.starts_with(QUOTES)
        {
            break line_end - after.len();
        }
        if line_end == doc.len() {
            return None;
        }
        at = line_end + 1;
    };
    let body_start = open + QUOTES.len();
    let close = body_start + doc[body_start..].find(QUOTES)?;
    // `""""` and `"""""` end with one or two quotes of the string.
    let extra = doc[close + QUOTES.len()..].bytes().take(2).take_while(|b| *b == b'"').count();
    let body = &doc[body_start..close + extra];
    if !body.contains('\\') || body.contains("'''") {
        return None;
    }
    Some(format!("{}'''{body}'''{}", &doc[..open], &doc[close + extra + QUOTES.len()..]))
}

/// Reads a complete ATTP document into a call.
///
/// ```
/// use spindle::calls::attp::parse_attp;
///
/// let doc = "```toml\nthought = \"\"\"\nSearch first.\n\"\"\"\n\n[tool_call]\nstatus = \"success\"\ntarget = \"search\"\ncode = '''\n__result__ = search_web(\"rust\", max_results=3)\n'''\n```";
/// let (call, _) = parse_attp(doc);
/// let attp = call.attp.unwrap();
/// assert_eq!(attp.thought.as_deref(), Some("Search first.\n"));
/// assert!(attp.violations.is_empty());
/// assert_eq!(call.steps[0].tool_id, "python");
/// assert_eq!(call.steps[0].params["target"], "search");
/// ```
pub fn parse_attp(text: &str) -> (ToolCall, Findings) {
    let mut f = Findings::default();
    let mut call = ToolCall::new(CallFormat::Attp);
    let (doc, outside, unclosed) = unfence(text);
    if unclosed {
        f.warn(DiagnosticCode::UnclosedFence, "the ``` fence around the TOML is never closed".into());
    }
    if !outside.is_empty() {
        f.warn(
            DiagnosticCode::TextOutsideToml,
            format!("text outside the TOML fence was ignored: {:?}", truncate(&outside, 200)),
        );
    }
    let mut attp = AttpCall {
        thought: None,
        status: None,
        target: None,
        code: None,
        message: None,
        violations: Vec::new(),
        calls: Vec::new(),
    };
    // `code` written as a `"""` string with Python's escapes in it rather
    // than TOML's: read as written when TOML's reading fails or cuts a
    // Python string, and the written form reads.
    let mut parsed = doc.parse::<toml::Table>();
    let toml_breaks_code = match &parsed {
        Ok(table) => code_of(table).is_some_and(has_cut_string),
        Err(_) => true,
    };
    if toml_breaks_code
        && let Some(table) = code_as_literal(&doc).and_then(|raw| raw.parse::<toml::Table>().ok())
        && (parsed.is_err() || !code_of(&table).is_some_and(has_cut_string))
    {
        f.warn(
            DiagnosticCode::CodeReadRaw,
            "`code` is a \"\"\" string with Python's escapes in it: read as written (as in '''), since TOML's \
             escapes break it (a \\n in a Python string becomes a line break, \\d is refused)"
                .into(),
        );
        parsed = Ok(table);
    }
    let table = match parsed {
        Ok(t) => t,
        Err(e) => {
            let at = e
                .span()
                .map(|s| format!(" at line {}", doc.get(..s.start).unwrap_or(&doc).matches('\n').count() + 1))
                .unwrap_or_default();
            let msg = format!("Invalid TOML{at}: {}", e.message());
            // The thought is still worth showing: read it the lenient way.
            let mut ts = ThoughtStream::new();
            let mut thought = ts.feed(&doc);
            thought.push_str(&ts.finish());
            attp.thought = ts.started().then_some(thought);
            call.attp = Some(attp);
            if !means_attp(&doc) {
                // Prose: an answer that calls nothing (the agent loop ends
                // on it).
                f.warn(DiagnosticCode::InvalidToml, format!("{msg}; no thought or [tool_call]: read as an answer"));
                return (call, f);
            }
            f.error(DiagnosticCode::InvalidToml, msg.clone());
            call.observation = Some(format!("Observation: Error - {msg}"));
            call.error = Some(msg);
            return (call, f);
        }
    };
    for key in table.keys().filter(|k| !k.eq_ignore_ascii_case("thought") && !k.eq_ignore_ascii_case("tool_call")) {
        f.warn(DiagnosticCode::UnknownKey, format!("top-level key {key:?} is not part of ATTP and was ignored"));
    }
    match get_ci(&table, "thought", &mut f) {
        Some(toml::Value::String(s)) => attp.thought = Some(s.clone()),
        Some(_) => f.warn(DiagnosticCode::MissingThought, "`thought` is not a string".into()),
        None => f.warn(DiagnosticCode::MissingThought, "the document has no `thought`".into()),
    }
    let tc = match get_ci(&table, "tool_call", &mut f) {
        Some(toml::Value::Table(tc)) => tc,
        None => {
            // Only a thought: the model answers without calling a tool.
            f.warn(
                DiagnosticCode::MissingToolCall,
                "the document has no [tool_call]: an answer that calls nothing".into(),
            );
            call.attp = Some(attp);
            return (call, f);
        }
        Some(_) => {
            let msg = "`tool_call` is not a table".to_string();
            f.error(DiagnosticCode::MissingToolCall, msg.clone());
            call.observation = Some(format!("Observation: Error - Invalid ATTP output: {msg}"));
            call.error = Some(msg);
            call.attp = Some(attp);
            return (call, f);
        }
    };
    let string = |k: &str| match tc.get(k) {
        Some(toml::Value::String(s)) => Some(s.clone()),
        Some(other) => Some(other.to_string()),
        None => None,
    };
    for key in tc.keys().filter(|k| !matches!(k.as_str(), "status" | "target" | "code" | "message")) {
        f.warn(DiagnosticCode::UnknownKey, format!("[tool_call] key {key:?} is not part of ATTP and was ignored"));
    }
    attp.target = string("target");
    attp.code = string("code").map(|code| match unfence_code(&code) {
        Some(inner) => {
            f.warn(
                DiagnosticCode::CodeFenceDropped,
                "`code` was wrapped in a ``` fence: the fence lines were dropped (the string is the code itself)"
                    .into(),
            );
            inner
        }
        None => code,
    });
    attp.message = string("message");
    let status = string("status").map(|s| s.trim().to_lowercase());
    let success = match status.as_deref() {
        Some("success") => true,
        Some("fail" | "failed" | "failure") => false,
        other => {
            let inferred = attp.code.is_some();
            let what = match other {
                Some(s) => format!("status {s:?} is neither \"success\" nor \"fail\""),
                None => "[tool_call] has no status".to_string(),
            };
            f.warn(
                DiagnosticCode::MissingStatus,
                format!("{what}; read as {}", if inferred { "success (it has code)" } else { "fail" }),
            );
            inferred
        }
    };
    attp.status = Some(if success { "success" } else { "fail" }.to_string());
    if success {
        if attp.target.is_none() {
            f.warn(DiagnosticCode::MissingTarget, "a successful [tool_call] has no `target`".into());
        }
        match &attp.code {
            Some(code) => {
                let report = check_code(code);
                if !report.assigns_result {
                    f.warn(
                        DiagnosticCode::NoResult,
                        "the code never assigns `__result__`: the value of its last expression, or else what it \
                         prints, is its result"
                            .into(),
                    );
                }
                for v in &report.violations {
                    f.warn(DiagnosticCode::PolicyViolation, v.message.clone());
                }
                if !report.violations.is_empty() {
                    let list: Vec<&str> = report.violations.iter().map(|v| v.message.as_str()).collect();
                    let msg = format!("Code policy violation: {}", list.join("; "));
                    call.observation = Some(format!("Observation: Error - {msg}"));
                    call.error = Some(msg);
                }
                attp.violations = report.violations;
                attp.calls = report.calls;
                let mut step = Step::new(PYTHON_TOOL);
                step.params.insert("code".into(), Value::String(code.clone()));
                if let Some(t) = &attp.target {
                    step.params.insert("target".into(), Value::String(t.clone()));
                }
                call.steps.push(step);
            }
            None => {
                let msg = "a successful [tool_call] has no `code`".to_string();
                f.error(DiagnosticCode::MissingCode, msg.clone());
                call.observation = Some(format!("Observation: Error - Invalid ATTP output: {msg}"));
                call.error = Some(msg);
            }
        }
    } else if attp.message.is_none() {
        f.warn(DiagnosticCode::MissingMessage, "a failed [tool_call] has no `message`".into());
    }
    call.attp = Some(attp);
    (call, f)
}

/// Whether a document that is not valid TOML was meant as ATTP: it names
/// `tool_call` or sets `thought` (any case), as a document gone wrong or
/// cut off does. Other text is prose: an answer that calls nothing.
fn means_attp(doc: &str) -> bool {
    let lower = doc.to_ascii_lowercase();
    lower.contains("tool_call")
        || lower.lines().any(|line| {
            line.trim_start().strip_prefix("thought").is_some_and(|rest| rest.trim_start().starts_with('='))
        })
}

/// `table[name]`, or a key that differs only in case (with a warning).
fn get_ci<'a>(table: &'a toml::Table, name: &str, f: &mut Findings) -> Option<&'a toml::Value> {
    if let Some(v) = table.get(name) {
        return Some(v);
    }
    let (key, v) = table.iter().find(|(k, _)| k.eq_ignore_ascii_case(name))?;
    f.warn(DiagnosticCode::KeyCase, format!("`{key}` was read as `{name}`"));
    Some(v)
}

fn truncate(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

// ----- streaming the thought ------------------------------------------

/// Which TOML string form the value uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StrKind {
    /// `"..."`
    Basic,
    /// `"""..."""`
    MultiBasic,
    /// `'...'`
    Literal,
    /// `'''...'''`
    MultiLiteral,
}

impl StrKind {
    fn quote(self) -> char {
        match self {
            StrKind::Basic | StrKind::MultiBasic => '"',
            StrKind::Literal | StrKind::MultiLiteral => '\'',
        }
    }

    fn multi(self) -> bool {
        matches!(self, StrKind::MultiBasic | StrKind::MultiLiteral)
    }

    fn escapes(self) -> bool {
        matches!(self, StrKind::Basic | StrKind::MultiBasic)
    }
}

/// An escape sequence being read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Esc {
    /// Just after `\`.
    Start,
    /// `\u`, `\U` or `\x`: `need` hex digits, `got` so far, value so far
    /// (the text as written is in `ThoughtStream::esc_raw`).
    Hex { need: u8, got: u8, value: u32 },
    /// A line-ending backslash: whitespace and newlines are skipped.
    LineEnd,
}

/// Where the thought reader is in the document.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TState {
    /// At the start of a line, before any non-space.
    LineStart,
    /// Reading a bare key.
    Key,
    /// Reading a quoted key.
    QuotedKey(char),
    /// After the key, before `=`.
    AfterKey,
    /// After `=`, before the value.
    AfterEq,
    /// One quote of a string value seen (it may become `""`/`"""`).
    Quote1(char),
    /// Two quotes seen: empty string or the start of a multi-line one.
    Quote2(char),
    /// Just inside a multi-line string: a newline here is not content.
    MultiStart(StrKind),
    /// Just inside a multi-line string after `\r`.
    MultiStartCr(StrKind),
    /// In a string's body.
    Body(StrKind),
    /// Inside an escape sequence.
    Escape(StrKind, Esc),
    /// Skipping an array or inline table (depth of brackets).
    Brackets(u32),
    /// Skipping a comment inside brackets.
    BracketComment(u32),
    /// Skipping to the end of the line.
    SkipLine,
    /// The thought has been read (or can no longer appear).
    Done,
}

/// Pulls the top-level `thought` string out of an ATTP document as it
/// streams, releasing its *value* (escapes decoded, the newline after an
/// opening `"""` dropped, closing quotes removed) as soon as each character
/// is certain.
///
/// Split-invariant: any split of the document into `feed` calls, followed
/// by `finish`, releases the same text. All four TOML string forms are
/// read (`"""..."""`, `'''...'''`, `"..."` with escapes, `'...'`). Other
/// keys' values are skipped (strings, arrays and inline tables included,
/// so a `thought = ` inside them is not mistaken for the key); a table
/// header (`[tool_call]`) ends the search. Lines that are not TOML (a
/// ```` ```toml ```` fence, prose) are skipped. The reader holds at most a
/// few characters (a run of quotes, an escape sequence) between calls.
///
/// ```
/// use spindle::calls::attp::ThoughtStream;
///
/// let doc = "```toml\nthought = \"\"\"\nStep 1: \\\"search\\\"\n\"\"\"\n[tool_call]\n";
/// let mut ts = ThoughtStream::new();
/// let mut seen = String::new();
/// for chunk in doc.as_bytes().chunks(3) {
///     seen.push_str(&ts.feed(std::str::from_utf8(chunk).unwrap()));
/// }
/// seen.push_str(&ts.finish());
/// assert_eq!(seen, "Step 1: \"search\"\n");
/// ```
#[derive(Debug, Clone)]
pub struct ThoughtStream {
    state: TState,
    /// The key being read (only whether it is `thought` matters).
    key: String,
    /// The key is dotted, or too long: not `thought`.
    key_spoiled: bool,
    /// Whether the value being read is the thought (else it is skipped).
    emit: bool,
    /// Quotes seen in a row inside a multi-line string, not yet decided.
    quotes: u8,
    /// Whether the thought string has started.
    started: bool,
    /// Whether the thought string has ended.
    ended: bool,
    /// The bracket depth to return to after a string skipped inside an
    /// array or inline table.
    bracket_return: Option<u32>,
    /// An escape sequence as written so far (at most 10 characters).
    esc_raw: String,
}

impl Default for ThoughtStream {
    fn default() -> Self {
        ThoughtStream::new()
    }
}

/// Longest key kept while looking for `thought`.
const MAX_KEY: usize = 16;

impl ThoughtStream {
    /// A reader at the start of a document.
    pub fn new() -> ThoughtStream {
        ThoughtStream {
            state: TState::LineStart,
            key: String::new(),
            key_spoiled: false,
            emit: false,
            quotes: 0,
            started: false,
            ended: false,
            bracket_return: None,
            esc_raw: String::new(),
        }
    }

    /// Whether the thought string has begun.
    pub fn started(&self) -> bool {
        self.started
    }

    /// Whether the thought string is complete (its closing quote was read).
    pub fn is_complete(&self) -> bool {
        self.ended
    }

    /// Reads more of the document; returns the thought text it released.
    pub fn feed(&mut self, raw: &str) -> String {
        let mut out = String::new();
        for c in raw.chars() {
            if self.state == TState::Done {
                break;
            }
            self.step(c, &mut out);
        }
        out
    }

    /// Ends the document; returns what was held (quotes that turned out to
    /// be content, an unfinished escape, written as it was).
    pub fn finish(&mut self) -> String {
        let mut out = String::new();
        match self.state {
            TState::Body(kind) if kind.multi() => {
                let n = if self.quotes >= 3 {
                    self.ended = self.emit;
                    self.quotes - 3
                } else {
                    self.quotes
                };
                self.put_quotes(kind.quote(), n, &mut out);
            }
            TState::Escape(_, Esc::Start | Esc::Hex { .. }) => {
                let raw = std::mem::take(&mut self.esc_raw);
                self.put_str(&raw, &mut out);
            }
            TState::Quote2(_) => self.ended = self.emit,
            _ => {}
        }
        self.state = TState::Done;
        out
    }

    fn put(&self, c: char, out: &mut String) {
        if self.emit {
            out.push(c);
        }
    }

    fn put_str(&self, s: &str, out: &mut String) {
        if self.emit {
            out.push_str(s);
        }
    }

    fn put_quotes(&self, q: char, n: u8, out: &mut String) {
        for _ in 0..n {
            self.put(q, out);
        }
    }

    /// A string value ends.
    fn string_done(&mut self) {
        if self.emit {
            self.ended = true;
            self.state = TState::Done;
            return;
        }
        self.state = match self.bracket_return.take() {
            Some(depth) => TState::Brackets(depth),
            None => TState::SkipLine,
        };
    }

    /// A string value starts with quote `q` (state after the first quote).
    fn open_string(&mut self, q: char, in_brackets: Option<u32>) {
        self.bracket_return = in_brackets;
        if in_brackets.is_none() && !self.key_spoiled && self.key.eq_ignore_ascii_case("thought") {
            self.emit = true;
            self.started = true;
        }
        self.state = TState::Quote1(q);
    }

    fn step(&mut self, c: char, out: &mut String) {
        use TState::*;
        self.state = match self.state {
            LineStart => match c {
                ' ' | '\t' | '\r' | '\n' => LineStart,
                '[' => Done,
                '"' | '\'' => {
                    self.key.clear();
                    self.key_spoiled = false;
                    QuotedKey(c)
                }
                c if c.is_ascii_alphanumeric() || c == '_' || c == '-' => {
                    self.key.clear();
                    self.key_spoiled = false;
                    self.key.push(c);
                    Key
                }
                _ => SkipLine,
            },
            Key => match c {
                c if c.is_ascii_alphanumeric() || c == '_' || c == '-' => {
                    if self.key.len() < MAX_KEY {
                        self.key.push(c);
                    } else {
                        self.key_spoiled = true;
                    }
                    Key
                }
                '.' => {
                    self.key_spoiled = true;
                    AfterKey
                }
                ' ' | '\t' => AfterKey,
                '=' => AfterEq,
                '\n' => LineStart,
                _ => SkipLine,
            },
            QuotedKey(q) => match c {
                c if c == q => AfterKey,
                '\n' => LineStart,
                c => {
                    if self.key.len() < MAX_KEY {
                        self.key.push(c);
                    } else {
                        self.key_spoiled = true;
                    }
                    QuotedKey(q)
                }
            },
            AfterKey => match c {
                ' ' | '\t' => AfterKey,
                '.' => {
                    self.key_spoiled = true;
                    AfterKey
                }
                '=' => AfterEq,
                '"' | '\'' if self.key_spoiled => QuotedKey(c),
                c if self.key_spoiled && (c.is_ascii_alphanumeric() || c == '_' || c == '-') => Key,
                '\n' => LineStart,
                _ => SkipLine,
            },
            AfterEq => match c {
                ' ' | '\t' => AfterEq,
                '"' | '\'' => {
                    self.open_string(c, None);
                    self.state
                }
                '[' | '{' => Brackets(1),
                '\n' => LineStart,
                _ => SkipLine,
            },
            Quote1(q) => {
                if c == q {
                    Quote2(q)
                } else {
                    let kind = if q == '"' { StrKind::Basic } else { StrKind::Literal };
                    self.state = Body(kind);
                    self.body(kind, c, out);
                    self.state
                }
            }
            Quote2(q) => {
                if c == q {
                    MultiStart(if q == '"' { StrKind::MultiBasic } else { StrKind::MultiLiteral })
                } else {
                    // `""`: an empty string, then `c` after it.
                    self.string_done();
                    if self.state == Done { Done } else { self.after_value(c) }
                }
            }
            MultiStart(kind) => match c {
                '\n' => Body(kind),
                '\r' => MultiStartCr(kind),
                _ => {
                    self.state = Body(kind);
                    self.body(kind, c, out);
                    self.state
                }
            },
            MultiStartCr(kind) => {
                if c == '\n' {
                    Body(kind)
                } else {
                    self.put('\r', out);
                    self.state = Body(kind);
                    self.body(kind, c, out);
                    self.state
                }
            }
            Body(kind) => {
                self.body(kind, c, out);
                self.state
            }
            Escape(kind, esc) => self.escape(kind, esc, c, out),
            Brackets(depth) => match c {
                '[' | '{' => Brackets(depth + 1),
                ']' | '}' if depth <= 1 => SkipLine,
                ']' | '}' => Brackets(depth - 1),
                '#' => BracketComment(depth),
                '"' | '\'' => {
                    self.open_string(c, Some(depth));
                    self.state
                }
                _ => Brackets(depth),
            },
            BracketComment(depth) => {
                if c == '\n' {
                    Brackets(depth)
                } else {
                    BracketComment(depth)
                }
            }
            SkipLine => {
                if c == '\n' {
                    LineStart
                } else {
                    SkipLine
                }
            }
            Done => Done,
        };
    }

    /// The state after a skipped value, given the next character.
    fn after_value(&mut self, c: char) -> TState {
        match self.state {
            TState::Brackets(_) => {
                // Still inside an array: the character is the array's.
                self.step(c, &mut String::new());
                self.state
            }
            _ => {
                if c == '\n' {
                    TState::LineStart
                } else {
                    TState::SkipLine
                }
            }
        }
    }

    /// One character of a string body.
    fn body(&mut self, kind: StrKind, c: char, out: &mut String) {
        let q = kind.quote();
        if kind.multi() {
            if c == q {
                self.quotes = self.quotes.saturating_add(1);
                if self.quotes >= 5 {
                    // Five quotes: two are content, three close (the most
                    // TOML allows).
                    self.put_quotes(q, 2, out);
                    self.quotes = 0;
                    self.string_done();
                }
                return;
            }
            if self.quotes >= 3 {
                let extra = self.quotes - 3;
                self.put_quotes(q, extra, out);
                self.quotes = 0;
                self.string_done();
                if self.state != TState::Done {
                    let next = self.after_value(c);
                    self.state = next;
                }
                return;
            }
            let n = self.quotes;
            self.put_quotes(q, n, out);
            self.quotes = 0;
        } else if c == q {
            self.string_done();
            return;
        } else if c == '\n' {
            // A one-line string cut by the end of its line: read as ended.
            self.string_done();
            if self.state != TState::Done {
                self.state = TState::LineStart;
            }
            return;
        }
        if c == '\\' && kind.escapes() {
            self.esc_raw.clear();
            self.esc_raw.push('\\');
            self.state = TState::Escape(kind, Esc::Start);
            return;
        }
        self.put(c, out);
        self.state = TState::Body(kind);
    }

    /// One character of an escape sequence.
    fn escape(&mut self, kind: StrKind, esc: Esc, c: char, out: &mut String) -> TState {
        match esc {
            Esc::Start => {
                let simple = match c {
                    'n' => Some('\n'),
                    't' => Some('\t'),
                    'r' => Some('\r'),
                    'b' => Some('\u{8}'),
                    'f' => Some('\u{c}'),
                    'e' => Some('\u{1b}'),
                    '"' => Some('"'),
                    '\\' => Some('\\'),
                    _ => None,
                };
                if let Some(ch) = simple {
                    self.put(ch, out);
                    return TState::Body(kind);
                }
                let hex = |need| TState::Escape(kind, Esc::Hex { need, got: 0, value: 0 });
                match c {
                    'u' | 'U' | 'x' => {
                        self.esc_raw.push(c);
                        hex(match c {
                            'u' => 4,
                            'U' => 8,
                            _ => 2,
                        })
                    }
                    ' ' | '\t' | '\r' | '\n' if kind.multi() => TState::Escape(kind, Esc::LineEnd),
                    _ => {
                        // Not an escape TOML knows: keep it as written.
                        self.put('\\', out);
                        self.state = TState::Body(kind);
                        self.body(kind, c, out);
                        self.state
                    }
                }
            }
            Esc::Hex { need, got, value } => match c.to_digit(16) {
                Some(d) => {
                    let value = value.wrapping_mul(16).wrapping_add(d);
                    if got + 1 == need {
                        self.put(char::from_u32(value).unwrap_or('\u{fffd}'), out);
                        TState::Body(kind)
                    } else {
                        self.esc_raw.push(c);
                        TState::Escape(kind, Esc::Hex { need, got: got + 1, value })
                    }
                }
                None => {
                    let raw = std::mem::take(&mut self.esc_raw);
                    self.put_str(&raw, out);
                    self.state = TState::Body(kind);
                    self.body(kind, c, out);
                    self.state
                }
            },
            Esc::LineEnd => match c {
                ' ' | '\t' | '\r' | '\n' => TState::Escape(kind, Esc::LineEnd),
                _ => {
                    self.state = TState::Body(kind);
                    self.body(kind, c, out);
                    self.state
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(doc: &str, size: usize) -> String {
        let mut ts = ThoughtStream::new();
        let mut out = String::new();
        let chars: Vec<char> = doc.chars().collect();
        for chunk in chars.chunks(size.max(1)) {
            out.push_str(&ts.feed(&chunk.iter().collect::<String>()));
        }
        out.push_str(&ts.finish());
        out
    }

    #[test]
    fn skips_other_values_before_the_thought() {
        let doc = "a = \"thought = 'x'\"\nb = [\"\"\"\nthought = 'y'\"\"\", { c = 'z' }] # c\nthought = 'real'\n";
        assert_eq!(stream(doc, 1), "real");
    }

    #[test]
    fn table_header_ends_the_search() {
        assert_eq!(stream("[tool_call]\nthought = 'no'\n", 1), "");
    }

    /// The lexer as it was (over a `Vec<char>`, a string per token): the
    /// reference the byte-offset lexer is held to.
    #[derive(Debug, Clone, PartialEq)]
    enum RefTok {
        Name { text: String, line: usize, after_dot: bool },
        Op { text: String },
    }

    /// Tokenizes Python enough for the policy: names and operators, with
    /// comments and string literals removed (f-string `{}` parts are lexed as
    /// code, on the line where the string starts).
    fn lex_reference(code: &str, first_line: usize, out: &mut Vec<RefTok>, depth: usize) {
        let chars: Vec<char> = code.chars().collect();
        let mut i = 0;
        let mut line = first_line;
        let mut last_dot = false;
        while i < chars.len() {
            let c = chars[i];
            if c == '\n' {
                line += 1;
                i += 1;
                continue;
            }
            if c.is_whitespace() || c == '\\' {
                i += 1;
                continue;
            }
            if c == '#' {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
                continue;
            }
            if c.is_alphabetic() || c == '_' {
                let start = i;
                while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                    i += 1;
                }
                let text: String = chars[start..i].iter().collect();
                let is_prefix =
                    text.len() <= 2 && text.chars().all(|c| matches!(c.to_ascii_lowercase(), 'r' | 'b' | 'u' | 'f'));
                if is_prefix && i < chars.len() && matches!(chars[i], '"' | '\'') {
                    let fstring = text.to_ascii_lowercase().contains('f');
                    let raw = text.to_ascii_lowercase().contains('r');
                    let (end, body) = string_at_reference(&chars, i, raw);
                    if fstring && depth < 4 {
                        for expr in fstring_exprs_reference(&body) {
                            lex_reference(&expr, line, out, depth + 1);
                        }
                    }
                    line += chars[i..end].iter().filter(|&&c| c == '\n').count();
                    i = end;
                    last_dot = false;
                    continue;
                }
                out.push(RefTok::Name { text, line, after_dot: last_dot });
                last_dot = false;
                continue;
            }
            if matches!(c, '"' | '\'') {
                let (end, _) = string_at_reference(&chars, i, false);
                line += chars[i..end].iter().filter(|&&c| c == '\n').count();
                i = end;
                last_dot = false;
                continue;
            }
            if c.is_ascii_digit() {
                while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '.' || chars[i] == '_') {
                    i += 1;
                }
                last_dot = false;
                continue;
            }
            // Operators: the two-character ones the policy distinguishes.
            let two: String = chars[i..(i + 2).min(chars.len())].iter().collect();
            let op = if matches!(
                two.as_str(),
                "==" | "!="
                    | "<="
                    | ">="
                    | ":="
                    | "+="
                    | "-="
                    | "*="
                    | "/="
                    | "%="
                    | "&="
                    | "|="
                    | "^="
                    | "->"
                    | "**"
                    | "//"
            ) {
                two
            } else {
                c.to_string()
            };
            i += op.chars().count();
            last_dot = op == ".";
            out.push(RefTok::Op { text: op });
        }
    }

    /// The end (exclusive) and body of the string literal whose quote is at
    /// `at`; an unterminated string runs to the end.
    fn string_at_reference(chars: &[char], at: usize, raw: bool) -> (usize, String) {
        let q = chars[at];
        let triple = chars.get(at + 1) == Some(&q) && chars.get(at + 2) == Some(&q);
        let mut i = at + if triple { 3 } else { 1 };
        let start = i;
        while i < chars.len() {
            let c = chars[i];
            if c == '\\' && !raw {
                i += 2;
                continue;
            }
            if c == '\\' && raw {
                // A raw string still cannot end on an escaped quote.
                i += 2;
                continue;
            }
            if !triple && c == '\n' {
                let body = chars[start..i].iter().collect();
                return (i, body);
            }
            if c == q && (!triple || (chars.get(i + 1) == Some(&q) && chars.get(i + 2) == Some(&q))) {
                let body = chars[start..i].iter().collect();
                return (i + if triple { 3 } else { 1 }, body);
            }
            i += 1;
        }
        let body = chars[start.min(chars.len())..].iter().collect();
        (chars.len(), body)
    }

    /// The `{...}` expressions of an f-string body (`{{` is a literal brace).
    fn fstring_exprs_reference(body: &str) -> Vec<String> {
        let mut out = Vec::new();
        let mut depth = 0usize;
        let mut cur = String::new();
        let mut chars = body.chars().peekable();
        while let Some(c) = chars.next() {
            match (depth, c) {
                (0, '{') if chars.peek() == Some(&'{') => {
                    chars.next();
                }
                (0, '{') => depth = 1,
                (0, _) => {}
                (_, '{') => {
                    depth += 1;
                    cur.push(c);
                }
                (1, '}') => {
                    depth = 0;
                    out.push(std::mem::take(&mut cur));
                }
                (_, '}') => {
                    depth -= 1;
                    cur.push(c);
                }
                _ => cur.push(c),
            }
        }
        if !cur.is_empty() {
            out.push(cur);
        }
        out
    }

    // ----- the lexer, held to its first version ---------------------------

    /// The tokens of the lexer, owned, as the reference gives them.
    fn lexed(code: &str) -> Vec<RefTok> {
        let mut toks = Vec::new();
        lex(code, 1, &mut toks, 0);
        toks.into_iter()
            .map(|t| match t {
                Tok::Name { text, line, after_dot } => RefTok::Name { text: text.to_string(), line, after_dot },
                Tok::Op { text } => RefTok::Op { text: text.to_string() },
            })
            .collect()
    }

    fn lexed_reference(code: &str) -> Vec<RefTok> {
        let mut toks = Vec::new();
        lex_reference(code, 1, &mut toks, 0);
        toks
    }

    #[test]
    fn the_lexer_reads_as_the_reference_does() {
        let cases = [
            "__result__ = search_web(\"rust\", max_results=3)",
            "x = f'{a + b} and {{literal}} {c[\"k\"]} {d'\nimport os",
            "s = rb'\\'' + u\"\"\"multi\nline\"\"\" # comment\ny = 1.5e3 ** 2 // 3 -> z",
            "名前 = 值(1)  # 中文\n__result__ := ñ.é",
            "'unterminated\nnext = 1",
            "f\"{x:{width}}\" + F'{'",
            "a\\\n b != c <= d >= e += f -= g *= h /= i %= j &= k |= l ^= m",
            "\"\\\u{e9}\" + '\\",
            "",
            "fr'{x}' BR\"y\" Rb'\\'",
        ];
        for code in cases {
            assert_eq!(lexed(code), lexed_reference(code), "{code:?}");
        }
    }

    use proptest::prelude::*;

    proptest! {
        /// Any mix of the lexer's tricky pieces (quotes, escapes, braces,
        /// prefixes, comments, line ends, non-ASCII names and operators)
        /// gives the reference's tokens.
        #[test]
        fn lexes_as_the_reference(
            parts in proptest::collection::vec(prop_oneof![
                Just("x"), Just("__result__"), Just("f"), Just("rb"), Just("Fr"), Just("u"), Just("'"),
                Just("\""), Just("'''"), Just("\\"), Just("{"), Just("}"), Just("{{"), Just("#"), Just("\n"),
                Just(" "), Just("="), Just("=="), Just("*"), Just("/"), Just("."), Just("("), Just("1.5"),
                Just("名"), Just("é"), Just("，"), Just("\u{3000}"), Just("->"), Just(":="),
            ], 0..32),
        ) {
            let code = parts.concat();
            prop_assert_eq!(lexed(&code), lexed_reference(&code));
        }
    }
}
