//! TAM blocks (spec 000, spec 002 §5) through `spindle parse --profile tam`
//! at chunk sizes 1, 7 and whole, and through the library.

mod calls_support;

use calls_support::*;
use proptest::prelude::*;
use serde_json::{Value, json};
use spindle::Registry;
use spindle::calls::tam::{normalize_key, parse_tam};

fn tam(input: &str) -> Vec<Value> {
    payloads(&parse_all_splits(input, &["--profile", "tam"]), "tam")
}

fn one(input: &str) -> Value {
    let mut p = tam(input);
    assert_eq!(p.len(), 1, "expected one TAM element in {input}");
    p.remove(0)
}

#[test]
fn spec000_5_1_single_step() {
    let p = one(&std::fs::read_to_string("corpora/tam-spec000-5-1-single-step.txt").unwrap());
    assert_eq!(
        steps(&p),
        [(
            "File.ApplyEdit".to_string(),
            json!({
                "file_path": "/path/to/main.js",
                "search_string": "console.log(\"old\");",
                "replace_string": "console.log(\"new\");"
            })
        )]
    );
    assert_eq!(p["steps"][0]["index"], Value::Null);
    assert_eq!(p["steps"][0]["on_error"], "stop");
    assert_eq!(p["steps"][0]["retry"], 0);
    assert!(warnings(&p).is_empty());
}

#[test]
fn spec000_5_2_multi_step() {
    let p = one(&std::fs::read_to_string("corpora/tam-spec000-5-2-multi-step.txt").unwrap());
    assert_eq!(p["request_id"], "req-20250805-report");
    assert_eq!(p["comment"], "生成每日报告的完整流程");
    assert_eq!(
        p["comments"],
        json!(["步骤 1: 异步生成封面图，如果失败则跳过", "步骤 2: 同步写日志", "步骤 3: 构建最终报告"])
    );
    let dir = "fam://project-x/reports/today";
    assert_eq!(
        steps(&p),
        [
            (
                "ImageTool.Generate".to_string(),
                json!({"prompt": "一只戴着宇航头盔的猫头鹰，赛博朋克风格", "output_uri": "@{common_output_dir}/cover.png", "output_dir": dir})
            ),
            (
                "File.Append".to_string(),
                json!({"file_path": "@{common_output_dir}/run.log", "content": "-- Report generation started at @{timestamp} --", "output_dir": dir})
            ),
            (
                "Report.Build".to_string(),
                json!({"payload": {
                    "title": "每日运营报告",
                    "coverImageUri": "@{common_output_dir}/cover.png",
                    "logFileUri": "@{common_output_dir}/run.log",
                    "author": "咕咕"
                }, "output_dir": dir})
            ),
        ]
    );
    let idx: Vec<&Value> = p["steps"].as_array().unwrap().iter().map(|s| &s["index"]).collect();
    assert_eq!(idx, [&json!(1), &json!(2), &json!(3)]);
    assert_eq!(p["steps"][0]["on_error"], "continue");
    assert_eq!(p["steps"][1]["on_error"], "stop");
    assert_eq!(p["steps"][2]["type_hints"], json!({"payload": "json"}));
    assert!(warnings(&p).is_empty(), "{:?}", warnings(&p));
}

#[test]
fn spec000_5_3_lenient_result() {
    let p = one(&std::fs::read_to_string("corpora/tam-spec000-5-3-lenient.txt").unwrap());
    // commands[0]: { index: 1, toolId: "File.Write", params: { file_path, content } }
    assert_eq!(p["steps"].as_array().unwrap().len(), 1);
    assert_eq!(p["steps"][0]["index"], 1);
    assert_eq!(p["steps"][0]["tool_id"], "File.Write");
    assert_eq!(p["steps"][0]["params"], json!({"file_path": "/logs/today.log", "content": "start…\nanother line"}));
    assert_eq!(warnings(&p), ["mixed_delimiters_used"]);
    assert_eq!(p["comments"], json!(["我的计划"]));
}

