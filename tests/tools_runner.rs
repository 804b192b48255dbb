//! The tool runner against real processes: the sample plugins in
//! `examples/plugins/basic` (Python and shell scripts), every fault of
//! issue 11 (hang, flood, non-zero exit, invalid JSON, a forked grandchild,
//! a missing program, a command that climbs out of its plugin, shell
//! injection, huge values), step semantics, async tasks, services and
//! cancellation. "No leaked process" is checked in the process table.

mod process_support;
use process_support::{assert_no_process, processes_with};
use serde_json::{Value, json};
use spindle::calls::{CallFormat, OnError, Step, ToolCall, ToolCatalog};
use spindle::tools::{Outcome, Runner, RunnerOptions, ToolConfig, ToolEvent, ToolResult};
use spindle::{Registry, parse};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

fn plugins() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/plugins")
}

fn runner_with(options: RunnerOptions) -> Runner {
    let catalog = ToolCatalog::load_plugins(&plugins()).unwrap_or_else(|e| panic!("{e}"));
    Runner::with_options(catalog, options)
}

fn runner() -> Runner {
    runner_with(RunnerOptions::default())
}

fn step(id: &str, params: Value) -> Step {
    let mut s = Step::new(id);
    if let Value::Object(m) = params {
        s.params = m;
    }
    s
}

fn call(steps: Vec<Step>) -> ToolCall {
    let mut c = ToolCall::new(CallFormat::Tam);
    c.steps = steps;
    c
}

async fn run(runner: &Runner, c: &ToolCall) -> Vec<ToolResult> {
    runner.scope().run_call(c, "call_1", &CancellationToken::new()).await
}

/// A marker unique to one test run, put in the command lines of the
/// processes a tool starts.
fn marker(name: &str) -> String {
    format!("spindle-test-{name}-{}-{}", std::process::id(), Instant::now().elapsed().as_nanos())
}

#[tokio::test]
async fn python_and_shell_tools_succeed() {
    let r = runner();
    let res = run(
        &r,
        &call(vec![
            step("Math.Add", json!({"a": "2", "b": "40"})),
            step("Echo", json!({"text": "héllo", "count": "3"})),
            step("Greet", json!({"name": "Ann"})),
        ]),
    )
    .await;
    assert_eq!(res.len(), 3);
    assert_eq!(res[0].result, json!(42));
    assert_eq!(res[0].observation, "Observation: Tool Math.Add executed successfully. Result: 42");
    assert_eq!(res[1].result, json!({"echo": {"text": "héllo", "count": 3}}));
    assert_eq!(res[2].result, json!("hello from sh, got: {\"name\":\"Ann\"}"));
    assert!(res.iter().all(|r| r.ok && r.outcome == Outcome::Success && r.attempts == 1));
}

#[tokio::test]
async fn hang_times_out_and_leaves_no_process() {
    let r = runner();
    let m = marker("hang");
    let started = Instant::now();
    let res = run(&r, &call(vec![step("Hang", json!({"marker": m}))])).await;
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(res[0].outcome, Outcome::Timeout);
    assert_eq!(res[0].observation, "Observation: Error - Tool Hang timed out after 400 ms and was stopped");
    assert_no_process(&m).await;
}

#[tokio::test]
async fn flood_is_capped_and_stopped() {
    let r = runner_with(RunnerOptions { max_output: 64 * 1024, max_observation: 200, ..RunnerOptions::default() });
    let started = Instant::now();
    let res = run(&r, &call(vec![step("Flood", json!({}))])).await;
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(res[0].outcome, Outcome::OutputCapped);
    assert!(res[0].truncated);
    assert!(res[0].bytes > 64 * 1024);
    assert_eq!(res[0].result.as_str().map(str::len), Some(64 * 1024));
    assert!(
        res[0].observation.starts_with("Observation: Error - Tool Flood wrote more than 65536 bytes"),
        "{}",
        res[0].observation
    );
    assert!(res[0].observation.len() < 600, "observation is bounded: {}", res[0].observation.len());
}

#[tokio::test]
async fn non_zero_exit_quotes_stderr() {
    let res = run(&runner(), &call(vec![step("Fail", json!({}))])).await;
    assert_eq!(res[0].outcome, Outcome::Failed);
    assert_eq!(
        res[0].observation,
        "Observation: Error - Tool Fail failed (exit status 3): disk quota exceeded while writing /tmp/x"
    );
}

#[tokio::test]
async fn invalid_json_output_is_text() {
    let res = run(&runner(), &call(vec![step("BadJson", json!({}))])).await;
    assert_eq!(res[0].outcome, Outcome::Success);
    assert_eq!(res[0].result, json!("{\"status\": \"ok\", broken"));
}

#[tokio::test]
async fn forked_grandchild_is_killed_when_the_tool_exits() {
    let m = marker("fork");
    let res = run(&runner(), &call(vec![step("Forker", json!({"marker": m}))])).await;
    assert_eq!(res[0].outcome, Outcome::Success, "{}", res[0].observation);
    assert_eq!(res[0].result, json!("forked"));
    assert_no_process(&m).await;
}

#[tokio::test]
async fn a_grandchild_in_a_session_of_its_own_is_killed_too() {
    // `setsid` takes it out of the tool's process group; the run's mark in
    // its environment still finds it.
    let m = marker("setsid");
    let res = run(&runner(), &call(vec![step("Forker", json!({"marker": m, "detach": true}))])).await;
    assert_eq!(res[0].outcome, Outcome::Success, "{}", res[0].observation);
    assert_eq!(res[0].result, json!("forked"));
    assert_no_process(&m).await;
}

