//! Async routing: completed elements (and, for subscribers that ask, text
//! deltas, repairs, diagnostics, comments) handed to tokio channels and
//! handler tasks the moment the parser emits them (DESIGN §7, spec 003 §4).
//!
//! This module owns the [`Router`]: subscriptions, handler tasks,
//! backpressure, failure isolation and the routing report. It must not
//! change events (structure is the machine's, payloads the payload stage's)
//! and it adds no parsing of its own: it drives a [`Parser`] and forwards
//! what comes out.
//!
//! # Overview
//!
//! A [`Router`] is set up once per response, then fed:
//!
//! 1. **Subscribe** to what you want. [`Router::subscribe`] gives a
//!    [`Subscription`] of the completed elements of one canonical tag
//!    (`Arc<Element>`), [`Router::subscribe_all`] the catch-all of every
//!    element, [`Router::subscribe_deltas`] the text of a streaming tag while
//!    it arrives; [`Router::subscribe_to`] takes any [`Topic`] (repairs,
//!    diagnostics, comments, every event, handler failures) with
//!    [`SubscribeOptions`].
//! 2. **Or add handlers**: [`Router::on`]`("tool_call", |el| async move { .. })`
//!    runs an async function for each element of a tag, on its own tokio
//!    task; [`Router::handle`] attaches a handler to any subscription.
//! 3. **Feed** it: [`Router::run`] drives a [`Parser`] from a byte stream,
//!    [`Router::run_reader`] from an [`AsyncRead`](tokio::io::AsyncRead);
//!    or do it yourself with [`Router::feed`] / [`Router::end`] per chunk,
//!    or [`Router::dispatch`] per event.
//! 4. **Finish**: [`Router::finish`] closes the channels, waits for the
//!    handlers to drain and returns a [`RouteReport`] (`run` does this for
//!    you).
//!
//! Every event is dispatched as soon as the parser emits it, so an element
//! reaches its handler while the model is still writing the rest of the
//! response.
//!
//! # Example: handlers over a stream
//!
//! ```
//! use futures::stream;
//! use spindle::route::Router;
//! use spindle::{Parser, Registry};
//! use std::sync::{Arc, Mutex};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let calls = Arc::new(Mutex::new(Vec::new()));
//! let mut router = Router::new();
//! let seen = calls.clone();
//! router.on("tool_call", move |el| {
//!     let seen = seen.clone();
//!     async move {
//!         // Run the tool here; an error is reported, never fatal.
//!         seen.lock().unwrap().push(el.text.trim().to_string());
//!         Ok::<_, std::io::Error>(())
//!     }
//! });
//! router.on("content", |el| async move { println!("show: {}", el.text) });
//!
//! let chunks = [
//!     "<thought>Look it up.</thought><content>Check",
//!     "ing the weather.</content><tool_call>{\"name\": \"w\"}",
//!     "</tool_call>",
//! ];
//! let input = stream::iter(chunks.map(|c| Ok::<_, std::io::Error>(c.as_bytes())));
//! let report = router.run(Parser::new(Registry::filament()), input).await?;
//!
//! assert_eq!(*calls.lock().unwrap(), [r#"{"name": "w"}"#]);
//! assert!(report.routing.is_clean());
//! # Ok(())
//! # }
//! ```
//!
//! # Example: subscriptions, streams and deltas
//!
//! A [`Subscription`] is a bounded receiver; it is also a
//! [`Stream`], so `tokio-stream` and `futures` combinators
//! apply. Delta subscriptions stream the text of `thought` and `content` as
//! it arrives (to a chat UI, say) while element subscriptions wait for the
//! whole element.
//!
//! ```
//! use futures::StreamExt;
//! use spindle::route::Router;
//! use spindle::{Parser, Registry};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let mut router = Router::new();
//! let mut text = router.subscribe_deltas("content");
//! let all = router.subscribe_all();
//! let ui = tokio::spawn(async move {
//!     let mut shown = String::new();
//!     while let Some(delta) = text.recv().await {
//!         shown.push_str(&delta.text);
//!     }
//!     shown
//! });
//! let log = tokio::spawn(all.map(|el| el.tag.to_string()).collect::<Vec<_>>());
//!
//! let mut parser = Parser::new(Registry::filament());
//! for chunk in ["<thought>hm</thought>\n<content>Hel", "lo!</content>"] {
//!     router.feed(&mut parser, chunk.as_bytes()).await;
//! }
//! router.end(parser).await;
//! let report = router.finish().await;
//!
//! assert_eq!(ui.await.unwrap(), "Hello!");
//! assert_eq!(log.await.unwrap(), ["thought", "content"]);
//! assert_eq!(report.elements, 2);
//! # }
//! ```
//!
//! # Backpressure
//!
//! Every subscription has a bounded channel
//! ([`SubscribeOptions::capacity`], default
//! [`RouterOptions::capacity`]) and a [`Backpressure`] policy:
//!
//! * [`Backpressure::Wait`] (the default): when the channel is full,
//!   dispatch waits for room. Nothing is lost; a slow consumer slows the
//!   whole stream (and, through [`Router::run`], stops reading the input),
//!   which is the right thing for state updates and tool calls. A `Wait`
//!   subscription must be read (or dropped), or the stream stalls.
//! * [`Backpressure::DropNewest`]: when the channel is full, the item that
//!   does not fit is dropped and counted (in [`Subscription::dropped`], in
//!   [`Router::report`] and in the final [`RouteReport`], and logged once
//!   per subscription). Use it for previews and telemetry that must never
//!   hold up the response.
//!
//! A dropped [`Subscription`] is noticed and skipped; what it would have
//! received is counted as `undelivered`.
//!
//! # Handlers, errors and panics
//!
//! A handler is an `FnMut(T) -> impl Future<Output = R>` where `R` is `()`
//! or any `Result<_, E>` with `E: Into<Box<dyn Error + Send + Sync>>`
//! (see [`HandlerOutcome`]). Each handler runs on its own tokio task and
//! consumes its own channel, one item at a time and in order, so a slow
//! handler only slows what waits on it. For concurrency inside one handler,
//! spawn from it.
//!
//! A handler call that returns `Err` or panics is caught, logged through
//! `tracing` (`warn` for errors, `error` for panics), recorded in the
//! report and sent to [`Topic::failures`] subscribers. It never stops the
//! stream or the other handlers, and **the handler stays subscribed**: the
//! next item goes to the next call of the same function, so under `Wait`
//! nothing after a panic is lost. (State the closure captured may be left
//! half-updated by a panic; keep handler state in types that tolerate it.)
//! The default panic hook still prints the panic to stderr.
//!
//! # Ordering
//!
//! One subscription receives its items in the order the parser emitted
//! them. Different subscriptions are different channels, so there is no
//! order *between* them; subscribe to [`Topic::events`] for one totally
//! ordered stream of everything.
//!
//! # Closing
//!
//! [`Router::finish`] drops the senders (subscriptions end after their
//! queued items), waits for every handler to drain its channel, then closes
//! failure subscriptions and waits for their handlers, and returns the
//! [`RouteReport`]. With [`RouterOptions::drain_timeout`], handlers still
//! busy at the deadline are aborted and reported. Dropping a router without
//! finishing also closes the channels (failure subscriptions at once); its
//! handlers then drain in the background, unreported.
//!
//! # Cancel safety
//!
//! [`Router::dispatch`] is all-or-nothing: it first reserves a place in
//! every matching channel (waiting as the policies say), then sends to all
//! of them without waiting. Cancelled before the end, it has delivered the
//! event to no subscription. [`Router::feed`] and [`Router::end`] keep the
//! events they have not dispatched yet and dispatch them first on the next
//! call (or in [`Router::finish`]), so cancelling them loses nothing. Each
//! public async fn documents its own cancel safety.
//!
//! # Runtime
//!
//! Handler tasks are spawned on the current tokio runtime (or the one given
//! with [`RouterOptions::runtime`]); [`Router::on`] and [`Router::handle`]
//! panic if neither exists, like [`tokio::spawn`]. Channels and dispatch
//! work on any executor.

