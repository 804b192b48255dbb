//! The SSE decoder against the WHATWG rules: a table of named cases, each
//! fed whole, byte by byte, and at every 2- and 3-way split; a naive
//! whole-buffer oracle compared by proptest; the limits and resync.

use proptest::prelude::*;
use spindle::sources::{SseDecoder, SseEvent, SseFault, SseItem, SseLimits};

fn decode_chunks(chunks: &[&[u8]], limits: SseLimits) -> Vec<SseItem> {
    let mut d = SseDecoder::with_limits(limits);
    let mut out = Vec::new();
    for c in chunks {
        d.feed_into(c, &mut out);
    }
    d.finish_into(&mut out);
    out
}

fn decode(input: &[u8]) -> Vec<SseItem> {
    decode_chunks(&[input], SseLimits::default())
}

/// Every 1-byte, 2-way and 3-way split of `input` decodes like the whole.
fn assert_split_invariant(name: &str, input: &[u8], limits: SseLimits) {
    let whole = decode_chunks(&[input], limits);
    let bytes: Vec<&[u8]> = input.chunks(1).collect();
    assert_eq!(decode_chunks(&bytes, limits), whole, "{name}: byte by byte");
    for i in 0..=input.len() {
        let (a, b) = input.split_at(i);
        assert_eq!(decode_chunks(&[a, b], limits), whole, "{name}: split at {i}");
        for j in i..=input.len() {
            let (b1, c) = input[i..].split_at(j - i);
            assert_eq!(decode_chunks(&[a, b1, c], limits), whole, "{name}: split at {i},{j}");
        }
    }
}

fn ev(event: &str, data: &str, id: &str, at: usize) -> SseItem {
    SseItem::Event(SseEvent { event: event.into(), data: data.into(), id: id.into(), retry: None, at })
}

fn msg(data: &str, at: usize) -> SseItem {
    ev("message", data, "", at)
}

/// The rules, one named case each: input and the exact items expected.
fn cases() -> Vec<(&'static str, &'static [u8], Vec<SseItem>)> {
    let with_retry = |mut item: SseItem, ms: u64| {
        if let SseItem::Event(e) = &mut item {
            e.retry = Some(ms);
        }
        item
    };
    vec![
        ("lf", b"data: a\n\ndata: b\n\n", vec![msg("a", 0), msg("b", 9)]),
        ("crlf", b"data: a\r\n\r\ndata: b\r\n\r\n", vec![msg("a", 0), msg("b", 11)]),
        ("lone_cr", b"data: a\r\rdata: b\r\r", vec![msg("a", 0), msg("b", 9)]),
        ("mixed_line_ends", b"data: a\r\ndata: b\rdata: c\n\r\n", vec![msg("a\nb\nc", 0)]),
        ("cr_then_lf_is_one_end", b"data: a\r\n\n", vec![msg("a", 0)]),
        ("bom_stripped", b"\xEF\xBB\xBFdata: a\n\n", vec![msg("a", 0)]),
        (
            "bom_only_once",
            b"\xEF\xBB\xBF\xEF\xBB\xBFdata: a\n\ndata: b\n\n",
            // The second BOM is part of the first line's field name.
            vec![SseItem::Fault(SseFault::IgnoredField { field: "\u{feff}data".into(), at: 0 }), msg("b", 12)],
        ),
        (
            "bom_prefix_is_text",
            b"\xEF\xBBx\n",
            vec![SseItem::Fault(SseFault::IgnoredField { field: "\u{FFFD}x".into(), at: 0 })],
        ),
        (
            "comments_ignored",
            b": ping\n:OPENROUTER PROCESSING\ndata: a\n\n",
            vec![
                SseItem::Comment { text: " ping".into(), at: 0 },
                SseItem::Comment { text: "OPENROUTER PROCESSING".into(), at: 7 },
                msg("a", 30),
            ],
        ),
        ("no_space", b"data:x\n\n", vec![msg("x", 0)]),
        ("one_space_stripped", b"data:  x\n\n", vec![msg(" x", 0)]),
        ("multi_line_data", b"data: a\ndata:\ndata: b\n\n", vec![msg("a\n\nb", 0)]),
        ("field_without_colon", b"data\ndata\n\n", vec![msg("\n", 0)]),
        ("empty_data_dispatched", b"data:\n\n", vec![msg("", 0)]),
        ("event_type", b"event: error\ndata: x\n\n", vec![ev("error", "x", "", 0)]),
        ("event_type_resets", b"event: e\ndata: 1\n\ndata: 2\n\n", vec![ev("e", "1", "", 0), msg("2", 18)]),
        (
            "id_persists",
            b"id: 7\ndata: a\n\ndata: b\n\n",
            vec![ev("message", "a", "7", 0), ev("message", "b", "7", 15)],
        ),
        (
            "id_with_nul_ignored",
            b"id: 1\ndata: a\n\nid: x\0y\ndata: b\n\n",
            vec![ev("message", "a", "1", 0), ev("message", "b", "1", 15)],
        ),
        ("retry_digits", b"retry: 1500\ndata: a\n\n", vec![with_retry(msg("a", 0), 1500)]),
        ("retry_not_digits", b"retry: 1s\ndata: a\n\n", vec![msg("a", 0)]),
        ("no_data_not_dispatched", b"event: x\nid: 3\n\ndata: a\n\n", vec![ev("message", "a", "3", 16)]),
        ("blank_lines_alone", b"\n\n\r\n\r\r", vec![]),
        (
            "unknown_field",
            b" data: x\nfoo: 1\ndata: y\n\n",
            vec![
                SseItem::Fault(SseFault::IgnoredField { field: " data".into(), at: 0 }),
                SseItem::Fault(SseFault::IgnoredField { field: "foo".into(), at: 9 }),
                msg("y", 0),
            ],
        ),
        (
            "eof_without_blank_line",
            b"data: a\n\ndata: b\n",
            vec![
                msg("a", 0),
                SseItem::Unterminated(SseEvent {
                    event: "message".into(),
                    data: "b".into(),
                    id: String::new(),
                    retry: None,
                    at: 9,
                }),
            ],
        ),
        (
            "eof_mid_line",
            b"data: [DONE]",
            vec![SseItem::Unterminated(SseEvent {
                event: "message".into(),
                data: "[DONE]".into(),
                id: String::new(),
                retry: None,
                at: 0,
            })],
        ),
        ("eof_after_fields_without_data", b"data: a\n\nevent: x\n", vec![msg("a", 0)]),
        ("utf8_split_anywhere", "data: 名前→é\n\n".as_bytes(), vec![msg("名前→é", 0)]),
        (
            "invalid_utf8_replaced",
            b"data: a\xFFb\n\n",
            vec![SseItem::Fault(SseFault::InvalidUtf8 { at: 0 }), msg("a\u{FFFD}b", 0)],
        ),
        ("colon_in_value", b"data: {\"a\":\"b:c\"}\n\n", vec![msg("{\"a\":\"b:c\"}", 0)]),
    ]
}