#[test]
fn spec002_cjk_delimiters() {
    let p = one(&std::fs::read_to_string("corpora/tam-spec002-5-2-1-single.txt").unwrap());
    assert_eq!(p["steps"][0]["tool_id"], "BilibiliFetch:getSubtitle");
    assert_eq!(p["steps"][0]["params"]["note"], "参数值 B，\n可以是多行。");
    assert!(warnings(&p).is_empty());

    let p = one(&std::fs::read_to_string("corpora/tam-spec002-5-2-2-chained.txt").unwrap());
    assert_eq!(
        steps(&p),
        [
            ("FileOperator.WriteFile".to_string(), json!({"file_path": "/logs/today.log", "content": "任务开始..."})),
            // Values are not unescaped: `\n` stays two characters.
            (
                "FileOperator.AppendFile".to_string(),
                json!({"file_path": "/logs/today.log", "content": "\\n添加新记录。"})
            ),
        ]
    );
    assert_eq!(p["comments"], json!(["步骤 1: 创建文件", "步骤 2: 追加日志"]));
}

#[test]
fn key_normalisation_follows_spec000_2_3() {
    let table = [
        ("File-Path 1", "file_path_1", "file_path", Some(1)),
        ("filePath_1", "file_path_1", "file_path", Some(1)),
        ("File Path_1", "file_path_1", "file_path", Some(1)),
        ("CONTENT1", "content_1", "content", Some(1)),
        ("command1", "command_1", "command", Some(1)),
        ("Command_1", "command_1", "command", Some(1)),
        ("  request-ID  ", "request_id", "request_id", None),
        ("type_hint_payload_3", "type_hint_payload_3", "type_hint_payload", Some(3)),
        ("onError2", "on_error_2", "on_error", Some(2)),
        ("HTTPRequest__URL", "http_request_url", "http_request_url", None),
        ("uri.Source.File-12", "uri_source_file_12", "uri_source_file", Some(12)),
        ("__weird__key__", "weird_key", "weird_key", None),
        ("参数1", "参数_1", "参数", Some(1)),
    ];
    for (raw, name, base, step) in table {
        let k = normalize_key(raw);
        assert_eq!((k.name.as_str(), k.base.as_str(), k.step), (name, base, step), "{raw:?}");
    }
}

#[test]
fn odd_key_spellings_reach_the_same_steps() {
    let input = "<|[REQUEST_TOOL]|>\nCOMMAND 1:»»»A.Run«««\nfilePath1:»»»/x«««\nFile-Path 2:»»»/y«««\ncommand-2:»»»B.Run«««\nOn Error 2:»»»Continue«««\nRETRY_2:»»»2«««\n<|[END_TOOL]|>";
    let p = one(input);
    assert_eq!(
        steps(&p),
        [("A.Run".to_string(), json!({"file_path": "/x"})), ("B.Run".to_string(), json!({"file_path": "/y"}))]
    );
    assert_eq!(p["steps"][1]["on_error"], "continue");
    assert_eq!(p["steps"][1]["retry"], 2);
}

#[test]
fn steps_run_in_numeric_order() {
    let input = "<|[REQUEST_TOOL]|>\ncommand_10:»»»Ten«««\ncommand_2:»»»Two«««\ncommand_1:»»»One«««\nx_10:»»»10«««\n<|[END_TOOL]|>";
    let p = one(input);
    let ids: Vec<String> = steps(&p).into_iter().map(|(t, _)| t).collect();
    assert_eq!(ids, ["One", "Two", "Ten"]);
    assert_eq!(p["steps"][2]["params"], json!({"x": "10"}));
}

