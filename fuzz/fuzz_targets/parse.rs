//! Any bytes, any profile or shaped registry, any chunk size: no panic,
//! chunked == whole, payloads built on demand == payloads built as
//! elements complete, and the same elements whole and chunked at small
//! limits.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Some((&selector, input)) = data.split_first()
        && let Err(why) = spindle::check::split_invariance(selector, input)
            .and_then(|()| spindle::check::deferred_payloads(selector, input))
            .and_then(|()| spindle::check::small_limits(selector, input))
    {
        panic!("{why}");
    }
});
