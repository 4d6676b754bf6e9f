//! docs/CLI.md and docs/SERVER.md against the code, both ways: each
//! subcommand's visible flags (clap's definitions) and the routes the
//! server's router is built from (`rlx_server::routes`).
//!
//! CLI.md's convention: a `## ` heading names the subcommands its section
//! covers (`## rlx run`, `## Model options (run, chat, …)`), and the first
//! column of a section's tables lists that section's flags.

use std::collections::{BTreeMap, BTreeSet};

use clap::CommandFactory;

use crate::Cli;

fn doc(name: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../docs")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The subcommands, without `help`.
fn subcommands() -> Vec<String> {
    Cli::command()
        .get_subcommands()
        .map(|s| s.get_name().to_owned())
        .collect()
}

/// Every `--flag` in `text` (not `---`, not part of a longer word).
fn long_flags(text: &str) -> Vec<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(at) = text[i..].find("--") {
        let start = i + at;
        let before = start.checked_sub(1).map(|b| bytes[b]);
        let name: String = text[start + 2..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
            .collect();
        let word_start = before.is_none_or(|b| !(b.is_ascii_alphanumeric() || b == b'-'));
        if word_start && name.starts_with(|c: char| c.is_ascii_alphanumeric()) {
            out.push(name.trim_end_matches('-').to_owned());
        }
        i = start + 2 + name.len();
    }
    out
}

/// A subcommand's visible long flags and their visible aliases.
struct Flags {
    long: BTreeSet<String>,
    aliases: BTreeSet<String>,
}

impl Flags {
    fn has(&self, flag: &str) -> bool {
        flag == "help" || self.long.contains(flag) || self.aliases.contains(flag)
    }
}

fn flags_of(sub: &str) -> Flags {
    let cmd = Cli::command();
    let sub = cmd.find_subcommand(sub).expect("a subcommand");
    let shown = || sub.get_arguments().filter(|a| !a.is_hide_set());
    Flags {
        long: shown()
            .filter_map(|a| a.get_long())
            .map(str::to_owned)
            .collect(),
        aliases: shown()
            .flat_map(|a| a.get_visible_aliases().unwrap_or_default())
            .map(str::to_owned)
            .collect(),
    }
}

/// A markdown table row's cells (`\|` inside a cell is no separator).
fn cells(row: &str) -> Vec<String> {
    let mut cells = vec![String::new()];
    let mut escaped = false;
    for c in row.trim().trim_start_matches('|').chars() {
        match c {
            '|' if !escaped => cells.push(String::new()),
            _ => cells.last_mut().unwrap().push(c),
        }
        escaped = c == '\\';
    }
    cells
}

/// CLI.md's sections: heading, the subcommands it names, the flags in the
/// first column of its tables.
fn sections(md: &str, subs: &[String]) -> Vec<(String, Vec<String>, Vec<String>)> {
    let mut out: Vec<(String, Vec<String>, Vec<String>)> = Vec::new();
    for line in md.lines() {
        if let Some(heading) = line.strip_prefix("## ") {
            let named = heading
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
                .filter(|w| subs.iter().any(|s| s == w))
                .map(str::to_owned)
                .collect();
            out.push((heading.to_owned(), named, Vec::new()));
        } else if line.starts_with('|') {
            if let Some(section) = out.last_mut() {
                section.2.extend(long_flags(&cells(line)[0]));
            }
        }
    }
    out
}

#[test]
fn cli_md_documents_every_flag_of_every_subcommand_and_no_other() {
    let md = doc("CLI.md");
    let subs = subcommands();
    assert!(subs.len() >= 13, "{subs:?}");
    let flags: BTreeMap<&str, Flags> = subs.iter().map(|s| (s.as_str(), flags_of(s))).collect();
    let sections = sections(&md, &subs);
    let mut problems = Vec::new();
    for sub in &subs {
        if !sections.iter().any(|s| s.0 == format!("rlx {sub}")) {
            problems.push(format!("no `## rlx {sub}` section"));
        }
        let documented: BTreeSet<&str> = sections
            .iter()
            .filter(|s| s.1.contains(sub))
            .flat_map(|s| s.2.iter().map(String::as_str))
            .collect();
        for flag in &flags[sub.as_str()].long {
            if !documented.contains(flag.as_str()) {
                problems.push(format!(
                    "rlx {sub} --{flag} is in no table under a heading naming {sub}"
                ));
            }
        }
    }
    for (heading, named, documented) in &sections {
        for flag in documented {
            for sub in named {
                if !flags[sub.as_str()].has(flag) {
                    problems.push(format!("## {heading}: rlx {sub} has no --{flag}"));
                }
            }
        }
    }
    for flag in long_flags(&md) {
        if !flags.values().any(|f| f.has(&flag)) {
            problems.push(format!("--{flag} is mentioned but no subcommand has it"));
        }
    }
    assert!(problems.is_empty(), "docs/CLI.md:\n{}", problems.join("\n"));
}

/// Every `` `METHOD /path` `` outside code blocks.
fn routes_in(md: &str) -> BTreeSet<(String, String)> {
    let mut prose = String::new();
    let mut fenced = false;
    for line in md.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
        } else if !fenced {
            prose.push_str(line);
            prose.push(' ');
        }
    }
    prose
        .split('`')
        .skip(1)
        .step_by(2)
        .filter_map(|code| {
            let words: Vec<&str> = code.split_whitespace().collect();
            match words[..] {
                [method, path]
                    if path.starts_with('/')
                        && ["GET", "POST", "PUT", "PATCH", "DELETE"].contains(&method) =>
                {
                    Some((method.to_owned(), path.to_owned()))
                }
                _ => None,
            }
        })
        .collect()
}

#[test]
fn server_md_documents_every_route_and_no_other() {
    let md = doc("SERVER.md");
    let documented = routes_in(&md);
    let served: BTreeSet<(String, String)> = rlx_server::routes()
        .into_iter()
        .map(|(m, p)| (m.to_owned(), p.to_owned()))
        .collect();
    let missing: Vec<_> = served.difference(&documented).collect();
    let extra: Vec<_> = documented.difference(&served).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "docs/SERVER.md: routes served but not documented {missing:?}; documented but not served {extra:?}"
    );
}

#[test]
fn server_md_documents_the_server_flags() {
    let md = doc("SERVER.md");
    let serve = flags_of("serve");
    let in_server_md: BTreeSet<String> = long_flags(&md).into_iter().collect();
    for flag in &in_server_md {
        assert!(serve.has(flag), "docs/SERVER.md: rlx serve has no --{flag}");
    }
    // The server's own flags (CLI.md's `rlx serve` table) are all here.
    let cli = doc("CLI.md");
    let subs = subcommands();
    let own = sections(&cli, &subs)
        .into_iter()
        .find(|s| s.0 == "rlx serve")
        .expect("CLI.md has `## rlx serve`")
        .2;
    for flag in own {
        assert!(
            in_server_md.contains(&flag),
            "docs/SERVER.md does not document --{flag}"
        );
    }
}
