//! `spindle tools manual|list` and `spindle parse --tools DIR --execute`
//! through the real binary, with the sample plugins of
//! `examples/plugins` and the transcripts of `tests/data/tool_transcripts`.

mod process_support;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn plugins() -> PathBuf {
    root().join("examples/plugins")
}

fn spindle(args: &[&str]) -> (String, String, bool) {
    let out = Command::new(env!("CARGO_BIN_EXE_spindle"))
        .args(args)
        .current_dir(root())
        .output()
        .unwrap_or_else(|e| panic!("cannot run spindle: {e}"));
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        out.status.success(),
    )
}

#[test]
fn manual_shows_every_tool_and_parameter_in_every_protocol() {
    let dir = plugins();
    let dir = dir.to_str().unwrap_or_default();
    let catalog = spindle::calls::ToolCatalog::load_plugins(Path::new(dir)).unwrap_or_else(|e| panic!("{e}"));
    for protocol in ["tam", "tam-cjk", "action", "attp", "filament", "openai"] {
        let (out, err, ok) = spindle(&["tools", "manual", "--tools", dir, "--protocol", protocol]);
        assert!(ok, "{protocol}: {err}");
        for tool in catalog.tools() {
            let name = match protocol {
                "attp" => {
                    let functions = catalog.python_functions();
                    let found = functions.iter().find(|(_, id)| *id == tool.id);
                    found.map(|(name, _)| name.clone()).unwrap_or_else(|| panic!("{}", tool.id))
                }
                "openai" => spindle::calls::openai_function_name(&tool.id).into_owned(),
                _ => tool.id.clone(),
            };
            assert!(out.contains(&name), "{protocol}: no {name}");
            for p in spindle::tools::manual::params_of(tool) {
                assert!(out.contains(&p.name), "{protocol}: {} lacks {}", tool.id, p.name);
            }
        }
    }
    let (out, _, ok) = spindle(&["tools", "manual", "--tools", dir, "--protocol", "openai", "--only", "Echo,Math.Add"]);
    assert!(ok);
    let tools: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    let names: Vec<&str> =
        tools.as_array().into_iter().flatten().filter_map(|t| t["function"]["name"].as_str()).collect();
    assert_eq!(names, ["Math_Add", "Echo"], "catalog order, in OpenAI's alphabet");
    let (_, err, ok) = spindle(&["tools", "manual", "--tools", dir, "--only", "Ecko"]);
    assert!(!ok);
    assert!(err.contains("did you mean \"Echo\""), "{err}");
}

#[test]
fn manual_fills_prompt_placeholders() {
    let prompt = std::env::temp_dir().join(format!("spindle-prompt-{}.md", std::process::id()));
    std::fs::write(&prompt, "# Tools\n{{AVAILABLE_TOOLS}}\n# End\n").unwrap_or_else(|e| panic!("{e}"));
    let dir = plugins();
    let (out, err, ok) = spindle(&[
        "tools",
        "manual",
        "--tools",
        dir.to_str().unwrap_or_default(),
        "--protocol",
        "attp",
        "--only",
        "Math.Add",
        "--prompt",
        prompt.to_str().unwrap_or_default(),
    ]);
    assert!(ok, "{err}");
    assert!(out.starts_with("# Tools\n```python\n# ===== Available tools ====="), "{out}");
    assert!(out.contains("def Add(a: int, b: int) -> Any:"), "{out}");
    assert!(out.ends_with("# End\n"));
    let _ = std::fs::remove_file(prompt);
}

#[test]
fn list_as_json() {
    let dir = plugins();
    let (out, err, ok) = spindle(&["tools", "list", "--tools", dir.to_str().unwrap_or_default(), "--format", "json"]);
    assert!(ok, "{err}");
    let list: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}"));
    let rows = list.as_array().cloned().unwrap_or_default();
    let render = rows.iter().find(|r| r["id"] == "Image.Render").unwrap_or_else(|| panic!("{out}"));
    assert_eq!(render["implementation"], "script");
    assert_eq!(render["async"], true);
    assert_eq!(render["plugin"], "basic");
    assert_eq!(err, "", "no warning");
}

