//! Connector credentials run out and are minted again in time (issue 17, item 9): with a validity of 12 s
//! the manager mints new credentials once 4 s are left, the connector Deployment rolls to them, and
//! hosted phases keep reaching the hosted cluster. The manager's own NATS user expires too (issue 39, item
//! 2): after 10 s nats-server closes its connection, the manager reconnects as a user it mints afresh,
//! and phases still reach the connector. This binary runs its own manager with those validities.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use pko_proto::core::object_set::ObjectSet;
use pko_testenv::wait_until;
use serde_json::json;

use common::*;

const EXPIRY: &str = "package-operator.run/credentials-expire-at";
const CREDENTIALS_HASH: &str = "package-operator.run/credentials-hash";

async fn expiry(secrets: &Api<Secret>) -> Result<u64, String> {
    let secret = secrets
        .get_opt("pko-connector-nats")
        .await
        .map_err(|e| e.to_string())?
        .ok_or("no credentials yet")?;
    secret
        .metadata
        .annotations
        .and_then(|a| a.get(EXPIRY).cloned())
        .ok_or("no expiry")?
        .parse()
        .map_err(|e: std::num::ParseIntError| e.to_string())
}

async fn credentials_hash(deployments: &Api<Deployment>) -> Result<String, String> {
    deployments
        .get("pko-connector")
        .await
        .map_err(|e| e.to_string())?
        .spec
        .and_then(|s| s.template.metadata)
        .and_then(|m| m.annotations)
        .and_then(|a| a.get(CREDENTIALS_HASH).cloned())
        .ok_or_else(|| "no credentials hash".to_owned())
}

/// An ObjectSet with one hosted phase writing ConfigMap `name` into the hosted cluster's `default`.
async fn hosted_set(client: &kube::Client, hcp: &str, name: &str) {
    let set = typed::<ObjectSet>(
        "ObjectSet",
        name,
        json!({"phases": [{"name": "config", "class": "hosted-cluster", "objects": [{"object": {
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": "default"}, "data": {"n": name}}}]}]}),
        json!({}),
    );
    create_set(client, hcp, &set).await;
    wait_condition(client, hcp, name, "Available", "True", None).await;
}

#[tokio::test]
async fn connector_credentials_are_minted_again_before_they_expire() {
    let env = env();
    let binary = Path::new(env!("CARGO_BIN_EXE_pko-manager"));
    let manager = env
        .start_manager(
            binary,
            &[
                "--connector-credentials-validity-seconds",
                "12",
                "--nats-user-validity-seconds",
                "10",
            ],
        )
        .await
        .unwrap();
    let clusters = env.simulate_hypershift().await.unwrap();
    let _runner = env
        .start_connector_runner(&connector_binary())
        .await
        .unwrap();
    let client = env.management().client().await.unwrap();
    let hcp = &clusters[0].hcp_namespace;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), hcp);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), hcp);
    // The Secret is written before the Deployment that mounts it.
    let (first, first_hash) = wait_until(
        "the first credentials and their connector",
        TIMEOUT,
        || async {
            Ok((
                expiry(&secrets).await?,
                credentials_hash(&deployments).await?,
            ))
        },
    )
    .await
    .unwrap();
    hosted_set(&client, hcp, "before-renewal").await;

    // Minted again before the first ones expire, and the connector rolls to them.
    let second = wait_until("credentials minted again", TIMEOUT, || async {
        match expiry(&secrets).await? {
            e if e > first => Ok(e),
            e => Err(format!("still expiring at {e}")),
        }
    })
    .await
    .unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(
        now <= first,
        "renewed only after the old credentials expired ({first}, now {now})"
    );
    assert!(second > first);
    wait_until(
        "the connector rolled to the new credentials",
        TIMEOUT,
        || async {
            match credentials_hash(&deployments).await? {
                hash if hash != first_hash => Ok(()),
                hash => Err(format!("still {hash}")),
            }
        },
    )
    .await
    .unwrap();

    // Past the first credentials' expiry, phases still reach the hosted cluster.
    wait_until("the first credentials expired", TIMEOUT, || async {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        if now > first {
            Ok(())
        } else {
            Err(format!("{} s left", first - now))
        }
    })
    .await
    .unwrap();
    // By now the manager's first NATS user expired as well: the server closed that connection and the
    // manager came back as a new user.
    let expires = wait_until("the manager's NATS user minted again", TIMEOUT, || async {
        match manager.metric("pko_nats_user_mints_total").await? {
            n if n >= 2 => {
                manager
                    .metric("pko_nats_user_expiry_timestamp_seconds")
                    .await
            }
            n => Err(format!("{n} users minted")),
        }
    })
    .await
    .unwrap();
    assert!(expires > first, "the manager's user expires at {expires}");
    hosted_set(&client, hcp, "after-renewal").await;
    let hosted = env.hosted_clusters()[0].client().await.unwrap();
    let cm = Api::<ConfigMap>::namespaced(hosted, "default")
        .get("after-renewal")
        .await
        .unwrap();
    assert_eq!(cm.data.unwrap()["n"], "after-renewal");
}
