//! ACTION blocks (spec 004) through `spindle parse --profile action` at
//! chunk sizes 1, 7 and whole, and through the library.

mod calls_support;

use calls_support::*;
use serde_json::{Value, json};
use spindle::calls::action::{MALFORMED, parse_action};

fn action(input: &str) -> (Vec<Value>, Vec<Value>) {
    let events = parse_all_splits(input, &["--profile", "action"]);
    (payloads(&events, "action"), events)
}

fn corpus(name: &str) -> String {
    std::fs::read_to_string(format!("corpora/{name}")).unwrap()
}

#[test]
fn spec004_5_1_simple_call() {
    let input = corpus("action-spec004-5-1-simple.txt");
    let (p, events) = action(&input);
    assert_eq!(
        steps(&p[0]),
        [(
            "ReadWorldStateTool".to_string(),
            json!({"path": "environment.weather.current_conditions", "default_value": "unknown"})
        )]
    );
    assert!(warnings(&p[0]).is_empty());
    let t = tracked_payloads(&profile("action"), &events);
    assert_eq!(t[0]["response_text"], "Okay, I need to check the current weather to answer the player's question.");
    // The response text is streamed as content before the block completes.
    let first_delta = events.iter().position(|e| e["type"] == "delta" && e["tag"] == "content").unwrap();
    let action_el = events.iter().position(|e| e["type"] == "element" && e["tag"] == "action").unwrap();
    assert!(first_delta < action_el);
}

#[test]
fn spec004_5_2_repeated_names_become_arrays() {
    let (p, events) = action(&corpus("action-spec004-5-2-nested.txt"));
    assert_eq!(
        steps(&p[0]),
        [("read_file".to_string(), json!({"args": {"file": [{"path": "src/app.ts"}, {"path": "src/utils.ts"}]}}))]
    );
    let t = tracked_payloads(&profile("action"), &events);
    assert_eq!(
        t[0]["response_text"],
        "I need to read both the main application file and the utility functions to understand the context."
    );
}

#[test]
fn spec004_5_3_and_3_2_4_cdata_verbatim() {
    let (p, _) = action(&corpus("action-spec004-5-3-cdata.txt"));
    assert_eq!(p[0]["steps"][0]["tool_id"], "ApplyProjectDiff");
    assert_eq!(p[0]["steps"][0]["params"]["target_file"], "config/settings.json");
    assert_eq!(
        p[0]["steps"][0]["params"]["diff_patch"],
        "\n--- a/config/settings.json\n+++ b/config/settings.json\n@@ -1,5 +1,5 @@\n {\n-  \"feature_enabled\": false,\n+  \"feature_enabled\": true,\n   \"api_key\": \"old_key_value\"\n }\n            "
    );
    let (p, _) = action(&corpus("action-spec004-3-2-4-diff-cdata.txt"));
    let diff = p[0]["steps"][0]["params"]["diff_content"].as_str().unwrap();
    assert!(diff.contains("console.log(\"New version with <special & characters>\");\n>>>>>>> REPLACE"));
    assert!(diff.starts_with("\n<<<<<<< SEARCH\n:start_line:10\n-------\n"));
}

#[test]
fn spec004_5_4_text_only_has_no_call() {
    let (p, events) = action(&corpus("action-spec004-5-4-text-only.txt"));
    assert!(p.is_empty());
    let content: Vec<&Value> = events.iter().filter(|e| e["type"] == "element").map(|e| &e["text"]).collect();
    assert_eq!(content, [&json!("The weather is currently sunny and pleasant. It's a great day for an adventure!\n")]);
    assert!(!events.iter().any(|e| e["type"] == "repair" || e["type"] == "diagnostic"));
}

#[test]
fn spec004_5_5_both_turns() {
    let (p, events) = action(&corpus("action-spec004-5-5-turn1-wrong-param.txt"));
    assert_eq!(steps(&p[0]), [("GetPlayerInfo".to_string(), json!({"playerId": "player123"}))]);
    assert_eq!(tracked_payloads(&profile("action"), &events)[0]["response_text"], "I'll try to get the player's name.");
    // The comment inside the block is an event of its own, not a value.
    assert!(events.iter().any(|e| e["type"] == "comment" && e["tag"] == "action"));
    let (p, _) = action(&corpus("action-spec004-5-5-turn2-corrected.txt"));
    assert_eq!(steps(&p[0]), [("GetPlayerInfo".to_string(), json!({"player_id": "player123"}))]);
}

#[test]
fn cdata_entities_and_items() {
    let (p, _) = action(&corpus("action-cdata-tricky.txt"));
    assert_eq!(
        p[0]["steps"][0]["params"],
        json!({
            "event_type": "agent.note & log",
            "payload": "{\"text\": \"a < b && c > d\", \"arr\": [[1, 2]], \"close\": \"]]\"}",
            "tags": ["x<y", "</ACTION>", "R&D ☺"],
            "priority": "3",
            "urgent": "true",
            "query": "a < b and b > c & d"
        })
    );
    assert!(warnings(&p[0]).is_empty(), "{:?}", warnings(&p[0]));
}

