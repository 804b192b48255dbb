//! Self-checks shared by the fuzz targets (`fuzz/`) and the replay of their
//! saved inputs (`tests/fuzz_replay.rs`). Not part of the stable API.

use crate::event::{Event, coalesce};
use crate::payload::{Payloads, build_deferred};
use crate::{Parser, ParserOptions, Registry};
use std::sync::Arc;

/// A fuzz input's registry, chunk size and the input left to parse.
struct Selected<'a> {
    /// The profile's name, or the shape bytes of a [`shaped`] registry.
    name: String,
    registry: Arc<Registry>,
    chunk: usize,
    input: &'a [u8],
}

/// What a fuzz input's first byte selects: a registry (its top three bits:
/// each built-in profile, and past them one of [`shaped`]'s, chosen by the
/// input's next two bytes), and a chunk size of 1 to 32 bytes (the rest).
fn selected(selector: u8, input: &[u8]) -> Result<Selected<'_>, String> {
    let names = Registry::profile_names();
    let chunk = usize::from(selector & 0x1f) + 1;
    match names.get(usize::from(selector >> 5)) {
        Some(&profile) => {
            let registry = Registry::profile(profile).ok_or("profile")?;
            Ok(Selected { name: profile.to_string(), registry: Arc::new(registry), chunk, input })
        }
        None => {
            let (shape, input) = match input {
                [a, b, rest @ ..] => ([*a, *b], rest),
                _ => ([input.first().copied().unwrap_or(0), 0], &[][..]),
            };
            let text = shaped(shape);
            let registry = Registry::from_toml_str(&text).map_err(|e| format!("{text}: {e}"))?;
            let name = format!("shaped {:#04x} {:#04x}", shape[0], shape[1]);
            Ok(Selected { name, registry: Arc::new(registry), chunk, input })
        }
    }
}

/// A registry file no profile is like, from two bytes: `filament` with
/// another lead (two bits), another default (two bits), the lead's open tag
/// written by the template or not (one bit), and the content tag's body
/// replaced (three bits); then the thought's body (two bits), no tool-call
/// blocks, a bare mergeable thought, a status bar holding choices, choices
/// only after content, a media tag that streams, and a tag written with
/// special markers (a bit each). Bare text may open an element that does
/// not stream, a void or JSON element may lead, content may be raw.
fn shaped(shape: [u8; 2]) -> String {
    let [a, b] = shape;
    let lead = ["thought", "content", "status_bar", "media"][usize::from(a & 3)];
    let default = ["content", "status_bar", "thought", "ui_component"][usize::from(a >> 2 & 3)];
    let prefilled = a >> 4 & 1 == 1;
    let content = match a >> 5 {
        3 => "body = \"raw\"",
        4 => "body = \"json\"",
        5 => "body = \"structured\"",
        6 => "body = \"void\"",
        7 => "body = \"stream\"\nbare = true",
        _ => "body = \"stream\"\nmergeable = true\nmandatory = true",
    };
    let mut text = format!(
        "name = \"shaped\"\nextends = \"filament\"\nlead = \"{lead}\"\ndefault = \"{default}\"\n\
         lead_prefilled = {prefilled}\n"
    );
    if b & 4 != 0 {
        text.push_str("without = [\"tam\", \"action\"]\n");
    }
    text.push_str(&format!("[[tag]]\nname = \"content\"\n{content}\n"));
    if b & 0b1011 != 0 {
        let body = ["stream", "raw", "structured", "json"][usize::from(b & 3)];
        let bare = b & 8 != 0;
        text.push_str(&format!(
            "[[tag]]\nname = \"thought\"\naliases = [\"think\"]\nbody = \"{body}\"\nbare = {bare}\nmergeable = {bare}\n"
        ));
    }
    if b & 16 != 0 {
        text.push_str("[[tag]]\nname = \"status_bar\"\nbody = \"structured\"\nchildren = [\"choice\"]\n");
    }
    if b & 32 != 0 {
        text.push_str("[[tag]]\nname = \"choice\"\nbody = \"structured\"\nafter = [\"content\"]\n");
    }
    if b & 64 != 0 {
        text.push_str("[[tag]]\nname = \"media\"\nbody = \"stream\"\n");
    }
    if b & 128 != 0 {
        text.push_str("[[tag]]\nname = \"note\"\nmarkers = { open = \"NOTE\", close = \"END_NOTE\" }\n");
    }
    text
}

