//! `variable_update` payloads: the intended `[OP, path, value?]` list out of
//! fenced, sloppy, legacy and broken bodies, at chunk sizes whole, 1 and 7.

use serde_json::{Value, json};
use spindle::event::Event;
use spindle::{Parser, Registry};

fn run(input: &str, chunk: usize) -> Vec<Event> {
    let mut parser = Parser::new(Registry::filament());
    let mut out = Vec::new();
    for c in input.as_bytes().chunks(chunk.max(1)) {
        out.extend(parser.feed(c));
    }
    out.extend(parser.finish());
    out
}

/// The `variable_update` payloads of a response, the same at every chunking.
fn updates(input: &str) -> Vec<Value> {
    let mut first: Option<Vec<Value>> = None;
    for chunk in [usize::MAX, 1, 7] {
        let got: Vec<Value> = run(input, chunk)
            .iter()
            .filter_map(Event::as_element)
            .filter(|e| &*e.tag == "variable_update")
            .map(|e| e.payload.clone())
            .collect();
        match &first {
            None => first = Some(got),
            Some(f) => assert_eq!(&got, f, "chunk {chunk} of {input:?}"),
        }
    }
    first.unwrap_or_default()
}

fn ops(input: &str) -> Value {
    let all = updates(input);
    assert_eq!(all.len(), 1, "one variable_update expected in {input:?}: {all:?}");
    all[0]["ops"].clone()
}

/// Bodies and the ops they mean. Every body is wrapped in a response
/// before being parsed.
fn table() -> Vec<(&'static str, Value)> {
    let std_ops = json!([["SET", "纯田真奈.好感度", 2], ["ADD", "mood.value", 1]]);
    vec![
        (
            "<analysis>\n    - 角色对白模拟插入\n  </analysis>\n  [\n    [\"SET\", \"纯田真奈.好感度\", 2],\n    [\"ADD\", \"mood.value\", 1]\n  ]",
            std_ops.clone(),
        ),
        ("```json\n[[\"SET\", \"纯田真奈.好感度\", 2], [\"ADD\", \"mood.value\", 1]]\n```", std_ops.clone()),
        ("```\n[[\"SET\", \"纯田真奈.好感度\", 2], [\"ADD\", \"mood.value\", 1],]\n```", std_ops.clone()),
        ("[['set', '纯田真奈.好感度', 2], ['add', 'mood.value', 1]]", std_ops.clone()),
        (
            "[\n  [\"SET\", \"纯田真奈.好感度\", 2], // she likes it\n  [\"ADD\", \"mood.value\", 1] # mood\n]",
            std_ops.clone(),
        ),
        ("[[\"SET\", \"纯田真奈.好感度\", 2]\n [\"ADD\", \"mood.value\", 1]]", std_ops.clone()),
        ("[\"SET\", \"纯田真奈.好感度\", 2]\n[\"ADD\", \"mood.value\", 1]", std_ops.clone()),
        ("{\"ops\": [[\"SET\", \"纯田真奈.好感度\", 2], [\"ADD\", \"mood.value\", 1]]}", std_ops.clone()),
        (
            "[{\"op\": \"set\", \"path\": \"纯田真奈.好感度\", \"value\": 2}, {\"op\": \"ADD\", \"path\": \"mood.value\", \"value\": 1}]",
            std_ops.clone(),
        ),
        (
            "Here are the updates:\n[[\"SET\", \"纯田真奈.好感度\", 2], [\"ADD\", \"mood.value\", 1]]\nDone.",
            std_ops.clone(),
        ),
        (
            "[[\u{201c}SET\u{201d}, \u{201c}纯田真奈.好感度\u{201d}, 2], [\u{201c}ADD\u{201d}, \u{201c}mood.value\u{201d}, 1]]",
            std_ops.clone(),
        ),
        ("[[\"SET\", \"纯田真奈.好感度\", 2], [\"ADD\", \"mood.value\", 1]", std_ops.clone()),
        ("[[\"SET\", \"纯田真奈.好感度\", 2], [\"ADD\", \"mood.value\", 1", std_ops.clone()),
        (
            "[[\"SET\", \"flag\", True], [\"SET\", \"note\", None], [\"PUSH\", \"log\", {\"t\": 'x',}], [\"POP\", \"log\"], [\"DELETE\", \"tmp\"]]",
            json!([["SET", "flag", true], ["SET", "note", null], ["PUSH", "log", {"t": "x"}], ["POP", "log"], ["DELETE", "tmp"]]),
        ),
        (
            "[[\"MUL\", \"gold\", 1.5], [\"DIV\", \"hp\", 2], [\"SUB\", \"mp\", -3], [\"SET\", \"items[0].name\", \"剑\"]]",
            json!([["MUL", "gold", 1.5], ["DIV", "hp", 2], ["SUB", "mp", -3], ["SET", "items[0].name", "剑"]]),
        ),
        (
            "<Analysis>悠纪.好感度: Y</Analysis>\n_.set('悠纪.好感度', 33,35);//愉快的一次讨论\n_.set('暮莲.日程.周三.上午', \"空\", \"地点：data_center_zone.数据服务器室 行为：检查\");//规划",
            json!([
                ["SET", "悠纪.好感度", 35],
                ["SET", "暮莲.日程.周三.上午", "地点：data_center_zone.数据服务器室 行为：检查"]
            ]),
        ),
        (
            "_.set('当前时间[0]', '2026-6-1 10:05', '2026-6-1 10:15');//时间流逝\n_.add('悠纪.好感度[0]', 2);\n_.assign('悠纪.重要成就[0]', '告白成功');\n_.remove('悠纪.着装[0]');",
            json!([
                ["SET", "当前时间[0]", "2026-6-1 10:15"],
                ["ADD", "悠纪.好感度[0]", 2],
                ["PUSH", "悠纪.重要成就[0]", "告白成功"],
                ["DELETE", "悠纪.着装[0]"]
            ]),
        ),
        ("", json!([])),
    ]
}

