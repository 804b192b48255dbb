//! The command line's habits: profile names from the library's list in
//! `--help`, examples, defaults, environment twins, completions, the man
//! page and the version line.

use spindle::Registry;
use std::process::Command;

fn spindle(args: &[&str], env: &[(&str, &str)]) -> (bool, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_spindle"));
    cmd.args(args);
    for var in [
        "SPINDLE_UPSTREAM",
        "SPINDLE_LISTEN",
        "SPINDLE_CONFIG",
        "SPINDLE_PROFILE",
        "SPINDLE_LOG",
        "SPINDLE_ALLOWED_HOST",
        "SPINDLE_ALLOW_ORIGIN",
    ] {
        cmd.env_remove(var);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn help_lists_every_built_in_profile_and_shows_examples() {
    for sub in ["parse", "replay", "proxy", "demo"] {
        let (ok, help, _) = spindle(&[sub, "--help"], &[]);
        assert!(ok, "{sub}");
        let listed: Vec<&str> = help
            .split("[possible values: ")
            .nth(1)
            .and_then(|s| s.split(']').next())
            .map(|s| s.split(", ").collect())
            .unwrap_or_default();
        for name in Registry::profile_names() {
            assert!(listed.contains(name), "{sub}: {name} not in {listed:?}");
        }
    }
    for sub in ["parse", "replay", "proxy", "mock-upstream", "tools", "agent"] {
        let (_, help, _) = spindle(&[sub, "--help"], &[]);
        assert!(help.contains("Examples:\n  spindle "), "{sub}:\n{help}");
    }
    let (_, help, _) = spindle(&["parse", "--help"], &[]);
    assert!(help.contains("[default: 4194304]") && help.contains("[default: 4096]"), "{help}");
    let (ok, _, err) = spindle(&["parse", "--profile", "nope", "x"], &[]);
    assert!(!ok && err.contains("[possible values: filament,"), "{err}");
}

#[test]
fn every_default_the_proxy_help_states_is_the_real_one() {
    let (_, help, _) = spindle(&["proxy", "--help"], &[]);
    let (ok, config, err) = spindle(&["proxy", "--upstream", "http://127.0.0.1:9", "--print-config"], &[]);
    assert!(ok, "{err}");
    for (flag, key) in [
        ("--max-line", "max_line"),
        ("--max-request-body", "max_request_body"),
        ("--max-response-body", "max_response_body"),
        ("--max-streams", "max_streams"),
        ("--sink-queue", "queue"),
        ("--listen", "listen"),
        ("--max-connections", "max_connections"),
        ("--max-request-buffer", "max_request_buffer"),
        ("--max-ws-message", "max_ws_message"),
    ] {
        let section = help.split(&format!("      {flag} ")).nth(1).unwrap_or_default();
        let stated = section.split("[default: ").nth(1).and_then(|s| s.split(']').next()).unwrap_or("missing");
        let real = config
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{key} = ")))
            .map(|v| v.trim_matches('"').to_string())
            .unwrap_or_default();
        assert_eq!(stated, real, "{flag}");
    }
}

#[test]
fn proxy_flags_have_environment_twins_and_flags_win() {
    let env = [("SPINDLE_UPSTREAM", "http://127.0.0.1:9"), ("SPINDLE_LISTEN", "127.0.0.1:9999")];
    let (ok, config, err) = spindle(&["proxy", "--print-config"], &env);
    assert!(ok, "{err}");
    assert!(
        config.contains("url = \"http://127.0.0.1:9\"") && config.contains("listen = \"127.0.0.1:9999\""),
        "{config}"
    );
    let (_, config, _) = spindle(&["proxy", "--print-config", "--listen", "127.0.0.1:1"], &env);
    assert!(config.contains("listen = \"127.0.0.1:1\""), "{config}");
    let (_, config, _) =
        spindle(&["proxy", "--print-config"], &[("SPINDLE_UPSTREAM", "http://x"), ("SPINDLE_PROFILE", "tam")]);
    assert!(config.contains("profile = \"tam\""), "{config}");
    // The access lists: space-separated in the environment, flags win.
    let env = [
        ("SPINDLE_UPSTREAM", "http://x"),
        ("SPINDLE_ALLOWED_HOST", "proxy.lan gpu-box"),
        ("SPINDLE_ALLOW_ORIGIN", "https://app.example"),
    ];
    let (ok, config, err) = spindle(&["proxy", "--print-config"], &env);
    assert!(ok, "{err}");
    assert!(config.contains("allowed_hosts = [\n    \"proxy.lan\",\n    \"gpu-box\",\n]"), "{config}");
    assert!(config.contains("allow_origins = [\"https://app.example\"]"), "{config}");
    let (_, config, _) = spindle(&["proxy", "--print-config", "--allowed-host", "other.lan"], &env);
    assert!(config.contains("allowed_hosts = [\"other.lan\"]"), "{config}");
    let (ok, _, err) = spindle(&["proxy", "--print-config", "--allow-origin", "app.example"], &env);
    assert!(!ok && err.contains("--allow-origin: \"app.example\" is not a browser origin"), "{err}");
}

#[test]
fn completions_and_man_page() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let (ok, script, err) = spindle(&["completions", shell], &[]);
        assert!(ok, "{shell}: {err}");
        for word in ["replay", "proxy", "mock-upstream", "--tool-protocol"] {
            assert!(script.contains(word), "{shell}: {word}");
        }
    }
    let (ok, script, _) = spindle(&["completions", "bash"], &[]);
    assert!(ok && script.contains("reasoning-prefilled"), "profile names complete");
    let (ok, man, _) = spindle(&["man"], &[]);
    assert!(ok && man.contains(".TH spindle"), "{}", &man[..man.len().min(200)]);
    assert!(man.contains("replay") && man.contains("proxy"));
    let (ok, _, err) = spindle(&["completions", "tcsh"], &[]);
    assert!(!ok && err.contains("possible values"), "{err}");
    // A page per subcommand, with its options.
    let (ok, page, err) = spindle(&["man", "parse"], &[]);
    assert!(ok && page.contains(".TH spindle-parse") && page.contains("chunk\\-size"), "{err}{page}");
    let (ok, _, err) = spindle(&["man", "nope"], &[]);
    assert!(!ok && err.contains("no subcommand \"nope\"; there are: parse, replay"), "{err}");
}

