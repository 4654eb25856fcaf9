//! `env-startup`: how long the real environment takes to start with N hosted clusters, and how much memory
//! its servers hold once ready.

use std::time::Duration;

use pko_testenv::{EnvConfig, TestEnv};

use crate::rss_kib;

/// Starts the environment `runs` times per hosted-cluster count and prints times and memory.
pub async fn run(hosted_clusters: Vec<usize>, runs: usize) -> std::process::ExitCode {
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
