//! Finding the calls of a response while it streams: [`CallCollector`]
//! watches parser events and hands out each completed call element as a
//! [`ToolCall`] with a call id, the moment its element event arrives.
//!
//! This module is synchronous and owns no I/O; it must not run anything.

use crate::Registry;
use crate::calls::{CallFormat, ToolCall, call_of};
use crate::event::{Event, RepairKind};
use std::sync::Arc;

/// Turns the events of one or more responses into numbered calls.
///
/// ```
/// use spindle::tools::collect::CallCollector;
/// use spindle::{parse, Registry};
///
/// let registry = Registry::profile("tam").unwrap();
/// let events = parse(registry.clone(), "Ok.\n<|[REQUEST_TOOL]|>\ncommand:»»»Look«««\n<|[END_TOOL]|>".as_bytes());
/// let mut collector = CallCollector::new(registry.into());
/// let calls: Vec<_> = events.iter().filter_map(|e| collector.observe(e)).collect();
/// assert_eq!(calls[0].0, "call_1");
/// assert_eq!(calls[0].1.steps[0].tool_id, "Look");
/// ```
#[derive(Debug)]
pub struct CallCollector {
    registry: Arc<Registry>,
    next: u64,
    /// Elements closed by the end of input.
    cut: Vec<u32>,
    prefix: String,
}

impl CallCollector {
    /// A collector numbering calls `call_1`, `call_2`, ...
    pub fn new(registry: Arc<Registry>) -> CallCollector {
        CallCollector::with_prefix(registry, "call_")
    }

    /// A collector whose ids are `prefix` and a number (the agent loop
    /// uses one prefix per turn).
    pub fn with_prefix(registry: Arc<Registry>, prefix: &str) -> CallCollector {
        CallCollector { registry, next: 0, cut: Vec::new(), prefix: prefix.to_string() }
    }

    /// Starts a new response with the same numbering.
    pub fn reset(&mut self, prefix: &str) {
        self.cut.clear();
        prefix.clone_into(&mut self.prefix);
    }

    /// Notes one event; returns the call when it completes one. A Filament
    /// `<tool_call>` cut off by the end of the output is marked
    /// `not_runnable: cut_off` like a cut-off TAM or ACTION block.
    pub fn observe(&mut self, event: &Event) -> Option<(String, ToolCall)> {
        match event {
            Event::Repair(r) if r.kind == RepairKind::ClosedAtEof => {
                if let Some(id) = r.element {
                    self.cut.push(id);
                }
                None
            }
            Event::Element(el) => {
                let mut call = call_of(&self.registry, el)?;
                if call.format == CallFormat::Filament && self.cut.contains(&el.id) {
                    call.not_runnable = Some("cut_off".into());
                    for s in &mut call.steps {
                        s.not_runnable = Some("cut_off".into());
                    }
                }
                self.next += 1;
                Some((format!("{}{}", self.prefix, self.next), call))
            }
            _ => None,
        }
    }
}
