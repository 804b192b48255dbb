//! The prompt side (spec 003 §2): every row of the §2.3.4 migration
//! tables, `spindle prompt render|migrate|import|registry` run as a user
//! would, hostile templates, broken cards, and a `<use_protocol>` registry
//! under which the matching answer parses without `missing_mandatory`.

use base64::Engine as _;
use serde_json::{Value, json};
use spindle::prompt::{NoteKind, migrate};
use std::path::{Path, PathBuf};
use std::process::Command;

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/prompt").join(name)
}

fn spindle(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_spindle")).args(args).output().expect("runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Every row of every table of spec 003 §2.3.4, with the Jinja2 it
/// becomes.
const ROWS: &[(&str, &str)] = &[
    // Basic.
    ("{{user}}", "{{ user }}"),
    ("<USER>", "{{ user }}"),
    ("{{char}}", "{{ char }}"),
    ("<BOT>", "{{ char }}"),
    ("<CHAR>", "{{ char }}"),
    ("{{getvar::x}}", "{{ state.x }}"),
    ("{{setvar::x::y}}", "{% set x = 'y' %}"),
    ("{{#if x}}a{{/if}}", "{% if state.x %}a{% endif %}"),
    ("{{random:a,b}}", "{{ random(['a', 'b']) }}"),
    ("{{// comment}}", "{# comment #}"),
    // Core/identity.
    ("{{group}}", "{{ group }}"),
    ("{{groupNotMuted}}", "{{ group | filter_not_muted }}"),
    ("{{notChar}}", "{{ not_char }}"),
    ("{{description}}", "{{ char.description }}"),
    ("{{personality}}", "{{ char.personality }}"),
    ("{{persona}}", "{{ user.persona }}"),
    ("{{scenario}}", "{{ char.scenario }}"),
    ("{{charVersion}}", "{{ char.version }}"),
    ("{{charPrompt}}", "{{ char.main_prompt }}"),
    ("{{charJailbreak}}", "{{ char.jailbreak }}"),
    ("{{charDepthPrompt}}", "{{ char.depth_prompt }}"),
    ("{{creatorNotes}}", "{{ char.creator_notes }}"),
    ("{{model}}", "{{ config.model }}"),
    ("{{mesExamples}}", "{{ char.examples | format_examples }}"),
    ("{{mesExamplesRaw}}", "{{ char.examples_raw }}"),
    // Message/conversation.
    ("{{lastMessage}}", "{{ history[-1].content }}"),
    ("{{lastMessageId}}", "{{ history[-1].id }}"),
    ("{{lastUserMessage}}", "{{ history | selectattr('role', 'eq', 'user') | map(attribute='content') | last }}"),
    ("{{lastCharMessage}}", "{{ history | selectattr('role', 'eq', 'assistant') | map(attribute='content') | last }}"),
    ("{{firstIncludedMessageId}}", "{{ context[0].id }}"),
    ("{{firstDisplayedMessageId}}", "{{ display_context[0].id }}"),
    ("{{lastSwipeId}}", "{{ history[-1].swipe_count }}"),
    ("{{currentSwipeId}}", "{{ history[-1].current_swipe }}"),
    ("{{lastGenerationType}}", "{{ last_generation.type }}"),
    ("{{input}}", "{{ user_input }}"),
    // Time/date.
    ("{{time}}", "{{ now | time_format('LT') }}"),
    ("{{date}}", "{{ now | date_format('LL') }}"),
    ("{{weekday}}", "{{ now | date_format('dddd') }}"),
    ("{{isotime}}", "{{ now | time_format('HH:mm') }}"),
    ("{{isodate}}", "{{ now | date_format('YYYY-MM-DD') }}"),
    ("{{datetimeformat DD.MM.YYYY}}", "{{ now | date_format('DD.MM.YYYY') }}"),
    ("{{time_UTC+2}}", "{{ now | utc_offset(2) | time_format }}"),
    ("{{time_UTC-5}}", "{{ now | utc_offset(-5) | time_format }}"),
    ("{{idle_duration}}", "{{ idle_duration }}"),
    (
        "{{timeDiff::2026-11-24T10:00:00Z::2026-11-24T12:00:00Z}}",
        "{{ time_diff('2026-11-24T10:00:00Z', '2026-11-24T12:00:00Z') }}",
    ),
    // Variables/logic.
    ("{{getvar::name}}", "{{ state.name }}"),
    ("{{setvar::name::value}}", "{% set name = 'value' %}"),
    ("{{addvar::name::5}}", "{% set name = addvar(state.name, 5) %}"),
    ("{{incvar::name}}", "{% set name = addvar(state.name, 1) %}"),
    ("{{decvar::name}}", "{% set name = addvar(state.name, -1) %}"),
    ("{{getglobalvar::name}}", "{{ global_state.name }}"),
    ("{{setglobalvar::name::value}}", "{% set_global name = 'value' %}"),
    ("{{addglobalvar::name::2}}", "{% set_global name = addvar(global_state.name, 2) %}"),
    ("{{incglobalvar::name}}", "{% set_global name = addvar(global_state.name, 1) %}"),
    ("{{decglobalvar::name}}", "{% set_global name = addvar(global_state.name, -1) %}"),
    ("{{var_name}}", "{{ state.var_name }}"),
    // Formatting/utility.
    ("{{newline}}", "{{ '\\n' }}"),
    ("{{trim}}", "{{ content | trim }}"),
    ("{{noop}}", "{# no-op #}"),
    ("{{random:arg1,arg2}}", "{{ random(['arg1', 'arg2']) }}"),
    ("{{random::arg1::arg2}}", "{{ random(['arg1', 'arg2']) }}"),
    ("{{pick::arg1::arg2}}", "{{ pick(['arg1', 'arg2']) }}"),
    ("{{roll:2d6}}", "{{ roll('2d6') }}"),
    ("{{reverse:abc}}", "{{ 'abc' | reverse }}"),
    ("{{banned \"word\"}}", "{# banned \"word\" (safety filter) #}"),
    ("{{isMobile}}", "{{ is_mobile }}"),
    // Extension/system.
    ("{{outlet::lore}}", "{{ outlet('lore') }}"),
    ("{{maxPrompt}}", "{{ config.max_context }}"),
    ("{{pipe}}", "{{ pipe_result }}"),
    ("{{anchorBefore}}", "{{ anchor_before }}"),
    ("{{anchorAfter}}", "{{ anchor_after }}"),
    ("{{wiBefore}}", "{{ lore_before }}"),
    ("{{loreBefore}}", "{{ lore_before }}"),
    ("{{wiAfter}}", "{{ lore_after }}"),
    ("{{loreAfter}}", "{{ lore_after }}"),
    // Instruct/context template.
    ("{{system}}", "{{ system_prompt }}"),
    ("{{instructSystemPrompt}}", "{{ instruct.system_prompt }}"),
    ("{{instructUserPrefix}}", "{{ instruct.user_prefix }}"),
    ("{{instructUserSuffix}}", "{{ instruct.user_suffix }}"),
    ("{{instructAssistantPrefix}}", "{{ instruct.assistant_prefix }}"),
    ("{{instructAssistantSuffix}}", "{{ instruct.assistant_suffix }}"),
    // Tavern-Helper.
    ("{{get_message_variable::a.b}}", "{{ state.message.a.b }}"),
    ("{{get_chat_variable::a.b}}", "{{ state.chat.a.b }}"),
    ("{{get_character_variable::a}}", "{{ state.character.a }}"),
    ("{{get_preset_variable::a}}", "{{ state.preset.a }}"),
    ("{{get_global_variable::a}}", "{{ state.global.a }}"),
    ("{{format_message_variable::a}}", "{{ state.message.a | to_yaml }}"),
    ("{{format_chat_variable::a}}", "{{ state.chat.a | to_yaml }}"),
    ("{{format_character_variable::a}}", "{{ state.character.a | to_yaml }}"),
    ("{{format_preset_variable::a}}", "{{ state.preset.a | to_yaml }}"),
    ("{{format_global_variable::a}}", "{{ state.global.a | to_yaml }}"),
    ("{{userAvatar}}", "{{ user.avatar_path }}"),
];

#[test]
fn every_row_of_the_migration_tables() {
    let mut count = 0;
    for (st, want) in ROWS {
        let m = migrate(st);
        assert_eq!(m.text, *want, "{st}");
        assert!(!m.notes.is_empty(), "{st}: reported");
        assert!(m.notes.iter().all(|n| n.kind != NoteKind::Unsupported), "{st}: {:?}", m.notes);
        count += 1;
    }
    assert!(count >= 90, "{count} rows");
    // Every converted row renders in the sandbox (a global write is
    // handed to the host).
    let r = spindle::prompt::Renderer::new();
    for (st, want) in ROWS {
        let ctx = json!({"history": [{"role": "user", "content": "hi", "id": 1}], "content": " x ", "context": [{"id": 0}], "display_context": [{"id": 0}]});
        assert!(
            r.render(want, &ctx, &json!({"x": 1, "name": 2})).is_ok(),
            "{st} -> {want}: {:?}",
            r.render(want, &ctx, &json!({}))
        );
    }
}

#[test]
fn render_is_reproducible_with_a_seed_and_a_fixed_time() {
    let args = |seed: &str| {
        spindle(&[
            "prompt",
            "render",
            data("scene.j2").to_str().unwrap(),
            "--vars",
            data("vars.yaml").to_str().unwrap(),
            "--state",
            data("state.json").to_str().unwrap(),
            "--seed",
            seed,
            "--now",
            "2026-11-24T21:05:00+01:00",
        ])
    };
    let (code, out, err) = args("7");
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("narrator: Seraphina\n"), "{out}");
    assert!(out.contains("time: 2026-11-24 21:05\n"), "{out}");
    assert!(out.contains("Seraphina looks at Ann. HP 7/20.\nSeraphina is worried."), "{out}");
    assert_eq!(args("7").1, out, "same seed, same render");
}

