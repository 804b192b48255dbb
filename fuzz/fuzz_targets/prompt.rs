//! Any bytes through the prompt side: a sandboxed template render, a card
//! import, a world-book entry, a migration, declared protocols.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Err(why) = spindle::check::prompt_entry_points(data) {
        panic!("{why}");
    }
});
