//! Any model text through the proxy's tool calling: streamed in deltas,
//! read in pieces and answered whole, a client gets the same content,
//! calls and finish reason, in well-formed chunks (`spindle::check::
//! tool_calling_agreement`). The first byte picks the protocol, the
//! handling of invalid calls, the ending and the delta size.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Some((&selector, input)) = data.split_first()
        && let Err(why) = spindle::check::tool_calling_agreement(selector, input)
    {
        panic!("{why}");
    }
});
