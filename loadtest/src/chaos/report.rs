//! The end of a chaos run: what the apiservers' audit logs, the NATS streams and the clusters' objects
//! say, and the memory and watch figures. Each check returns its findings (violations) and prints its
//! figures.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{DynamicObject, ListParams};
use kube::{Api, Client};
use pko_proto::core::hosted_cluster_package::HostedClusterPackage;
use pko_proto::core::object_set::ObjectSet;
use pko_proto::fleet::AGGREGATE_STREAM;
use pko_proto::rollout_events::STREAM;
use pko_proto::well_known::SHARD_OWNER_LABEL;
use pko_testenv::workload::widget_resource;
use pko_testenv::{wait_until, ApiServer, FleetNats};

use crate::apiserver_requests::apiserver_metrics;
use crate::chaos::event_stream::stream_findings;
use crate::chaos::faults::RssSample;
use crate::chaos::topology::{ClusterUnderTest, CLUSTERS, NAME};
use crate::fleet_bench::stored;

/// How long deletions may still take at the end (namespaces, ObjectSets' finalizers).
const CLEANUP_BOUND: Duration = Duration::from_secs(120);

/// Keys written by two replicas within one tenure, per apiserver.
pub fn double_writers(servers: &[&ApiServer]) -> Result<Vec<String>, String> {
    let mut findings = Vec::new();
    for server in servers {
        let audit =
            pko_testenv::shard_write_audit(&server.audit_log_path()).map_err(|e| e.to_string())?;
        println!(
            "{}: {} audited writes ({} too close to a label write to place), keys written by two \
             replicas in one tenure: {}",
            server.name(),
            audit.writes,
            audit.unplaced,
            audit.overlaps.len()
        );
        findings.extend(
            audit
                .overlaps
                .iter()
                .map(|o| format!("double writer at {}: {o}", server.name())),
        );
    }
    Ok(findings)
}

/// Every event each cluster stored, once and in order at the hub.
pub async fn event_stream(nats: &FleetNats) -> Result<Vec<String>, String> {
    let mut own = BTreeMap::new();
    for name in CLUSTERS {
        let leaf = nats.leaf(name).ok_or("no NATS leaf")?;
        let ids = stored(leaf, STREAM).await?.into_iter().map(|m| m.id);
        own.insert(name.to_owned(), ids.collect::<Vec<_>>());
    }
    // Filed by the cluster the hub took each from: an event's own `source` is the sender's word.
    let at_hub: Vec<(String, String)> = stored(nats.hub(), AGGREGATE_STREAM)
        .await?
        .into_iter()
        .map(|m| (m.origin.unwrap_or_default(), m.id))
        .collect();
    println!(
        "rollout events: {} at the hub, {} in the clusters' own streams",
        at_hub.len(),
        own.values().map(Vec::len).sum::<usize>()
    );
    Ok(stream_findings(&own, &at_hub)
        .into_iter()
        .map(|f| format!("event stream: {f}"))
        .collect())
}

