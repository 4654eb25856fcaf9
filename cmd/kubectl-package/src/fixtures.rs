//! Template-test fixtures on disk, as upstream keeps them: `<unit>/.test-fixtures/<case>/` holds the
//! rendered object files of one test case. A missing case directory is written; an existing one is
//! compared with what the case renders now, through the system's `diff -u`, the way upstream reports it.
//! Never writes outside the case directory (and a temporary directory it removes).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use pko_package::loader::LoadedPackage;
use pko_package::template_test_cases::{check_case_name, fixture_files, FIXTURE_DIR};

/// How a test case compares with its fixtures.
pub enum CaseCheck {
    /// Fixtures written or identical.
    Pass,
    /// Mismatches, one message each (upstream's wording).
    Mismatch(Vec<String>),
}

/// Writes or compares the fixtures of `case` rendered as `loaded`, for the package unit in `unit_dir`.
/// An Err is a hard failure (a fixture missing for a file that rendered, or I/O).
pub fn check_case(
    unit_dir: &Path,
    case: &str,
    loaded: &LoadedPackage,
) -> Result<CaseCheck, String> {
    check_case_name(case)?;
    let fixture_dir = unit_dir.join(FIXTURE_DIR).join(case);
    let rendered = fixture_files(loaded);
    if !fixture_dir.exists() {
        write_files(&fixture_dir, &rendered)?;
        return Ok(CaseCheck::Pass);
    }
    let actual_dir = TempDir::new(case)?;
    write_files(&actual_dir.0, &rendered)?;

    let mut unexpected = Vec::new();
    for relative in files_under(&fixture_dir)? {
        if !loaded.object_files.contains_key(&relative) {
            unexpected.push(format!(
                "file {relative} should not exist, filtered or empty after template render"
            ));
        }
    }
    let mut mismatches = Vec::new();
    for path in loaded.object_files.keys() {
        let fixture = fixture_dir.join(path);
        let actual = actual_dir.0.join(path);
        match (fixture.exists(), actual.exists()) {
            (false, true) => {
                return Err(format!(
                    "file {} not found in fixtures folder",
                    fixture.display()
                ))
            }
            (false, false) => continue,
            _ => {}
        }
        let diff = run_diff(&fixture, &actual)?;
        if !diff.is_empty() {
            mismatches.push(format!(
                "File mismatch against fixture in {path}: Testcase {case:?}\n{diff}"
            ));
        }
    }
    unexpected.append(&mut mismatches);
    Ok(if unexpected.is_empty() {
        CaseCheck::Pass
    } else {
        CaseCheck::Mismatch(unexpected)
    })
}

fn write_files(dir: &Path, files: &BTreeMap<String, String>) -> Result<(), String> {
    for (path, content) in files {
        let target = dir.join(path);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
        }
        std::fs::write(&target, content).map_err(|e| format!("{}: {e}", target.display()))?;
    }
    Ok(())
}

/// Every file under `dir`, symlinks followed, as `/`-separated paths relative to it.
fn files_under(dir: &Path) -> Result<Vec<String>, String> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(current) = pending.pop() {
        let entries =
            std::fs::read_dir(&current).map_err(|e| format!("{}: {e}", current.display()))?;
        for entry in entries {
            let path = entry
                .map_err(|e| format!("{}: {e}", current.display()))?
                .path();
            if path.is_dir() {
                pending.push(path);
            } else if let Ok(relative) = path.strip_prefix(dir) {
                let parts: Vec<String> = relative
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect();
                found.push(parts.join("/"));
            }
        }
    }
    found.sort();
    Ok(found)
}

/// `diff -u` between the fixture and the actual file, labelled as upstream labels them; "" when equal.
fn run_diff(fixture: &Path, actual: &Path) -> Result<String, String> {
    let base = fixture
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let out = Command::new("diff")
        .arg("-u")
        .arg(format!("--label=FIXTURE/{base}"))
        .arg(format!("--label=ACTUAL/{base}"))
        .arg(fixture)
        .arg(actual)
        .output()
        .map_err(|e| format!("running diff: {e}"))?;
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    Ok(text.trim().to_owned())
}

/// A directory removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(case: &str) -> Result<Self, String> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or_default();
        let dir = std::env::temp_dir().join(format!(
            "kubectl-package-{}-{nanos}-{case}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        Ok(TempDir(dir))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        // Best effort: a leftover temporary directory is harmless.
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
