//! A connector's NATS credentials, as `nats_credentials` mints them from `connector_permissions()`, confine it
//! to its own hosted cluster's subjects on a real nats-server in operator mode.

#![allow(clippy::unwrap_used)] // tests fail loudly on the first unexpected error

use std::time::Duration;

use async_nats::client::RequestErrorKind;
use async_nats::{ConnectOptions, Event, ServerError};
use futures::{FutureExt, StreamExt};
use pko_proto::connector_wire::HostedClusterSubjects;
use tokio::sync::mpsc;

const DEADLINE: Duration = Duration::from_secs(10);

/// Waits for the server to report a permissions violation naming `subject`.
async fn violation(errors: &mut mpsc::UnboundedReceiver<String>, subject: &str) -> String {
    tokio::time::timeout(DEADLINE, async {
        loop {
            let error = errors.recv().await.expect("event channel open");
            if error.contains("Permissions Violation") && error.contains(subject) {
                return error;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no permissions violation for {subject} within {DEADLINE:?}"))
}

#[tokio::test]
async fn connector_credentials_reach_only_their_own_subjects() {
    let env = pko_testenv::shared().unwrap();
    let nats = env.nats();
    let own = HostedClusterSubjects::new("clusters-iso-a").unwrap();
    let other = HostedClusterSubjects::new("clusters-iso-b").unwrap();
    let manager = nats.client().await.unwrap();

    let (errors_tx, mut errors) = mpsc::unbounded_channel();
    let options = ConnectOptions::new().event_callback(move |event| {
        let errors_tx = errors_tx.clone();
        async move {
            if let Event::ServerError(ServerError::Other(message)) = event {
                let _ = errors_tx.send(message);
            }
        }
    });
    let credentials = nats
        .credentials("connector-iso-a", Some(&own.connector_permissions()))
        .unwrap();
    let connector = nats.connect(&credentials, options).await.unwrap();

    // Subscribing to another cluster's requests is refused, and nothing published there arrives.
    let mut foreign = connector.subscribe(other.apply()).await.unwrap();
    let refusal = violation(&mut errors, &other.apply()).await;
    assert!(refusal.contains("Subscription"), "{refusal}");
    let mut own_requests = connector.subscribe(own.apply()).await.unwrap();
    connector.flush().await.unwrap();

    // Its own requests arrive and it may answer them (allow_responses), though it cannot publish to the
    // manager's inbox otherwise.
    let serve = tokio::spawn({
        let connector = connector.clone();
        async move {
            let request = own_requests.next().await.unwrap();
            connector
                .publish(request.reply.unwrap(), "report".into())
                .await
                .unwrap();
        }
    });
    manager
        .publish(other.apply(), "not for you".into())
        .await
        .unwrap();
    // The server may answer "no responders" until the connector's interest has reached the manager's
    // side of the account; ask again until someone is there to answer.
    let reply = tokio::time::timeout(DEADLINE, async {
        loop {
            match manager.request(own.apply(), "apply".into()).await {
                Err(e) if e.kind() == RequestErrorKind::NoResponders => {
                    tokio::task::yield_now().await
                }
                other => return other,
            }
        }
    })
    .await
    .unwrap()
    .unwrap();
    assert_eq!(&reply.payload[..], b"report");
    serve.await.unwrap();
    // The server delivers one publisher's messages in order: the foreign one would have come first.
    assert!(
        foreign.next().now_or_never().is_none(),
        "a foreign request was delivered"
    );

    // Publishing as another cluster's connector is refused; the manager sees only the connector's own status.
    let mut statuses = manager
        .subscribe(format!(
            "{}.*.phase.status",
            pko_proto::connector_wire::SUBJECT_PREFIX
        ))
        .await
        .unwrap();
    nats.round_trip(&manager).await.unwrap();
    connector
        .publish(other.status(), "forged".into())
        .await
        .unwrap();
    connector
        .publish(own.status(), "genuine".into())
        .await
        .unwrap();
    connector.flush().await.unwrap();
    let refusal = violation(&mut errors, &other.status()).await;
    assert!(refusal.contains("Publish"), "{refusal}");
    let first = tokio::time::timeout(DEADLINE, statuses.next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first.subject.as_str(), own.status());
    assert_eq!(&first.payload[..], b"genuine");

    // Nor may it listen to the whole hierarchy.
    let _wide = connector.subscribe("pko.>").await.unwrap();
    violation(&mut errors, "pko.>").await;
}
