use super::*;

#[test]
fn builtin_profiles_validate() {
    for name in Registry::profile_names() {
        let reg = Registry::profile(name).unwrap_or_else(|| panic!("profile {name} must build"));
        assert_eq!(reg.name(), *name);
        assert!(reg.default_tag().is_some(), "{name} needs a default tag");
    }
    assert!(Registry::profile("nope").is_none());
}

#[test]
fn filament_has_every_spec_tag_and_legacy_alias() {
    let reg = Registry::filament();
    let canon = |n: &str| reg.lookup(n.as_bytes()).map(|id| reg.tag(id).name.clone());
    for (written, want) in [
        ("thought", "thought"),
        ("THINK", "thought"),
        ("thinking", "thought"),
        ("content", "content"),
        ("variable_update", "variable_update"),
        ("UpdateVariable", "variable_update"),
        ("state_update", "variable_update"),
        ("tool_call", "tool_call"),
        ("status_bar", "status_bar"),
        ("details", "details"),
        ("choice", "choice"),
        ("xx", "choice"),
        ("ui_component", "ui_component"),
        ("media", "media"),
    ] {
        assert_eq!(canon(written).as_deref(), Some(want), "{written}");
    }
    assert_eq!(canon("span"), None);
    let lead = reg.lead().unwrap();
    let default = reg.default_tag().unwrap();
    assert_eq!(reg.tag(lead).name, "thought");
    assert_eq!(reg.tag(default).name, "content");
    assert!(reg.tag(default).mandatory && reg.tag(default).mergeable);
    let vu = reg.lookup(b"variable_update").unwrap();
    assert_eq!(reg.tag(vu).after, [default]);
}

#[test]
fn reasoning_profile_shape() {
    let reg = Registry::reasoning();
    let thought = reg.lookup(b"think").unwrap();
    assert_eq!(reg.lead(), Some(thought));
    assert_eq!(reg.tag(thought).spelling, "think");
    let content = reg.default_tag().unwrap();
    assert!(reg.tag(content).bare);
}

#[test]
fn json_and_toml_files_load_the_same() {
    let toml = r#"
        name = "mini"
        lead = "plan"
        default = "say"
        [[tag]]
        name = "plan"
        mergeable = true
        [[tag]]
        name = "say"
        mandatory = true
        [[tag]]
        name = "call"
        body = "json"
        after = ["say"]
        markers = { open = "CALL", close = "END_CALL" }
    "#;
    let json = r#"{"name":"mini","lead":"plan","default":"say","tag":[
        {"name":"plan","mergeable":true},
        {"name":"say","mandatory":true},
        {"name":"call","body":"json","after":["say"],"markers":{"open":"CALL","close":"END_CALL"}}]}"#;
    let a = Registry::from_toml_str(toml).unwrap();
    let b = Registry::from_json_str(json).unwrap();
    assert_eq!(a, b);
    assert_eq!(a.lookup_marker(b"end-call").map(|(_, r)| r), Some(MarkerRole::Close));
    assert!(a.is_marker_prefix(b"[END_C"));
}

#[test]
fn extends_adds_and_replaces() {
    let reg = Registry::from_toml_str(
        r#"
        extends = "filament"
        [[tag]]
        name = "content"
        mandatory = false
        mergeable = true
        [[tag]]
        name = "StatusBlock"
        body = "structured"
    "#,
    )
    .unwrap();
    let content = reg.lookup(b"content").unwrap();
    assert!(!reg.tag(content).mandatory);
    assert!(reg.lookup(b"statusblock").is_some());
    assert!(reg.lookup(b"UpdateVariable").is_some(), "inherited tags stay");
}

