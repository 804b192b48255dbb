//! Compile-time checks that the router's public types and futures can
//! cross threads (tokio's `async_send_sync.rs` idea): if one of these stops
//! being `Send`/`Sync`, this file stops compiling.

use futures::stream;
use spindle::event::{Comment, Delta, Diagnostic, Element, Event, Repair};
use spindle::route::{
    Backpressure, FailureKind, HandlerFailure, HandlerId, HandlerReport, RouteReport, Router, RouterOptions, RunError,
    RunReport, SubscribeOptions, Subscription, SubscriptionId, SubscriptionReport, SubscriptionStats, Topic,
};
use spindle::{Parser, Registry};
use std::sync::Arc;

fn send_sync_unpin<T: Send + Sync + Unpin>() {}
fn send_sync<T: Send + Sync>() {}
fn send_future<F: std::future::Future + Send>(f: F) -> F {
    f
}

#[test]
fn public_types_are_send_sync_unpin() {
    send_sync_unpin::<Router>();
    send_sync_unpin::<RouterOptions>();
    send_sync_unpin::<SubscribeOptions>();
    send_sync_unpin::<Backpressure>();
    send_sync_unpin::<Subscription<Arc<Element>>>();
    send_sync_unpin::<Subscription<Delta>>();
    send_sync_unpin::<Subscription<Repair>>();
    send_sync_unpin::<Subscription<Diagnostic>>();
    send_sync_unpin::<Subscription<Comment>>();
    send_sync_unpin::<Subscription<Event>>();
    send_sync_unpin::<Subscription<HandlerFailure>>();
    send_sync_unpin::<Topic<Arc<Element>>>();
    send_sync_unpin::<Topic<Delta>>();
    send_sync_unpin::<RouteReport>();
    send_sync_unpin::<SubscriptionReport>();
    send_sync_unpin::<SubscriptionStats>();
    send_sync_unpin::<HandlerReport>();
    send_sync_unpin::<HandlerFailure>();
    send_sync_unpin::<HandlerId>();
    send_sync_unpin::<SubscriptionId>();
    send_sync_unpin::<FailureKind>();
    send_sync_unpin::<RunReport>();
    send_sync::<RunError<std::io::Error>>();
    // Errors convert into boxed errors for `?` in callers.
    let _: fn(RunError<std::io::Error>) -> Box<dyn std::error::Error + Send + Sync> = |e| e.into();
}

#[test]
fn router_futures_are_send() {
    let event = spindle::parse(Registry::filament(), b"<content>x</content>").into_iter().next().unwrap();
    let mut router = Router::new();
    let mut sub = router.subscribe("content");
    drop(send_future(sub.recv()));
    drop(send_future(router.dispatch(&event)));
    drop(send_future(router.dispatch_all(vec![event.clone()])));
    drop(send_future(router.dispatch_stream(stream::iter(vec![event.clone()]))));
    let mut parser = Parser::new(Registry::filament());
    drop(send_future(router.feed(&mut parser, b"<content>")));
    drop(send_future(router.flush()));
    drop(send_future(Router::new().end(Parser::new(Registry::filament()))));
    drop(send_future(Router::new().finish()));
    let input = stream::iter(vec![Ok::<_, std::io::Error>(bytes::Bytes::from_static(b"x"))]);
    drop(send_future(Router::new().run(Parser::new(Registry::filament()), input)));
    drop(send_future(Router::new().run_reader(Parser::new(Registry::filament()), &b"x"[..])));
    drop(router);
}
