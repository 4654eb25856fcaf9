//! The command line, as upstream's `kubectl-package` (cobra/pflag) takes it: every command, flag and
//! argument count, and the wording of usage errors. Positional arguments are collected loosely and
//! counted here, so a wrong count gets cobra's message instead of clap's.

use std::path::PathBuf;

use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::{Args as ClapArgs, Parser, Subcommand};

/// The root command. Global flags are accepted by every command.
#[derive(Debug, Parser)]
#[command(
    name = "kubectl-package",
    about = "Package Operator package CLI: build, validate and inspect packages",
    disable_version_flag = true
)]
pub struct Cli {
    /// kubeconfig for the cluster commands (rollout, clustertree, pause, unpause).
    #[arg(long, global = true)]
    pub kubeconfig: Option<PathBuf>,
    /// Accepted for compatibility with upstream's logging flags; pko logs nothing by default.
    #[command(flatten)]
    pub zap: ZapFlags,
    /// Print the version.
    #[arg(short = 'v', long = "version")]
    pub version: bool,
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// controller-runtime's log flags, which upstream's binary accepts everywhere.
#[derive(Debug, ClapArgs)]
pub struct ZapFlags {
    #[arg(long = "zap-devel", global = true, num_args = 0..=1, require_equals = true, default_missing_value = "true", hide = true)]
    pub devel: Option<bool>,
    #[arg(long = "zap-encoder", global = true, hide = true)]
    pub encoder: Option<String>,
    #[arg(long = "zap-log-level", global = true, hide = true)]
    pub log_level: Option<String>,
    #[arg(long = "zap-stacktrace-level", global = true, hide = true)]
    pub stacktrace_level: Option<String>,
    #[arg(long = "zap-time-encoding", global = true, hide = true)]
    pub time_encoding: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Build a package image from a folder; validates it first.
    Build(BuildArgs),
    /// Validate a package folder or, with --pull, a package image.
    Validate(ValidateArgs),
    /// Print the phases and objects a package renders to.
    Tree(TreeArgs),
    /// Resolve the digests of the manifest's images into manifest.lock.yaml.
    Update(UpdateArgs),
    /// Create a package folder from existing Kubernetes objects (experimental).
    Kickstart(KickstartArgs),
    /// Print version information.
    Version(Positionals),
    /// Inspect and follow the rollouts of HostedClusterPackages, (Cluster)Packages and (Cluster)ObjectDeployments.
    #[command(subcommand_required = false, arg_required_else_help = true)]
    Rollout {
        #[command(subcommand)]
        command: Option<RolloutCommand>,
    },
    /// Print the phases and objects of an installed (Cluster)Package.
    Clustertree(ClusterTreeArgs),
    /// The fleet of management clusters, from its hub NATS.
    #[command(subcommand_required = false, arg_required_else_help = true)]
    Fleet {
        #[command(subcommand)]
        command: Option<FleetCommand>,
    },
    /// Manage a package repository index and its image.
    #[command(
        alias = "repo",
        subcommand_required = false,
        arg_required_else_help = true
    )]
    Repository {
        #[command(subcommand)]
        command: Option<RepositoryCommand>,
    },
    /// Print a shell completion script: bash, zsh, fish or powershell.
    Completion(Positionals),
    /// Pause a (Cluster)Package: pko stops reconciling its objects.
    Pause(PauseArgs),
    /// Unpause a (Cluster)Package.
    Unpause(PauseArgs),
}

#[derive(Debug, Subcommand)]
pub enum RolloutCommand {
    /// List the revisions (ObjectSets) of a (Cluster)Package or (Cluster)ObjectDeployment.
    History(HistoryArgs),
    /// Show where a HostedClusterPackage, (Cluster)Package or (Cluster)ObjectDeployment rollout stands and
    /// follow it until it finishes (exit 0), fails, or times out.
    Status(RolloutStatusArgs),
    /// Show the next steps of a HostedClusterPackage rollout: groups in order, the next wave, and why the
    /// other Packages wait (the manager's own planner).
    Plan(RolloutPlanArgs),
    /// Show what a HostedClusterPackage release changes where: its preflight's groups of identical
    /// change, each with its unified diffs and the apiserver's dry-run verdicts.
    Diff(RolloutDiffArgs),
    /// Run the manager's own planner offline over a HostedClusterPackage's fleet: the waves, time per
    /// group and in total, the peak of unavailable Packages, where approvals and soaks wait, and what a
    /// failure would halt or roll back.
    Simulate(RolloutSimulateArgs),
    /// Approve a group of a HostedClusterPackage rollout for its current template (pko rollout policy).
    Approve(RolloutApproveArgs),
    /// Halt a HostedClusterPackage's current template and roll every Package back to the last template
    /// that finished rolling out everywhere.
    Undo(Positionals),
    /// Pause a HostedClusterPackage rollout (spec.paused): nothing is created or updated.
    Pause(Positionals),
    /// Resume a paused HostedClusterPackage rollout.
    Resume(Positionals),
}