/// A plugins folder with a folder that is no plugin (no plugin.yaml) and a
/// broken tool file next to a good one.
fn half_broken_plugins() -> tempfile::TempDir {
    let dir = tempfile::Builder::new().prefix("spindle-half-broken-").tempdir().unwrap_or_else(|e| panic!("{e}"));
    let files = [
        ("good/plugin.yaml", "name: good\ntools:\n  entry: ./tools\n"),
        (
            "good/tools/ok.tool.json",
            r#"{"id": "Ok", "implementation": {"type": "script", "command": ["/bin/sh", "-c", "echo fine"]}, "parameters": {"type": "object", "properties": {}}}"#,
        ),
        ("good/tools/broken.tool.json", "{\"id\": "),
        ("zz-assets/logo.txt", "not a plugin"),
    ];
    for (rel, text) in files {
        let p = dir.path().join(rel);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent).unwrap_or_else(|e| panic!("{e}"));
        }
        std::fs::write(&p, text).unwrap_or_else(|e| panic!("{e}"));
    }
    dir
}

/// Spec 002 §7.1: a bad plugin or tool file does not stop the others from
/// loading; every command says what was left out on stderr (the output of
/// `tools list` keeps its shape) and runs.
#[test]
fn a_bad_plugin_is_skipped_and_said_by_list_and_parse() {
    let dir = half_broken_plugins();
    let d = dir.path().to_str().unwrap_or_default();
    let (out, err, ok) = spindle(&["tools", "list", "--tools", d, "--format", "json"]);
    assert!(ok, "{err}");
    let list: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(list[0]["id"], "Ok");
    assert_eq!(list.as_array().map(Vec::len), Some(1), "{out}");
    let warned: Vec<&str> = err.lines().filter(|l| l.starts_with("spindle: warning: skipped ")).collect();
    assert_eq!(warned.len(), 2, "{err}");
    assert!(warned[0].contains("tool file") && warned[0].contains("good/tools/broken.tool.json"), "{err}");
    assert!(warned[0].contains("is invalid"), "{err}");
    assert!(warned[1].contains("plugin") && warned[1].contains("has no plugin.yaml"), "{err}");

    let (out, _, ok) = spindle(&["tools", "list", "--tools", d]);
    assert!(ok);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 1, "{out}");
    assert!(lines[0].starts_with("Ok\tscript\tgood\t"), "{out}");

    let call = dir.path().join("call.txt");
    std::fs::write(&call, "<|[REQUEST_TOOL]|>\ncommand:»»»Ok«««\n<|[END_TOOL]|>").unwrap_or_else(|e| panic!("{e}"));
    let c = call.to_str().unwrap_or_default();
    let (out, err, ok) = spindle(&["parse", c, "--profile", "tam", "--tools", d, "--execute"]);
    assert!(ok, "{err}");
    let warned: Vec<&str> = err.lines().filter(|l| l.starts_with("spindle: warning: skipped ")).collect();
    assert_eq!(warned.len(), 2, "{err}");
    assert!(warned[0].contains("broken.tool.json") && warned[1].contains("zz-assets"), "{err}");
    let result = out
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["type"] == "tool_result")
        .unwrap_or_else(|| panic!("{out}"));
    assert_eq!(result["outcome"], "success", "{result}");
    assert_eq!(result["result"], "fine");
}