/// Held-out style variants: (name, input, steps, warnings that must be
/// present).
#[test]
fn variants() {
    let cases: &[(&str, &str, Value, &[&str])] = &[
        (
            "missing close before next key",
            "<|[REQUEST_TOOL]|>\ncommand:»»»X.Y\npath:»»»a«««\n<|[END_TOOL]|>",
            json!([["X.Y", {"path": "a"}]]),
            &["missing_close_delimiter"],
        ),
        (
            "missing close at end marker",
            "<|[REQUEST_TOOL]|>\ncommand:»»»X.Y«««\nbody:»»»line 1\nline 2\n<|[END_TOOL]|>",
            json!([["X.Y", {"body": "line 1\nline 2"}]]),
            &["missing_close_delimiter"],
        ),
        (
            "value closed in another style",
            "<|[REQUEST_TOOL]|>\ncommand:»»»X.Y<<<\npath:>>>a«««\n<|[END_TOOL]|>",
            json!([["X.Y", {"path": "a"}]]),
            &["mixed_delimiters_used"],
        ),
        (
            "only angle delimiters",
            "<|[REQUEST_TOOL]|>\ncommand:>>>X.Y<<<\npath:>>>a<<<\n<|[END_TOOL]|>",
            json!([["X.Y", {"path": "a"}]]),
            &["alternate_delimiters_used"],
        ),
        (
            "delimiters missing altogether",
            "<|[REQUEST_TOOL]|>\ncommand: X.Y\npath: a b\n<|[END_TOOL]|>",
            json!([["X.Y", {"path": "a b"}]]),
            &["missing_delimiters"],
        ),
        (
            "fence around the key lines",
            "<|[REQUEST_TOOL]|>\n```tam\ncommand:»»»X.Y«««\n```\n<|[END_TOOL]|>",
            json!([["X.Y", {}]]),
            &[],
        ),
        (
            "markers with spaces, dashes, lower case",
            "text <| [request-tool] |>\ncommand:»»»X.Y«««\n<|end_tool|> more",
            json!([["X.Y", {}]]),
            &[],
        ),
        (
            "two keys on one line",
            "<|[REQUEST_TOOL]|>command:»»»X.Y«««path:»»»a«««<|[END_TOOL]|>",
            json!([["X.Y", {"path": "a"}]]),
            &[],
        ),
        (
            "delimiter-like text inside a value",
            "<|[REQUEST_TOOL]|>\ncommand:»»»X.Y«««\ndiff:»»»<<<<<<< SEARCH\na >>> b\n=======\n>>>>>>> REPLACE«««\n<|[END_TOOL]|>",
            json!([["X.Y", {"diff": "<<<<<<< SEARCH\na >>> b\n=======\n>>>>>>> REPLACE"}]]),
            &[],
        ),
        (
            "markup and CDATA inside values",
            "<|[REQUEST_TOOL]|>\ncommand:»»»X.Y«««\nhtml:»»»<b>bold</b> <![CDATA[ x ]]> <!-- c --> &amp;«««\n<|[END_TOOL]|>",
            json!([["X.Y", {"html": "<b>bold</b> <![CDATA[ x ]]> <!-- c --> &amp;"}]]),
            &[],
        ),
        (
            "full-width colon and CJK delimiters",
            "<|[REQUEST_TOOL]|>\ncommand：「始」X.Y「末」\n内容：「始」你好「末」\n<|[END_TOOL]|>",
            json!([["X.Y", {"内容": "你好"}]]),
            &[],
        ),
        (
            "block indented, values multi-line",
            "<|[REQUEST_TOOL]|>\n    command:»»»X.Y«««\n    code:»»»def f():\n        return 1\n    «««\n<|[END_TOOL]|>",
            json!([["X.Y", {"code": "def f():\n    return 1"}]]),
            &[],
        ),
        (
            "a digit in a parameter name of a single step",
            "<|[REQUEST_TOOL]|>\ncommand:»»»Hash.Check«««\nsha256:»»»abc«««\nfile_path_1:»»»/x«««\n<|[END_TOOL]|>",
            json!([["Hash.Check", {"sha256": "abc", "file_path": "/x"}]]),
            &["step_number_mismatch"],
        ),
        (
            "opening delimiter on the line after the key",
            "<|[REQUEST_TOOL]|>\ncommand:»»»X.Y«««\npayload:\n»»»\n{\"a\": 1}\n«««\n<|[END_TOOL]|>",
            json!([["X.Y", {"payload": "{\"a\": 1}"}]]),
            &[],
        ),
        (
            "a key-like line in another style inside a value",
            "<|[REQUEST_TOOL]|>\ncommand:»»»X.Y«««\ndoc:»»»Usage:\nExample: >>> f(1)\n2\n«««\n<|[END_TOOL]|>",
            json!([["X.Y", {"doc": "Usage:\nExample: >>> f(1)\n2"}]]),
            &[],
        ),
        (
            "missing close, next key in another style",
            "<|[REQUEST_TOOL]|>\ncommand:>>>X.Y\npath:»»»a«««\n<|[END_TOOL]|>",
            json!([["X.Y", {"path": "a"}]]),
            &["missing_close_delimiter", "mixed_delimiters_used"],
        ),
        (
            "stray prose inside the block",
            "<|[REQUEST_TOOL]|>\nI will now call the tool.\ncommand:»»»X.Y«««\n<|[END_TOOL]|>",
            json!([["X.Y", {}]]),
            &["stray_text"],
        ),
    ];
    for (name, input, want, want_warnings) in cases {
        let p = one(input);
        let got: Vec<Value> = steps(&p).into_iter().map(|(t, params)| json!([t, params])).collect();
        assert_eq!(Value::Array(got), *want, "{name}");
        let w = warnings(&p);
        for code in *want_warnings {
            assert!(w.iter().any(|x| x == code), "{name}: {code} missing from {w:?}");
        }
        if want_warnings.is_empty() {
            assert!(w.is_empty(), "{name}: unexpected warnings {w:?}");
        }
    }
}

