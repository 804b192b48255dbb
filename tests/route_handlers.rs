//! Router handlers: a slow handler under the wait policy loses nothing, a
//! failing or panicking handler leaves the stream and the others running,
//! and an element reaches its handler while the input is still running.

use futures::stream::{self, StreamExt};
use spindle::route::{FailureKind, Router, RouterOptions, SubscribeOptions};
use spindle::{Parser, Registry};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// `n` tool calls, each `{"n": i}`, then a content element.
fn tool_calls(n: usize) -> String {
    let mut s = String::new();
    for i in 0..n {
        s.push_str(&format!("<tool_call>{{\"n\": {i}}}</tool_call>\n"));
    }
    s.push_str("<content>done</content>");
    s
}

/// The input cut into chunks of `size` bytes, as a fallible byte stream.
fn chunked(text: &str, size: usize) -> impl futures::Stream<Item = Result<Vec<u8>, std::io::Error>> + use<> {
    let chunks: Vec<Vec<u8>> = text.as_bytes().chunks(size).map(<[u8]>::to_vec).collect();
    stream::iter(chunks.into_iter().map(Ok))
}

fn shared<T>() -> Arc<Mutex<Vec<T>>> {
    Arc::new(Mutex::new(Vec::new()))
}

fn take<T: Clone>(v: &Arc<Mutex<Vec<T>>>) -> Vec<T> {
    v.lock().unwrap().clone()
}

/// Fails the test instead of hanging it.
async fn within<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(20), f).await.expect("test timed out")
}

#[tokio::test]
async fn slow_handler_with_wait_policy_loses_nothing() {
    const N: usize = 40;
    // Capacity 2: the handler falls behind at once, so dispatch must wait.
    let mut router = Router::with_options(RouterOptions::new().capacity(2));
    let seen = shared();
    let s = seen.clone();
    let slow = router.on("tool_call", move |el| {
        let s = s.clone();
        async move {
            tokio::time::sleep(Duration::from_millis(2)).await;
            s.lock().unwrap().push(el.text.clone());
        }
    });
    // A fast catch-all beside it sees everything too.
    let all = shared();
    let a = all.clone();
    router.on_all(move |el| {
        let a = a.clone();
        async move { a.lock().unwrap().push(el.tag.to_string()) }
    });

    let input = tool_calls(N);
    let report = within(router.run(Parser::new(Registry::filament()), chunked(&input, 5))).await.unwrap();

    let expected: Vec<String> = (0..N).map(|i| format!("{{\"n\": {i}}}")).collect();
    assert_eq!(take(&seen), expected, "every element, in order");
    assert_eq!(take(&all).len(), N + 1);
    let r = &report.routing;
    assert_eq!(r.dropped(), 0);
    assert!(r.is_clean(), "{r}");
    let h = r.handler(slow).unwrap();
    assert_eq!((h.received, h.succeeded, h.errors, h.panics), (N as u64, N as u64, 0, 0));
    let sub = r.subscription(h.subscription).unwrap();
    assert_eq!((sub.delivered, sub.dropped, sub.capacity), (N as u64, 0, 2));
}

