//! Any bytes, any profile, any chunk size: no panic, chunked == whole.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Some((&selector, input)) = data.split_first()
        && let Err(why) = spindle::check::split_invariance(selector, input)
    {
        panic!("{why}");
    }
});