#[test]
fn type_hints_uris_and_common() {
    let p = one(&std::fs::read_to_string("corpora/tam-modifiers.txt").unwrap());
    assert_eq!(p["request_id"], "req-42");
    let s1 = &p["steps"][0];
    assert_eq!(s1["tool_id"], "Blob.Upload");
    assert_eq!(s1["params"]["note"], "hello, 世界!");
    assert_eq!(s1["params"]["file_path"], "/data/shared.bin");
    assert_eq!(s1["params"]["mode"], "fast");
    assert_eq!(s1["uris"], json!({"source": "fam://project-data/images/input.png"}));
    assert_eq!(s1["comment"], "upload first");
    let s2 = &p["steps"][1];
    assert_eq!(s2["params"]["config"], json!({"retries": 3, "tags": ["a", "b"]}));
    assert_eq!(s2["params"]["mode"], "slow", "a step's own value overrides common_");
    assert_eq!((s2["on_error"].as_str(), s2["retry"].as_u64()), (Some("continue"), Some(3)));
    assert!(warnings(&p).contains(&"unnumbered_param_applied_to_all".to_string()));
}

#[test]
fn bad_modifiers_are_reported_not_fatal() {
    let (call, f) = parse_tam(
        "\ncommand:»»»X«««\non_error:»»»explode«««\nretry:»»»many«««\ntype_hint_a:»»»json«««\na:»»»{nope«««\ntype_hint_b:»»»base64«««\nb:»»»***«««\ntype_hint_c:»»»yaml«««\nc:»»»x«««\n",
    );
    let s = &call.steps[0];
    assert_eq!(s.on_error, spindle::calls::OnError::Stop);
    assert_eq!(s.retry, 0);
    assert_eq!(s.params["a"], "{nope");
    assert_eq!(s.params["b"], "***");
    assert_eq!(s.params["c"], "x");
    for code in ["invalid_on_error", "invalid_retry", "type_hint_failed", "unknown_type_hint"] {
        assert!(f.warnings.iter().any(|w| w == code), "{code} in {:?}", f.warnings);
    }
    assert_eq!(f.diagnostics.len(), 5);
}

#[test]
fn a_block_without_command_is_an_error_payload() {
    let p = one("<|[REQUEST_TOOL]|>\npath:»»»a«««\n<|[END_TOOL]|>");
    assert_eq!(p["steps"], json!([]));
    assert!(p["error"].as_str().unwrap().contains("command"));
    assert!(p["observation"].as_str().unwrap().starts_with("Observation: Error - "));
    assert_eq!(p["unassigned"], json!({"path": "a"}));
}

#[test]
fn orphan_step_parameters_are_kept() {
    let (call, f) = parse_tam("\ncommand_1:»»»A«««\ncommand_2:»»»B«««\npath_3:»»»lost?«««\n");
    assert_eq!(call.unassigned["path_3"], "lost?");
    assert!(f.warnings.contains(&"params_without_command".to_string()));
}