#[tokio::test]
async fn panicking_handler_leaves_the_others_running() {
    const N: usize = 12;
    let mut router = Router::new();
    let mut failures = router.subscribe_failures();

    // Panics on every element whose number is a multiple of 4, and keeps
    // receiving the ones after.
    let survived = shared();
    let s = survived.clone();
    let panicky = router.on_with("tool_call", SubscribeOptions::new().name("panicky"), move |el| {
        let s = s.clone();
        async move {
            let v: serde_json::Value = serde_json::from_str(&el.text).unwrap();
            let n = v["n"].as_u64().unwrap() as usize;
            if n.is_multiple_of(4) {
                panic!("boom at {n}");
            }
            s.lock().unwrap().push(n);
        }
    });
    // Returns an error on odd numbers.
    let erring = router.on_with("tool_call", SubscribeOptions::new().name("erring"), |el| async move {
        if el.id % 2 == 1 { Err(format!("odd element {}", el.id)) } else { Ok(()) }
    });
    // A well-behaved handler must see every element.
    let calm = shared();
    let c = calm.clone();
    router.on_all(move |el| {
        let c = c.clone();
        async move { c.lock().unwrap().push(el.id) }
    });

    let input = tool_calls(N);
    let report = within(router.run(Parser::new(Registry::filament()), chunked(&input, 7))).await.unwrap().routing;

    // The calm handler saw all N + 1 elements; the stream ran to the end.
    assert_eq!(take(&calm), (0..=N as u32).collect::<Vec<_>>());
    // The panicking handler got every element after each panic.
    let expected: Vec<usize> = (0..N).filter(|n| !n.is_multiple_of(4)).collect();
    assert_eq!(take(&survived), expected);

    let p = report.handler(panicky).unwrap();
    assert_eq!(p.received, N as u64);
    assert_eq!(p.panics, 3);
    assert_eq!(p.succeeded, N as u64 - 3);
    let e = report.handler(erring).unwrap();
    assert_eq!((e.errors, e.succeeded), (6, 6));
    assert_eq!(report.failure_count(), 9);
    assert_eq!(report.failures.len(), 9);

    let panics: Vec<_> = report
        .failures
        .iter()
        .filter(|f| f.kind == FailureKind::Panic)
        .map(|f| (f.label.as_str(), f.message.as_str(), f.tag.as_deref()))
        .collect();
    assert_eq!(
        panics,
        [
            ("panicky", "boom at 0", Some("tool_call")),
            ("panicky", "boom at 4", Some("tool_call")),
            ("panicky", "boom at 8", Some("tool_call")),
        ]
    );
    assert!(
        report
            .failures
            .iter()
            .any(|f| f.kind == FailureKind::Error && f.message == "odd element 1" && f.element == Some(1))
    );

    // The failure subscription got the same failures, then ended.
    let mut received = Vec::new();
    while let Some(f) = within(failures.recv()).await {
        received.push(f);
    }
    let mut from_report = report.failures.clone();
    let key = |f: &spindle::route::HandlerFailure| (f.handler, f.element);
    received.sort_by_key(key);
    from_report.sort_by_key(key);
    assert_eq!(received, from_report);
}