#[tokio::test]
async fn missing_program_and_escaping_command_fail_cleanly() {
    let res = run(&runner(), &call(vec![step("Missing", json!({}))])).await;
    assert_eq!(res[0].outcome, Outcome::Failed);
    assert!(res[0].observation.contains("not found"), "{}", res[0].observation);
    let res = run(&runner(), &call(vec![step("Escape", json!({}))])).await;
    assert_eq!(res[0].outcome, Outcome::Failed);
    assert!(res[0].observation.contains("climbs out of the plugin folder"), "{}", res[0].observation);
}

#[tokio::test]
async fn shell_injection_is_only_data() {
    let dir = tempdir("inject");
    let victim = dir.path().join("victim.txt");
    std::fs::write(&victim, "still here").unwrap_or_else(|e| panic!("{e}"));
    let text = format!("x; rm -f {0} && touch {0}.pwned $(rm -f {0}) `rm -f {0}`", victim.display());
    let res =
        run(&runner(), &call(vec![step("Greet", json!({"name": text})), step("Echo", json!({"text": text}))])).await;
    assert!(res.iter().all(|r| r.ok), "{res:?}");
    assert_eq!(res[1].result["echo"]["text"], json!(text));
    assert_eq!(std::fs::read_to_string(&victim).ok().as_deref(), Some("still here"));
    assert!(!dir.path().join("victim.txt.pwned").exists());
}

#[tokio::test]
async fn huge_values_are_refused_before_running() {
    let r = runner_with(RunnerOptions { max_params_bytes: 1000, ..RunnerOptions::default() });
    let res = run(&r, &call(vec![step("Echo", json!({"text": "x".repeat(5000)}))])).await;
    assert_eq!(res[0].outcome, Outcome::InvalidParams);
    assert_eq!(res[0].attempts, 0);
    assert!(res[0].observation.contains("more than the 1000-byte limit"), "{}", res[0].observation);
}

#[tokio::test]
async fn environment_is_only_path_lang_the_run_mark_and_config() {
    // The fixed system PATH: `python3` from a version manager's shim
    // (pyenv, on this process's own PATH) would add the shim's variables
    // (`PYENV_ROOT`, ...) to what the script sees.
    let path = RunnerOptions::FALLBACK_PATH.to_string();
    let mut r = runner_with(RunnerOptions { path: path.clone(), ..RunnerOptions::default() });
    let config = json!({"basic": {"apiToken": "t0k"}, "Env": {"unrelated": "x"}});
    r.set_config(ToolConfig(config.as_object().cloned().unwrap_or_default()));
    let res = run(&r, &call(vec![step("Env", json!({}))])).await;
    let env = res[0].result.as_object().cloned().unwrap_or_default();
    let keys: Vec<&str> = env.keys().map(String::as_str).collect();
    assert_eq!(keys, ["API_TOKEN", "LANG", "PATH", "REGION", "SPINDLE_TOOL_RUN"], "{env:?}");
    assert!(env["SPINDLE_TOOL_RUN"].as_str().is_some_and(|m| m.starts_with(&format!("{}-", std::process::id()))));
    assert_eq!(env["API_TOKEN"], "t0k");
    assert_eq!(env["REGION"], "eu", "defaultValue of the configSchema");
    assert_eq!(env["PATH"], path);
}

/// `RunnerOptions::env` (`--tool-env`): a named variable of this process
/// is passed on, `NAME=VALUE` sets one, an unset name adds nothing, and
/// `PATH` stays `RunnerOptions::path`'s.
#[tokio::test]
async fn named_environment_is_passed_on() {
    let path = RunnerOptions::FALLBACK_PATH.to_string();
    let home = std::env::var("HOME").unwrap_or_default();
    assert!(!home.is_empty(), "the test needs HOME");
    let env = ["HOME", "MODE=a=b", "SPINDLE_TEST_SURELY_UNSET", "PATH=/nowhere"];
    let options = RunnerOptions { path: path.clone(), env: env.map(String::from).to_vec(), ..RunnerOptions::default() };
    let r = runner_with(options);
    let res = run(&r, &call(vec![step("Env", json!({}))])).await;
    let env = res[0].result.as_object().cloned().unwrap_or_default();
    let keys: Vec<&str> = env.keys().map(String::as_str).collect();
    assert_eq!(keys, ["HOME", "LANG", "MODE", "PATH", "REGION", "SPINDLE_TOOL_RUN"], "{env:?}");
    assert_eq!(env["HOME"], home.as_str());
    assert_eq!(env["MODE"], "a=b");
    assert_eq!(env["PATH"], path, "PATH is the path option's");
}

/// The tools' `PATH` is by default the one this process was started
/// with, so a bare program name is found where the user's shell finds it.
#[tokio::test]
async fn the_tools_path_is_the_processes_own_unless_set() {
    let own = std::env::var("PATH").unwrap_or_default();
    assert!(!own.is_empty());
    assert_eq!(RunnerOptions::default().path, own);
    assert_eq!(RunnerOptions::inherited_path(), own);
    let program = process_support::PrivateProgram::new();
    let catalog = ToolCatalog::load_plugins(&program.plugins).unwrap_or_else(|e| panic!("{e}"));
    let r = Runner::with_options(catalog, RunnerOptions { path: program.path(), ..RunnerOptions::default() });
    let res = run(&r, &call(vec![step("Where", json!({}))])).await;
    assert_eq!(res[0].result, json!({"found": "yes", "path": program.path()}), "{}", res[0].observation);
    // The process's own PATH does not hold the program's folder.
    let catalog = ToolCatalog::load_plugins(&program.plugins).unwrap_or_else(|e| panic!("{e}"));
    let res = run(&Runner::new(catalog), &call(vec![step("Where", json!({}))])).await;
    assert_eq!(res[0].outcome, Outcome::Failed);
    assert!(res[0].observation.contains("not found"), "{}", res[0].observation);
}