/// Held-out style variants: (name, block inner text, params of the one
/// step).
#[test]
fn variants() {
    let cases: &[(&str, &str, Value)] = &[
        ("empty values", "<T><a/><b></b><c>  </c></T>", json!({"a": "", "b": "", "c": ""})),
        ("single item list", "<T><l><item>only</item></l></T>", json!({"l": ["only"]})),
        (
            "nested item objects",
            "<T><l><item><k>1</k></item><item><k>2</k></item></l></T>",
            json!({"l": [{"k": "1"}, {"k": "2"}]}),
        ),
        ("repeated parameter", "<T><f>1</f><f>2</f><g>3</g></T>", json!({"f": ["1", "2"], "g": "3"})),
        ("cdata with ]] and ]>", "<T><c><![CDATA[a]]b]>c]] >]]></c></T>", json!({"c": "a]]b]>c]] >"})),
        ("cdata then text", "<T><c><![CDATA[<x>]]> &amp; more</c></T>", json!({"c": "<x> & more"})),
        ("two cdata sections", "<T><c><![CDATA[a]]><![CDATA[b]]></c></T>", json!({"c": "ab"})),
        ("numeric entities", "<T><c>&#65;&#x42;&lt;&gt;&quot;&apos;</c></T>", json!({"c": "AB<>\"'"})),
        ("unknown entity kept", "<T><c>&copy; &bogus;</c></T>", json!({"c": "&copy; &bogus;"})),
        ("code fence around the tool", "\n```xml\n<T><a>1</a></T>\n```\n", json!({"a": "1"})),
        ("multi-line text trimmed", "<T><a>\n  line one\n  line two\n</a></T>", json!({"a": "line one\n  line two"})),
        ("special marker text", "<T><a><|[REQUEST_TOOL]|></a></T>", json!({"a": "<|[REQUEST_TOOL]|>"})),
        ("padded tag is text", "<T><a>x < y > z</a></T>", json!({"a": "x < y > z"})),
    ];
    for (name, inner, want) in cases {
        let input = format!("Doing it.\n<ACTION>{inner}</ACTION>");
        let (p, _) = action(&input);
        assert_eq!(p.len(), 1, "{name}");
        assert_eq!(p[0]["steps"][0]["tool_id"], "T", "{name}");
        assert_eq!(p[0]["steps"][0]["params"], *want, "{name}");
        assert!(p[0]["error"].is_null(), "{name}: {}", p[0]["error"]);
    }
}

#[test]
fn malformed_xml_gives_the_observation() {
    let cases = [
        ("mismatched close", "<GetPlayerInfo><player_id>p</player></GetPlayerInfo>"),
        ("never closed", "<GetPlayerInfo><player_id>p</GetPlayerInfo>"),
        ("stray close", "</GetPlayerInfo>"),
        ("empty block", "   "),
        ("text only", "GetPlayerInfo player_id=p"),
        ("close of an unopened element", "<GetPlayerInfo></player_id></GetPlayerInfo>"),
    ];
    for (name, inner) in cases {
        let (p, events) = action(&format!("Try.\n<ACTION>{inner}</ACTION>"));
        assert_eq!(p[0]["steps"], json!([]), "{name}");
        let err = p[0]["error"].as_str().unwrap();
        assert!(err.starts_with(MALFORMED), "{name}: {err}");
        let obs = p[0]["observation"].as_str().unwrap();
        assert!(obs.starts_with("Observation: Error - Malformed XML in ACTION block"), "{name}: {obs}");
        assert!(diagnostic_codes(&events).contains(&"malformed_xml".to_string()), "{name}");
    }
    let (p, _) = action(&corpus("action-malformed.txt"));
    assert!(p[0]["observation"].as_str().unwrap().contains("</player>"));
}

#[test]
fn second_block_and_several_tools_are_reported() {
    let (p, events) = action(&corpus("action-two-blocks.txt"));
    assert_eq!(p.len(), 2);
    assert_eq!(steps(&p[1]).len(), 2);
    assert!(warnings(&p[1]).contains(&"multiple_tools".to_string()));
    let t = tracked_payloads(&profile("action"), &events);
    assert!(!warnings(&t[0]).contains(&"second_action_block".to_string()));
    assert!(warnings(&t[1]).contains(&"second_action_block".to_string()));
    assert_eq!(t[1]["response_text"], "And also the player.");
}

#[test]
fn block_cut_mid_parameter_keeps_what_was_written() {
    let input = "Reading.\n<ACTION>\n  <read_file>\n    <args><file><path>src/app.ts</path></file><file><path>src/ut";
    let (p, events) = action(input);
    assert_eq!(
        steps(&p[0]),
        [("read_file".to_string(), json!({"args": {"file": [{"path": "src/app.ts"}, {"path": "src/ut"}]}}))]
    );
    assert!(warnings(&p[0]).contains(&"unclosed_elements".to_string()));
    assert!(p[0]["error"].is_null());
    let t = tracked_payloads(&profile("action"), &events);
    assert!(warnings(&t[0]).contains(&"unterminated_block".to_string()));
}