/// The `tool_result` events of one parse, without the timing field.
fn results(file: &str, profile: &str, chunk: Option<usize>) -> Vec<Value> {
    let dir = plugins();
    let path = root().join("tests/data/tool_transcripts").join(file);
    let mut args = vec![
        "parse".to_string(),
        path.display().to_string(),
        "--profile".into(),
        profile.into(),
        "--tools".into(),
        dir.display().to_string(),
        "--execute".into(),
    ];
    if let Some(n) = chunk {
        args.extend(["--chunk-size".into(), n.to_string()]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (out, err, ok) = spindle(&args);
    assert!(ok, "{err}");
    out.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["type"] == "tool_result")
        .map(|mut v| {
            if let Some(m) = v.as_object_mut() {
                m.remove("duration_ms");
            }
            v
        })
        .collect()
}

fn summary(results: &[Value]) -> Vec<String> {
    results
        .iter()
        .map(|r| {
            format!(
                "{} {} {} {}",
                r["call_id"].as_str().unwrap_or_default(),
                r["tool_id"].as_str().unwrap_or_default(),
                r["step"],
                r["outcome"].as_str().unwrap_or_default()
            )
        })
        .collect()
}

fn check(file: &str, profile: &str, expected: &[&str]) -> Vec<Value> {
    let whole = results(file, profile, None);
    assert_eq!(summary(&whole), expected, "{file}");
    for n in [1, 7] {
        assert_eq!(results(file, profile, Some(n)), whole, "{file} at chunk size {n}");
    }
    whole
}

#[test]
fn execute_tam_steps_in_order_with_on_error_common_and_cut_off() {
    let r = check(
        "tam_steps.txt",
        "tam",
        &[
            "call_1 Math.Add 1 success",
            "call_1 Echo 2 success",
            "call_1 Fail 3 failed",
            "call_1 Greet 4 success",
            "call_1 Fail 5 failed",
            "call_1 Echo 6 not_run",
            "call_2 Echo null not_run",
        ],
    );
    assert_eq!(r[1]["result"]["echo"]["text"], "shared text", "common_text reaches the step that takes it");
    assert_eq!(r[0]["result"], 42);
    assert!(r[6]["observation"].as_str().unwrap_or_default().contains("cut off"));

    // `summary` counts the elements apart from the tool records.
    let path = root().join("tests/data/tool_transcripts/tam_steps.txt").display().to_string();
    let dir = plugins().display().to_string();
    let (out, err, ok) =
        spindle(&["parse", &path, "--profile", "tam", "--tools", &dir, "--execute", "--format", "summary"]);
    assert!(ok, "{err}");
    assert!(out.contains("elements     4  (content 2, tam 2)"), "{out}");
    assert!(out.contains("tool records 14  (tool_audit 7, tool_result 7)"), "{out}");
}

#[test]
fn execute_only_the_first_action_block() {
    let r = check("action_two_blocks.txt", "action", &["call_1 Math.Add null success", "call_2 Greet null not_run"]);
    assert_eq!(r[0]["observation"], "Observation: Tool Math.Add executed successfully. Result: 42");
}

#[test]
fn execute_filament_and_hermes_tool_calls() {
    let r = check(
        "filament_calls.txt",
        "filament",
        &[
            "call_1 Greet null success",
            "call_2 Echo null success",
            "call_3 Ech null unknown_tool",
            "call_4 Echo null not_run",
        ],
    );
    assert_eq!(r[2]["observation"], "Observation: Error - Unknown tool ID 'Ech', did you mean 'Echo'?");
}

#[test]
fn execute_cjk_block_with_a_timeout() {
    let r = check("cjk_hang.txt", "tam", &["call_1 Hang 1 timeout", "call_1 Math.Add 2 success"]);
    assert_eq!(r[0]["observation"], "Observation: Error - Tool Hang timed out after 400 ms and was stopped");
}

#[test]
fn tools_without_execute_check_filament_calls_too() {
    let dir = plugins();
    let path = root().join("tests/data/tool_transcripts/filament_calls.txt");
    let (_, err, ok) = spindle(&[
        "parse",
        path.to_str().unwrap_or_default(),
        "--profile",
        "filament",
        "--tools",
        dir.to_str().unwrap_or_default(),
    ]);
    assert!(ok);
    assert!(err.contains("Observation: Error - Unknown tool ID 'Ech', did you mean 'Echo'?"), "{err}");
}

#[test]
fn manual_of_an_openai_tools_file() {
    let file = std::env::temp_dir().join(format!("spindle-openai-tools-{}.json", std::process::id()));
    let request = serde_json::json!({"model": "m", "tools": [{"type": "function", "function": {
        "name": "get_weather", "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City"}}, "required": ["city"]}
    }}]});
    std::fs::write(&file, request.to_string()).unwrap_or_else(|e| panic!("{e}"));
    let dir = plugins();
    let (out, err, ok) = spindle(&[
        "tools",
        "manual",
        "--tools",
        dir.to_str().unwrap_or_default(),
        "--openai-tools",
        file.to_str().unwrap_or_default(),
        "--only",
        "get_weather",
        "--protocol",
        "action",
    ]);
    assert!(ok, "{err}");
    assert!(out.contains("*   `<get_weather>`: Weather for a city"), "{out}");
    assert!(out.contains("*   `<city>` (string, required): City"), "{out}");
    let _ = std::fs::remove_file(file);
}