#[tokio::test]
async fn unknown_tool_and_invalid_params_say_did_you_mean() {
    let res = run(&runner(), &call(vec![step("Echoo", json!({"text": "a"}))])).await;
    assert_eq!(res[0].outcome, Outcome::UnknownTool);
    assert_eq!(res[0].observation, "Observation: Error - Unknown tool ID 'Echoo', did you mean 'Echo'?");
    let res = run(&runner(), &call(vec![step("Echo", json!({"txt": "a"}))])).await;
    assert_eq!(res[0].outcome, Outcome::InvalidParams);
    assert_eq!(
        res[0].observation,
        "Observation: Error - Invalid parameters for Echo: Unknown parameter 'txt', did you mean 'text'?"
    );
}

#[tokio::test]
async fn on_error_continue_and_stop() {
    let mut fail = step("Fail", json!({}));
    fail.index = Some(1);
    fail.on_error = OnError::Continue;
    let mut add = step("Math.Add", json!({"a": 1, "b": 2}));
    add.index = Some(2);
    let mut fail2 = step("Fail", json!({}));
    fail2.index = Some(3);
    let mut greet = step("Greet", json!({"name": "x"}));
    greet.index = Some(4);
    let res = run(&runner(), &call(vec![fail, add, fail2, greet])).await;
    let outcomes: Vec<Outcome> = res.iter().map(|r| r.outcome).collect();
    assert_eq!(outcomes, [Outcome::Failed, Outcome::Success, Outcome::Failed, Outcome::NotRun]);
    assert_eq!(
        res[3].observation,
        "Observation: Error - Tool Greet was not run: step 3 (Fail) did not succeed, and on_error for it is stop"
    );
    assert_eq!(res.iter().map(|r| r.step).collect::<Vec<_>>(), [Some(1), Some(2), Some(3), Some(4)]);
}

/// Spec 002 §12.2-12.3, spec 004 §3.3: every step is checked before any
/// runs; one invalid step (an unknown tool, a bad or missing parameter)
/// and no step of the call runs, `on_error: continue` or not.
#[tokio::test]
async fn one_invalid_step_and_no_step_of_the_call_runs() {
    let dir = tempdir("validate");
    let counter = dir.path().join("n");
    let flaky = || step("Flaky", json!({"counter_file": counter.display().to_string(), "succeed_on": 1}));
    let mut first = flaky();
    first.index = Some(1);
    first.on_error = OnError::Continue;
    let mut unknown = step("File.Wrte", json!({"image": "x"}));
    unknown.index = Some(2);
    let mut bad = step("Math.Add", json!({"a": "two"}));
    bad.index = Some(3);
    let mut last = step("Greet", json!({"name": "x"}));
    last.index = Some(4);
    let res = run(&runner(), &call(vec![first, unknown, bad, last])).await;
    assert!(!counter.exists(), "step 1 ran before the invalid steps were seen");
    let outcomes: Vec<Outcome> = res.iter().map(|r| r.outcome).collect();
    assert_eq!(outcomes, [Outcome::NotRun, Outcome::UnknownTool, Outcome::InvalidParams, Outcome::NotRun]);
    assert!(res.iter().all(|r| r.attempts == 0 && !r.ok));
    assert_eq!(
        res[0].observation,
        "Observation: Error - Tool Flaky was not run: steps 2 (File.Wrte), 3 (Math.Add) failed validation, and no step of a call runs unless every step is valid"
    );
    assert_eq!(res[1].observation, "Observation: Error - Unknown tool ID 'File.Wrte'");
    assert!(
        res[2].observation.starts_with("Observation: Error - Invalid parameters for Math.Add: "),
        "{}",
        res[2].observation
    );
    assert_eq!(res[3].observation, res[0].observation.replace("Tool Flaky", "Tool Greet"));

    // ACTION steps (no numbers) are named by position.
    let mut c = call(vec![flaky(), step("Echo", json!({}))]);
    c.format = CallFormat::Action;
    let res = run(&runner(), &c).await;
    assert!(!counter.exists());
    assert_eq!(
        res[0].observation,
        "Observation: Error - Tool Flaky was not run: step 2 (Echo) failed validation, and no step of a call runs unless every step is valid"
    );
    assert_eq!(
        res[1].observation,
        "Observation: Error - Invalid parameters for Echo: Missing required parameter 'text'"
    );

    // All valid: they run, and `on_error: continue` still covers a failure at run time.
    let mut fail = step("Fail", json!({}));
    fail.on_error = OnError::Continue;
    let res = run(&runner(), &call(vec![fail, flaky()])).await;
    assert_eq!((res[0].outcome, res[1].outcome), (Outcome::Failed, Outcome::Success));
    assert_eq!(std::fs::read_to_string(&counter).ok().as_deref(), Some("1"));
}

