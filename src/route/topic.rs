//! What a subscription listens to: a [`Topic`] names a kind of event (and,
//! for elements and deltas, a tag) and fixes the item type its receiver
//! yields. This module owns the matching of events against topics and the
//! type-erased senders the router keeps; it must not decide when or how
//! items are sent (that is the router's backpressure logic).

use crate::event::{Comment, Delta, Diagnostic, Element, Event, Repair, TagName};
use crate::route::failure::HandlerFailure;
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use tokio::sync::mpsc;

/// The event filter behind a topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Filter {
    /// Completed elements of one canonical tag.
    Element(TagName),
    /// Every completed element.
    AnyElement,
    /// Deltas of one canonical tag.
    Delta(TagName),
    /// Every delta.
    AnyDelta,
    /// Repair events.
    Repair,
    /// Diagnostic events.
    Diagnostic,
    /// HTML comments.
    Comment,
    /// Every event.
    Event,
    /// Handler failures (fed by handlers, not by dispatch).
    Failure,
}

impl Filter {
    /// Whether `event` goes to a subscription with this filter.
    pub(crate) fn matches(&self, event: &Event) -> bool {
        match (self, event) {
            (Filter::Element(tag), Event::Element(e)) => tag_eq(tag, &e.tag),
            (Filter::AnyElement, Event::Element(_)) => true,
            (Filter::Delta(tag), Event::Delta(d)) => tag_eq(tag, &d.tag),
            (Filter::AnyDelta, Event::Delta(_)) => true,
            (Filter::Repair, Event::Repair(_)) => true,
            (Filter::Diagnostic, Event::Diagnostic(_)) => true,
            (Filter::Comment, Event::Comment(_)) => true,
            (Filter::Event, _) => true,
            _ => false,
        }
    }

    /// The tag this filter names, if any (for registry checks).
    pub(crate) fn tag(&self) -> Option<&TagName> {
        match self {
            Filter::Element(t) | Filter::Delta(t) => Some(t),
            _ => None,
        }
    }
}

/// Canonical names are compared ASCII-case-insensitively, like the
/// registry matches tags.
fn tag_eq(want: &str, got: &str) -> bool {
    want.eq_ignore_ascii_case(got)
}

impl fmt::Display for Filter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Filter::Element(t) => write!(f, "element:{t}"),
            Filter::AnyElement => f.write_str("element:*"),
            Filter::Delta(t) => write!(f, "delta:{t}"),
            Filter::AnyDelta => f.write_str("delta:*"),
            Filter::Repair => f.write_str("repair"),
            Filter::Diagnostic => f.write_str("diagnostic"),
            Filter::Comment => f.write_str("comment"),
            Filter::Event => f.write_str("event"),
            Filter::Failure => f.write_str("failure"),
        }
    }
}

/// What a subscription receives, and as which item type `T`.
///
/// Build one with the constructors below and pass it to
/// [`Router::subscribe_to`](crate::route::Router::subscribe_to); the
/// `subscribe_*` shortcuts on the router cover the common cases.
///
/// | constructor | receives | item |
/// | --- | --- | --- |
/// | [`Topic::elements`] | completed elements of one tag | `Arc<Element>` |
/// | [`Topic::all_elements`] | every completed element (catch-all) | `Arc<Element>` |
/// | [`Topic::deltas`] | text deltas of one streaming tag | [`Delta`] |
/// | [`Topic::all_deltas`] | every text delta | [`Delta`] |
/// | [`Topic::repairs`] | every repair the parser made | [`Repair`] |
/// | [`Topic::diagnostics`] | every diagnostic | [`Diagnostic`] |
/// | [`Topic::comments`] | HTML comments | [`Comment`] |
/// | [`Topic::events`] | every event, in order | [`Event`] |
/// | [`Topic::failures`] | handler errors and panics | [`HandlerFailure`] |
///
/// Elements are shared as `Arc<Element>` because one element often goes to
/// several subscribers (a tag handler and a catch-all logger) and its
/// payload may be large.
pub struct Topic<T> {
    pub(crate) filter: Filter,
    item: PhantomData<fn() -> T>,
}

impl<T> Topic<T> {
    fn new(filter: Filter) -> Topic<T> {
        Topic { filter, item: PhantomData }
    }
}

impl<T> Clone for Topic<T> {
    fn clone(&self) -> Self {
        Topic::new(self.filter.clone())
    }
}

impl<T> fmt::Debug for Topic<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Topic").field(&self.filter.to_string()).finish()
    }
}

impl<T> fmt::Display for Topic<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.filter.fmt(f)
    }
}

impl Topic<Arc<Element>> {
    /// Completed elements whose canonical tag is `tag` (an alias is
    /// resolved when the router knows the registry).
    pub fn elements(tag: &str) -> Self {
        Topic::new(Filter::Element(TagName::from(tag.trim())))
    }

    /// Every completed element, whatever its tag.
    pub fn all_elements() -> Self {
        Topic::new(Filter::AnyElement)
    }
}

