//! How the watches read what exists when they start: paged lists, or streaming lists (`sendInitialEvents`,
//! the apiserver's WatchList feature, on by default from Kubernetes 1.32, off on the 1.27 floor). A
//! streaming list hands objects over one by one from the watch cache instead of pages read whole, so a
//! start over a large fleet holds less at once and costs the apiserver no etcd list.
//!
//! This module decides which, once per process (asking the apiserver when told to find out); it starts no
//! watch of its own beyond that one question.

use futures::StreamExt;
use kube::api::{Api, WatchEvent, WatchParams};
use kube::runtime::watcher::{self, InitialListStrategy};
use kube::Client;
use pko_proto::core::package::Package;
use prometheus_client::metrics::gauge::Gauge;
use tracing::info;

/// Which initial lists the watches make.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum InitialLists {
    /// `list` calls, page by page.
    #[default]
    Paged,
    /// One watch with `sendInitialEvents=true`, ended by a bookmark.
    Streaming,
}

impl InitialLists {
    /// A watcher configuration that makes this kind of initial list.
    pub fn config(self) -> watcher::Config {
        let config = watcher::Config::default();
        match self {
            InitialLists::Paged => config,
            InitialLists::Streaming => config.streaming_lists(),
        }
    }

    /// The strategy for kube's watcher.
    pub fn strategy(self) -> InitialListStrategy {
        match self {
            InitialLists::Paged => InitialListStrategy::ListWatch,
            InitialLists::Streaming => InitialListStrategy::StreamingList,
        }
    }

    /// A gauge that says which: 1 for streaming lists, 0 for paged ones.
    pub fn gauge(self) -> Gauge {
        let gauge = Gauge::default();
        gauge.set(i64::from(self == InitialLists::Streaming));
        gauge
    }

    pub fn name(self) -> &'static str {
        match self {
            InitialLists::Paged => "paged",
            InitialLists::Streaming => "streaming",
        }
    }
}

/// Asks the apiserver for a streaming list of Packages named so that none matches: a server serving
/// streaming lists answers with the bookmark that ends the (empty) initial events; one without the
/// feature refuses the parameter or never sends that bookmark. A transport failure is an error: the
/// caller cannot tell either way.
pub async fn probe(client: &Client) -> Result<InitialLists, kube::Error> {
    let api: Api<Package> = Api::all(client.clone());
    let params = WatchParams::streaming_lists()
        .fields("metadata.name=pko-initial-list-probe.invalid")
        .timeout(10);
    let mut events = match api.watch(&params, "").await {
        Ok(events) => events.boxed(),
        // Refused as a request the server does not understand.
        Err(kube::Error::Api(status)) if (400..500).contains(&status.code) => {
            info!(code = status.code, reason = %status.reason, "the apiserver refuses streaming lists");
            return Ok(InitialLists::Paged);
        }
        Err(other) => return Err(other),
    };
    while let Some(event) = events.next().await {
        match event? {
            WatchEvent::Bookmark(bookmark)
                if ends_initial_events(&bookmark.metadata.annotations) =>
            {
                return Ok(InitialLists::Streaming);
            }
            WatchEvent::Error(status) => {
                info!(code = status.code, reason = %status.reason, "the apiserver refuses streaming lists");
                return Ok(InitialLists::Paged);
            }
            _ => {}
        }
    }
    // The watch ended (its timeout) without saying the initial events are done: not served.
    Ok(InitialLists::Paged)
}

/// Whether a bookmark is the one a streaming list ends its initial events with.
fn ends_initial_events(annotations: &std::collections::BTreeMap<String, String>) -> bool {
    annotations
        .get("k8s.io/initial-events-end")
        .is_some_and(|v| v == "true")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_end_of_initial_events_counts() {
        let mut annotations = std::collections::BTreeMap::new();
        assert!(!ends_initial_events(&annotations));
        annotations.insert("k8s.io/initial-events-end".into(), "false".into());
        assert!(!ends_initial_events(&annotations));
        annotations.insert("k8s.io/initial-events-end".into(), "true".into());
        assert!(ends_initial_events(&annotations));
    }

    #[test]
    fn each_kind_of_list_configures_the_watcher_for_it() {
        assert_eq!(
            InitialLists::Streaming.config().initial_list_strategy,
            InitialListStrategy::StreamingList
        );
        assert_eq!(
            InitialLists::Paged.config().initial_list_strategy,
            InitialListStrategy::ListWatch
        );
    }
}
