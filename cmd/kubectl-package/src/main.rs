//! `kubectl-package`: works with Package Operator packages on disk. `validate` loads a package directory
//! (manifest, lock file, templates, every object's phase and labels) and reports the first problem with
//! file and line; `tree` prints the phases and objects the package produces.
//!
//! Exit codes: 0 valid, 1 the package is invalid, 2 the command could not run (usage, unreadable files).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use pko_actors::package::files::from_dir;
use pko_actors::package::loader::{load_package, LoadedPackage};
use serde_json::{json, Value};

#[derive(Debug, Parser)]
#[command(version, about = "Work with Package Operator packages")]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Check that a package directory loads: manifest, templates, objects.
    Validate(Source),
    /// Print the phases and objects a package directory produces.
    Tree(Source),
}

#[derive(Debug, clap::Args)]
struct Source {
    /// Package directory (holding manifest.yaml).
    path: PathBuf,
    /// Package config (YAML or JSON) given to templates as `.config`.
    #[arg(long)]
    config: Option<PathBuf>,
}

enum Failure {
    Invalid(String),
    CannotRun(String),
}

fn context(source: &Source) -> Result<Value, Failure> {
    let config: Value = match &source.config {
        None => json!({}),
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| Failure::CannotRun(format!("{}: {e}", path.display())))?;
            serde_saphyr::from_str(&text)
                .map_err(|e| Failure::CannotRun(format!("{}: {e}", path.display())))?
        }
    };
    let name = source
        .path
        .canonicalize()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "package".to_owned());
    Ok(json!({
        "package": {"metadata": {"name": name, "namespace": "default", "labels": {}, "annotations": {}}, "image": ""},
        "config": config,
        "environment": {"kubernetes": {"version": "v1.20.2"}},
    }))
}

fn load(source: &Source) -> Result<LoadedPackage, Failure> {
    let files = from_dir(Path::new(&source.path))
        .map_err(|e| Failure::CannotRun(format!("{}: {e}", source.path.display())))?;
    load_package(&files, &context(source)?).map_err(|e| Failure::Invalid(e.to_string()))
}

fn tree(package: &LoadedPackage) -> String {
    let mut out = format!(
        "Package {}\n",
        package
            .manifest
            .metadata
            .name
            .as_deref()
            .unwrap_or_default()
    );
    for (i, phase) in package.phases.iter().enumerate() {
        let last_phase = i + 1 == package.phases.len();
        let class = if phase.class.is_empty() {
            String::new()
        } else {
            format!(" (class {})", phase.class)
        };
        out.push_str(&format!(
            "{} Phase {}{class}\n",
            if last_phase { "└──" } else { "├──" },
            phase.name
        ));
        for (j, object) in phase.objects.iter().enumerate() {
            let o = &object.object;
            let field = |p: &str| {
                o.pointer(p)
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned()
            };
            let namespace = field("/metadata/namespace");
            let name = if namespace.is_empty() {
                field("/metadata/name")
            } else {
                format!("{namespace}/{}", field("/metadata/name"))
            };
            let branch = if j + 1 == phase.objects.len() {
                "└──"
            } else {
                "├──"
            };
            let indent = if last_phase { "    " } else { "│   " };
            out.push_str(&format!(
                "{indent}{branch} {} {} {name}\n",
                field("/apiVersion"),
                field("/kind")
            ));
        }
    }
    out
}

fn main() -> ExitCode {
    let args = Args::parse();
    let result = match &args.command {
        Command::Validate(source) => load(source).map(|p| {
            let objects: usize = p.phases.iter().map(|ph| ph.objects.len()).sum();
            format!(
                "Package validated: {} phases, {objects} objects.",
                p.phases.len()
            )
        }),
        Command::Tree(source) => load(source).map(|p| tree(&p)),
    };
    match result {
        Ok(out) => {
            println!("{}", out.trim_end());
            ExitCode::SUCCESS
        }
        Err(Failure::Invalid(message)) => {
            eprintln!("kubectl-package: invalid package: {message}");
            ExitCode::from(1)
        }
        Err(Failure::CannotRun(message)) => {
            eprintln!("kubectl-package: {message}");
            ExitCode::from(2)
        }
    }
}
