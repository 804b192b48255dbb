//! The binary's error paths, by their exact stderr: one `spindle: error:`
//! line (a multi-line TOML diagnostic keeps its lines), each cause once,
//! exit status 2.

use std::path::Path;
use std::process::Command;

fn spindle(dir: &Path, args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_spindle")).current_dir(dir).args(args).output().expect("runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A fresh folder, removed when the returned guard drops.
fn scratch(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(&format!("spindle-cli-errors-{name}-")).tempdir().expect("temp dir")
}

fn transcript() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("corpora/clean-rp-zh-teahouse.txt").display().to_string()
}

const NO_FILE: &str = "No such file or directory (os error 2)";

#[test]
fn registry_errors_print_their_cause_once() {
    let tmp = scratch("registry");
    let dir = tmp.path();
    std::fs::write(dir.join("bad.toml"), "x = [\n").unwrap();
    std::fs::write(dir.join("bad.json"), "{\"tags\": [\n").unwrap();
    let t = transcript();
    let cases = [
        (
            "bad.toml",
            "spindle: error: registry bad.toml: registry TOML is invalid: TOML parse error at line 1, column 6\n  |\n1 | x = [\n  |      ^\nunclosed array, expected `]`\n".to_string(),
        ),
        (
            "bad.json",
            "spindle: error: registry bad.json: registry JSON is invalid: EOF while parsing a list at line 2 column 0\n"
                .to_string(),
        ),
        (
            "missing.toml",
            format!("spindle: error: registry missing.toml: cannot read registry file missing.toml: {NO_FILE}\n"),
        ),
    ];
    for (file, want) in cases {
        let (code, stdout, stderr) = spindle(dir, &["parse", &t, "--registry", file]);
        assert_eq!((code, stdout.as_str(), stderr.as_str()), (Some(2), "", want.as_str()), "{file}");
    }
}

#[test]
fn missing_files_and_unknown_names_are_one_line() {
    let tmp = scratch("names");
    let dir = tmp.path();
    let t = transcript();
    let cases: Vec<(Vec<&str>, String)> = vec![
        (vec!["parse", "missing.txt"], format!("spindle: error: cannot read missing.txt: {NO_FILE}\n")),
        (
            vec!["tools", "list", "--tools", "nope"],
            format!("spindle: error: tools nope: cannot read nope: {NO_FILE}\n"),
        ),
        (
            vec!["parse", "--execute", "--tools", "nope", &t],
            format!("spindle: error: tools nope: cannot read nope: {NO_FILE}\n"),
        ),
        (
            vec!["agent", "hi", "--upstream", "http://127.0.0.1:9", "--model", "m", "--tools", "nope"],
            format!("spindle: error: tools nope: cannot read nope: {NO_FILE}\n"),
        ),
        (
            vec!["proxy", "--config", "missing.toml"],
            format!("spindle: error: config missing.toml: cannot read it: {NO_FILE}\n"),
        ),
    ];
    for (args, want) in cases {
        let (code, _, stderr) = spindle(dir, &args);
        assert_eq!((code, stderr.as_str()), (Some(2), want.as_str()), "{args:?}");
    }
}

#[test]
fn an_unknown_profile_is_a_usage_error_with_the_known_names() {
    let (code, _, stderr) = spindle(scratch("profile").path(), &["parse", &transcript(), "--profile", "nope"]);
    let want = "error: invalid value 'nope' for '--profile <PROFILE>'\n  [possible values: filament, reasoning, reasoning-prefilled, chat, tam, action, attp]\n\nFor more information, try '--help'.\n";
    assert_eq!((code, stderr.as_str()), (Some(2), want));
}

#[test]
fn a_bad_config_file_names_the_line_and_key() {
    let tmp = scratch("config");
    let dir = tmp.path();
    std::fs::write(dir.join("bad.toml"), "[upstream]\nurl = 3\n").unwrap();
    let (code, _, stderr) = spindle(dir, &["proxy", "--config", "bad.toml"]);
    assert_eq!(
        (code, stderr.as_str()),
        (
            Some(2),
            "spindle: error: config bad.toml, line 2: upstream.url: invalid type: integer `3`, expected a string\n"
        )
    );
}

#[test]
fn a_port_in_use_is_one_line() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let tmp = scratch("bind");
    let dir = tmp.path();
    let (code, _, stderr) = spindle(dir, &["proxy", "--upstream", "http://127.0.0.1:9", "--listen", &addr]);
    assert_eq!(code, Some(2), "{stderr}");
    let want = format!("spindle: error: cannot listen on {addr}: Address already in use (os error 98)\n");
    assert_eq!(stderr, want);
}