/// Spec 000 §3.3, §4: `uri_[param]_N` passes a parameter by URI. The
/// tool gets the URI string, or what the scheme's resolver makes of it;
/// a resolver's error is the step's error.
#[tokio::test]
async fn uri_parameters_reach_the_tool_resolved_or_as_written() {
    let registry = Registry::profile("tam").unwrap_or_else(|| panic!("tam"));
    let text = "<|[REQUEST_TOOL]|>\ncommand:»»»Echo«««\nuri_text:»»»fam://project-data/notes.txt«««\ncount:»»»5«««\n<|[END_TOOL]|>";
    let events = parse(registry.clone(), text.as_bytes());
    let mut col = spindle::tools::collect::CallCollector::new(registry.into());
    let (_, c) = events.iter().find_map(|e| col.observe(e)).unwrap_or_else(|| panic!("no call"));
    assert_eq!(c.steps[0].uris.get("text").map(String::as_str), Some("fam://project-data/notes.txt"));

    // No resolver: the URI as the value.
    let res = run(&runner(), &c).await;
    assert_eq!(res[0].outcome, Outcome::Success, "{}", res[0].observation);
    assert_eq!(res[0].result, json!({"echo": {"count": 5, "text": "fam://project-data/notes.txt"}}));

    // A resolver for the scheme (any case): the resource instead.
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let mut r = runner();
    let log = seen.clone();
    r.register_uri_scheme("FAM", move |uri| {
        log.lock().map(|mut l| l.push(uri.clone())).unwrap_or(());
        async move {
            match uri.strip_prefix("fam://project-data/") {
                Some("notes.txt") => Ok(json!("the notes")),
                Some("number") => Ok(json!(7)),
                _ => Err(format!("no such resource: {uri}")),
            }
        }
    });
    let res = run(&r, &c).await;
    assert_eq!(res[0].result, json!({"echo": {"count": 5, "text": "the notes"}}), "{}", res[0].observation);
    assert_eq!(seen.lock().map(|l| l.clone()).unwrap_or_default(), ["fam://project-data/notes.txt"]);

    // The resolver's error is the step's, and the tool does not run.
    let mut missing = c.clone();
    missing.steps[0].uris.insert("text".into(), "fam://project-data/gone".into());
    let res = run(&r, &missing).await;
    assert_eq!((res[0].outcome, res[0].attempts), (Outcome::Failed, 0));
    assert_eq!(
        res[0].observation,
        "Observation: Error - Tool Echo was not run: its parameter 'text' (fam://project-data/gone) could not be resolved: no such resource: fam://project-data/gone"
    );
    // A resource the schema rejects (text must be a string).
    let mut number = c.clone();
    number.steps[0].uris.insert("text".into(), "fam://project-data/number".into());
    let res = run(&r, &number).await;
    assert_eq!(res[0].outcome, Outcome::InvalidParams, "{}", res[0].observation);
    assert!(res[0].observation.ends_with("(after resolving its URIs)"), "{}", res[0].observation);

    // No built-in file reading: a file:// URI stays a string.
    let secret = tempdir("uri");
    let file = secret.path().join("secret.txt");
    std::fs::write(&file, "SECRET").unwrap_or_else(|e| panic!("{e}"));
    let mut local = c.clone();
    local.steps[0].uris.insert("text".into(), format!("file://{}", file.display()));
    let res = run(&r, &local).await;
    assert_eq!(res[0].result["echo"]["text"], json!(format!("file://{}", file.display())));
    assert!(!res[0].observation.contains("SECRET"));
}

/// Spec 000 §4: `request_id` is for log tracing and idempotency. It is in
/// every result and audit record of its call, and a second call with it in
/// the same run is not run again: it gets the first call's results.
#[tokio::test]
async fn a_repeated_request_id_is_not_run_again_and_is_in_every_record() {
    let dir = tempdir("request-id");
    let counter = dir.path().join("n");
    let records: Arc<Mutex<Vec<ToolEvent>>> = Arc::default();
    let mut r = runner();
    let sink = records.clone();
    r.set_sink(Arc::new(move |e| sink.lock().map(|mut l| l.push(e)).unwrap_or(())));
    let flaky = step("Flaky", json!({"counter_file": counter.display().to_string(), "succeed_on": 1}));
    let mut first = call(vec![flaky.clone(), step("Greet", json!({"name": "Ann"}))]);
    first.request_id = Some("req-7".into());
    let scope = r.scope();
    let cancel = CancellationToken::new();
    let one = scope.run_call(&first, "call_1", &cancel).await;
    assert_eq!(std::fs::read_to_string(&counter).ok().as_deref(), Some("1"));
    assert!(one.iter().all(|r| r.request_id.as_deref() == Some("req-7") && r.attempts == 1), "{one:?}");
    assert_eq!(one[0].to_event_json("tool_result")["request_id"], "req-7");
    let audits: Vec<Value> = records
        .lock()
        .map(|l| l.iter().filter(|e| matches!(e, ToolEvent::Audit(_))).map(ToolEvent::to_event_json).collect())
        .unwrap_or_default();
    assert_eq!(audits.len(), 2);
    assert!(audits.iter().all(|a| a["request_id"] == "req-7"), "{audits:?}");

    // The same request_id again: not run, the first results, said so.
    let two = scope.run_call(&first, "call_2", &cancel).await;
    assert_eq!(std::fs::read_to_string(&counter).ok().as_deref(), Some("1"), "ran again");
    assert_eq!(two.len(), 2);
    for (a, b) in one.iter().zip(&two) {
        assert_eq!((b.call_id.as_str(), b.attempts, b.outcome, &b.result), ("call_2", 0, a.outcome, &a.result));
        assert_eq!(b.request_id.as_deref(), Some("req-7"));
    }
    assert_eq!(
        two[0].observation,
        "Observation: Tool Flaky executed successfully. Result: {\"attempt\":1} [request_id \"req-7\" was already run, as call_1: not run again; this is that result]"
    );
    // Another run, or another request_id, runs it.
    r.scope().run_call(&first, "call_1", &cancel).await;
    assert_eq!(std::fs::read_to_string(&counter).ok().as_deref(), Some("2"));
    let mut other = first.clone();
    other.request_id = Some("req-8".into());
    scope.run_call(&other, "call_3", &cancel).await;
    assert_eq!(std::fs::read_to_string(&counter).ok().as_deref(), Some("3"));

    // A call that ran nothing (invalid) is not remembered.
    let mut invalid = call(vec![flaky.clone(), step("Nope", json!({}))]);
    invalid.request_id = Some("req-9".into());
    let res = scope.run_call(&invalid, "call_4", &cancel).await;
    assert_eq!(res[1].outcome, Outcome::UnknownTool);
    assert_eq!(res[0].request_id.as_deref(), Some("req-9"));
    let mut fixed = call(vec![flaky]);
    fixed.request_id = Some("req-9".into());
    let res = scope.run_call(&fixed, "call_5", &cancel).await;
    assert_eq!((res[0].outcome, res[0].attempts), (Outcome::Success, 1));
    assert_eq!(std::fs::read_to_string(&counter).ok().as_deref(), Some("4"));

    // No request_id: none in the JSON.
    let res = run(&r, &call(vec![step("Greet", json!({"name": "x"}))])).await;
    assert!(res[0].to_event_json("tool_result").get("request_id").is_none());
}

