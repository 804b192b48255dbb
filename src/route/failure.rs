//! Failure records: which handler failed, how, on which element. Plain
//! data that the handler loop makes, the failure topic routes and reports
//! count; this module must not run handlers or route anything.

use crate::event::TagName;
use serde::Serialize;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

/// Identifies a handler in reports. Unique within the process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct HandlerId(u64);

impl HandlerId {
    pub(crate) fn next() -> HandlerId {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        HandlerId(NEXT.fetch_add(1, Ordering::Relaxed))
    }

    /// The number behind the id.
    pub fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for HandlerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "handler#{}", self.0)
    }
}

/// How a handler call went wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum FailureKind {
    /// The handler returned an error.
    Error,
    /// The handler panicked (while being called or while its future ran).
    Panic,
}

/// One failed handler call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct HandlerFailure {
    /// The handler.
    pub handler: HandlerId,
    /// Its label (the subscription's name, else its topic).
    pub label: String,
    /// Error or panic.
    pub kind: FailureKind,
    /// The error message, or the panic message.
    pub message: String,
    /// The element the failed call was about, when known.
    pub element: Option<u32>,
    /// That element's canonical tag.
    pub tag: Option<TagName>,
}

impl fmt::Display for HandlerFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.kind {
            FailureKind::Error => "failed",
            FailureKind::Panic => "panicked",
        };
        write!(f, "{} ({}) {what}", self.handler, self.label)?;
        if let Some(tag) = &self.tag {
            write!(f, " on {tag}")?;
        }
        if let Some(id) = self.element {
            write!(f, " #{id}")?;
        }
        write!(f, ": {}", self.message)
    }
}
