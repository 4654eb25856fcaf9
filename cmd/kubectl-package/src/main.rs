//! `kubectl-package`: a drop-in for upstream Package Operator's package CLI. `build`, `validate`,
//! `tree` and `update` work on package folders (and images), `rollout history`, `clustertree`, `pause`
//! and `unpause` on installed packages. Commands, flags, messages and exit codes follow upstream's
//! contract (docs/packages.md, "Compatibility with upstream kubectl-package"): results on stdout, one
//! `Error: <message>` line on stderr, exit 0 on success and 1 on any failure.

mod args;
mod build;
mod cluster;
mod fixtures;
mod fleet_snapshot;
mod fleet_status;
mod kickstart;
mod olm_bundle;
mod registry_auth;
mod repository;
mod rollout_control;
mod rollout_diff;
mod rollout_follow;
mod rollout_plan_view;
mod rollout_simulate;
mod tree;
mod validation;

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

use clap::{CommandFactory, Parser};
use pko_package::image::{ImageError, ImageStore};

use args::{
    exact_args, minimum_args, range_args, Cli, Command, FleetCommand, ParseOutcome,
    RepositoryCommand, RolloutCommand,
};

/// What a command prints on success (exactly, no newline added).
type Outcome = Result<String, String>;

fn version_text() -> String {
    format!(
        "pko\tv{}\npath\tkubectl-package\n",
        env!("CARGO_PKG_VERSION")
    )
}

fn help() -> String {
    Cli::command().render_help().to_string()
}

/// The completion script for `shell`.
fn completion(shell: &str) -> Outcome {
    let shell: clap_complete::Shell = shell
        .parse()
        .map_err(|_| format!("unknown command {shell:?} for \"kubectl-package completion\""))?;
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "kubectl-package", &mut script);
    Ok(String::from_utf8_lossy(&script).into_owned())
}

fn on_cluster(command: impl std::future::Future<Output = Outcome>) -> Outcome {
    build::runtime()?.block_on(command)
}

/// `validate --pull IMAGE`.
fn validate_image(image: &str, insecure: bool, plain_http: &[String]) -> Outcome {
    let failed =
        |e: String| format!("validating package: getting package from remote reference: {e}");
    let reference: oci_client::Reference = image
        .parse()
        .map_err(|e| failed(format!("parsing remote reference: {e}")))?;
    let store: ImageStore = build::store(insecure, &[reference.whole()], plain_http);
    let files = match build::runtime()?
        .block_on(store.fetch(&reference.whole(), &registry_auth::auth_for(image)))
    {
        Ok((_, files)) => (*files).clone(),
        // An image without package files is upstream's "empty package" violation.
        Err(ImageError::Empty { .. }) => Default::default(),
        Err(e) => return Err(failed(format!("importing package from image: {e}"))),
    };
    validation::validate_files(&files).map_err(|e| format!("validating package: {e}"))?;
    Ok("Package validated successfully!".to_owned())
}

/// Pulls an OLM bundle image and converts it to plain objects.
fn import_olm_bundle(
    image: &str,
    plain_http: &[String],
) -> Result<(String, Vec<serde_json::Value>), String> {
    let failed = |e: String| format!("kickstarting package: {e}");
    let store = build::store(false, &[], plain_http);
    let files = build::runtime()?
        .block_on(store.fetch_under(image, "", &registry_auth::auth_for(image)))
        .map_err(|e| failed(format!("pull olm bundle: {e}")))?;
    olm_bundle::convert(&files).map_err(failed)
}

