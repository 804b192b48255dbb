//! The tool catalog: plugin loading (spec 002 §6-7, §10), call checking,
//! "did you mean" suggestions and observation texts (spec 004 §5.5), and
//! `spindle parse --tools DIR`.

mod calls_support;

use calls_support::*;
use serde_json::json;
use spindle::calls::catalog::{LoadOptions, closest, observation_success};
use spindle::calls::{CallFormat, CallProblem, CatalogError, ParamProblem, Step, ToolCall, ToolCatalog, ToolDef};
use std::path::{Path, PathBuf};

const PLUGINS: &str = "tests/data/plugins";

fn catalog() -> ToolCatalog {
    ToolCatalog::load_plugins(Path::new(PLUGINS)).unwrap()
}

fn call(format: CallFormat, tool: &str, params: serde_json::Value) -> ToolCall {
    let mut step = Step::new(tool);
    step.params = params.as_object().unwrap().clone();
    let mut c = ToolCall::new(format);
    c.steps.push(step);
    c
}

#[test]
fn loads_the_sample_plugins_dir() {
    let c = catalog();
    let plugins: Vec<&str> = c.plugins().iter().map(|p| p.manifest.name.as_str()).collect();
    assert_eq!(plugins, ["bilibili-fetch", "file-ops", "game-tools", "search", "theme-only"]);
    assert_eq!(c.len(), 17);
    // By the name OpenAI's API takes for the id, too.
    assert_eq!(
        c.get("BilibiliFetch_getSubtitle").map(|t| t.id.as_str()),
        Some("BilibiliFetch:getSubtitle"),
        "the OpenAI function name finds the tool"
    );
    assert!(c.get("BilibiliFetch getSubtitle").is_none(), "no other spelling");
    let b = c.get("BilibiliFetch:getSubtitle").unwrap();
    assert_eq!(b.display_name.as_deref(), Some("获取 Bilibili 视频字幕"));
    assert_eq!(b.implementation.as_ref().unwrap()["command"], "python scripts/BilibiliFetch.py");
    assert_eq!(b.extra["configSchema"][0]["key"], "bilibiliCookie");
    assert_eq!(b.plugin.as_deref(), Some("bilibili-fetch"));
    assert!(b.source.as_ref().unwrap().ends_with("bilibili-fetch/tools/bilibili.tool.json"));
    let theme = c.plugins().iter().find(|p| p.manifest.name == "theme-only").unwrap();
    assert!(theme.tools.is_empty());
    // A single plugin directory loads too.
    let one = ToolCatalog::load_plugins(&Path::new(PLUGINS).join("game-tools")).unwrap();
    assert_eq!(one.len(), 5);
    // Not a *.tool.json: not loaded.
    assert!(c.tools().all(|t| !t.id.contains("notes")));
}

#[test]
fn spec004_5_5_observation_text() {
    let c = catalog();
    let obs = c.observations(&call(CallFormat::Action, "GetPlayerInfo", json!({"playerId": "player123"})));
    assert_eq!(
        obs,
        [
            "Observation: Error - Invalid parameters for GetPlayerInfo: Unknown parameter 'playerId', did you mean 'player_id'?"
        ]
    );
    assert!(c.observations(&call(CallFormat::Action, "GetPlayerInfo", json!({"player_id": "player123"}))).is_empty());
    assert_eq!(
        observation_success("ReadWorldStateTool", "sunny"),
        "Observation: Tool ReadWorldStateTool executed successfully. Result: sunny"
    );
}

#[test]
fn unknown_tools_name_the_closest() {
    let c = catalog();
    let cases = [
        ("GetPlayerInfos", Some("GetPlayerInfo")),
        ("getplayerinfo", Some("GetPlayerInfo")),
        ("ReadWorldState", Some("ReadWorldStateTool")),
        ("File.ApplyEdits", Some("File.ApplyEdit")),
        ("file_write", Some("File.Write")),
        ("BilibiliFetch:getSubtitles", Some("BilibiliFetch:getSubtitle")),
        ("Zzz", None),
    ];
    for (id, want) in cases {
        let problems = c.check(&call(CallFormat::Tam, id, json!({})));
        match &problems[..] {
            [CallProblem::UnknownTool { id: got, suggestion, .. }] => {
                assert_eq!(got, id);
                assert_eq!(suggestion.as_deref(), want, "{id}");
            }
            other => panic!("{id}: {other:?}"),
        }
    }
    let obs = c.observations(&call(CallFormat::Tam, "GetPlayerInfos", json!({})));
    assert_eq!(obs, ["Observation: Error - Unknown tool ID 'GetPlayerInfos', did you mean 'GetPlayerInfo'?"]);
}

