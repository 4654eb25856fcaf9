//! The observer's own eyes: one Package watch per management cluster, with its own client, turned into
//! [`PackageSeen`]s for the judge in each apiserver's order. A re-list (after an apiserver restart, a
//! 410) is marked so the judge does not read transitions into it, and Packages missing from it are
//! reported gone.

use std::collections::BTreeSet;
use std::time::Instant;

use futures::StreamExt;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client};
use pko_proto::core::package::Package;
use pko_proto::well_known::HOSTED_CLUSTER_PACKAGE_LABEL;
use tokio::sync::mpsc::UnboundedSender;

use crate::chaos::judge::PackageSeen;

/// What reaches the judge, in the order it happened for it.
#[derive(Debug)]
pub enum Observed {
    Package(PackageSeen),
    /// A release is about to be set (`broken`: it fails on the canary HostedCluster).
    Release {
        name: String,
        broken: bool,
    },
    /// The run deleted the HostedCluster of this HCP namespace.
    Left {
        cluster: usize,
        namespace: String,
    },
}

/// The release a Package's template carries.
pub fn release_of(package: &Package) -> String {
    package
        .spec
        .config
        .as_ref()
        .and_then(|c| c.get("release"))
        .and_then(|r| r.as_str())
        .unwrap_or_default()
        .to_owned()
}

/// Available=True and Progressing=False, both for the Package's generation: its latest revision is live.
pub fn is_live(package: &Package) -> bool {
    let fresh = |type_: &str, status: &str| {
        package.status.iter().flat_map(|s| &s.conditions).any(|c| {
            c.type_ == type_
                && c.status == status
                && c.observed_generation == package.metadata.generation
        })
    };
    fresh("Available", "True") && fresh("Progressing", "False")
}

/// Watches HostedClusterPackage `owner`'s Packages in `cluster` until the receiver is gone.
pub fn watch_packages(
    client: Client,
    cluster: usize,
    owner: &str,
    started: Instant,
    to_judge: UnboundedSender<Observed>,
) -> tokio::task::JoinHandle<()> {
    let api: Api<Package> = Api::all(client);
    let config =
        watcher::Config::default().labels(&format!("{HOSTED_CLUSTER_PACKAGE_LABEL}={owner}"));
    tokio::spawn(async move {
        // Backoff: while the schedule has the apiserver away, the watch retries without spinning.
        let mut events = watcher::watcher(api, config).default_backoff().boxed();
        let mut known: BTreeSet<String> = BTreeSet::new();
        let mut relisted: BTreeSet<String> = BTreeSet::new();
        let seen = |package: &Package, listed: bool, gone: bool| {
            Observed::Package(PackageSeen {
                at: started.elapsed(),
                cluster,
                namespace: package.metadata.namespace.clone().unwrap_or_default(),
                release: (!gone).then(|| release_of(package)),
                live: !gone && is_live(package),
                listed,
            })
        };
        while let Some(event) = events.next().await {
            let observed = match event {
                // The watch itself failing (the apiserver away) is what the run does to it; the watcher
                // lists again when it is back.
                Err(_) | Ok(Event::Init) => {
                    relisted.clear();
                    continue;
                }
                Ok(Event::InitApply(p)) => {
                    let namespace = p.metadata.namespace.clone().unwrap_or_default();
                    relisted.insert(namespace.clone());
                    known.insert(namespace);
                    vec![seen(&p, true, false)]
                }
                Ok(Event::InitDone) => {
                    let gone: Vec<String> = known.difference(&relisted).cloned().collect();
                    known = std::mem::take(&mut relisted);
                    gone.into_iter()
                        .map(|namespace| {
                            Observed::Package(PackageSeen {
                                at: started.elapsed(),
                                cluster,
                                namespace,
                                release: None,
                                live: false,
                                listed: true,
                            })
                        })
                        .collect()
                }
                Ok(Event::Apply(p)) => {
                    known.insert(p.metadata.namespace.clone().unwrap_or_default());
                    vec![seen(&p, false, false)]
                }
                Ok(Event::Delete(p)) => {
                    known.remove(p.metadata.namespace.as_deref().unwrap_or_default());
                    vec![seen(&p, false, true)]
                }
            };
            for o in observed {
                if to_judge.send(o).is_err() {
                    return;
                }
            }
        }
    })
}
