//! What a CloudEvents sink keeps up with: N rollout events published through the manager's own outbox
//! into JetStream (the baseline, in the same process) and delivered by the manager's own sink code to a
//! local HTTP receiver, with the time each took, the sink's rate and how far it trails the stream. Then
//! the receiver is down while another N are published, and the catch-up once it is back is timed.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use pko_actors::engine::notifications::notification_sink::NotificationSink;
use pko_actors::engine::notifications::sink_address::SinkAddressPolicy;
use pko_actors::metrics::manager_metrics::ManagerMetrics;
use pko_actors::notifications::notification_sinks::NotificationSinks;
use pko_actors::rollout::rollout_publisher::RolloutPublisher;
use pko_actors::runtime::api_request_metrics::ApiRequestMetrics;
use pko_proto::core::rollout_notifications::HostedClusterPackageNotificationSink;
use pko_proto::rollout_events::{RolloutEvent, RolloutEventKind, EVENT_VERSION};
use pko_testenv::{EnvConfig, TestEnv};

/// A receiver that counts the CloudEvents it takes, answering 503 while `down`.
#[derive(Clone, Default)]
struct Receiver {
    taken: Arc<AtomicUsize>,
    down: Arc<AtomicBool>,
}

impl Receiver {
    async fn start(&self) -> Result<u16, String> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| e.to_string())?;
        let port = listener.local_addr().map_err(|e| e.to_string())?.port();
        let receiver = self.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let receiver = receiver.clone();
                tokio::spawn(async move {
                    let service =
                        service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
                            let receiver = receiver.clone();
                            async move {
                                let _ = request.into_body().collect().await;
                                let status = if receiver.down.load(Ordering::SeqCst) {
                                    503
                                } else {
                                    receiver.taken.fetch_add(1, Ordering::SeqCst);
                                    202
                                };
                                let mut response = hyper::Response::new(String::new());
                                *response.status_mut() =
                                    hyper::StatusCode::from_u16(status).unwrap_or_default();
                                Ok::<_, Infallible>(response)
                            }
                        });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(port)
    }

    async fn wait_for(&self, count: usize, limit: Duration) -> Result<Duration, String> {
        let started = Instant::now();
        while self.taken.load(Ordering::SeqCst) < count {
            if started.elapsed() > limit {
                return Err(format!(
                    "{} of {count} events after {limit:?}",
                    self.taken.load(Ordering::SeqCst)
                ));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok(started.elapsed())
    }
}

fn events(batch: usize, count: usize) -> Vec<RolloutEvent> {
    (0..count)
        .map(|i| RolloutEvent {
            version: EVENT_VERSION,
            kind: RolloutEventKind::PackageUpdated,
            hosted_cluster_package: "bench".into(),
            uid: "bench-uid".into(),
            generation: i64::try_from(batch).unwrap_or_default(),
            group: None,
            namespace: Some(format!("clusters-hc-{i}")),
            message: String::new(),
            source: "bench".into(),
            trace_id: None,
            traceparent: None,
        })
        .collect()
}

pub async fn run(count: usize) -> Result<(), String> {
    let env = TestEnv::start(EnvConfig {
        hosted_clusters: 0,
        controller_manager: false,
    })
    .await
    .map_err(|e| e.to_string())?;
    let nats = env.nats().client().await.map_err(|e| e.to_string())?;
    let client = env.management().client().await.map_err(|e| e.to_string())?;
    let metrics = ManagerMetrics::new(ApiRequestMetrics::default());
    let receiver = Receiver::default();
    let port = receiver.start().await?;
    let sink = NotificationSink::parse(
        &HostedClusterPackageNotificationSink {
            url: format!("http://127.0.0.1:{port}/events"),
            ..Default::default()
        },
        "bench",
    )?;
    let sinks = NotificationSinks::new(
        nats.clone(),
        client,
        "default",
        metrics.notifications.clone(),
        // The receiver is on loopback, which sinks reach only when the operator allows it.
        SinkAddressPolicy::parse(&["127.0.0.1/32".to_owned()])?,
    )?;
    // A HostedClusterPackage's sink: its consumer starts at the object's oldest event, whenever it is
    // made.
    sinks.ensure("bench", "bench-uid", &[sink]);
    let publisher = RolloutPublisher::start(nats, count * 2, metrics);

    println!("{count} rollout events, one sink on loopback:");
    let started = Instant::now();
    publisher.enqueue(events(1, count));
    let left = publisher.flush(Duration::from_secs(300)).await;
    let published = started.elapsed();
    if left > 0 {
        return Err(format!("{left} events not acknowledged by the stream"));
    }
    let delivered = receiver.wait_for(count, Duration::from_secs(600)).await? + published;
    let rate = |d: Duration| count as f64 / d.as_secs_f64();
    println!(
        "  into the stream (outbox → JetStream): {:.2} s, {:.0} events/s",
        published.as_secs_f64(),
        rate(published)
    );
    println!(
        "  to the sink (stream → HTTP, one outstanding): {:.2} s, {:.0} events/s ({:.2}× the stream's time); \
         the last arrived {:.2} s after the stream had it",
        delivered.as_secs_f64(),
        rate(delivered),
        delivered.as_secs_f64() / published.as_secs_f64(),
        (delivered - published).as_secs_f64()
    );

    receiver.down.store(true, Ordering::SeqCst);
    publisher.enqueue(events(2, count));
    publisher.flush(Duration::from_secs(300)).await;
    let outage = Duration::from_secs(10);
    tokio::time::sleep(outage).await;
    receiver.down.store(false, Ordering::SeqCst);
    let caught_up = receiver
        .wait_for(2 * count, Duration::from_secs(600))
        .await?;
    println!(
        "  after a {} s outage with {count} waiting: caught up in {:.2} s ({:.0} events/s, the first \
         retry's backoff included)",
        outage.as_secs(),
        caught_up.as_secs_f64(),
        rate(caught_up)
    );
    sinks.drain(Duration::from_secs(5)).await;
    Ok(())
}