mod failure;
mod handler;
mod report;
mod run;
mod subscription;
mod topic;

pub use failure::{FailureKind, HandlerFailure, HandlerId};
pub use handler::HandlerOutcome;
pub use report::{HandlerReport, RouteReport, SubscriptionReport};
pub use run::{RunError, RunReport};
pub use subscription::{Backpressure, SubscribeOptions, Subscription, SubscriptionId, SubscriptionStats};
pub use topic::{Routable, Topic};

use crate::event::{Delta, Element, Event, TagName};
use crate::parser::Parser;
use crate::registry::Registry;
use futures::{Stream, StreamExt};
use handler::{FailureHub, HandlerContext, HandlerStats};
use std::borrow::Borrow;
use std::collections::VecDeque;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use subscription::{Slot, SlotStats};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use topic::{AnyPermit, Filter, NoPlace};

/// Router-wide settings and per-subscription defaults.
///
/// ```
/// use spindle::route::{Backpressure, RouterOptions};
/// use spindle::Registry;
/// use std::time::Duration;
///
/// let options = RouterOptions::new()
///     .registry(Registry::filament())
///     .capacity(16)
///     .policy(Backpressure::Wait)
///     .drain_timeout(Duration::from_secs(5));
/// assert_eq!(options.get_capacity(), 16);
/// ```
#[derive(Debug, Clone)]
pub struct RouterOptions {
    registry: Option<Arc<Registry>>,
    capacity: usize,
    policy: Backpressure,
    drain_timeout: Option<Duration>,
    max_failures: usize,
    read_chunk: usize,
    runtime: Option<tokio::runtime::Handle>,
}

