//! Tool calls written in the text: TAM blocks (spec 000, 002 §5), ACTION XML
//! (spec 004) and ATTP TOML (spec 001), normalised into one `ToolCall` shape.

use crate::event::Element;
use crate::payload::Payload;

/// The payload of a completed TAM element.
pub fn tam_payload(_el: &Element) -> Payload {
    Payload::none()
}

/// The payload of a completed ACTION element.
pub fn action_payload(_el: &Element) -> Payload {
    Payload::none()
}

/// The payload of a completed ATTP element.
pub fn attp_payload(_el: &Element) -> Payload {
    Payload::none()
}
