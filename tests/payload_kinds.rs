//! Payloads of every Filament tag, read through the whole parser at chunk
//! sizes whole, 1 and 7 (the payload must not depend on the chunking).

use serde_json::{Value, json};
use spindle::calls::OnError;
use spindle::event::{Event, Level, RepairKind};
use spindle::{Parser, Registry};

fn events(registry: &Registry, input: &str, chunk: usize) -> Vec<Event> {
    let mut parser = Parser::new(registry.clone());
    let mut out = Vec::new();
    for c in input.as_bytes().chunks(chunk.max(1)) {
        out.extend(parser.feed(c));
    }
    out.extend(parser.finish());
    out
}

/// The payload of the first element of `tag`, checked to be the same at
/// chunk sizes whole, 1 and 7.
fn payload_in(registry: &Registry, input: &str, tag: &str) -> (Value, Vec<Event>) {
    let mut first: Option<(Value, Vec<Event>)> = None;
    for chunk in [usize::MAX, 1, 7] {
        let evs = events(registry, input, chunk);
        let p = evs
            .iter()
            .filter_map(Event::as_element)
            .find(|e| &*e.tag == tag)
            .map(|e| e.payload.clone())
            .unwrap_or_else(|| panic!("no <{tag}> element in {input:?}: {evs:?}"));
        match &first {
            None => first = Some((p, evs)),
            Some((f, _)) => assert_eq!(&p, f, "payload of {input:?} differs at chunk {chunk}"),
        }
    }
    first.unwrap_or_else(|| panic!("unreachable"))
}

fn payload(input: &str, tag: &str) -> Value {
    payload_in(&Registry::filament(), input, tag).0
}

fn codes(events: &[Event]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Diagnostic(d) => Some(d.code.to_string()),
            _ => None,
        })
        .collect()
}

#[test]
fn tool_call() {
    let table: &[(&str, Value)] = &[
        (
            "<tool_call name=\"weather_forecast\">\n{\n  \"location\": \"Ancient Ruins\",\n  \"days\": 3,\n  \"units\": \"celsius\"\n}\n</tool_call>",
            json!({"name": "weather_forecast", "arguments": {"location": "Ancient Ruins", "days": 3, "units": "celsius"}}),
        ),
        (
            "<tool_call>{\"name\": \"search\", \"arguments\": {\"q\": \"rust\"}}</tool_call>",
            json!({"name": "search", "arguments": {"q": "rust"}}),
        ),
        (
            "<tool_call>{\"name\": \"search\", \"arguments\": \"{\\\"q\\\": \\\"rust\\\"}\"}</tool_call>",
            json!({"name": "search", "arguments": {"q": "rust"}}),
        ),
        (
            "<tool_call>{\"name\": \"search\", \"q\": \"rust\", \"limit\": 3}</tool_call>",
            json!({"name": "search", "arguments": {"q": "rust", "limit": 3}}),
        ),
        (
            "<tool_call name=\"w\">```json\n{location: 'Paris', days: 3, metric: True,}\n```</tool_call>",
            json!({"name": "w", "arguments": {"location": "Paris", "days": 3, "metric": true}}),
        ),
        (
            "<tool_call name=\"w\">Sure, calling it now:\n{\"location\": \"Paris\" // the city\n}</tool_call>",
            json!({"name": "w", "arguments": {"location": "Paris"}}),
        ),
        ("<tool_call name=\"noop\"></tool_call>", json!({"name": "noop", "arguments": {}})),
        (
            "<tool_call name=\"w\">\"{\\\"city\\\": \\\"Oslo\\\"}\"</tool_call>",
            json!({"name": "w", "arguments": {"city": "Oslo"}}),
        ),
        (
            "<tool_call name=\"w\">{\"arguments\": {\"city\": \"Oslo\"}}</tool_call>",
            json!({"name": "w", "arguments": {"city": "Oslo"}}),
        ),
        (
            "<tool_call name=\"w\">{\"name\": \"Paris\", \"days\": 2}</tool_call>",
            json!({"name": "w", "arguments": {"name": "Paris", "days": 2}}),
        ),
        (
            "<tool_call name=\"w\">{\"location\": \"Paris\", \"days\": [1, 2",
            json!({"name": "w", "arguments": {"location": "Paris", "days": [1, 2]}}),
        ),
    ];
    for (input, want) in table {
        assert_eq!(&payload(input, "tool_call"), want, "{input}");
    }
}

