//! Any text through lenient JSON, the HTML filter, TAM/ACTION/ATTP and state.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Err(why) = spindle::check::text_entry_points(&String::from_utf8_lossy(data)) {
        panic!("{why}");
    }
});