/// `parse --execute` is one run: it waits at the end for the async tasks
/// its calls started and prints each one's `tool_task` record (its tasks
/// end with it, never after).
#[test]
fn parse_execute_waits_for_its_async_tasks() {
    let file = tempfile::Builder::new().suffix(".txt").tempfile().unwrap_or_else(|e| panic!("{e}"));
    let text = "Rendering.\n<|[REQUEST_TOOL]|>\ncommand:»»»Image.Render«««\nprompt:»»»owl«««\nseconds:»»»0.3«««\n<|[END_TOOL]|>\nDone.\n";
    std::fs::write(file.path(), text).unwrap_or_else(|e| panic!("{e}"));
    let dir = plugins();
    let path = file.path().display().to_string();
    let (out, err, ok) =
        spindle(&["parse", &path, "--profile", "tam", "--tools", dir.to_str().unwrap_or_default(), "--execute"]);
    assert!(ok, "{err}");
    let lines: Vec<Value> = out.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    let started = lines.iter().find(|v| v["type"] == "tool_result").unwrap_or_else(|| panic!("{out}"));
    assert_eq!((started["outcome"].as_str(), started["task_id"].as_str()), (Some("pending"), Some("task_1")));
    let done = lines.iter().find(|v| v["type"] == "tool_task").unwrap_or_else(|| panic!("{out}"));
    assert_eq!((done["outcome"].as_str(), done["task_id"].as_str()), (Some("success"), Some("task_1")), "{done}");
    assert_eq!(done["result"], serde_json::json!({"rendered": "owl"}));
}

