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
    // The tool gets the URI as the parameter's value (spec 000 §3.3).
    let checked = c.check_step_uris(CallFormat::Tam, 0, &call.steps[0]).unwrap();
    assert_eq!(serde_json::Value::Object(checked.params), json!({"content": "x", "file_path": "fam://a"}));
    assert_eq!(checked.uris.into_iter().collect::<Vec<_>>(), [("file_path".to_string(), "fam://a".to_string())]);
    assert_eq!(c.check_step(CallFormat::Tam, 0, &call.steps[0]).unwrap()["file_path"], "fam://a");
    call.steps[0].uris.insert("nope".into(), "fam://b".into());
    assert_eq!(c.check(&call).len(), 1);
    // A value and a URI for one parameter: which one is meant?
    let mut both = self::call(CallFormat::Tam, "File.Write", json!({"content": "x", "file_path": "/a"}));
    both.steps[0].uris.insert("file_path".into(), "fam://a".into());
    assert_eq!(
        c.observations(&both),
        [
            "Observation: Error - Invalid parameters for File.Write: Parameter 'file_path': it is given both as a value and by URI (uri_...); give one"
        ]
    );
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

#[test]
fn tools_sharing_a_name_get_distinct_python_functions() {
    let mut c = ToolCatalog::new();
    for id in ["Weather:get", "Stock:get", "Files.list", "Math.Add"] {
        c.add(ToolDef::new(id, json!({"type": "object"}))).unwrap();
    }
    let names: Vec<(String, &str)> = c.python_functions();
    let names: Vec<(&str, &str)> = names.iter().map(|(n, id)| (n.as_str(), *id)).collect();
    // `get` is two tools' and `list` is Python's own: the whole id instead.
    assert_eq!(
        names,
        [("Weather_get", "Weather:get"), ("Stock_get", "Stock:get"), ("Files_list", "Files.list"), ("Add", "Math.Add")]
    );
    let code = |body: &str| {
        let text = format!("[tool_call]\nstatus='success'\ntarget='t'\ncode='''\n{body}\n'''");
        spindle::calls::attp::parse_attp(&text).0
    };
    assert!(c.check(&code("__result__ = [Weather_get(city='Oslo'), Stock_get(symbol='X'), Add(a=1)]")).is_empty());
    // The OpenAI form of an id is an alias (a model shown the tools that way).
    assert!(c.check(&code("__result__ = Math_Add(a=1)")).is_empty());
    assert_eq!(
        c.check(&code("__result__ = get(city='Oslo')")),
        [CallProblem::AmbiguousFunction {
            name: "get".into(),
            candidates: vec!["Weather_get".into(), "Stock_get".into()]
        }]
    );
    assert_eq!(
        c.observations(&code("__result__ = get(city='Oslo')")),
        ["Observation: Error - Tool 'get' called in the code is ambiguous: call one of 'Weather_get', 'Stock_get'"]
    );
    // The manual shows the same names.
    let manual = spindle::tools::manual::manual(c.tools(), spindle::tools::manual::Protocol::Attp);
    for def in ["def Weather_get(", "def Stock_get(", "def Files_list(", "def Add("] {
        assert!(manual.contains(def), "no {def} in\n{manual}");
    }
    assert!(!manual.contains("def get("), "{manual}");
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

const OTHER_TOOL: &str = r#"{"id": "z:ok", "parameters": {"type": "object"}}"#;

/// Spec 002 §7.1, §15.1.2: each plugin loads on its own. A bad plugin or
/// tool file is left out with a warning naming it; the rest loads.
#[test]
fn a_bad_plugin_or_tool_file_is_skipped_with_a_warning_naming_it() {
    use spindle::calls::catalog::Skipped;
    let cases: &[(&str, Files, Skipped, &str, &[&str])] = &[
        ("broken yaml", &[("p/plugin.yaml", "name: [unclosed\n")], Skipped::Plugin, "p/plugin.yaml", &[]),
        ("manifest without name", &[("p/plugin.yaml", "displayName: X\n")], Skipped::Plugin, "p/plugin.yaml", &[]),
        (
            "entry is not a directory",
            &[("p/plugin.yaml", "name: p\ntools:\n  entry: ./missing\n")],
            Skipped::Plugin,
            "missing",
            &[],
        ),
        (
            "broken tool json",
            &[
                ("p/plugin.yaml", "name: p\ntools:\n  entry: tools\n"),
                ("p/tools/a.tool.json", GOOD_TOOL),
                ("p/tools/x.tool.json", "{\"id\": "),
            ],
            Skipped::ToolFile,
            "x.tool.json",
            &["t:one"],
        ),
        (
            "tool without id",
            &[("p/plugin.yaml", "name: p\ntools:\n  entry: tools\n"), ("p/tools/x.tool.json", "{\"parameters\": {}}")],
            Skipped::ToolFile,
            "x.tool.json",
            &[],
        ),
        (
            "invalid schema",
            &[
                ("p/plugin.yaml", "name: p\ntools:\n  entry: tools\n"),
                ("p/tools/bad.tool.json", r#"{"id": "bad", "parameters": {"type": 12}}"#),
                ("p/tools/c.tool.json", GOOD_TOOL),
            ],
            Skipped::ToolFile,
            "bad.tool.json",
            &["t:one"],
        ),
        (
            "schema that is not an object",
            &[
                ("p/plugin.yaml", "name: p\ntools:\n  entry: tools\n"),
                ("p/tools/bad.tool.json", r#"{"id": "bad", "parameters": "string"}"#),
            ],
            Skipped::ToolFile,
            "bad.tool.json",
            &[],
        ),
        (
            "duplicate id",
            &[
                ("p/plugin.yaml", "name: p\ntools:\n  entry: tools\n"),
                ("p/tools/a.tool.json", GOOD_TOOL),
                ("q/plugin.yaml", "name: q\ntools:\n  entry: tools\n"),
                ("q/tools/b.tool.json", GOOD_TOOL),
            ],
            Skipped::ToolFile,
            "b.tool.json",
            &["t:one"],
        ),
        (
            "duplicate plugin name",
            &[
                ("p/plugin.yaml", "name: p\ntools:\n  entry: tools\n"),
                ("p/tools/a.tool.json", GOOD_TOOL),
                ("q/plugin.yaml", "name: p\ntools:\n  entry: tools\n"),
                ("q/tools/c.tool.json", r#"{"id": "c", "parameters": {"type": "object"}}"#),
            ],
            Skipped::Plugin,
            "plugin name \"p\" is already the name of",
            &["t:one"],
        ),
        (
            "plugin dir without manifest",
            &[("p/tools/a.tool.json", GOOD_TOOL)],
            Skipped::Plugin,
            "has no plugin.yaml",
            &[],
        ),
    ];
    for (name, files, skipped, needle, kept) in cases {
        // Every case has a good plugin too, after the bad one in name order.
        let mut all = files.to_vec();
        all.extend([("z/plugin.yaml", "name: z\ntools:\n  entry: tools\n"), ("z/tools/ok.tool.json", OTHER_TOOL)]);
        let dir = plugins_dir(&all);
        let catalog = ToolCatalog::load_plugins(&dir).unwrap_or_else(|e| panic!("{name}: {e}"));
        let ids: Vec<&str> = catalog.tools().map(|t| t.id.as_str()).collect();
        let mut want: Vec<&str> = kept.to_vec();
        want.push("z:ok");
        assert_eq!(ids, want, "{name}: the rest loads");
        let [warning] = catalog.warnings() else { panic!("{name}: {:?}", catalog.warnings()) };
        assert_eq!(warning.skipped, *skipped, "{name}");
        let text = warning.to_string();
        assert!(text.contains(needle), "{name}: {text}");
        assert!(text.contains(&warning.path.display().to_string()), "{name}: {text}");
        assert_eq!(warning.to_json()["reason"], warning.error.to_string(), "{name}");
        let _ = std::fs::remove_dir_all(&dir);
    }
    // The duplicate's warning names both files.
    let dir = plugins_dir(&[
        ("p/plugin.yaml", "name: p\ntools:\n  entry: tools\n"),
        ("p/tools/a.tool.json", GOOD_TOOL),
        ("p/tools/b.tool.json", GOOD_TOOL),
    ]);
    let catalog = ToolCatalog::load_plugins(&dir).unwrap();
    let text = catalog.warnings()[0].to_string();
    assert!(text.contains("a.tool.json") && text.contains("b.tool.json"), "{text}");
    assert!(matches!(catalog.warnings()[0].error, CatalogError::Duplicate { .. }));
    assert_eq!(catalog.plugins()[0].tools, ["t:one"]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// What stays an error: nothing at all could load.
#[test]
fn an_unreadable_dir_or_a_broken_single_plugin_is_still_an_error() {
    let err = ToolCatalog::load_plugins(Path::new("tests/data/no-such-dir")).unwrap_err();
    assert!(matches!(err, CatalogError::Io { .. }), "{err}");
    let err = ToolCatalog::load_plugins(Path::new("tests/data/plugins/README.md")).unwrap_err();
    assert!(matches!(err, CatalogError::Io { .. }), "not a directory: {err}");
    // The directory is itself one plugin, and its manifest is broken.
    let dir = plugins_dir(&[("plugin.yaml", "name: [unclosed\n"), ("tools/a.tool.json", GOOD_TOOL)]);
    let err = ToolCatalog::load_plugins(&dir).unwrap_err();
    assert!(matches!(err, CatalogError::Manifest { .. }) && err.to_string().contains("plugin.yaml"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
    // A single plugin with a bad tool file loads its other tools.
    let dir = plugins_dir(&[
        ("plugin.yaml", "name: p\ntools:\n  entry: tools\n"),
        ("tools/a.tool.json", GOOD_TOOL),
        ("tools/b.tool.json", "{nope"),
    ]);
    let catalog = ToolCatalog::load_plugins(&dir).unwrap();
    assert_eq!(catalog.len(), 1);
    assert!(catalog.warnings()[0].to_string().contains("b.tool.json"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn oversized_files_are_skipped() {
    use spindle::calls::catalog::Skipped;
    let dir =
        plugins_dir(&[("p/plugin.yaml", "name: p\ntools:\n  entry: tools\n"), ("p/tools/a.tool.json", GOOD_TOOL)]);
    // The manifest (29 bytes) is past the limit: the plugin is left out.
    let c = ToolCatalog::load_plugins_with(&dir, LoadOptions { max_file_len: 20 }).unwrap();
    assert!(c.is_empty());
    assert!(
        matches!(c.warnings(), [w] if w.skipped == Skipped::Plugin && matches!(w.error, CatalogError::TooLarge { .. }))
    );
    // The tool file is past it: the plugin loads without that tool.
    let c = ToolCatalog::load_plugins_with(&dir, LoadOptions { max_file_len: 40 }).unwrap();
    assert_eq!((c.len(), c.plugins().len()), (0, 1));
    assert!(
        matches!(c.warnings(), [w] if w.skipped == Skipped::ToolFile && matches!(w.error, CatalogError::TooLarge { .. }))
    );
    let c = ToolCatalog::load_plugins_with(&dir, LoadOptions { max_file_len: 1000 }).unwrap();
    assert_eq!(c.len(), 1);
    assert!(c.warnings().is_empty());
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
fn parse_with_a_broken_tool_file_warns_naming_it_and_checks_with_the_rest() {
    let dir = plugins_dir(&[
        ("p/plugin.yaml", "name: p\ntools:\n  entry: tools\n"),
        ("p/tools/bad.tool.json", "{nope"),
        ("p/tools/good.tool.json", GOOD_TOOL),
    ]);
    let call = "<|[REQUEST_TOOL]|>\ncommand:»»»t:one«««\nb:»»»1«««\n<|[END_TOOL]|>";
    let r = run(call.as_bytes(), None, &["--profile", "tam", "--tools", dir.to_str().unwrap()]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let lines: Vec<&str> = r.stderr.lines().collect();
    assert_eq!(lines.len(), 2, "{}", r.stderr);
    assert!(
        lines[0].starts_with("spindle: warning: skipped tool file ") && lines[0].contains("bad.tool.json"),
        "{}",
        r.stderr
    );
    // The good tool of the same plugin checks the call.
    assert_eq!(lines[1], "Observation: Error - Invalid parameters for t:one: Unknown parameter 'b'");
    let _ = std::fs::remove_dir_all(&dir);
}