impl Default for RouterOptions {
    fn default() -> RouterOptions {
        RouterOptions {
            registry: None,
            capacity: 64,
            policy: Backpressure::Wait,
            drain_timeout: None,
            max_failures: 1000,
            read_chunk: 8 * 1024,
            runtime: None,
        }
    }
}

impl RouterOptions {
    /// The defaults: capacity 64, [`Backpressure::Wait`], no drain timeout,
    /// up to 1000 failures kept, 8 KiB reads, no registry.
    pub fn new() -> RouterOptions {
        RouterOptions::default()
    }

    /// Resolve subscription tag names through this registry: aliases
    /// (`think`, `UpdateVariable`) become canonical names, and a name the
    /// registry does not know, or a delta subscription to a tag that does
    /// not stream, is warned about through `tracing`. Without a registry,
    /// names are matched against canonical tags as given (ignoring ASCII
    /// case).
    pub fn registry(self, registry: impl Into<Arc<Registry>>) -> RouterOptions {
        RouterOptions { registry: Some(registry.into()), ..self }
    }

    /// Default channel capacity for subscriptions (`0` is taken as `1`).
    pub fn capacity(self, capacity: usize) -> RouterOptions {
        RouterOptions { capacity: capacity.max(1), ..self }
    }

    /// Default backpressure policy for subscriptions.
    pub fn policy(self, policy: Backpressure) -> RouterOptions {
        RouterOptions { policy, ..self }
    }

    /// How long [`Router::finish`] waits for handlers to drain before it
    /// aborts them (default: no limit).
    pub fn drain_timeout(self, timeout: Duration) -> RouterOptions {
        RouterOptions { drain_timeout: Some(timeout), ..self }
    }

    /// How many handler failures the report keeps (the rest are counted).
    pub fn max_failures(self, max: usize) -> RouterOptions {
        RouterOptions { max_failures: max, ..self }
    }

    /// Read size of [`Router::run_reader`] (`0` is taken as `1`).
    pub fn read_chunk(self, bytes: usize) -> RouterOptions {
        RouterOptions { read_chunk: bytes.max(1), ..self }
    }

