//! ATTP documents (spec 001): the whole output through `spindle parse
//! --profile attp`, the code policy, and the streaming thought reader.

mod calls_support;

use calls_support::*;
use proptest::prelude::*;
use serde_json::{Value, json};
use spindle::calls::attp::{ThoughtStream, check_code, parse_attp};

fn attp(input: &str) -> (Value, Vec<Value>) {
    let events = parse_all_splits(input, &["--profile", "attp"]);
    let mut p = payloads(&events, "attp");
    assert_eq!(p.len(), 1, "the whole output is one attp element");
    (p.remove(0), events)
}

fn corpus(name: &str) -> String {
    std::fs::read_to_string(format!("corpora/{name}")).unwrap()
}

const TEMPLATE_THOUGHT: &str = "模型的思考过程，必须包括：\n1. 理解用户请求：[用户想做什么]\n2. 选择工具：[需要使用哪些工具，为什么]\n3. 工具验证：[确认工具存在于可用列表]\n4. 执行计划：[如何使用工具解决问题]\n";

#[test]
fn spec001_success_template() {
    let (p, events) = attp(&corpus("attp-spec001-success-template.txt"));
    let a = &p["attp"];
    assert_eq!(a["thought"], TEMPLATE_THOUGHT);
    assert_eq!(a["status"], "success");
    assert_eq!(a["target"], "工具调用的目标描述");
    // The comments mention import, but the code has none.
    assert_eq!(a["violations"], json!([]));
    assert_eq!(a["calls"], json!(["tool_name"]));
    assert_eq!(p["steps"][0]["tool_id"], "python");
    assert!(p["steps"][0]["params"]["code"].as_str().unwrap().ends_with("__result__ = tool_name(arg1, arg2)\n"));
    assert!(p["error"].is_null());
    assert!(!events.iter().any(|e| e["type"] == "repair"), "bare attp: no repairs");
}

#[test]
fn spec001_fail_template_and_examples() {
    let (p, _) = attp(&corpus("attp-spec001-fail-template.txt"));
    assert_eq!(p["attp"]["thought"], TEMPLATE_THOUGHT);
    assert_eq!(p["attp"]["status"], "fail");
    assert_eq!(p["attp"]["message"], "失败原因和替代方案");
    assert_eq!(p["steps"], json!([]));
    assert!(p["error"].is_null());

    let (p, _) = attp(&corpus("attp-spec001-success-example.txt"));
    assert_eq!(p["attp"]["target"], "搜索Python异步编程相关内容");
    assert_eq!(p["attp"]["code"], "__result__ = search_web(\"Python异步编程\", max_results=3)\n");
    assert_eq!(p["attp"]["calls"], json!(["search_web"]));
    assert!(
        p["attp"]["thought"].as_str().unwrap().starts_with("用户需要搜索Python异步编程相关信息并获取前3个结果。\n")
    );

    let (p, _) = attp(&corpus("attp-spec001-fail-example.txt"));
    assert_eq!(p["attp"]["status"], "fail");
    assert!(p["attp"]["message"].as_str().unwrap().starts_with("当前可用的工具列表中没有文件删除功能"));
}

