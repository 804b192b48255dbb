//! No input panics the payload stage, the lenient JSON reader, paths or
//! `apply`; payloads do not depend on chunking; filtered HTML stays inside
//! the allowlist whatever the input.

use proptest::prelude::*;
use serde_json::Value;
use spindle::event::Event;
use spindle::payload::html::HtmlFilter;
use spindle::state::{Op, OpCode, Path, apply};
use spindle::{CodeMarkup, FilterLimits, Parser, Registry};

const TAGS: &[&str] = &[
    "content",
    "variable_update",
    "UpdateVariable",
    "tool_call",
    "ui_component",
    "media",
    "choice",
    "xx",
    "details",
    "status_bar",
    "thought",
];

/// Text biased towards the characters every reader cares about.
fn body() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop_oneof![
            3 => prop::sample::select(vec![
                "<", ">", "/", "\"", "'", "&", ";", "#", "[", "]", "{", "}", ",", ":", "=", "(", ")", "\\", "\n", " ",
                "_.set(", "`", "```", "<!--", "-->", "<analysis>", "</analysis>", "<b>", "<script>", "SET", "on", "url(",
                "\u{201c}", "\u{ff0c}", "\u{ff1a}", "True", "None", "//", "/*", "*/", "&#", "x;",
            ])
            .prop_map(str::to_string),
            1 => any::<char>().prop_map(|c| c.to_string()),
            1 => "[a-z0-9.]{1,6}",
        ],
        0..48,
    )
    .prop_map(|v| v.concat())
}

fn parse(input: &[u8], chunk: usize) -> Vec<Event> {
    let mut parser = Parser::new(Registry::filament());
    let mut out = Vec::new();
    for c in input.chunks(chunk.max(1)) {
        out.extend(parser.feed(c));
    }
    out.extend(parser.finish());
    out
}

fn payloads(events: &[Event]) -> Vec<Value> {
    events.iter().filter_map(Event::as_element).map(|e| e.payload.clone()).collect()
}

/// Which bytes of `html` are inside Markdown code, read independently of
/// spindle's reader by the rules its `payload` docs give: fenced blocks
/// (a line of three or more backticks or tildes after spaces, closed by a
/// line of at least as many of the same), and code spans on one line
/// (a run of backticks closed by the next run as long).
fn code_bytes(html: &str) -> Vec<bool> {
    let b = html.as_bytes();
    let mut code = vec![false; b.len()];
    let mut fence: Option<(u8, usize)> = None;
    let mut start = 0;
    while start < b.len() {
        let end = b[start..].iter().position(|&c| c == b'\n').map_or(b.len(), |n| start + n);
        let line = &b[start..end];
        let indent = line.iter().take_while(|&&c| c == b' ' || c == b'\t').count();
        let run_ch = line.get(indent).copied().filter(|&c| c == b'`' || c == b'~');
        let run = run_ch.map_or(0, |ch| line[indent..].iter().take_while(|&&c| c == ch).count());
        let after = &line[(indent + run).min(line.len())..];
        match (fence, run_ch) {
            (Some((ch, len)), Some(c)) if c == ch && run >= len && after.iter().all(u8::is_ascii_whitespace) => {
                fence = None;
            }
            (Some(_), _) => code[start..end].iter_mut().for_each(|c| *c = true),
            (None, Some(ch)) if run >= 3 && !(ch == b'`' && after.contains(&b'`')) => fence = Some((ch, run)),
            (None, _) => {
                // Spans: each run of backticks, closed by the next run as
                // long on the line; a fence's run that opens no fence
                // (a backtick in its info string) opens no span either.
                let mut i = if run_ch == Some(b'`') && run >= 3 { indent + run } else { 0 };
                let mut open: Option<(usize, usize)> = None;
                while i < line.len() {
                    if line[i] != b'`' {
                        i += 1;
                        continue;
                    }
                    let n = line[i..].iter().take_while(|&&c| c == b'`').count();
                    match open {
                        None => open = Some((i + n, n)),
                        Some((from, len)) if len == n => {
                            code[start + from..start + i].iter_mut().for_each(|c| *c = true);
                            open = None;
                        }
                        Some(_) => {}
                    }
                    i += n;
                }
            }
        }
        start = end + 1;
    }
    code
}

