//! One test per row of DESIGN §4's table, and the edges around each, each
//! checked whole, byte by byte and at 7-byte chunks.

use crate::event::DiagnosticCode;
use crate::event::{Event, RepairKind};
use crate::machine::MERGE_SPACE_LIMIT;
use crate::{Parser, ParserOptions, Registry};
use std::sync::Arc;

fn run(registry: &Registry, input: &[u8], chunk: usize) -> Vec<Event> {
    let options = ParserOptions { rewrite: true, ..ParserOptions::default() };
    let mut p = Parser::with_options(Arc::new(registry.clone()), options);
    let mut out = Vec::new();
    for c in input.chunks(chunk.max(1)) {
        p.feed_into(c, &mut out);
    }
    out.extend(p.finish());
    out
}

fn elements(events: &[Event]) -> Vec<(String, String)> {
    events.iter().filter_map(Event::as_element).map(|e| (e.tag.to_string(), e.text.clone())).collect()
}

fn repairs(events: &[Event]) -> Vec<RepairKind> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Repair(r) => Some(r.kind),
            _ => None,
        })
        .collect()
}

fn diagnostics(events: &[Event]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Diagnostic(d) => Some(d.code.to_string()),
            _ => None,
        })
        .collect()
}

/// Parses `input` whole, byte by byte and in 7-byte chunks, checks the three
/// agree, and returns the whole-input events.
fn check(registry: &Registry, input: &str, want_elements: &[(&str, &str)], want_repairs: &[RepairKind]) -> Vec<Event> {
    let whole = run(registry, input.as_bytes(), usize::MAX);
    let got: Vec<(String, String)> = elements(&whole);
    let want: Vec<(String, String)> = want_elements.iter().map(|(t, x)| (t.to_string(), x.to_string())).collect();
    assert_eq!(got, want, "elements of {input:?}");
    assert_eq!(repairs(&whole), want_repairs, "repairs of {input:?}");
    for chunk in [1, 7] {
        let split = run(registry, input.as_bytes(), chunk);
        assert_eq!(elements(&split), want, "elements at chunk {chunk} of {input:?}");
        assert_eq!(repairs(&split), want_repairs, "repairs at chunk {chunk} of {input:?}");
    }
    whole
}

fn f() -> Registry {
    Registry::filament()
}

fn r() -> Registry {
    Registry::reasoning()
}

use RepairKind::*;

// ----- header insertion -------------------------------------------------

#[test]
fn header_inserted_before_leading_text_then_thought_confirmed() {
    check(
        &f(),
        "thinking...</thought><content>hi</content>",
        &[("thought", "thinking..."), ("content", "hi")],
        &[HeaderInserted],
    );
}

#[test]
fn header_inserted_leading_whitespace_belongs_to_no_element() {
    let ev = check(
        &f(),
        "\n  idea</thought>\n<content>x</content>",
        &[("thought", "idea"), ("content", "x")],
        &[HeaderInserted],
    );
    assert!(ev.iter().any(|e| matches!(e, Event::Gap(g) if g.text == "\n  ")));
}

#[test]
fn header_inserted_for_default_between_elements() {
    check(
        &f(),
        "<thought>t</thought>\n\nThe answer.",
        &[("thought", "t"), ("content", "The answer.")],
        &[HeaderInserted, ClosedAtEof],
    );
}

#[test]
fn reasoning_bare_content_is_not_a_repair() {
    check(&r(), "<think>t</think>\n\nThe answer.", &[("thought", "t"), ("content", "The answer.")], &[]);
    check(
        &r(),
        "deep thought</think>The answer.",
        &[("thought", "deep thought"), ("content", "The answer.")],
        &[HeaderInserted],
    );
}

#[test]
fn prefilled_lead_stays_the_lead() {
    let p = Registry::profile("reasoning-prefilled").unwrap();
    // Never closed (cut at max_tokens, or still thinking): a thought, not
    // reclassified as content.
    check(&p, "Let me think about this", &[("thought", "Let me think about this")], &[HeaderInserted, ClosedAtEof]);
    check(
        &p,
        "\nOkay, so</think>\n\nThe answer is 4.",
        &[("thought", "Okay, so"), ("content", "The answer is 4.")],
        &[HeaderInserted],
    );
    // The model wrote <think> anyway.
    check(&p, "<think>a</think>b", &[("thought", "a"), ("content", "b")], &[]);
    // Empty reasoning: the close alone closes an empty lead (its rewrite,
    // `<think></think>Just the answer.`, reads the same).
    check(&p, "</think>Just the answer.", &[("thought", ""), ("content", "Just the answer.")], &[HeaderInserted]);
    check(&p, "<!-- note --> </think>\nHi", &[("thought", ""), ("content", "Hi")], &[HeaderInserted]);
    // Without the setting, an unconfirmed lead is content.
    check(&r(), "Let me think about this", &[("content", "Let me think about this")], &[HeaderInserted, Reclassified]);
}

#[test]
fn hermes_tool_call_ends_an_open_thought() {
    let p = Registry::profile("reasoning-prefilled").unwrap();
    let call = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>";
    check(
        &p,
        &format!("I need f.\n\n{call}"),
        &[("thought", "I need f.\n\n"), ("tool_call", "\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n")],
        &[HeaderInserted, AutoClosed],
    );
    check(
        &Registry::chat(),
        &format!("Sure.{call}{call}"),
        &[
            ("content", "Sure."),
            ("tool_call", "\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n"),
            ("tool_call", "\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n"),
        ],
        &[],
    );
}

