//! Any bytes as an SSE body, any chunking: no panic, chunked == whole.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Some((&selector, input)) = data.split_first()
        && let Err(why) = spindle::check::sse_split_invariance(selector, input)
    {
        panic!("{why}");
    }
});