#[test]
fn intended_ops_from_every_form() {
    for (body, want) in table() {
        for tag in ["variable_update", "state_update", "UpdateVariable"] {
            let input = format!("<thought>plan</thought>\n<content>「你好」</content>\n<{tag}>{body}</{tag}>\n");
            assert_eq!(ops(&input), want, "{tag}: {body}");
        }
    }
}

#[test]
fn broken_structure_around_the_update() {
    let body = "[[\"SET\", \"a\", 1], [\"ADD\", \"b\", 2],]";
    let want = json!([["SET", "a", 1], ["ADD", "b", 2]]);
    let inputs = [
        // No </variable_update>: closed at the end of the response.
        format!("<content>hi</content><variable_update>{body}"),
        // No <content> tags at all: the bare text is content.
        format!("Hello there.\n<variable_update>{body}</variable_update>"),
        // Closed with the legacy name.
        format!("<content>hi</content><variable_update>{body}</UpdateVariable>"),
        // Content never closed: the update closes it.
        format!("<content>hi <b>there</b>\n<UpdateVariable>{body}</UpdateVariable>"),
        // Odd spacing and case in the tags.
        format!("<content>hi</content>< Variable_Update >{body}</ variable_update >"),
    ];
    for input in inputs {
        assert_eq!(ops(&input), want, "{input}");
    }
}

#[test]
fn analysis_is_kept() {
    let all = updates(
        "<content>x</content><variable_update><analysis>\n  - reason one\n  - reason two\n</analysis>[[\"SET\", \"a\", 1]]</variable_update>",
    );
    assert_eq!(all[0]["analysis"], json!("- reason one\n- reason two"));
    let all = updates("<content>x</content><variable_update>[[\"SET\", \"a\", 1]]</variable_update>");
    assert_eq!(all[0]["analysis"], Value::Null);
    let all =
        updates("<content>x</content><variable_update><analysis>no close\n[[\"SET\", \"a\", 1]]</variable_update>");
    assert_eq!(all[0]["analysis"], json!("no close"));
    assert_eq!(all[0]["ops"], json!([["SET", "a", 1]]));
}