fn run(cli: Cli) -> Outcome {
    if cli.version {
        return Ok(format!(
            "kubectl-package version v{}\n",
            env!("CARGO_PKG_VERSION")
        ));
    }
    let kubeconfig = cli.kubeconfig.as_ref();
    let Some(command) = cli.command else {
        return Ok(help());
    };
    match command {
        Command::Build(args) => {
            exact_args(&args.positionals.args, 1)?;
            build::build(&args.positionals.args[0], &args)
        }
        Command::Validate(args) => {
            exact_args(&args.positionals.args, 1)?;
            let target = &args.positionals.args[0];
            if target.is_empty() {
                return Err("arguments invalid: 'target' must not be empty".to_owned());
            }
            if args.pull {
                return validate_image(target, args.insecure, &args.plain_http);
            }
            validation::validate_dir(Path::new(target))
                .map_err(|e| format!("validating package: {e}"))?;
            Ok("Package validated successfully!".to_owned())
        }
        Command::Tree(args) => {
            exact_args(&args.positionals.args, 1)?;
            if args.config_path.is_some() && args.config_testcase.is_some() {
                return Err("if any flags in the group [config-path config-testcase] are set none of the others can be; [config-path config-testcase] were all set".to_owned());
            }
            tree::tree(Path::new(&args.positionals.args[0]), &args)
        }
        Command::Update(args) => {
            exact_args(&args.positionals.args, 1)?;
            build::update(&args.positionals.args[0], args.insecure, &args.plain_http)
        }
        Command::Kickstart(args) => {
            exact_args(&args.positionals.args, 1)?;
            let bundle = if args.olm_bundle.is_empty() {
                None
            } else {
                Some(import_olm_bundle(&args.olm_bundle, &args.plain_http)?)
            };
            kickstart::kickstart(
                &args.positionals.args[0],
                &args.filenames,
                bundle,
                &args.parametrize,
            )
        }
        Command::Version(args) => {
            exact_args(&args.args, 0)?;
            Ok(version_text())
        }
        Command::Completion(args) => {
            exact_args(&args.args, 1)?;
            completion(&args.args[0])
        }
        Command::Rollout { command: None } => Ok(help()),
        Command::Rollout {
            command: Some(RolloutCommand::History(args)),
        } => {
            range_args(&args.positionals.args, 1, 2)?;
            on_cluster(cluster::history(&args, kubeconfig))
        }
        Command::Rollout {
            command: Some(RolloutCommand::Status(args)),
        } => {
            range_args(&args.positionals.args, 1, 2)?;
            on_cluster(rollout_follow::status(&args, kubeconfig))
        }
        Command::Rollout {
            command: Some(RolloutCommand::Plan(args)),
        } => {
            range_args(&args.positionals.args, 1, 2)?;
            on_cluster(rollout_plan_view::plan(&args, kubeconfig))
        }
        Command::Rollout {
            command: Some(RolloutCommand::Simulate(args)),
        } => {
            range_args(&args.positionals.args, 1, 2)?;
            on_cluster(rollout_simulate::simulate(&args, kubeconfig))
        }
        Command::Rollout {
            command: Some(RolloutCommand::Diff(args)),
        } => {
            range_args(&args.positionals.args, 1, 2)?;
            on_cluster(rollout_diff::diff(&args, kubeconfig))
        }
        Command::Rollout {
            command: Some(RolloutCommand::Approve(args)),
        } => {
            range_args(&args.positionals.args, 1, 2)?;
            on_cluster(rollout_control::approve(&args, kubeconfig))
        }
        Command::Rollout {
            command: Some(RolloutCommand::Undo(args)),
        } => {
            range_args(&args.args, 1, 2)?;
            on_cluster(rollout_control::undo(&args, kubeconfig))
        }
        Command::Rollout {
            command: Some(RolloutCommand::Pause(args)),
        } => {
            range_args(&args.args, 1, 2)?;
            on_cluster(rollout_control::set_rollout_paused(&args, true, kubeconfig))
        }
        Command::Rollout {
            command: Some(RolloutCommand::Resume(args)),
        } => {
            range_args(&args.args, 1, 2)?;
            on_cluster(rollout_control::set_rollout_paused(
                &args, false, kubeconfig,
            ))
        }
        Command::Fleet { command: None } => Ok(help()),
        Command::Fleet {
            command: Some(FleetCommand::Status(args)),
        } => {
            range_args(&args.positionals.args, 0, 2)?;
            on_cluster(fleet_status::status(&args))
        }
        Command::Repository { command: None } => Ok(help()),
        Command::Repository {
            command: Some(command),
        } => match command {
            RepositoryCommand::Initialize(a) => {
                exact_args(&a.positionals.args, 2)?;
                repository::init(&a.positionals.args[0], &a.positionals.args[1])
            }
            RepositoryCommand::Add(a) => {
                minimum_args(&a.positionals.args, 3)?;
                let p = &a.positionals.args;
                repository::add(&p[0], &p[1], &p[2..], &a.plain_http)
            }
            RepositoryCommand::Remove(a) => {
                exact_args(&a.positionals.args, 2)?;
                let p = &a.positionals.args;
                repository::remove(&p[0], &p[1], &a.plain_http)
            }
            RepositoryCommand::Pull(a) => {
                exact_args(&a.positionals.args, 2)?;
                let p = &a.positionals.args;
                repository::pull(&p[0], &p[1], &a.plain_http)
            }
            RepositoryCommand::Push(a) => {
                exact_args(&a.positionals.args, 2)?;
                let p = &a.positionals.args;
                repository::push(&p[0], &p[1], &a.plain_http)
            }
        },
        Command::Clustertree(args) => {
            range_args(&args.positionals.args, 1, 2)?;
            on_cluster(cluster::cluster_tree(&args, kubeconfig))
        }
        Command::Pause(args) => {
            range_args(&args.positionals.args, 1, 2)?;
            on_cluster(cluster::set_paused(&args, true, kubeconfig))
        }
        Command::Unpause(args) => {
            range_args(&args.positionals.args, 1, 2)?;
            on_cluster(cluster::set_paused(&args, false, kubeconfig))
        }
    }
}

/// Ctrl-C ends the command as upstream's cancelled command context does: an error line and exit 1, not
/// death by signal.
fn exit_one_on_interrupt() {
    std::thread::spawn(|| {
        let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return;
        };
        if runtime.block_on(tokio::signal::ctrl_c()).is_ok() {
            eprintln!("Error: context canceled");
            std::process::exit(1);
        }
    });
}

fn main() -> ExitCode {
    exit_one_on_interrupt();
    let argv: Vec<String> = std::env::args().collect();
    let outcome = match Cli::try_parse_from(&argv) {
        Ok(cli) => run(cli),
        Err(e) => match args::outcome(&e, &argv) {
            ParseOutcome::Help(text) => Ok(text),
            ParseOutcome::Error(message) => Err(message),
        },
    };
    match outcome {
        Ok(out) => {
            let mut stdout = std::io::stdout();
            // A closed stdout (`| head`) is not the command's failure.
            let _ = stdout
                .write_all(out.as_bytes())
                .and_then(|()| stdout.flush());
            ExitCode::SUCCESS
        }
        Err(message) => {
            eprintln!("Error: {message}");
            ExitCode::from(1)
        }
    }
}
