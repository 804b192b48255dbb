//! Router subscriptions: drop-newest counting, catch-all order against
//! `spindle::parse` as the oracle (whole, byte by byte, in 7-byte chunks
//! and at random split points), deltas joining into element text, topics,
//! aliases, dropped receivers, cancel safety and input errors.

use futures::StreamExt;
use futures::stream;
use proptest::prelude::*;
use spindle::event::{Element, Event};
use spindle::route::{Backpressure, Router, RouterOptions, SubscribeOptions, Topic};
use spindle::{Parser, Registry};
use std::sync::Arc;
use std::time::Duration;

const RESPONSE: &str = "Let me think about the forest.\n</thought>\n\
<content>「在这片黑暗森林中，你要特别小心。」\n<!-- aside -->\nWatch out.</content>\n\
<variable_update><analysis>mood drops</analysis>[[\"SUB\", \"mood.value\", 1]]</variable_update>\n\
<tool_call name=\"weather\">{\"location\": \"ruins\", \"days\": 3}</tool_call>\n\
<content>More text.</content><status_bar><mood>anxious</mood></status_bar>\n\
<media type=\"image\" src=\"a.jpg\" alt=\"x\" /><content>tail, never closed";

fn elements_of(events: &[Event]) -> Vec<Element> {
    events.iter().filter_map(Event::as_element).cloned().collect()
}

async fn within<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(20), f).await.expect("test timed out")
}

/// Feeds `input` split at `cuts` through a router and returns what the
/// catch-all, the event topic and the thought/content delta topics got.
async fn route_split(input: &[u8], cuts: &[usize]) -> (Vec<Element>, Vec<Event>, String, String) {
    let mut router = Router::new();
    let all = router.subscribe_all();
    let events = router.subscribe_to(Topic::events(), SubscribeOptions::new());
    let thought = router.subscribe_deltas("thought");
    let content = router.subscribe_deltas("content");
    let all = tokio::spawn(all.map(|e| Element::clone(&e)).collect::<Vec<_>>());
    let events = tokio::spawn(events.collect::<Vec<_>>());
    let join = |s: spindle::route::Subscription<spindle::event::Delta>| {
        tokio::spawn(s.fold(String::new(), |mut acc, d| async move {
            acc.push_str(&d.text);
            acc
        }))
    };
    let (thought, content) = (join(thought), join(content));

    let mut parser = Parser::new(Registry::filament());
    let mut start = 0;
    for &cut in cuts.iter().chain(std::iter::once(&input.len())) {
        let cut = cut.clamp(start, input.len());
        router.feed(&mut parser, &input[start..cut]).await;
        start = cut;
    }
    router.end(parser).await;
    let report = within(router.finish()).await;
    assert!(report.is_clean());
    (all.await.unwrap(), events.await.unwrap(), thought.await.unwrap(), content.await.unwrap())
}

#[tokio::test]
async fn catch_all_sees_every_element_in_order_at_chunk_sizes_whole_1_and_7() {
    let oracle = spindle::parse(Registry::filament(), RESPONSE.as_bytes());
    let want = elements_of(&oracle);
    assert!(want.len() >= 8, "fixture has many elements");
    let n = RESPONSE.len();
    for size in [n, 1, 7] {
        let cuts: Vec<usize> = (size..n).step_by(size).collect();
        let (all, events, _, _) = route_split(RESPONSE.as_bytes(), &cuts).await;
        assert_eq!(all, want, "chunk size {size}");
        // The events topic is the parser's own output in order (deltas and
        // call deltas may be split differently, so compare everything else).
        let no_deltas = |v: &[Event]| -> Vec<Event> {
            v.iter().filter(|e| !matches!(e, Event::Delta(_) | Event::CallDelta(_))).cloned().collect()
        };
        assert_eq!(no_deltas(&events), no_deltas(&oracle), "chunk size {size}");
    }
}

#[tokio::test]
async fn content_deltas_join_into_the_element_text() {
    // Thought and content without inline HTML: their deltas join into the
    // element text exactly (the content filter of the payload stage may
    // rewrite markup in deltas, so the fixture has none).
    let input = "<thought>step one, step two</thought>\n<content>Hello, \u{4e16}\u{754c}! Line two.</content>\n<content>merged</content>";
    let want = elements_of(&spindle::parse(Registry::filament(), input.as_bytes()));
    let join_of = |tag: &str| -> String { want.iter().filter(|e| &*e.tag == tag).map(|e| e.text.as_str()).collect() };
    for cuts in [vec![], (1..input.len()).collect::<Vec<_>>(), vec![3, 17, 40, 41, 42]] {
        let (_, _, thought, content) = route_split(input.as_bytes(), &cuts).await;
        assert_eq!(thought, join_of("thought"));
        assert_eq!(content, join_of("content"));
        assert_eq!(content, "Hello, \u{4e16}\u{754c}! Line two.merged");
    }
}

