//! `rota completions` and `rota man`, checked by the programs that consume
//! them: a real bash runs the completion function the script registers,
//! zsh and fish parse their scripts when installed, and man-db's `man -l`
//! renders the pages.

mod common;

use std::collections::BTreeSet;
use std::io::ErrorKind;
use std::path::Path;
use std::process::Command;

use common::Rota;

/// Sources a bash completion script (`$1`), finds the function it
/// registered for `rota`, calls it the way bash does at a TAB with the
/// cursor at the end of the words `$2…` (the last one, maybe empty, being
/// completed) and prints the candidates, one per line.
const BASH_COMPLETE: &str = r#"
script=$1
shift
source "$script" || { echo "sourcing $script failed" >&2; exit 3; }
spec=$(complete -p rota) || { echo "the script registers no completion for rota" >&2; exit 3; }
[[ $spec =~ -F\ ([^ ]+) ]] || { echo "no completion function in: $spec" >&2; exit 3; }
function=${BASH_REMATCH[1]}
COMP_WORDS=("$@")
COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
COMP_LINE="${COMP_WORDS[*]}"
COMP_POINT=${#COMP_LINE}
COMPREPLY=()
"$function" rota "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD - 1]}"
printf '%s\n' "${COMPREPLY[@]}"
"#;

/// What bash offers for `line` with the cursor at its end (a trailing
/// space completes a new, empty word).
fn bash_candidates(script: &Path, line: &str) -> BTreeSet<String> {
    let mut words: Vec<&str> = line.split_whitespace().collect();
    if line.ends_with(' ') {
        words.push("");
    }
    let output = Command::new("bash")
        .args(["--norc", "--noprofile", "-c", BASH_COMPLETE, "bash"])
        .arg(script)
        .args(&words)
        .output()
        .unwrap_or_else(|err| panic!("cannot run bash, which the completion test needs: {err}"));
    assert!(output.status.success(), "completing {line:?} in bash failed: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).expect("utf-8 candidates").lines().filter(|line| !line.is_empty()).map(str::to_owned).collect()
}

#[test]
fn bash_completes_subcommands_flags_and_values() {
    let rota = Rota::new();
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("rota.bash");
    std::fs::write(&script, rota.ok(&["completions", "bash"])).unwrap();

    let subcommands = bash_candidates(&script, "rota ser");
    assert_eq!(subcommands, BTreeSet::from(["serve".to_owned()]), "rota ser<TAB>");
    let flags = bash_candidates(&script, "rota serve --work");
    assert_eq!(flags, BTreeSet::from(["--workflows".to_owned()]), "rota serve --work<TAB>");
    // Nested subcommands, and a flag's fixed values.
    assert!(bash_candidates(&script, "rota queue se").contains("send"), "rota queue se<TAB>");
    let shells = bash_candidates(&script, "rota completions ");
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        assert!(shells.contains(shell), "rota completions <TAB> does not offer {shell}: {shells:?}");
    }
}

#[test]
fn every_shell_gets_a_script_that_names_rota() {
    let rota = Rota::new();
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let script = rota.ok(&["completions", shell]);
        assert!(!script.trim().is_empty(), "rota completions {shell} printed nothing");
        assert!(script.contains("rota"), "rota completions {shell} does not mention rota:\n{script}");
    }
}

#[test]
fn completions_refuses_an_unknown_shell() {
    let (code, stderr) = Rota::new().fails(&["completions", "tcsh"]);
    assert_eq!(code, 2, "a usage error: {stderr}");
    assert!(stderr.contains("tcsh") && stderr.contains("bash"), "names the value and the choices: {stderr}");
}

