//! Replays the saved fuzz inputs of `tests/fuzz/testdata/` (minimised
//! crashes and hand-picked seeds) through the same checks the fuzz targets
//! make (`parse`, `sse`, `text`, `prompt`, `calling`), so CI never needs cargo-fuzz. A file's
//! first byte selects the chunk size and a profile, or a registry shaped by
//! the next two bytes, as in `fuzz/fuzz_targets/parse.rs`.

use std::path::Path;

#[test]
fn saved_fuzz_inputs_pass_the_fuzz_checks() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz/testdata");
    let mut files: Vec<_> =
        std::fs::read_dir(&dir).expect("tests/fuzz/testdata exists").filter_map(|e| e.ok()).collect();
    files.sort_by_key(|e| e.path());
    assert!(!files.is_empty(), "no saved inputs in {}", dir.display());
    for entry in files {
        let data = std::fs::read(entry.path()).expect("readable");
        let Some((&selector, input)) = data.split_first() else { continue };
        for shift in 0..8u8 {
            // Every registry and several chunk sizes, not just the saved one.
            let sel = selector.wrapping_add(shift.wrapping_mul(37));
            let checks = [
                spindle::check::split_invariance(sel, input),
                spindle::check::deferred_payloads(sel, input),
                spindle::check::sse_split_invariance(sel, input),
                spindle::check::small_limits(sel, input),
            ];
            for result in checks {
                if let Err(why) = result {
                    panic!("{}: {why}", entry.path().display());
                }
            }
        }
        #[cfg(feature = "proxy")]
        for shift in 0..4u8 {
            // The proxy's tool calling: four of its protocols, endings and
            // delta sizes.
            if let Err(why) =
                spindle::check::tool_calling_agreement(selector.wrapping_add(shift.wrapping_mul(69)), input)
            {
                panic!("{}: {why}", entry.path().display());
            }
        }
        if let Err(why) = spindle::check::text_entry_points(&String::from_utf8_lossy(input)) {
            panic!("{}: {why}", entry.path().display());
        }
        if let Err(why) = spindle::check::prompt_entry_points(input) {
            panic!("{}: {why}", entry.path().display());
        }
    }
}