#[test]
fn truncated_block_still_gives_its_steps() {
    let events =
        parse_all_splits(&std::fs::read_to_string("corpora/tam-truncated.txt").unwrap(), &["--profile", "tam"]);
    let p = payloads(&events, "tam");
    assert_eq!(
        steps(&p[0]),
        [("File.Write".to_string(), json!({"file_path": "/tmp/out.txt", "content": "partial content that was cut"}))]
    );
    assert!(warnings(&p[0]).contains(&"missing_close_delimiter".to_string()));
    assert!(events.iter().any(|e| e["type"] == "repair" && e["kind"] == "closed_at_eof" && e["tag"] == "tam"));
    // With context, the block itself is flagged as cut off.
    let tracked = tracked_payloads(&profile("tam"), &events);
    assert!(warnings(&tracked[0]).contains(&"unterminated_block".to_string()));
    assert_eq!(tracked[0]["response_text"], "Let me save that.");
}

#[test]
fn block_cut_at_every_byte_never_fails() {
    // Every prefix of the §5.2 example parses; once `command_1`'s value is
    // complete the first step is there with its tool id.
    let full = std::fs::read_to_string("corpora/tam-spec000-5-2-multi-step.txt").unwrap();
    let mark = full.find("on_error_1").unwrap();
    for (cut, _) in full.char_indices() {
        let events = spindle::parse(profile("tam"), &full.as_bytes()[..cut]);
        let p: Vec<&Value> =
            events.iter().filter_map(|e| e.as_element()).filter(|e| &*e.tag == "tam").map(|e| &e.payload).collect();
        if cut >= mark {
            assert_eq!(p[0]["steps"][0]["tool_id"], "ImageTool.Generate", "cut at {cut}");
        }
        for payload in p {
            for step in payload["steps"].as_array().unwrap() {
                let id = step["tool_id"].as_str().unwrap();
                assert!(!id.contains(['»', '«', '\n']), "cut at {cut}: {id:?}");
            }
        }
    }
}

#[test]
fn end_marker_cut_at_eof_is_dropped() {
    let input = "<|[REQUEST_TOOL]|>\ncommand:»»»X«««\n<|[END_TO";
    let events = parse_all_splits(input, &["--profile", "tam"]);
    let p = payloads(&events, "tam");
    assert_eq!(steps(&p[0]), [("X".to_string(), json!({}))]);
    assert!(events.iter().any(|e| e["type"] == "repair" && e["kind"] == "truncated_marker"));
}

#[test]
fn free_text_around_blocks_is_content_without_repairs() {
    let events =
        parse_all_splits(&std::fs::read_to_string("corpora/tam-two-blocks.txt").unwrap(), &["--profile", "tam"]);
    let content: Vec<&str> = events
        .iter()
        .filter(|e| e["type"] == "element" && e["tag"] == "content")
        .map(|e| e["text"].as_str().unwrap())
        .collect();
    assert_eq!(content, ["First I read, then I write.\n", "Then:\n"]);
    assert!(!events.iter().any(|e| e["type"] == "repair"), "no repairs expected: {events:#?}");
    let p = payloads(&events, "tam");
    assert_eq!(p[1]["steps"][0]["params"]["content"], "<content>not a tag</content> &amp; <|[not a marker]|>");
    // Content is streamed as deltas while it arrives.
    assert!(events.iter().any(|e| e["type"] == "delta" && e["tag"] == "content"));
    let tracked = tracked_payloads(&profile("tam"), &events);
    assert_eq!(tracked[0]["response_text"], "First I read, then I write.");
    assert_eq!(tracked[1]["response_text"], "Then:");
}

#[test]
fn fenced_blocks_are_recognised() {
    let p = tam(&std::fs::read_to_string("corpora/tam-fenced-block.txt").unwrap());
    assert_eq!(p.len(), 2);
    assert_eq!(p[0]["steps"][0]["params"]["content"], "```python\nprint(\"a code fence inside a value stays\")\n```");
    assert_eq!(steps(&p[1]), [("File.Append".to_string(), json!({"file_path": "notes/log.md", "content": "line"}))]);
}