#[tokio::test]
async fn element_reaches_its_handler_before_the_stream_ends() {
    // The input yields a complete tool call, then blocks until the
    // handler of that tool call has run. If elements were only routed at
    // the end of input, this would never finish.
    let (fire, fired) = tokio::sync::oneshot::channel::<u32>();
    let fire = Arc::new(Mutex::new(Some(fire)));
    let ended = Arc::new(AtomicBool::new(false));

    let mut router = Router::new();
    let saw_end = shared();
    let (f, e, s) = (fire.clone(), ended.clone(), saw_end.clone());
    router.on("tool_call", move |el| {
        let (f, e, s) = (f.clone(), e.clone(), s.clone());
        async move {
            s.lock().unwrap().push(e.load(Ordering::SeqCst));
            if let Some(tx) = f.lock().unwrap().take() {
                let _ = tx.send(el.id);
            }
        }
    });

    enum Step {
        First(tokio::sync::oneshot::Receiver<u32>),
        Wait(tokio::sync::oneshot::Receiver<u32>),
        Done,
    }
    let end_flag = ended.clone();
    let input = stream::unfold(Step::First(fired), move |step| {
        let end_flag = end_flag.clone();
        async move {
            match step {
                Step::First(fired) => Some((
                    Ok::<_, std::io::Error>(
                        b"<thought>calling</thought><tool_call>{\"name\":\"w\"}</tool_call>".to_vec(),
                    ),
                    Step::Wait(fired),
                )),
                Step::Wait(rx) => {
                    let id = rx.await.map_err(std::io::Error::other);
                    Some((id.map(|id| format!("<content>tool {id} ran</content>").into_bytes()), Step::Done))
                }
                Step::Done => {
                    end_flag.store(true, Ordering::SeqCst);
                    None
                }
            }
        }
    });
    let mut contents = router.subscribe("content");
    let report = within(router.run(Parser::new(Registry::filament()), input)).await.unwrap();

    assert_eq!(take(&saw_end), [false], "handler ran while the input was open");
    assert_eq!(contents.recv().await.unwrap().text, "tool 1 ran");
    assert_eq!(report.chunks, 2);
    assert!(report.routing.is_clean());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn element_reaches_its_handler_before_the_stream_ends_multi_thread() {
    // Same proof with `feed` on a multi-threaded runtime: the handler's
    // answer is awaited between two chunks.
    let (tx, mut rx) = tokio::sync::mpsc::channel::<String>(1);
    let mut router = Router::new();
    router.on("variable_update", move |el| {
        let tx = tx.clone();
        async move { tx.send(el.text.clone()).await }
    });
    let mut parser = Parser::new(Registry::filament());
    router.feed(&mut parser, b"<content>hi</content><variable_update>[[\"SET\",\"a\",1]]").await;
    router.feed(&mut parser, b"</variable_update>").await;
    let got = within(rx.recv()).await.unwrap();
    assert_eq!(got, "[[\"SET\",\"a\",1]]");
    router.feed(&mut parser, b"<content>more</content>").await;
    router.end(parser).await;
    let report = within(router.finish()).await;
    assert_eq!(report.elements, 3);
}

#[tokio::test]
async fn handler_error_messages_keep_their_sources() {
    let mut router = Router::new();
    router.on("content", |_| async {
        let io = std::io::Error::other("disk full");
        Err::<(), _>(anyhow::Error::new(io).context("saving the reply"))
    });
    router.dispatch_all(spindle::parse(Registry::filament(), b"<content>x</content>")).await;
    let report = within(router.finish()).await;
    assert_eq!(report.failures.len(), 1);
    assert_eq!(report.failures[0].message, "saving the reply: disk full");
    assert_eq!(report.failures[0].kind, FailureKind::Error);
}

#[tokio::test]
async fn failure_handler_sees_every_failure_and_finish_does_not_deadlock() {
    let mut router = Router::new();
    router.on("tool_call", |el| async move {
        if el.id == 1 {
            panic!("second call broke");
        }
        Err::<(), _>("always fails")
    });
    let logged = shared();
    let l = logged.clone();
    let failures = router.subscribe_to(spindle::route::Topic::failures(), SubscribeOptions::new().capacity(1));
    // A failure handler that itself fails: recorded, not re-published.
    router.handle(failures, move |f| {
        let l = l.clone();
        async move {
            l.lock().unwrap().push(f.to_string());
            Err::<(), _>("logger broke too")
        }
    });
    let report =
        within(router.run(Parser::new(Registry::filament()), chunked(&tool_calls(5), 3))).await.unwrap().routing;
    let logged = take(&logged);
    assert_eq!(logged.len(), 5, "{logged:?}");
    assert!(logged.iter().any(|l| l.contains("panicked on tool_call #1: second call broke")));
    // 5 from the tool handler, 5 from the logger itself.
    assert_eq!(report.failure_count(), 10);
}

#[tokio::test]
async fn drain_timeout_aborts_a_stuck_handler_and_reports_it() {
    let options = RouterOptions::new().capacity(8).drain_timeout(Duration::from_millis(100));
    let mut router = Router::with_options(options);
    let stuck = router.on("tool_call", |_| std::future::pending::<()>());
    let fine = router.on("content", |_| async {});
    let report =
        within(router.run(Parser::new(Registry::filament()), chunked(&tool_calls(3), 64))).await.unwrap().routing;
    let s = report.handler(stuck).unwrap();
    assert!(s.aborted);
    assert_eq!(s.received, 1);
    assert_eq!(s.unhandled, 3, "one in flight, two queued");
    assert!(!report.handler(fine).unwrap().aborted);
    assert!(!report.is_clean());
}

#[tokio::test]
async fn handlers_keep_state_and_subscriptions_stream() {
    // FnMut handlers may keep state between calls.
    let mut router = Router::new();
    let total = Arc::new(Mutex::new(0usize));
    let t = total.clone();
    let mut count = 0usize;
    router.on("tool_call", move |_| {
        count += 1;
        *t.lock().unwrap() = count;
        async {}
    });
    let texts = router.subscribe("tool_call");
    let collected = tokio::spawn(texts.map(|el| el.id).collect::<Vec<_>>());
    within(router.run(Parser::new(Registry::filament()), chunked(&tool_calls(6), 1))).await.unwrap();
    assert_eq!(*total.lock().unwrap(), 6);
    assert_eq!(collected.await.unwrap(), (0..6).collect::<Vec<u32>>());
}

#[tokio::test]
async fn dropping_the_router_ends_every_handler_task() {
    let mut router = Router::new();
    router.on("content", |_| async { Err::<(), _>("fails") });
    // Each handler owns a guard; its receiver sees `None` once the
    // handler's task (and with it the closure) is gone.
    let (guard, mut gone) = tokio::sync::mpsc::channel::<()>(1);
    let failures = router.subscribe_failures();
    let g = guard.clone();
    router.handle(failures, move |_| {
        let _g = g.clone();
        async {}
    });
    let g = guard;
    router.on_all(move |_| {
        let _g = g.clone();
        async {}
    });
    router.dispatch_all(spindle::parse(Registry::filament(), b"<content>x</content>")).await;
    drop(router);
    assert_eq!(within(gone.recv()).await, None);
}