#[derive(Debug, ClapArgs)]
pub struct RolloutApproveArgs {
    #[command(flatten)]
    pub positionals: Positionals,
    /// The partition group to approve (`unknown` for the unknown group or a rollout without partitions).
    #[arg(
        long,
        required_unless_present = "preflight",
        conflicts_with = "preflight"
    )]
    pub group: Option<String>,
    /// Accept the refusals the preflight of the current template found, and let the rollout go on.
    #[arg(long)]
    pub preflight: bool,
    /// Refuse unless the rollout's current template has this hash (the one reviewed).
    #[arg(long)]
    pub template_hash: Option<String>,
    /// Refuse unless the preflight of the current template found this change (the digest reviewed
    /// with `rollout diff`).
    #[arg(long)]
    pub preflight_digest: Option<String>,
    /// Approve the group for the template whatever change its preflight finds (without one, the
    /// approval names the preflight's digest and counts only for that change).
    #[arg(long, conflicts_with_all = ["preflight", "preflight_digest"])]
    pub any_change: bool,
}

#[derive(Debug, ClapArgs)]
pub struct RolloutStatusArgs {
    #[command(flatten)]
    pub positionals: Positionals,
    #[arg(short = 'n', long, default_value = "")]
    pub namespace: String,
    /// Follow the rollout until it ends (default: when stdout is a terminal).
    #[arg(short = 'w', long, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub watch: Option<bool>,
    /// Give up after this long (30s, 5m, 1h); 0 waits forever.
    #[arg(long, default_value = "0")]
    pub timeout: String,
    /// Follow a HostedClusterPackage on the rollout event stream of this NATS server instead of the
    /// apiserver.
    #[arg(long)]
    pub nats_url: Option<String>,
    /// NATS credentials file for --nats-url.
    #[arg(long)]
    pub nats_creds: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum FleetCommand {
    /// Every management cluster's rollout of HostedClusterPackages (all, or `hostedclusterpackage NAME`):
    /// template, partition, counts, promotion gate, age of the last event and of the report.
    Status(FleetStatusArgs),
}

#[derive(Debug, ClapArgs)]
pub struct FleetStatusArgs {
    #[command(flatten)]
    pub positionals: Positionals,
    /// The fleet's hub NATS.
    #[arg(long)]
    pub nats_url: String,
    /// NATS credentials file for --nats-url.
    #[arg(long)]
    pub nats_creds: Option<PathBuf>,
    /// Print the table again whenever a management cluster reports, until interrupted.
    #[arg(short = 'w', long)]
    pub watch: bool,
}

#[derive(Debug, ClapArgs)]
pub struct RolloutPlanArgs {
    #[command(flatten)]
    pub positionals: Positionals,
}

#[derive(Debug, ClapArgs)]
pub struct RolloutSimulateArgs {
    #[command(flatten)]
    pub positionals: Positionals,
    /// Simulate the fleet saved in this file instead of the cluster's.
    #[arg(long, conflicts_with = "save")]
    pub snapshot: Option<PathBuf>,
    /// Save the cluster's fleet to this file (for --snapshot) and stop.
    #[arg(long)]
    pub save: Option<PathBuf>,
    /// How long a written Package takes to be live (30s, 5m). Default: from the rollout event
    /// stream's history with --nats-url, else 30s.
    #[arg(long)]
    pub readiness: Option<String>,
    /// Read readiness times from the rollout event stream of this NATS server.
    #[arg(long)]
    pub nats_url: Option<String>,
    /// NATS credentials file for --nats-url.
    #[arg(long)]
    pub nats_creds: Option<PathBuf>,
    /// Updates that fail: `clusters=NAME,...` (HostedCluster names or HCP namespaces).
    #[arg(long)]
    pub fail: Vec<String>,
    /// Every other update fails with this probability (0 to 1).
    #[arg(long, default_value_t = 0.0)]
    pub fail_rate: f64,
    /// Seed of the --fail-rate draws: the same seed, the same story.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Policy to simulate instead of the object's: maxUnavailable=20%, minSuccessTime=10m,
    /// progressDeadline=15m, maxFailures=1, rollback=Automatic (repeatable).
    #[arg(long)]
    pub policy: Vec<String>,
    /// Do not approve groups that require it: the simulation ends where one waits.
    #[arg(long)]
    pub no_approve: bool,
    /// `json` for the simulation as data.
    #[arg(short = 'o', long, default_value = "")]
    pub output: String,
}

#[derive(Debug, ClapArgs)]
pub struct RolloutDiffArgs {
    #[command(flatten)]
    pub positionals: Positionals,
    /// `json` for the whole report as the manager keeps it.
    #[arg(short = 'o', long, default_value = "")]
    pub output: String,
    /// Ask the manager for a new preflight first, and wait for it.
    #[arg(long)]
    pub refresh: bool,
    /// With --refresh: give up after this long (30s, 5m).
    #[arg(long, default_value = "5m")]
    pub timeout: String,
}

#[derive(Debug, Subcommand)]
pub enum RepositoryCommand {
    /// Start an empty index: FILE NAME.
    #[command(alias = "init")]
    Initialize(RepositoryArgs),
    /// Add a package image's versions: FILE PKGREF VERSION...
    Add(RepositoryArgs),
    /// Remove a package image: FILE PKGREF.
    Remove(RepositoryArgs),
    /// Write the index held by an image to FILE: FILE TAG.
    Pull(RepositoryArgs),
    /// Push FILE as an index image: FILE TAG.
    Push(RepositoryArgs),
}

#[derive(Debug, ClapArgs)]
pub struct RepositoryArgs {
    #[command(flatten)]
    pub positionals: Positionals,
    /// pko: registries reached over plain HTTP, comma-separated hosts.
    #[arg(long = "plain-http", value_delimiter = ',')]
    pub plain_http: Vec<String>,
}

/// Positional arguments, counted by the command.
#[derive(Debug, ClapArgs)]
pub struct Positionals {
    #[arg(num_args = 0.., value_name = "ARGS")]
    pub args: Vec<String>,
}

/// `build`. Bool flags take pflag's forms: `--f`, `--f=true`, `--f=false`.
#[derive(Debug, ClapArgs)]
pub struct BuildArgs {
    #[command(flatten)]
    pub positionals: Positionals,
    /// Image references to tag the package with (repeatable, comma-separated).
    #[arg(short = 't', long = "tag", value_delimiter = ',', action = clap::ArgAction::Append)]
    pub tags: Vec<String>,
    /// Write the image as a tar file (docker-save and OCI layout).
    #[arg(short = 'o', long = "output", default_value = "")]
    pub output: String,
    /// Push the image to every tag.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false")]
    pub push: bool,
    /// Plain HTTP to the registries involved (pushes and lock-digest lookups).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false")]
    pub insecure: bool,
    /// human or digest.
    #[arg(long = "output-format", default_value = "human")]
    pub output_format: String,
    /// Labels for the image config, key=value (repeatable).
    #[arg(short = 'l', long = "label", action = clap::ArgAction::Append)]
    pub labels: Vec<String>,
    /// pko: registries reached over plain HTTP, comma-separated hosts.
    #[arg(long = "plain-http", value_delimiter = ',')]
    pub plain_http: Vec<String>,
}

#[derive(Debug, ClapArgs)]
pub struct ValidateArgs {
    #[command(flatten)]
    pub positionals: Positionals,
    /// Validate the package image TARGET names instead of a folder.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false")]
    pub pull: bool,
    /// Plain HTTP to the registry (with --pull).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false")]
    pub insecure: bool,
    /// pko: registries reached over plain HTTP, comma-separated hosts.
    #[arg(long = "plain-http", value_delimiter = ',')]
    pub plain_http: Vec<String>,
}

#[derive(Debug, ClapArgs)]
pub struct TreeArgs {
    #[command(flatten)]
    pub positionals: Positionals,
    /// Render as a ClusterPackage.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false")]
    pub cluster: bool,
    /// Config file (YAML or JSON) to render with.
    #[arg(long = "config-path")]
    pub config_path: Option<String>,
    /// Test case of the manifest's test.template to render with.
    #[arg(long = "config-testcase")]
    pub config_testcase: Option<String>,
    /// Accepted and ignored, as upstream does: tree shows the root package.
    #[arg(long)]
    pub component: Option<String>,
}

#[derive(Debug, ClapArgs)]
pub struct UpdateArgs {
    #[command(flatten)]
    pub positionals: Positionals,
    /// Plain HTTP to the registries of the manifest's images.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false")]
    pub insecure: bool,
    /// pko: registries reached over plain HTTP, comma-separated hosts.
    #[arg(long = "plain-http", value_delimiter = ',')]
    pub plain_http: Vec<String>,
}

#[derive(Debug, ClapArgs)]
pub struct KickstartArgs {
    #[command(flatten)]
    pub positionals: Positionals,
    /// Objects to import: a file, directory, glob, `-` (stdin) or http(s) URL (repeatable).
    #[arg(short = 'f', long = "filename", value_delimiter = ',', action = clap::ArgAction::Append)]
    pub filenames: Vec<String>,
    /// An OLM registry+v1 bundle image to import; its package name names the manifest.
    #[arg(short = 'b', long = "olm-bundle", default_value = "")]
    pub olm_bundle: String,
    /// Fields to turn into config: namespaces, replicas, tolerations, nodeselectors, resources, env,
    /// images, all (repeatable).
    #[arg(short = 'p', long = "parametrize", value_delimiter = ',', action = clap::ArgAction::Append)]
    pub parametrize: Vec<String>,
    /// pko: registries reached over plain HTTP, comma-separated hosts.
    #[arg(long = "plain-http", value_delimiter = ',')]
    pub plain_http: Vec<String>,
}

#[derive(Debug, ClapArgs)]
pub struct HistoryArgs {
    #[command(flatten)]
    pub positionals: Positionals,
    #[arg(short = 'n', long, default_value = "")]
    pub namespace: String,
    /// json or yaml; a table without it.
    #[arg(short = 'o', long, default_value = "")]
    pub output: String,
    /// Print only this revision.
    #[arg(long, default_value = "0", allow_negative_numbers = true)]
    pub revision: i64,
}

#[derive(Debug, ClapArgs)]
pub struct ClusterTreeArgs {
    #[command(flatten)]
    pub positionals: Positionals,
    #[arg(short = 'n', long, default_value = "")]
    pub namespace: String,
}

#[derive(Debug, ClapArgs)]
pub struct PauseArgs {
    #[command(flatten)]
    pub positionals: Positionals,
    #[arg(short = 'n', long, default_value = "default")]
    pub namespace: String,
    /// Why the package is paused (pause only; kept in an annotation).
    #[arg(short = 'm', long, default_value = "")]
    pub message: String,
}

/// Cobra's check of a command's positional count; its wording.
pub fn exact_args(args: &[String], n: usize) -> Result<(), String> {
    if args.len() == n {
        Ok(())
    } else {
        Err(format!("accepts {n} arg(s), received {}", args.len()))
    }
}

/// Cobra's `MinimumNArgs` check.
pub fn minimum_args(args: &[String], n: usize) -> Result<(), String> {
    if args.len() >= n {
        Ok(())
    } else {
        Err(format!(
            "requires at least {n} arg(s), only received {}",
            args.len()
        ))
    }
}

/// Cobra's `RangeArgs` check.
pub fn range_args(args: &[String], min: usize, max: usize) -> Result<(), String> {
    if (min..=max).contains(&args.len()) {
        Ok(())
    } else {
        Err(format!(
            "accepts between {min} and {max} arg(s), received {}",
            args.len()
        ))
    }
}

/// What clap's parse failure becomes: text for stdout with exit 0 (help), or a cobra-worded error.
pub enum ParseOutcome {
    Help(String),
    Error(String),
}

/// Maps clap's error to what upstream's binary prints for the same mistake.
pub fn outcome(error: &clap::Error, argv: &[String]) -> ParseOutcome {
    let context = |kind: ContextKind| match error.get(kind) {
        Some(ContextValue::String(s)) => s.clone(),
        Some(ContextValue::Strings(s)) => s.join(" "),
        _ => String::new(),
    };
    match error.kind() {
        ErrorKind::DisplayHelp
        | ErrorKind::DisplayVersion
        | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
        | ErrorKind::MissingSubcommand => ParseOutcome::Help(error.render().to_string()),
        ErrorKind::InvalidSubcommand => ParseOutcome::Error(format!(
            "unknown command \"{}\" for \"kubectl-package\"\nRun 'kubectl-package --help' for usage.",
            context(ContextKind::InvalidSubcommand)
        )),
        ErrorKind::UnknownArgument => {
            let arg = context(ContextKind::InvalidArg);
            ParseOutcome::Error(unknown_flag(&arg, argv))
        }
        ErrorKind::InvalidValue | ErrorKind::NoEquals
            if context(ContextKind::InvalidValue).is_empty() =>
        {
            let flag = flag_name(&context(ContextKind::InvalidArg));
            ParseOutcome::Error(format!("flag needs an argument: {flag}"))
        }
        ErrorKind::InvalidValue | ErrorKind::ValueValidation => {
            let flag = flag_name(&context(ContextKind::InvalidArg));
            let value = context(ContextKind::InvalidValue);
            let why = match flag.as_str() {
                "--revision" => format!("strconv.ParseInt: parsing {value:?}: invalid syntax"),
                _ => format!("strconv.ParseBool: parsing {value:?}: invalid syntax"),
            };
            ParseOutcome::Error(format!(
                "invalid argument {value:?} for \"{flag}\" flag: {why}"
            ))
        }
        _ => ParseOutcome::Error(
            error
                .render()
                .to_string()
                .lines()
                .next()
                .unwrap_or_default()
                .trim_start_matches("error: ")
                .to_owned(),
        ),
    }
}

/// `--tag <TAG>` (clap's rendering) → `--tag`.
fn flag_name(rendered: &str) -> String {
    rendered
        .split([' ', '='])
        .next()
        .unwrap_or_default()
        .to_owned()
}

/// pflag's message for a flag it does not know: the long form as given, or the first unknown letter of a
/// short group.
fn unknown_flag(arg: &str, argv: &[String]) -> String {
    if let Some(long) = arg.strip_prefix("--") {
        let name = long.split('=').next().unwrap_or(long);
        return format!("unknown flag: --{name}");
    }
    let letter = arg.trim_start_matches('-').chars().next().unwrap_or('-');
    let group = argv
        .iter()
        .find(|a| a.starts_with('-') && !a.starts_with("--") && a.contains(letter))
        .cloned()
        .unwrap_or_else(|| format!("-{letter}"));
    format!("unknown shorthand flag: '{letter}' in {group}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(argv: &[&str]) -> Result<Cli, String> {
        let argv: Vec<String> = std::iter::once("kubectl-package")
            .chain(argv.iter().copied())
            .map(str::to_owned)
            .collect();
        Cli::try_parse_from(&argv).map_err(|e| match outcome(&e, &argv) {
            ParseOutcome::Help(_) => "help".to_owned(),
            ParseOutcome::Error(m) => m,
        })
    }

    #[test]
    fn flags_parse_as_pflag_does() {
        let Some(Command::Build(build)) = parse(&["build", "-t", "a,b", "-tc", "--push", "dir"])
            .unwrap()
            .command
        else {
            panic!("not build")
        };
        assert_eq!(build.tags, ["a", "b", "c"]);
        assert!(build.push);
        assert_eq!(build.positionals.args, ["dir"]);
        let Some(Command::Build(build)) = parse(&["build", "--push=false", "dir"]).unwrap().command
        else {
            panic!("not build")
        };
        assert!(!build.push);
        // `--push false`: `false` is a positional argument.
        let Some(Command::Build(build)) = parse(&["build", "--push", "false"]).unwrap().command
        else {
            panic!("not build")
        };
        assert_eq!(build.positionals.args, ["false"]);
    }

    #[test]
    fn usage_errors_use_cobra_wording() {
        assert_eq!(
            parse(&["build", "--nope", "x"]).unwrap_err(),
            "unknown flag: --nope"
        );
        assert_eq!(
            parse(&["build", "--output /some/dir"]).unwrap_err(),
            "unknown flag: --output /some/dir"
        );
        assert_eq!(
            parse(&["tree", "-x", "dir"]).unwrap_err(),
            "unknown shorthand flag: 'x' in -x"
        );
        assert_eq!(
            parse(&["build", "--tag"]).unwrap_err(),
            "flag needs an argument: --tag"
        );
        assert_eq!(
            parse(&["rollout", "history", "--revision", "x"]).unwrap_err(),
            "invalid argument \"x\" for \"--revision\" flag: strconv.ParseInt: parsing \"x\": invalid syntax"
        );
        assert_eq!(
            parse(&["nope"]).unwrap_err(),
            "unknown command \"nope\" for \"kubectl-package\"\nRun 'kubectl-package --help' for usage."
        );
        assert_eq!(parse(&["--help"]).unwrap_err(), "help");
        assert_eq!(
            exact_args(&[], 1).unwrap_err(),
            "accepts 1 arg(s), received 0"
        );
        assert_eq!(
            range_args(&["a".into(), "b".into(), "c".into()], 1, 2).unwrap_err(),
            "accepts between 1 and 2 arg(s), received 3"
        );
    }
}