#[test]
fn filament_users_can_opt_in_to_tam() {
    let path = "tests/data/filament-tam.toml";
    let registry = Registry::load(std::path::Path::new(path)).unwrap();
    let input = "<thought>I should write it down.</thought>\n<content>Writing now.</content>\n<|[REQUEST_TOOL]|>\ncommand:»»»File.Write«««\ncontent:»»»<b>hi</b></content>«««\n<|[END_TOOL]|>\n";
    let events = parse_all_splits(input, &["--registry", path]);
    let p = payloads(&events, "tam");
    assert_eq!(steps(&p[0]), [("File.Write".to_string(), json!({"content": "<b>hi</b></content>"}))]);
    let tags: Vec<&str> =
        events.iter().filter(|e| e["type"] == "element").map(|e| e["tag"].as_str().unwrap()).collect();
    assert_eq!(tags, ["thought", "content", "tam"]);
    assert!(!events.iter().any(|e| e["type"] == "repair"), "{events:#?}");
    let tracked = tracked_payloads(&registry, &events);
    assert_eq!(tracked[0]["response_text"], "Writing now.");
}

// ----- property: generated blocks read back to what was written --------

const DELIMS: [(&str, &str); 3] = [("»»»", "«««"), ("「始」", "「末」"), (">>>", "<<<")];

fn spell(base: &str, n: u64, style: usize) -> String {
    match style % 4 {
        0 => format!("{base}_{n}"),
        1 => {
            // camelCase with the number glued on: filePath1
            let mut out = String::new();
            let mut up = false;
            for c in base.chars() {
                if c == '_' {
                    up = true;
                } else if up {
                    out.extend(c.to_uppercase());
                    up = false;
                } else {
                    out.push(c);
                }
            }
            format!("{out}{n}")
        }
        2 => format!("{} {n}", base.replace('_', "-").to_uppercase()),
        _ => format!("{base}{n}"),
    }
}

proptest! {
    #[test]
    fn generated_blocks_round_trip(
        steps_in in prop::collection::vec(
            (prop::sample::select(vec!["A.Run", "B.Write", "C"]),
             prop::collection::vec((prop::sample::select(vec!["file_path", "content", "query", "max_count"]), "[a-z0-9 .,\n{}\\[\\]<>&\"#-]{0,20}", 0usize..3, 0usize..4), 0..3)),
            1..4),
        indent in prop::sample::select(vec!["", "  ", "\t"]),
        chunk in 1usize..9,
    ) {
        let mut block = String::from("<|[REQUEST_TOOL]|>\n");
        let mut want = Vec::new();
        for (i, (tool, params)) in steps_in.iter().enumerate() {
            let n = i as u64 + 1;
            let (o, c) = DELIMS[i % 2];
            block.push_str(&format!("{indent}{}:{o}{tool}{c}\n", spell("command", n, i)));
            let mut map = serde_json::Map::new();
            for (name, value, d, style) in params {
                let (o, c) = DELIMS[*d % 2];
                // A value line must not look like a key line or a comment
                // once trimmed; values are trimmed.
                let value = value.replace('\n', " ").trim().to_string();
                if value.starts_with('#') { continue; }
                block.push_str(&format!("{indent}{}:{o}{value}{c}\n", spell(name, n, *style)));
                map.insert(name.to_string(), Value::String(value));
            }
            want.push((tool.to_string(), Value::Object(map)));
        }
        block.push_str("<|[END_TOOL]|>");
        let events = spindle::parse(profile("tam"), block.as_bytes());
        let whole: Vec<Value> = events.iter().filter_map(|e| e.as_element()).filter(|e| &*e.tag == "tam").map(|e| e.payload.clone()).collect();
        prop_assert_eq!(whole.len(), 1);
        prop_assert_eq!(steps(&whole[0]), want);
        // Split invariance of the payload.
        let mut parser = spindle::Parser::new(profile("tam"));
        let mut split = Vec::new();
        for c in block.as_bytes().chunks(chunk) { split.extend(parser.feed(c)); }
        split.extend(parser.finish());
        let split: Vec<Value> = split.iter().filter_map(|e| e.as_element()).filter(|e| &*e.tag == "tam").map(|e| e.payload.clone()).collect();
        prop_assert_eq!(split, whole);
    }
}

/// A TAM block of `n` values: none closed (`""`), all closed (`"«««"`), or
/// alternating styles with nothing closed (`"mixed"`), the block's last line
/// closing a far-away `»»»` value.
fn bulk_block(n: usize, close: &str) -> String {
    let mut block = String::from("\ncommand:»»»Bulk.Load«««\n");
    for i in 0..n {
        match close {
            "mixed" if i % 2 == 0 => block.push_str(&format!("key_{i}_x:»»»value {i}\n")),
            "mixed" => block.push_str(&format!("key_{i}_x:>>>value {i}\n")),
            close => block.push_str(&format!("key_{i}_x:»»»value {i}{close}\n")),
        }
    }
    block.push_str("«««\n");
    block
}

