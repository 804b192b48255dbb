//! Any registry file text: a registry or an error, never a panic.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let _ = spindle::Registry::from_toml_str(&text);
    let _ = spindle::Registry::from_json_str(&text);
});