/// What is left behind, once deletions had `CLEANUP_BOUND` to finish: namespaces of deleted
/// HostedClusters still there, ObjectSets stuck in deletion, Widgets no existing ObjectSet controls.
pub async fn leftovers(clusters: &[ClusterUnderTest<'_>]) -> Result<Vec<String>, String> {
    let mut findings = Vec::new();
    for cluster in clusters {
        let client = cluster.server.client().await.map_err(|e| e.to_string())?;
        let left = wait_until(
            &format!("{}: nothing left behind", cluster.name),
            CLEANUP_BOUND,
            || async {
                match left_behind(&client, &cluster.deleted).await {
                    Ok(left) if left.is_empty() => Ok(left),
                    Ok(left) => Err(left.join("; ")),
                    Err(e) => Err(e),
                }
            },
        )
        .await;
        if let Err(e) = left {
            findings.push(format!("leftover in {}: {e}", cluster.name));
        }
    }
    Ok(findings)
}

async fn left_behind(client: &Client, deleted: &[String]) -> Result<Vec<String>, String> {
    let mut left = Vec::new();
    let namespaces: Api<Namespace> = Api::all(client.clone());
    for namespace in deleted {
        if let Some(ns) = namespaces
            .get_opt(namespace)
            .await
            .map_err(|e| e.to_string())?
        {
            let phase = ns.status.and_then(|s| s.phase).unwrap_or_default();
            left.push(format!("namespace {namespace} ({phase})"));
        }
    }
    let sets = Api::<ObjectSet>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(|e| e.to_string())?;
    let mut live_sets: BTreeSet<(String, String)> = BTreeSet::new();
    for set in &sets.items {
        let key = (
            set.metadata.namespace.clone().unwrap_or_default(),
            set.metadata.name.clone().unwrap_or_default(),
        );
        if set.metadata.deletion_timestamp.is_some() {
            left.push(format!(
                "ObjectSet {}/{} deleting, finalizers {:?}",
                key.0, key.1, set.metadata.finalizers
            ));
        } else {
            live_sets.insert(key);
        }
    }
    let widgets = Api::<DynamicObject>::all_with(client.clone(), &widget_resource())
        .list(&ListParams::default())
        .await
        .map_err(|e| e.to_string())?;
    for widget in widgets.items {
        let namespace = widget.metadata.namespace.clone().unwrap_or_default();
        let controlled = widget.metadata.owner_references.iter().flatten().any(|o| {
            o.controller == Some(true)
                && o.kind == "ObjectSet"
                && live_sets.contains(&(namespace.clone(), o.name.clone()))
        });
        if !controlled {
            left.push(format!(
                "Widget {namespace}/{} controlled by no live ObjectSet",
                widget.metadata.name.unwrap_or_default()
            ));
        }
    }
    Ok(left)
}

/// Where each cluster's HostedClusterPackage says it stands, and which replica it is labelled for: what
/// to read first when the run did not converge.
pub async fn rollout_standing(clients: &[Client]) -> Result<(), String> {
    for (client, cluster) in clients.iter().zip(CLUSTERS) {
        let h = Api::<HostedClusterPackage>::all(client.clone())
            .get(NAME)
            .await
            .map_err(|e| e.to_string())?;
        let owner = h
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(SHARD_OWNER_LABEL))
            .cloned()
            .unwrap_or_default();
        let status = h.status.unwrap_or_default();
        println!(
            "  {cluster}: HostedClusterPackage on {owner}, generation {:?} observed {}, halted {:?}",
            h.metadata.generation, status.observed_generation, status.halted
        );
        for c in &status.conditions {
            println!("    {}={} {}: {}", c.type_, c.status, c.reason, c.message);
        }
    }
    Ok(())
}

/// Watches open at each apiserver: its long-running requests of verb WATCH (`apiserver_longrunning_gauge`
/// up to Kubernetes 1.22, `apiserver_longrunning_requests` after).
pub async fn open_watches(servers: &[&ApiServer]) -> Result<Vec<f64>, String> {
    let mut counts = Vec::new();
    for server in servers {
        let text = apiserver_metrics(server).await?;
        counts.push(
            text.lines()
                .filter(|l| {
                    (l.starts_with("apiserver_longrunning_gauge{")
                        || l.starts_with("apiserver_longrunning_requests{"))
                        && l.contains("verb=\"WATCH\"")
                })
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum(),
        );
    }
    Ok(counts)
}

/// Watches each apiserver has open at the end against when the run settled: every process of the run is
/// of the same kind as before the faults, so a leak grows with them and a restart alone does not.
pub fn watch_leaks(servers: &[&ApiServer], before: &[f64], after: &[f64]) -> Vec<String> {
    let mut leaks = Vec::new();
    for ((server, before), after) in servers.iter().zip(before).zip(after) {
        println!(
            "{}: open watches {before} when settled, {after} at the end",
            server.name()
        );
        if *after > before * 1.5 + 10.0 {
            leaks.push(format!(
                "watch leak at {}: {before} → {after}",
                server.name()
            ));
        }
    }
    leaks
}

/// Runs shorter than this say nothing about a leak: a replica started mid-run is still warming up.
const RSS_JUDGED_FROM: Duration = Duration::from_secs(10 * 60);
/// The steepest a replica's RSS may rise over the run's last half (least squares, MiB per minute) in a
/// judged run: the fleet is the same size throughout, so steady growth is a leak.
const RSS_SLOPE_BOUND: f64 = 1.0;

