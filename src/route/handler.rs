//! Handlers: async functions run on their own tokio task, one per handler,
//! each consuming its own subscription. This module owns the handler loop
//! (one call per item, in order, with errors and panics caught) and the
//! hub that keeps failure records and forwards them to failure
//! subscribers; it must not touch dispatch or the parser.

use crate::route::failure::{FailureKind, HandlerFailure, HandlerId};
use crate::route::subscription::{Backpressure, Slot, Subscription};
use crate::route::topic::{NoPlace, Routable};
use futures::FutureExt;
use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// What a handler's future may return: `()` (it cannot fail) or any
/// `Result<T, E>` whose error converts into `Box<dyn Error + Send + Sync>`
/// (`anyhow::Error`, `std::io::Error`, `String`, `&'static str`, your own
/// error types). An `Err` is reported as a [`HandlerFailure`] of kind
/// [`FailureKind::Error`]; the handler keeps receiving.
pub trait HandlerOutcome {
    /// `Ok` when the handler succeeded, else the error message with its
    /// sources joined by `": "`.
    ///
    /// # Errors
    ///
    /// The handler's error, as text.
    fn into_result(self) -> Result<(), String>;
}

impl HandlerOutcome for () {
    fn into_result(self) -> Result<(), String> {
        Ok(())
    }
}

impl<T, E> HandlerOutcome for Result<T, E>
where
    E: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    fn into_result(self) -> Result<(), String> {
        match self {
            Ok(_) => Ok(()),
            Err(e) => {
                let e: Box<dyn std::error::Error + Send + Sync> = e.into();
                let message = crate::chain::error_chain(&*e);
                Err(message)
            }
        }
    }
}

/// Counters of one handler, shared by its task and the router.
#[derive(Debug, Default)]
pub(crate) struct HandlerStats {
    pub(crate) received: AtomicU64,
    pub(crate) succeeded: AtomicU64,
    pub(crate) errors: AtomicU64,
    pub(crate) panics: AtomicU64,
}

/// Failure records, bounded, and the failure subscriptions.
#[derive(Debug)]
pub(crate) struct FailureHub {
    state: Mutex<HubState>,
}

#[derive(Debug)]
struct HubState {
    log: Vec<HandlerFailure>,
    omitted: u64,
    limit: usize,
    slots: Vec<Arc<Slot>>,
}

impl FailureHub {
    pub(crate) fn new(limit: usize) -> FailureHub {
        FailureHub { state: Mutex::new(HubState { log: Vec::new(), omitted: 0, limit, slots: Vec::new() }) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HubState> {
        // A panic while holding this lock cannot leave the log inconsistent
        // (pushes and counters only), so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn add_slot(&self, slot: Slot) {
        self.lock().slots.push(Arc::new(slot));
    }

    /// Drops the failure senders: failure subscriptions end once drained.
    pub(crate) fn close(&self) {
        self.lock().slots.clear();
    }

    /// The recorded failures and how many were left out past the limit.
    pub(crate) fn log(&self) -> (Vec<HandlerFailure>, u64) {
        let state = self.lock();
        (state.log.clone(), state.omitted)
    }

    /// Records a failure and, when `publish`, sends it to the failure
    /// subscriptions (each per its policy).
    async fn record(&self, failure: HandlerFailure, publish: bool) {
        let slots = {
            let mut state = self.lock();
            if state.log.len() < state.limit {
                state.log.push(failure.clone());
            } else {
                state.omitted += 1;
            }
            if publish { state.slots.clone() } else { Vec::new() }
        };
        for slot in slots {
            let permit = match slot.policy {
                Backpressure::Wait => slot.sender.reserve().await,
                _ => slot.sender.try_reserve(),
            };
            match permit {
                Ok(p) => {
                    if p.send_failure(&failure) {
                        slot.stats.delivered();
                    }
                }
                Err(NoPlace::Full) => {
                    if slot.stats.dropped() {
                        tracing::warn!(subscription = %slot.label(), "failure subscription full; dropping failures");
                    }
                }
                Err(NoPlace::Closed) => {
                    slot.stats.undelivered();
                }
            }
        }
    }
}

/// Everything a handler task needs besides its function.
pub(crate) struct HandlerContext {
    pub(crate) id: HandlerId,
    pub(crate) label: String,
    pub(crate) stats: Arc<HandlerStats>,
    pub(crate) hub: Arc<FailureHub>,
    /// Whether failures of this handler go to failure subscriptions (not
    /// for handlers of failures themselves: that could feed a loop).
    pub(crate) publish: bool,
}

/// The handler task: calls `f` once per item, in order, until the channel
/// ends. Errors and panics are recorded and the loop goes on with the next
/// item; this task itself never panics.
pub(crate) async fn run_handler<T, F, Fut, R>(mut sub: Subscription<T>, mut f: F, cx: HandlerContext)
where
    T: Routable,
    F: FnMut(T) -> Fut + Send + 'static,
    Fut: Future<Output = R> + Send + 'static,
    R: HandlerOutcome + 'static,
{
    while let Some(item) = sub.rx.recv().await {
        cx.stats.received.fetch_add(1, Ordering::Relaxed);
        let origin = item.origin();
        // The call itself runs inside the guarded future, so a panic in the
        // closure body (before its future exists) is caught as well. The
        // closure's own state may be left half-updated by a panic; that is
        // the documented price of keeping the handler alive.
        let outcome = AssertUnwindSafe(async { f(item).await.into_result() }).catch_unwind().await;
        let (kind, message) = match outcome {
            Ok(Ok(())) => {
                cx.stats.succeeded.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            Ok(Err(message)) => {
                cx.stats.errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(handler = %cx.label, element = ?origin.element, tag = ?origin.tag.as_deref(), error = %message, "route handler returned an error");
                (FailureKind::Error, message)
            }
            Err(panic) => {
                cx.stats.panics.fetch_add(1, Ordering::Relaxed);
                let message = panic_message(panic.as_ref());
                tracing::error!(handler = %cx.label, element = ?origin.element, tag = ?origin.tag.as_deref(), panic = %message, "route handler panicked; it keeps receiving");
                (FailureKind::Panic, message)
            }
        };
        let failure = HandlerFailure {
            handler: cx.id,
            label: cx.label.clone(),
            kind,
            message,
            element: origin.element,
            tag: origin.tag,
        };
        cx.hub.record(failure, cx.publish).await;
    }
}

/// The text of a panic payload (`panic!("...")` gives `&str` or `String`).
pub(crate) fn panic_message(panic: &(dyn Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic with a non-string payload".to_string()
    }
}
