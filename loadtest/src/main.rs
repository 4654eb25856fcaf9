//! `pko-loadtest`: measurements on the real environment. `env-startup`: start-up time and memory of the
//! environment itself. `object-set`: the object engine against a plain server-side-apply loop, write
//! counts of an unchanged set, and status-change latency. `package`: Package created to Available with a
//! cold and a warm image, and package render time. `hosted-phase`: what a hosted-cluster phase adds over a
//! local one, and objects per second through one connector. `rollout`: HostedClusterPackage hand-off
//! latency, and the manager's CPU time and memory for a fleet of HostedClusters. `sharding`: the same
//! rollout under 1, 2 and 4 sharded replicas, take-over time and the write audit. `restart`: a manager
//! (or one of `--replicas N` sharded replicas) restarting over a settled fleet, and the writes it makes. `chaos`: a seeded
//! schedule of faults at once under continuous releases, judged by an independent observer. `calendar`:
//! what maintenance windows and skips cost a rollout decision. `notifications`: CloudEvents sinks against
//! the JetStream stream they read.

mod addons_bench;
mod apiserver_requests;
mod calendar_bench;
mod chaos;
mod env_startup;
mod fleet_bench;
mod hosted_phase_bench;
mod notification_bench;
mod object_set_bench;
mod package_bench;
mod process_usage;
mod restart_bench;
mod rollout_bench;
mod shard_restart_bench;
mod sharding_bench;

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    #[command(subcommand)]
    command: Measurement,
    /// Managers export every span (sampling 100 %) over OTLP/gRPC to a receiver in this process: run a
    /// measurement with and without it to see what tracing costs.
    #[arg(long, global = true)]
    traces: bool,
}