/// Prints each process's RSS (a replica's or a connector's: first, last, slope over the last half of the
/// run, of the process running at the end) and returns, for a run of at least [`RSS_JUDGED_FROM`], a
/// finding per process whose slope exceeds [`RSS_SLOPE_BOUND`].
pub fn rss_findings(samples: &[RssSample]) -> Vec<String> {
    let Some(end) = samples.iter().map(|s| s.at).max() else {
        return Vec::new();
    };
    let half = end / 2;
    let judged = end >= RSS_JUDGED_FROM;
    let mut slots: BTreeMap<&str, Vec<&RssSample>> = BTreeMap::new();
    for s in samples {
        slots.entry(&s.process).or_default().push(s);
    }
    println!(
        "RSS (MiB) per manager replica and connector, first → last, slope over the last half{}:",
        if judged {
            format!(" (bound {RSS_SLOPE_BOUND} MiB/min)")
        } else {
            format!(
                " (not judged: runs of {} min or more are)",
                RSS_JUDGED_FROM.as_secs() / 60
            )
        }
    );
    let mut findings = Vec::new();
    for (process, series) in slots {
        let last_pid = series.last().map(|s| s.pid).unwrap_or(0);
        let late: Vec<(f64, f64)> = series
            .iter()
            .filter(|s| s.at >= half && s.pid == last_pid)
            .map(|s| (s.at.as_secs_f64(), s.kib as f64 / 1024.0))
            .collect();
        let mib = |s: Option<&&RssSample>| s.map(|s| s.kib as f64 / 1024.0).unwrap_or(0.0);
        let (first, last) = (mib(series.first()), mib(series.last()));
        // A process that started in the last half has not a whole half behind it to judge.
        let whole_half = series.iter().any(|s| s.at < half && s.pid == last_pid);
        let gone_early = series.last().is_some_and(|s| s.at < half);
        match slope_per_minute(&late) {
            Some(slope) if whole_half => {
                println!("  {process}: {first:.0} → {last:.0}, {slope:+.2} MiB/min");
                if judged && slope > RSS_SLOPE_BOUND {
                    findings.push(format!(
                        "RSS of {process} grows {slope:.2} MiB/min over the run's last half (bound {RSS_SLOPE_BOUND}): {first:.0} → {last:.0} MiB"
                    ));
                }
            }
            _ if gone_early => {
                println!("  {process}: {first:.0} → {last:.0} (gone before the last half)")
            }
            _ => println!("  {process}: {first:.0} → {last:.0} (restarted in the last half)"),
        }
    }
    findings
}

/// Least-squares slope of (seconds, MiB) in MiB per minute; `None` with fewer than 3 points.
fn slope_per_minute(points: &[(f64, f64)]) -> Option<f64> {
    if points.len() < 3 {
        return None;
    }
    let n = points.len() as f64;
    let mean_x = points.iter().map(|p| p.0).sum::<f64>() / n;
    let mean_y = points.iter().map(|p| p.1).sum::<f64>() / n;
    let covariance: f64 = points.iter().map(|p| (p.0 - mean_x) * (p.1 - mean_y)).sum();
    let variance: f64 = points.iter().map(|p| (p.0 - mean_x).powi(2)).sum();
    (variance > 0.0).then(|| covariance / variance * 60.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples(
        minutes: u64,
        replica: usize,
        pid_from: impl Fn(u64) -> u32,
        mib_per_min: f64,
    ) -> Vec<RssSample> {
        (0..=minutes * 12)
            .map(|i| RssSample {
                at: Duration::from_secs(i * 5),
                process: format!("canary replica {replica}"),
                pid: pid_from(i * 5),
                kib: ((70.0 + mib_per_min * (i * 5) as f64 / 60.0) * 1024.0) as u64,
            })
            .collect()
    }

    #[test]
    fn steady_growth_over_a_long_run_is_a_finding_and_a_short_run_or_a_restart_is_not() {
        let mut long = samples(20, 0, |_| 1, 2.0);
        long.extend(samples(20, 1, |_| 2, 0.1));
        // Restarted at minute 15: its last process has no whole half behind it.
        long.extend(samples(20, 2, |at| if at < 900 { 3 } else { 4 }, 3.0));
        let findings = rss_findings(&long);
        assert_eq!(findings.len(), 1, "{findings:?}");
        assert!(findings[0].contains("canary replica 0"), "{findings:?}");
        assert!(rss_findings(&samples(3, 0, |_| 1, 5.0)).is_empty());
    }

    #[test]
    fn the_slope_is_per_minute_and_needs_three_points() {
        let growing = [(0.0, 100.0), (30.0, 101.0), (60.0, 102.0)];
        assert!((slope_per_minute(&growing).unwrap() - 2.0).abs() < 1e-9);
        assert_eq!(slope_per_minute(&growing[..2]), None);
        assert_eq!(
            slope_per_minute(&[(5.0, 1.0), (5.0, 2.0), (5.0, 3.0)]),
            None
        );
    }
}
