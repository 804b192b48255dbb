//! Finding the calls of a response while it streams: [`CallCollector`]
//! watches parser events and hands out each completed call element as a
//! [`ToolCall`] with a call id, the moment its element event arrives.
//!
//! This module is synchronous and owns no I/O; it must not run anything.

use crate::Registry;
use crate::calls::{CallFormat, ToolCall, call_of};
use crate::event::{DiagnosticCode, Event, RepairKind};
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
    /// Call elements inside an open Markdown code block: examples the
    /// model shows (`call_in_code_block`), not calls.
    examples: Vec<u32>,
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
        CallCollector { registry, next: 0, cut: Vec::new(), examples: Vec::new(), prefix: prefix.to_string() }
    }

    /// Starts a new response with the same numbering.
    pub fn reset(&mut self, prefix: &str) {
        self.cut.clear();
        self.examples.clear();
        prefix.clone_into(&mut self.prefix);
    }

    /// Notes one event; returns the call when it completes one. A Filament
    /// `<tool_call>` cut off by the end of the output is marked
    /// `not_runnable: cut_off` like a cut-off TAM or ACTION block. A call
    /// inside an open Markdown code block is an example the model shows
    /// (a `call_in_code_block` diagnostic): no call, as the proxy does not
    /// send it either.
    pub fn observe(&mut self, event: &Event) -> Option<(String, ToolCall)> {
        match event {
            Event::Repair(r) if r.kind == RepairKind::ClosedAtEof => {
                if let Some(id) = r.element {
                    self.cut.push(id);
                }
                None
            }
            Event::Diagnostic(d) if d.code == DiagnosticCode::CallInCodeBlock => {
                if let Some(id) = d.element {
                    self.examples.push(id);
                }
                None
            }
            Event::Element(el) if self.examples.contains(&el.id) => {
                self.examples.retain(|&id| id != el.id);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A call block shown inside a Markdown code block is an example: no
    /// call to run; the same block outside one is a call.
    #[test]
    fn an_example_in_a_code_block_is_no_call() {
        let registry = Registry::profile("tam").expect("built-in");
        let block = "<|[REQUEST_TOOL]|>\ncommand:»»»Look«««\n<|[END_TOOL]|>\n";
        let calls = |text: &str| {
            let events = crate::parse(registry.clone(), text.as_bytes());
            let mut collector = CallCollector::new(registry.clone().into());
            events.iter().filter_map(|e| collector.observe(e)).count()
        };
        assert_eq!(calls(&format!("Like this:\n```\nfirst line\n{block}```\nDone.")), 0);
        assert_eq!(calls(&format!("Now:\n{block}")), 1);
        // A fence around the block alone is the model's wrapping of a call.
        assert_eq!(calls(&format!("Now:\n```\n{block}```\n")), 1);
    }
}