    /// Spawn handler tasks on this runtime instead of the current one.
    pub fn runtime(self, handle: tokio::runtime::Handle) -> RouterOptions {
        RouterOptions { runtime: Some(handle), ..self }
    }

    /// The default capacity.
    pub fn get_capacity(&self) -> usize {
        self.capacity
    }

    /// The default policy.
    pub fn get_policy(&self) -> Backpressure {
        self.policy
    }
}

/// Routes parser events to subscriptions and handler tasks. See the
/// [module documentation](self) for a guide.
///
/// Set up subscriptions and handlers with `&mut self` (before or between
/// dispatches), feed it, then [`finish`](Router::finish) it.
#[derive(Debug)]
pub struct Router {
    options: RouterOptions,
    core: Core,
    /// Events a parser produced that are not dispatched yet (a cancelled
    /// [`Router::feed`] leaves them here).
    pending: VecDeque<Event>,
    hub: Arc<FailureHub>,
    records: Vec<SubRecord>,
    handlers: Vec<HandlerEntry>,
}

/// The dispatching part, apart from `pending` so both can be borrowed.
#[derive(Debug, Default)]
struct Core {
    slots: Vec<Slot>,
    events: u64,
    elements: u64,
}

/// What the report says about one subscription.
#[derive(Debug)]
struct SubRecord {
    id: SubscriptionId,
    name: Option<String>,
    topic: String,
    policy: Backpressure,
    capacity: usize,
    stats: Arc<SlotStats>,
    handler: Option<HandlerId>,
}

#[derive(Debug)]
struct HandlerEntry {
    id: HandlerId,
    label: String,
    subscription: SubscriptionId,
    stats: Arc<HandlerStats>,
    join: Option<JoinHandle<()>>,
    on_failures: bool,
    aborted: bool,
}

impl Default for Router {
    fn default() -> Router {
        Router::new()
    }
}

impl Router {
    /// A router with default options.
    pub fn new() -> Router {
        Router::with_options(RouterOptions::default())
    }

    /// A router with explicit options.
    pub fn with_options(options: RouterOptions) -> Router {
        let hub = Arc::new(FailureHub::new(options.max_failures));
        Router {
            options,
            core: Core::default(),
            pending: VecDeque::new(),
            hub,
            records: Vec::new(),
            handlers: Vec::new(),
        }
    }

    /// A router that resolves tag names through `registry` (see
    /// [`RouterOptions::registry`]).
    ///
    /// ```
    /// use spindle::route::Router;
    /// use spindle::Registry;
    ///
    /// let mut router = Router::for_registry(Registry::filament());
    /// let sub = router.subscribe("think"); // an alias of thought
    /// assert_eq!(sub.topic(), "element:thought");
    /// ```
    pub fn for_registry(registry: impl Into<Arc<Registry>>) -> Router {
        Router::with_options(RouterOptions::new().registry(registry))
    }

    /// The options this router was built with.
    pub fn options(&self) -> &RouterOptions {
        &self.options
    }

    // ----- subscriptions -------------------------------------------------

    /// Completed elements of one tag, with the router's default capacity
    /// and policy.
    pub fn subscribe(&mut self, tag: &str) -> Subscription<Arc<Element>> {
        self.subscribe_to(Topic::elements(tag), SubscribeOptions::new())
    }

    /// Every completed element, in order (the catch-all).
    pub fn subscribe_all(&mut self) -> Subscription<Arc<Element>> {
        self.subscribe_to(Topic::all_elements(), SubscribeOptions::new())
    }

    /// Text deltas of one streaming tag (`thought`, `content`): joined, they
    /// are the streamed text of each element of that tag (see
    /// [`Delta::id`] to tell elements apart). They carry what the payload
    /// stage releases: for `content` that is the HTML-filtered text, which
    /// may differ from the raw [`Element::text`].
    pub fn subscribe_deltas(&mut self, tag: &str) -> Subscription<Delta> {
        self.subscribe_to(Topic::deltas(tag), SubscribeOptions::new())
    }