// ----- auto-close ------------------------------------------------------

#[test]
fn auto_closed_by_next_top_level_tag() {
    check(&f(), "<thought>a\n<content>b</content>", &[("thought", "a\n"), ("content", "b")], &[AutoClosed]);
    check(
        &f(),
        "<content>b\n<variable_update>[]</variable_update>",
        &[("content", "b\n"), ("variable_update", "[]")],
        &[AutoClosed],
    );
}

#[test]
fn markup_inside_a_json_string_is_its_text() {
    // Tags of the registry inside a call's string arguments (a file being
    // written, a prompt being explained) are the string's text.
    let body = r#"{"name": "write_file", "arguments": {"content": "wrap it in <think> tags, \"</content>\" and <tool_call> too\\"}}"#;
    let input = format!("<tool_call>{body}</tool_call>\nDone.");
    check(&r(), &input, &[("tool_call", body), ("content", "Done.")], &[]);
    // Outside the strings a tag still ends a call never closed.
    check(
        &r(),
        "<tool_call>{\"name\": \"f\", \"arguments\": {}}\n<tool_call>{\"name\": \"g\"}</tool_call>",
        &[("tool_call", "{\"name\": \"f\", \"arguments\": {}}\n"), ("tool_call", "{\"name\": \"g\"}")],
        &[AutoClosed],
    );
}

#[test]
fn an_own_close_inside_a_value_waits_for_what_follows() {
    // `</tool_call>` inside a string the call writes out (a file about
    // tool calls): what follows goes on with the string, so it is text.
    let body = r#"{"name": "write_file", "arguments": {"content": "end each call with </tool_call>\n, then wait"}}"#;
    let input = format!("<tool_call>{body}</tool_call>\nDone.");
    let events = check(&r(), &input, &[("tool_call", body), ("content", "Done.")], &[]);
    assert_eq!(diagnostics(&events), ["close_in_value"]);
    let payload = events.iter().find_map(Event::as_element).map(|e| &e.payload);
    assert_eq!(
        payload.and_then(|p| p.pointer("/arguments/content")).and_then(|v| v.as_str()),
        Some("end each call with </tool_call>\n, then wait")
    );
    // Whitespace, markup that is no registry tag and comments go on with
    // the value too.
    let body = r#"{"name": "f", "arguments": {"a": "x</tool_call>  <b>y</b><!-- z -->"}}"#;
    check(&r(), &format!("<tool_call>{body}</tool_call>"), &[("tool_call", body)], &[]);
    // Qwen3-Coder and GLM write values in markup: the same inside them.
    let qwen = "\n<function=write_file>\n<parameter=content>\nclose with </tool_call>\n</parameter>\n</function>\n";
    let events = check(
        &r(),
        &format!("<tool_call>{qwen}</tool_call>\nDone."),
        &[("tool_call", qwen), ("content", "Done.")],
        &[],
    );
    assert_eq!(diagnostics(&events), ["close_in_value"]);
    let glm = "write_file\n<arg_key>content</arg_key>\n<arg_value>a </tool_call> b</arg_value>\n";
    check(&r(), &format!("<tool_call>{glm}</tool_call>"), &[("tool_call", glm)], &[]);
    // Registry tags inside those values are the values' text, asked again
    // and again as the values go on; between values a tag is a tag.
    let qwen = "<function=f>\n<parameter=a>\nuse <think> and <content>\n</parameter>\n<parameter=b>\n<content>x</content>\n</parameter>\n</function>";
    check(&r(), &format!("<tool_call>{qwen}</tool_call>"), &[("tool_call", qwen)], &[]);
    let glm = "f\n<arg_key>a</arg_key>\n<arg_value><think></arg_value>\n<arg_key>b</arg_key>\n<arg_value></think></arg_value>";
    check(&r(), &format!("<tool_call>{glm}</tool_call>"), &[("tool_call", glm)], &[]);
    let qwen = "<function=f>\n<parameter=a>\n1\n</parameter>\n";
    check(&r(), &format!("<tool_call>{qwen}<think>t</think>"), &[("tool_call", qwen), ("thought", "t")], &[AutoClosed]);
    // Between values a close is a close at once, whatever quotes a value
    // in markup holds.
    let qwen = "<function=f>\n<parameter=q>\nsay \"hi\n</parameter>\n</function>";
    check(&r(), &format!("<tool_call>{qwen}</tool_call>Done."), &[("tool_call", qwen), ("content", "Done.")], &[]);
    // A value never ended: what ends a call confirms the close (the end of
    // input, a registry tag, a chat-template token), so that a broken
    // string cannot swallow the next call.
    let cut = "{\"name\": \"f\", \"arguments\": {\"a\": \"x";
    for (after, want, repairs) in [
        ("", vec![("tool_call", cut)], vec![]),
        ("\n\n", vec![("tool_call", cut)], vec![]),
        ("\n<tool_call>{}</tool_call>", vec![("tool_call", cut), ("tool_call", "{}")], vec![]),
        ("<|im_end|>", vec![("tool_call", cut)], vec![SpecialTokenDropped]),
        ("\n<think>t</think>", vec![("tool_call", cut), ("thought", "t")], vec![]),
    ] {
        let events = check(&r(), &format!("<tool_call>{cut}</tool_call>{after}"), &want, &repairs);
        assert!(!diagnostics(&events).contains(&"close_in_value".to_string()), "{after:?}");
    }
    // A second call right after a close inside a value is a second call,
    // not the first one merged.
    let events = check(
        &r(),
        "<tool_call>{\"a\": \"x</tool_call><tool_call>{}</tool_call>",
        &[("tool_call", "{\"a\": \"x"), ("tool_call", "{}")],
        &[],
    );
    assert!(repairs(&events).is_empty());
    // Prose after a value never ended is the price: it goes on with the
    // value, and the end of input closes the call.
    check(
        &r(),
        &format!("<tool_call>{cut}</tool_call>\nmore"),
        &[("tool_call", &format!("{cut}</tool_call>\nmore"))],
        &[ClosedAtEof],
    );
    // More whitespace than the machine holds: the close stands.
    let space = " ".repeat(MERGE_SPACE_LIMIT + 1);
    let events = check(
        &r(),
        &format!("<tool_call>{cut}</tool_call>{space}more"),
        &[("tool_call", cut), ("content", "more")],
        &[],
    );
    assert_eq!(diagnostics(&events)[0], "merge_space_too_long");
}