impl Topic<Delta> {
    /// Text deltas of elements whose canonical tag is `tag`. Only streaming
    /// tags (body kind `stream`, such as thought and content) emit deltas.
    pub fn deltas(tag: &str) -> Self {
        Topic::new(Filter::Delta(TagName::from(tag.trim())))
    }

    /// Every text delta, whatever its tag.
    pub fn all_deltas() -> Self {
        Topic::new(Filter::AnyDelta)
    }
}

impl Topic<Repair> {
    /// Every repair event (what the corrector changed).
    pub fn repairs() -> Self {
        Topic::new(Filter::Repair)
    }
}

impl Topic<Diagnostic> {
    /// Every diagnostic event (payload problems, missing tags, limits).
    pub fn diagnostics() -> Self {
        Topic::new(Filter::Diagnostic)
    }
}

impl Topic<Comment> {
    /// Every HTML comment `<!-- -->` (spec 003 §3.1.2 routes them apart from
    /// the text users see).
    pub fn comments() -> Self {
        Topic::new(Filter::Comment)
    }
}

impl Topic<Event> {
    /// Every event, in the order the parser emitted them.
    pub fn events() -> Self {
        Topic::new(Filter::Event)
    }
}

impl Topic<HandlerFailure> {
    /// Errors returned and panics raised by this router's handlers.
    pub fn failures() -> Self {
        Topic::new(Filter::Failure)
    }
}

/// An item type a [`Topic`] can carry. Sealed: the router knows how to
/// build each of them from an event.
pub trait Routable: sealed::Sealed + Send + 'static {}

impl<T: sealed::Sealed + Send + 'static> Routable for T {}

pub(crate) mod sealed {
    use super::*;

    /// Where an item came from, for failure reports.
    #[allow(unreachable_pub)] // reachable only through the sealed trait
    #[derive(Debug, Clone, Default)]
    pub struct Origin {
        /// The element concerned.
        pub element: Option<u32>,
        /// Its canonical tag.
        pub tag: Option<TagName>,
    }

    /// The router's view of an item type.
    #[allow(unreachable_pub)] // the sealed-trait pattern: public, unnameable
    pub trait Sealed: Sized {
        /// Erases the sender's item type.
        #[doc(hidden)]
        fn erase(sender: mpsc::Sender<Self>) -> AnySender;
        /// The element and tag this item is about.
        #[doc(hidden)]
        fn origin(&self) -> Origin;
    }

    impl Sealed for Arc<Element> {
        fn erase(sender: mpsc::Sender<Self>) -> AnySender {
            AnySender::Element(sender)
        }
        fn origin(&self) -> Origin {
            Origin { element: Some(self.id), tag: Some(self.tag.clone()) }
        }
    }

    impl Sealed for Delta {
        fn erase(sender: mpsc::Sender<Self>) -> AnySender {
            AnySender::Delta(sender)
        }
        fn origin(&self) -> Origin {
            Origin { element: Some(self.id), tag: Some(self.tag.clone()) }
        }
    }

    impl Sealed for Repair {
        fn erase(sender: mpsc::Sender<Self>) -> AnySender {
            AnySender::Repair(sender)
        }
        fn origin(&self) -> Origin {
            Origin { element: self.element, tag: self.tag.clone() }
        }
    }

    impl Sealed for Diagnostic {
        fn erase(sender: mpsc::Sender<Self>) -> AnySender {
            AnySender::Diagnostic(sender)
        }
        fn origin(&self) -> Origin {
            Origin { element: self.element, tag: self.tag.clone() }
        }
    }

    impl Sealed for Comment {
        fn erase(sender: mpsc::Sender<Self>) -> AnySender {
            AnySender::Comment(sender)
        }
        fn origin(&self) -> Origin {
            Origin { element: self.element, tag: self.tag.clone() }
        }
    }

    impl Sealed for Event {
        fn erase(sender: mpsc::Sender<Self>) -> AnySender {
            AnySender::Event(sender)
        }
        fn origin(&self) -> Origin {
            match self {
                Event::Open(o) => Origin { element: Some(o.id), tag: Some(o.tag.clone()) },
                Event::Delta(d) => d.origin(),
                Event::Close(c) => Origin { element: Some(c.id), tag: Some(c.tag.clone()) },
                Event::Element(e) => Origin { element: Some(e.id), tag: Some(e.tag.clone()) },
                Event::Repair(r) => r.origin(),
                Event::Diagnostic(d) => d.origin(),
                Event::Comment(c) => c.origin(),
                _ => Origin::default(),
            }
        }
    }

    impl Sealed for HandlerFailure {
        fn erase(sender: mpsc::Sender<Self>) -> AnySender {
            AnySender::Failure(sender)
        }
        fn origin(&self) -> Origin {
            Origin { element: self.element, tag: self.tag.clone() }
        }
    }

