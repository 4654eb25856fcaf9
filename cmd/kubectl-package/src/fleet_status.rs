//! `kubectl package fleet status [hostedclusterpackage NAME] --nats-url HUB`: every management cluster's
//! rollout of HostedClusterPackages, from the records the managers keep at the fleet's hub; with `--watch`
//! printed again whenever a record changes.

use std::path::PathBuf;

use async_nats::jetstream::{self, kv};
use futures::StreamExt;
use k8s_openapi::jiff::Timestamp;
use pko_engine::fleet::promotion_gate::RECORD_STALE_AFTER;
use pko_proto::fleet::{FleetRecords, STATE_BUCKET};

use crate::args::FleetStatusArgs;
use crate::cluster::resource_and_name;
use crate::rollout_follow::is_hosted_cluster_package;

pub async fn status(args: &FleetStatusArgs) -> Result<String, String> {
    let name = match args.positionals.args.as_slice() {
        [] => None,
        rest => {
            let (kind, name) = resource_and_name(rest)?;
            if !is_hosted_cluster_package(&kind) {
                return Err(format!(
                    "fleet status takes hostedclusterpackage NAME, not {kind:?}"
                ));
            }
            Some(name)
        }
    };
    let store = bucket(&args.nats_url, args.nats_creds.as_ref()).await?;
    let mut records = FleetRecords::default();
    // The last value of every key, then (watching) every change.
    let mut entries = store
        .watch_with_history(">")
        .await
        .map_err(|e| format!("reading {STATE_BUCKET}: {e}"))?;
    let empty = store
        .status()
        .await
        .map_err(|e| format!("reading {STATE_BUCKET}: {e}"))?
        .values()
        == 0;
    let mut caught_up = empty;
    let mut printed = String::new();
    loop {
        if caught_up {
            let table = fleet_table(&records, name.as_deref(), Timestamp::now());
            if !args.watch {
                return Ok(table);
            }
            if table != printed {
                println!("{table}\n");
                printed = table;
            }
        }
        let Some(entry) = entries.next().await else {
            return Err(format!("the watch of {STATE_BUCKET} ended"));
        };
        let entry = entry.map_err(|e| format!("watching {STATE_BUCKET}: {e}"))?;
        if matches!(entry.operation, kv::Operation::Put) {
            // A record that does not parse, or says another cluster than its key, is left out.
            let _ = records.put(&entry.key, &entry.value);
        } else {
            records.delete(&entry.key);
        }
        caught_up |= entry.seen_current;
    }
}

async fn bucket(url: &str, creds: Option<&PathBuf>) -> Result<kv::Store, String> {
    let mut options = async_nats::ConnectOptions::new();
    if let Some(path) = creds {
        options = async_nats::ConnectOptions::with_credentials_file(path)
            .await
            .map_err(|e| format!("reading {}: {e}", path.display()))?;
    }
    let nats = options
        .name("kubectl-package")
        .connect(url)
        .await
        .map_err(|e| format!("connecting to {url}: {e}"))?;
    jetstream::new(nats)
        .get_key_value(STATE_BUCKET)
        .await
        .map_err(|e| {
            format!("bucket {STATE_BUCKET} at {url} (no manager joined the fleet yet?): {e}")
        })
}

fn age(from: Option<Timestamp>, now: Timestamp) -> String {
    match from {
        None => "-".to_owned(),
        Some(from) => {
            let seconds = now.duration_since(from).as_secs().max(0);
            match seconds {
                s if s < 120 => format!("{s}s"),
                s if s < 7200 => format!("{}m", s / 60),
                s => format!("{}h", s / 3600),
            }
        }
    }
}

