//! The receiving end of a route: [`Subscription`], its options and its
//! counters. This module owns the per-subscription bookkeeping shared
//! between the router (which counts what it delivered or dropped) and the
//! receiver (which can read those counts); it must not send anything.

use crate::route::topic::{AnySender, Filter};
use futures::Stream;
use serde::Serialize;
use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

/// What dispatch does when a subscription's channel is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Backpressure {
    /// Dispatch waits until the subscriber makes room: nothing is lost, and
    /// a slow subscriber slows the stream (the default).
    #[default]
    Wait,
    /// The item that does not fit is dropped and counted
    /// ([`Subscription::dropped`], [`SubscriptionReport::dropped`]); the
    /// stream never waits for this subscriber.
    ///
    /// [`SubscriptionReport::dropped`]: crate::route::SubscriptionReport::dropped
    DropNewest,
}

/// Identifies a subscription in reports. Unique within the process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct SubscriptionId(pub(crate) u64);

impl SubscriptionId {
    pub(crate) fn next() -> SubscriptionId {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        SubscriptionId(NEXT.fetch_add(1, Ordering::Relaxed))
    }

    /// The number behind the id.
    pub fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for SubscriptionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sub#{}", self.0)
    }
}

/// Per-subscription settings; unset fields take the router's defaults
/// ([`RouterOptions`](crate::route::RouterOptions)).
///
/// ```
/// use spindle::route::{Backpressure, SubscribeOptions};
///
/// let opts = SubscribeOptions::new().capacity(4).drop_newest().name("ui preview");
/// assert_eq!(opts.get_policy(), Some(Backpressure::DropNewest));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SubscribeOptions {
    capacity: Option<usize>,
    policy: Option<Backpressure>,
    name: Option<String>,
}

impl SubscribeOptions {
    /// Router defaults for everything.
    pub fn new() -> SubscribeOptions {
        SubscribeOptions::default()
    }

    /// Channel capacity: how many items may wait for the subscriber.
    /// `0` is taken as `1` (a channel needs room for one item).
    pub fn capacity(mut self, capacity: usize) -> SubscribeOptions {
        self.capacity = Some(capacity.max(1));
        self
    }

    /// The backpressure policy.
    pub fn policy(mut self, policy: Backpressure) -> SubscribeOptions {
        self.policy = Some(policy);
        self
    }

    /// Shorthand for `policy(Backpressure::Wait)`.
    pub fn wait(self) -> SubscribeOptions {
        self.policy(Backpressure::Wait)
    }

    /// Shorthand for `policy(Backpressure::DropNewest)`.
    pub fn drop_newest(self) -> SubscribeOptions {
        self.policy(Backpressure::DropNewest)
    }

    /// A name for reports and logs (a handler on this subscription is
    /// reported under it too).
    pub fn name(mut self, name: impl Into<String>) -> SubscribeOptions {
        self.name = Some(name.into());
        self
    }

    /// The capacity set, if any.
    pub fn get_capacity(&self) -> Option<usize> {
        self.capacity
    }

    /// The policy set, if any.
    pub fn get_policy(&self) -> Option<Backpressure> {
        self.policy
    }

    /// The name set, if any.
    pub fn get_name(&self) -> Option<&str> {
        self.name.as_deref()
    }
}

/// Counters of one subscription, shared by router and receiver.
#[derive(Debug, Default)]
pub(crate) struct SlotStats {
    delivered: AtomicU64,
    dropped: AtomicU64,
    undelivered: AtomicU64,
    closed: AtomicBool,
}