#[derive(Debug, Subcommand)]
enum Measurement {
    /// Start the environment repeatedly and report start-up times and server memory.
    EnvStartup {
        /// Hosted-cluster counts to measure, comma-separated.
        #[arg(long, value_delimiter = ',', default_values_t = [0usize, 2, 8])]
        hosted_clusters: Vec<usize>,
        /// Starts per count.
        #[arg(long, default_value_t = 3)]
        runs: usize,
    },
    /// ObjectSet of N ConfigMaps in 3 phases vs. a plain server-side-apply loop; zero-write re-reconcile;
    /// latency from an object change to the set's condition.
    ObjectSet {
        /// ConfigMaps in the set.
        #[arg(long, default_value_t = 500)]
        objects: usize,
        /// Status-change round trips to time.
        #[arg(long, default_value_t = 100)]
        latency_samples: usize,
        /// pko-manager binary (default: next to this binary).
        #[arg(long)]
        manager: Option<PathBuf>,
    },
    /// Package created -> Available with an image not yet pulled and with a pulled one; load and render
    /// time of a package of N objects.
    Package {
        /// Packages per case.
        #[arg(long, default_value_t = 5)]
        runs: usize,
        /// Objects in the rendered package.
        #[arg(long, default_value_t = 1000)]
        render_objects: usize,
        /// pko-manager binary (default: next to this binary).
        #[arg(long)]
        manager: Option<PathBuf>,
    },
    /// ObjectSet -> Available for a local vs. a hosted-cluster phase; objects per second through one
    /// connector, via the manager and directly.
    HostedPhase {
        /// Sets per case.
        #[arg(long, default_value_t = 30)]
        runs: usize,
        /// ConfigMaps in the throughput phase.
        #[arg(long, default_value_t = 500)]
        objects: usize,
        /// pko-manager binary (default: next to this binary; pko-connector must be next to it).
        #[arg(long)]
        manager: Option<PathBuf>,
    },
    /// HostedClusterPackage rollouts: hand-off latency from one Package turning live (Available=True and
    /// Progressing=False) to the next one's update (maxUnavailable 1); manager CPU time and memory for a
    /// fleet of HostedClusters.
    Rollout {
        /// HostedClusters in the hand-off fleet.
        #[arg(long, default_value_t = 30)]
        handoff_clusters: usize,
        /// Rollouts across the hand-off fleet.
        #[arg(long, default_value_t = 4)]
        rollouts: usize,
        /// HostedClusters in the fleet whose cost is measured; several sizes, comma-separated, each in a
        /// fresh environment (e.g. 250,500,1000,2000).
        #[arg(long, value_delimiter = ',', default_values_t = [500usize])]
        fleet: Vec<usize>,
        /// Rolling updates of the measured fleet, one release after another (each printed: an
        /// archived revision must cost next to nothing, so memory stays flat across releases).
        #[arg(long, default_value_t = 1)]
        fleet_releases: usize,
        /// Each release of the measured fleet changes every rendered object (the image in each
        /// ConfigMap): new revisions everywhere, and a preflight that dry-runs every object. Without,
        /// a release changes only the image, which renders the same objects.
        #[arg(long)]
        changing_releases: bool,
        /// Many add-ons on every hosted cluster instead: N HostedClusterPackages of different packages
        /// over each `--fleet` size, one N per size or one for all (e.g. `--fleet 500,500,1000,2000
        /// --addons 1,10,10,5`); creation, settled memory per Package, an instant and a rolling
        /// release, label churn and a restart, then a table.
        #[arg(long, value_delimiter = ',')]
        addons: Vec<usize>,
        /// pko-manager binary (default: next to this binary).
        #[arg(long)]
        manager: Option<PathBuf>,
    },
    /// A manager restarting over a settled fleet: time to ready and until every object is reconciled
    /// again, its CPU, and the writes the apiserver served meanwhile (none expected).
    Restart {
        /// HostedClusters in the fleet, their Packages live.
        #[arg(long, default_value_t = 1000)]
        hosted_clusters: usize,
        /// Sharded replicas working on the fleet; with more than one, a replica that does not
        /// coordinate restarts.
        #[arg(long, default_value_t = 1)]
        replicas: usize,
        /// Sharded replicas named per process (no --member-name), as before member names: the
        /// restarted replica is a new member and keys move.
        #[arg(long)]
        member_per_process: bool,
        /// pko-manager binary (default: next to this binary; pko-connector must be next to it).
        #[arg(long)]
        manager: Option<PathBuf>,
    },
    /// Sharded managers: a fleet's rollout under 1, 2 and 4 `--sharding` replicas (CPU and memory per
    /// replica, wall time), take-over time after a replica is killed, and keys written by two replicas.
    Sharding {
        /// HostedClusters in the fleet.
        #[arg(long, default_value_t = 1000)]
        hosted_clusters: usize,
        /// Replica counts to measure, comma-separated.
        #[arg(long, value_delimiter = ',', default_values_t = [1usize, 2, 4])]
        replicas: Vec<usize>,
        /// pko-manager binary (default: next to this binary; pko-connector must be next to it).
        #[arg(long)]
        manager: Option<PathBuf>,
    },
    /// A fleet of management clusters (an apiserver, NATS leaf and manager each, under a hub NATS)
    /// rolling one release canary → prod behind a promotion gate: end-to-end time against the waits that
    /// are not pko's, the hub's event lag, and the hub's catch-up after an outage.
    Fleet {
        /// Management clusters (the first is the canary).
        #[arg(long, default_value_t = 10)]
        clusters: usize,
        /// Simulated HostedClusters per management cluster.
        #[arg(long, default_value_t = 100)]
        hosted_clusters: usize,
        /// The rollouts' maxUnavailable.
        #[arg(long, default_value_t = 10)]
        max_unavailable: usize,
        /// Seconds a workload takes to report ready after a change.
        #[arg(long, default_value_t = 5)]
        readiness_lag_seconds: u64,
        /// Seconds prod waits after the canary settled.
        #[arg(long, default_value_t = 30)]
        soak_seconds: u64,
        /// Seconds the hub is down during the canary's next rollout.
        #[arg(long, default_value_t = 60)]
        outage_seconds: u64,
        /// pko-manager binary (default: next to this binary).
        #[arg(long)]
        manager: Option<PathBuf>,
    },
    /// Two management clusters of sharded replicas under a hub NATS, releases every 30 s (some broken on
    /// the canary), and a seeded schedule of faults at once; an independent observer judges the rollout
    /// invariants, the write audit, the hub's event stream and convergence. A seed replays its schedule.
    Chaos {
        /// The schedule's seed.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Minutes of faults (then a final release and convergence).
        #[arg(long, default_value_t = 3.0)]
        minutes: f64,
        /// HostedClusters per management cluster.
        #[arg(long, default_value_t = 6)]
        clusters: usize,
        /// Each replica under a member name of its own (`--member-name`), as deploy/manager-sharded
        /// runs them: a killed or stopped replica comes back under its name.
        #[arg(long)]
        member_names: bool,
        /// pko-manager binary (default: next to this binary).
        #[arg(long)]
        manager: Option<PathBuf>,
    },
    /// What maintenance windows and skips cost a rollout decision: `decide_rollout` over fleets of N
    /// HostedClusters with and without a calendar (no servers).
    Calendar {
        /// Fleet sizes, comma-separated.
        #[arg(long, value_delimiter = ',', default_values_t = [500usize, 2000])]
        hosted_clusters: Vec<usize>,
        /// Decisions per case (the median is printed).
        #[arg(long, default_value_t = 21)]
        runs: usize,
    },
    /// CloudEvents sinks: N rollout events into JetStream through the manager's outbox, against their
    /// delivery to a local HTTP receiver by the manager's sink, and the catch-up after an outage.
    Notifications {
        /// Events per batch.
        #[arg(long, default_value_t = 2000)]
        events: usize,
    },
}

