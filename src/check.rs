//! Self-checks shared by the fuzz targets (`fuzz/`) and the replay of their
//! saved inputs (`tests/fuzz_replay.rs`). Not part of the stable API.

use crate::event::coalesce;
use crate::{Parser, Registry};
use std::sync::Arc;

/// Parses `input` whole and in chunks chosen by `selector`, with a profile
/// chosen by `selector`, and checks the coalesced events agree and that no
/// element claims bytes outside the input.
///
/// # Errors
///
/// A description of the first disagreement.
pub fn split_invariance(selector: u8, input: &[u8]) -> Result<(), String> {
    let names = Registry::profile_names();
    let profile = names[usize::from(selector >> 5) % names.len()];
    let registry = Arc::new(Registry::profile(profile).ok_or("profile")?);
    let chunk = usize::from(selector & 0x1f) + 1;
    let run = |size: usize| {
        let mut p = Parser::with_options(registry.clone(), Default::default());
        let mut events = Vec::new();
        for c in input.chunks(size) {
            p.feed_into(c, &mut events);
        }
        events.extend(p.finish());
        coalesce(events)
    };
    let whole = run(input.len().max(1));
    let split = run(chunk);
    if whole != split {
        return Err(format!("profile {profile}: chunk {chunk} differs from whole input"));
    }
    for e in &whole {
        if let Some(el) = e.as_element()
            && (el.span.start > el.span.end || el.span.end > input.len())
        {
            return Err(format!("element {} has span {:?} outside the input", el.id, el.span));
        }
    }
    Ok(())
}

/// Decodes `input` as SSE whole and in chunks chosen by `selector`;
/// the items must agree.
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
    Ok(())
}

/// Runs every text entry point (lenient JSON, HTML filter, TAM, ACTION and
/// ATTP readers, state ops) on `text`: none may panic, the HTML filter's
/// output must hold no executable vector, and the filter must give the same
/// output at any split, with or without its runs that bypass the rewriter.
///
/// # Errors
///
/// A description of the first broken promise.
pub fn text_entry_points(text: &str) -> Result<(), String> {
    let _ = crate::payload::json::parse(text);
    let sanitized = crate::payload::html::sanitize(text);
    let lower = sanitized.html.to_ascii_lowercase();
    for bad in ["<script", "<iframe", "javascript:", "expression(", "url("] {
        if lower.contains(bad) {
            return Err(format!("filtered HTML still holds {bad:?}"));
        }
    }
    // A split size of 1 to 16 bytes, chosen by the text.
    let chunk = text.len() % 16 + 1;
    if let Some(why) = crate::payload::html::bypass_disagreement(text, chunk) {
        return Err(format!("HTML filter: {why}"));
    }
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