/// `--now` takes an RFC 3339 time or a bare date (midnight UTC); anything
/// else is an error that says what it wants, with an example.
#[test]
fn now_takes_a_time_or_a_date_and_says_what_it_wants() {
    let tmp = tempfile::Builder::new().prefix("spindle-prompt-now-").tempdir().unwrap();
    let t = tmp.path().join("r.j2");
    std::fs::write(&t, "{{ now }}").unwrap();
    let render = |now: &str| spindle(&["prompt", "render", t.to_str().unwrap(), "--now", now]);
    let (code, midnight, err) = render("2025-01-01T00:00:00Z");
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(render("2025-01-01"), (Some(0), midnight, String::new()));
    for bad in ["2025-01-01 09:30", "2025-02-30", "2025-1-1", "tomorrow", "2025-01-01T25:00:00Z"] {
        let (code, out, err) = render(bad);
        assert_eq!((code, out.as_str()), (Some(2), ""), "{bad}");
        assert!(
            err.starts_with(&format!("spindle: error: --now {bad:?}: expected an RFC 3339 time"))
                && err.contains("2025-01-01T00:00:00Z"),
            "{bad}: {err}"
        );
    }
}

/// Variables read as a prompt means them: `NO` (a country code) and `yes`
/// stay text; a key written twice is an error, not a silent overwrite.
#[test]
fn vars_yaml_keeps_words_as_written() {
    let tmp = tempfile::Builder::new().prefix("spindle-prompt-").tempdir().unwrap();
    let (t, vars, twice) = (tmp.path().join("t.j2"), tmp.path().join("v.yaml"), tmp.path().join("w.yaml"));
    std::fs::write(&t, "{{ user }} from {{ country }} says {{ answer }} ({{ code }})").unwrap();
    std::fs::write(&vars, "user: Ann\ncountry: NO\nanswer: yes\ncode: 007\n").unwrap();
    std::fs::write(&twice, "user: Ann\nuser: Bo\n").unwrap();
    let (code, out, err) = spindle(&["prompt", "render", t.to_str().unwrap(), "--vars", vars.to_str().unwrap()]);
    assert_eq!((code, out.as_str()), (Some(0), "Ann from NO says yes (007)"), "{err}");
    let (code, _, err) = spindle(&["prompt", "render", t.to_str().unwrap(), "--vars", twice.to_str().unwrap()]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("duplicate mapping key: user") && !err.contains("DuplicateKeyPolicy"), "{err}");
}