/// All events of `input` fed `chunk` bytes at a time (at least one).
fn events_of(registry: &Arc<Registry>, options: ParserOptions, input: &[u8], chunk: usize) -> Vec<Event> {
    rewritten(registry, options, input, chunk).0
}

/// [`events_of`], and the corrected text when `options` ask for it, with
/// where call elements ended in it (element id, offset in the whole text;
/// marked only when call text is left out, [`crate::CallText::Omit`], as
/// the proxy's tool calling asks).
fn rewritten(
    registry: &Arc<Registry>,
    options: ParserOptions,
    input: &[u8],
    chunk: usize,
) -> (Vec<Event>, Vec<u8>, Vec<(u32, usize)>) {
    let mut p = Parser::with_options(registry.clone(), options);
    let (mut events, mut text, mut marks, mut piece) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut take = |bytes: Vec<u8>, piece: &mut Vec<(u32, usize)>, text: &mut Vec<u8>| {
        marks.extend(piece.drain(..).map(|(id, at)| (id, text.len() + at)));
        text.extend(bytes);
    };
    for c in input.chunks(chunk.max(1)) {
        p.feed_into(c, &mut events);
        let bytes = p.take_rewrite_marked(&mut piece);
        take(bytes, &mut piece, &mut text);
    }
    let (last, rest) = p.finish_with_rewrite_marked(&mut piece);
    events.extend(last);
    take(rest, &mut piece, &mut text);
    (events, text, marks)
}

/// Parses `input` whole and in chunks chosen by `selector`, with a registry
/// chosen by `selector` (and, for a shaped one, the input's first two
/// bytes), and checks the coalesced events agree, that no element claims
/// bytes outside the input, and that the corrected text (`rewrite`) is the
/// same either way and changes no event. With call text left out, the
/// events, the corrected text and where call elements ended in it must
/// also be the same whole and in chunks.
///
/// # Errors
///
/// A description of the first disagreement.
pub fn split_invariance(selector: u8, input: &[u8]) -> Result<(), String> {
    let Selected { name: profile, registry, chunk, input } = selected(selector, input)?;
    let run = |size: usize| {
        let (events, text, _) =
            rewritten(&registry, ParserOptions { rewrite: true, ..ParserOptions::default() }, input, size);
        (coalesce(events), text)
    };
    let (whole, whole_text) = run(input.len());
    let (split, split_text) = run(chunk);
    if whole != split {
        return Err(format!("profile {profile}: chunk {chunk} differs from whole input"));
    }
    if whole_text != split_text {
        return Err(format!("profile {profile}: the rewrite at chunk {chunk} differs from the whole input's"));
    }
    if coalesce(events_of(&registry, ParserOptions::default(), input, input.len())) != whole {
        return Err(format!("profile {profile}: the rewrite changes the events"));
    }
    for e in &whole {
        if let Some(el) = e.as_element()
            && (el.span.start > el.span.end || el.span.end > input.len())
        {
            return Err(format!("element {} has span {:?} outside the input", el.id, el.span));
        }
    }
    let omit = ParserOptions { rewrite: true, call_text: crate::CallText::Omit, ..ParserOptions::default() };
    let (events, text, marks) = rewritten(&registry, omit, input, input.len());
    let (split_events, split_text, split_marks) = rewritten(&registry, omit, input, chunk);
    if coalesce(events) != coalesce(split_events) {
        return Err(format!("profile {profile}, call text left out: chunk {chunk} differs from whole input"));
    }
    if text != split_text {
        return Err(format!("profile {profile}: the rewrite without call text at chunk {chunk} differs from whole"));
    }
    if marks != split_marks {
        return Err(format!("profile {profile}: call ends at {split_marks:?} at chunk {chunk}, {marks:?} whole"));
    }
    if let Some(m) = marks.iter().find(|m| m.1 > text.len()) {
        return Err(format!("profile {profile}: call end {m:?} past the corrected text ({} bytes)", text.len()));
    }
    Ok(())
}