    /// Handler errors and panics, as they happen. Closed after every other
    /// handler has finished, so it sees all of them. Under
    /// [`Backpressure::Wait`] a failing handler waits for room here, so read
    /// it (or attach a handler with [`Router::handle`]); a failure handler's
    /// own failures are recorded but not sent back to it.
    pub fn subscribe_failures(&mut self) -> Subscription<HandlerFailure> {
        self.subscribe_to(Topic::failures(), SubscribeOptions::new())
    }

    /// Any topic, with explicit options.
    ///
    /// ```
    /// use spindle::route::{Router, SubscribeOptions, Topic};
    ///
    /// let mut router = Router::new();
    /// let repairs = router.subscribe_to(Topic::repairs(), SubscribeOptions::new().drop_newest());
    /// assert_eq!(repairs.topic(), "repair");
    /// ```
    pub fn subscribe_to<T: Routable>(&mut self, topic: Topic<T>, options: SubscribeOptions) -> Subscription<T> {
        let filter = self.canonical(topic.filter);
        // tokio channels need 1..=MAX_PERMITS places; they allocate lazily,
        // so a large capacity costs nothing until it fills.
        let capacity =
            options.get_capacity().unwrap_or(self.options.capacity).clamp(1, tokio::sync::Semaphore::MAX_PERMITS);
        let policy = options.get_policy().unwrap_or(self.options.policy);
        let name = options.get_name().map(str::to_string);
        let (tx, rx) = mpsc::channel(capacity);
        let id = SubscriptionId::next();
        let stats = Arc::new(SlotStats::default());
        let slot = Slot {
            id,
            filter: filter.clone(),
            policy,
            sender: <T as topic::sealed::Sealed>::erase(tx),
            stats: stats.clone(),
            name: name.clone(),
        };
        self.records.push(SubRecord {
            id,
            name: name.clone(),
            topic: filter.to_string(),
            policy,
            capacity,
            stats: stats.clone(),
            handler: None,
        });
        if filter == Filter::Failure {
            self.hub.add_slot(slot);
        } else {
            self.core.slots.push(slot);
        }
        Subscription { id, filter, name, rx, stats }
    }

    /// Resolves the tag of a filter through the registry, warning about
    /// names that will never match.
    fn canonical(&self, filter: Filter) -> Filter {
        let Some(registry) = &self.options.registry else {
            return filter;
        };
        let Some(tag) = filter.tag() else {
            return filter;
        };
        let Some(id) = registry.lookup(tag.as_bytes()) else {
            tracing::warn!(tag = %tag, registry = registry.name(), "subscription to a tag the registry does not know; it will only match elements with exactly this name");
            return filter;
        };
        let spec = registry.tag(id);
        let name = TagName::from(spec.name.as_str());
        match filter {
            Filter::Element(_) => Filter::Element(name),
            Filter::Delta(_) => {
                if !spec.body.emits_deltas() {
                    tracing::warn!(tag = %name, "delta subscription to a tag that does not stream; it will receive nothing");
                }
                Filter::Delta(name)
            }
            other => other,
        }
    }

    // ----- handlers ------------------------------------------------------

    /// Runs `handler` for every completed element of `tag`, on its own task
    /// (see the [module docs](self#handlers-errors-and-panics)). Returns the
    /// handler's id, as found in reports.
    ///
    /// ```
    /// use spindle::route::Router;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let mut router = Router::new();
    /// router.on("variable_update", |el| async move {
    ///     if el.text.is_empty() {
    ///         return Err("empty update");
    ///     }
    ///     Ok(())
    /// });
    /// let report = router.finish().await;
    /// assert_eq!(report.handlers.len(), 1);
    /// # }
    /// ```
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime, unless [`RouterOptions::runtime`] was set.
    pub fn on<F, Fut, R>(&mut self, tag: &str, handler: F) -> HandlerId
    where
        F: FnMut(Arc<Element>) -> Fut + Send + 'static,
        Fut: Future<Output = R> + Send + 'static,
        R: HandlerOutcome + 'static,
    {
        let sub = self.subscribe(tag);
        self.handle(sub, handler)
    }

