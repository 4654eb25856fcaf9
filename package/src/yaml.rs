//! YAML as Package Operator reads package files: its document splitting, first-document rule and
//! YAML 1.1 scalars with last-wins duplicate keys. Pure text handling; knows nothing of manifests.

/// The document upstream reads of a manifest or lock file: the first; later ones are ignored.
pub fn first_document(text: &str) -> &str {
    split_documents(text).first().map_or("", |(_, doc)| doc)
}

/// Aliases one document may use: Kubernetes objects need few, and each one can copy a whole subtree
/// (the billion-laughs expansion needs many).
pub const MAX_ALIASES: usize = 1_000;
/// Nesting depth of one document.
pub const MAX_DEPTH: usize = 64;
/// Nodes of one document.
pub const MAX_NODES: usize = 250_000;
/// Bytes of all scalars of one document, alias copies included.
pub const MAX_SCALAR_BYTES: usize = 16 * 1024 * 1024;

/// Parses one YAML document of a package file as Package Operator does (sigs.k8s.io/yaml, YAML 1.1
/// scalars): a mapping key given twice keeps its last value, `yes`/`no`/`on`/`off` are booleans and a
/// leading zero makes an integer octal (`defaultMode: 0644` is 420). Within explicit budgets (aliases,
/// depth, nodes, scalar bytes): a document over one is an error naming it.
pub fn parse_yaml<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, serde_saphyr::Error> {
    let options = serde_saphyr::options! {
        budget: budget(),
        duplicate_keys: serde_saphyr::DuplicateKeyPolicy::LastWins,
        legacy_octal_numbers: true,
    };
    serde_saphyr::from_str_with_options(text, options)
}

/// Parses YAML a tenant wrote (rendered templates, `fromYaml`) with the parser's own defaults, within
/// the same budgets as package files.
pub fn parse_untrusted_yaml<T: serde::de::DeserializeOwned>(
    text: &str,
) -> Result<T, serde_saphyr::Error> {
    serde_saphyr::from_str_with_options(text, serde_saphyr::options! { budget: budget() })
}

fn budget() -> Option<serde_saphyr::Budget> {
    serde_saphyr::budget! {
        max_aliases: MAX_ALIASES,
        max_depth: MAX_DEPTH,
        max_nodes: MAX_NODES,
        max_total_scalar_bytes: MAX_SCALAR_BYTES,
    }
}

/// Splits an object file as upstream does: leading and trailing `-` and newline characters go, the rest
/// is split at lines that are exactly `---`, and each part is trimmed. Empty parts stay (they keep the
/// document indices upstream reports).
pub fn split_object_file(content: &str) -> Vec<&str> {
    let content = content.trim_matches(|c| c == '-' || c == '\n');
    let mut parts = Vec::new();
    let mut start = 0;
    let mut offset = 0;
    for line in content.split_inclusive('\n') {
        if line.strip_suffix('\n').unwrap_or(line) == "---" {
            parts.push(content[start..offset].trim());
            start = offset + line.len();
        }
        offset += line.len();
    }
    parts.push(content[start..].trim());
    parts
}

/// Splits a YAML stream at `---` lines; yields (1-based line where the document starts, document).
pub fn split_documents(content: &str) -> Vec<(usize, &str)> {
    let mut docs = Vec::new();
    let mut start_byte = 0;
    let mut start_line = 1;
    let mut offset = 0;
    for (i, line) in content.split_inclusive('\n').enumerate() {
        let trimmed = line.trim_end();
        if trimmed == "---" || trimmed.starts_with("--- ") {
            docs.push((start_line, &content[start_byte..offset]));
            start_byte = offset + line.len();
            start_line = i + 2;
        }
        offset += line.len();
    }
    docs.push((start_line, &content[start_byte..]));
    docs.into_iter()
        .filter(|(_, d)| !d.trim().is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alias_bombs_and_deep_nesting_are_refused_by_their_budget() {
        let mut laughs =
            String::from("a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]\n");
        for level in 1..10 {
            let previous = format!("*a{}", level - 1);
            let row = vec![previous; 10].join(", ");
            laughs.push_str(&format!("a{level}: &a{level} [{row}]\n"));
        }
        let error = parse_yaml::<serde_json::Value>(&laughs)
            .unwrap_err()
            .to_string();
        assert!(error.to_lowercase().contains("budget"), "{error}");
        let deep = format!(
            "{}1{}",
            "[".repeat(MAX_DEPTH + 8),
            "]".repeat(MAX_DEPTH + 8)
        );
        assert!(parse_yaml::<serde_json::Value>(&deep).is_err());
        let fine: serde_json::Value = parse_yaml("a: &x [1, 2]\nb: *x\n").unwrap();
        assert_eq!(fine["b"], serde_json::json!([1, 2]));
    }
    use pko_proto::manifests::PackageManifest;
    use serde_json::{json, Value};

    #[test]
    fn documents_split_at_separator_lines_with_their_start_lines() {
        let docs = split_documents("a: 1\n---\nb: 2\n--- # comment\n\n---\nc: 3\n");
        assert_eq!(docs, vec![(1, "a: 1\n"), (3, "b: 2\n"), (7, "c: 3\n")]);
        assert_eq!(split_documents("---\nx: 1\n"), vec![(2, "x: 1\n")]);
    }

    #[test]
    fn a_key_given_twice_keeps_its_last_value_as_upstream_does() {
        let object: Value =
            parse_yaml("kind: ConfigMap\ndata:\n  greeting: hi\n  greeting: hello\n").unwrap();
        assert_eq!(object["data"], json!({"greeting": "hello"}));
        let manifest: PackageManifest = parse_yaml(
            "apiVersion: manifests.package-operator.run/v1alpha1\nkind: PackageManifest\n\
             metadata: {name: first}\nmetadata: {name: second}\nspec: {scopes: [Namespaced], phases: []}\n",
        )
        .unwrap();
        assert_eq!(manifest.metadata.name.as_deref(), Some("second"));
    }

    #[test]
    fn scalars_resolve_as_yaml_1_1() {
        let object: Value =
            parse_yaml("mode: 0644\nenabled: yes\nquiet: off\nport: 8080\n").unwrap();
        assert_eq!(
            object,
            json!({"mode": 420, "enabled": true, "quiet": false, "port": 8080})
        );
    }

    #[test]
    fn a_manifest_file_is_its_first_document() {
        let text = "---\napiVersion: manifests.package-operator.run/v1alpha1\nkind: PackageManifest\n\
                    metadata: {name: first}\nspec: {scopes: [Namespaced], phases: []}\n---\nignored: [\n";
        let manifest: PackageManifest = parse_yaml(first_document(text)).unwrap();
        assert_eq!(manifest.metadata.name.as_deref(), Some("first"));
        assert_eq!(first_document(""), "");
    }
}