#[test]
fn large_blocks_parse_in_linear_time() {
    // 10 000 values without closing delimiters, and 10 000 with: each value
    // must not rescan the rest of the block. Checked as a ratio in one run,
    // not against a clock (machines and build profiles differ): four times
    // the values take about four times as long, where a rescan would take
    // sixteen. The best of three runs of each size damps a busy machine.
    for close in ["", "«««", "mixed"] {
        let (small, large) = (bulk_block(2_500, close), bulk_block(10_000, close));
        let (call, _) = parse_tam(&large);
        if close != "mixed" {
            assert_eq!(call.steps[0].params.len() + call.unassigned.len(), 10_000);
        } else {
            // Near the final `«««`, `>>>` lines read as text of the open
            // `»»»` value before them; the rest are keys.
            assert!(call.steps[0].params.len() > 9_000);
        }
        let best = |block: &str| {
            (0..3)
                .map(|_| {
                    let started = std::time::Instant::now();
                    std::hint::black_box(parse_tam(block));
                    started.elapsed()
                })
                .min()
                .unwrap_or_default()
        };
        let (small, large) = (best(&small), best(&large));
        let ratio = large.as_secs_f64() / small.as_secs_f64().max(1e-9);
        assert!(ratio < 9.0, "4x the values took {ratio:.1}x as long ({small:?} -> {large:?}) for close {close:?}");
    }
}

#[test]
fn rewrite_closes_a_cut_block_with_its_marker() {
    let input = std::fs::read_to_string("corpora/tam-truncated.txt").unwrap();
    for chunk in [None, Some(1), Some(7)] {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_spindle"));
        cmd.args(["parse", "corpora/tam-truncated.txt", "--profile", "tam", "--format", "rewrite"]);
        if let Some(n) = chunk {
            cmd.args(["--chunk-size", &n.to_string()]);
        }
        let out = String::from_utf8(cmd.output().unwrap().stdout).unwrap();
        assert_eq!(out, format!("{input}<|[END_TOOL]|>"), "chunk {chunk:?}");
    }
    // Complete blocks and the text around them are rewritten unchanged.
    for file in ["corpora/tam-two-blocks.txt", "corpora/tam-fenced-block.txt", "corpora/tam-spec000-5-2-multi-step.txt"]
    {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_spindle"))
            .args(["parse", file, "--profile", "tam", "--format", "rewrite"])
            .output()
            .unwrap();
        assert_eq!(String::from_utf8(out.stdout).unwrap(), std::fs::read_to_string(file).unwrap(), "{file}");
    }
}

/// Spec 002 §7.3: an agent's output is scanned for call blocks whatever else
/// it holds. With the built-in Filament profile a TAM block (and an ACTION
/// block) in the answer is a call element, never content.
#[test]
fn filament_profile_reads_tam_and_action_blocks() {
    let input = "<thought>Need the weather.</thought>\n<content>Let me check.\n<|[REQUEST_TOOL]|>\ncommand:»»»Weather.Get«««\ncity:»»»Paris«««\n<|[END_TOOL]|>\n</content>";
    let events = parse_all_splits(input, &["--profile", "filament"]);
    let calls = payloads(&events, "tam");
    assert_eq!(calls.len(), 1, "{events:?}");
    assert_eq!(steps(&calls[0]), [("Weather.Get".to_string(), json!({"city": "Paris"}))]);
    assert_eq!(calls[0]["response_text"], "Let me check.");
    let content: String = events
        .iter()
        .filter(|e| e["type"] == "element" && e["tag"] == "content")
        .map(|e| e["text"].as_str().unwrap().to_string())
        .collect();
    assert!(
        !content.contains("REQUEST_TOOL") && !content.contains("Weather.Get") && !content.contains("END_TOOL"),
        "{content:?}"
    );
    assert!(content.contains("Let me check."));
    assert!(!diagnostic_codes(&events).contains(&"special_token_dropped".to_string()));

    let action = "<content>Looking.</content>\n<ACTION><Look><at>sky</at></Look></ACTION>";
    let events = parse_all_splits(action, &["--profile", "filament"]);
    let calls = payloads(&events, "action");
    assert_eq!(steps(&calls[0]), [("Look".to_string(), json!({"at": "sky"}))]);

    // A registry file turns the call blocks off: the markers are then
    // dropped or kept as text, as before.
    let path = temp_path("no-calls.toml");
    std::fs::write(&path, "extends = \"filament\"\nwithout = [\"tam\", \"action\"]\n").unwrap();
    let events = parse_all_splits(input, &["--registry", path.to_str().unwrap()]);
    let _ = std::fs::remove_file(&path);
    assert!(payloads(&events, "tam").is_empty());
}

