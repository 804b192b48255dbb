//! Any bytes, any profile or shaped registry, any chunk size: no panic,
//! chunked == whole, and payloads built on demand == payloads built as
//! elements complete.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Some((&selector, input)) = data.split_first()
        && let Err(why) = spindle::check::split_invariance(selector, input)
            .and_then(|()| spindle::check::deferred_payloads(selector, input))
    {
        panic!("{why}");
    }
});
