//! Deterministic YAML for prompts: 2-space indentation, sequences indented
//! under their key, keys in the order given (spec 003 §2.1.1). The
//! emitting is serde-saphyr's; this module only fixes its options.

use serde_json::Value;

/// `value` as 2-space YAML, keys in their order, no document marker; a
/// trailing newline. A value serde-saphyr cannot write (none that JSON can
/// hold) falls back to its JSON text.
pub fn to_yaml(value: &Value) -> String {
    let mut options = serde_saphyr::SerializerOptions::default();
    options.indent_step = 2;
    options.compact_list_indent = false;
    let mut text = serde_saphyr::to_string_with_options(value, options).unwrap_or_else(|_| value.to_string());
    if !text.ends_with('\n') {
        text.push('\n');
    }
    text
}

/// YAML as prompts read it (`spindle prompt render --vars`, world-book
/// entries): YAML 1.2 booleans only, so `no`, `y` and `NO` (a country
/// code) stay text; `007` and `1_000` as written; a key written twice is
/// an error, not a silent overwrite.
///
/// ```
/// use spindle::prompt::from_yaml;
/// use serde_json::json;
///
/// let v = from_yaml("country: NO\nanswer: yes\ncode: 007\nok: true").unwrap();
/// assert_eq!(v, json!({"country": "NO", "answer": "yes", "code": "007", "ok": true}));
/// assert!(from_yaml("a: 1\na: 2").is_err());
/// ```
///
/// # Errors
///
/// The text is not YAML (the message says where).
pub fn from_yaml(text: &str) -> Result<Value, YamlError> {
    serde_saphyr::from_str_with_options(text, options())
        // The crate's advice is for its own callers, not for a prompt's.
        .map_err(|e| YamlError(e.to_string().replace(", set DuplicateKeyPolicy in Options if acceptable", "")))
}

/// Why [`from_yaml`] failed.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct YamlError(String);

fn options() -> serde_saphyr::Options {
    let mut options = serde_saphyr::Options::default();
    options.strict_booleans = true;
    options.leading_zero_numbers_as_strings = true;
    options.underscored_numbers_as_strings = true;
    options.duplicate_keys = serde_saphyr::DuplicateKeyPolicy::Error;
    options
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    /// JSON values whose strings look like other YAML (`yes`, `null`,
    /// `1e3`, `- x`, `a: b`, `#`, leading spaces, line breaks, …).
    fn value() -> impl Strategy<Value = Value> {
        let text = prop_oneof![
            "[ -~]{0,6}",
            "(yes|no|null|~|true|NaN|\\.inf|0x10|012|\\+1|1:20|2001-01-01|---|\\.\\.\\.|- x|a: b|#x|'q'|\"q\"|\\||>|\\{a\\}|\\[1\\]|@x|`x|%x|!x|&x|\\*x)",
            "[ \\t\\r\\n\\x00\\u{85}\\u{2028}\\u{feff}a:#-]{0,5}",
        ];
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            (-1e300f64..1e300).prop_map(Value::from),
            text.clone().prop_map(Value::from),
        ];
        leaf.prop_recursive(3, 24, 4, move |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
                proptest::collection::vec((text.clone(), inner), 0..4)
                    .prop_map(|kv| Value::Object(kv.into_iter().collect())),
            ]
        })
    }

    proptest! {
        /// The YAML a prompt holds means the value it was written from.
        #[test]
        fn yaml_reads_back_as_the_value(v in value()) {
            let yaml = to_yaml(&v);
            let back: Value = serde_saphyr::from_str(&yaml).map_err(|e| TestCaseError::fail(format!("{e}\n{yaml}")))?;
            prop_assert_eq!(&back, &v, "{}", yaml);
            // And so it does as spindle reads YAML.
            let ours = from_yaml(&yaml).map_err(|e| TestCaseError::fail(format!("{e}\n{yaml}")))?;
            prop_assert_eq!(ours, v, "{}", yaml);
        }
    }

    #[test]
    fn two_spaces_and_indented_sequences() {
        let v = json!({"role": "Dungeon Master", "rules": ["strict_physics", "permadeath"], "attributes": {"int": 18}});
        assert_eq!(
            to_yaml(&v),
            "role: Dungeon Master\nrules:\n  - strict_physics\n  - permadeath\nattributes:\n  int: 18\n"
        );
    }
}