/// Qwen3-Coder's `<function=NAME><parameter=KEY>VALUE</parameter></function>`
/// form: values as strings (a schema types them when the call is
/// checked), one line break trimmed at each end, missing closes ended by
/// what follows; JSON arguments inside `<function=…>` too.
#[test]
fn tool_call_in_qwen3_coders_form() {
    let table: &[(&str, Value)] = &[
        (
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
            json!({"name": "get_weather", "arguments": {"city": "Paris", "days": "3"}}),
        ),
        (
            "<tool_call><function=write_file><parameter=text>\nline one\n\n  line two\n</parameter></function></tool_call>",
            json!({"name": "write_file", "arguments": {"text": "line one\n\n  line two"}}),
        ),
        (
            "<tool_call><function=f><parameter=a>1<parameter=b>2</function></tool_call>",
            json!({"name": "f", "arguments": {"a": "1", "b": "2"}}),
        ),
        ("<tool_call><function=f><parameter=a>x", json!({"name": "f", "arguments": {"a": "x"}})),
        ("<tool_call><function=noop></function></tool_call>", json!({"name": "noop", "arguments": {}})),
        (
            "<tool_call><function=get_weather>{\"city\":\"Lisbon\"}</function></tool_call>",
            json!({"name": "get_weather", "arguments": {"city": "Lisbon"}}),
        ),
    ];
    for (input, want) in table {
        assert_eq!(&payload(input, "tool_call"), want, "{input}");
    }
    // No name: no call, said so by the call reader.
    let nameless = payload("<tool_call><function=><parameter=a>1</parameter></function></tool_call>", "tool_call");
    assert_eq!(nameless["name"], Value::Null);
}

/// GLM-4.5's `NAME<arg_key>KEY</arg_key><arg_value>VALUE</arg_value>` form:
/// values as strings (a schema types them when the call is checked), on
/// lines of their own or not, missing closes ended by what follows; a
/// body that is one name is a call without arguments.
#[test]
fn tool_call_in_glms_form() {
    let table: &[(&str, Value)] = &[
        (
            "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Beijing</arg_value>\n<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call>",
            json!({"name": "get_weather", "arguments": {"city": "Beijing", "days": "2"}}),
        ),
        (
            "<tool_call>search<arg_key>q</arg_key><arg_value>a <b> c</arg_value><arg_key>filters</arg_key><arg_value>{\"lang\": \"en\"}</arg_value></tool_call>",
            json!({"name": "search", "arguments": {"q": "a <b> c", "filters": "{\"lang\": \"en\"}"}}),
        ),
        (
            "<tool_call>f<arg_key>a<arg_value>1<arg_key>b</arg_key><arg_value>two\nlines\n</tool_call>",
            json!({"name": "f", "arguments": {"a": "1", "b": "two\nlines"}}),
        ),
        ("<tool_call>get_time\n</tool_call>", json!({"name": "get_time", "arguments": {}})),
        ("<tool_call>Math.Add</tool_call>", json!({"name": "Math.Add", "arguments": {}})),
    ];
    for (input, want) in table {
        assert_eq!(&payload(input, "tool_call"), want, "{input}");
    }
    // Two words, or a word set apart by spaces, are prose: not a call.
    for prose in ["<tool_call>call it</tool_call>", "<tool_call> and </tool_call>"] {
        let p = payload(prose, "tool_call");
        assert!(p.get("error").is_some(), "{prose}: {p}");
    }
}

#[test]
fn ui_component() {
    let table: &[(&str, Value)] = &[
        (
            "<ui_component view=\"widget.inventory_grid\">\n{\n  \"filter\": \"magical_items\",\n  \"columns\": 3,\n  \"max_items\": 12\n}\n</ui_component>",
            json!({"view": "widget.inventory_grid", "props": {"filter": "magical_items", "columns": 3, "max_items": 12}}),
        ),
        (
            "<ui_component view='widget.map'>{'center': [1.5, -2], zoom: 3, 'labels': None}</ui_component>",
            json!({"view": "widget.map", "props": {"center": [1.5, -2], "zoom": 3, "labels": null}}),
        ),
        (
            "<ui_component>{\"view\": \"w.x\", \"props\": {\"a\": 1}}</ui_component>",
            json!({"view": "w.x", "props": {"a": 1}}),
        ),
        ("<ui_component view=\"w.empty\"/>", json!({"view": "w.empty", "props": {}})),
    ];
    for (input, want) in table {
        assert_eq!(&payload(input, "ui_component"), want, "{input}");
    }
}