#[test]
fn json_body_auto_closed() {
    check(
        &f(),
        "<content>x</content><tool_call name=\"f\">{\"a\":1}<content>y</content>",
        &[("content", "x"), ("tool_call", "{\"a\":1}"), ("content", "y")],
        &[AutoClosed],
    );
}

#[test]
fn declared_child_does_not_auto_close() {
    let reg = Registry::from_toml_str(
        r#"
        extends = "filament"
        [[tag]]
        name = "panel"
        body = "structured"
        children = ["content"]
    "#,
    )
    .unwrap();
    check(
        &reg,
        "<content>a</content><panel><content>inner</content></panel>",
        &[("content", "a"), ("panel", "<content>inner</content>")],
        &[],
    );
}

#[test]
fn opaque_body_is_not_auto_closed() {
    let reg = Registry::from_toml_str(
        r#"
        extends = "filament"
        [[tag]]
        name = "code"
        body = "raw"
    "#,
    )
    .unwrap();
    check(
        &reg,
        "<content>a</content><code><content>x</thought></code>",
        &[("content", "a"), ("code", "<content>x</thought>")],
        &[],
    );
}

// ----- adjacent merge ---------------------------------------------------

#[test]
fn merged_adjacent_content() {
    check(
        &f(),
        "<content>Hello</content>\n \n<content> world</content>",
        &[("content", "Hello world")],
        &[MergedAdjacent],
    );
}

#[test]
fn merged_adjacent_thought() {
    check(
        &f(),
        "<thought>a</thought><thought>b</thought><content>c</content>",
        &[("thought", "ab"), ("content", "c")],
        &[MergedAdjacent],
    );
}

/// Whitespace after a mergeable close is held only up to a limit: past
/// it the close stands, said once, at any split, and the whitespace is a
/// gap (a model emitting nothing but newlines holds no memory for them).
#[test]
fn a_close_followed_by_endless_whitespace_stands() {
    let far = format!("<thought>a</thought>{}<thought>b</thought>", "\n".repeat(MERGE_SPACE_LIMIT + 1));
    let ev = check(&f(), &far, &[("thought", "a"), ("thought", "b")], &[]);
    assert_eq!(diagnostics(&ev), ["merge_space_too_long", "missing_mandatory"]);
    let gap: usize = ev.iter().filter_map(|e| if let Event::Gap(g) = e { Some(g.text.len()) } else { None }).sum();
    assert_eq!(gap, MERGE_SPACE_LIMIT + 1);
    // Bare text after it opens a new content element.
    let far = format!("<content>a</content>{}b", " ".repeat(MERGE_SPACE_LIMIT + 1));
    check(&f(), &far, &[("content", "a"), ("content", "b")], &[HeaderInserted, ClosedAtEof]);
    // At the limit, the merge still happens.
    let near = format!("<thought>a</thought>{}<thought>b</thought>", "\n".repeat(MERGE_SPACE_LIMIT));
    let ev = check(&f(), &near, &[("thought", "ab")], &[MergedAdjacent]);
    assert!(!diagnostics(&ev).contains(&"merge_space_too_long".to_string()));
}

#[test]
fn held_close_then_other_tag_is_a_real_close() {
    let ev = check(
        &f(),
        "<content>a</content>\n<variable_update>[]</variable_update>",
        &[("content", "a"), ("variable_update", "[]")],
        &[],
    );
    // The whitespace between belongs to no element.
    assert!(ev.iter().any(|e| matches!(e, Event::Gap(g) if g.text == "\n")));
}

#[test]
fn held_close_at_eof_is_a_real_close() {
    let ev = check(&f(), "<content>a</content>\n", &[("content", "a")], &[]);
    let el = ev.iter().find_map(Event::as_element).unwrap();
    assert_eq!((el.span.start, el.span.end), (0, 20));
}

#[test]
fn bare_text_after_closed_default_continues_it() {
    // The continued element is then open until the end of input.
    check(&f(), "<content>Hello</content> and more", &[("content", "Hello and more")], &[MergedAdjacent, ClosedAtEof]);
}