/// A plugin folder given relative to the working folder runs a program
/// named by its path in the plugin (`./run.sh`, `bin/run.sh`): the
/// program is found once, not again below the plugin folder the process
/// starts in.
#[test]
fn a_relative_tools_folder_runs_programs_named_by_path() {
    use std::os::unix::fs::PermissionsExt;
    let work = tempfile::tempdir().unwrap();
    let plugin = work.path().join("plugins/own");
    std::fs::create_dir_all(plugin.join("tools")).unwrap();
    std::fs::create_dir_all(plugin.join("bin")).unwrap();
    std::fs::write(plugin.join("plugin.yaml"), "name: own\ntools:\n  entry: ./tools\n").unwrap();
    for (program, id) in [("./run.sh", "Dot"), ("bin/run.sh", "Bin")] {
        let def = serde_json::json!({"id": id, "description": "Says hi.",
            "implementation": {"type": "script", "command": program},
            "parameters": {"type": "object", "properties": {}}});
        std::fs::write(plugin.join(format!("tools/{id}.tool.json")), def.to_string()).unwrap();
    }
    for script in ["run.sh", "bin/run.sh"] {
        let path = plugin.join(script);
        std::fs::write(&path, "#!/bin/sh\necho hi from $0\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let calls = "<tool_call name=\"Dot\">{}</tool_call>\n<tool_call name=\"Bin\">{}</tool_call>\n";
    std::fs::write(work.path().join("calls.txt"), calls).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_spindle"))
        .args(["parse", "calls.txt", "--profile", "filament", "--tools", "plugins", "--execute"])
        .current_dir(work.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let results: Vec<Value> = stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["type"] == "tool_result")
        .collect();
    assert_eq!(results.len(), 2, "{stdout}");
    for r in &results {
        assert_eq!(r["outcome"], "success", "{r}");
    }
}

/// The ATTP manual states the output format of spec 001's system prompt
/// (TOML: `thought`, `[tool_call]` with `status`, `target`, `code` and
/// `__result__`, the allowed libraries, `status = "fail"` with a
/// `message`) before the tools; a prompt with a placeholder states it
/// itself, so the placeholder takes the tools alone (above).
#[test]
fn the_attp_manual_states_its_output_format() {
    let dir = plugins();
    let (out, err, ok) = spindle(&[
        "tools",
        "manual",
        "--tools",
        dir.to_str().unwrap_or_default(),
        "--protocol",
        "attp",
        "--only",
        "Math.Add",
    ]);
    assert!(ok, "{err}");
    for needed in [
        "TOML",
        "thought = \"\"\"",
        "[tool_call]",
        "status = \"success\"",
        "status = \"fail\"",
        "__result__",
        "math, json, datetime, re, random, statistics",
    ] {
        assert!(out.contains(needed), "{needed} missing: {out}");
    }
    let rules = out.find("[tool_call]").unwrap_or(usize::MAX);
    let tools = out.find("def Add(a: int, b: int)").unwrap_or(0);
    assert!(rules < tools, "the rules come before the tools: {out}");
}

/// The audit's repro (a side-effect tool, then an unknown one) in TAM and
/// ACTION: the first step does not run, because the second is invalid.
#[test]
fn a_call_with_an_invalid_step_runs_none_of_its_steps() {
    let dir = tempfile::Builder::new().prefix("spindle-validate-").tempdir().unwrap_or_else(|e| panic!("{e}"));
    let log = dir.path().join("side.log");
    let tool = format!(
        r#"{{"id": "Side.Effect", "implementation": {{"type": "script", "command": ["/bin/sh", "-c", "echo ran >> {}; echo ok"]}}, "parameters": {{"type": "object", "properties": {{}}}}}}"#,
        log.display()
    );
    let write = r#"{"id": "File.Write", "implementation": {"type": "script", "command": ["/bin/cat"]}, "parameters": {"type": "object", "properties": {"image": {"type": "string"}}, "required": ["image"]}}"#;
    for (rel, text) in [
        ("p/plugin.yaml", "name: p\ntools:\n  entry: ./tools\n"),
        ("p/tools/side.tool.json", tool.as_str()),
        ("p/tools/write.tool.json", write),
    ] {
        let p = dir.path().join(rel);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent).unwrap_or_else(|e| panic!("{e}"));
        }
        std::fs::write(&p, text).unwrap_or_else(|e| panic!("{e}"));
    }
    let cases = [
        (
            "tam",
            "<|[REQUEST_TOOL]|>\ncommand_1:»»»Side.Effect«««\ncommand_2:»»»File.Wrte«««\nimage_2:»»»x«««\n<|[END_TOOL]|>",
            ["Side.Effect 1 not_run", "File.Wrte 2 unknown_tool"],
        ),
        (
            "action",
            "Doing it.\n<ACTION>\n<Side.Effect></Side.Effect>\n<File.Write><imag>x</imag></File.Write>\n</ACTION>",
            ["Side.Effect null not_run", "File.Write null invalid_params"],
        ),
    ];
    for (profile, text, expected) in cases {
        let input = dir.path().join(format!("{profile}.txt"));
        std::fs::write(&input, text).unwrap_or_else(|e| panic!("{e}"));
        let (out, err, ok) = spindle(&[
            "parse",
            input.to_str().unwrap_or_default(),
            "--profile",
            profile,
            "--tools",
            dir.path().to_str().unwrap_or_default(),
            "--execute",
        ]);
        assert!(ok, "{err}");
        let results: Vec<Value> = out
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|v| v["type"] == "tool_result")
            .collect();
        let got: Vec<String> = results
            .iter()
            .map(|r| {
                format!(
                    "{} {} {}",
                    r["tool_id"].as_str().unwrap_or_default(),
                    r["step"],
                    r["outcome"].as_str().unwrap_or_default()
                )
            })
            .collect();
        assert_eq!(got, expected, "{profile}");
        assert!(
            results[0]["observation"].as_str().unwrap_or_default().contains("failed validation"),
            "{profile}: {out}"
        );
        assert!(!log.exists(), "{profile}: the side effect ran");
    }
}