#[test]
fn policy_violations_are_listed() {
    let (p, _) = attp(&corpus("attp-policy-violations.txt"));
    let rules: Vec<(String, Option<String>)> = p["attp"]["violations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| (v["rule"].as_str().unwrap().to_string(), v["name"].as_str().map(str::to_string)))
        .collect();
    let want = [
        ("import", Some("os")),
        ("forbidden_module", Some("pathlib")),
        ("forbidden_call", Some("open")),
        ("forbidden_module", Some("os")),
        ("forbidden_call", Some("eval")),
        ("forbidden_call", Some("__import__")),
    ];
    let want: Vec<(String, Option<String>)> =
        want.iter().map(|(r, n)| (r.to_string(), n.map(str::to_string))).collect();
    assert_eq!(rules, want);
    assert!(p["observation"].as_str().unwrap().starts_with("Observation: Error - Code policy violation: "));
    assert!(warnings(&p).contains(&"text_outside_toml".to_string()));
}

#[test]
fn code_policy_table() {
    // (code, rules found)
    let cases: &[(&str, &[&str])] = &[
        ("__result__ = 1", &[]),
        ("__result__: int = 1", &[]),
        ("for __result__ in range(3): pass", &[]),
        // Not assigning `__result__` is no breach (see below).
        ("x = 1", &[]),
        // The pre-injected libraries may be imported (the names are there
        // already); nothing else, nothing dotted or relative, no `_` name.
        ("import math\n__result__ = 1", &[]),
        ("import math, json as j\nfrom datetime import datetime, timedelta\n__result__ = j.dumps(1)", &[]),
        ("from math import (sqrt,\n    pi)\n__result__ = sqrt(pi)", &[]),
        ("import os\n__result__ = 1", &["import"]),
        ("import math, os\n__result__ = 1", &["import"]),
        ("import os.path\n__result__ = 1", &["import"]),
        ("import math.x\n__result__ = 1", &["import"]),
        ("from . import x\n__result__ = 1", &["import"]),
        ("from math import _x\n__result__ = 1", &["import"]),
        ("from os import path\n__result__ = 1", &["forbidden_module"]),
        ("from math import sqrt\npass\nimport os\n__result__ = 1", &["import"]),
        ("import math; import shutil as s\n__result__ = 1", &["import"]),
        ("__result__ = exec('x')", &["forbidden_call"]),
        ("__result__ = compile('1', 'f', 'eval')", &["forbidden_call"]),
        ("__result__ = subprocess.run(['ls'])", &["forbidden_module"]),
        ("__result__ = socket.socket()", &["forbidden_module"]),
        ("__result__ = requests.get(u)", &["forbidden_module"]),
        ("__result__ = http.client", &["forbidden_module"]),
        (
            "__result__ = ().__class__.__bases__[0].__subclasses__()",
            &["sandbox_escape", "sandbox_escape", "sandbox_escape"],
        ),
        // A library's private parts: `random` imports `os` as `_os`.
        ("__result__ = random._os.system('id')", &["sandbox_escape"]),
        // A running generator's frame leads to its callers' globals.
        (
            "def g():\n    yield gen.gi_frame.f_back.f_back.f_globals\ngen = g()\n__result__ = next(gen)",
            &["sandbox_escape", "sandbox_escape", "sandbox_escape", "sandbox_escape"],
        ),
        (
            "try:\n    1/0\nexcept Exception as e:\n    __result__ = e.__traceback__.tb_frame",
            &["sandbox_escape", "sandbox_escape"],
        ),
        ("__result__ = f'{eval(\"1\")}'", &["forbidden_call"]),
        ("__result__ = f'{{eval}} open'", &[]),
        // Not code: strings and comments; attributes and keyword arguments.
        ("# import os\n__result__ = 'import os; eval(x); open(f)'", &[]),
        ("__result__ = \"\"\"\nimport os\n\"\"\"", &[]),
        ("__result__ = r'\\'open'", &[]),
        ("d = tool()\n__result__ = d.open(mode='r', eval=True)", &[]),
        ("__result__ = search_web(query='os.system', open=1)", &[]),
        ("__result__ = math.sqrt(json.loads('4'))", &[]),
    ];
    for (code, want) in cases {
        let got: Vec<String> = check_code(code).violations.into_iter().map(|v| v.rule).collect();
        assert_eq!(got, *want, "{code:?}");
    }
    // Whether `__result__` is assigned (code that does not still runs: its
    // last expression, or what it prints, is its result).
    for (code, assigns) in [
        ("__result__ = 1", true),
        ("__result__: int = 1", true),
        ("for __result__ in range(3): pass", true),
        ("x = 1", false),
        ("__result__ == 1", false),
        ("f(__result__=1)", false),
    ] {
        assert_eq!(check_code(code).assigns_result, assigns, "{code:?}");
    }
    let r = check_code(
        "def helper(x):\n    return search_web(x)\nitems = [helper(q) for q in qs]\n__result__ = summarize(items, n=len(items))",
    );
    assert_eq!(r.calls, ["search_web", "summarize"]);
    // What an import binds is not a tool.
    let r = check_code("from math import sqrt as root, pi\nimport json as j\n__result__ = root(pi) + f(j.loads('1'))");
    assert_eq!(r.calls, ["f"]);
    let refused: Vec<Option<String>> =
        check_code("import math, os.path\n__result__ = 1").violations.into_iter().map(|v| v.name).collect();
    assert_eq!(refused, [Some("os.path".to_string())]);
}

#[test]
fn invalid_and_truncated_documents_still_show_the_thought() {
    let (p, _) = attp(&corpus("attp-invalid-toml.txt"));
    assert!(p["error"].as_str().unwrap().starts_with("Invalid TOML"));
    assert_eq!(p["attp"]["thought"], "I will search for the docs.\n");
    let (p, events) = attp(&corpus("attp-truncated.txt"));
    assert!(p["error"].as_str().unwrap().starts_with("Invalid TOML"));
    assert_eq!(
        p["attp"]["thought"],
        "Step 1: understand the request.\nStep 2: choose search_web, with \"quotes\" and \\backslashes\\.\n"
    );
    assert!(warnings(&p).contains(&"unclosed_fence".to_string()));
    // The thought streamed as it arrived, even though the document was
    // cut off; the raw TOML is the element's text.
    let streamed: String = events
        .iter()
        .filter(|e| e["type"] == "delta" && e["tag"] == "thought")
        .filter_map(|e| e["text"].as_str())
        .collect();
    assert_eq!(streamed, p["attp"]["thought"].as_str().unwrap());
}

#[test]
fn library_reader_edge_cases() {
    let (call, f) = parse_attp("thought = 'x'\n[tool_call]\ncode = '__result__ = 1'\nextra = 2\n");
    assert_eq!(call.attp.as_ref().unwrap().status.as_deref(), Some("success"));
    assert!(f.warnings.contains(&"missing_status".to_string()));
    assert!(f.warnings.contains(&"unknown_key".to_string()));
    assert!(f.warnings.contains(&"missing_target".to_string()));
    // Only a thought, or prose: an answer that calls nothing (no error).
    let (call, f) = parse_attp("thought = 'x'\n");
    assert!(call.error.is_none() && call.steps.is_empty(), "{call:?}");
    assert!(f.warnings.contains(&"missing_tool_call".to_string()));
    let (call, f) = parse_attp("The answer is 42.");
    assert!(call.error.is_none() && call.steps.is_empty(), "{call:?}");
    assert_eq!(f.warnings, ["invalid_toml"]);
    // Broken TOML that means to call is an error the model reads.
    let (call, _) = parse_attp("[tool_call\nstatus = 'success'");
    assert!(call.error.unwrap().contains("Invalid TOML"));
    let (call, f) = parse_attp("Thought = 'Mixed case.'\n[Tool_Call]\nstatus = 'FAIL'\nmessage = 'no'\n");
    let a = call.attp.unwrap();
    assert_eq!((a.thought.as_deref(), a.status.as_deref()), (Some("Mixed case."), Some("fail")));
    assert_eq!(f.warnings, ["key_case"]);
    let mut ts = ThoughtStream::new();
    assert_eq!(ts.feed("Thought = 'Mixed case.'"), "Mixed case.");
    let (call, _) = parse_attp("[tool_call]\nstatus = 'success'\ntarget = 't'\n");
    assert!(call.error.unwrap().contains("code"));
}

// ----- the thought stream ------------------------------------------------

/// Streams `doc` split at the given char boundaries.
fn stream_split(doc: &str, cuts: &[usize]) -> String {
    let mut ts = ThoughtStream::new();
    let mut out = String::new();
    let mut last = 0;
    for &c in cuts {
        out.push_str(&ts.feed(&doc[last..c]));
        last = c;
    }
    out.push_str(&ts.feed(&doc[last..]));
    out.push_str(&ts.finish());
    out
}

fn char_bounds(doc: &str) -> Vec<usize> {
    doc.char_indices().map(|(i, _)| i).chain([doc.len()]).collect()
}

/// Every split into two and three pieces, and every chunk size, gives the
/// same text.
fn assert_split_invariant(doc: &str, want: &str) {
    let bounds = char_bounds(doc);
    for &a in &bounds {
        assert_eq!(stream_split(doc, &[a]), want, "split at {a} of {doc:?}");
        for &b in bounds.iter().filter(|&&b| b >= a).step_by(3) {
            assert_eq!(stream_split(doc, &[a, b]), want, "splits at {a},{b} of {doc:?}");
        }
    }
    for size in 1..=8 {
        let cuts: Vec<usize> = bounds.iter().copied().skip(size).step_by(size).filter(|&c| c < doc.len()).collect();
        assert_eq!(stream_split(doc, &cuts), want, "chunk size {size} of {doc:?}");
    }
}

#[test]
fn thought_stream_at_every_split() {
    let cases: &[(&str, &str)] = &[
        ("thought = \"\"\"\nline 1\nline 2\n\"\"\"\n[tool_call]\n", "line 1\nline 2\n"),
        ("thought = '''\r\nraw \\n ''not'' closed'''", "raw \\n ''not'' closed"),
        ("thought = \"a \\\"b\\\" \\\\ \\t \\u00E9 \\U0001F600 \\x41\"", "a \"b\" \\ \t é 😀 A"),
        ("thought = 'it''s'", "it"),
        ("thought = \"\"\"ends with quotes\"\"\"\"\"", "ends with quotes\"\""),
        ("thought = \"\"\"one \"\"quote\"\" run\"\"\"", "one \"\"quote\"\" run"),
        ("thought = \"\"\"\nfolded \\\n   line\"\"\"", "folded line"),
        ("thought = \"\"", ""),
        ("```toml\nthought = \"\"\"\n思考：用「工具」\n\"\"\"\n```", "思考：用「工具」\n"),
        ("Sure, here it is:\n```toml\n  thought   =   \"x\"  # c\n```", "x"),
        ("\"thought\" = 'quoted key'", "quoted key"),
        ("thoughts = 'no'\nthought.x = 'no'\nthought = 'yes'", "yes"),
        ("a = [1, \"thought = 'no'\", [2, '''x\n]''']]\nb = { thought = 'no' }\nthought = 'yes'", "yes"),
        ("[tool_call]\nthought = 'not top level'", ""),
        ("thought = \"bad \\q escape \\u12G\"", "bad \\q escape \\u12G"),
        ("thought = \"\"\"unterminated with \"\"", "unterminated with \"\""),
        ("thought = \"cut in escape \\u00", "cut in escape \\u00"),
        // Six quotes: TOML allows two before the closing three; the sixth
        // is after the string.
        ("thought = \"\"\"\n\"\"\"\"\"\"", "\"\""),
    ];
    for (doc, want) in cases {
        assert_split_invariant(doc, want);
    }
}

#[test]
fn thought_stream_releases_early() {
    let mut ts = ThoughtStream::new();
    assert_eq!(ts.feed("thought = \"\"\"\nHel"), "Hel");
    assert_eq!(ts.feed("lo \""), "lo ");
    assert_eq!(ts.feed("\" "), "\"\" ");
    assert_eq!(ts.feed("wor\\"), "wor");
    assert_eq!(ts.feed("u00e9"), "é");
    assert!(!ts.is_complete());
    assert_eq!(ts.feed("\"\"\"\n[tool_call]\ncode = '''x'''"), "");
    assert!(ts.is_complete());
    assert_eq!(ts.finish(), "");
}

#[test]
fn thought_stream_matches_the_binary_element() {
    // The element's raw text, streamed in deltas of any size, releases the
    // thought the TOML parser finds.
    for name in [
        "attp-spec001-success-template.txt",
        "attp-spec001-fail-example.txt",
        "attp-multi-tool-unfenced.txt",
        "attp-policy-violations.txt",
    ] {
        let doc = corpus(name);
        for size in [1, 7, 64] {
            let run = run(doc.as_bytes(), Some(size), &["--profile", "attp"]);
            let p = payloads(&run.events, "attp");
            let text_of = |tag: &str| -> Vec<String> {
                run.events
                    .iter()
                    .filter(|e| e["type"] == "delta" && e["tag"] == tag)
                    .map(|e| e["text"].as_str().unwrap().to_string())
                    .collect()
            };
            let (raw, thought) = (text_of("attp"), text_of("thought"));
            assert!(!raw.is_empty() || !thought.is_empty(), "{name}: no deltas at all");
            // Thought deltas (once the payload stage streams them) add up to
            // the thought.
            if !thought.is_empty() {
                assert_eq!(Value::String(thought.concat()), p[0]["attp"]["thought"], "{name} at {size}");
            }
            if raw.is_empty() {
                continue;
            }
            let mut ts = ThoughtStream::new();
            let mut seen = String::new();
            for t in &raw {
                seen.push_str(&ts.feed(t));
            }
            seen.push_str(&ts.finish());
            assert_eq!(Value::String(seen), p[0]["attp"]["thought"], "{name} at {size}");
        }
    }
}

/// TOML text for `s` as one of the four string forms, or `None` when the
/// form cannot hold it.
fn toml_string(s: &str, form: u8) -> Option<String> {
    match form % 4 {
        0 => {
            let mut out = String::from("\"");
            for c in s.chars() {
                match c {
                    '"' => out.push_str("\\\""),
                    '\\' => out.push_str("\\\\"),
                    '\n' => out.push_str("\\n"),
                    '\t' => out.push_str("\\t"),
                    c if (c as u32) < 0x20 || c == '\u{7f}' => out.push_str(&format!("\\u{:04X}", c as u32)),
                    c => out.push(c),
                }
            }
            out.push('"');
            Some(out)
        }
        1 => {
            let mut out = String::from("\"\"\"\n");
            for c in s.chars() {
                match c {
                    '"' => out.push_str("\\\""),
                    '\\' => out.push_str("\\\\"),
                    '\n' | '\t' => out.push(c),
                    c if (c as u32) < 0x20 || c == '\u{7f}' => out.push_str(&format!("\\u{:04X}", c as u32)),
                    c => out.push(c),
                }
            }
            out.push_str("\"\"\"");
            Some(out)
        }
        2 => (!s.contains(['\'', '\n', '\r']) && !s.chars().any(|c| c.is_control() && c != '\t'))
            .then(|| format!("'{s}'")),
        _ => (!s.contains("'''")
            && !s.ends_with('\'')
            && !s.contains('\r')
            && !s.chars().any(|c| c.is_control() && !matches!(c, '\t' | '\n')))
        .then(|| format!("'''\n{s}'''")),
    }
}

proptest! {
    /// Oracle: the `toml` crate's reading of the whole document.
    #[test]
    fn thought_stream_agrees_with_toml(
        s in "[a-z \"'\\\\\n\t{}=#\\[\\]é思😀]{0,40}",
        form in 0u8..4,
        before in prop::sample::select(vec!["", "a = 1\n", "x = \"\"\"\nthought = 'no'\n\"\"\"\n", "arr = [\n 'thought',\n]\n"]),
        cuts in prop::collection::vec(0usize..200, 0..6),
    ) {
        let Some(lit) = toml_string(&s, form) else { return Ok(()) };
        let doc = format!("{before}thought = {lit}\n\n[tool_call]\nstatus = \"fail\"\nmessage = \"m\"\n");
        let table: toml::Table = match doc.parse() { Ok(t) => t, Err(_) => return Ok(()) };
        let want = table["thought"].as_str().unwrap().to_string();
        let bounds = char_bounds(&doc);
        let mut cuts: Vec<usize> = cuts.into_iter().map(|c| bounds[c % bounds.len()]).collect();
        cuts.sort_unstable();
        prop_assert_eq!(stream_split(&doc, &cuts), want);
    }
}

/// `code` in a `"""` string, as models often write it: read with Python's
/// escapes, as written (TOML's would break `"\n".join` and refuse `\d`).
#[test]
fn code_in_a_basic_string_is_read_as_written() {
    let doc = |code: &str| {
        format!(
            "thought = \"\"\"t\"\"\"\n[tool_call]\nstatus = \"success\"\ntarget = \"t\"\ncode = \"\"\"\n{code}\n\"\"\"\n"
        )
    };
    let raw = |call: &spindle::calls::ToolCall| call.attp.as_ref().and_then(|a| a.code.clone()).unwrap_or_default();
    for code in ["__result__ = \"\\n\".join([\"a\", \"b\"])", "__result__ = re.findall(r\"\\d+\", \"a1b22\")"] {
        let (call, f) = parse_attp(&doc(code));
        assert!(call.error.is_none(), "{code}: {call:?}");
        assert_eq!(raw(&call), format!("{code}\n"));
        assert!(f.warnings.contains(&"code_read_raw".to_string()), "{code}: {f:?}");
    }
    // Nothing to change, TOML's escapes used as TOML means them, or
    // nothing a literal string could hold: TOML's reading stands, without
    // a warning.
    for (code, want) in [
        ("__result__ = 1", "__result__ = 1\n"),
        ("__result__ = \"\\\\n\".join(x)", "__result__ = \"\\n\".join(x)\n"),
        ("__result__ = '''a\\tb'''", "__result__ = '''a\tb'''\n"),
    ] {
        let (call, f) = parse_attp(&doc(code));
        assert_eq!(raw(&call), want);
        assert!(!f.warnings.contains(&"code_read_raw".to_string()), "{code}: {f:?}");
    }
    // The same through the whole parser, at every split.
    let (p, _) = attp(&doc("__result__ = \"\\n\".join(x)"));
    assert_eq!(p["attp"]["code"], "__result__ = \"\\n\".join(x)\n");
}

/// Code fenced inside its string (with the document fenced or not): the
/// fence lines go, the code stays; a ```` ```python ```` line inside `code`
/// does not end the document's own fence.
#[test]
fn fenced_code_inside_the_document() {
    let doc = "thought = '''t'''\n[tool_call]\nstatus = \"success\"\ntarget = \"t\"\ncode = '''\n```python\nx = 1\n__result__ = x\n```\n'''\n";
    let code = |call: &spindle::calls::ToolCall| call.attp.as_ref().and_then(|a| a.code.clone()).unwrap_or_default();
    for (text, outside) in [(doc.to_string(), false), (format!("Here:\n```toml\n{doc}```\nDone."), true)] {
        let (call, f) = parse_attp(&text);
        assert!(call.error.is_none(), "{text}: {call:?}");
        assert_eq!(code(&call), "x = 1\n__result__ = x\n", "{text}");
        assert!(f.warnings.contains(&"code_fence_dropped".to_string()), "{f:?}");
        assert_eq!(f.warnings.contains(&"text_outside_toml".to_string()), outside, "{f:?}");
    }
    // Unfenced code: as it is, no warning.
    let (call, f) = parse_attp("[tool_call]\nstatus = \"success\"\ntarget = \"t\"\ncode = '''\n__result__ = 1\n'''\n");
    assert_eq!(code(&call), "__result__ = 1\n");
    assert!(!f.warnings.contains(&"code_fence_dropped".to_string()));
    // Through the whole parser, at every split.
    let (p, _) = attp(doc);
    assert_eq!(p["attp"]["code"], "x = 1\n__result__ = x\n");
}

/// A thought that quotes a `code = """` line does not hide the real one.
#[test]
fn a_quoted_code_line_in_the_thought_is_not_the_code() {
    let doc = "thought = '''I could write\ncode = \"\"\" like this\"\"\"\n'''\r\n[tool_call]\r\nstatus = \"success\"\r\ntarget = \"t\"\r\ncode = \"\"\"\r\n__result__ = re.findall(r\"\\d+\", \"a1\")\r\n\"\"\"\r\n";
    let (call, f) = parse_attp(doc);
    assert!(call.error.is_none(), "{call:?}");
    assert!(f.warnings.contains(&"code_read_raw".to_string()), "{f:?}");
    let code = call.attp.and_then(|a| a.code).unwrap_or_default();
    assert_eq!(code, "__result__ = re.findall(r\"\\d+\", \"a1\")\r\n");
}
