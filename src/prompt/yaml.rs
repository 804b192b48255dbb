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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn two_spaces_and_indented_sequences() {
        let v = json!({"role": "Dungeon Master", "rules": ["strict_physics", "permadeath"], "attributes": {"int": 18}});
        assert_eq!(
            to_yaml(&v),
            "role: Dungeon Master\nrules:\n  - strict_physics\n  - permadeath\nattributes:\n  int: 18\n"
        );
    }
}