#[test]
fn parameter_problems() {
    let c = catalog();
    let check = |format, tool, params| match c.check(&call(format, tool, params)).as_slice() {
        [CallProblem::InvalidParams { problems, .. }] => problems.clone(),
        [] => Vec::new(),
        other => panic!("{other:?}"),
    };
    assert_eq!(
        check(CallFormat::Action, "ReadWorldStateTool", json!({"pathh": "a"})),
        [ParamProblem::Unknown { name: "pathh".into(), suggestion: Some("path".into()) }]
    );
    assert_eq!(
        check(CallFormat::Action, "ReadWorldStateTool", json!({})),
        [ParamProblem::Missing { name: "path".into() }]
    );
    assert_eq!(
        check(CallFormat::Action, "ReadWorldStateTool", json!({"path": "a", "zzz": 1})),
        [ParamProblem::Unknown { name: "zzz".into(), suggestion: None }]
    );
    // Text values take the schema's types where the text allows it.
    assert!(
        check(
            CallFormat::Action,
            "PublishEventTool",
            json!({"event_type": "e", "priority": " 3 ", "urgent": "TRUE", "tags": "one", "payload": "{\"a\": 1}"})
        )
        .is_empty()
    );
    let p = check(CallFormat::Action, "PublishEventTool", json!({"event_type": "e", "priority": "high"}));
    assert!(matches!(&p[..], [ParamProblem::Invalid { path, .. }] if path == "priority"), "{p:?}");
    let p = check(CallFormat::Action, "PublishEventTool", json!({"event_type": "e", "priority": "12"}));
    assert!(
        matches!(&p[..], [ParamProblem::Invalid { path, message }] if path == "priority" && message.contains("9")),
        "{p:?}"
    );
    // Nested: a single <file> is a one-element array; missing nested fields are reported with their path.
    assert!(
        check(CallFormat::Action, "read_file", json!({"args": {"file": {"path": "a", "max_lines": "10"}}})).is_empty()
    );
    let p = check(CallFormat::Action, "read_file", json!({"args": {"file": [{"path": "a"}, {"max_lines": "x"}]}}));
    assert_eq!(p.len(), 2, "{p:?}");
    assert!(
        p.iter().all(|x| matches!(x, ParamProblem::Invalid { path, .. } if path.starts_with("args.file.1"))),
        "{p:?}"
    );
    // TAM keys are normalised: they match camelCase schema names.
    assert!(check(CallFormat::Tam, "FileOperator.WriteFile", json!({"file_path": "/a", "content": "x"})).is_empty());
    // ACTION names are as written: file_path is not filePath.
    let p = check(CallFormat::Action, "FileOperator.WriteFile", json!({"file_path": "/a", "content": "x"}));
    assert_eq!(p, [ParamProblem::Unknown { name: "file_path".into(), suggestion: Some("filePath".into()) }]);
}

#[test]
fn uris_stand_for_their_parameter() {
    let c = catalog();
    let mut call = call(CallFormat::Tam, "File.Write", json!({"content": "x"}));
    call.steps[0].uris.insert("file_path".into(), "fam://a".into());
    assert!(c.check(&call).is_empty(), "{:?}", c.check(&call));
    call.steps[0].uris.insert("nope".into(), "fam://b".into());
    assert_eq!(c.check(&call).len(), 1);
}

#[test]
fn check_step_returns_converted_params() {
    let c = catalog();
    let step = &call(CallFormat::Action, "PublishEventTool", json!({"event_type": "e", "priority": "3", "tags": "t"}))
        .steps[0];
    let params = c.check_step(CallFormat::Action, 0, step).unwrap();
    assert_eq!(serde_json::Value::Object(params), json!({"event_type": "e", "priority": 3, "tags": ["t"]}));
    let step = &call(CallFormat::Tam, "FileOperator.WriteFile", json!({"file_path": "/a", "content": "x"})).steps[0];
    let params = c.check_step(CallFormat::Tam, 0, step).unwrap();
    assert_eq!(serde_json::Value::Object(params), json!({"filePath": "/a", "content": "x"}));
}