/// Parses `input` (profile and chunk size chosen by `selector`, as
/// [`split_invariance`]) with small limits (an element of 1 to 64 bytes, a
/// marker of 3 to 66, chosen by the input's length), whole and in chunks:
/// past a limit the parser degrades without a panic, and the elements
/// (tag, kept text, payload, truncation) are the same either way. The
/// fuzz inputs are short: at the default limits (megabytes) they never
/// reach one.
///
/// # Errors
///
/// A description of the first disagreement.
pub fn small_limits(selector: u8, input: &[u8]) -> Result<(), String> {
    let Selected { name: profile, registry, chunk, input } = selected(selector, input)?;
    let mut options = ParserOptions::default();
    options.machine.max_element_len = input.len() % 64 + 1;
    options.scan.max_marker_len = input.len() / 64 % 64 + 3;
    let elements = |size: usize| -> Vec<String> {
        events_of(&registry, options, input, size)
            .iter()
            .filter_map(Event::as_element)
            .map(|e| format!("<{}> {:?} {} {}", e.tag, e.text, e.payload, e.truncated))
            .collect()
    };
    let (whole, split) = (elements(input.len()), elements(chunk));
    if whole != split {
        let (m, e) = (options.machine.max_element_len, options.scan.max_marker_len);
        return Err(format!(
            "profile {profile}, element limit {m}, marker limit {e}: chunk {chunk} gives elements {split:?}, whole {whole:?}"
        ));
    }
    Ok(())
}

/// Parses `input` (profile and chunk size chosen by `selector`, as
/// [`split_invariance`]) with every payload built eagerly and with
/// [`Payloads::OnDemand`]; building each deferred payload
/// ([`build_deferred`]) and putting it and its events back must give the
/// eager events exactly (compared as JSON: key order included).
///
/// # Errors
///
/// A description of the first disagreement.
pub fn deferred_payloads(selector: u8, input: &[u8]) -> Result<(), String> {
    let Selected { name: profile, registry, chunk, input } = selected(selector, input)?;
    deferred_payloads_with(&registry, input, chunk).map_err(|why| format!("profile {profile}, chunk {chunk}: {why}"))
}

/// [`deferred_payloads`] with a given registry and chunk size.
///
/// # Errors
///
/// A description of the first disagreement.
pub fn deferred_payloads_with(registry: &Arc<Registry>, input: &[u8], chunk: usize) -> Result<(), String> {
    let run =
        |payloads: Payloads| events_of(registry, ParserOptions { payloads, ..ParserOptions::default() }, input, chunk);
    let eager = run(Payloads::Eager);
    let mut rebuilt = Vec::new();
    for event in run(Payloads::OnDemand) {
        let Event::Element(mut el) = event else {
            rebuilt.push(event);
            continue;
        };
        match build_deferred(registry, &el) {
            Some(built) => {
                if !el.payload.is_null() {
                    return Err(format!("element {} <{}> has a payload on demand", el.id, el.tag));
                }
                el.payload = built.value;
                rebuilt.push(Event::Element(el));
                rebuilt.extend(built.events);
            }
            None => rebuilt.push(Event::Element(el)),
        }
    }
    let json = |events: &[Event]| serde_json::to_string(events).map_err(|e| e.to_string());
    if json(&eager)? != json(&rebuilt)? {
        return Err("payloads built on demand differ from eager ones".to_string());
    }
    Ok(())
}