    /// Like [`Router::on`], with subscription options (capacity, policy,
    /// a name that labels the handler in reports and logs).
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime, unless [`RouterOptions::runtime`] was set.
    pub fn on_with<F, Fut, R>(&mut self, tag: &str, options: SubscribeOptions, handler: F) -> HandlerId
    where
        F: FnMut(Arc<Element>) -> Fut + Send + 'static,
        Fut: Future<Output = R> + Send + 'static,
        R: HandlerOutcome + 'static,
    {
        let sub = self.subscribe_to(Topic::elements(tag), options);
        self.handle(sub, handler)
    }

    /// Runs `handler` for every completed element (a catch-all handler).
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime, unless [`RouterOptions::runtime`] was set.
    pub fn on_all<F, Fut, R>(&mut self, handler: F) -> HandlerId
    where
        F: FnMut(Arc<Element>) -> Fut + Send + 'static,
        Fut: Future<Output = R> + Send + 'static,
        R: HandlerOutcome + 'static,
    {
        let sub = self.subscribe_all();
        self.handle(sub, handler)
    }

    /// Runs `handler` for every item of a subscription made by this router
    /// (deltas, repairs, failures, ...), one at a time, in order, on its own
    /// task.
    ///
    /// ```
    /// use spindle::route::{Router, SubscribeOptions, Topic};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let mut router = Router::new();
    /// let repairs = router.subscribe_to(Topic::repairs(), SubscribeOptions::new().name("repair log"));
    /// router.handle(repairs, |r| async move { eprintln!("repaired: {:?} at {}", r.kind, r.at) });
    /// router.dispatch_all(spindle::parse(spindle::Registry::filament(), b"<content>hi")).await;
    /// let report = router.finish().await;
    /// assert_eq!(report.handlers[0].label, "repair log");
    /// assert!(report.handlers[0].received > 0);
    /// # }
    /// ```
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime, unless [`RouterOptions::runtime`] was set.
    pub fn handle<T, F, Fut, R>(&mut self, subscription: Subscription<T>, handler: F) -> HandlerId
    where
        T: Routable,
        F: FnMut(T) -> Fut + Send + 'static,
        Fut: Future<Output = R> + Send + 'static,
        R: HandlerOutcome + 'static,
    {
        let id = HandlerId::next();
        let label = match &subscription.name {
            Some(name) => name.clone(),
            None => subscription.filter.to_string(),
        };
        let on_failures = subscription.filter == Filter::Failure;
        if let Some(record) = self.records.iter_mut().find(|r| r.id == subscription.id) {
            record.handler = Some(id);
        }
        let stats = Arc::new(HandlerStats::default());
        let cx = HandlerContext {
            id,
            label: label.clone(),
            stats: stats.clone(),
            hub: self.hub.clone(),
            publish: !on_failures,
        };
        let subscription_id = subscription.id;
        let task = handler::run_handler(subscription, handler, cx);
        let join = match &self.options.runtime {
            Some(rt) => rt.spawn(task),
            None => tokio::spawn(task),
        };
        self.handlers.push(HandlerEntry {
            id,
            label,
            subscription: subscription_id,
            stats,
            join: Some(join),
            on_failures,
            aborted: false,
        });
        id
    }

    // ----- feeding -------------------------------------------------------

    /// Routes one event to every matching subscription, each per its
    /// policy: waits for room in `Wait` channels, drops and counts for full
    /// `DropNewest` channels.
    ///
    /// # Cancel safety
    ///
    /// All or nothing: places in every matching channel are reserved first
    /// (this is where it waits) and the event is sent to all of them only
    /// once every place is held. If the future is dropped before it
    /// completes, no subscription received the event and nothing was
    /// counted; dispatching it again is correct.
    pub async fn dispatch(&mut self, event: &Event) {
        self.core.dispatch(event).await;
    }

