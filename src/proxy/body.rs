//! The client's response body, driven by the client's connection: it owns
//! the response's pump ([`super::pump`]) and polls it itself, so an
//! upstream read reaches the client's socket in the task that writes it,
//! with no task or channel hand-off in between.
//!
//! This module owns the hand-over between the pump and the body: a small
//! queue (the [`Outbox`], at most `capacity` items) that the pump fills and
//! the body empties, the point where the pump lets the connection flush
//! before it parses ([`Outbox::let_flush`]), and what happens when the
//! client goes away: hyper drops the body, the queue is closed, and the
//! rest of the pump is spawned as its own task, so that it sees the client
//! gone (the pump's [`Outbox::closed`]), drops the upstream response and
//! finishes its metrics, sinks and log. It must not look at the bytes.
//!
//! Why not a spawned pump and a channel: a paced stream then wakes three
//! tasks per upstream read (the upstream connection, the pump, the client
//! connection); here it wakes two. Backpressure is the connection's own:
//! hyper polls the body only while its write buffer has room, so a client
//! that reads slowly leaves the upstream unread.

use bytes::Bytes;
use futures::Stream;
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

/// What the client's body carries (an `Err` makes hyper abort the
/// response, so the client sees a broken body, not a clean short one).
pub(crate) type ClientItem = Result<Bytes, std::io::Error>;

/// What the pump and the body share.
#[derive(Debug)]
struct Shared {
    items: VecDeque<ClientItem>,
    capacity: usize,
    /// The pump has written something and asked for it to be flushed
    /// before it goes on (see [`Outbox::let_flush`]).
    flush: bool,
    /// The body is gone: the client went away.
    closed: bool,
}

fn lock(shared: &Mutex<Shared>) -> MutexGuard<'_, Shared> {
    // Nothing panics while holding the lock; a poisoned lock still holds
    // a consistent queue.
    shared.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The pump's side: where it puts what the client receives.
#[derive(Debug)]
pub(crate) struct Outbox {
    shared: Arc<Mutex<Shared>>,
}

/// Why an item was not queued.
#[derive(Debug)]
pub(crate) struct ClientGone;

impl Outbox {
    /// Queues one item, waiting while the queue is full (the body empties
    /// it and polls the pump again).
    pub(crate) async fn send(&self, item: ClientItem) -> Result<(), ClientGone> {
        let mut item = Some(item);
        std::future::poll_fn(|_cx| {
            let mut shared = lock(&self.shared);
            if shared.closed {
                return Poll::Ready(Err(ClientGone));
            }
            if shared.items.len() >= shared.capacity {
                // No waker: the body polls the pump whenever its queue is
                // empty, and nothing else runs this future until then.
                return Poll::Pending;
            }
            if let Some(item) = item.take() {
                shared.items.push_back(item);
            }
            Poll::Ready(Ok(()))
        })
        .await
    }

    /// Ready once the client went away (never while the body is alive).
    pub(crate) async fn closed(&self) {
        std::future::poll_fn(|_cx| if lock(&self.shared).closed { Poll::Ready(()) } else { Poll::Pending }).await;
    }

    /// Lets the client's connection write what is queued before the pump
    /// goes on: the body hands the queue out and then reports "pending"
    /// once, which makes hyper flush, and the pump resumes in the
    /// connection's next poll. Parsing after this point adds nothing to
    /// the chunk's latency.
    ///
    /// `yield_now` (not a plain self-wake): tokio runs the task again only
    /// after it has polled for I/O, so under load the chunks that arrived
    /// meanwhile are forwarded before this one is parsed. A self-wake
    /// would save that poll (one `epoll_wait` per paced chunk) but queue
    /// the parsing ahead of them; measured at 64 streams on one core, the
    /// two differed by less than the machine's noise, so the order that
    /// favours forwarding stays.
    pub(crate) async fn let_flush(&self) {
        lock(&self.shared).flush = true;
        tokio::task::yield_now().await;
    }
}

/// The pump's future, as the body holds it.
type PumpFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The client's side: a stream of [`ClientItem`]s that runs the pump.
pub(crate) struct PumpBody {
    shared: Arc<Mutex<Shared>>,
    /// `None` once the pump has finished.
    pump: Option<PumpFuture>,
}

impl std::fmt::Debug for PumpBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PumpBody").field("running", &self.pump.is_some()).finish_non_exhaustive()
    }
}

