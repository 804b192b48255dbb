//! Puts the git commit and its date into `spindle --version`
//! (`SPINDLE_BUILD_INFO`, e.g. ` (1a2b3c4 2026-11-24)`), and nothing when
//! the source is not a git checkout or git is missing (a crates.io
//! download, a tarball): the build never fails for it.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!text.is_empty()).then_some(text)
}

fn main() {
    let info = match (git(&["rev-parse", "--short=7", "HEAD"]), git(&["log", "-1", "--format=%cs"])) {
        (Some(commit), Some(date)) => format!(" ({commit} {date})"),
        (Some(commit), None) => format!(" ({commit})"),
        _ => String::new(),
    };
    println!("cargo:rustc-env=SPINDLE_BUILD_INFO={info}");
    // Build again when HEAD moves (a commit, a checkout).
    if let Some(dir) = git(&["rev-parse", "--git-dir"]) {
        println!("cargo:rerun-if-changed={dir}/HEAD");
        if let Some(reference) = git(&["symbolic-ref", "-q", "HEAD"])
            && let Some(common) = git(&["rev-parse", "--git-common-dir"])
        {
            println!("cargo:rerun-if-changed={common}/{reference}");
            println!("cargo:rerun-if-changed={common}/packed-refs");
        }
    }
    println!("cargo:rerun-if-changed=build.rs");
}