#[test]
fn rules_whole_and_at_every_split() {
    for (name, input, expected) in cases() {
        assert_eq!(decode(input), expected, "case {name}");
        assert_split_invariant(name, input, SseLimits::default());
    }
}

#[test]
fn offsets_count_from_after_the_bom() {
    let got = decode(b"\xEF\xBB\xBFdata: a\n\ndata: b\n\n");
    assert_eq!(got, vec![msg("a", 0), msg("b", 9)]);
}

#[test]
fn reconnection_time_and_last_id_are_kept() {
    let mut d = SseDecoder::new();
    let items = d.feed(b"retry: 250\nid: abc\n\n");
    assert!(items.is_empty(), "no data, no event: {items:?}");
    assert_eq!(d.reconnection_time(), Some(250));
    assert_eq!(d.last_event_id(), "abc");
}

const SMALL: SseLimits = SseLimits { max_line_len: 16, max_event_len: 24 };

#[test]
fn line_too_long_drops_its_event_and_resyncs() {
    let input = b"data: 0123456789abcdefXYZ\ndata: tail\n\ndata: ok\n\n";
    let got = decode_chunks(&[input], SMALL);
    assert_eq!(got, vec![SseItem::Fault(SseFault::LineTooLong { at: 0, limit: 16 }), msg("ok", 38),]);
    assert_split_invariant("line_too_long", input, SMALL);
}

#[test]
fn long_comment_line_does_not_drop_the_event() {
    let input = b"data: a\n: a very long keep-alive comment\ndata: b\n\n";
    let got = decode_chunks(&[input], SMALL);
    assert_eq!(got, vec![SseItem::Fault(SseFault::LineTooLong { at: 8, limit: 16 }), msg("a\nb", 0)]);
    assert_split_invariant("long_comment", input, SMALL);
}

#[test]
fn event_too_large_is_dropped_and_the_next_one_read() {
    let input = b"data: 0123456789\ndata: 0123456789\ndata: xyz\n\ndata: ok\n\n";
    let got = decode_chunks(&[input], SMALL);
    assert_eq!(got, vec![SseItem::Fault(SseFault::EventTooLarge { at: 0, limit: 24 }), msg("ok", 45)]);
    assert_split_invariant("event_too_large", input, SMALL);
}

#[test]
fn ten_megabyte_line_keeps_memory_bounded() {
    let limits = SseLimits { max_line_len: 1024 * 1024, max_event_len: 1024 * 1024 };
    let mut d = SseDecoder::with_limits(limits);
    let mut out = Vec::new();
    d.feed_into(b"data: ", &mut out);
    let block = vec![b'x'; 64 * 1024];
    let mut peak = 0;
    for _ in 0..160 {
        d.feed_into(&block, &mut out);
        peak = peak.max(d.held_bytes());
    }
    d.feed_into(b"\n\ndata: after\n\n", &mut out);
    d.finish_into(&mut out);
    assert!(peak <= 2 * 1024 * 1024, "held {peak} bytes for a 10 MB line");
    assert_eq!(
        out,
        vec![SseItem::Fault(SseFault::LineTooLong { at: 0, limit: 1024 * 1024 }), msg("after", 10 * 1024 * 1024 + 8)]
    );
}