#[test]
fn invalid_ops_are_listed_and_reported() {
    let input = "<content>x</content><variable_update>[\
        [\"SET\", \"ok\", 1],\
        [\"SET\", \"no_value\"],\
        [\"POP\", \"a\", 1],\
        [\"ADD\", \"hp\", \"five\"],\
        [\"FLY\", \"a\", 1],\
        [\"SET\", 5, 1],\
        [\"SET\", \"a..b\", 1],\
        \"not an op\",\
        [\"remove\", \"gone\"]\
    ]</variable_update>";
    let evs = run(input, 7);
    let el = evs.iter().filter_map(Event::as_element).find(|e| &*e.tag == "variable_update");
    let p = el.map(|e| e.payload.clone()).unwrap_or_default();
    assert_eq!(p["ops"], json!([["SET", "ok", 1], ["DELETE", "gone"]]));
    let invalid: Vec<u64> =
        p["invalid"].as_array().map(|a| a.iter().filter_map(|i| i["index"].as_u64()).collect()).unwrap_or_default();
    assert_eq!(invalid, [1, 2, 3, 4, 5, 6, 7]);
    for entry in p["invalid"].as_array().into_iter().flatten() {
        assert!(entry["error"].as_str().is_some_and(|e| !e.is_empty()), "{entry}");
    }
    let reported = evs.iter().filter(|e| matches!(e, Event::Diagnostic(d) if d.code == "invalid_op")).count();
    assert_eq!(reported, 7);
    assert!(evs.iter().any(|e| matches!(e, Event::Diagnostic(d) if d.code == "op_alias")));
}

#[test]
fn unparsable_ops_fall_back_to_content_and_the_rest_flows() {
    let input = "<content>before</content><variable_update><analysis>why</analysis>this is not json at all (really)</variable_update><content>after</content>";
    let evs = run(input, 1);
    let els: Vec<_> = evs.iter().filter_map(Event::as_element).collect();
    assert_eq!(els.len(), 3, "{els:?}");
    assert_eq!(els[1].payload["analysis"], json!("why"));
    assert!(els[1].payload["error"].is_string());
    assert_eq!(els[2].payload["html"], json!("after"));
    assert!(
        evs.iter().any(|e| matches!(e, Event::Repair(r) if r.kind == spindle::event::RepairKind::FallbackToContent))
    );
}

#[test]
fn ten_megabytes_in_one_update_is_bounded() {
    let big = format!(
        "<content>x</content><variable_update>[[\"SET\", \"a\", \"{}\"]]</variable_update><content>after</content>",
        "y".repeat(10 << 20)
    );
    let mut parser = Parser::new(Registry::filament());
    let mut evs = Vec::new();
    for c in big.as_bytes().chunks(64 << 10) {
        evs.extend(parser.feed(c));
        // The machine keeps at most the 4 MiB element limit (its buffer may
        // have twice that capacity), however much arrives.
        assert!(parser.held_bytes() <= 9 << 20, "held {}", parser.held_bytes());
    }
    evs.extend(parser.finish());
    let upd = evs.iter().filter_map(Event::as_element).find(|e| &*e.tag == "variable_update");
    let upd = upd.unwrap_or_else(|| panic!("no update"));
    assert!(upd.truncated);
    assert!(upd.payload["error"].is_string());
    assert!(evs.iter().any(|e| matches!(e, Event::Diagnostic(d) if d.code == "payload_truncated")));
    let after = evs.iter().filter_map(Event::as_element).filter(|e| &*e.tag == "content").nth(1);
    assert_eq!(after.map(|e| e.payload["html"].clone()), Some(json!("after")));
}

#[test]
fn brackets_in_prose_before_the_ops() {
    let input = "<content>x</content><variable_update>Mood [calm] rises a bit.\n[[\"SET\", \"mood\", \"calm\"], [\"ADD\", \"calm\", 1]]</variable_update>";
    assert_eq!(ops(input), json!([["SET", "mood", "calm"], ["ADD", "calm", 1]]));
    let evs = run(input, 1);
    assert!(evs.iter().any(|e| matches!(e, Event::Diagnostic(d) if d.code == "json_surrounding_prose")));
    assert!(!evs.iter().any(|e| matches!(e, Event::Diagnostic(d) if d.code == "invalid_op")));
}
