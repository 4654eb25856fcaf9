//! `pko-loadtest`: fleet-scale measurements. `env-startup` measures how long the real environment takes to
//! start with N hosted clusters, and how much memory its servers hold once ready — the fixed cost every
//! integration test binary, the dev environment and the fleet simulations pay.

use std::time::Duration;

use clap::{Parser, Subcommand};
use pko_testenv::{EnvConfig, TestEnv};

#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    #[command(subcommand)]
    command: Measurement,
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
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let Measurement::EnvStartup {
        hosted_clusters,
        runs,
    } = Args::parse().command;
    println!("env-startup: {runs} start(s) per row, times in seconds (min / median / max), RSS once ready");
    println!(
        "{:>7} {:>20} {:>20} {:>20} {:>20} {:>12}",
        "hosted", "total", "apiservers", "etcd+nats+registry", "controller-mgr", "RSS MiB"
    );
    for count in hosted_clusters {
        let mut samples = Vec::new();
        for _ in 0..runs.max(1) {
            let env = match TestEnv::start(EnvConfig {
                hosted_clusters: count,
                controller_manager: true,
            })
            .await
            {
                Ok(env) => env,
                Err(error) => {
                    eprintln!("pko-loadtest: environment with {count} hosted clusters failed to start: {error}");
                    return std::process::ExitCode::FAILURE;
                }
            };
            let timings = env.timings().clone();
            let rss: u64 = env.processes().iter().map(|(_, pid)| rss_kib(*pid)).sum();
            samples.push((timings, rss));
        }
        let column = |pick: &dyn Fn(&pko_testenv::StartupTimings) -> Duration| {
            let mut values: Vec<f64> = samples.iter().map(|(t, _)| pick(t).as_secs_f64()).collect();
            values.sort_by(f64::total_cmp);
            format!(
                "{:.1} / {:.1} / {:.1}",
                values[0],
                values[values.len() / 2],
                values[values.len() - 1]
            )
        };
        let mut rss: Vec<u64> = samples.iter().map(|(_, rss)| rss / 1024).collect();
        rss.sort_unstable();
        println!(
            "{:>7} {:>20} {:>20} {:>20} {:>20} {:>12}",
            count,
            column(&|t| t.total),
            column(&|t| t.apiservers),
            column(&|t| t.etcd.max(t.nats).max(t.registry)),
            column(&|t| t.controller_manager),
            rss[rss.len() / 2],
        );
    }
    std::process::ExitCode::SUCCESS
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