/// Elements and attributes that act even when written bare.
const ACTING: &[&str] = &[
    "script",
    "style",
    "iframe",
    "img",
    "svg",
    "math",
    "object",
    "embed",
    "textarea",
    "title",
    "xmp",
    "plaintext",
    "noscript",
    "template",
    "link",
    "meta",
    "base",
    "form",
    "input",
    "button",
    "details",
    "dialog",
    "image",
    "frame",
];

/// The filtered `html` runs nothing: outside Markdown code only the
/// allowlist's tags and no script-like pattern; inside code (shown as
/// written) also tags that could do nothing but show themselves, should a
/// renderer read them as HTML, unless the code is `AsWritten` (then a
/// renderer that shows code as text is trusted with anything in it). A
/// description of the first problem.
fn unsafe_html(html: &str, markup: CodeMarkup) -> Option<String> {
    let lower = html.to_ascii_lowercase();
    let code = code_bytes(&lower);
    let trusted = markup == CodeMarkup::AsWritten;
    if let Some((at, _)) = lower.match_indices("javascript:").find(|(at, _)| !(trusted && code[*at])) {
        return Some(format!("javascript: at {at}"));
    }
    for bad in ["url(", "expression("] {
        if let Some((at, _)) = lower.match_indices(bad).find(|(at, _)| !code[*at]) {
            return Some(format!("{bad} outside code at {at}"));
        }
    }
    for (i, _) in lower.match_indices('<') {
        let rest = &lower[i + 1..];
        let name: String = rest.trim_start_matches('/').chars().take_while(|c| c.is_ascii_alphanumeric()).collect();
        if ["b", "strong", "i", "em", "u", "s", "br", "span", "ruby", "rt", "rp"].contains(&name.as_str()) {
            continue;
        }
        if !code[i] {
            return Some(format!("markup <{name} outside code at {i}"));
        }
        if trusted {
            continue;
        }
        let line = &rest[..rest.find('\n').unwrap_or(rest.len())];
        if line.strip_prefix("!--").is_some_and(|c| c.contains("-->")) {
            // A comment ended on its line hides only itself.
            continue;
        }
        if rest.starts_with('!') || rest.starts_with('?') || ACTING.contains(&name.as_str()) {
            return Some(format!("<{name} in code at {i}"));
        }
        // The tag, up to its `>` (a quoted `>` does not end it here, which
        // only reads more).
        let tag = &rest[..rest.find('>').unwrap_or(rest.len())];
        let acting_attribute = tag.split(|c: char| c.is_ascii_whitespace() || c == '/').skip(1).any(|attr| {
            ["on", "href", "src", "style", "action", "formaction", "hidden", "srcdoc", "data", "is="]
                .iter()
                .any(|a| attr.starts_with(a))
        });
        let is_tag = name.starts_with(|c: char| c.is_ascii_alphabetic());
        if is_tag && (acting_attribute || tag.contains("url(") || tag.contains("expression(")) {
            return Some(format!("acting tag <{tag}> in code at {i}"));
        }
    }
    None
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(ProptestConfig::default().cases.min(128)))]

    #[test]
    fn any_body_in_any_tag(tag in prop::sample::select(TAGS), text in body(), attrs in "( [a-z]{1,5}=\"[^\"]{0,8}\"){0,2}") {
        let input = format!("<{tag}{attrs}>{text}</{tag}>");
        let whole = parse(input.as_bytes(), usize::MAX);
        for chunk in [1, 7] {
            prop_assert_eq!(payloads(&parse(input.as_bytes(), chunk)), payloads(&whole), "{}", input);
        }
        for el in whole.iter().filter_map(Event::as_element) {
            if let Some(html) = el.payload.get("html").and_then(Value::as_str) {
                let problem = unsafe_html(html, CodeMarkup::Inert);
                prop_assert!(problem.is_none(), "{}: {}", problem.unwrap_or_default(), html);
            }
        }
    }

    /// With code shown as written, the filter's output is safe outside
    /// code, the same at every split, and its own fixed point.
    #[test]
    fn code_as_written_is_safe_outside_code(text in body(), cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..6)) {
        let limits = FilterLimits { code_markup: CodeMarkup::AsWritten, ..FilterLimits::default() };
        let run = |pieces: &[&str]| {
            let mut filter = HtmlFilter::with_limits(limits);
            let mut out: String = pieces.iter().map(|p| filter.push(p)).collect();
            out.push_str(&filter.finish());
            out
        };
        let whole = run(&[&text]);
        let mut at: Vec<usize> = cuts.iter().map(|c| c.index(text.len() + 1)).filter(|&c| text.is_char_boundary(c)).collect();
        at.sort_unstable();
        at.dedup();
        let mut pieces = Vec::new();
        let mut from = 0;
        for cut in at {
            pieces.push(&text[from..cut]);
            from = cut;
        }
        pieces.push(&text[from..]);
        prop_assert_eq!(&run(&pieces), &whole, "{:?}", text);
        let problem = unsafe_html(&whole, CodeMarkup::AsWritten);
        prop_assert!(problem.is_none(), "{}: {}", problem.unwrap_or_default(), whole);
        prop_assert_eq!(run(&[&whole]), whole.clone(), "not a fixed point: {:?}", text);
    }

    #[test]
    fn arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let whole = parse(&bytes, usize::MAX);
        prop_assert_eq!(payloads(&parse(&bytes, 1)), payloads(&whole));
    }

    #[test]
    fn lenient_json_and_paths_never_panic(text in body()) {
        let _ = spindle::payload::json::parse(&text);
        let _ = spindle::payload::json::parse_values(&text);
        let _ = Path::parse(&text);
        let _ = spindle::payload::html::sanitize(&text);
    }

    #[test]
    fn apply_never_panics(
        paths in prop::collection::vec("[a-c]{1,2}(\\.[a-c0-9]{1,2}|\\[-?[0-9]\\]){0,3}", 1..12),
        codes in prop::collection::vec(0usize..8, 1..12),
        values in prop::collection::vec(prop_oneof![Just(Value::Null), any::<i8>().prop_map(Value::from), Just(Value::from(0.5)), Just(serde_json::json!([1])), Just(serde_json::json!({"a": 1})), Just(Value::from("s"))], 1..12),
    ) {
        let mut state = serde_json::json!({"a": {"b": [1, 2, {"c": 3}]}, "b": 4, "c": "text"});
        let ops: Vec<Op> = paths
            .iter()
            .zip(codes.iter().cycle())
            .zip(values.iter().cycle())
            .map(|((p, &c), v)| {
                let code = OpCode::ALL[c % OpCode::ALL.len()];
                let value = code.takes_value().then(|| if code.is_arithmetic() { Value::from(2) } else { v.clone() });
                Op::new(code, p, value)
            })
            .collect();
        let outcomes = apply(&mut state, &ops);
        prop_assert_eq!(outcomes.len(), ops.len());
        // A failed op leaves the state as it was: replaying only the
        // successful ones on a fresh copy gives the same state.
        let ok: Vec<Op> = outcomes.iter().filter(|o| o.is_ok()).map(|o| o.op.clone()).collect();
        let mut replay = serde_json::json!({"a": {"b": [1, 2, {"c": 3}]}, "b": 4, "c": "text"});
        let again = apply(&mut replay, &ok);
        prop_assert!(again.iter().all(|o| o.is_ok()));
        prop_assert_eq!(replay, state);
    }
}
