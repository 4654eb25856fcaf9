//! Seed fixtures and a typed dispatch on `kind`, shared by the round-trip tests.

use std::path::PathBuf;

use serde_json::Value;

/// `(file name, parsed YAML)` of every seed fixture.
pub fn seed_fixtures() -> Vec<(String, Value)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/seeds");
    let mut fixtures: Vec<(String, Value)> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "yaml"))
        .map(|path| {
            let text = std::fs::read_to_string(&path).unwrap();
            let value: Value = serde_saphyr::from_str(&text)
                .unwrap_or_else(|error| panic!("{}: {error}", path.display()));
            (
                path.file_name().unwrap().to_string_lossy().into_owned(),
                value,
            )
        })
        .collect();
    fixtures.sort_by(|a, b| a.0.cmp(&b.0));
    fixtures
}

/// Every field of `expected` is in `actual` with the same value (`actual` may add defaulted fields).
/// Returns the path of the first difference.
pub fn contains(actual: &Value, expected: &Value, path: &str) -> Result<(), String> {
    match (actual, expected) {
        (Value::Object(actual), Value::Object(expected)) => {
            for (key, value) in expected {
                let inner = format!("{path}.{key}");
                let found = actual.get(key).ok_or_else(|| format!("{inner} missing"))?;
                contains(found, value, &inner)?;
            }
            Ok(())
        }
        (Value::Array(actual), Value::Array(expected)) => {
            if actual.len() != expected.len() {
                return Err(format!(
                    "{path}: {} items instead of {}",
                    actual.len(),
                    expected.len()
                ));
            }
            for (index, (found, value)) in actual.iter().zip(expected).enumerate() {
                contains(found, value, &format!("{path}[{index}]"))?;
            }
            Ok(())
        }
        (Value::Number(actual), Value::Number(expected))
            if actual.as_f64() == expected.as_f64() =>
        {
            Ok(())
        }
        _ if actual == expected => Ok(()),
        _ => Err(format!("{path}: {actual} instead of {expected}")),
    }
}