/// An answer written without tags opens the lead (thought) and streams as
/// it; when it proves to be content (at its end), the content delta topic
/// gets it all the same, filtered, whole and at any chunking; what comes
/// after it too.
#[tokio::test]
async fn an_answer_without_tags_reaches_the_content_deltas() {
    let input = "Hello <b>there</b>, <script>x()</script>how are you?";
    let want = elements_of(&spindle::parse(Registry::filament(), input.as_bytes()));
    assert_eq!(want.len(), 1);
    assert_eq!(&*want[0].tag, "content");
    let html = want[0].payload["html"].as_str().unwrap_or_default().to_string();
    assert!(html.starts_with("Hello <b>there</b>, ") && !html.contains("<script"), "{html}");
    for cuts in [vec![], (1..input.len()).collect::<Vec<_>>(), vec![3, 17, 40]] {
        let (_, _, thought, content) = route_split(input.as_bytes(), &cuts).await;
        assert_eq!(thought, input, "streamed as the lead first");
        assert_eq!(content, html, "then given again as content, filtered (cuts {cuts:?})");
    }
    // The lead proved to be content before its end (a variable_update
    // comes after content only): the content topic gets it, and the
    // content after.
    let input = "Hi <i>there</i>.\n<variable_update>[[\"SET\", \"mood\", \"calm\"]]</variable_update>\n<content>Later.</content>";
    let want = elements_of(&spindle::parse(Registry::filament(), input.as_bytes()));
    let content_text: String =
        want.iter().filter(|e| &*e.tag == "content").map(|e| e.payload["html"].as_str().unwrap_or_default()).collect();
    assert_eq!(content_text, "Hi <i>there</i>.\nLater.");
    for cuts in [vec![], (1..input.len()).collect::<Vec<_>>()] {
        let (_, _, _, content) = route_split(input.as_bytes(), &cuts).await;
        assert_eq!(content, content_text, "cuts {cuts:?}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]
    #[test]
    fn catch_all_matches_parse_at_any_split(mut cuts in proptest::collection::vec(0..RESPONSE.len(), 0..12)) {
        cuts.sort_unstable();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let (all, _, thought, _) = rt.block_on(route_split(RESPONSE.as_bytes(), &cuts));
        let want = elements_of(&spindle::parse(Registry::filament(), RESPONSE.as_bytes()));
        prop_assert_eq!(&all, &want);
        let thought_text: String = want.iter().filter(|e| &*e.tag == "thought").map(|e| e.text.as_str()).collect();
        prop_assert_eq!(thought, thought_text);
    }
}

#[tokio::test]
async fn drop_newest_counts_every_drop_and_keeps_the_oldest() {
    let mut router = Router::new();
    let mut preview = router
        .subscribe_to(Topic::elements("tool_call"), SubscribeOptions::new().capacity(3).drop_newest().name("preview"));
    // A Wait subscription beside it, read after the stream: capacity 16
    // holds all ten, so nothing waits.
    let mut lossless = router.subscribe_to(Topic::elements("tool_call"), SubscribeOptions::new().capacity(16));
    let mut input = String::new();
    for i in 0..10 {
        input.push_str(&format!("<tool_call>{i}</tool_call>"));
    }
    router.dispatch_all(&spindle::parse(Registry::filament(), input.as_bytes())).await;
    assert_eq!(preview.dropped(), 7);
    let mid = router.report();
    let line = mid.subscription(preview.id()).unwrap();
    assert_eq!((line.delivered, line.dropped, line.policy), (3, 7, Backpressure::DropNewest));
    assert_eq!(mid.dropped(), 7);

    // After a read makes room, the next element fits again.
    assert_eq!(preview.recv().await.unwrap().text, "0");
    router.dispatch_all(spindle::parse(Registry::filament(), b"<tool_call>10</tool_call>")).await;
    let report = within(router.finish()).await;
    let mut kept = Vec::new();
    while let Some(el) = preview.recv().await {
        kept.push(el.text.clone());
    }
    assert_eq!(kept, ["1", "2", "10"]);
    let line = report.subscription(preview.id()).unwrap();
    assert_eq!((line.delivered, line.dropped), (4, 7));
    assert_eq!(line.name.as_deref(), Some("preview"));
    assert_eq!(report.dropped(), 7);
    assert!(!report.is_clean());
    let mut all = 0;
    while lossless.recv().await.is_some() {
        all += 1;
    }
    assert_eq!(all, 11);
}

#[tokio::test]
async fn same_element_is_shared_between_subscribers() {
    let mut router = Router::new();
    let mut a = router.subscribe("content");
    let mut b = router.subscribe_all();
    router.dispatch_all(spindle::parse(Registry::filament(), b"<content>x</content>")).await;
    let (a, b) = (a.recv().await.unwrap(), b.recv().await.unwrap());
    assert!(Arc::ptr_eq(&a, &b));
}

#[tokio::test]
async fn repair_diagnostic_and_comment_topics() {
    let input = b"Hmm.</thought><content>a <!-- hidden --> b</content><tool_call>{}</tool_call></bogus><content>open";
    let oracle = spindle::parse(Registry::filament(), input);
    let mut router = Router::new();
    let repairs = router.subscribe_to(Topic::repairs(), SubscribeOptions::new());
    let diags = router.subscribe_to(Topic::diagnostics(), SubscribeOptions::new());
    let comments = router.subscribe_to(Topic::comments(), SubscribeOptions::new());
    router.dispatch_all(&oracle).await;
    let report = within(router.finish()).await;
    let got_repairs: Vec<_> = repairs.collect().await;
    let got_diags: Vec<_> = diags.collect().await;
    let got_comments: Vec<_> = comments.collect().await;
    let want_repairs: Vec<_> = oracle
        .iter()
        .filter_map(|e| match e {
            Event::Repair(r) => Some((**r).clone()),
            _ => None,
        })
        .collect();
    let want_diags: Vec<_> = oracle
        .iter()
        .filter_map(|e| match e {
            Event::Diagnostic(d) => Some(d.clone()),
            _ => None,
        })
        .collect();
    assert!(want_repairs.len() >= 3, "header, stray close, closed at eof");
    assert_eq!(got_repairs, want_repairs);
    assert_eq!(got_diags, want_diags);
    assert_eq!(got_comments.len(), 1);
    assert_eq!(got_comments[0].text, " hidden ");
    assert_eq!(report.events, oracle.len() as u64);
}

#[tokio::test]
async fn aliases_resolve_through_the_registry() {
    let mut router = Router::for_registry(Registry::filament());
    let think = router.subscribe("THINK");
    let updates = router.subscribe("UpdateVariable");
    let deltas = router.subscribe_deltas("thinking");
    assert_eq!(think.topic(), "element:thought");
    assert_eq!(updates.topic(), "element:variable_update");
    assert_eq!(deltas.topic(), "delta:thought");
    let input = b"<think>hm</think><content>c</content><UpdateVariable>[]</UpdateVariable>";
    router.dispatch_all(spindle::parse(Registry::filament(), input)).await;
    drop(router);
    let think: Vec<_> = think.map(|e| e.raw_tag.to_string()).collect().await;
    let updates: Vec<_> = updates.map(|e| e.raw_tag.to_string()).collect().await;
    assert_eq!(think, ["think"]);
    assert_eq!(updates, ["UpdateVariable"]);
    // Without a registry a name matches the canonical tag, ignoring case.
    let mut plain = Router::new();
    let mut upper = plain.subscribe("Tool_Call");
    plain.dispatch_all(spindle::parse(Registry::filament(), b"<tool_call>{}</tool_call>")).await;
    assert_eq!(upper.recv().await.unwrap().tag.as_ref(), "tool_call");
}

#[tokio::test]
async fn a_dropped_subscription_never_blocks_the_stream() {
    let mut router = Router::with_options(RouterOptions::new().capacity(1));
    let gone = router.subscribe("content");
    let gone_id = gone.id();
    drop(gone);
    let mut kept = router.subscribe_to(Topic::elements("content"), SubscribeOptions::new().capacity(8));
    let input = "<content>a</content><tool_call>{}</tool_call><content>b</content><tool_call>{}</tool_call><content>c</content>";
    within(router.dispatch_all(spindle::parse(Registry::filament(), input.as_bytes()))).await;
    let report = within(router.finish()).await;
    let line = report.subscription(gone_id).unwrap();
    assert_eq!((line.delivered, line.undelivered), (0, 3));
    let mut n = 0;
    while kept.recv().await.is_some() {
        n += 1;
    }
    assert_eq!(n, 3);
}

#[tokio::test]
async fn cancelled_dispatch_delivers_to_no_subscription() {
    let mut router = Router::with_options(RouterOptions::new().capacity(1));
    let mut fast = router.subscribe_to(Topic::elements("content"), SubscribeOptions::new().capacity(8));
    let mut full = router.subscribe("content");
    let events =
        spindle::parse(Registry::filament(), b"<content>a</content><tool_call>{}</tool_call><content>b</content>");
    let contents: Vec<&Event> =
        events.iter().filter(|e| matches!(e, Event::Element(el) if &*el.tag == "content")).collect();
    router.dispatch(contents[0]).await;
    // `full` holds one item and is not read: this dispatch waits, and is
    // cancelled by the timeout.
    let waited = tokio::time::timeout(Duration::from_millis(50), router.dispatch(contents[1])).await;
    assert!(waited.is_err(), "dispatch had to wait");
    assert_eq!(fast.try_recv().unwrap().text, "a");
    assert!(fast.try_recv().is_err(), "the cancelled dispatch reached no one");
    assert_eq!(router.report().events, 1);

    // Make room and dispatch again: each subscriber gets it exactly once.
    assert_eq!(full.recv().await.unwrap().text, "a");
    within(router.dispatch(contents[1])).await;
    assert_eq!(fast.try_recv().unwrap().text, "b");
    assert_eq!(full.try_recv().unwrap().text, "b");
    assert!(fast.try_recv().is_err());
    assert_eq!(router.report().events, 2);
}

#[tokio::test]
async fn cancelled_feed_keeps_undispatched_events() {
    let mut router = Router::with_options(RouterOptions::new().capacity(1));
    let mut all = router.subscribe_all();
    let mut parser = Parser::new(Registry::filament());
    let input = b"<thought>t</thought><content>c</content><tool_call>{}</tool_call><media src=\"x\"/>";
    // Capacity 1 and nobody reading: feed stalls after the first element.
    let fed = tokio::time::timeout(Duration::from_millis(50), router.feed(&mut parser, input)).await;
    assert!(fed.is_err());
    let mut got = vec![all.recv().await.unwrap().tag.to_string()];
    let reader = tokio::spawn(async move {
        while let Some(el) = all.recv().await {
            got.push(el.tag.to_string());
        }
        got
    });
    router.end(parser).await;
    within(router.finish()).await;
    assert_eq!(reader.await.unwrap(), ["thought", "content", "tool_call", "media"]);
}

#[tokio::test]
async fn input_error_still_routes_what_arrived_and_returns_the_report() {
    let mut router = Router::new();
    let all = router.subscribe_all();
    let all = tokio::spawn(all.map(|e| (e.tag.to_string(), e.text.clone())).collect::<Vec<_>>());
    let input = stream::iter(vec![
        Ok(b"<thought>t</thought><content>partial ".to_vec()),
        Err(std::io::Error::new(std::io::ErrorKind::ConnectionReset, "peer went away")),
        Ok(b"never read</content>".to_vec()),
    ]);
    let err = within(router.run(Parser::new(Registry::filament()), input)).await.unwrap_err();
    assert_eq!(err.error.kind(), std::io::ErrorKind::ConnectionReset);
    assert_eq!(err.report.chunks, 1);
    assert!(err.to_string().contains("peer went away"), "{err}");
    assert_eq!(
        all.await.unwrap(),
        [("thought".to_string(), "t".to_string()), ("content".to_string(), "partial ".to_string())]
    );
    assert_eq!(err.report.routing.elements, 2);
}

#[tokio::test]
async fn run_reader_reads_in_configured_chunks() {
    const PARTS: [&str; 3] = ["<thought>slow", "ly</thought>", "<content>ok</content>"];
    let (mut writer, reader) = tokio::io::duplex(16);
    let writer = tokio::spawn(async move {
        use tokio::io::AsyncWriteExt;
        for part in PARTS {
            writer.write_all(part.as_bytes()).await.unwrap();
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    let mut router = Router::with_options(RouterOptions::new().read_chunk(4));
    let all = router.subscribe_all();
    let all = tokio::spawn(all.map(|e| e.text.clone()).collect::<Vec<_>>());
    let report = within(router.run_reader(Parser::new(Registry::filament()), reader)).await.unwrap();
    writer.await.unwrap();
    assert_eq!(all.await.unwrap(), ["slowly", "ok"]);
    let total: usize = PARTS.iter().map(|p| p.len()).sum();
    assert_eq!(report.input_bytes, total as u64);
    assert!(report.chunks >= 12, "4-byte reads: {}", report.chunks);
}

#[tokio::test]
async fn report_serializes_to_json() {
    let mut router = Router::new();
    router.on("content", |_| async { Err::<(), _>("nope") });
    let _keep = router.subscribe_to(Topic::all_deltas(), SubscribeOptions::new().drop_newest().capacity(1));
    router.dispatch_all(spindle::parse(Registry::filament(), b"<content>hello</content>")).await;
    let report = within(router.finish()).await;
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["elements"], 1);
    assert_eq!(json["subscriptions"][0]["topic"], "element:content");
    assert_eq!(json["subscriptions"][1]["policy"], "drop_newest");
    assert_eq!(json["failures"][0]["kind"], "error");
    assert_eq!(json["failures"][0]["message"], "nope");
    let text = report.to_string();
    assert!(text.contains("1 errors"), "{text}");
}
