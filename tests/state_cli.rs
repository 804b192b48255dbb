//! `spindle parse --state FILE`: applies every variable_update to the JSON
//! in FILE, writes it back atomically, and reports each op on stderr while
//! stdout keeps the chosen format.

use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const RESPONSE: &str = "<thought>plan</thought>
<content>「你好」</content>
<UpdateVariable>
<Analysis>悠纪.好感度: Y</Analysis>
_.set('悠纪.好感度', 33,35);//开心
_.add('gold', 10);
</UpdateVariable>
<variable_update>
```json
[
  [\"set\", \"纯田真奈.好感度\", 2],
  [\"ADD\", \"mood.value\", 1,],
  [\"DIV\", \"mood.value\", 0],
  ['PUSH', 'items', 'sword'],
  [\"POP\", \"missing\"],
  [\"SET\", \"gold.x\", 1],
]
```
</variable_update>
";

/// A fresh folder, removed when it drops.
struct TempDir(tempfile::TempDir);

impl TempDir {
    fn new(name: &str) -> TempDir {
        TempDir(tempfile::Builder::new().prefix(&format!("spindle-state-{name}-")).tempdir().expect("create temp dir"))
    }

    fn path(&self) -> &Path {
        self.0.path()
    }

    fn file(&self, name: &str, text: &str) -> PathBuf {
        let p = self.path().join(name);
        std::fs::write(&p, text).expect("write file");
        p
    }
}

fn spindle(args: &[&str], input: &Path, state: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_spindle"))
        .arg("parse")
        .args(args)
        .arg(input)
        .arg("--state")
        .arg(state)
        .output()
        .expect("run spindle")
}

fn read_json(p: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(p).expect("read state")).expect("state is JSON")
}

#[test]
fn applies_updates_and_reports_each_op() {
    for chunk in ["1000000", "1", "7"] {
        let dir = TempDir::new(&format!("apply{chunk}"));
        let input = dir.file("response.txt", RESPONSE);
        let state = dir.file("state.json", r#"{"悠纪": {"好感度": 33}, "gold": 5, "mood": {"value": 3}}"#);
        let out = spindle(&["--format", "jsonl", "--chunk-size", chunk], &input, &state);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(
            read_json(&state),
            json!({"悠纪": {"好感度": 35}, "gold": 15, "mood": {"value": 4}, "纯田真奈": {"好感度": 2}, "items": ["sword"]})
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        let lines: Vec<&str> = stderr.lines().filter(|l| l.starts_with("spindle: state: element")).collect();
        assert_eq!(
            lines,
            [
                "spindle: state: element 2: SET 悠纪.好感度: 33 -> 35",
                "spindle: state: element 2: ADD gold: 5 -> 15",
                "spindle: state: element 3: SET 纯田真奈.好感度: (new) -> 2",
                "spindle: state: element 3: ADD mood.value: 3 -> 4",
                "spindle: state: element 3: DIV mood.value: failed: division by zero",
                "spindle: state: element 3: PUSH items: appended \"sword\"",
                "spindle: state: element 3: POP missing: failed: nothing at missing",
                "spindle: state: element 3: SET gold.x: failed: the path goes through a number at gold",
            ],
            "{stderr}"
        );
        assert!(stderr.contains("(5 op(s) applied, 3 failed)"), "{stderr}");
        // stdout is still one JSON event per line.
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(stdout.lines().all(|l| serde_json::from_str::<Value>(l).is_ok()), "{stdout}");
        // Nothing but the two files is left in the directory.
        let mut names: Vec<String> = std::fs::read_dir(dir.path())
            .expect("list dir")
            .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect();
        names.sort();
        assert_eq!(names, ["response.txt", "state.json"]);
    }
}

#[test]
fn a_missing_state_file_is_created() {
    let dir = TempDir::new("missing");
    let input =
        dir.file("r.txt", "<content>x</content><variable_update>[[\"SET\", \"a.b\", [1, 2]]]</variable_update>");
    let state = dir.path().join("new.json");
    let out = spindle(&["--format", "summary"], &input, &state);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(read_json(&state), json!({"a": {"b": [1, 2]}}));
    assert!(String::from_utf8_lossy(&out.stderr).contains("does not exist; starting from {}"));
}

#[test]
fn an_invalid_state_file_is_left_alone() {
    let dir = TempDir::new("invalid");
    let input = dir.file("r.txt", "<content>x</content><variable_update>[[\"SET\", \"a\", 1]]</variable_update>");
    let state = dir.file("s.json", "{not json");
    let out = spindle(&[], &input, &state);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("is not valid JSON"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::read_to_string(&state).unwrap_or_default(), "{not json");
}

#[test]
fn nothing_applied_leaves_the_file_as_it_was() {
    let dir = TempDir::new("noop");
    let input = dir.file("r.txt", "<content>x</content><variable_update>[[\"POP\", \"nothing\"]]</variable_update>");
    let original = "{\"keep\":   \"formatting\"}";
    let state = dir.file("s.json", original);
    let out = spindle(&["--format", "pretty"], &input, &state);
    assert!(out.status.success());
    assert_eq!(std::fs::read_to_string(&state).unwrap_or_default(), original);
    assert!(String::from_utf8_lossy(&out.stderr).contains("no op applied (1 failed)"));
}