/// Decodes `input` as SSE whole and in chunks chosen by `selector`;
/// the items must agree. Their data then goes through [`ChatStream`]
/// (a chat-completions stream), and the whole input is read as a response
/// body: neither may panic. The input read as JSON lines
/// ([`crate::sources::LineTap`]) whole and in those chunks must give the
/// same events.
///
/// [`ChatStream`]: crate::sources::ChatStream
///
/// # Errors
///
/// A description of the disagreement.
pub fn sse_split_invariance(selector: u8, input: &[u8]) -> Result<(), String> {
    use crate::sources::SseDecoder;
    let chunk = usize::from(selector) % 17 + 1;
    let mut whole = SseDecoder::new();
    let mut a = whole.feed(input);
    a.extend(whole.finish());
    let mut split = SseDecoder::new();
    let mut b = Vec::new();
    for c in input.chunks(chunk) {
        split.feed_into(c, &mut b);
    }
    b.extend(split.finish());
    if a != b {
        return Err(format!("SSE items differ at chunk size {chunk}"));
    }
    // The events of a model stream: the chunks these items carry, and the
    // same bytes read as one (non-streamed) response body.
    use crate::sources::{ChatStream, SseItem, StreamOptions};
    let mut stream = ChatStream::new(StreamOptions::default());
    let mut events = Vec::new();
    for item in &a {
        match item {
            SseItem::Event(e) | SseItem::Unterminated(e) => {
                stream.push_data_events(&e.event, &e.data, e.at, &mut events)
            }
            SseItem::Comment { .. } | SseItem::Fault(_) => {}
        }
    }
    stream.finish_into(&mut events);
    let _ = ChatStream::response_events(StreamOptions::default(), input);
    let lines = |size: usize| {
        let mut tap = crate::sources::LineTap::new(StreamOptions::default());
        let mut events = Vec::new();
        for c in input.chunks(size.max(1)) {
            tap.feed_into(c, &mut events);
        }
        tap.finish_into(&mut events);
        events
    };
    if lines(input.len()) != lines(chunk) {
        return Err(format!("JSON lines give other events at chunk size {chunk}"));
    }
    Ok(())
}

/// Model text through the proxy's tool calling (`spindle proxy
/// --tool-protocol`): `selector` picks the protocol, whether invalid calls
/// are dropped, whether the stream ends cut off (`length`), and how many
/// characters each content delta holds. The text streamed in those deltas
/// must reach the client as whole SSE events of JSON chunks ending in
/// `[DONE]`, each call's first fragment carrying its id and name and the
/// call indexes counting up from 0; the client's bytes must not depend on
/// how the upstream's bytes were read; and the content, calls and finish
/// reason a client assembles must be the same as with the text in one
/// delta, and as in the same text answered whole (not streamed). The same
/// bytes are also read as a request body: the request side translates it
/// or refuses it with a reason, and a translated body is JSON.
///
/// # Errors
///
/// A description of the first disagreement.
#[cfg(feature = "proxy")]
pub fn tool_calling_agreement(selector: u8, input: &[u8]) -> Result<(), String> {
    crate::proxy::selfcheck::tool_calling_agreement(selector, &String::from_utf8_lossy(input))
}

/// Runs every text entry point (lenient JSON, HTML filter, TAM, ACTION and
/// ATTP readers, state ops) on `text`: none may panic, strict JSON must
/// read as `serde_json` reads it, the HTML filter's output must hold no
/// executable vector and be its own fixed point, and the filter must give
/// the same output at any split, with or without its runs that bypass the
/// rewriter.
///
/// # Errors
///
/// A description of the first broken promise.
pub fn text_entry_points(text: &str) -> Result<(), String> {
    let lenient = crate::payload::json::parse(text);
    // Strict JSON reads as strict JSON reads it.
    if let Ok(strict) = serde_json::from_str::<serde_json::Value>(text)
        && lenient.as_ref().map(|read| &read.value) != Ok(&strict)
    {
        return Err(format!("the lenient reader reads the JSON {text:?} as {lenient:?}, not {strict:?}"));
    }
    let sanitized = crate::payload::html::sanitize(text);
    if let Some(problem) = filtered_html_problem(&sanitized.html, crate::CodeMarkup::Inert) {
        return Err(format!("filtered HTML {:?}: {problem}", sanitized.html));
    }
    // The filter's output is its own fixed point: filtered again, it is
    // unchanged (anything the filter would still change is markup it let
    // through unapproved).
    let again = crate::payload::html::sanitize(&sanitized.html).html;
    if again != sanitized.html {
        return Err(format!("HTML filter: filtering {:?} again changes it to {again:?}", sanitized.html));
    }
    // A split size of 1 to 16 bytes, chosen by the text.
    let chunk = text.len() % 16 + 1;
    if let Some(why) = crate::payload::html::bypass_disagreement(text, chunk) {
        return Err(format!("HTML filter: {why}"));
    }
    code_as_written(text, chunk)?;
    let _ = crate::calls::tam::parse_tam(text);
    let _ = crate::calls::action::parse_action(text);
    let _ = crate::calls::attp::parse_attp(text);
    if let Ok(read) = crate::payload::json::parse(text) {
        let ops = crate::state::ops_from_payload(&serde_json::json!({ "ops": read.value }));
        let mut state = serde_json::json!({});
        let _ = crate::state::apply(&mut state, &ops);
    }
    Ok(())
}

