//! What a router did: per-subscription counts, per-handler outcomes and the
//! failures. This module owns the report shapes only; the router fills
//! them.

use crate::route::failure::{HandlerFailure, HandlerId};
use crate::route::subscription::{Backpressure, SubscriptionId};
use serde::Serialize;
use std::fmt;

/// A routing report: returned by [`Router::finish`](crate::route::Router::finish)
/// (final) and [`Router::report`](crate::route::Router::report) (so far).
/// Serializes to JSON for logs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct RouteReport {
    /// Events dispatched.
    pub events: u64,
    /// Of those, completed elements.
    pub elements: u64,
    /// Every subscription, in the order they were made.
    pub subscriptions: Vec<SubscriptionReport>,
    /// Every handler, in the order they were added.
    pub handlers: Vec<HandlerReport>,
    /// Handler failures, oldest first, up to
    /// [`RouterOptions::max_failures`](crate::route::RouterOptions::max_failures).
    pub failures: Vec<HandlerFailure>,
    /// Failures past that limit (counted, not kept).
    pub failures_omitted: u64,
}

impl RouteReport {
    /// Items dropped by all drop-newest subscriptions together.
    pub fn dropped(&self) -> u64 {
        self.subscriptions.iter().map(|s| s.dropped).sum()
    }

    /// Handler errors and panics together.
    pub fn failure_count(&self) -> u64 {
        self.handlers.iter().map(|h| h.errors + h.panics).sum()
    }

    /// Nothing dropped, nothing undelivered, no handler failed or was
    /// aborted.
    pub fn is_clean(&self) -> bool {
        self.dropped() == 0
            && self.failure_count() == 0
            && self.subscriptions.iter().all(|s| s.undelivered == 0)
            && self.handlers.iter().all(|h| !h.aborted)
    }

    /// One subscription's line.
    pub fn subscription(&self, id: SubscriptionId) -> Option<&SubscriptionReport> {
        self.subscriptions.iter().find(|s| s.id == id)
    }

    /// One handler's line.
    pub fn handler(&self, id: HandlerId) -> Option<&HandlerReport> {
        self.handlers.iter().find(|h| h.id == id)
    }
}

impl fmt::Display for RouteReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "routed {} events ({} elements)", self.events, self.elements)?;
        for s in &self.subscriptions {
            write!(f, "  {} {}: delivered {}", s.id, s.name.as_deref().unwrap_or(&s.topic), s.delivered)?;
            if s.dropped > 0 {
                write!(f, ", dropped {}", s.dropped)?;
            }
            if s.undelivered > 0 {
                write!(f, ", undelivered {} (receiver gone)", s.undelivered)?;
            }
            writeln!(f)?;
        }
        for h in &self.handlers {
            write!(f, "  {} {}: {} ok, {} errors, {} panics", h.id, h.label, h.succeeded, h.errors, h.panics)?;
            if h.aborted {
                write!(f, ", aborted with {} unhandled", h.unhandled)?;
            }
            writeln!(f)?;
        }
        for x in &self.failures {
            writeln!(f, "  failure: {x}")?;
        }
        if self.failures_omitted > 0 {
            writeln!(f, "  ... {} more failures", self.failures_omitted)?;
        }
        Ok(())
    }
}

/// One subscription's counts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct SubscriptionReport {
    /// The subscription.
    pub id: SubscriptionId,
    /// Its name, if given.
    pub name: Option<String>,
    /// Its topic (`element:tool_call`, `delta:content`, `element:*`, ...).
    pub topic: String,
    /// Its backpressure policy.
    pub policy: Backpressure,
    /// Its channel capacity.
    pub capacity: usize,
    /// Items placed in its channel.
    pub delivered: u64,
    /// Items dropped because the channel was full (drop-newest only).
    pub dropped: u64,
    /// Items not delivered because the receiver had been dropped.
    pub undelivered: u64,
    /// The handler consuming it, if any.
    pub handler: Option<HandlerId>,
}

/// One handler's outcome.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct HandlerReport {
    /// The handler.
    pub id: HandlerId,
    /// Its label.
    pub label: String,
    /// The subscription it consumes.
    pub subscription: SubscriptionId,
    /// Items taken from its channel.
    pub received: u64,
    /// Calls that returned `()` or `Ok`.
    pub succeeded: u64,
    /// Calls that returned `Err`.
    pub errors: u64,
    /// Calls that panicked.
    pub panics: u64,
    /// Whether it was aborted at the drain timeout.
    pub aborted: bool,
    /// When aborted: items delivered to it that it never finished.
    pub unhandled: u64,
}