/// Every subcommand that prints meets a closed pipe by stopping quietly
/// and a full disk with one error line: never a panic.
#[test]
#[cfg(target_os = "linux")]
fn a_closed_or_full_stdout_is_an_error_not_a_panic() {
    let plugins = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/plugins");
    let commands: [&[&str]; 6] = [
        &["tools", "list", "--tools", plugins],
        &["tools", "manual", "--tools", plugins],
        &["completions", "bash"],
        &["man"],
        &["proxy", "--upstream", "http://127.0.0.1:9", "--print-config"],
        &["parse", concat!(env!("CARGO_MANIFEST_DIR"), "/corpora/long-rp-en-lighthouse.txt")],
    ];
    for args in commands {
        let full = std::fs::OpenOptions::new().write(true).open("/dev/full").expect("/dev/full");
        let out = Command::new(env!("CARGO_BIN_EXE_spindle")).args(args).stdout(full).output().expect("runs");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains("spindle: error:") && err.contains("No space left"), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");

        // A reader that is gone before the first write.
        let mut child = Command::new(env!("CARGO_BIN_EXE_spindle"))
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("runs");
        drop(child.stdout.take());
        let out = child.wait_with_output().expect("runs");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success() && !err.contains("panicked"), "{args:?}: {:?} {err}", out.status);
    }
}

#[test]
fn version_names_the_package_version() {
    let (ok, out, _) = spindle(&["--version"], &[]);
    assert!(ok && out.starts_with(&format!("spindle {}", env!("CARGO_PKG_VERSION"))), "{out}");
}