/// A fresh folder, removed when the guard drops.
fn tempdir(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(&format!("{}-", marker(name))).tempdir().unwrap_or_else(|e| panic!("{e}"))
}

#[tokio::test]
async fn retry_until_success_and_capped_retries() {
    let dir = tempdir("retry");
    let counter = dir.path().join("n");
    let mut s = step("Flaky", json!({"counter_file": counter.display().to_string(), "succeed_on": 3}));
    s.retry = 3;
    let res = run(&runner(), &call(vec![s.clone()])).await;
    assert_eq!((res[0].outcome, res[0].attempts), (Outcome::Success, 3));
    assert_eq!(res[0].result, json!({"attempt": 3}));
    // Too few retries: the failure says how many attempts were made.
    let counter2 = dir.path().join("m");
    s.params.insert("counter_file".into(), json!(counter2.display().to_string()));
    s.retry = 1;
    let res = run(&runner(), &call(vec![s])).await;
    assert_eq!((res[0].outcome, res[0].attempts), (Outcome::Failed, 2));
    assert!(res[0].observation.ends_with("(after 2 attempts)"), "{}", res[0].observation);
}

#[tokio::test]
async fn cut_off_tam_block_and_second_action_block_are_not_run() {
    let registry = Registry::profile("tam").unwrap_or_else(|| panic!("tam"));
    let text = "<|[REQUEST_TOOL]|>\ncommand:»»»Math.Add«««\na:»»»1«««\nb:»»»2";
    let events = parse(registry.clone(), text.as_bytes());
    let mut col = spindle::tools::collect::CallCollector::new(registry.into());
    let calls: Vec<_> = events.iter().filter_map(|e| col.observe(e)).collect();
    let res = run(&runner(), &calls[0].1).await;
    assert_eq!(res[0].outcome, Outcome::NotRun);
    assert!(res[0].observation.contains("cut off"), "{}", res[0].observation);

    let registry = Registry::profile("action").unwrap_or_else(|| panic!("action"));
    let text =
        "A.\n<ACTION><Greet><name>one</name></Greet></ACTION>\nB.\n<ACTION><Greet><name>two</name></Greet></ACTION>";
    let events = parse(registry.clone(), text.as_bytes());
    let mut col = spindle::tools::collect::CallCollector::new(registry.into());
    let calls: Vec<_> = events.iter().filter_map(|e| col.observe(e)).collect();
    let r = runner().scope();
    let first = r.run_call(&calls[0].1, "call_1", &CancellationToken::new()).await;
    let second = r.run_call(&calls[1].1, &calls[1].0, &CancellationToken::new()).await;
    assert_eq!(first[0].outcome, Outcome::Success);
    assert_eq!(second[0].outcome, Outcome::NotRun);
    assert_eq!((second[0].call_id.as_str(), first[0].call_id.as_str()), ("call_2", "call_1"));
    assert!(second[0].observation.contains("only the first <ACTION> block"), "{}", second[0].observation);
}

#[tokio::test]
async fn async_tool_answers_with_a_task_id_then_completes() {
    let mut r = runner();
    let events: Arc<Mutex<Vec<ToolEvent>>> = Arc::default();
    let sink = events.clone();
    r.set_sink(Arc::new(move |e| sink.lock().map(|mut l| l.push(e)).unwrap_or(())));
    let r = r.scope();
    let res = r
        .run_call(
            &call(vec![step("Image.Render", json!({"prompt": "owl", "seconds": 1.0}))]),
            "call_1",
            &CancellationToken::new(),
        )
        .await;
    // Answered while the task still runs (it takes a second): no clock
    // bound, which a busy machine could miss, but no completion seen yet.
    let seen = events.lock().map(|l| l.clone()).unwrap_or_default();
    assert!(!seen.iter().any(|e| matches!(e, ToolEvent::TaskDone(_))), "answered only when the task was done");
    assert_eq!(res[0].outcome, Outcome::Pending);
    assert!(res[0].ok);
    assert_eq!(res[0].task_id.as_deref(), Some("task_1"));
    assert_eq!(
        res[0].observation,
        "Observation: Tool Image.Render started asynchronously. Task id: task_1. Its result will be reported when it completes."
    );
    assert_eq!(r.pending_tasks(), 1);
    let done = r.wait_tasks().await;
    assert_eq!(done[0].outcome, Outcome::Success);
    assert_eq!(done[0].result, json!({"rendered": "owl"}));
    assert_eq!(done[0].task_id.as_deref(), Some("task_1"));
    let seen = events.lock().map(|l| l.clone()).unwrap_or_default();
    assert!(seen.iter().any(|e| matches!(e, ToolEvent::TaskDone(t) if t.task_id.as_deref() == Some("task_1"))));
    assert!(
        seen.iter()
            .any(|e| matches!(e, ToolEvent::Audit(a) if a.tool_id == "Image.Render" && a.outcome == Outcome::Success))
    );
}