impl SlotStats {
    pub(crate) fn delivered(&self) {
        self.delivered.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a drop; true for the first one (worth a warning).
    pub(crate) fn dropped(&self) -> bool {
        self.dropped.fetch_add(1, Ordering::Relaxed) == 0
    }

    /// Counts an item whose receiver is gone; true the first time.
    pub(crate) fn undelivered(&self) -> bool {
        self.undelivered.fetch_add(1, Ordering::Relaxed);
        !self.closed.swap(true, Ordering::Relaxed)
    }

    pub(crate) fn snapshot(&self) -> SubscriptionStats {
        SubscriptionStats {
            delivered: self.delivered.load(Ordering::Relaxed),
            dropped: self.dropped.load(Ordering::Relaxed),
            undelivered: self.undelivered.load(Ordering::Relaxed),
        }
    }
}

/// A subscription's counters at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[non_exhaustive]
pub struct SubscriptionStats {
    /// Items placed in the channel.
    pub delivered: u64,
    /// Items dropped because the channel was full
    /// ([`Backpressure::DropNewest`] only).
    pub dropped: u64,
    /// Items not delivered because the receiver had been dropped.
    pub undelivered: u64,
}

/// The router's end of a subscription.
#[derive(Debug)]
pub(crate) struct Slot {
    pub(crate) id: SubscriptionId,
    pub(crate) filter: Filter,
    pub(crate) policy: Backpressure,
    pub(crate) sender: AnySender,
    pub(crate) stats: Arc<SlotStats>,
    pub(crate) name: Option<String>,
}

impl Slot {
    /// A label for logs: the name, else the id and topic.
    pub(crate) fn label(&self) -> String {
        match &self.name {
            Some(n) => n.clone(),
            None => format!("{} ({})", self.id, self.filter),
        }
    }
}

/// The receiving end of a subscription: a bounded channel of `T`.
///
/// Read it with [`recv`](Subscription::recv), use it as a
/// [`Stream`](futures::Stream), or take the plain
/// [`mpsc::Receiver`](Subscription::into_receiver) or
/// [`ReceiverStream`](Subscription::into_stream). It ends (`None`) once the
/// router is finished or dropped and every queued item has been read.
///
/// Dropping a subscription is allowed at any time: the router notices,
/// stops sending to it (never waiting on it again) and counts the items it
/// could not deliver as `undelivered`.
///
/// # Cancel safety
///
/// [`recv`](Subscription::recv) and the [`Stream`] implementation are
/// cancel safe: if the future is dropped (for instance as a losing branch of
/// `tokio::select!`), no item was taken from the channel.
pub struct Subscription<T> {
    pub(crate) id: SubscriptionId,
    pub(crate) filter: Filter,
    pub(crate) name: Option<String>,
    pub(crate) rx: mpsc::Receiver<T>,
    pub(crate) stats: Arc<SlotStats>,
}

impl<T> fmt::Debug for Subscription<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Subscription")
            .field("id", &self.id)
            .field("topic", &self.filter.to_string())
            .field("name", &self.name)
            .field("stats", &self.stats.snapshot())
            .finish()
    }
}

impl<T> Subscription<T> {
    /// This subscription's id (as found in reports).
    pub fn id(&self) -> SubscriptionId {
        self.id
    }

    /// The topic, as written in reports (`element:tool_call`, `delta:*`).
    pub fn topic(&self) -> String {
        self.filter.to_string()
    }

    /// Receives the next item; `None` once the router is finished and the
    /// channel is drained.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: if the future is dropped before it completes, no item
    /// was received and the next call gets it.
    pub async fn recv(&mut self) -> Option<T> {
        self.rx.recv().await
    }

    /// Receives an item if one is queued, without waiting.
    ///
    /// # Errors
    ///
    /// [`TryRecvError::Empty`](mpsc::error::TryRecvError::Empty) when nothing
    /// is queued, [`TryRecvError::Disconnected`](mpsc::error::TryRecvError::Disconnected)
    /// when the router is finished and the channel drained.
    pub fn try_recv(&mut self) -> Result<T, mpsc::error::TryRecvError> {
        self.rx.try_recv()
    }

    /// Counters so far (delivered, dropped, undelivered).
    pub fn stats(&self) -> SubscriptionStats {
        self.stats.snapshot()
    }

    /// Items dropped so far because the channel was full.
    pub fn dropped(&self) -> u64 {
        self.stats.snapshot().dropped
    }

    /// The underlying tokio receiver (counters stay readable through the
    /// router's report).
    pub fn into_receiver(self) -> mpsc::Receiver<T> {
        self.rx
    }

    /// A [`ReceiverStream`] over the channel, for `tokio-stream` combinators.
    pub fn into_stream(self) -> ReceiverStream<T> {
        ReceiverStream::new(self.rx)
    }
}

impl<T> Stream for Subscription<T> {
    type Item = T;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        self.rx.poll_recv(cx)
    }
}
