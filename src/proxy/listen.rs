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
//!    listener, fewer when the process's open-file limit (`ulimit -n`) has
//!    no room for that many ([`within_open_files`]). Past the cap the loop
//!    stops accepting: new connections wait in the kernel's accept queue
//!    (nothing is read from them, nothing refused) until one closes.
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

/// Descriptors kept for what is not a client connection or its upstream
/// connection: the listeners, sink files and sockets, the pipes of tool
/// processes and MCP servers, the log.
const RESERVED_DESCRIPTORS: u64 = 64;

/// The client connections an open-file limit of `nofile` descriptors has
/// room for, when that is fewer than `wanted`: each connection may hold a
/// second descriptor to the upstream, and [`RESERVED_DESCRIPTORS`] are
/// kept for the rest.
fn descriptor_cap(nofile: u64, wanted: usize) -> Option<usize> {
    let room = nofile.saturating_sub(RESERVED_DESCRIPTORS) / 2;
    let room = usize::try_from(room).unwrap_or(usize::MAX).max(1);
    (room < wanted).then_some(room)
}

/// `wanted` connections per listener, or fewer when the process's soft
/// open-file limit has no room for them (said in the log): a proxy whose
/// descriptors ran out could accept clients it could not connect upstream
/// for, and would stall accepting; under the lower cap the extra clients
/// wait in the accept queue instead.
pub(crate) fn within_open_files(wanted: usize) -> usize {
    use nix::sys::resource::{Resource, getrlimit};
    let Ok((soft, _)) = getrlimit(Resource::RLIMIT_NOFILE) else { return wanted };
    match descriptor_cap(soft, wanted) {
        Some(cap) => {
            tracing::warn!(
                "the open-file limit (ulimit -n {soft}) has room for about {cap} client connections per listener, \
                 fewer than --max-connections {wanted}: at most {cap} are served at once (raise the limit for more)"
            );
            cap
        }
        None => wanted,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_leaves_two_descriptors_a_connection_and_a_reserve() {
        // A common default, 1024: room for 480 of the 1024 wanted.
        assert_eq!(descriptor_cap(1024, 1024), Some(480));
        assert_eq!(descriptor_cap(256, 1024), Some(96));
        // Room enough: the wanted number stands.
        assert_eq!(descriptor_cap(1 << 20, 1024), None);
        assert_eq!(descriptor_cap(u64::MAX, 1 << 40), None);
        assert_eq!(descriptor_cap(1024, 100), None);
        // Never none at all.
        assert_eq!(descriptor_cap(10, 1024), Some(1));
    }
}
