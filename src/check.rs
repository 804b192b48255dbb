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