/// The result of an `Image.Render` task, by its prompt.
fn rendered(results: &[ToolResult]) -> Vec<String> {
    results.iter().map(|r| r.result["rendered"].as_str().unwrap_or("?").to_string()).collect()
}

fn render(prompt: &str, seconds: f64) -> ToolCall {
    call(vec![step("Image.Render", json!({"prompt": prompt, "seconds": seconds}))])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_runs_on_one_runner_never_see_each_others_tasks() {
    // The proxy's case: one runner shared by every request, one scope per
    // request.
    let runner = Arc::new(runner());
    let (alice, bob) = (runner.scope(), runner.scope());
    let none = CancellationToken::new();
    let a = alice.run_call(&render("ALICE-PRIVATE-PROMPT", 0.1), "t1_call_1", &none).await;
    let b = bob.run_call(&render("bob", 0.8), "t1_call_1", &none).await;
    // Ids are numbered per run: neither learns how many tasks the other has.
    assert_eq!((a[0].task_id.as_deref(), b[0].task_id.as_deref()), (Some("task_1"), Some("task_1")));
    // Alice's task finishes while Bob's still runs.
    let deadline = Instant::now() + Duration::from_secs(5);
    while alice.pending_tasks() > 0 {
        assert!(Instant::now() < deadline, "Alice's task never finished");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(bob.pending_tasks(), 1);
    assert!(bob.take_finished_tasks().is_empty(), "Bob took a task he did not start");
    let done = alice.take_finished_tasks();
    assert_eq!(rendered(&done), ["ALICE-PRIVATE-PROMPT"]);
    assert!(alice.take_finished_tasks().is_empty(), "taken once");
    // Waiting waits for one's own tasks only.
    assert_eq!(rendered(&bob.wait_tasks().await), ["bob"]);
    let a2 = alice.run_call(&render("alice-2", 0.1), "t2_call_1", &none).await;
    assert_eq!(a2[0].task_id.as_deref(), Some("task_2"));
    assert!(bob.wait_tasks().await.is_empty());
    assert_eq!(rendered(&alice.wait_tasks().await), ["alice-2"]);
}

/// Waits up to 5 s for a process with `marker` to show up.
async fn wait_for_process(marker: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while processes_with(marker).is_empty() {
        assert!(Instant::now() < deadline, "the task's process never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_that_ends_kills_the_tasks_it_still_runs() {
    let mut r = runner();
    let events: Arc<Mutex<Vec<ToolEvent>>> = Arc::default();
    let sink = events.clone();
    r.set_sink(Arc::new(move |e| sink.lock().map(|mut l| l.push(e)).unwrap_or(())));
    let none = CancellationToken::new();
    let slow = |m: &str| call(vec![step("Image.Render", json!({"prompt": "p", "seconds": 60, "marker": m}))]);

    // Stopped: the process group is gone when `stop` returns, long before
    // the tool's 10 s limit, and the task is reported stopped.
    let m = marker("scope-stop");
    let run = r.scope();
    let other = r.scope();
    let res = run.run_call(&slow(&m), "call_1", &none).await;
    assert_eq!(res[0].outcome, Outcome::Pending);
    wait_for_process(&m).await;
    let started = Instant::now();
    let stopped = run.stop().await;
    assert!(started.elapsed() < Duration::from_secs(2), "stop took {:?}", started.elapsed());
    assert_no_process(&m).await;
    assert_eq!(stopped.len(), 1);
    assert_eq!((stopped[0].outcome, stopped[0].task_id.as_deref()), (Outcome::Cancelled, Some("task_1")));
    assert_eq!(
        stopped[0].observation,
        "Observation: Error - Task task_1 of tool Image.Render was stopped before it finished: the run that started it ended"
    );
    let seen = events.lock().map(|l| l.clone()).unwrap_or_default();
    assert!(
        seen.iter().any(|e| matches!(e, ToolEvent::TaskDone(t) if t.outcome == Outcome::Cancelled)),
        "the sink hears of the stop: {seen:?}"
    );
    // A stopped run starts no more tasks; a second stop has nothing to do.
    let late = run.run_call(&slow(&m), "call_2", &none).await;
    assert_eq!(late[0].outcome, Outcome::NotRun);
    assert_eq!(
        late[0].observation,
        "Observation: Error - Tool Image.Render was not run: the run that made this call has ended"
    );
    assert!(run.stop().await.is_empty());
    assert_eq!(run.pending_tasks(), 0);
    // Another run of the same runner is not touched.
    let res = other.run_call(&render("other", 0.1), "call_1", &none).await;
    assert_eq!(res[0].outcome, Outcome::Pending);
    assert_eq!(rendered(&other.wait_tasks().await), ["other"]);

    // Dropped without a stop: the same kill.
    let m = marker("scope-drop");
    let run = r.scope();
    let _ = run.run_call(&slow(&m), "call_1", &none).await;
    wait_for_process(&m).await;
    drop(run);
    assert_no_process(&m).await;

    // A wait that is given up leaves the task to its run, which kills it.
    let m = marker("scope-wait");
    let run = r.scope();
    let _ = run.run_call(&slow(&m), "call_1", &none).await;
    wait_for_process(&m).await;
    assert!(tokio::time::timeout(Duration::from_millis(100), run.wait_tasks()).await.is_err());
    assert_eq!(run.pending_tasks(), 1);
    assert_eq!(run.stop().await.len(), 1);
    assert_no_process(&m).await;
}

#[tokio::test]
async fn cancel_token_and_drop_kill_the_running_tool() {
    let catalog = ToolCatalog::load_plugins(&plugins()).unwrap_or_else(|e| panic!("{e}"));
    let r = Runner::with_options(catalog, RunnerOptions::default()).scope();
    // Hang has a 400 ms limit; cancel before it.
    let m = marker("cancel");
    let token = CancellationToken::new();
    let t2 = token.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(150)).await;
        t2.cancel();
    });
    let c = call(vec![step("Hang", json!({"marker": m})), step("Greet", json!({"name": "x"}))]);
    let res = r.run_call(&c, "call_1", &token).await;
    assert_eq!(res.iter().map(|r| r.outcome).collect::<Vec<_>>(), [Outcome::Cancelled, Outcome::Cancelled]);
    assert_no_process(&m).await;
    // Dropping the future mid-run.
    let m = marker("drop");
    let c = call(vec![step("Hang", json!({"marker": m}))]);
    let fut = r.run_call(&c, "call_2", &token);
    let _ = tokio::time::timeout(Duration::from_millis(150), fut).await;
    assert_no_process(&m).await;
}

#[tokio::test]
async fn service_tools_and_attp_code() {
    let mut catalog = ToolCatalog::new();
    catalog
        .add(spindle::calls::ToolDef::new(
            "Lookup",
            json!({"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}),
        ))
        .unwrap_or_else(|e| panic!("{e}"));
    let mut r = Runner::new(catalog);
    r.register_service("Lookup", |p| async move {
        match p.get("key").and_then(Value::as_str) {
            Some("weather") => Ok(json!("sunny")),
            other => Err(format!("no entry for {other:?}")),
        }
    });
    let res = run(&r, &call(vec![step("Lookup", json!({"key": "weather"}))])).await;
    assert_eq!(res[0].observation, "Observation: Tool Lookup executed successfully. Result: sunny");
    let res = run(&r, &call(vec![step("Lookup", json!({"key": "moon"}))])).await;
    assert_eq!(
        res[0].observation,
        "Observation: Error - Tool Lookup failed (service error): no entry for Some(\"moon\")"
    );
    // ATTP code...
    let registry = Registry::profile("attp").unwrap_or_else(|| panic!("attp"));
    let text = "thought = \"\"\"x\"\"\"\n[tool_call]\nstatus = \"success\"\ntarget = \"t\"\ncode = '''\n__result__ = Lookup(key=\"weather\")\n'''\n";
    let events = parse(registry.clone(), text.as_bytes());
    let mut col = spindle::tools::collect::CallCollector::new(registry.clone().into());
    let (_, attp) = events.iter().find_map(|e| col.observe(e)).unwrap_or_else(|| panic!("no call"));
    let res = run(&r, &attp).await;
    // Without a `python` service it runs in spindle's sandbox: the tool it
    // called, then the code's own result.
    let got: Vec<(&str, Outcome)> = res.iter().map(|r| (r.tool_id.as_str(), r.outcome)).collect();
    assert_eq!(got, [("Lookup", Outcome::Success), ("python", Outcome::Success)], "{res:?}");
    assert_eq!(res[0].step, Some(1));
    assert_eq!(res[1].result, json!("sunny"));
    // ...and handed to one when registered, with the names to bind.
    r.register_service("python", |p| async move {
        Ok(json!({"ran": p.get("code").cloned(), "functions": p.get("functions").cloned()}))
    });
    let res = run(&r, &attp).await;
    assert_eq!(res[0].outcome, Outcome::Success, "{}", res[0].observation);
    assert!(res[0].observation.contains(r#""functions":{"Lookup":"Lookup"}"#), "{}", res[0].observation);
    // Code calling a function no tool provides is not handed over.
    let text = text.replace("Lookup(", "Lokup(");
    let events = parse(registry.clone(), text.as_bytes());
    let mut col = spindle::tools::collect::CallCollector::new(registry.into());
    let (_, attp) = events.iter().find_map(|e| col.observe(e)).unwrap_or_else(|| panic!("no call"));
    let res = run(&r, &attp).await;
    assert_eq!(res[0].outcome, Outcome::UnknownTool);
    assert_eq!(
        res[0].observation,
        "Observation: Error - Unknown tool 'Lokup' called in the code, did you mean 'Lookup'?"
    );
}

/// ATTP code without a `python` service runs in spindle's sandbox (spec
/// 001): positional and keyword arguments, the pre-injected libraries,
/// `print`, a failing tool raised as `ToolError`, an exception with its
/// line, and a run-away block stopped at the time limit with nothing left
/// running.
#[tokio::test]
async fn attp_code_runs_in_the_sandbox() {
    let r = runner_with(RunnerOptions { default_timeout: Duration::from_secs(3), ..RunnerOptions::default() });
    let registry = Registry::profile("attp").unwrap_or_else(|| panic!("attp"));
    let attp = |code: &str| {
        let text = format!(
            "thought = \"\"\"x\"\"\"\n[tool_call]\nstatus = \"success\"\ntarget = \"t\"\ncode = '''\n{code}\n'''\n"
        );
        let events = parse(registry.clone(), text.as_bytes());
        let mut col = spindle::tools::collect::CallCollector::new(registry.clone().into());
        events.iter().find_map(|e| col.observe(e)).map(|(_, c)| c).unwrap_or_else(|| panic!("no call in {text}"))
    };
    let code =
        "s = Add(2, b=40)\ne = Echo(text=str(s))\nprint('sum', s)\n__result__ = {'s': s, 'e': e, 'r': math.sqrt(16)}";
    let res = run(&r, &attp(code)).await;
    let got: Vec<(&str, Option<u64>, Outcome)> = res.iter().map(|r| (r.tool_id.as_str(), r.step, r.outcome)).collect();
    assert_eq!(
        got,
        [
            ("Math.Add", Some(1), Outcome::Success),
            ("Echo", Some(2), Outcome::Success),
            ("python", None, Outcome::Success)
        ],
        "{res:?}"
    );
    assert_eq!(res[0].result, json!(42));
    assert_eq!(
        res[2].result,
        json!({"result": {"s": 42, "e": {"echo": {"text": "42"}}, "r": 4.0}, "printed": "sum 42\n"})
    );
    assert!(
        res[2].observation.starts_with("Observation: Tool python executed successfully. Result: {\"s\":42"),
        "{}",
        res[2].observation
    );
    // The libraries may be imported as models habitually do; classes work;
    // anything else imported at run time is refused.
    let code = "import math\nfrom datetime import timedelta as td\nimport json as j\nclass Box:\n    def __init__(self, v):\n        self.v = v\n__result__ = [math.floor(2.5), str(td(days=1)), j.loads('[1]'), Box(3).v]";
    let res = run(&r, &attp(code)).await;
    assert_eq!(res[0].outcome, Outcome::Success, "{}", res[0].observation);
    assert_eq!(res[0].result, json!([2, "1 day, 0:00:00", [1], 3]));
    // A tool's failure is the code's to handle.
    let res = run(&r, &attp("try:\n    Fail()\nexcept ToolError as e:\n    __result__ = 'caught'")).await;
    assert_eq!(res.iter().map(|r| r.outcome).collect::<Vec<_>>(), [Outcome::Failed, Outcome::Success]);
    assert_eq!(res[1].result, json!("caught"));
    // An exception: its type, message and line.
    let res = run(&r, &attp("x = 1\ny = x / 0\n__result__ = y")).await;
    assert_eq!(res[0].outcome, Outcome::Failed);
    assert_eq!(
        res[0].observation,
        "Observation: Error - ATTP code failed: ZeroDivisionError: division by zero (line 2)"
    );
    // Printing is kept to a bounded tail; values JSON cannot hold become text.
    let res = run(&r, &attp("for i in range(20000):\n    print('x' * 100)\n__result__ = [float('nan'), {1}]")).await;
    assert_eq!(res[0].outcome, Outcome::Success, "{}", res[0].observation);
    assert_eq!(res[0].result["result"], json!(["nan", [1]]));
    assert!(res[0].result["printed"].as_str().is_some_and(|p| p.len() <= 4096 && p.ends_with("x\n")));
    // Endless code: stopped at the limit, its process gone.
    let id = marker("attp-loop");
    let res = r.scope().run_call(&attp("while True:\n    pass\n__result__ = 1"), &id, &CancellationToken::new()).await;
    assert_eq!(res[0].outcome, Outcome::Timeout, "{}", res[0].observation);
    assert_no_process(&id).await;
}

#[tokio::test]
async fn process_table_check_sees_live_processes() {
    // The leak checks above would pass vacuously if the scan saw nothing.
    let m = marker("live");
    let mut child = std::process::Command::new("sh")
        .args(["-c", &format!("sleep 5; : {m}")])
        .spawn()
        .unwrap_or_else(|e| panic!("{e}"));
    // Right after fork the child still shows the parent's command line.
    let deadline = Instant::now() + Duration::from_secs(3);
    while processes_with(&m).is_empty() {
        assert!(Instant::now() < deadline, "the scan never saw the live process");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let _ = child.kill();
    let _ = child.wait();
    assert_no_process(&m).await;
}

#[tokio::test]
async fn malformed_blocks_and_policy_breaches_run_nothing() {
    let mut r = runner();
    let ran = Arc::new(Mutex::new(0usize));
    let counter = ran.clone();
    r.register_service("python", move |_| {
        let counter = counter.clone();
        async move {
            counter.lock().map(|mut n| *n += 1).unwrap_or(());
            Ok(json!(null))
        }
    });
    let calls_of = |profile: &str, text: &str| {
        let registry = Registry::profile(profile).unwrap_or_else(|| panic!("{profile}"));
        let events = parse(registry.clone(), text.as_bytes());
        let mut col = spindle::tools::collect::CallCollector::new(registry.into());
        events.iter().filter_map(|e| col.observe(e)).map(|(_, c)| c).collect::<Vec<_>>()
    };
    let action = calls_of("action", "<ACTION><Greet><name>x</nam></Greet></ACTION>");
    let res = run(&r, &action[0]).await;
    assert_eq!(res.len(), 1);
    assert_eq!(res[0].outcome, Outcome::Malformed);
    assert!(
        res[0].observation.starts_with("Observation: Error - Malformed XML in ACTION block"),
        "{}",
        res[0].observation
    );
    let breach = "thought = \"\"\"x\"\"\"\n[tool_call]\nstatus = \"success\"\ntarget = \"t\"\ncode = '''\nimport os\n__result__ = os.system(\"rm -rf /\")\n'''\n";
    let res = run(&r, &calls_of("attp", breach)[0]).await;
    assert_eq!(res[0].outcome, Outcome::Malformed);
    assert!(res[0].observation.contains("policy"), "{}", res[0].observation);
    let declined = "thought = \"\"\"x\"\"\"\n[tool_call]\nstatus = \"fail\"\nmessage = \"no tool for that\"\n";
    assert!(run(&r, &calls_of("attp", declined)[0]).await.is_empty());
    assert_eq!(*ran.lock().unwrap_or_else(|e| e.into_inner()), 0, "the python service never ran");
}