/// The table: a row per management cluster and HostedClusterPackage (only `name`'s when given), and a row
/// for each announced cluster that reports no rollout of `name`.
pub fn fleet_table(records: &FleetRecords, name: Option<&str>, now: Timestamp) -> String {
    let mut rows = vec![[
        "HOSTEDCLUSTERPACKAGE",
        "CLUSTER",
        "TEMPLATE",
        "GEN",
        "PARTITION",
        "UPDATED",
        "AVAILABLE",
        "FAILED",
        "SETTLED",
        "LAST EVENT",
        "REPORTED",
        "GATE",
    ]
    .map(str::to_owned)];
    for ((hcpkg, cluster), r) in &records.rollouts {
        if name.is_some_and(|n| n != hcpkg) {
            continue;
        }
        let reported = age(Some(r.updated_at), now);
        let stale =
            now.duration_since(r.updated_at).as_secs() > RECORD_STALE_AFTER.as_secs() as i64;
        rows.push([
            hcpkg.clone(),
            cluster.clone(),
            r.template_hash.clone(),
            r.generation.to_string(),
            r.partition.clone().unwrap_or_else(|| "-".to_owned()),
            format!("{}/{}", r.updated, r.total),
            format!("{}/{}", r.available, r.total),
            r.failed.to_string(),
            match r.settled_since {
                Some(since) if r.settled => format!("{} ago", age(Some(since), now)),
                _ => "no".to_owned(),
            },
            age(r.last_event_at, now),
            if stale {
                format!("{reported} (stale)")
            } else {
                reported
            },
            r.gate.clone().unwrap_or_else(|| "-".to_owned()),
        ]);
    }
    if let Some(name) = name {
        for cluster in records.clusters.keys() {
            if !records
                .rollouts
                .contains_key(&(name.to_owned(), cluster.clone()))
            {
                let mut row: [String; 12] = Default::default();
                row[0] = name.to_owned();
                row[1] = cluster.clone();
                row[2] = "(no rollout)".to_owned();
                for cell in row.iter_mut().skip(3) {
                    *cell = "-".to_owned();
                }
                rows.push(row);
            }
        }
    }
    if rows.len() == 1 {
        return match name {
            Some(name) => format!("no management cluster reports hostedclusterpackage/{name}"),
            None => "no management cluster reports a rollout".to_owned(),
        };
    }
    let widths: Vec<usize> = (0..12)
        .map(|i| rows.iter().map(|r| r[i].len()).max().unwrap_or(0))
        .collect();
    rows.iter()
        .map(|row| {
            row.iter()
                .zip(&widths)
                .map(|(cell, width)| format!("{cell:<width$}"))
                .collect::<Vec<_>>()
                .join("  ")
                .trim_end()
                .to_owned()
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use pko_proto::fleet::{FleetRolloutRecord, ManagementClusterRecord, RECORD_VERSION};
    use std::collections::BTreeMap;

    fn at(second: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + second).unwrap()
    }

    #[test]
    fn the_table_shows_every_cluster_and_flags_stale_reports() {
        let mut records = FleetRecords::default();
        for (cluster, settled, written, gate) in [
            ("canary", true, 95, None),
            (
                "prod-a",
                false,
                0,
                Some("waiting: Waiting for canary: soaking".to_owned()),
            ),
        ] {
            records.rollouts.insert(
                ("addon".into(), cluster.into()),
                FleetRolloutRecord {
                    version: RECORD_VERSION,
                    cluster: cluster.into(),
                    hosted_cluster_package: "addon".into(),
                    generation: 2,
                    template_hash: "0123abcd".into(),
                    partition: None,
                    total: 4,
                    updated: if settled { 4 } else { 0 },
                    available: 4,
                    failed: 0,
                    settled,
                    settled_since: settled.then(|| at(40)),
                    gate,
                    last_event_at: Some(at(30)),
                    poisoned: Vec::new(),
                    updated_at: at(written),
                },
            );
        }
        for cluster in ["canary", "prod-a", "prod-b"] {
            records.clusters.insert(
                cluster.into(),
                ManagementClusterRecord {
                    version: RECORD_VERSION,
                    name: cluster.into(),
                    labels: BTreeMap::new(),
                    updated_at: at(90),
                },
            );
        }
        let table = fleet_table(&records, Some("addon"), at(100));
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 4, "{table}");
        assert!(
            lines[1].starts_with("addon") && lines[1].contains("canary"),
            "{table}"
        );
        assert!(
            lines[1].contains("4/4") && lines[1].contains("60s ago"),
            "{table}"
        );
        assert!(
            lines[2].contains("100s (stale)") && lines[2].contains("waiting: Waiting for canary"),
            "{table}"
        );
        assert!(
            lines[3].contains("prod-b") && lines[3].contains("(no rollout)"),
            "{table}"
        );
        assert_eq!(
            fleet_table(&records, Some("other"), at(100))
                .lines()
                .count(),
            4,
            "the announced clusters, none reporting it"
        );
        assert_eq!(
            fleet_table(&FleetRecords::default(), None, at(0)),
            "no management cluster reports a rollout"
        );
    }
}
