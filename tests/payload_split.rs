//! Split invariance of payloads and of filtered content deltas: any
//! chunking of a response gives the same `payload` on every element and the
//! same joined content deltas (equal to `payload.html`), and filtered HTML
//! never holds markup outside the allowlist.

use proptest::prelude::*;
use serde_json::Value;
use spindle::event::Event;
use spindle::payload::html::HtmlFilter;
use spindle::{Parser, Registry};

/// Pieces of content: whitelisted and hostile markup, entities, comments,
/// CJK, patterns, and fragments that only become tags when joined.
const CONTENT_PIECES: &[&str] = &[
    "text ",
    "中文字符",
    "😀",
    " ",
    "\n",
    "<b>",
    "</b>",
    "<i>x</i>",
    "<br>",
    "<br/>",
    "<span style=\"color: red\">",
    "</span>",
    "<span style='color:red;position:fixed' onclick=x>",
    "<ruby>漢<rt>kan</rt></ruby>",
    "<script>alert(1)</script>",
    "<script>",
    "</script>",
    "<svg/onload=alert(1)>",
    "<img src=x onerror=alert(1)>",
    "<iframe src=x <",
    "<!-- note -->",
    "<!--",
    "-->",
    "&amp;",
    "&#106;",
    "avascript:",
    "javascript:",
    "on",
    "load=",
    "url(",
    "expression(",
    "<",
    ">",
    "\"",
    "'",
    "=",
    "<style>b{x:url(y)}</style>",
    "<a href=\"javascript:x\">link</a>",
    "<div>",
    "</div>",
    "<p>p</p>",
    "</ti",
    "tle>",
    "<title>",
    "<textarea>",
    "<scr",
    "ipt>",
    "<![CDATA[x]]>",
    "<![CDATA[a > b",
    "]]>",
    "plain words between tags ",
    "<!DOCTYPE html>",
    "&lt;b&gt;",
    "<B ONCLICK=1>",
    "<math>",
    "</math>",
    "&colon;",
    "\t",
    "<xmp>",
    "</xmp>",
    "<user>",
    "</char>",
    "<us",
    "er>",
    "<<",
    "</>",
];

/// Pieces of whole responses (every Filament tag, sloppy bodies).
const RESPONSE_PIECES: &[&str] = &[
    "<thought>plan <b>x</b></thought>",
    "bare text ",
    "<content>Hi <b>you</b><script>x()</script><!-- c --></content>",
    "<content>more</content>",
    "<variable_update><analysis>why</analysis>```json\n[['set', 'a.b', 1], [\"ADD\", \"hp\", 2],]\n```</variable_update>",
    "<UpdateVariable>_.set('悠纪.好感度', 33, 35);//r\n_.add('gold', 1);</UpdateVariable>",
    "<tool_call name=\"w\">{location: 'Paris', days: 3,}</tool_call>",
    "<tool_call>{\"name\": \"s\", \"arguments\": {\"q\": \"x\"}}</tool_call>",
    "<ui_component view=\"w.g\">{'columns': 3, filter: None}</ui_component>",
    "<media type=\"image\" src=\"a.png\" alt=\"森林\"/>",
    "<choice><prompt>Pick</prompt><option id=\"a\">A</option><option id=\"b\">B</option></choice>",
    "<xx>\n1. one\n2. two\n</xx>",
    "<details><summary>S</summary>body</details>",
    "<status_bar><mood>calm</mood><hp max=\"9\">5</hp></status_bar>",
    "<tool_call name=\"broken\">{\"a\": (1)}</tool_call>",
    "\n",
    "<content>unclosed <i>italic",
];

fn parse_chunked(input: &[u8], cuts: &[usize]) -> Vec<Event> {
    let mut parser = Parser::new(Registry::filament());
    let mut out = Vec::new();
    let mut last = 0;
    for &cut in cuts {
        let cut = cut.min(input.len());
        if cut > last {
            out.extend(parser.feed(&input[last..cut]));
            last = cut;
        }
    }
    out.extend(parser.feed(&input[last..]));
    out.extend(parser.finish());
    out
}

fn fixed_cuts(len: usize, size: usize) -> Vec<usize> {
    (1..=len / size).map(|i| i * size).collect()
}

/// Per element: (tag, payload); and per content element that streamed as
/// content, the joined deltas. (An element reclassified into content at its
/// end streamed as the lead tag; its payload.html is the filtered view.)
fn summary(events: &[Event]) -> (Vec<(String, Value)>, Vec<String>) {
    let mut payloads = Vec::new();
    let mut deltas: Vec<(u32, String)> = Vec::new();
    let reclassified: Vec<u32> = events
        .iter()
        .filter_map(|e| match e {
            Event::Repair(r) if r.kind == spindle::event::RepairKind::Reclassified => r.element,
            _ => None,
        })
        .collect();
    for e in events {
        match e {
            Event::Element(el) => payloads.push((el.tag.to_string(), el.payload.clone())),
            Event::Delta(d) if &*d.tag == "content" && !reclassified.contains(&d.id) => {
                match deltas.iter_mut().find(|(id, _)| *id == d.id) {
                    Some((_, text)) => text.push_str(&d.text),
                    None => deltas.push((d.id, d.text.clone())),
                }
            }
            _ => {}
        }
    }
    let content_ids: Vec<u32> = events
        .iter()
        .filter_map(Event::as_element)
        .filter(|e| &*e.tag == "content" && !reclassified.contains(&e.id))
        .map(|e| e.id)
        .collect();
    let joined = content_ids
        .iter()
        .map(|id| deltas.iter().find(|(d, _)| d == id).map(|(_, t)| t.clone()).unwrap_or_default())
        .collect();
    (payloads, joined)
}