#[test]
fn bare_text_after_closed_thought_opens_content() {
    check(
        &f(),
        "<thought>t</thought> answer",
        &[("thought", "t"), ("content", "answer")],
        &[HeaderInserted, ClosedAtEof],
    );
}

#[test]
fn repeated_open_of_an_open_mergeable_tag_merges() {
    check(&f(), "<content>a <content>b</content>", &[("content", "a b")], &[MergedAdjacent]);
    check(
        &f(),
        "<content>A</content>\nbare B\n<content>C</content>",
        &[("content", "A\nbare B\nC")],
        &[MergedAdjacent, MergedAdjacent],
    );
}

#[test]
fn unknown_special_tokens_between_elements_are_dropped() {
    check(&f(), "<content>hi</content>\n<|im_end|>", &[("content", "hi")], &[SpecialTokenDropped]);
    check(&f(), "<content>hi<|im_end|></content>", &[("content", "hi<|im_end|>")], &[]);
}

// ----- mismatched and stray closes -------------------------------------

#[test]
fn mismatched_close_by_alias() {
    check(&f(), "<think>t</thought><content>c</content>", &[("thought", "t"), ("content", "c")], &[MismatchedClose]);
}

#[test]
fn mismatched_close_by_other_top_level_tag() {
    check(&f(), "<thought>t</content><content>c</content>", &[("thought", "t"), ("content", "c")], &[MismatchedClose]);
}

#[test]
fn case_only_difference_is_not_a_mismatch() {
    check(&f(), "<Content>c</CONTENT>", &[("content", "c")], &[]);
}

#[test]
fn stray_close_dropped() {
    check(&f(), "<content>c</content>\n</thought>", &[("content", "c")], &[StrayCloseDropped]);
    check(&f(), "</think><content>c</content>", &[("content", "c")], &[StrayCloseDropped]);
}

#[test]
fn stray_lead_close_at_start_means_content_follows() {
    check(&r(), "</think>\n\nanswer", &[("content", "answer")], &[StrayCloseDropped]);
}

#[test]
fn non_registry_tags_are_text() {
    check(
        &f(),
        "<content>a <b>bold</b> <span style=\"color:red\">x</span><br/></content>",
        &[("content", "a <b>bold</b> <span style=\"color:red\">x</span><br/>")],
        &[],
    );
}

#[test]
fn prose_angle_brackets_are_text() {
    check(&f(), "<content>if a < b and 5 > 3 then <3</content>", &[("content", "if a < b and 5 > 3 then <3")], &[]);
}

#[test]
fn structured_children_are_text_of_the_element() {
    check(
        &f(),
        "<content>x</content><status_bar><mood>ok</mood><loc>here</loc></status_bar>",
        &[("content", "x"), ("status_bar", "<mood>ok</mood><loc>here</loc>")],
        &[],
    );
}

#[test]
fn self_closing_registry_tag() {
    let ev = check(
        &f(),
        "<content>x</content><media type=\"image\" src=\"a.png\" alt=\"A &amp; B\"/>",
        &[("content", "x"), ("media", "")],
        &[],
    );
    let media = ev.iter().filter_map(Event::as_element).nth(1).unwrap();
    assert_eq!(media.attrs.get("alt").map(String::as_str), Some("A & B"));
}

#[test]
fn void_tag_without_self_close_ends_at_its_open_tag() {
    check(
        &f(),
        "<content>x</content><media src=\"a.png\">\nMore text",
        &[("content", "x"), ("media", ""), ("content", "More text")],
        &[HeaderInserted, ClosedAtEof],
    );
    check(&f(), "<content>x</content><media src=\"a.png\"> </media>", &[("content", "x"), ("media", " ")], &[]);
    check(
        &f(),
        "<content>x</content><media src=\"a.png\"><content>y</content>",
        &[("content", "x"), ("media", ""), ("content", "y")],
        &[],
    );
    check(&f(), "<content>x</content><media src=\"a.png\">", &[("content", "x"), ("media", "")], &[]);
    // A short body followed by its close is the body.
    check(
        &f(),
        "<content>x</content><media type=\"image\">pics/a.png</media>",
        &[("content", "x"), ("media", "pics/a.png")],
        &[],
    );
    // More than a body's worth of text: the tag ended at its open tag.
    let prose = "word ".repeat(60);
    let input = format!("<content>x</content><media src=\"a.png\">{prose}");
    check(
        &f(),
        &input,
        &[("content", "x"), ("media", ""), ("content", prose.as_str())],
        &[HeaderInserted, ClosedAtEof],
    );
}

// ----- end of stream ----------------------------------------------------

#[test]
fn closed_at_eof() {
    check(
        &f(),
        "<thought>t</thought><content>cut off mid",
        &[("thought", "t"), ("content", "cut off mid")],
        &[ClosedAtEof],
    );
}

#[test]
fn truncated_marker_dropped_at_eof() {
    check(&f(), "<content>almost done</cont", &[("content", "almost done")], &[TruncatedMarker, ClosedAtEof]);
    check(&f(), "<content>x</content><variable_upd", &[("content", "x")], &[TruncatedMarker]);
    // A lone `<` at the end is prose, not a cut marker.
    check(&f(), "<content>x <", &[("content", "x <")], &[ClosedAtEof]);
}