#[test]
fn ui_component_view_must_be_namespaced() {
    let codes = |input: &str| -> Vec<String> {
        let (_, evs) = payload_in(&Registry::filament(), input, "ui_component");
        evs.iter()
            .filter_map(|e| match e {
                Event::Diagnostic(d) => Some(d.code.to_string()),
                _ => None,
            })
            .filter(|c| c.starts_with("ui_component"))
            .collect()
    };
    for bad in ["inventory", "rpg.", ".map", "rpg..map", "1rpg.map", "rpg map.x", "rpg.m@p"] {
        let input = format!("<content>x</content><ui_component view=\"{bad}\">{{}}</ui_component>");
        assert_eq!(codes(&input), ["ui_component_view_invalid"], "{bad}");
        // Kept as written: the handler decides.
        assert_eq!(payload(&input, "ui_component")["view"], bad);
    }
    for good in ["rpg.inventory", "widget.inventory_grid", "my-ns.sub.view_2", "界面.地图"] {
        let input = format!("<content>x</content><ui_component view=\"{good}\">{{}}</ui_component>");
        assert!(codes(&input).is_empty(), "{good}");
    }
}

#[test]
fn json_keys_keep_the_models_order() {
    let p = payload("<tool_call name=\"x\">{\"z\": 1, \"a\": 2, \"m\": 3}</tool_call>", "tool_call");
    let keys: Vec<&String> = p["arguments"].as_object().map(|m| m.keys().collect()).unwrap_or_default();
    assert_eq!(keys, ["z", "a", "m"]);
}

#[test]
fn unparsable_json_falls_back_to_content() {
    let input = "<content>hi</content><tool_call name=\"x\">{\"a\": <b>1</b> ]]]</tool_call>";
    let (p, evs) = payload_in(&Registry::filament(), input, "tool_call");
    assert!(p["error"].as_str().is_some_and(|e| e.contains("not JSON")), "{p}");
    let repair = evs.iter().find_map(|e| match e {
        Event::Repair(r) if r.kind == RepairKind::FallbackToContent => Some(r.clone()),
        _ => None,
    });
    let repair = repair.unwrap_or_else(|| panic!("no fallback repair in {evs:?}"));
    assert_eq!(repair.tag.as_deref(), Some("tool_call"));
    assert_eq!(repair.text.as_deref(), Some("{\"a\": <b>1</b> ]]]"));
    assert!(
        evs.iter()
            .any(|e| matches!(e, Event::Diagnostic(d) if d.code == "payload_unparsable" && d.level == Level::Error))
    );
    // A prose body is not an argument object either.
    let (p, _) = payload_in(&Registry::filament(), "<tool_call name=\"x\">I cannot do that.</tool_call>", "tool_call");
    assert!(p.get("error").is_some(), "{p}");
}

#[test]
fn leniencies_are_reported_on_the_element() {
    let (_, evs) = payload_in(&Registry::filament(), "<tool_call name=\"x\">{a: 'b',}</tool_call>", "tool_call");
    let c = codes(&evs);
    for want in ["json_trailing_comma", "json_single_quotes", "json_unquoted_key"] {
        assert!(c.iter().any(|x| x == want), "{want} missing from {c:?}");
    }
    let el_id = evs.iter().filter_map(Event::as_element).find(|e| &*e.tag == "tool_call").map(|e| e.id);
    for e in &evs {
        if let Event::Diagnostic(d) = e
            && d.code.as_str().starts_with("json_")
        {
            assert_eq!(d.element, el_id);
            assert_eq!(d.tag.as_deref(), Some("tool_call"));
        }
    }
}

