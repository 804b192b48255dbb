//! Payloads: typed views of elements, built the moment an element
//! completes, and the per-element streaming transforms of deltas (HTML
//! filtering of content, thought extraction from ATTP).
//!
//! This module owns the [`Stage`] that sits between the machine and the
//! caller: it sees every event in order, keeps per-element state for
//! streaming bodies, and fills `payload` on `element` events. It must not
//! change structure (which elements exist, where they start and end): that
//! is the machine's. The tool-call bodies (TAM, ACTION, ATTP) are parsed by
//! [`crate::calls`]; this stage only dispatches to it.

use crate::event::{Diagnostic, Element, Event};
use crate::registry::{BodyKind, Registry, TagSpec};
use std::collections::HashMap;
use std::sync::Arc;

/// What a payload parser returns for one element.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Payload {
    /// The typed payload (`null` when the tag has none).
    pub value: serde_json::Value,
    /// Leniencies used and problems found, attached to the element.
    pub diagnostics: Vec<Diagnostic>,
    /// Whether the body could not be read even leniently.
    pub failed: bool,
}

impl Payload {
    /// No payload.
    pub fn none() -> Payload {
        Payload::default()
    }
}

/// Streaming state of one open element.
#[derive(Debug)]
enum BodyState {
    /// Deltas pass through unchanged.
    Plain,
}

/// The payload stage. One per parser.
#[derive(Debug)]
pub(crate) struct Stage {
    registry: Arc<Registry>,
    open: HashMap<u32, BodyState>,
}

impl Stage {
    pub(crate) fn new(registry: Arc<Registry>) -> Stage {
        Stage { registry, open: HashMap::new() }
    }

    /// Transforms machine events into caller events.
    pub(crate) fn process(&mut self, events: impl Iterator<Item = Event>, out: &mut Vec<Event>) {
        for event in events {
            match event {
                Event::Open(o) => {
                    self.open.insert(o.id, BodyState::Plain);
                    out.push(Event::Open(o));
                }
                Event::Element(mut el) => {
                    self.open.remove(&el.id);
                    let payload = match self.registry.tags().iter().find(|t| *t.name == *el.tag) {
                        Some(spec) => element_payload(spec, &el),
                        None => Payload::none(),
                    };
                    el.payload = payload.value;
                    let id = el.id;
                    let tag = el.tag.clone();
                    out.push(Event::Element(el));
                    for mut d in payload.diagnostics {
                        d.element.get_or_insert(id);
                        d.tag.get_or_insert_with(|| tag.clone());
                        out.push(Event::Diagnostic(d));
                    }
                }
                other => out.push(other),
            }
        }
    }
}

/// The payload of a completed element, by body kind.
fn element_payload(spec: &TagSpec, el: &Element) -> Payload {
    match spec.body {
        BodyKind::Tam => crate::calls::tam_payload(el),
        BodyKind::Action => crate::calls::action_payload(el),
        BodyKind::Attp => crate::calls::attp_payload(el),
        _ => Payload::none(),
    }
}