/// The HTML filter with code shown as written
/// ([`crate::CodeMarkup::AsWritten`]) over `text`, whole and in
/// `chunk`-byte pieces: safe outside Markdown code, the same either way,
/// and its own fixed point.
///
/// # Errors
///
/// A description of the first broken promise.
pub fn code_as_written(text: &str, chunk: usize) -> Result<(), String> {
    let limits = crate::FilterLimits { code_markup: crate::CodeMarkup::AsWritten, ..crate::FilterLimits::default() };
    let as_written = |input: &str, chunk: usize| {
        let mut filter = crate::payload::html::HtmlFilter::with_limits(limits);
        let mut out = String::new();
        let mut rest = input;
        while !rest.is_empty() {
            let mut cut = chunk.clamp(1, rest.len());
            while !rest.is_char_boundary(cut) {
                cut += 1;
            }
            out.push_str(&filter.push(&rest[..cut]));
            rest = &rest[cut..];
        }
        out.push_str(&filter.finish());
        out
    };
    let shown = as_written(text, usize::MAX);
    if let Some(problem) = filtered_html_problem(&shown, crate::CodeMarkup::AsWritten) {
        return Err(format!("filtered HTML (code as written) {shown:?}: {problem}"));
    }
    let split = as_written(text, chunk);
    if split != shown {
        return Err(format!("HTML filter (code as written): at {chunk}-byte chunks {split:?}, whole {shown:?}"));
    }
    let again = as_written(&shown, usize::MAX);
    if again != shown {
        return Err(format!("HTML filter (code as written): filtering {shown:?} again changes it to {again:?}"));
    }
    Ok(())
}