/// No markup outside the allowlist, no script-capable pattern.
fn assert_safe(html: &str) {
    let lower = html.to_ascii_lowercase();
    for bad in ["javascript:", "expression(", "url(", "vbscript:"] {
        assert!(!lower.contains(bad), "{bad} in {html:?}");
    }
    for (i, _) in lower.match_indices('<') {
        let rest = lower[i + 1..].trim_start_matches('/');
        let name: String = rest.chars().take_while(|c| c.is_ascii_alphanumeric()).collect();
        assert!(
            ["b", "strong", "i", "em", "u", "s", "br", "span", "ruby", "rt", "rp"].contains(&name.as_str()),
            "markup <{name} in {html:?}"
        );
    }
}

fn check_response(input: &str, cuts: &[usize]) {
    let whole = summary(&parse_chunked(input.as_bytes(), &[]));
    for size in [1, 7] {
        let got = summary(&parse_chunked(input.as_bytes(), &fixed_cuts(input.len(), size)));
        assert_eq!(got, whole, "chunk size {size} of {input:?}");
    }
    let got = summary(&parse_chunked(input.as_bytes(), cuts));
    assert_eq!(got, whole, "cuts {cuts:?} of {input:?}");
    // Joined content deltas are payload.html.
    let events = parse_chunked(input.as_bytes(), &[]);
    let streamed: Vec<String> = events
        .iter()
        .filter_map(Event::as_element)
        .filter(|e| &*e.tag == "content")
        .filter(|e| !events.iter().any(|r| matches!(r, Event::Repair(r) if r.kind == spindle::event::RepairKind::Reclassified && r.element == Some(e.id))))
        .filter_map(|e| e.payload.get("html").and_then(Value::as_str).map(str::to_string))
        .collect();
    assert_eq!(whole.1, streamed, "deltas vs payload.html in {input:?}");
    for (tag, p) in &whole.0 {
        if tag == "content" {
            assert_safe(p.get("html").and_then(Value::as_str).unwrap_or_default());
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(ProptestConfig::default().cases.min(96)))]

    #[test]
    fn content_is_split_invariant_and_safe(
        pieces in prop::collection::vec(prop::sample::select(CONTENT_PIECES), 0..24),
        cuts in prop::collection::vec(0usize..400, 0..12),
    ) {
        let input = format!("<content>{}</content>", pieces.concat());
        let mut cuts = cuts;
        cuts.sort_unstable();
        check_response(&input, &cuts);
    }

    #[test]
    fn payloads_are_split_invariant(
        pieces in prop::collection::vec(prop::sample::select(RESPONSE_PIECES), 1..8),
        cuts in prop::collection::vec(0usize..1200, 0..16),
    ) {
        let input = pieces.concat();
        let mut cuts = cuts;
        cuts.sort_unstable();
        check_response(&input, &cuts);
    }

    #[test]
    fn filter_direct_split_invariance(
        pieces in prop::collection::vec(prop::sample::select(CONTENT_PIECES), 0..24),
        split_every in 1usize..9,
    ) {
        let text = pieces.concat();
        let whole = {
            let mut f = HtmlFilter::new();
            let mut s = f.push(&text);
            s.push_str(&f.finish());
            s
        };
        let mut f = HtmlFilter::new();
        let mut joined = String::new();
        let mut start = 0;
        let mut n = 0;
        for (i, _) in text.char_indices().skip(1) {
            n += 1;
            if n % split_every == 0 {
                joined.push_str(&f.push(&text[start..i]));
                start = i;
            }
        }
        joined.push_str(&f.push(&text[start..]));
        joined.push_str(&f.finish());
        prop_assert_eq!(&joined, &whole);
        assert_safe(&whole);
    }
}

#[test]
fn fixed_examples_at_one_and_seven_bytes() {
    let examples = [
        "<content>a <b>b</b> <svg/onload=alert(1)> c <span style=\"color: red\">d</span></content>",
        "<content>x <scr<script>ipt>alert(1)</scr</script>ipt> y</content>",
        "<content>「在这片黑暗森林中，你要特别小心。」\n<!-- consider: (角色对白模拟插入) -->\n<!--\n1. 「a」\n2. 「aa」\n-->\n</content>",
        "thinking first</thought><content>answer <img src=x onerror=alert(1)>ok</content><variable_update>[[\"SET\",\"a\",1]]</variable_update>",
    ];
    for e in examples {
        check_response(e, &[]);
    }
}