#[test]
fn hostile_templates_end_with_a_clear_error() {
    let tmp = tempfile::Builder::new().prefix("spindle-prompt-").tempdir().unwrap();
    let dir = tmp.path();
    // A value joined with itself 40 times (10 TB at the end): fuel pays for
    // the bytes created, so it ends with the limit long before.
    let grow = format!("{{% set a = 'xxxxxxxxxx' %}}{}{{{{ a | length }}}}", "{% set a = a ~ a %}".repeat(40));
    for (name, t, want) in [
        ("grow.j2", grow.as_str(), "fuel"),
        ("loop.j2", "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}", "limit"),
        ("rec.j2", "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "limit"),
        ("big.j2", "{% for a in range(100000) %}{{ 'x' * 1000 }}{% endfor %}", "limit"),
        ("write.j2", "{% set state.hp = 0 %}", "sandbox"),
        ("file.j2", "{% include '/etc/passwd' %}", "sandbox"),
    ] {
        let path = dir.join(name);
        std::fs::write(&path, t).unwrap();
        let t0 = std::time::Instant::now();
        let (code, _, err) = spindle(&["prompt", "render", path.to_str().unwrap(), "--max-output", "100000"]);
        assert_eq!(code, Some(2), "{name}: {err}");
        assert!(err.starts_with("spindle: error: ") && err.contains(want), "{name}: {err}");
        assert!(t0.elapsed() < std::time::Duration::from_secs(20), "{name} stopped in time");
    }
}

#[test]
fn migrate_a_preset_with_a_line_numbered_report() {
    let (code, out, err) = spindle(&["prompt", "migrate", data("st-preset.txt").to_str().unwrap()]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("You are {{ char }}, talking with {{ user }} ({{ user }}, {{ char }})."), "{out}");
    assert!(out.contains("{% set mood %}wary\nand tired{% endset %}"), "{out}");
    assert!(out.contains("Mood: {{ mood }}. Gold: {{ state.gold }}."), "{out}");
    assert!(out.contains("{% raw %}{{frobnicate::x}}{% endraw %}"), "unknown macro kept visibly: {out}");
    assert!(
        err.contains("line 7: {{frobnicate::x}} -> {% raw %}{{frobnicate::x}}{% endraw %} [no equivalent, kept]"),
        "{err}"
    );
    assert!(err.contains("line 3: {{setvar::mood::wary\\nand tired}}"), "{err}");
    let summary = err.lines().last().unwrap_or_default();
    assert!(summary.ends_with("1 without equivalent"), "{summary}");
    // The migrated text renders.
    let r = spindle::prompt::Renderer::new().render(
        &out,
        &json!({"user": "Ann", "char": "Sera"}),
        &json!({"gold": 5, "trusted": true}),
    );
    let r = r.unwrap();
    assert!(r.contains("Sera trusts you.") && r.contains("Mood: wary\nand tired. Gold: 5."), "{r}");
}

fn png_card(chunks: &[(&str, String)]) -> Vec<u8> {
    let mut out = Vec::new();
    {
        let mut enc = png::Encoder::new(&mut out, 1, 1);
        enc.set_color(png::ColorType::Grayscale);
        enc.set_depth(png::BitDepth::Eight);
        for (k, v) in chunks {
            enc.add_text_chunk((*k).to_string(), v.clone()).unwrap();
        }
        let mut w = enc.write_header().unwrap();
        w.write_image_data(&[0]).unwrap();
    }
    out
}

#[test]
fn import_cards_and_world_info() {
    let tmp = tempfile::Builder::new().prefix("spindle-prompt-import-").tempdir().unwrap();
    let dir = tmp.path();
    let v3 = json!({"spec": "chara_card_v3", "spec_version": "3.0", "data": {
        "name": "Seraphina", "description": "Guardian of {{user}}.", "first_mes": "*She bows.*",
        "character_book": {"entries": [{"keys": ["forest"], "comment": "location_forest",
            "content": "name: Dark Forest\ncreatures:\n    - Shadow Wolves\n"}]}}});
    let b64 = base64::engine::general_purpose::STANDARD.encode(v3.to_string());
    let png = dir.join("card.png");
    std::fs::write(&png, png_card(&[("ccv3", b64)])).unwrap();
    let (code, out, err) = spindle(&["prompt", "import", png.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.starts_with("<character_card>\nname: Seraphina\ndescription: Guardian of {{user}}.\nfirst_message: \"*She bows.*\"\n</character_card>"), "{out}");
    assert!(
        out.contains("<location_forest>\n  name: Dark Forest\n  creatures:\n    - Shadow Wolves\n</location_forest>"),
        "{out}"
    );
    assert!(err.contains("macro"), "{err}");
    // Broken PNGs.
    let none = dir.join("none.png");
    std::fs::write(&none, png_card(&[("Software", "paint".into())])).unwrap();
    let (code, _, err) = spindle(&["prompt", "import", none.to_str().unwrap()]);
    assert_eq!(
        (code, err.trim()),
        (
            Some(2),
            format!(
                "spindle: error: {}: the PNG has no character card (no `chara` or `ccv3` text chunk)",
                none.display()
            )
            .as_str()
        )
    );
    let bad = dir.join("bad.png");
    std::fs::write(&bad, png_card(&[("chara", "!!!".into())])).unwrap();
    let (code, _, err) = spindle(&["prompt", "import", bad.to_str().unwrap()]);
    assert!(code == Some(2) && err.contains("corrupt"), "{err}");
    // World info, with a malformed entry reported.
    let world = dir.join("world.json");
    std::fs::write(
        &world,
        json!({"entries": {"0": {"key": ["inn"], "comment": "inn", "content": "{\"beds\": 3"}}}).to_string(),
    )
    .unwrap();
    let (code, out, err) = spindle(&["prompt", "import", world.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("<inn>\n  {\"beds\": 3\n</inn>") && err.contains("invalid JSON"), "{out}\n{err}");
    // migrate on a card converts its text fields.
    let (code, out, _) = spindle(&["prompt", "migrate", png.to_str().unwrap(), "--report", "json"]);
    assert_eq!(code, Some(0));
    let card: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(card["data"]["description"], "Guardian of {{ user }}.");
}

/// `prompt import` counts the macros `prompt migrate` would convert: none
/// in a card already migrated (Jinja2 `{{ user }}` is no macro left to
/// convert), each `{{user}}` and `<BOT>` in one that is not, and none
/// it would keep as written (`{{frobnicate::x}}`).
#[test]
fn import_counts_only_macros_left_to_migrate() {
    let tmp = tempfile::Builder::new().prefix("spindle-prompt-count-").tempdir().unwrap();
    let dir = tmp.path();
    let original = dir.join("card.json");
    std::fs::write(
        &original,
        json!({"spec": "chara_card_v2", "spec_version": "2.0", "data": {"name": "Sera",
            "description": "Guard of {{user}}, friend of <BOT>.", "first_mes": "Hi, {{user}}. {{ user }} again.",
            "alternate_greetings": ["{{char}} waves.", "{{frobnicate::x}}"]}})
        .to_string(),
    )
    .unwrap();
    let (code, _, err) = spindle(&["prompt", "import", original.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("note: 4 SillyTavern macro(s) left in the card text"), "{err}");
    let (code, migrated, err) = spindle(&["prompt", "migrate", original.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{err}");
    let migrated_card = dir.join("migrated.json");
    std::fs::write(&migrated_card, &migrated).unwrap();
    let (code, out, err) = spindle(&["prompt", "import", migrated_card.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("description: Guard of {{ user }}, friend of {{ char }}."), "{out}");
    assert!(!err.contains("macro"), "{err}");
}

/// `prompt migrate` reads text as `prompt render` and `prompt registry`
/// do: a file that is not UTF-8 (Latin-1, a binary) is refused with the
/// same error, never migrated with its bytes replaced.
#[test]
fn migrate_refuses_text_that_is_not_utf8() {
    let tmp = tempfile::Builder::new().prefix("spindle-prompt-utf8-").tempdir().unwrap();
    let dir = tmp.path();
    let latin1 = dir.join("latin1.txt");
    std::fs::write(&latin1, b"Caf\xe9 {{user}}\n").unwrap();
    let binary = dir.join("blob.bin");
    std::fs::write(&binary, [0x7f, b'E', b'L', b'F', 2, 1, 1, 0, 0xff, 0xfe, 0x00, 0x80]).unwrap();
    for path in [&latin1, &binary] {
        let p = path.to_str().unwrap();
        let (code, out, err) = spindle(&["prompt", "migrate", p]);
        assert_eq!((code, out.as_str()), (Some(2), ""), "{p}: {err}");
        let want = format!("spindle: error: {p} is not UTF-8 text");
        assert!(err.starts_with(&want), "{err}");
        for other in ["render", "registry"] {
            let (code, _, other_err) = spindle(&["prompt", other, p]);
            assert_eq!((code, other_err.as_str()), (Some(2), err.as_str()), "{other} {p}");
        }
    }
}

/// `prompt migrate` on a card writes the card back in its own shape: a V2
/// card keeps its `spec`, `spec_version` and unknown keys around `data`
/// (JSON or PNG), a V1 card stays flat; only the text fields change.
#[test]
fn migrate_keeps_the_card_shape() {
    let tmp = tempfile::Builder::new().prefix("spindle-prompt-shape-").tempdir().unwrap();
    let dir = tmp.path();
    let v2 = json!({"spec": "chara_card_v2", "spec_version": "2.0", "x_host": {"kept": true}, "data": {
        "name": "Sera", "description": "Guard of {{user}}.", "first_mes": "Hi, {{user}}.",
        "extensions": {"depth": 4},
        "character_book": {"name": "book", "entries": [{"keys": ["inn"], "content": "{{char}}'s inn"}]}}});
    let mut want = v2.clone();
    want["data"]["description"] = json!("Guard of {{ user }}.");
    want["data"]["first_mes"] = json!("Hi, {{ user }}.");
    want["data"]["character_book"]["entries"][0]["content"] = json!("{{ char }}'s inn");
    let json_card = dir.join("card.json");
    std::fs::write(&json_card, v2.to_string()).unwrap();
    let png = dir.join("card.png");
    let b64 = base64::engine::general_purpose::STANDARD.encode(v2.to_string());
    std::fs::write(&png, png_card(&[("chara", b64)])).unwrap();
    for path in [&json_card, &png] {
        let (code, out, err) = spindle(&["prompt", "migrate", path.to_str().unwrap(), "--report", "json"]);
        assert_eq!(code, Some(0), "{}: {err}", path.display());
        let card: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(card, want, "{}", path.display());
        let report: Value = serde_json::from_str(&err).unwrap();
        let fields: Vec<&str> = report.as_array().unwrap().iter().filter_map(|n| n["field"].as_str()).collect();
        assert_eq!(fields, ["description", "first_mes", "character_book.entries[0].content"], "{err}");
    }
    // A V1 card stays V1: no wrapper is added.
    let v1 = dir.join("v1.json");
    std::fs::write(&v1, json!({"name": "Bo", "description": "{{char}} bakes.", "talkativeness": "0.5"}).to_string())
        .unwrap();
    let (code, out, err) = spindle(&["prompt", "migrate", v1.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{err}");
    let card: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(card, json!({"name": "Bo", "description": "{{ char }} bakes.", "talkativeness": "0.5"}));
}

/// World-book normalisation keeps an entry's text in the order written:
/// an opening line before `key: value` lines stays first.
#[test]
fn import_keeps_entry_text_in_order() {
    let tmp = tempfile::Builder::new().prefix("spindle-prompt-order-").tempdir().unwrap();
    let wi = tmp.path().join("wi.json");
    std::fs::write(
        &wi,
        json!({"entries": {"0": {"key": ["inn"], "comment": "inn", "content": "The Snow Inn.\nkeeper: Old Bo\nrooms: 3"},
            "1": {"key": ["hall"], "comment": "hall", "content": "A hall.\nkeeper: Ida\nIt is cold."}}})
        .to_string(),
    )
    .unwrap();
    let (code, out, err) = spindle(&["prompt", "import", wi.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("<inn>\n  text: The Snow Inn.\n  keeper: Old Bo\n  rooms: \"3\"\n</inn>"), "{out}");
    // Prose after the keys joins the text above them, and the move is said.
    assert!(out.contains("<hall>\n  text:\n    - A hall.\n    - It is cold.\n  keeper: Ida\n</hall>"), "{out}");
    assert!(err.contains("entry \"hall\", line 3: text after other keys: joins the `text` above them"), "{err}");
}

#[test]
fn use_protocol_builds_the_registry_the_answer_needs() {
    let (code, toml, err) = spindle(&["prompt", "registry", data("scene.j2").to_str().unwrap()]);
    assert_eq!(code, Some(0), "{err}");
    assert!(toml.contains("extends = \"filament\""), "{toml}");
    let tmp = tempfile::Builder::new().prefix("spindle-prompt-reg-").tempdir().unwrap();
    let dir = tmp.path();
    let reg = dir.join("expected.toml");
    std::fs::write(&reg, &toml).unwrap();
    let (code, out, err) = spindle(&[
        "parse",
        data("answer.txt").to_str().unwrap(),
        "--registry",
        reg.to_str().unwrap(),
        "--format",
        "jsonl",
    ]);
    assert_eq!(code, Some(0), "{err}");
    let events: Vec<Value> = out.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    let tags: Vec<&str> = events.iter().filter(|e| e["type"] == "element").filter_map(|e| e["tag"].as_str()).collect();
    assert_eq!(tags, ["thought", "content", "variable_update", "status_bar"]);
    assert!(!out.contains("missing_mandatory"), "{out}");
    // An unknown protocol is reported, not fatal.
    let p = dir.join("p.txt");
    std::fs::write(&p, "<use_protocol>sparkles</use_protocol>").unwrap();
    let (code, _, err) = spindle(&["prompt", "registry", p.to_str().unwrap()]);
    assert_eq!(code, Some(0));
    assert!(err.contains("unknown protocol \"sparkles\""), "{err}");
}

/// A template whose single steps grow without bound (a list doubled in a
/// loop: few instructions, so fuel does not stop it) ends at --max-time
/// with one error line.
#[test]
fn a_render_that_runs_away_ends_at_max_time() {
    let dir = std::env::temp_dir().join(format!("spindle-prompt-runaway-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let template = dir.join("doubling.j2");
    std::fs::write(
        &template,
        "{% set ns = namespace(l=[1]) %}{% for i in range(60) %}{% set ns.l = ns.l + ns.l %}{% endfor %}{{ ns.l|length }}",
    )
    .expect("write");
    let (code, out, err) = spindle(&["prompt", "render", template.to_str().unwrap_or_default(), "--max-time", "1"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(out.is_empty() && err.contains("still rendering after 1 s (RenderLimits::max_time)"), "{err}");
    let (code, _, err) = spindle(&["prompt", "render", template.to_str().unwrap_or_default(), "--max-time", "0"]);
    assert_eq!(code, Some(2), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `{{setglobalvar}}` and its kin migrate to `{% set_global %}`, which
/// renders: it prints nothing, writes no state, hands the write to the
/// host, and the rest of the render reads it back. Comments, raw blocks
/// and strings that spell the statement are left alone.
#[test]
fn set_global_hands_its_write_to_the_host() {
    let r = spindle::prompt::Renderer::new();
    let m = spindle::prompt::migrate(
        "{{setglobalvar::met::yes}}Hi {{user}}, {{getglobalvar::met}}.{{incglobalvar::visits}}{{getglobalvar::visits}}",
    );
    let vars = json!({"user": "Ann", "global_state": {"visits": 4}});
    let out = r.render_full(&m.text, &vars, &json!({})).unwrap_or_else(|e| panic!("{}: {e}", m.text));
    assert_eq!(out.text, "Hi Ann, yes.5");
    let writes: Vec<(String, serde_json::Value)> =
        out.global_writes.iter().map(|w| (w.name.clone(), w.value.clone())).collect();
    assert_eq!(writes, [("met".to_string(), json!("yes")), ("visits".to_string(), json!(5))]);
    // `render` gives the same text.
    assert_eq!(r.render(&m.text, &vars, &json!({})).unwrap(), "Hi Ann, yes.5");
    // Whitespace control, a string holding `%}`, a dotted name.
    let out = r.render_full("a  {%- set_global quest.stage = 'x %} y' -%}  b", &json!({}), &json!({})).unwrap();
    assert_eq!(out.text, "ab");
    assert_eq!(out.global_writes[0].name, "quest.stage");
    assert_eq!(out.global_writes[0].value, json!("x %} y"));
    // Spelled in a comment, a raw block or a string: text, not a write.
    let t = "{# {% set_global a = 1 %} #}{% raw %}{% set_global b = 2 %}{% endraw %}{{ '{% set_global c = 3 %}' }}";
    let out = r.render_full(t, &json!({}), &json!({})).unwrap();
    assert_eq!(out.text, "{% set_global b = 2 %}{% set_global c = 3 %}");
    assert!(out.global_writes.is_empty());
    // A set_global that is no assignment is a template error, not a panic.
    assert!(r.render("{% set_global %}", &json!({}), &json!({})).is_err());
    assert!(r.render("{% set_global 1x = 2 %}", &json!({}), &json!({})).is_err());
    assert!(r.render("{% set_global a = ", &json!({}), &json!({})).is_err());
}

/// The spec's function whitelist (003 §2.3.3: `random`, `time`,
/// `format`): all three are functions.
#[test]
fn time_and_format_are_functions() {
    let now = chrono::DateTime::parse_from_rfc3339("2026-11-24T21:05:00+00:00").unwrap();
    let r = spindle::prompt::Renderer::new().with_now(now);
    let out = r.render(
        "{{ time() }} | {{ time('YYYY-MM-DD') }} | {{ format('%s has %d HP', 'Ann', 7) }}",
        &json!({}),
        &json!({}),
    );
    assert_eq!(out.unwrap(), "9:05 PM | 2026-11-24 | Ann has 7 HP");
}

/// `spindle prompt render --card`: a card's fields under the names the
/// migrated macros read (spec 003 §2.3.4's `char.*`), so a migrated
/// template prints them instead of nothing.
#[test]
fn render_with_a_card_fills_the_migrated_char_names() {
    let dir = tempfile::tempdir().unwrap();
    let card = json!({"spec": "chara_card_v2", "spec_version": "2.0", "data": {
        "name": "Seraphina", "description": "A forest guardian.", "personality": "kind",
        "scenario": "A glade.", "first_mes": "Hello.", "mes_example": "<START>\n{{char}}: Hi.",
        "system_prompt": "Stay in character.", "post_history_instructions": "Be brief.",
        "character_version": "1.2", "extensions": {"depth_prompt": {"prompt": "Remember the glade.", "depth": 4}}}});
    let card_path = dir.path().join("card.json");
    std::fs::write(&card_path, card.to_string()).unwrap();
    let st = "{{charPrompt}}|{{charJailbreak}}|{{charDepthPrompt}}|{{charVersion}}|{{mesExamplesRaw}}|{{description}}|{{char}}";
    let template = spindle::prompt::migrate(st).text;
    let template_path = dir.path().join("t.j2");
    std::fs::write(&template_path, &template).unwrap();
    let (code, out, err) =
        spindle(&["prompt", "render", template_path.to_str().unwrap(), "--card", card_path.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        out,
        "Stay in character.|Be brief.|Remember the glade.|1.2|<START>\n{{char}}: Hi.|A forest guardian.|Seraphina"
    );
    // World info is no card.
    let wi = dir.path().join("wi.json");
    std::fs::write(&wi, json!({"entries": {"0": {"key": ["a"], "content": "x"}}}).to_string()).unwrap();
    let (code, _, err) =
        spindle(&["prompt", "render", template_path.to_str().unwrap(), "--card", wi.to_str().unwrap()]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("not a character card"), "{err}");
}