    /// Routes events in order; see [`Router::dispatch`].
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe as a whole: if dropped, a prefix of the events has
    /// been dispatched (each one completely or not at all) and the rest has
    /// not. Use [`Router::feed`] to have undispatched events kept.
    pub async fn dispatch_all<I>(&mut self, events: I)
    where
        I: IntoIterator,
        I::Item: Borrow<Event>,
    {
        for event in events {
            self.core.dispatch(event.borrow()).await;
        }
    }

    /// Routes every event of a stream (from another source of events, say a
    /// replayed JSONL file) until it ends.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: an event taken from the stream but not yet
    /// dispatched when the future is dropped is lost.
    pub async fn dispatch_stream<S>(&mut self, events: S)
    where
        S: Stream<Item = Event>,
    {
        let mut events = std::pin::pin!(events);
        while let Some(event) = events.next().await {
            self.core.dispatch(&event).await;
        }
    }

    /// Feeds one chunk to `parser` and routes the events it made certain,
    /// at once: an element completed by this chunk reaches its subscribers
    /// before this returns.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe in the sense that nothing is lost: the chunk is consumed
    /// by the parser at the first poll, and events not dispatched when the
    /// future is dropped stay queued in the router and are dispatched first
    /// by the next `feed`, [`end`](Router::end), [`flush`](Router::flush) or
    /// [`finish`](Router::finish). Do not feed the same chunk again.
    pub async fn feed(&mut self, parser: &mut Parser, chunk: &[u8]) {
        let mut events = Vec::new();
        parser.feed_into(chunk, &mut events);
        self.pending.extend(events);
        self.flush().await;
    }

    /// Ends `parser`'s input and routes its last events (elements closed at
    /// end of input, end-of-response diagnostics).
    ///
    /// # Cancel safety
    ///
    /// As [`Router::feed`]: events not yet dispatched stay queued for the
    /// next call.
    pub async fn end(&mut self, parser: Parser) {
        self.pending.extend(parser.finish());
        self.flush().await;
    }

    /// Dispatches events left queued by a cancelled [`Router::feed`] or
    /// [`Router::end`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: an event leaves the queue only once it is dispatched.
    pub async fn flush(&mut self) {
        while let Some(event) = self.pending.front() {
            self.core.dispatch(event).await;
            self.pending.pop_front();
        }
    }

    // ----- closing -------------------------------------------------------

    /// The counts so far (subscriptions, handlers, failures), without
    /// stopping anything.
    pub fn report(&self) -> RouteReport {
        let (failures, failures_omitted) = self.hub.log();
        let subscriptions = self
            .records
            .iter()
            .map(|r| {
                let s = r.stats.snapshot();
                SubscriptionReport {
                    id: r.id,
                    name: r.name.clone(),
                    topic: r.topic.clone(),
                    policy: r.policy,
                    capacity: r.capacity,
                    delivered: s.delivered,
                    dropped: s.dropped,
                    undelivered: s.undelivered,
                    handler: r.handler,
                }
            })
            .collect::<Vec<_>>();
        let handlers = self
            .handlers
            .iter()
            .map(|h| {
                let received = h.stats.received.load(Ordering::Relaxed);
                let succeeded = h.stats.succeeded.load(Ordering::Relaxed);
                let errors = h.stats.errors.load(Ordering::Relaxed);
                let panics = h.stats.panics.load(Ordering::Relaxed);
                let delivered = subscriptions.iter().find(|s| s.id == h.subscription).map_or(received, |s| s.delivered);
                HandlerReport {
                    id: h.id,
                    label: h.label.clone(),
                    subscription: h.subscription,
                    received,
                    succeeded,
                    errors,
                    panics,
                    aborted: h.aborted,
                    unhandled: if h.aborted { delivered.saturating_sub(succeeded + errors + panics) } else { 0 },
                }
            })
            .collect();
        RouteReport {
            events: self.core.events,
            elements: self.core.elements,
            subscriptions,
            handlers,
            failures,
            failures_omitted,
        }
    }