/// Spec 002 §5.3: the parser is insensitive to the case and underscores of
/// a key. `filepath` stands for `file_path` or `filePath`, when exactly one
/// declared parameter matches.
#[test]
fn tam_keys_match_declared_names_without_case_and_underscores() {
    use spindle::calls::{CallProblem, ParamProblem, ToolCatalog, ToolDef};
    let tool = |id: &str, names: &[&str]| {
        let props: serde_json::Map<String, Value> =
            names.iter().map(|n| (n.to_string(), json!({"type": "string"}))).collect();
        ToolDef::new(id, json!({"type": "object", "properties": props, "required": [names[0]]}))
    };
    let mut catalog = ToolCatalog::new();
    for def in [
        tool("Snake", &["file_path"]),
        tool("Camel", &["filePath"]),
        tool("Both", &["file_path", "filePath"]),
        tool("Open", &["file_path"]),
    ] {
        catalog.add(def).unwrap();
    }
    let block =
        |tool: &str, key: &str| format!("<|[REQUEST_TOOL]|>\ncommand:»»»{tool}«««\n{key}:»»»/tmp/x«««\n<|[END_TOOL]|>");
    let check = |tool: &str, key: &str| {
        let (call, _) = parse_tam(&block(tool, key));
        catalog.check_step(call.format, 0, &call.steps[0])
    };
    for key in ["filepath", "FILEPATH", "file_path", "filePath", "File_Path", "file-path"] {
        for tool in ["Snake", "Camel"] {
            let params = check(tool, key).unwrap_or_else(|e| panic!("{tool} {key}: {e}"));
            let want = if tool == "Snake" { "file_path" } else { "filePath" };
            assert_eq!(Value::Object(params), json!({want: "/tmp/x"}), "{tool} {key}");
        }
    }
    // Two declared names match `filepath`: an error that names both.
    match check("Both", "filepath") {
        Err(p @ CallProblem::InvalidParams { .. }) => {
            let CallProblem::InvalidParams { problems, .. } = &p else { unreachable!() };
            assert_eq!(
                problems[0],
                ParamProblem::Ambiguous {
                    name: "filepath".into(),
                    candidates: vec!["file_path".into(), "filePath".into()]
                }
            );
            let obs = p.observation();
            let want = "Observation: Error - Invalid parameters for Both: Parameter 'filepath' is ambiguous: write it as one of 'file_path', 'filePath'";
            assert!(obs.starts_with(want), "{obs}");
        }
        other => panic!("{other:?}"),
    }
    // The normalised form is exact and wins: `filePath` is read as `file_path`.
    assert_eq!(Value::Object(check("Both", "file_path").unwrap()), json!({"file_path": "/tmp/x"}));
    // An open schema (additional properties allowed) maps the key too.
    let mut open = ToolCatalog::new();
    open.add(ToolDef::new(
        "Open",
        json!({"type": "object", "properties": {"file_path": {"type": "string"}},
        "required": ["file_path"], "additionalProperties": true}),
    ))
    .unwrap();
    let (call, _) = parse_tam(&block("Open", "filepath"));
    assert_eq!(Value::Object(open.check_step(call.format, 0, &call.steps[0]).unwrap()), json!({"file_path": "/tmp/x"}));
    // Not onto a name the step also gives as written.
    let (call, _) =
        parse_tam("<|[REQUEST_TOOL]|>\ncommand:»»»Snake«««\nfile_path:»»»a«««\nfilepath:»»»b«««\n<|[END_TOOL]|>");
    assert!(catalog.check_step(call.format, 0, &call.steps[0]).is_err());
}
