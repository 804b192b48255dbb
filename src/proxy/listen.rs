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
//! hyper's HTTP/1 connection builder. (Not hyper-util's `auto` builder:
//! its connections with upgrades first read the bytes that tell HTTP/2
//! from HTTP/1 with no timeout, even when built HTTP/1-only, so a client
//! that sent nothing was never cut off.)
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
//!    keep-alive connection idle for that long are all closed. Upgrades are
//!    allowed (a WebSocket handshake, the `websocket` module): hyper hands the
//!    socket to the request's handler after its `101` and the connection's
//!    task ends, but the connection keeps its slot: every request carries
//!    the connection's [`ConnectionSlot`], and the WebSocket session holds
//!    it until it ends.
//! 4. **Stop**: at shutdown the loop accepts no more; each connection
//!    finishes the request it is serving and closes (hyper's graceful
//!    shutdown), and [`serve`] returns once all have closed. The
//!    WebSocket sessions of upgraded connections are not waited for here:
//!    the server ends them (after the grace period, with `1001`).
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
use hyper::server::conn::http1::Builder;
use hyper::service::Service;
use hyper_util::rt::{TokioIo, TokioTimer};
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

/// What a client connection holds while it is open: its slot under the
/// cap and the open-connections gauge. Shared by the connection's task and
/// its requests (a request extension, `Arc<ConnectionSlot>`), so that a
/// connection handed over by an upgrade counts until its session ends.
#[derive(Debug)]
pub(crate) struct ConnectionSlot {
    _slot: OwnedSemaphorePermit,
    _gauge: GaugeGuard,
}

/// The router's service with the connection's slot put into every request.
#[derive(Debug, Clone)]
struct WithSlot {
    router: TowerToHyperService<Router>,
    slot: Arc<ConnectionSlot>,
}

impl<B> Service<hyper::Request<B>> for WithSlot
where
    TowerToHyperService<Router>: Service<hyper::Request<B>>,
{
    type Response = <TowerToHyperService<Router> as Service<hyper::Request<B>>>::Response;
    type Error = <TowerToHyperService<Router> as Service<hyper::Request<B>>>::Error;
    type Future = <TowerToHyperService<Router> as Service<hyper::Request<B>>>::Future;

    fn call(&self, mut request: hyper::Request<B>) -> Self::Future {
        request.extensions_mut().insert(self.slot.clone());
        self.router.call(request)
    }
}

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
    let mut builder = Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(serving.header_timeout);
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
        let slot = Arc::new(ConnectionSlot { _slot: slot, _gauge: metrics.connection_open() });
        connections.spawn(connection(builder.clone(), tcp, router.clone(), stop.clone(), slot));
    }
    // Phase 4, stop: no more accepts; wait for the open connections.
    drop(listener);
    connections.close();
    connections.wait().await;
}

/// Phase 3, one connection: served until it ends (or is upgraded), or
/// until `stop`, then to the end of its running request.
async fn connection(
    builder: Builder,
    tcp: TcpStream,
    router: Router,
    stop: CancellationToken,
    slot: Arc<ConnectionSlot>,
) {
    let service = WithSlot { router: TowerToHyperService::new(router), slot: slot.clone() };
    let conn = builder.serve_connection(TokioIo::new(tcp), service).with_upgrades();
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
    drop(slot);
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