#[test]
fn cut_off_candidate_with_a_complete_name_is_text() {
    // A prefix of a registry name followed by a space and prose: the name is
    // complete and is no registry tag, so the bytes are the element's text.
    check(&f(), "<content>a word: <thin is a word", &[("content", "a word: <thin is a word")], &[ClosedAtEof]);
    check(&f(), "<content>if a <con b then c", &[("content", "if a <con b then c")], &[ClosedAtEof]);
    check(&f(), "<content>x</content>\n<var is", &[("content", "x\n<var is")], &[MergedAdjacent, ClosedAtEof]);
    check(&f(), "<content>see </thin ", &[("content", "see </thin ")], &[ClosedAtEof]);
    check(&f(), "<content>see <thin/", &[("content", "see <thin/")], &[ClosedAtEof]);
    let r = Registry::profile("reasoning").unwrap();
    check(
        &r,
        "<think>hm</think>The answer is a <thin line",
        &[("thought", "hm"), ("content", "The answer is a <thin line")],
        &[],
    );
    // A registry name that is complete, or a name still being read, is a
    // marker cut off by the end.
    check(&f(), "<content>x</content><content class=\"a", &[("content", "x")], &[TruncatedMarker]);
    check(&f(), "<content>x <thin", &[("content", "x ")], &[TruncatedMarker, ClosedAtEof]);
    check(&f(), "<content>x </content ", &[("content", "x ")], &[TruncatedMarker, ClosedAtEof]);
}

// ----- reclassification --------------------------------------------------

#[test]
fn reclassified_when_only_an_implicit_thought() {
    let ev =
        check(&f(), "Just an answer.", &[("content", "Just an answer.")], &[HeaderInserted, Reclassified, ClosedAtEof]);
    // Deltas streamed as thought; the repair names the element.
    assert!(ev.iter().any(|e| matches!(e, Event::Delta(d) if &*d.tag == "thought")));
    let rep = ev
        .iter()
        .find_map(|e| match e {
            Event::Repair(r) if r.kind == Reclassified => Some(r),
            _ => None,
        })
        .unwrap();
    assert_eq!((rep.element, rep.tag.as_deref(), rep.from.as_deref()), (Some(0), Some("content"), Some("thought")));
    check(&r(), "Just an answer.", &[("content", "Just an answer.")], &[HeaderInserted, Reclassified]);
}

#[test]
fn reclassified_by_its_close_tag() {
    check(&f(), "an answer</content>", &[("content", "an answer")], &[HeaderInserted, Reclassified]);
    check(
        &f(),
        "[[\"SET\",\"a\",1]]</variable_update>",
        &[("variable_update", "[[\"SET\",\"a\",1]]")],
        &[HeaderInserted, Reclassified],
    );
}

#[test]
fn reclassified_by_order_dependency() {
    check(
        &f(),
        "Answer.\n<variable_update>[]</variable_update>",
        &[("content", "Answer.\n"), ("variable_update", "[]")],
        &[HeaderInserted, Reclassified, AutoClosed],
    );
}

/// Where content is written bare (reasoning), a lead that proves to be
/// content has no close tag to miss: no `AutoClosed`, as for bare text read
/// as content from the start (found by `rewrite_is_a_fixpoint`).
#[test]
fn lead_proved_bare_content_is_not_auto_closed() {
    check(
        &r(),
        "Hello <tool_call>{\"q\": 1}</tool_call>",
        &[("content", "Hello "), ("tool_call", "{\"q\": 1}")],
        &[HeaderInserted, Reclassified],
    );
}

#[test]
fn undecided_lead_waits_and_keeps_order() {
    // Decided at the end: no content at all, so it was content.
    check(
        &f(),
        "Answer.\n<status_bar><hp>3</hp></status_bar>\n",
        &[("content", "Answer.\n"), ("status_bar", "<hp>3</hp>")],
        &[HeaderInserted, Reclassified, AutoClosed],
    );
    // Decided by a later content element: it was a thought.
    check(
        &f(),
        "Plan.\n<status_bar><hp>3</hp></status_bar><content>Hi</content>",
        &[("thought", "Plan.\n"), ("status_bar", "<hp>3</hp>"), ("content", "Hi")],
        &[HeaderInserted, AutoClosed],
    );
}

#[test]
fn explicit_thought_is_never_reclassified() {
    check(&f(), "<thought>only thinking", &[("thought", "only thinking")], &[ClosedAtEof]);
}

// ----- diagnostics -------------------------------------------------------

#[test]
fn missing_mandatory_and_order_diagnostics() {
    let ev = check(&f(), "<thought>t</thought>", &[("thought", "t")], &[]);
    assert_eq!(diagnostics(&ev), ["missing_mandatory"]);
    let ev = check(
        &f(),
        "<variable_update>[]</variable_update><content>c</content>",
        &[("variable_update", "[]"), ("content", "c")],
        &[],
    );
    assert_eq!(diagnostics(&ev), ["order_violation"]);
}

