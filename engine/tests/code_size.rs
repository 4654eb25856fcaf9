//! Sizes a reader can hold in their head (issue 40): no production file above 600 lines and no function
//! above 120 lines in the crates that hold pko's behaviour (`actors`, `engine`, `package`). Read from the
//! sources as text: a file's production part ends at its `#[cfg(test)]` module; a function runs from its
//! `fn` line to the closing brace at the same indentation.

mod sources;
use sources::{production, rust_files, workspace_root};

const MAX_FILE_LINES: usize = 600;
const MAX_FUNCTION_LINES: usize = 120;
const CRATES: [&str; 3] = ["actors", "engine", "package"];

/// The name of the function a line opens, if it opens one with a body.
fn function_at(line: &str) -> Option<&str> {
    let code = line.trim_start();
    let mut rest = code;
    for prefix in [
        "pub(crate) ",
        "pub(super) ",
        "pub ",
        "async ",
        "const ",
        "unsafe ",
    ] {
        rest = rest.strip_prefix(prefix).unwrap_or(rest);
    }
    let rest = rest.strip_prefix("async ").unwrap_or(rest);
    let name = rest.strip_prefix("fn ")?;
    let end = name.find(|c: char| !(c.is_alphanumeric() || c == '_'))?;
    (!line.trim_end().ends_with(';')).then_some(&name[..end])
}

/// Functions longer than the limit in `lines` (production part only), with their length.
fn long_functions<'a>(lines: &[&'a str]) -> Vec<(&'a str, usize)> {
    let mut found = Vec::new();
    for (start, line) in lines.iter().enumerate() {
        let Some(name) = function_at(line) else {
            continue;
        };
        let indent = line.len() - line.trim_start().len();
        let close = format!("{}}}", " ".repeat(indent));
        let end = lines[start..]
            .iter()
            .position(|l| l.trim_end() == close)
            .map_or(lines.len(), |offset| start + offset);
        let length = end - start + 1;
        if length > MAX_FUNCTION_LINES {
            found.push((name, length));
        }
    }
    found
}

#[test]
fn no_production_file_or_function_is_too_long_to_hold() {
    let root = workspace_root();
    let mut too_long = Vec::new();
    for krate in CRATES {
        let mut files = Vec::new();
        rust_files(&root.join(krate).join("src"), &mut files);
        assert!(!files.is_empty(), "no sources under {krate}/src");
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let production = &lines[..production(&lines)];
            let name = file.strip_prefix(&root).unwrap_or(&file).display();
            if production.len() > MAX_FILE_LINES {
                too_long.push(format!("{name}: {} lines", production.len()));
            }
            for (function, length) in long_functions(production) {
                too_long.push(format!("{name}: fn {function}, {length} lines"));
            }
        }
    }
    assert!(
        too_long.is_empty(),
        "above {MAX_FILE_LINES} lines a file, {MAX_FUNCTION_LINES} a function:\n{}",
        too_long.join("\n")
    );
}

#[test]
fn functions_are_measured_to_their_own_closing_brace() {
    let mut source = vec!["pub async fn long() {"];
    source.extend(std::iter::repeat_n("    step();", MAX_FUNCTION_LINES));
    source.push("}");
    source.extend(["    fn short(&self) -> bool {", "        true", "    }"]);
    source.push("fn declared();");
    assert_eq!(
        long_functions(&source),
        vec![("long", MAX_FUNCTION_LINES + 2)]
    );
    let with_tests = ["fn a() {}", "#[cfg(test)]", "mod tests {", "}"];
    assert_eq!(production(&with_tests), 1);
}