/// Which bytes of `html` are inside Markdown code, read independently of
/// spindle's readers (`scan::markdown`, `payload::code`) by the rules the
/// `payload` docs give: fenced blocks
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
pub fn filtered_html_problem(html: &str, markup: crate::CodeMarkup) -> Option<String> {
    let lower = html.to_ascii_lowercase();
    let code = code_bytes(&lower);
    let trusted = markup == crate::CodeMarkup::AsWritten;
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
        // The name as an HTML tokenizer reads it: up to white space, `/` or
        // `>` (`<frame<<x>` is an element named `frame<<x`, no frame).
        let name: String = rest
            .trim_start_matches('/')
            .chars()
            .take_while(|&c| !c.is_ascii_whitespace() && c != '/' && c != '>')
            .collect();
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
        let acting_attribute =
            tag.trim_start_matches('/').split(|c: char| c.is_ascii_whitespace() || c == '/').skip(1).any(|attr| {
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

/// Runs every prompt-side entry point on `data`: the bytes as a Jinja2
/// template in the sandbox (small limits, so that any loop ends fast), as
/// a card, as a world-book entry, as SillyTavern text to migrate, and as a
/// prompt declaring protocols. None may panic; a render must keep to its
/// output limit and give the same text twice (it is seeded).
///
/// # Errors
///
/// A description of the first broken promise.
#[cfg(feature = "prompt")]
pub fn prompt_entry_points(data: &[u8]) -> Result<(), String> {
    use crate::prompt::{RenderLimits, Renderer};
    use serde_json::json;
    let text = String::from_utf8_lossy(data);
    let max_output = 16 * 1024;
    let now = chrono::DateTime::parse_from_rfc3339("2026-01-02T03:04:05+08:00").map_err(|e| e.to_string())?;
    let renderer = Renderer::new().with_seed(7).with_now(now).with_limits(RenderLimits {
        fuel: 20_000,
        recursion: 16,
        max_output,
        // On this thread: a fuzzer's own timeout reports a run-away render.
        max_time: None,
    });
    let vars =
        json!({"user": {"name": "Ann", "persona": "a traveller"}, "char": "Bo", "items": [1, "two", {"three": 3}]});
    let state = json!({"hp": 3, "bag": ["torch"], "flags": {"met": true}});
    let first = renderer.render(&text, &vars, &state);
    if let Ok(out) = &first
        && out.len() > max_output
    {
        return Err(format!("a render wrote {} bytes past its limit of {max_output}", out.len()));
    }
    let second = renderer.render(&text, &vars, &state);
    if first.as_ref().ok() != second.as_ref().ok() {
        return Err("two renders with one seed differ".into());
    }
    let _ = crate::prompt::import_bytes(data);
    let entry = crate::prompt::normalize_entry("entry", &text);
    // A world-book entry's text, whatever it holds, ends its block only at
    // the block's end.
    let block = crate::prompt::Block::text("lorebook_entry", entry.text).role("system").render();
    for tag in ["lorebook_entry>", "block>"] {
        if block.to_ascii_lowercase().matches(&format!("</{tag}")).count() != 1 {
            return Err(format!("the entry {text:?} closes its block early: {block:?}"));
        }
    }
    let migrated = crate::prompt::migrate(&text);
    // Whatever the macros, the migrated template compiles (global writes
    // aside: minijinja alone has no `set_global`; the renderer reads it).
    if !migrated.text.contains("{% set_global")
        && let Err(e) = minijinja::Environment::new().template_from_str(&migrated.text)
    {
        return Err(format!("the migration of {text:?} does not compile: {e} ({:?})", migrated.text));
    }
    let rendered = renderer.render(&migrated.text, &vars, &state);
    // A migration that reports every macro converted (or a global write,
    // which the render hands on) renders, whatever the state holds, a
    // limit aside (the fuel here is small).
    let renders = |n: &crate::prompt::MigrationNote| {
        n.kind == crate::prompt::NoteKind::Converted
            || (n.kind == crate::prompt::NoteKind::NeedsHost && n.to.starts_with("{% set_global"))
    };
    if migrated.notes.iter().all(renders)
        && let Err(e) = &rendered
        && !matches!(e, crate::prompt::RenderError::Limit(_))
    {
        return Err(format!("the migration of {text:?} reports every macro converted but does not render: {e}"));
    }
    // Text with no macro shows as written (SillyTavern's `{%` is text):
    // only the one trailing newline Jinja drops (`\n`, then `\r`) may go.
    if !text.contains("{{") && !["<USER>", "<BOT>", "<CHAR>"].iter().any(|n| text.contains(n)) {
        let shown = rendered.map_err(|e| format!("migrated text without macros failed to render: {e}"))?;
        let trimmed = text.strip_suffix('\n').unwrap_or(&text);
        let trimmed = trimmed.strip_suffix('\r').unwrap_or(trimmed);
        if shown != text && shown != trimmed {
            return Err(format!("migrated text without macros rendered as {shown:?}, not as written"));
        }
    }
    // The registry file is generated: it always loads.
    crate::prompt::registry_for(&text).map_err(|e| format!("the registry of {text:?} does not load: {e}"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every shape (each value of each byte) gives a valid registry, and a
    /// response with every kind of element parses the same whole and in
    /// chunks under each.
    #[test]
    fn every_shape_is_a_registry_and_splits_alike() {
        let input = "lead in\n```\n<ACTION><ls/></ACTION><thought>plan</thought>bare\n```xml\n<ACTION><ls/></ACTION>\n<content>Hi <b>x</b></content>\
                     <status_bar><hp>3</hp><choice>a</choice></status_bar>tail text<media src=\"a.png\"> after\n\
                     <|[NOTE]|>n<|[END_NOTE]|><choice>b</choice><ui_component>{\"a\": 1}</ui_component>";
        for shape in (0..=255u8).flat_map(|a| [[a, 0], [a, a.rotate_left(3)], [a, !a]]) {
            for chunk in [0u8, 2, 6, 31] {
                let mut data = shape.to_vec();
                data.extend_from_slice(input.as_bytes());
                let selector = 0xe0 | chunk;
                split_invariance(selector, &data).unwrap();
                deferred_payloads(selector, &data).unwrap();
            }
        }
    }
}
