//! No import cycles between the modules of any crate of the workspace, and no domain imported by the actor
//! runtime (issue 40): a module that needs another must not be needed back, directly or around a longer
//! circle, so each can be read, tested and moved on its own. Read from the sources as text: `crate::…`,
//! `super::…` and bare `child::…` paths (to a module's own submodules) outside test modules are edges
//! from the file's module to the longest module path they name; `mod` declarations are not. So a parent
//! whose submodules add `impl` blocks to its types must not import from them.
//! The crate roots (`lib.rs`, `main.rs`) are left out: a binary's root is its composition root.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

mod sources;
use sources::{production, rust_files, workspace_root};

/// Every crate's `src/` directory in the workspace.
fn crate_sources(root: &Path) -> Vec<PathBuf> {
    let mut crates = Vec::new();
    let mut dirs = vec![root.to_owned()];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if !path.is_dir() || name.starts_with('.') || name == "target" || name == "src" {
                continue;
            }
            if path.join("Cargo.toml").is_file() && path.join("src").is_dir() {
                crates.push(path.join("src"));
            }
            dirs.push(path);
        }
    }
    crates.sort();
    crates
}

/// The module path of a source file under `src` (`a/b.rs` and `a/b/mod.rs` are `a::b`; roots are "").
fn module_of(src: &Path, file: &Path) -> String {
    let relative = file.strip_prefix(src).unwrap_or(file).with_extension("");
    let mut parts: Vec<String> = relative
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts.join("::")
}

/// The path after `crate::` or `super::` at `rest`, expanded over one level of braces
/// (`crate::{a, b::c}` names `a` and `b::c`).
fn paths_at(rest: &str) -> Vec<String> {
    let path: String = rest
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
        .collect();
    let after = &rest[path.len()..];
    if path.is_empty() && after.starts_with('{') {
        let inner: String = after[1..].chars().take_while(|c| *c != '}').collect();
        return inner
            .split(',')
            .map(|p| p.trim().trim_end_matches("::").to_owned())
            .filter(|p| !p.is_empty())
            .collect();
    }
    vec![path.trim_end_matches("::").to_owned()]
}

/// The production code of a file: without comments and without its `#[cfg(test)]` module at the end.
fn production_lines(text: &str) -> Vec<&str> {
    let lines: Vec<&str> = text.lines().collect();
    lines[..production(&lines)]
        .iter()
        .copied()
        .filter(|line| !line.trim_start().starts_with("//"))
        .collect()
}

/// The longest known module that `path` (relative to the crate root) starts with.
fn resolve(modules: &BTreeSet<String>, path: &str) -> Option<String> {
    let parts: Vec<&str> = path.split("::").collect();
    (1..=parts.len())
        .rev()
        .map(|n| parts[..n].join("::"))
        .find(|candidate| modules.contains(candidate))
}

fn parent(module: &str) -> String {
    module
        .rsplit_once("::")
        .map(|(p, _)| p.to_owned())
        .unwrap_or_default()
}

/// Each module's imports of other modules of the same crate.
fn import_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let modules: BTreeSet<String> = files.iter().map(|f| module_of(src, f)).collect();
    let mut graph = BTreeMap::new();
    for file in &files {
        let module = module_of(src, file);
        if module.is_empty() {
            continue;
        }
        let text = std::fs::read_to_string(file).unwrap_or_default();
        let mut edges = BTreeSet::new();
        // A module's own submodules are named by a bare path (`child::Item`).
        let children: Vec<(String, String)> = modules
            .iter()
            .filter(|m| parent(m) == module)
            .map(|m| (format!("{}::", &m[module.len() + 2..]), module.clone()))
            .collect();
        let markers = [
            ("crate::".to_owned(), String::new()),
            ("super::".to_owned(), parent(&module)),
        ];
        for line in production_lines(&text) {
            for (marker, base) in markers.iter().chain(&children) {
                let marker = marker.as_str();
                let base = if children.iter().any(|(c, _)| c == marker) {
                    format!("{base}::{}", marker.trim_end_matches("::"))
                } else {
                    base.clone()
                };
                for (at, _) in line.match_indices(marker) {
                    // `pko_proto::…::crate::` does not occur; a word before `super::` would be a path
                    // of another crate's module named super, which does not occur either.
                    if line[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_' || c == ':') {
                        continue;
                    }
                    for path in paths_at(&line[at + marker.len()..]) {
                        let full = match (base.is_empty(), path.is_empty()) {
                            (true, _) => path,
                            (false, true) => base.clone(),
                            (false, false) => format!("{base}::{path}"),
                        };
                        if let Some(target) = resolve(&modules, &full) {
                            if target != module && !target.is_empty() {
                                edges.insert(target);
                            }
                        }
                    }
                }
            }
        }
        graph.insert(module, edges);
    }
    graph
}