#[test]
fn truncated_block_keeps_what_is_complete() {
    let (p, events) = action(&corpus("action-truncated.txt"));
    assert_eq!(steps(&p[0]), [("read_file".to_string(), json!({"args": {"file": {"path": "src/app.ts"}}}))]);
    assert!(events.iter().any(|e| e["type"] == "repair" && e["kind"] == "closed_at_eof"));
    let t = tracked_payloads(&profile("action"), &events);
    assert!(warnings(&t[0]).contains(&"unterminated_block".to_string()));
}

#[test]
fn library_reader_reports_stray_parts() {
    let (call, f) = parse_action("hello <T a=\"1\">text<p>v</p></T>");
    assert_eq!(call.steps[0].params["p"], "v");
    for code in ["stray_text", "attributes_ignored", "tool_text_ignored"] {
        assert!(f.warnings.iter().any(|w| w == code), "{code} in {:?}", f.warnings);
    }
    let (call, f) = parse_action("<T><P>v</p></T>");
    assert_eq!(call.steps[0].params["P"], "v");
    assert_eq!(f.warnings, ["close_tag_case_mismatch"]);
    let deep = format!("<T>{}{}</T>", "<a>".repeat(100), "</a>".repeat(100));
    let (call, _) = parse_action(&deep);
    assert!(call.error.unwrap().contains("deeper"));
}

/// Writes `v` as XML text: escaped, or as CDATA when `cdata` (split where
/// the value holds `]]>`).
fn xml_text(v: &str, cdata: bool) -> String {
    if cdata {
        format!("<![CDATA[{}]]>", v.replace("]]>", "]]]]><![CDATA[>"))
    } else {
        v.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
    }
}

proptest::proptest! {
    /// Generated ACTION blocks read back to the parameters written, at any
    /// chunk size.
    #[test]
    fn generated_blocks_round_trip(
        params in proptest::collection::btree_map("[a-z][a-z_]{0,8}", ("[a-z <>&\\]\"'\n]{0,16}", proptest::bool::ANY), 1..5),
        list in proptest::collection::vec("[a-z&<]{1,5}", 0..4),
        chunk in 1usize..12,
    ) {
        let mut xml = String::from("Calling.\n<ACTION>\n  <Tool>\n");
        let mut want = serde_json::Map::new();
        for (name, (value, cdata)) in &params {
            if name == "item" || name == "l" { continue; }
            xml.push_str(&format!("    <{name}>{}</{name}>\n", xml_text(value, *cdata)));
            let read = if *cdata { value.clone() } else { value.trim().to_string() };
            want.insert(name.clone(), Value::String(read));
        }
        if !list.is_empty() {
            xml.push_str("    <l>");
            for v in &list { xml.push_str(&format!("<item>{}</item>", xml_text(v, false))); }
            xml.push_str("</l>\n");
            want.insert("l".into(), Value::Array(list.iter().map(|v| Value::String(v.clone())).collect()));
        }
        xml.push_str("  </Tool>\n</ACTION>\n");
        let mut parser = spindle::Parser::new(profile("action"));
        let mut events = Vec::new();
        for c in xml.as_bytes().chunks(chunk) { events.extend(parser.feed(c)); }
        events.extend(parser.finish());
        let p: Vec<&Value> = events.iter().filter_map(|e| e.as_element()).filter(|e| &*e.tag == "action").map(|e| &e.payload).collect();
        proptest::prop_assert_eq!(p.len(), 1);
        proptest::prop_assert_eq!(&p[0]["steps"][0]["params"], &Value::Object(want));
    }
}

#[test]
fn a_block_past_the_element_size_limit_does_not_run() {
    // ACTION: a value cut at the limit would run cut; TAM: the same, and a
    // block cut before its keys says so instead of "no command".
    let value = "A".repeat(200);
    let action_block = format!("<ACTION><Echo><text>{value}</text></Echo></ACTION>");
    let events = parse_all_splits(&action_block, &["--profile", "action", "--max-element", "64"]);
    let p = payloads(&events, "action");
    assert_eq!(p[0]["not_runnable"], "too_large", "{}", p[0]);
    assert!(p[0]["steps"].as_array().into_iter().flatten().all(|s| s["not_runnable"] == "too_large"), "{}", p[0]);
    assert!(diagnostic_codes(&events).contains(&"payload_truncated".to_string()));

    let tam_block = format!("<|[REQUEST_TOOL]|>\ncommand:»»»Echo«««\ntext:»»»{value}«««\n<|[END_TOOL]|>");
    let events = parse_all_splits(&tam_block, &["--profile", "tam", "--max-element", "64"]);
    let p = payloads(&events, "tam");
    assert_eq!(p[0]["not_runnable"], "too_large", "{}", p[0]);
    let events = parse_all_splits(&tam_block, &["--profile", "tam", "--max-element", "4"]);
    let p = payloads(&events, "tam");
    let observation = p[0]["observation"].as_str().unwrap_or_default();
    assert!(observation.contains("passed the element size limit"), "{}", p[0]);
    assert!(!observation.contains("no `command`"), "{observation}");
}