#[test]
fn media() {
    let table: &[(&str, Value)] = &[
        (
            "<media type=\"image\" src=\"assets/forest_night.jpg\" alt=\"黑暗森林的夜景\" />",
            json!({"type": "image", "src": "assets/forest_night.jpg", "alt": "黑暗森林的夜景"}),
        ),
        ("<media type=\"audio\" src=\"a.mp3\"></media>", json!({"type": "audio", "src": "a.mp3", "alt": null})),
        ("<media src=\"clip.mp4\"/>", json!({"type": "video", "src": "clip.mp4", "alt": null})),
        ("<media type=\"image\">pics/cat.png</media>", json!({"type": "image", "src": "pics/cat.png", "alt": null})),
        ("<media type=\"image\" src=\"javascript:alert(1)\"/>", json!({"type": "image", "src": null, "alt": null})),
    ];
    for (input, want) in table {
        assert_eq!(&payload(input, "media"), want, "{input}");
    }
}

#[test]
fn choice() {
    let table: &[(&str, Value)] = &[
        (
            "<choice>\n  <prompt>请选择源的下一步行动：</prompt>\n  <options>\n    <option id=\"investigate\">调查废墟</option>\n    <option id=\"rest\">休息恢复</option>\n    <option id=\"leave\">离开此地</option>\n  </options>\n</choice>",
            json!({"prompt": "请选择源的下一步行动：", "options": [
                {"id": "investigate", "label": "调查废墟"},
                {"id": "rest", "label": "休息恢复"},
                {"id": "leave", "label": "离开此地"}]}),
        ),
        (
            "<xx>\nWhat now?\n1. Go north\n2. Rest\n   a while\n3. Leave\n</xx>",
            json!({"prompt": "What now?", "options": [
                {"id": "1", "label": "Go north"},
                {"id": "2", "label": "Rest a while"},
                {"id": "3", "label": "Leave"}]}),
        ),
        (
            "<choice><prompt>Pick</prompt>\n- red\n- blue\n</choice>",
            json!({"prompt": "Pick", "options": [{"id": "1", "label": "red"}, {"id": "2", "label": "blue"}]}),
        ),
        (
            "<choice><option>Yes</option><option>No</option></choice>",
            json!({"prompt": null, "options": [{"id": "1", "label": "Yes"}, {"id": "2", "label": "No"}]}),
        ),
        (
            "<choice>\nA. fight\nB. flee\n</choice>",
            json!({"prompt": null, "options": [{"id": "A", "label": "fight"}, {"id": "B", "label": "flee"}]}),
        ),
    ];
    for (input, want) in table {
        assert_eq!(&payload(input, "choice"), want, "{input}");
    }
}

#[test]
fn details() {
    assert_eq!(
        payload("<details>\n  <summary>摘要</summary>\n  用户询问了森林的危险性。\n</details>", "details"),
        json!({"summary": "摘要", "body": "用户询问了森林的危险性。"})
    );
    assert_eq!(payload("<details>only body</details>", "details"), json!({"summary": null, "body": "only body"}));
    // The body is shown as HTML: it gets content's allowlist.
    let p = payload(
        "<details><summary>s</summary><b>ok</b><script>alert(1)</script><a href=\"javascript:x\">y</a><img src=x onerror=alert(2)></details>",
        "details",
    );
    let body = p["body"].as_str().unwrap_or_default();
    assert!(body.starts_with("<b>ok</b>"), "{body}");
    for bad in ["<script", "javascript:", "onerror"] {
        assert!(!body.contains(bad), "{bad} in {body}");
    }
}

/// A status bar's fields are free (spec 003 §3.3.1): a `<thinking>` or
/// an `<action>` field is a field, not a thought or an ACTION call block
/// that ends the bar and leaks the rest into the content.
#[test]
fn status_bar_fields_named_like_elements() {
    let input = "<content>hi</content><status_bar><mood>anxious</mood><thinking>她在想</thinking><action>walks to the door</action><location>X</location></status_bar>";
    let (p, evs) = payload_in(&Registry::filament(), input, "status_bar");
    assert_eq!(p, json!({"mood": "anxious", "thinking": "她在想", "action": "walks to the door", "location": "X"}));
    let tags: Vec<&str> = evs.iter().filter_map(Event::as_element).map(|e| &*e.tag).collect();
    assert_eq!(tags, ["content", "status_bar"]);
    assert!(!evs.iter().any(|e| matches!(e, Event::Repair(_))), "{evs:?}");
}