#[test]
fn closest_prefers_normalised_equality() {
    assert_eq!(closest("playerId", ["player", "player_id", "layer_id"]), Some("player_id"));
    assert_eq!(closest("FILE-PATH", ["file_name", "file_path"]), Some("file_path"));
    assert_eq!(closest("colour", ["color", "column"]), Some("color"));
    assert_eq!(closest("xyz", ["query", "max_results"]), None);
    assert_eq!(closest("x", std::iter::empty::<&str>()), None);
}

#[test]
fn attp_code_is_checked_against_tool_names() {
    let c = catalog();
    let (call, _) =
        spindle::calls::attp::parse_attp(&std::fs::read_to_string("corpora/attp-multi-tool-unfenced.txt").unwrap());
    assert_eq!(
        c.observations(&call),
        ["Observation: Error - Unknown tool 'serch_web' called in the code, did you mean 'search_web'?"]
    );
    // An empty catalog checks only the policy.
    assert!(ToolCatalog::new().observations(&call).is_empty());
    let (call, _) =
        spindle::calls::attp::parse_attp(&std::fs::read_to_string("corpora/attp-policy-violations.txt").unwrap());
    let obs = ToolCatalog::new().observations(&call);
    assert_eq!(obs.len(), 1);
    assert!(obs[0].starts_with("Observation: Error - Code policy violation: "));
    // Tools are callable by their id's last part.
    let mut c = ToolCatalog::new();
    c.add(ToolDef::new("Web:search", json!({"type": "object"}))).unwrap();
    let (call, _) =
        spindle::calls::attp::parse_attp("[tool_call]\nstatus='success'\ntarget='t'\ncode='__result__ = search(1)'");
    assert!(c.observations(&call).is_empty());
}

// ----- loading errors -------------------------------------------------------