/// Checks that `shell` parses the script `rota completions <shell>` prints
/// (`check_flag` makes it parse and run nothing). Without `shell` on the
/// machine, prints a SKIP line naming it.
fn script_parses_in(shell: &str, check_flag: &str) {
    let rota = Rota::new();
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join(format!("rota.{shell}"));
    std::fs::write(&script, rota.ok(&["completions", shell])).unwrap();
    let output = match Command::new(shell).arg(check_flag).arg(&script).output() {
        Ok(output) => output,
        Err(err) if err.kind() == ErrorKind::NotFound => {
            println!("SKIP: {shell} is not installed, so its completion script was not parsed");
            return;
        }
        Err(err) => panic!("cannot run {shell}: {err}"),
    };
    assert!(
        output.status.success(),
        "{shell} {check_flag} rejects the script: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn zsh_parses_its_script() {
    script_parses_in("zsh", "-n");
}

#[test]
fn fish_parses_its_script() {
    script_parses_in("fish", "--no-execute");
}

/// A page as `man -l` shows it: plain ASCII text, 80 columns wide.
fn rendered(page: &Path) -> String {
    let output = Command::new("man")
        .arg("-l")
        .arg(page)
        .env("MANPAGER", "cat")
        .env("MANWIDTH", "80")
        // ASCII hyphens and quotes, whatever the machine's locale.
        .env("LC_ALL", "C")
        .output()
        .unwrap_or_else(|err| match err.kind() {
            ErrorKind::NotFound => panic!("`man` is not installed: the man page tests render the pages with `man -l` (install man-db)"),
            _ => panic!("cannot run man: {err}"),
        });
    assert!(output.status.success(), "man -l {} failed: {}", page.display(), String::from_utf8_lossy(&output.stderr));
    // Bold and underline, should the pager be skipped differently: `x\bx`, `_\bx`.
    let text = String::from_utf8(output.stdout).expect("utf-8 page");
    let mut plain = String::with_capacity(text.len());
    for c in text.chars() {
        if c == '\u{8}' {
            plain.pop();
        } else {
            plain.push(c);
        }
    }
    plain
}

#[test]
fn man_prints_rotas_page() {
    let rota = Rota::new();
    let dir = tempfile::tempdir().unwrap();
    let page = dir.path().join("rota.1");
    let roff = rota.ok(&["man"]);
    assert!(roff.lines().any(|line| line.starts_with(".TH rota 1 ")), "not a roff page of rota(1):\n{roff}");
    std::fs::write(&page, roff).unwrap();

    let text = rendered(&page);
    for needle in
        ["NAME", "SYNOPSIS", "OPTIONS", "SUBCOMMANDS", "rota-serve(1)", "rota-queue(1)", "--store <URL>", "ROTA_STORE", "--server <URL>"]
    {
        assert!(text.contains(needle), "the rendered page lacks {needle:?}:\n{text}");
    }
}

#[test]
fn man_dir_writes_a_page_per_command() {
    let rota = Rota::new();
    let dir = tempfile::tempdir().unwrap();
    let man1 = dir.path().join("share/man/man1");
    let listed: BTreeSet<String> = rota.ok(&["man", "--dir", man1.to_str().unwrap()]).lines().map(str::to_owned).collect();

    let written: BTreeSet<String> = std::fs::read_dir(&man1).unwrap().map(|entry| entry.unwrap().path().display().to_string()).collect();
    assert_eq!(listed, written, "prints each page it writes, and only those");
    let names: BTreeSet<String> = written.iter().map(|path| Path::new(path).file_name().unwrap().to_str().unwrap().to_owned()).collect();
    for name in [
        "rota.1",
        "rota-serve.1",
        "rota-agent.1",
        "rota-queue.1",
        "rota-queue-send.1",
        "rota-dlq-redrive.1",
        "rota-completions.1",
        "rota-man.1",
    ] {
        assert!(names.contains(name), "no {name} in {names:?}");
    }
    assert!(!names.iter().any(|name| name.contains("help")), "clap's help subcommand gets no page: {names:?}");

    for path in &written {
        let text = rendered(Path::new(path));
        assert!(text.contains("NAME") && text.contains("SYNOPSIS"), "{path} renders without NAME or SYNOPSIS:\n{text}");
    }
    let serve = rendered(&man1.join("rota-serve.1"));
    for needle in ["rota-serve", "--workflows", "--store <URL>"] {
        assert!(serve.contains(needle), "rota-serve(1) lacks {needle:?}:\n{serve}");
    }
    let send = rendered(&man1.join("rota-queue-send.1"));
    assert!(send.contains("rota-queue-send") && send.contains("--body"), "rota-queue-send(1):\n{send}");
}