#[test]
fn status_bar() {
    let p = payload(
        "<status_bar>\n  <SFW>safe</SFW>\n  <mood>anxious</mood>\n  <location>Dark Forest</location>\n</status_bar>",
        "status_bar",
    );
    assert_eq!(p, json!({"SFW": "safe", "mood": "anxious", "location": "Dark Forest"}));
    let keys: Vec<&String> = p.as_object().map(|m| m.keys().collect()).unwrap_or_default();
    assert_eq!(keys, ["SFW", "mood", "location"], "order kept");

    let nested = payload(
        "<status_bar><hero><hp max=\"100\">80</hp><buffs><buff>haste</buff><buff>shield</buff></buffs></hero><note>x &amp; y</note></status_bar>",
        "status_bar",
    );
    assert_eq!(
        nested,
        json!({"hero": {"hp": {"@max": "100", "#text": "80"}, "buffs": {"buff": ["haste", "shield"]}}, "note": "x & y"})
    );
    assert_eq!(
        payload("<status_bar>\nHP: 50\n心情：平静\n</status_bar>", "status_bar"),
        json!({"HP": "50", "心情": "平静"})
    );
}

#[test]
fn custom_registry_tags() {
    let registry = Registry::from_toml_str(
        r#"
        extends = "filament"
        [[tag]]
        name = "status_block"
        aliases = ["StatusBlock"]
        body = "structured"
        [[tag]]
        name = "scene"
        body = "json"
        [[tag]]
        name = "code_block"
        body = "raw"
    "#,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let (p, _) = payload_in(
        &registry,
        "<StatusBlock kind=\"rp\"><name>Mana</name>text<stat k=\"v\"/></StatusBlock>",
        "status_block",
    );
    assert_eq!(
        p,
        json!({"attrs": {"kind": "rp"}, "children": [
            {"tag": "name", "attrs": {}, "children": ["Mana"]},
            "text",
            {"tag": "stat", "attrs": {"k": "v"}, "children": []}]})
    );
    let (p, _) = payload_in(&registry, "<scene id=\"1\">{mood: 'dark'}</scene>", "scene");
    assert_eq!(p, json!({"attrs": {"id": "1"}, "value": {"mood": "dark"}}));
    let (p, _) = payload_in(&registry, "<code_block><b>x</b></code_block>", "code_block");
    assert_eq!(p, json!({"attrs": {}, "text": "<b>x</b>"}));
}

#[test]
fn thought_has_no_payload_and_content_is_filtered() {
    let evs = events(
        &Registry::filament(),
        "<thought>I <b>think</b></thought><content>Hi <i>there</i><!-- note --></content>",
        1,
    );
    let els: Vec<_> = evs.iter().filter_map(Event::as_element).collect();
    assert_eq!(els[0].payload, Value::Null);
    assert_eq!(els[1].payload, json!({"html": "Hi <i>there</i>", "comments": [" note "]}));
    assert_eq!(els[1].text, "Hi <i>there</i><!-- note -->", "text stays raw");
}

#[test]
fn truncated_elements_get_an_error_payload() {
    let mut options = spindle::ParserOptions::default();
    options.machine.max_element_len = 64;
    let body = format!("[[\"SET\", \"a\", \"{}\"]]", "x".repeat(200));
    let input = format!("<content>ok</content><variable_update>{body}</variable_update>");
    let mut parser = Parser::with_options(std::sync::Arc::new(Registry::filament()), options);
    let mut evs = parser.feed(input.as_bytes());
    evs.extend(parser.finish());
    let el = evs.iter().filter_map(Event::as_element).find(|e| &*e.tag == "variable_update");
    let el = el.unwrap_or_else(|| panic!("no element"));
    assert!(el.truncated);
    assert_eq!(el.payload["truncated"], json!(true));
    assert!(el.payload["error"].is_string());
    assert!(codes(&evs).iter().any(|c| c == "payload_truncated"));
    // The text still reaches the UI through the fallback repair.
    assert!(evs.iter().any(|e| matches!(e, Event::Repair(r) if r.kind == RepairKind::FallbackToContent)));
}