/// The strongly connected components of more than one module (Tarjan's algorithm).
fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct Search<'a> {
        graph: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        found: Vec<Vec<String>>,
    }
    impl<'a> Search<'a> {
        fn visit(&mut self, node: &'a str) {
            let n = self.index.len();
            self.index.insert(node, n);
            self.low.insert(node, n);
            self.stack.push(node);
            self.on_stack.insert(node);
            for next in self.graph.get(node).into_iter().flatten() {
                let next = next.as_str();
                if !self.index.contains_key(next) {
                    self.visit(next);
                    let low = self.low[node].min(self.low[next]);
                    self.low.insert(node, low);
                } else if self.on_stack.contains(next) {
                    let low = self.low[node].min(self.index[next]);
                    self.low.insert(node, low);
                }
            }
            if self.low[node] == self.index[node] {
                let mut component = Vec::new();
                while let Some(top) = self.stack.pop() {
                    self.on_stack.remove(top);
                    component.push(top.to_owned());
                    if top == node {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.found.push(component);
                }
            }
        }
    }
    let mut search = Search {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for node in graph.keys() {
        if !search.index.contains_key(node.as_str()) {
            search.visit(node);
        }
    }
    search.found
}

#[test]
fn no_crate_of_the_workspace_has_an_import_cycle() {
    let root = workspace_root();
    let crates = crate_sources(&root);
    assert!(crates.len() >= 5, "found only {crates:?}");
    let mut found = Vec::new();
    for src in &crates {
        for cycle in cycles(&import_graph(src)) {
            let name = src
                .parent()
                .unwrap_or(src)
                .strip_prefix(&root)
                .unwrap_or(src);
            found.push(format!("{}: {}", name.display(), cycle.join(" ↔ ")));
        }
    }
    assert!(found.is_empty(), "import cycles:\n{}", found.join("\n"));
}

/// The actor runtime (shell, feeds, Leases, sharding, client) is the floor every domain stands on: it
/// imports none of them, so it can be read and changed without the domains.
#[test]
fn the_actor_runtime_imports_no_domain() {
    let src = workspace_root().join("actors/src");
    let graph = import_graph(&src);
    let outside: Vec<String> = graph
        .iter()
        .filter(|(module, _)| module.starts_with("runtime::"))
        .flat_map(|(module, edges)| {
            edges
                .iter()
                .filter(|target| !target.starts_with("runtime::"))
                .map(move |target| format!("{module} → {target}"))
        })
        .collect();
    assert!(
        graph.keys().any(|m| m == "runtime::object_actor"),
        "{graph:?}"
    );
    assert!(
        outside.is_empty(),
        "the runtime imports domains:\n{}",
        outside.join("\n")
    );
}

#[test]
fn the_graph_sees_a_cycle_and_resolves_paths() {
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("a", vec!["b"]),
        ("b", vec!["c"]),
        ("c", vec!["a"]),
        ("d", vec!["a"]),
    ]
    .into_iter()
    .map(|(m, e)| (m.to_owned(), e.into_iter().map(str::to_owned).collect()))
    .collect();
    assert_eq!(cycles(&graph), vec![vec!["a", "b", "c"]]);
    let modules: BTreeSet<String> = ["x", "x::y"].into_iter().map(str::to_owned).collect();
    assert_eq!(resolve(&modules, "x::y::Z").as_deref(), Some("x::y"));
    assert_eq!(resolve(&modules, "x::W").as_deref(), Some("x"));
    assert_eq!(resolve(&modules, "engine::q"), None);
    assert_eq!(paths_at("{a, b::c};"), vec!["a", "b::c"]);
    assert_eq!(paths_at("a::b::{C, D};"), vec!["a::b"]);
}