#[test]
fn broken_registries_are_clear_errors() {
    let cases = [
        ("[[tag]]\nname = \"a\"\n[[tag]]\nname = \"A\"", "used twice"),
        ("lead = \"x\"\n[[tag]]\nname = \"a\"", "lead names unknown tag"),
        ("[[tag]]\nname = \"a\"\nafter = [\"b\"]", "after names unknown tag"),
        ("[[tag]]\nname = \"1a\"", "invalid tag name"),
        ("[[tag]]\nname = \"a\"\nbody = \"yaml\"", "registry TOML is invalid"),
        ("extends = \"nope\"", "unknown profile"),
        ("[[tag]]\nname = \"a\"\ncolour = 1", "registry TOML is invalid"),
        ("this is not toml", "registry TOML is invalid"),
        ("[[tag]]\nname = \"a\"\nmarkers = { open = \"\", close = \"\" }", "special marker \"\" must be non-empty"),
        ("[[tag]]\nname = \"a\"\nmarkers = { open = \"A]|>\", close = \"B\" }", "special marker \"A]|>\" must be"),
        ("[[tag]]\nname = \"a\"\nmarkers = { open = \"M\", close = \"m\" }", "special marker \"m\" is named twice"),
        (
            "[[tag]]\nname = \"a\"\nmarkers = { open = \"GO\", close = \"END\" }\n\
             [[tag]]\nname = \"b\"\nmarkers = { open = \"GO-ON\", close = \"end\" }",
            "tag \"b\": special marker \"end\" is named twice",
        ),
        ("[[tag]]\nname = \"a\"\nchildren = [\"ok\", \"\"]", "invalid tag name \"\""),
        ("lead_prefilled = true\n[[tag]]\nname = \"a\"", "lead_prefilled = true needs a lead"),
        (
            "extends = \"filament\"\nwithout = [\"thought\"]",
            "`without` removes \"thought\", which the profile's lead names",
        ),
        (
            "extends = \"chat\"\nwithout = [\"content\"]",
            "`without` removes \"content\", which the profile's default names",
        ),
    ];
    for (text, want) in cases {
        let err = Registry::from_toml_str(text).unwrap_err().to_string();
        assert!(err.contains(want), "{text:?}: {err}");
    }
    let err = Registry::load(Path::new("/nonexistent/registry.toml")).unwrap_err();
    assert!(err.to_string().contains("cannot read registry file"), "{err}");
    // The I/O cause is the error's source, for a chain walker to find.
    let cause = std::error::Error::source(&err).and_then(|c| c.downcast_ref::<std::io::Error>());
    assert_eq!(cause.map(std::io::Error::kind), Some(std::io::ErrorKind::NotFound));
}

#[test]
fn filament_has_call_blocks_and_a_file_can_turn_them_off() {
    let reg = Registry::filament();
    assert!(reg.lookup(b"ACTION").is_some());
    assert!(reg.lookup_marker(b"REQUEST_TOOL").is_some());
    let off = Registry::from_toml_str("extends = \"filament\"\nwithout = [\"tam\", \"action\"]\n").unwrap();
    assert!(off.lookup(b"action").is_none());
    assert!(off.lookup_marker(b"REQUEST_TOOL").is_none());
    assert_eq!(off.tags().len(), reg.tags().len() - 2);
    let err = Registry::from_toml_str("extends = \"filament\"\nwithout = [\"nope\"]\n").unwrap_err();
    assert_eq!(err.to_string(), "without names unknown tag \"nope\"");
}

/// An empty `lead` or `default` clears the one a profile gives, so
/// `without` can take that tag away.
#[test]
fn an_empty_lead_or_default_clears_the_profiles() {
    let reg = Registry::from_toml_str("extends = \"filament\"\nwithout = [\"thought\"]\nlead = \"\"").unwrap();
    assert_eq!(reg.lead(), None);
    assert!(reg.lookup(b"thought").is_none());
    let reg = Registry::from_toml_str("extends = \"chat\"\ndefault = \"\"").unwrap();
    assert_eq!(reg.default_tag(), None);
    // An id this registry has no tag for is `None`, not a panic.
    let media = Registry::filament().lookup(b"media").unwrap();
    assert!(Registry::chat().get(media).is_none());
    assert_eq!(Registry::filament().get(media).map(|t| t.name.as_str()), Some("media"));
}

#[test]
fn lead_prefilled_in_files() {
    let reg = Registry::from_toml_str("extends = \"reasoning\"\nlead_prefilled = true\n").unwrap();
    assert_eq!(reg.lead_open(), LeadOpen::Template);
    assert_eq!(Registry::reasoning().lead_open(), LeadOpen::Model);
    let json = Registry::from_json_str(r#"{"extends": "reasoning", "lead_prefilled": true}"#).unwrap();
    assert_eq!(json.lead_open(), LeadOpen::Template);
    assert_eq!(Registry::profile("reasoning-prefilled").unwrap().lead_open(), LeadOpen::Template);
}

/// Every name and alias of every profile is found in any case, by the
/// index of names by length; other names of those lengths, and names longer
/// than any, are not.
#[test]
fn lookup_finds_every_name_and_alias_in_any_case() {
    for profile in Registry::profile_names() {
        let reg = Registry::profile(profile).unwrap_or_else(|| panic!("profile {profile}"));
        let mut longest = 0;
        for (i, spec) in reg.tags().iter().enumerate() {
            for n in std::iter::once(&spec.name).chain(&spec.aliases) {
                longest = longest.max(n.len());
                for written in [n.clone(), n.to_ascii_uppercase(), n.to_ascii_lowercase()] {
                    let found = reg.lookup(written.as_bytes()).map(|id| reg.tag(id).name.clone());
                    assert_eq!(found.as_deref(), Some(reg.tags()[i].name.as_str()), "{profile}: {written}");
                }
                let other = format!("{}~", &n[..n.len() - 1]);
                assert_eq!(reg.lookup(other.as_bytes()), None, "{profile}: {other}");
            }
        }
        assert_eq!(reg.lookup("x".repeat(longest + 1).as_bytes()), None);
        assert_eq!(reg.lookup(b""), None);
    }
}