/// A queue of at most `capacity` items (at least one) and the body that
/// empties it; the body runs the pump that `pump` builds from the queue's
/// [`Outbox`].
pub(crate) fn pump_body<F, P>(capacity: usize, pump: P) -> PumpBody
where
    P: FnOnce(Outbox) -> F,
    F: Future<Output = ()> + Send + 'static,
{
    let shared =
        Arc::new(Mutex::new(Shared { items: VecDeque::new(), capacity: capacity.max(1), flush: false, closed: false }));
    let outbox = Outbox { shared: shared.clone() };
    PumpBody { shared, pump: Some(Box::pin(pump(outbox))) }
}

impl Stream for PumpBody {
    type Item = Result<Bytes, std::io::Error>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            {
                let mut shared = lock(&this.shared);
                if let Some(item) = shared.items.pop_front() {
                    return Poll::Ready(Some(item));
                }
                if std::mem::take(&mut shared.flush) && this.pump.is_some() {
                    // The pump yielded (its waker is already called): hyper
                    // flushes on this "pending" and polls again.
                    return Poll::Pending;
                }
            }
            let Some(pump) = this.pump.as_mut() else {
                return Poll::Ready(None);
            };
            match pump.as_mut().poll(cx) {
                Poll::Ready(()) => this.pump = None,
                Poll::Pending => {
                    let shared = lock(&this.shared);
                    if shared.items.is_empty() && !shared.flush {
                        return Poll::Pending;
                    }
                }
            }
        }
    }
}

impl Drop for PumpBody {
    fn drop(&mut self) {
        let Some(pump) = self.pump.take() else {
            return;
        };
        {
            let mut shared = lock(&self.shared);
            shared.closed = true;
            shared.items.clear();
        }
        // The client went away mid-response: the pump finishes on its own
        // (it sees the outbox closed, drops the upstream and accounts for
        // the response). Outside a runtime it is dropped, which still
        // closes the upstream.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(pump);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;

    fn data(s: &'static str) -> ClientItem {
        Ok(Bytes::from_static(s.as_bytes()))
    }

    #[tokio::test]
    async fn items_come_out_in_order_through_a_small_queue() {
        let body = pump_body(2, |out| async move {
            for s in ["a", "b", "c", "d", "e"] {
                if out.send(data(s)).await.is_err() {
                    return;
                }
            }
        });
        let got: Vec<Bytes> = body.map(|r| r.unwrap_or_default()).collect().await;
        assert_eq!(got, ["a", "b", "c", "d", "e"].map(|s| Bytes::from_static(s.as_bytes())));
    }

    #[tokio::test]
    async fn a_flush_point_hands_out_the_queue_then_waits_one_poll() {
        let mut body = pump_body(4, |out| async move {
            let _ = out.send(data("x")).await;
            out.let_flush().await;
            let _ = out.send(data("y")).await;
        });
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        assert!(matches!(Pin::new(&mut body).poll_next(&mut cx), Poll::Ready(Some(Ok(b))) if b == "x"));
        // The connection flushes here.
        assert!(Pin::new(&mut body).poll_next(&mut cx).is_pending());
        assert!(matches!(Pin::new(&mut body).poll_next(&mut cx), Poll::Ready(Some(Ok(b))) if b == "y"));
        assert!(matches!(Pin::new(&mut body).poll_next(&mut cx), Poll::Ready(None)));
    }

    #[tokio::test]
    async fn a_dropped_body_lets_the_pump_see_the_client_gone() {
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
        let mut body = pump_body(1, |out| async move {
            let _ = out.send(data("first")).await;
            // Waits for something that never comes while the client is
            // there; the client leaving ends the wait.
            tokio::select! {
                _ = go_rx => {}
                () = out.closed() => {}
            }
            let gone = out.send(data("late")).await.is_err();
            let _ = done_tx.send(gone);
        });
        assert!(matches!(body.next().await, Some(Ok(b)) if b == "first"));
        let waker = futures::task::noop_waker();
        assert!(Pin::new(&mut body).poll_next(&mut Context::from_waker(&waker)).is_pending());
        drop(body);
        let gone = tokio::time::timeout(std::time::Duration::from_secs(5), done_rx).await;
        assert!(matches!(gone, Ok(Ok(true))), "{gone:?}");
        drop(go_tx);
    }
}