/// A naive whole-buffer decoder written straight from the WHATWG text:
/// strip one BOM, split into lines, apply fields, dispatch on blank lines.
fn oracle(input: &[u8]) -> Vec<SseItem> {
    let input = input.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(input);
    // Lines with their start offsets; the last may lack a line end.
    let mut lines: Vec<(usize, &[u8], bool)> = Vec::new();
    let mut start = 0;
    let mut i = 0;
    while i < input.len() {
        match input[i] {
            b'\n' => {
                lines.push((start, &input[start..i], true));
                i += 1;
                start = i;
            }
            b'\r' => {
                lines.push((start, &input[start..i], true));
                i += if input.get(i + 1) == Some(&b'\n') { 2 } else { 1 };
                start = i;
            }
            _ => i += 1,
        }
    }
    if start < input.len() {
        lines.push((start, &input[start..], false));
    }
    let mut out = Vec::new();
    let (mut data, mut kind, mut last_id) = (String::new(), String::new(), String::new());
    let mut retry = None;
    let mut event_at: Option<usize> = None;
    let text = |bytes: &[u8], at: usize, out: &mut Vec<SseItem>| {
        let s = String::from_utf8_lossy(bytes).into_owned();
        if std::str::from_utf8(bytes).is_err() {
            out.push(SseItem::Fault(SseFault::InvalidUtf8 { at }));
        }
        s
    };
    for (at, line, _) in &lines {
        let at = *at;
        if line.is_empty() {
            if !data.is_empty() {
                data.pop();
                out.push(SseItem::Event(SseEvent {
                    event: if kind.is_empty() { "message".into() } else { kind.clone() },
                    data: std::mem::take(&mut data),
                    id: last_id.clone(),
                    retry,
                    at: event_at.unwrap_or(at),
                }));
            }
            data.clear();
            kind.clear();
            retry = None;
            event_at = None;
            continue;
        }
        if line[0] == b':' {
            let t = text(&line[1..], at, &mut out);
            out.push(SseItem::Comment { text: t, at });
            continue;
        }
        event_at.get_or_insert(at);
        let (field, value): (&[u8], &[u8]) = match line.iter().position(|&b| b == b':') {
            Some(c) => {
                let v = &line[c + 1..];
                (&line[..c], if v.first() == Some(&b' ') { &v[1..] } else { v })
            }
            None => (line, b""),
        };
        match field {
            b"data" => {
                let t = text(value, at, &mut out);
                data.push_str(&t);
                data.push('\n');
            }
            b"event" => kind = text(value, at, &mut out),
            b"id" if !value.contains(&0) => last_id = text(value, at, &mut out),
            b"id" => {}
            b"retry" => {
                if !value.is_empty() && value.iter().all(u8::is_ascii_digit) {
                    retry = std::str::from_utf8(value).ok().and_then(|s| s.parse().ok());
                }
            }
            other => out.push(SseItem::Fault(SseFault::IgnoredField {
                field: String::from_utf8_lossy(&other[..other.len().min(64)]).into_owned(),
                at,
            })),
        }
    }
    if !data.is_empty() {
        data.pop();
        out.push(SseItem::Unterminated(SseEvent {
            event: if kind.is_empty() { "message".into() } else { kind },
            data,
            id: last_id,
            retry,
            at: event_at.unwrap_or(0),
        }));
    }
    out
}

fn token() -> impl Strategy<Value = &'static [u8]> {
    prop::sample::select(vec![
        &b"data"[..],
        b"data:",
        b"data: ",
        b"event: ",
        b"id: ",
        b"retry: ",
        b"12",
        b":",
        b": ping",
        b" ",
        b"\n",
        b"\r",
        b"\r\n",
        b"\n\n",
        b"x",
        b"{\"a\":1}",
        b"[DONE]",
        b"error",
        b"\xEF\xBB\xBF",
        "é名".as_bytes(),
        b"\xFF",
        b"\0",
        b"foo",
    ])
}

proptest! {
    #[test]
    fn matches_the_naive_oracle_at_any_split(
        tokens in prop::collection::vec(token(), 0..40),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..6),
    ) {
        let input: Vec<u8> = tokens.concat();
        let mut points: Vec<usize> = cuts.iter().map(|c| c.index(input.len() + 1)).collect();
        points.sort_unstable();
        let mut chunks = Vec::new();
        let mut prev = 0;
        for p in points {
            chunks.push(&input[prev..p]);
            prev = p;
        }
        chunks.push(&input[prev..]);
        let got = decode_chunks(&chunks, SseLimits::default());
        prop_assert_eq!(got, oracle(&input), "input {:?}", String::from_utf8_lossy(&input));
    }
}
