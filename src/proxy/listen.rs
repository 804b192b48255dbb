//! The listeners' connections: accepted up to a cap, served as HTTP/1.1
//! with a timeout on every request head, and closed gracefully at
//! shutdown.
//!
//! This module owns a listener's accept loop and each connection's life;
//! what a request means is the router's (the proxy's routes, the
//! inspector's). `axum::serve` has neither a connection cap nor a
//! header-read timeout, so clients that opened connections and sent
//! nothing (or half a head) kept a descriptor each for as long as they
//! liked, until the proxy could accept no more; hence this loop, with
//! hyper-util's connection builder.
//!
//! # Phases of a connection
//!
//! 1. **Slot**: at most `max_connections` connections are open per
//!    listener. Past the cap the loop stops accepting: new connections wait
//!    in the kernel's accept queue (nothing is read from them, nothing
//!    refused) until one closes.
//! 2. **Accept**, with `TCP_NODELAY`. An accept error (out of descriptors)
//!    pauses the loop for a second instead of spinning.
//! 3. **Serve**: HTTP/1.1 with keep-alive. Every request head must arrive
//!    within the header timeout, counted from when the connection is ready
//!    for it: a new connection that sends nothing, a slowloris head, and a
//!    keep-alive connection idle for that long are all closed.
//! 4. **Stop**: at shutdown the loop accepts no more; each connection
//!    finishes the request it is serving and closes (hyper's graceful
//!    shutdown), and [`serve`] returns once all have closed.
//!
//! HTTP/2 is not offered: browsers and OpenAI clients speak HTTP/1.1 to an
//! `http://` URL, and hyper's HTTP/2 server has no header-read timeout.
//!
//! # Cancel safety
//!
//! Dropping [`serve`]'s future stops accepting; connections already
//! accepted run on in their own tasks until they end.

use super::metrics::{GaugeGuard, Metrics};
use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// How a listener treats its connections.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Serving {
    /// Most connections open at once.
    pub(crate) max_connections: usize,
    /// The longest wait for a request head.
    pub(crate) header_timeout: Duration,
}

/// What a connection holds while it is open: its slot and the gauge.
type Held = (OwnedSemaphorePermit, GaugeGuard);

/// Serves `router` on `listener` until `stop` is cancelled, then until the
/// open connections have closed. See the module's phases.
pub(crate) async fn serve(
    listener: TcpListener,
    router: Router,
    serving: Serving,
    stop: CancellationToken,
    metrics: Arc<Metrics>,
) {
    let slots = Arc::new(Semaphore::new(serving.max_connections.clamp(1, Semaphore::MAX_PERMITS)));
    let connections = TaskTracker::new();
    let mut builder = Builder::new(TokioExecutor::new()).http1_only();
    builder.http1().timer(TokioTimer::new()).header_read_timeout(serving.header_timeout);
    loop {
        // Phase 1, a slot.
        let slot = tokio::select! {
            slot = slots.clone().acquire_owned() => slot,
            () = stop.cancelled() => break,
        };
        let Ok(slot) = slot else { break };
        // Phase 2, accept.
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = stop.cancelled() => break,
        };
        let tcp = match accepted {
            Ok((tcp, _)) => tcp,
            Err(e) => {
                pause_after(&e).await;
                continue;
            }
        };
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!("cannot set TCP_NODELAY: {e}");
        }
        let held = (slot, metrics.connection_open());
        connections.spawn(connection(builder.clone(), tcp, router.clone(), stop.clone(), held));
    }
    // Phase 4, stop: no more accepts; wait for the open connections.
    drop(listener);
    connections.close();
    connections.wait().await;
}

/// Phase 3, one connection: served until it ends, or until `stop`, then
/// to the end of its running request.
async fn connection(
    builder: Builder<TokioExecutor>,
    tcp: TcpStream,
    router: Router,
    stop: CancellationToken,
    held: Held,
) {
    let conn = builder.serve_connection(TokioIo::new(tcp), TowerToHyperService::new(router));
    tokio::pin!(conn);
    let ended = tokio::select! {
        ended = conn.as_mut() => ended,
        () = stop.cancelled() => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(e) = ended {
        // A head too slow, a client gone: that client's business.
        tracing::debug!("connection closed: {e}");
    }
    drop(held);
}

/// After a failed accept: a connection that failed before it was accepted
/// is nothing to wait for; anything else (out of descriptors) pauses the
/// loop a second rather than spin on it.
async fn pause_after(e: &std::io::Error) {
    use std::io::ErrorKind;
    if matches!(e.kind(), ErrorKind::ConnectionRefused | ErrorKind::ConnectionAborted | ErrorKind::ConnectionReset) {
        return;
    }
    tracing::warn!("cannot accept a connection: {e}; pausing a second");
    tokio::time::sleep(Duration::from_secs(1)).await;
}