#[test]
fn content_cut_at_the_size_limit_is_the_same_at_any_split() {
    // The limit falls inside a two-byte character, after some markup.
    let text = format!("{}<b>bold</b> {}«««é😀 end", "a".repeat(20), "c".repeat(7));
    let input = format!("<content>{text}</content>");
    let mut whole: Option<(String, Value)> = None;
    for chunk in [input.len(), 1, 2, 3, 7, 16] {
        let mut options = spindle::ParserOptions::default();
        options.machine.max_element_len = 40;
        let mut parser = Parser::with_options(std::sync::Arc::new(Registry::filament()), options);
        let mut evs = Vec::new();
        for piece in input.as_bytes().chunks(chunk) {
            evs.extend(parser.feed(piece));
        }
        evs.extend(parser.finish());
        let el = evs.iter().find_map(Event::as_element).unwrap_or_else(|| panic!("no element"));
        // The kept text ends with a whole character, just past the limit.
        assert!(el.truncated && el.text.len() == 41 && el.text.ends_with('«'), "{chunk}: {:?}", el.text);
        assert!(!codes(&evs).iter().any(|c| c == "invalid_utf8"), "{chunk}: {:?}", codes(&evs));
        // The deltas are the whole text, every character intact.
        let deltas: String = evs
            .iter()
            .filter_map(|e| match e {
                Event::Delta(d) => Some(d.text.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(deltas, text, "{chunk}");
        // The html covers the kept text, whatever the split.
        assert_eq!(el.payload["html"], json!(el.text), "{chunk}");
        let seen = (el.text.clone(), el.payload.clone());
        assert_eq!(whole.get_or_insert_with(|| seen.clone()), &seen, "{chunk}");
    }
}

#[test]
fn reasoning_profile_content_is_filtered() {
    let (p, _) =
        payload_in(&Registry::reasoning(), "Hmm <script>x</script></think>Answer <b>42</b><img src=x>", "content");
    assert_eq!(p, json!({"html": "Answer <b>42</b>", "comments": []}));
}

#[test]
fn parser_and_filter_can_move_between_threads() {
    fn assert_send<T: Send>() {}
    assert_send::<Parser>();
    assert_send::<spindle::payload::html::HtmlFilter>();
    // A parser in the middle of a content element moves to another thread.
    let mut parser = Parser::new(Registry::filament());
    let mut evs = parser.feed(b"<content>Hi <b>the");
    let handle = std::thread::spawn(move || {
        let mut evs = parser.feed(b"re</b><script>x</script></content>");
        evs.extend(parser.finish());
        evs
    });
    evs.extend(handle.join().unwrap_or_default());
    let html = evs.iter().filter_map(Event::as_element).map(|e| e.payload["html"].clone()).next();
    assert_eq!(html, Some(json!("Hi <b>there</b>")));
}

/// An element reclassified after it streamed (bare text closed by
/// `</variable_update>`: the model forgot the open tag) gets the payload of
/// its new tag, not of the lead tag it opened as.
#[test]
fn a_reclassified_element_gets_the_payload_of_its_new_tag() {
    let registry = Registry::filament();
    let input = "[[\"SET\", \"a\", 1]]</variable_update><content>hi</content>";
    let (payload, evs) = payload_in(&registry, input, "variable_update");
    assert_eq!(payload["ops"], json!([["SET", "a", 1]]));
    assert!(evs.iter().any(|e| matches!(e, Event::Repair(r) if r.kind == RepairKind::Reclassified)));
}

/// A content element of endless comments and distinct unknown tags keeps a
/// payload of bounded size: at most 1024 comments listed (each still in its
/// own event), at most 32 names per list of the HTML report.
#[test]
fn content_payload_lists_are_bounded() {
    let mut text = String::from("<content>");
    for i in 0..1500 {
        text.push_str(&format!("<!-- c{i} -->x <tag{i}>y</tag{i}> <b onclick{i}=\"z\">b</b>"));
    }
    text.push_str("</content>");
    let (p, evs) = payload_in(&Registry::filament(), &text, "content");
    assert_eq!(p["comments"].as_array().map(Vec::len), Some(1024));
    assert_eq!(p["comments"][0], json!(" c0 "));
    let comment_events = evs.iter().filter(|e| matches!(e, Event::Comment(_))).count();
    assert_eq!(comment_events, 1500);
    let cut = evs.iter().find_map(|e| match e {
        Event::Diagnostic(d) if d.code == "payload_truncated" => Some(d.message.clone()),
        _ => None,
    });
    assert!(cut.is_some_and(|m| m.contains("476 more")), "{evs:?}");
    let filtered = evs
        .iter()
        .find_map(|e| match e {
            Event::Diagnostic(d) if d.code == "html_filtered" => Some(d.message.clone()),
            _ => None,
        })
        .unwrap_or_default();
    // 32 names, then the rest counted together, in both lists (a tag
    // shown as text counts its open and its close).
    assert!(filtered.contains("removed attributes: (other names) ×1468, onclick0,"), "{filtered}");
    assert!(filtered.contains("shown as text: (other names) ×2936, tag0 ×2,"), "{filtered}");
    assert!(filtered.len() < 2000, "{} bytes: {filtered}", filtered.len());
}

/// A tool call past the element size limit streams its kept part as call
/// deltas and the rest as plain deltas: each byte once, none in both.
#[test]
fn a_call_past_the_size_limit_streams_each_byte_once() {
    let args = "a".repeat(300);
    let input = format!("<tool_call>{{\"name\": \"f\", \"arguments\": {{\"s\": \"{args}\"}}}}</tool_call>");
    let body = &input["<tool_call>".len()..input.len() - "</tool_call>".len()];
    for chunk in [usize::MAX, 1, 7] {
        let mut options = spindle::ParserOptions::default();
        options.machine.max_element_len = 100;
        let mut parser = Parser::with_options(std::sync::Arc::new(Registry::reasoning()), options);
        let mut evs = Vec::new();
        for c in input.as_bytes().chunks(chunk.min(input.len())) {
            evs.extend(parser.feed(c));
        }
        evs.extend(parser.finish());
        let (mut call_args, mut deltas) = (String::new(), String::new());
        for e in &evs {
            match e {
                Event::CallDelta(c) => call_args.push_str(&c.arguments),
                Event::Delta(d) if &*d.tag == "tool_call" => deltas.push_str(&d.text),
                _ => {}
            }
        }
        let el = evs.iter().find_map(Event::as_element).unwrap_or_else(|| panic!("no element"));
        assert!(el.truncated, "{chunk}");
        assert_eq!(format!("{}{deltas}", el.text), body, "{chunk}");
        assert!(call_args.len() <= 100, "{chunk}: {} bytes of call arguments", call_args.len());
    }
}

/// Several calls in one `<tool_call>` (one object after another, or a
/// list): the first is the payload's call, the others `more_calls`, and
/// `filament_call` makes a step of each, independent of the others.
#[test]
fn several_calls_in_one_tool_call() {
    let a = json!({"name": "Echo", "arguments": {"text": "a"}});
    let b = json!({"name": "Add", "arguments": {"a": 1, "b": 2}});
    let both = json!({"name": "Echo", "arguments": {"text": "a"}, "more_calls": [b]});
    let table: &[(&str, Value)] = &[
        (
            "<tool_call>\n{\"name\": \"Echo\", \"arguments\": {\"text\": \"a\"}}\n{\"name\": \"Add\", \"arguments\": {\"a\": 1, \"b\": 2}}\n</tool_call>",
            both.clone(),
        ),
        (
            "<tool_call>[{\"name\": \"Echo\", \"arguments\": {\"text\": \"a\"}}, {\"name\": \"Add\", \"arguments\": \"{\\\"a\\\": 1, \\\"b\\\": 2}\"}]</tool_call>",
            both.clone(),
        ),
        ("<tool_call>[{\"name\": \"Echo\", \"arguments\": {\"text\": \"a\"}}]</tool_call>", a.clone()),
    ];
    let registry = Registry::filament();
    for (input, want) in table {
        let (p, events) = payload_in(&registry, input, "tool_call");
        assert_eq!(&p, want, "{input}");
        assert!(codes(&events).contains(&"several_calls".to_string()), "{input}: {:?}", codes(&events));
        let el = events.iter().filter_map(Event::as_element).find(|e| &*e.tag == "tool_call").unwrap();
        let call = spindle::calls::filament_call(el);
        let steps: Vec<(&str, OnError)> = call.steps.iter().map(|s| (s.tool_id.as_str(), s.on_error)).collect();
        let want: Vec<(&str, OnError)> = match p.get("more_calls") {
            Some(_) => vec![("Echo", OnError::Continue), ("Add", OnError::Continue)],
            None => vec![("Echo", OnError::Stop)],
        };
        assert_eq!(steps, want, "{input}");
    }
    // Prose after one call, or a list of what are not calls: as before.
    let p = payload("<tool_call>{\"name\": \"Echo\", \"arguments\": {}} and that is all</tool_call>", "tool_call");
    assert_eq!(p, json!({"name": "Echo", "arguments": {}}));
    let p = payload("<tool_call>[1, 2]</tool_call>", "tool_call");
    assert_eq!(p["name"], Value::Null);
}

/// Among several calls in one `<tool_call>`, one whose arguments are not a
/// JSON object (a string that is not JSON, a list) is a step
/// marked `malformed_arguments`, wherever it stands; the others still run.
/// A lone call with such arguments is a malformed call, as before.
#[test]
fn a_malformed_call_among_several_does_not_stop_the_others() {
    let registry = Registry::filament();
    // Each input, and its steps: the tool and why it is not runnable.
    type Steps = &'static [(&'static str, Option<&'static str>)];
    let table: &[(&str, Steps)] = &[
        (
            "<tool_call>[{\"name\": \"Echo\", \"arguments\": {\"text\": \"a\"}}, {\"name\": \"Add\", \"arguments\": \"a=1, b=2\"}]</tool_call>",
            &[("Echo", None), ("Add", Some("malformed_arguments"))],
        ),
        (
            "<tool_call>\n{\"name\": \"Add\", \"arguments\": [1, 2]}\n{\"name\": \"Echo\", \"arguments\": {\"text\": \"a\"}}\n</tool_call>",
            &[("Add", Some("malformed_arguments")), ("Echo", None)],
        ),
    ];
    for (input, want) in table {
        let (_, events) = payload_in(&registry, input, "tool_call");
        let el = events.iter().filter_map(Event::as_element).find(|e| &*e.tag == "tool_call").unwrap();
        let call = spindle::calls::filament_call(el);
        assert!(call.error.is_none(), "{input}: {:?}", call.error);
        let steps: Vec<(&str, Option<&str>)> =
            call.steps.iter().map(|s| (s.tool_id.as_str(), s.not_runnable.as_deref())).collect();
        assert_eq!(&steps, want, "{input}");
        assert!(call.steps.iter().all(|s| s.on_error == OnError::Continue), "{input}");
        let runnable = call.steps.iter().find(|s| s.not_runnable.is_none()).unwrap();
        assert!(!runnable.params.is_empty(), "{input}");
    }
    let (_, events) =
        payload_in(&registry, "<tool_call>{\"name\": \"Add\", \"arguments\": [1, 2]}</tool_call>", "tool_call");
    let el = events.iter().filter_map(Event::as_element).find(|e| &*e.tag == "tool_call").unwrap();
    let call = spindle::calls::filament_call(el);
    assert!(call.steps.is_empty());
    assert_eq!(call.error.as_deref(), Some("the arguments of Add are an array, not a JSON object"));
}

/// OpenAI's wire form written inside the tag (`{"type": "function",
/// "function": {"name", "arguments"}}`, the arguments a JSON string or an
/// object), alone or several in a list: read as the calls it describes.
#[test]
fn tool_call_in_openais_wire_form() {
    let one = "<tool_call>{\"type\": \"function\", \"function\": {\"name\": \"Echo\", \"arguments\": \"{\\\"text\\\": \\\"a\\\"}\"}}</tool_call>";
    let (p, events) = payload_in(&Registry::filament(), one, "tool_call");
    assert_eq!(p, json!({"name": "Echo", "arguments": {"text": "a"}}));
    assert!(!codes(&events).contains(&"tool_call_without_name".to_string()), "{:?}", codes(&events));
    let list = "<tool_call>[{\"type\": \"function\", \"function\": {\"name\": \"Echo\", \"arguments\": {\"text\": \"a\"}}}, {\"function\": {\"name\": \"Add\", \"arguments\": {\"a\": 1}}}]</tool_call>";
    assert_eq!(
        payload(list, "tool_call"),
        json!({"name": "Echo", "arguments": {"text": "a"}, "more_calls": [{"name": "Add", "arguments": {"a": 1}}]})
    );
    // A top-level name wins over an argument that happens to be called
    // `function`.
    let named = "<tool_call>{\"name\": \"define\", \"arguments\": {\"function\": {\"name\": \"f\"}}}</tool_call>";
    assert_eq!(payload(named, "tool_call"), json!({"name": "define", "arguments": {"function": {"name": "f"}}}));
}