/// The tools' `PATH` is the one spindle was started with (so a program
/// that pyenv, nvm or Homebrew put on it is found), or `--tool-path`.
#[test]
fn tools_see_spindles_path_or_the_tool_path_flag() {
    let program = process_support::PrivateProgram::new();
    let call = program.root.path().join("call.txt");
    std::fs::write(&call, "<|[REQUEST_TOOL]|>\ncommand:»»»Where«««\n<|[END_TOOL]|>").unwrap_or_else(|e| panic!("{e}"));
    let parse = |path: &str, flag: Option<&str>| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_spindle"));
        cmd.args(["parse", "--profile", "tam", "--execute", "--tools"])
            .arg(&program.plugins)
            .arg(&call)
            .env("PATH", path);
        if let Some(p) = flag {
            cmd.args(["--tool-path", p]);
        }
        let out = cmd.output().unwrap_or_else(|e| panic!("{e}"));
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|v| v["type"] == "tool_result")
            .unwrap_or_default()
    };
    // spindle's own PATH, passed on as it is.
    let r = parse(&program.path(), None);
    assert_eq!(r["outcome"], "success", "{r}");
    assert_eq!(r["result"], serde_json::json!({"found": "yes", "path": program.path()}));
    // --tool-path instead: the program is not on it.
    let r = parse(&program.path(), Some("/usr/bin:/bin"));
    assert_eq!(r["outcome"], "failed", "{r}");
    assert!(r["observation"].as_str().unwrap_or_default().contains("not found"), "{r}");
    // --tool-path with it, spindle's own without.
    let r = parse("/usr/bin:/bin", Some(&program.path()));
    assert_eq!(r["result"]["path"], program.path(), "{r}");
}

/// `request_id` in the `tool_result` and `tool_audit` lines of
/// `parse --execute`; a second block with the same id is not run again.
#[test]
fn request_id_is_in_the_records_and_a_repeat_is_not_run_again() {
    let dir = tempfile::Builder::new().prefix("spindle-request-id-").tempdir().unwrap_or_else(|e| panic!("{e}"));
    let counter = dir.path().join("n");
    let block = format!(
        "<|[REQUEST_TOOL]|>\nrequest_id:»»»req-42«««\ncommand:»»»Flaky«««\ncounter_file:»»»{}«««\nsucceed_on:»»»1«««\n<|[END_TOOL]|>",
        counter.display()
    );
    let input = dir.path().join("two.txt");
    std::fs::write(&input, format!("Once.\n{block}\nAnd again.\n{block}\n")).unwrap_or_else(|e| panic!("{e}"));
    let plugins = plugins();
    let (out, err, ok) = spindle(&[
        "parse",
        input.to_str().unwrap_or_default(),
        "--profile",
        "tam",
        "--tools",
        plugins.to_str().unwrap_or_default(),
        "--execute",
    ]);
    assert!(ok, "{err}");
    let lines: Vec<Value> = out.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    let of = |t: &str| lines.iter().filter(|l| l["type"] == t).cloned().collect::<Vec<_>>();
    let results = of("tool_result");
    assert_eq!(results.len(), 2, "{out}");
    assert!(results.iter().all(|r| r["request_id"] == "req-42"), "{out}");
    assert_eq!((results[0]["attempts"].as_u64(), results[1]["attempts"].as_u64()), (Some(1), Some(0)));
    assert_eq!(results[1]["result"], results[0]["result"]);
    assert!(results[1]["observation"].as_str().unwrap_or_default().contains("was already run, as call_1"), "{out}");
    let audits = of("tool_audit");
    assert!(!audits.is_empty() && audits.iter().all(|a| a["request_id"] == "req-42"), "{out}");
    assert_eq!(std::fs::read_to_string(&counter).ok().as_deref(), Some("1"), "the repeat ran");
}