/// A measurement's outcome as the exit code, printing why it failed.
fn outcome(result: Result<(), String>) -> std::process::ExitCode {
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("pko-loadtest: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    object_set_bench::TRACES.store(args.traces, std::sync::atomic::Ordering::Relaxed);
    let code = match args.command {
        Measurement::EnvStartup {
            hosted_clusters,
            runs,
        } => env_startup::run(hosted_clusters, runs).await,
        Measurement::ObjectSet {
            objects,
            latency_samples,
            manager,
        } => object_set_bench::run(objects, latency_samples, manager).await,
        Measurement::Package {
            runs,
            render_objects,
            manager,
        } => package_bench::run(runs, render_objects, manager).await,
        Measurement::HostedPhase {
            runs,
            objects,
            manager,
        } => hosted_phase_bench::run(runs, objects, manager).await,
        Measurement::Rollout {
            fleet,
            addons,
            manager,
            ..
        } if !addons.is_empty() => match addons_bench::shapes(&fleet, &addons) {
            Ok(shapes) => outcome(addons_bench::measure(shapes, manager).await),
            Err(e) => outcome(Err(e)),
        },
        Measurement::Rollout {
            handoff_clusters,
            rollouts,
            fleet,
            fleet_releases,
            changing_releases,
            manager,
            ..
        } => {
            let releases = rollout_bench::Releases {
                count: fleet_releases,
                changing: changing_releases,
            };
            rollout_bench::run(handoff_clusters, rollouts, fleet, releases, manager).await
        }
        Measurement::Restart {
            hosted_clusters,
            replicas,
            member_per_process,
            manager,
        } if replicas > 1 => {
            let topology = shard_restart_bench::Topology {
                replicas,
                member_per_process,
            };
            shard_restart_bench::run(hosted_clusters, topology, manager).await
        }
        Measurement::Restart {
            hosted_clusters,
            manager,
            ..
        } => restart_bench::run(hosted_clusters, manager).await,
        Measurement::Sharding {
            hosted_clusters,
            replicas,
            manager,
        } => sharding_bench::run(hosted_clusters, replicas, manager).await,
        Measurement::Fleet {
            clusters,
            hosted_clusters,
            max_unavailable,
            readiness_lag_seconds,
            soak_seconds,
            outage_seconds,
            manager,
        } => {
            fleet_bench::run(fleet_bench::FleetBench {
                clusters,
                hosted_clusters,
                max_unavailable,
                readiness_lag: Duration::from_secs(readiness_lag_seconds),
                soak: Duration::from_secs(soak_seconds),
                outage: Duration::from_secs(outage_seconds),
                manager,
            })
            .await
        }
        Measurement::Chaos {
            seed,
            minutes,
            clusters,
            member_names,
            manager,
        } => {
            chaos::run(chaos::ChaosRun {
                seed,
                minutes,
                clusters,
                member_names,
                manager,
            })
            .await
        }
        Measurement::Calendar {
            hosted_clusters,
            runs,
        } => outcome(calendar_bench::run(&hosted_clusters, runs)),
        Measurement::Notifications { events } => outcome(notification_bench::run(events).await),
    };
    if let Some(spans) = object_set_bench::spans_received() {
        println!("traces: {spans} spans received over OTLP/gRPC");
    }
    code
}

/// Resident memory of a process in KiB (0 if it is gone).
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("VmRSS:"))
                .and_then(|value| value.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}