    /// Dispatches what is still queued, closes every channel, waits for the
    /// handlers to drain (up to [`RouterOptions::drain_timeout`], then
    /// aborts the rest) and returns the final report.
    ///
    /// Subscriptions held outside handlers end (`None`) once their queued
    /// items are read; `finish` does not wait for them.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: if dropped, the report is lost. Nothing else is:
    /// the channels are closed at the first poll (after queued events are
    /// dispatched) and handlers keep draining in the background.
    pub async fn finish(mut self) -> RouteReport {
        self.flush().await;
        self.core.slots.clear();
        let deadline = self.options.drain_timeout.map(|d| tokio::time::Instant::now() + d);
        for h in self.handlers.iter_mut().filter(|h| !h.on_failures) {
            h.join(deadline).await;
        }
        // Failure subscriptions close only now, so they saw every failure.
        self.hub.close();
        for h in self.handlers.iter_mut().filter(|h| h.on_failures) {
            h.join(deadline).await;
        }
        self.report()
    }
}

impl Drop for Router {
    /// Closes the failure subscriptions too, so that no handler task (a
    /// failure handler holds the hub that feeds it) outlives the router
    /// for good; handlers still draining record their failures in the log
    /// but no longer publish them.
    fn drop(&mut self) {
        self.hub.close();
    }
}

impl Core {
    async fn dispatch(&mut self, event: &Event) {
        // Phase 1: hold a place in every matching channel. The only awaits
        // are here; dropping the future drops the permits, sending nothing.
        let mut plan: Vec<(&Slot, Result<AnyPermit<'_>, NoPlace>)> = Vec::new();
        for slot in &self.slots {
            if !slot.filter.matches(event) {
                continue;
            }
            let place = if slot.sender.is_closed() {
                Err(NoPlace::Closed)
            } else {
                match slot.policy {
                    Backpressure::Wait => slot.sender.reserve().await,
                    Backpressure::DropNewest => slot.sender.try_reserve(),
                }
            };
            plan.push((slot, place));
        }
        // Phase 2: send to all, without waiting.
        let mut shared = None;
        for (slot, place) in plan {
            match place {
                Ok(permit) => {
                    if permit.send(event, &mut shared) {
                        slot.stats.delivered();
                    }
                }
                Err(NoPlace::Full) => {
                    if slot.stats.dropped() {
                        tracing::warn!(subscription = %slot.label(), topic = %slot.filter, "subscription full; dropping newest items (counted in the report)");
                    }
                }
                Err(NoPlace::Closed) => {
                    if slot.stats.undelivered() {
                        tracing::debug!(subscription = %slot.label(), "subscription receiver dropped; no longer delivering to it");
                    }
                }
            }
        }
        self.events += 1;
        if matches!(event, Event::Element(_)) {
            self.elements += 1;
        }
    }
}

impl HandlerEntry {
    /// Waits for the handler task to end, aborting it at `deadline`.
    async fn join(&mut self, deadline: Option<tokio::time::Instant>) {
        let Some(mut join) = self.join.take() else {
            return;
        };
        let result = match deadline {
            Some(deadline) => match tokio::time::timeout_at(deadline, &mut join).await {
                Ok(result) => result,
                Err(_) => {
                    join.abort();
                    self.aborted = true;
                    tracing::warn!(handler = %self.label, "handler still busy at the drain timeout; aborted");
                    return;
                }
            },
            None => join.await,
        };
        if let Err(e) = result {
            if e.is_cancelled() {
                self.aborted = true;
            } else if e.is_panic() {
                // The loop catches handler panics; this is a panic of the
                // loop itself, reported the same way.
                self.stats.panics.fetch_add(1, Ordering::Relaxed);
                let message = handler::panic_message(e.into_panic().as_ref());
                tracing::error!(handler = %self.label, panic = %message, "route handler task panicked");
            }
        }
    }
}