/// A plugins dir in a fresh temp folder: `files` are (relative path, text).
fn plugins_dir(files: &[(&str, &str)]) -> PathBuf {
    let root = temp_path("plugins");
    for (rel, text) in files {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
    std::fs::create_dir_all(&root).unwrap();
    root
}

/// (relative path, text) of the files of a plugins dir.
type Files<'a> = &'a [(&'a str, &'a str)];

const GOOD_TOOL: &str = r#"{"id": "t:one", "parameters": {"type": "object", "properties": {"a": {"type": "string"}}}}"#;

#[test]
fn loading_errors_name_the_file() {
    let cases: &[(&str, Files, &str)] = &[
        ("broken yaml", &[("p/plugin.yaml", "name: [unclosed\n")], "p/plugin.yaml"),
        ("manifest without name", &[("p/plugin.yaml", "displayName: X\n")], "p/plugin.yaml"),
        ("entry is not a directory", &[("p/plugin.yaml", "name: p\ntools:\n  entry: ./missing\n")], "missing"),
        (
            "broken tool json",
            &[("p/plugin.yaml", "name: p\ntools:\n  entry: tools\n"), ("p/tools/x.tool.json", "{\"id\": ")],
            "x.tool.json",
        ),
        (
            "tool without id",
            &[("p/plugin.yaml", "name: p\ntools:\n  entry: tools\n"), ("p/tools/x.tool.json", "{\"parameters\": {}}")],
            "x.tool.json",
        ),
        (
            "invalid schema",
            &[
                ("p/plugin.yaml", "name: p\ntools:\n  entry: tools\n"),
                ("p/tools/bad.tool.json", r#"{"id": "bad", "parameters": {"type": 12}}"#),
            ],
            "bad.tool.json",
        ),
        (
            "schema that is not an object",
            &[
                ("p/plugin.yaml", "name: p\ntools:\n  entry: tools\n"),
                ("p/tools/bad.tool.json", r#"{"id": "bad", "parameters": "string"}"#),
            ],
            "bad.tool.json",
        ),
        (
            "duplicate id",
            &[
                ("p/plugin.yaml", "name: p\ntools:\n  entry: tools\n"),
                ("p/tools/a.tool.json", GOOD_TOOL),
                ("q/plugin.yaml", "name: q\ntools:\n  entry: tools\n"),
                ("q/tools/b.tool.json", GOOD_TOOL),
            ],
            "b.tool.json",
        ),
        ("plugin dir without manifest", &[("p/tools/a.tool.json", GOOD_TOOL)], "has no plugin.yaml"),
    ];
    for (name, files, needle) in cases {
        let dir = plugins_dir(files);
        let err = ToolCatalog::load_plugins(&dir).expect_err(name);
        let msg = err.to_string();
        assert!(msg.contains(needle), "{name}: {msg}");
        let _ = std::fs::remove_dir_all(&dir);
    }
    let err = ToolCatalog::load_plugins(Path::new("tests/data/no-such-dir")).unwrap_err();
    assert!(matches!(err, CatalogError::Io { .. }), "{err}");
}

#[test]
fn oversized_files_are_refused() {
    let dir =
        plugins_dir(&[("p/plugin.yaml", "name: p\ntools:\n  entry: tools\n"), ("p/tools/a.tool.json", GOOD_TOOL)]);
    let err = ToolCatalog::load_plugins_with(&dir, LoadOptions { max_file_len: 20 }).unwrap_err();
    assert!(matches!(err, CatalogError::TooLarge { .. }), "{err}");
    assert!(ToolCatalog::load_plugins_with(&dir, LoadOptions { max_file_len: 1000 }).is_ok());
    let _ = std::fs::remove_dir_all(&dir);
}

// ----- the binary ---------------------------------------------------------

#[test]
fn parse_with_tools_prints_observations_to_stderr() {
    let input = std::fs::read_to_string("corpora/action-spec004-5-5-turn1-wrong-param.txt").unwrap();
    for chunk in [None, Some(1), Some(7)] {
        let r = run(input.as_bytes(), chunk, &["--profile", "action", "--tools", PLUGINS]);
        assert_eq!(r.code, 0);
        assert_eq!(
            r.stderr.trim_end(),
            "Observation: Error - Invalid parameters for GetPlayerInfo: Unknown parameter 'playerId', did you mean 'player_id'?"
        );
        // stdout stays JSONL.
        assert!(r.events.iter().any(|e| e["type"] == "element" && e["tag"] == "action"));
    }
    let ok = std::fs::read_to_string("corpora/action-spec004-5-5-turn2-corrected.txt").unwrap();
    let r = run(ok.as_bytes(), None, &["--profile", "action", "--tools", PLUGINS]);
    assert_eq!(r.stderr, "");
    for (file, profile, needle) in [
        ("action-malformed.txt", "action", "Observation: Error - Malformed XML in ACTION block"),
        ("tam-two-blocks.txt", "tam", "Unknown tool ID 'File.Read'"),
        ("attp-multi-tool-unfenced.txt", "attp", "did you mean 'search_web'?"),
    ] {
        let text = std::fs::read_to_string(format!("corpora/{file}")).unwrap();
        let r = run(text.as_bytes(), Some(7), &["--profile", profile, "--tools", PLUGINS]);
        assert!(r.stderr.contains(needle), "{file}: {}", r.stderr);
    }
    for file in [
        "tam-spec000-5-1-single-step.txt",
        "tam-spec000-5-2-multi-step.txt",
        "tam-spec002-5-2-2-chained.txt",
        "action-spec004-5-2-nested.txt",
    ] {
        let text = std::fs::read_to_string(format!("corpora/{file}")).unwrap();
        let profile = file.split('-').next().unwrap();
        let r = run(text.as_bytes(), None, &["--profile", profile, "--tools", PLUGINS]);
        assert_eq!(r.stderr, "", "{file} should be valid against the sample plugins");
    }
}

#[test]
fn parse_with_a_broken_tools_dir_fails_naming_the_file() {
    let dir =
        plugins_dir(&[("p/plugin.yaml", "name: p\ntools:\n  entry: tools\n"), ("p/tools/bad.tool.json", "{nope")]);
    let r = run(b"hi", None, &["--profile", "tam", "--tools", dir.to_str().unwrap()]);
    assert_eq!(r.code, 2);
    assert!(r.stderr.contains("bad.tool.json"), "{}", r.stderr);
    let _ = std::fs::remove_dir_all(&dir);
}