    /// A sender with its item type erased.
    #[allow(unreachable_pub)]
    #[derive(Debug)]
    pub enum AnySender {
        /// Completed elements.
        Element(mpsc::Sender<Arc<Element>>),
        /// Deltas.
        Delta(mpsc::Sender<Delta>),
        /// Repairs.
        Repair(mpsc::Sender<Repair>),
        /// Diagnostics.
        Diagnostic(mpsc::Sender<Diagnostic>),
        /// Comments.
        Comment(mpsc::Sender<Comment>),
        /// Every event.
        Event(mpsc::Sender<Event>),
        /// Handler failures.
        Failure(mpsc::Sender<HandlerFailure>),
    }
}

pub(crate) use sealed::AnySender;

/// A reserved place in one subscription's channel. Sending through it
/// cannot wait and cannot fail, which is what makes dispatch all-or-nothing.
#[derive(Debug)]
pub(crate) enum AnyPermit<'a> {
    Element(mpsc::Permit<'a, Arc<Element>>),
    Delta(mpsc::Permit<'a, Delta>),
    Repair(mpsc::Permit<'a, Repair>),
    Diagnostic(mpsc::Permit<'a, Diagnostic>),
    Comment(mpsc::Permit<'a, Comment>),
    Event(mpsc::Permit<'a, Event>),
    Failure(mpsc::Permit<'a, HandlerFailure>),
}

/// Why a place could not be reserved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NoPlace {
    /// The channel is at capacity.
    Full,
    /// The receiver is gone.
    Closed,
}

macro_rules! each_sender {
    ($sender:expr, $s:ident => $body:expr) => {
        match $sender {
            AnySender::Element($s) => $body,
            AnySender::Delta($s) => $body,
            AnySender::Repair($s) => $body,
            AnySender::Diagnostic($s) => $body,
            AnySender::Comment($s) => $body,
            AnySender::Event($s) => $body,
            AnySender::Failure($s) => $body,
        }
    };
}

macro_rules! reserve_as {
    ($sender:expr, $s:ident => $reserve:expr) => {
        match $sender {
            AnySender::Element($s) => $reserve.map(AnyPermit::Element),
            AnySender::Delta($s) => $reserve.map(AnyPermit::Delta),
            AnySender::Repair($s) => $reserve.map(AnyPermit::Repair),
            AnySender::Diagnostic($s) => $reserve.map(AnyPermit::Diagnostic),
            AnySender::Comment($s) => $reserve.map(AnyPermit::Comment),
            AnySender::Event($s) => $reserve.map(AnyPermit::Event),
            AnySender::Failure($s) => $reserve.map(AnyPermit::Failure),
        }
    };
}

impl AnySender {
    /// Waits for a place in the channel.
    ///
    /// Cancel safe: dropping the future gives up the place in the queue of
    /// waiting senders, nothing else.
    pub(crate) async fn reserve(&self) -> Result<AnyPermit<'_>, NoPlace> {
        reserve_as!(self, s => s.reserve().await.map_err(|_| NoPlace::Closed))
    }

    /// Takes a place in the channel if one is free.
    pub(crate) fn try_reserve(&self) -> Result<AnyPermit<'_>, NoPlace> {
        reserve_as!(self, s => s.try_reserve().map_err(|e| match e {
            mpsc::error::TrySendError::Full(()) => NoPlace::Full,
            mpsc::error::TrySendError::Closed(()) => NoPlace::Closed,
        }))
    }

    /// Whether the receiver is gone.
    pub(crate) fn is_closed(&self) -> bool {
        each_sender!(self, s => s.is_closed())
    }
}

impl AnyPermit<'_> {
    /// Sends the item `event` makes for this permit's type. `element` caches
    /// the shared element so that all subscribers get the same `Arc`.
    /// Returns false (sending nothing) if the event has no item of this
    /// type, which the topic filters rule out.
    pub(crate) fn send(self, event: &Event, element: &mut Option<Arc<Element>>) -> bool {
        match (self, event) {
            (AnyPermit::Element(p), Event::Element(e)) => {
                let shared = element.get_or_insert_with(|| Arc::new((**e).clone()));
                p.send(shared.clone());
            }
            (AnyPermit::Delta(p), Event::Delta(d)) => p.send(d.clone()),
            (AnyPermit::Repair(p), Event::Repair(r)) => p.send((**r).clone()),
            (AnyPermit::Diagnostic(p), Event::Diagnostic(d)) => p.send(d.clone()),
            (AnyPermit::Comment(p), Event::Comment(c)) => p.send(c.clone()),
            (AnyPermit::Event(p), e) => p.send(e.clone()),
            _ => return false,
        }
        true
    }

    /// Sends a handler failure (the only item not made from an event).
    pub(crate) fn send_failure(self, failure: &HandlerFailure) -> bool {
        match self {
            AnyPermit::Failure(p) => {
                p.send(failure.clone());
                true
            }
            _ => false,
        }
    }
}