#[test]
fn element_size_limit_truncates_text_but_not_deltas() {
    let mut options = ParserOptions::default();
    options.machine.max_element_len = 10;
    let mut p = Parser::with_options(Arc::new(f()), options);
    let mut ev = p.feed(b"<content>0123456789abcdef</content><tool_call>{\"k\":\"0123456789\"}</tool_call>");
    ev.extend(p.finish());
    let els: Vec<_> = ev.iter().filter_map(Event::as_element).collect();
    assert_eq!((els[0].text.as_str(), els[0].truncated), ("0123456789", true));
    let content_deltas: String = ev
        .iter()
        .filter_map(|e| match e {
            Event::Delta(d) if d.id == 0 => Some(d.text.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(content_deltas, "0123456789abcdef");
    // A non-streaming body's overflow still arrives, as deltas.
    let call_deltas: String = ev
        .iter()
        .filter_map(|e| match e {
            Event::Delta(d) if d.id == 1 => Some(d.text.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(format!("{}{call_deltas}", els[1].text), "{\"k\":\"0123456789\"}");
    assert_eq!(diagnostics(&ev).iter().filter(|d| *d == "element_too_large").count(), 2);
}

#[test]
fn an_undecided_lead_past_the_size_limit_is_settled_once() {
    // Bare text, then elements that leave the implicit lead undecided,
    // past a small limit: the lead is kept, said once, at any split.
    let input = b"abc<status_bar>x</status_bar><status_bar>y</status_bar><content>z</content>";
    let mut whole = None;
    for chunk in [input.len(), 1, 7] {
        let mut options = ParserOptions::default();
        options.machine.max_element_len = 20;
        let mut p = Parser::with_options(Arc::new(f()), options);
        let mut ev = Vec::new();
        for piece in input.chunks(chunk) {
            ev.extend(p.feed(piece));
        }
        ev.extend(p.finish());
        assert_eq!(diagnostics(&ev).iter().filter(|d| *d == "lead_undecided").count(), 1, "chunk {chunk}");
        let tags: Vec<String> = ev.iter().filter_map(Event::as_element).map(|e| e.tag.to_string()).collect();
        assert_eq!(tags, ["thought", "status_bar", "status_bar", "content"], "chunk {chunk}");
        let ev = crate::event::coalesce(ev);
        assert_eq!(whole.get_or_insert_with(|| ev.clone()), &ev, "chunk {chunk}");
    }
}

// ----- rewrite -----------------------------------------------------------

fn rewrite(registry: &Registry, input: &str, chunk: usize) -> String {
    let options = ParserOptions { rewrite: true, ..ParserOptions::default() };
    let mut p = Parser::with_options(Arc::new(registry.clone()), options);
    let mut out = Vec::new();
    for c in input.as_bytes().chunks(chunk) {
        p.feed(c);
        out.extend(p.take_rewrite());
    }
    let (_, rest) = p.finish_with_rewrite();
    out.extend(rest);
    String::from_utf8(out).unwrap()
}

#[test]
fn rewrite_inserts_and_drops() {
    let cases = [
        (
            f(),
            "thinking</thought>\n<content>a</content>\n<content>b",
            "<thought>thinking</thought>\n<content>ab</content>",
        ),
        (f(), "Only.", "<content>Only.</content>"),
        (f(), "A.\n<status_bar>s</status_bar>", "<content>A.\n</content><status_bar>s</status_bar>"),
        (f(), "<Think>x</thought></content>", "<Think>x</Think>"),
        (r(), "deep</think>answer", "<think>deep</think>answer"),
        (f(), "<content>x</cont", "<content>x</content>"),
    ];
    for (reg, input, want) in cases {
        for chunk in [1, 3, input.len()] {
            assert_eq!(rewrite(&reg, input, chunk), want, "{input:?} at {chunk}");
        }
    }
}

// ----- code fences around call blocks ---------------------------------------

fn tam() -> Registry {
    Registry::profile("tam").unwrap()
}

fn action() -> Registry {
    Registry::profile("action").unwrap()
}

#[test]
fn fences_around_a_tam_block_leave_the_content() {
    let input = "Writing it now.\n```\n<|[REQUEST_TOOL]|>\ncommand:»»»ls«««\n<|[END_TOOL]|>\n```\nDone.";
    let block = "\ncommand:»»»ls«««\n";
    let events = check(
        &tam(),
        input,
        &[("content", "Writing it now.\n"), ("tam", block), ("content", "Done.")],
        &[FenceDropped, FenceDropped],
    );
    // The fences are the repairs' spans (every byte accounted for at random
    // splits is checked by the `call_block_fences` proptest).
    let dropped: Vec<&str> = events
        .iter()
        .filter_map(|e| if let Event::Repair(r) = e { r.span } else { None })
        .map(|s| &input[s.start..s.end])
        .collect();
    assert_eq!(dropped, ["```\n", "\n```\n"]);
    // The rewrite keeps the model's formatting.
    let mut p = Parser::with_options(Arc::new(tam()), ParserOptions { rewrite: true, ..ParserOptions::default() });
    p.feed(input.as_bytes());
    let (_, rewritten) = p.finish_with_rewrite();
    assert_eq!(String::from_utf8(rewritten).unwrap(), input);
}

#[test]
fn fences_with_info_strings_indentation_and_blank_lines() {
    let input = "Call:\n  ```xml\n\n<ACTION><ls><path>.</path></ls></ACTION>\n  ```  \n\nAfter.";
    check(
        &action(),
        input,
        &[("content", "Call:\n"), ("action", "<ls><path>.</path></ls>"), ("content", "After.")],
        &[FenceDropped, FenceDropped],
    );
    // A block at the very start, fenced, with the output ending on the fence.
    check(&action(), "```xml\n<ACTION><ls/></ACTION>\n```", &[("action", "<ls/>")], &[FenceDropped, FenceDropped]);
}

#[test]
fn fences_that_are_not_around_a_block_stay_text() {
    // A code block of the response's own, closed before the block: its
    // closing fence is not the block's opening one.
    let input = "Code:\n```py\nx = 1\n```\n<|[REQUEST_TOOL]|>\ncommand:»»»ls«««\n<|[END_TOOL]|>\n```py\ny\n```";
    check(
        &tam(),
        input,
        &[("content", "Code:\n```py\nx = 1\n```\n"), ("tam", "\ncommand:»»»ls«««\n"), ("content", "```py\ny\n```")],
        &[],
    );
    // A fence followed by more text, and a fence at the end of output.
    check(&tam(), "See:\n```\ncode\n```\n", &[("content", "See:\n```\ncode\n```\n")], &[]);
    // Inline backticks at a line start.
    check(&tam(), "a\n`x` and ``y``", &[("content", "a\n`x` and ``y``")], &[]);
    // Profiles without call blocks never look.
    check(&f(), "<content>```\n</content>", &[("content", "```\n")], &[]);
}

/// Text that settles a wait part way (a held close at its first
/// non-space byte, a void element's wait at its limit) is watched for a
/// fence from there, as if a chunk had ended at that byte: the same at every
/// split (found by the `parse` fuzz target).
#[test]
fn a_fence_after_a_settled_wait_is_watched() {
    let input = "<content>Intro</content> more\n  ```\n<ACTION><ls/></ACTION>";
    check(&action(), input, &[("content", "Intro more\n"), ("action", "<ls/>")], &[MergedAdjacent, FenceDropped]);
    let words = "word ".repeat(60);
    let input = format!("<media src=\"a.png\">{words}\n\t<ACTION><ls/></ACTION>");
    check(
        &f(),
        &input,
        &[("media", ""), ("content", &format!("{words}\n")), ("action", "<ls/>")],
        &[HeaderInserted, AutoClosed, FenceDropped],
    );
}

/// A fence right after a held close (`</thought>`, `</content>`: closes
/// that may merge with what follows) is watched like one after text.
#[test]
fn a_fence_right_after_a_held_close_is_dropped() {
    let call = "```xml\n<ACTION><ls/></ACTION>\n```\n";
    let input = format!("<thought>a</thought>\n{call}");
    check(&f(), &input, &[("thought", "a"), ("action", "<ls/>")], &[FenceDropped, FenceDropped]);
    let input = format!("<content>a</content>\n{call}");
    check(
        &f(),
        &input,
        &[("content", "a\n"), ("action", "<ls/>")],
        &[MergedAdjacent, AutoClosed, FenceDropped, FenceDropped],
    );
    let input = format!("<content>a</content>{call}");
    check(
        &f(),
        &input,
        &[("content", "a"), ("action", "<ls/>")],
        &[MergedAdjacent, AutoClosed, FenceDropped, FenceDropped],
    );
}

#[test]
fn a_closing_fence_is_dropped_only_after_a_dropped_opening_one() {
    let input = "Go.\n<|[REQUEST_TOOL]|>\ncommand:»»»ls«««\n<|[END_TOOL]|>\n```\ncode";
    check(&tam(), input, &[("content", "Go.\n"), ("tam", "\ncommand:»»»ls«««\n"), ("content", "```\ncode")], &[]);
}

/// `CallText::Omit`: the corrected text without call elements (and the
/// fences around TAM/ACTION blocks), the same at every split; a call inside
/// an open code block is an example and stays, with a diagnostic.
#[test]
fn rewrite_can_omit_call_elements() {
    let omit = |registry: &Registry, input: &str, chunk: usize| {
        let options = ParserOptions { rewrite: true, call_text: crate::CallText::Omit, ..ParserOptions::default() };
        let mut p = Parser::with_options(Arc::new(registry.clone()), options);
        let mut text = Vec::new();
        let mut events = Vec::new();
        for c in input.as_bytes().chunks(chunk.max(1)) {
            p.feed_into(c, &mut events);
            text.extend(p.take_rewrite());
        }
        let (rest, tail) = p.finish_with_rewrite();
        events.extend(rest);
        text.extend(tail);
        let examples = events
            .iter()
            .filter(|e| matches!(e, Event::Diagnostic(d) if d.code == DiagnosticCode::CallInCodeBlock))
            .count();
        (String::from_utf8(text).unwrap(), examples)
    };
    let chat = Registry::chat();
    let reasoning = Registry::profile("reasoning").unwrap();
    let cases: [(&Registry, &str, &str, usize); 8] = [
        (&chat, "Hi <tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call> bye", "Hi  bye", 0),
        // A call that opens while a call is open ends it and is left out too.
        (&chat, "x <tool_call>a\n<tool_call>{\"name\": \"g\"}</tool_call> y", "x  y", 0),
        (&chat, "<tool_call name=\"f\">{\"a\": 1}</tool_call>\n<tool_call>{\"name\": \"g\"}", "\n", 0),
        // As the kept rewrite reads it (the lead was content), less the call.
        (&reasoning, "plan<tool_call>{\"name\": \"f\"}</tool_call>", "plan", 0),
        (&reasoning, "<think>plan</think>ok<tool_call>{\"name\": \"f\"}</tool_call>", "<think>plan</think>ok", 0),
        (&tam(), "Go.\n```\n<|[REQUEST_TOOL]|>\ncommand:»»»ls«««\n<|[END_TOOL]|>\n```\nAfter.", "Go.\nAfter.", 0),
        (&action(), "Look:\n<ACTION><ls><path>.</path></ls></ACTION>", "Look:\n", 0),
        (
            &chat,
            "E:\n```\n<tool_call>{\"name\": \"f\"}</tool_call>\n```\nend",
            "E:\n```\n<tool_call>{\"name\": \"f\"}</tool_call>\n```\nend",
            1,
        ),
    ];
    for (registry, input, want, examples) in cases {
        for chunk in [1, 7, input.len()] {
            assert_eq!(omit(registry, input, chunk), (want.to_string(), examples), "{input:?} at {chunk}");
        }
    }
}

/// Bare text opens the default element; when that element does not stream,
/// the text after its first byte is the element's and not watched for a
/// fence, as it would not be had a chunk ended there.
#[test]
fn a_fence_after_bare_text_opening_an_unwatched_default_is_not_held() {
    let registry = Registry::from_toml_str(
        r#"
        name = "raw-default"
        extends = "action"
        default = "note"

        [[tag]]
        name = "note"
        body = "raw"
        "#,
    )
    .unwrap();
    let input = "abc\n```xml\n<ACTION><ls/></ACTION>";
    check(&registry, input, &[("note", input)], &[HeaderInserted, ClosedAtEof]);
    let input = "abc\n```xml\n";
    check(&registry, input, &[("note", input)], &[HeaderInserted, ClosedAtEof]);
    // Before the first bare byte, a fence is held as anywhere between
    // elements.
    let input = "```xml\n<ACTION><ls/></ACTION>";
    check(&registry, input, &[("action", "<ls/>")], &[FenceDropped]);
}

/// A registry tag inside Markdown code in a streamed element (a fenced
/// block, a code span) is the code's text: an HTML example with
/// `<details>` or `<option>`, a sentence about `<thought>` tags. The
/// element's own close still ends it (a block the model left open does
/// not swallow the rest of the response), and calls keep their own
/// reading of code.
#[test]
fn registry_tags_inside_markdown_code_are_text() {
    let filament = Registry::filament();
    let block = "<content>Use:\n\n```html\n<details><summary>More</summary>x</details>\n<select><option>A</option></select>\n```\n</content>";
    let events = check(
        &filament,
        block,
        &[(
            "content",
            "Use:\n\n```html\n<details><summary>More</summary>x</details>\n<select><option>A</option></select>\n```\n",
        )],
        &[],
    );
    assert_eq!(diagnostics(&events).iter().filter(|d| *d == "tag_in_code").count(), 1);
    let cases: &[(&str, &[(&str, &str)])] = &[
        // A block the model left open ends with the element.
        (
            "<content>```\n<details>x</details>\n</content>\n<status_bar><hp>1</hp></status_bar>",
            &[("content", "```\n<details>x</details>\n"), ("status_bar", "<hp>1</hp>")],
        ),
        (
            "<content>A `<thought>` tag and ``<content>`` too; then <b>bold</b>.</content>",
            &[("content", "A `<thought>` tag and ``<content>`` too; then <b>bold</b>.")],
        ),
        (
            "<content>~~~\n<status_bar><hp>1</hp></status_bar>\n~~~\nDone.</content><status_bar><hp>2</hp></status_bar>",
            &[("content", "~~~\n<status_bar><hp>1</hp></status_bar>\n~~~\nDone."), ("status_bar", "<hp>2</hp>")],
        ),
        // A span ends with its line; a closed span or block is no code.
        (
            "<content>a `b\n<choice><option>x</option></choice>",
            &[("content", "a `b\n"), ("choice", "<option>x</option>")],
        ),
        ("<content>```\ncode\n```\n<thought>t</thought>", &[("content", "```\ncode\n```\n"), ("thought", "t")]),
        // Not a fence: a backtick in its info string, a run too short.
        ("<content>```a`b\n<thought>t</thought>", &[("content", "```a`b\n"), ("thought", "t")]),
        ("<content>``\n<thought>t</thought>", &[("content", "``\n"), ("thought", "t")]),
        // A fence in a list item, indented.
        (
            "<content>1. Run:\n   ```\n   <thought>\n   ```\n</content>",
            &[("content", "1. Run:\n   ```\n   <thought>\n   ```\n")],
        ),
    ];
    for &(input, want) in cases {
        let repairs: Vec<RepairKind> = repairs(&run(&filament, input.as_bytes(), usize::MAX));
        check(&filament, input, want, &repairs);
    }
    // Cut off inside code at the end of input: a registry tag's start is
    // text, not a cut marker.
    let input = "<content>See `<thou";
    check(&filament, input, &[("content", "See `<thou")], &[ClosedAtEof]);
    // A call named in a code span is text too.
    let chat = Registry::chat();
    let input = "Wrap the JSON in `<tool_call>` tags, then `</tool_call>`.\n\nThen wait.";
    check(&chat, input, &[("content", input)], &[]);
    // A call in an open block is text as well, where calls are read (no
    // runtime runs an example); where they are left out of the text it is
    // an example element (see `rewrite_can_omit_call_elements`).
    let input = "E:\n```\n<tool_call>{\"name\": \"f\"}</tool_call>\n```\nend";
    check(&chat, input, &[("content", input)], &[]);
}
