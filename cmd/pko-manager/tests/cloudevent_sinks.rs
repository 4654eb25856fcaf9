//! Rollout events as CloudEvents (issue 44): a real HTTP receiver, read with the `cloudevents-sdk`
//! crate's own binary-mode parser, takes a manager-wide sink over HTTPS (bearer token from a labelled
//! Secret naming the receiver's origin) and a HostedClusterPackage's sink (only some kinds). Another
//! HostedClusterPackage names the same Secret for a receiver of its own: it never gets the token, and
//! over plain http its spec is refused (issue 63, items 3 and 4). Three releases roll out: the second while the receiver
//! answers 503, which must not hold the rollout back; the manager is then stopped with events still
//! pending and a successor delivers them. In the end each sink got every event it wants exactly once, in
//! the stream's order. This binary restarts the manager, so it has its own environment.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeSet;
use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cloudevents::{AttributesReader, Data};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::Secret;
use kube::api::PostParams;
use kube::Api;
use pko_proto::core::hosted_cluster_package::HostedClusterPackage;
use pko_proto::rollout_events::{RolloutEvent, RolloutEventKind};
use pko_testenv::{wait_until, ManagerProcess, MANAGER_NAMESPACE};
use serde_json::json;
use tokio_rustls::rustls::crypto::aws_lc_rs;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::TlsAcceptor;

use common::rollout::*;
use common::*;

/// One CloudEvent the receiver took.
#[derive(Debug, Clone)]
struct Received {
    path: String,
    authorization: Option<String>,
    event: cloudevents::Event,
}

/// An HTTP receiver of CloudEvents: answers 503 while `down`, else parses the request as a binary-mode
/// CloudEvent and answers 202.
#[derive(Clone, Default)]
struct Receiver {
    down: Arc<AtomicBool>,
    received: Arc<Mutex<Vec<Received>>>,
    refused: Arc<Mutex<u64>>,
}

impl Receiver {
    async fn start(&self) -> u16 {
        self.start_on("127.0.0.1", None).await
    }

    /// Listens on `address` (over TLS with `tls`); the port.
    async fn start_on(&self, address: &str, tls: Option<TlsAcceptor>) -> u16 {
        let listener = tokio::net::TcpListener::bind((address, 0)).await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let receiver = self.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let receiver = receiver.clone();
                let tls = tls.clone();
                tokio::spawn(async move {
                    match tls {
                        Some(tls) => {
                            if let Ok(stream) = tls.accept(stream).await {
                                receiver.serve(TokioIo::new(stream)).await;
                            }
                        }
                        None => receiver.serve(TokioIo::new(stream)).await,
                    }
                });
            }
        });
        port
    }

    async fn serve<I>(self, io: I)
    where
        I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    {
        let service = service_fn(move |request| {
            let receiver = self.clone();
            async move { Ok::<_, Infallible>(receiver.take(request).await) }
        });
        let _ = hyper::server::conn::http1::Builder::new()
            .serve_connection(io, service)
            .await;
    }

    /// Every request it got, CloudEvent or not.
    fn requests(&self) -> usize {
        self.received.lock().unwrap().len() + *self.refused.lock().unwrap() as usize
    }

    async fn take(&self, request: Request<Incoming>) -> Response<String> {
        let (parts, body) = request.into_parts();
        let body = body.collect().await.unwrap().to_bytes().to_vec();
        if self.down.load(Ordering::SeqCst) {
            *self.refused.lock().unwrap() += 1;
            return answer(503, "down for maintenance");
        }
        let authorization = parts
            .headers
            .get("authorization")
            .map(|v| v.to_str().unwrap().to_owned());
        let path = parts.uri.path().to_owned();
        match cloudevents::binding::http::to_event(&parts.headers, body) {
            Ok(event) => {
                self.received.lock().unwrap().push(Received {
                    path,
                    authorization,
                    event,
                });
                answer(202, "")
            }
            Err(error) => answer(400, &error.to_string()),
        }
    }

    fn at(&self, path: &str) -> Vec<Received> {
        self.received
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.path == path)
            .cloned()
            .collect()
    }
}

fn answer(status: u16, body: &str) -> Response<String> {
    let mut response = Response::new(body.to_owned());
    *response.status_mut() = hyper::StatusCode::from_u16(status).unwrap();
    response
}

/// The rollout event a CloudEvent carries.
fn carried(r: &Received) -> RolloutEvent {
    match r.event.data() {
        Some(Data::Json(value)) => serde_json::from_value(value.clone()).unwrap(),
        // Binary mode: the body as sent, JSON by its content type.
        Some(Data::Binary(bytes)) => {
            assert_eq!(r.event.datacontenttype(), Some("application/json"));
            serde_json::from_slice(bytes).unwrap()
        }
        other => panic!("not JSON data: {other:?}"),
    }
}

/// A CA and a certificate for 127.0.0.1 it signed, made with openssl in `dir`: the CA's file (the
/// manager trusts it through SSL_CERT_FILE) and an acceptor serving the certificate.
fn loopback_tls(dir: &Path) -> (PathBuf, TlsAcceptor) {
    std::fs::create_dir_all(dir).unwrap();
    let openssl = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let key = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
    ];
    openssl(
        &[
            &["req", "-x509"],
            &key[..],
            &[
                "-keyout",
                "ca.key",
                "-out",
                "ca.crt",
                "-subj",
                "/CN=pko test CA",
                "-days",
                "1",
            ],
        ]
        .concat(),
    );
    openssl(
        &[
            &["req"],
            &key[..],
            &[
                "-keyout",
                "sink.key",
                "-out",
                "sink.csr",
                "-subj",
                "/CN=127.0.0.1",
            ],
        ]
        .concat(),
    );
    std::fs::write(dir.join("san.ext"), "subjectAltName=IP:127.0.0.1\n").unwrap();
    openssl(&[
        "x509",
        "-req",
        "-in",
        "sink.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "sink.crt",
        "-days",
        "1",
        "-extfile",
        "san.ext",
    ]);
    let chain = CertificateDer::pem_file_iter(dir.join("sink.crt"))
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_file(dir.join("sink.key")).unwrap();
    let config = ServerConfig::builder_with_provider(Arc::new(aws_lc_rs::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap();
    (dir.join("ca.crt"), TlsAcceptor::from(Arc::new(config)))
}

/// A manager whose manager-wide sink is the HTTPS receiver at `port`, trusting `ca`.
async fn start_manager(port: u16, ca: &Path) -> ManagerProcess {
    let sink = format!("https://127.0.0.1:{port}/all");
    let launch = pko_testenv::ManagerLaunch {
        env: vec![("SSL_CERT_FILE".to_owned(), ca.display().to_string())],
        ..Default::default()
    };
    env()
        .start_manager_with(
            Path::new(env!("CARGO_BIN_EXE_pko-manager")),
            &launch,
            &[
                "--cloudevents-sink",
                &sink,
                "--cloudevents-sink-secret",
                "sink-token",
                // The receivers are on loopback, which sinks may not reach unless allowed; 127.0.0.2 is not.
                "--notification-sink-allowed-cidrs",
                "127.0.0.1/32",
            ],
        )
        .await
        .unwrap()
}

#[tokio::test]
async fn sinks_get_every_event_once_and_in_order_across_an_outage_and_a_restart() {
    let env = env();
    let (ca, tls) = loopback_tls(&env.root_dir().join("sink-tls"));
    let receiver = Receiver::default();
    let port = receiver.start().await;
    // The same receiver over HTTPS, for the manager-wide sink and its token.
    let secure_port = receiver.start_on("127.0.0.1", Some(tls.clone())).await;
    // Another team's receiver, over HTTPS too, naming the token's Secret.
    let other = Receiver::default();
    let other_port = other.start_on("127.0.0.1", Some(tls)).await;
    // A sink pointed at an address inside the cluster's reach that the allow-list does not name (as
    // `http://prometheus…:9090/-/quit` would be): never connected to.
    let inside = Receiver::default();
    let inside_port = inside.start_on("127.0.0.2", None).await;
    let first = start_manager(secure_port, &ca).await;
    let client = env.management().client().await.unwrap();
    let token: Secret = serde_json::from_value(json!({
        "metadata": {"name": "sink-token",
            "labels": {pko_proto::well_known::SINK_CREDENTIALS_LABEL: "true"},
            "annotations": {pko_proto::well_known::SINK_ORIGINS_ANNOTATION:
                format!("https://127.0.0.1:{secure_port}")}},
        "stringData": {"token": "s3cret"},
    }))
    .unwrap();
    Api::<Secret>::namespaced(client.clone(), MANAGER_NAMESPACE)
        .create(&PostParams::default(), &token)
        .await
        .unwrap();

    let risks = [Some("early"), Some("early"), Some("late"), Some("late")];
    let (ns, _clusters) = fleet("sinks", &risks).await;
    let images: Vec<String> = (1..=3)
        .map(|v| build_and_push("handlebars", &format!("sinks:v{v}")))
        .collect();
    let api: Api<HostedClusterPackage> = Api::all(client.clone());
    let name = format!("{ns}-addon");
    let wanted = [
        "rolloutStarted",
        "groupStarted",
        "groupFinished",
        "rolloutFinished",
    ];
    let mut h = hcpkg(
        &name,
        &ns,
        &images[0],
        json!({"rollingUpgrade": {"maxUnavailable": 1}}),
        Some(risk_partition()),
    );
    h.spec.rollout_policy = Some(
        serde_json::from_value(json!({"notifications": [
            {"url": format!("http://127.0.0.1:{port}/addon"), "kinds": wanted},
            {"url": format!("http://127.0.0.2:{inside_port}/-/quit")}]}))
        .unwrap(),
    );
    api.create(&PostParams::default(), &h).await.unwrap();
    wait_status(
        &api,
        &name,
        || first.log_tail(),
        "4/4 on v1",
        |h| all_available(h, 4),
    )
    .await;

    // Another team names the token's Secret for a receiver of its own. Over https the Secret's origin
    // binding keeps the token from it; over http the spec is refused before anything is sent.
    let thief = format!("{ns}-thief");
    let mut stealing = hcpkg(
        &thief,
        &ns,
        &images[0],
        json!({"rollingUpgrade": {"maxUnavailable": 1}}),
        None,
    );
    stealing.spec.rollout_policy = Some(
        serde_json::from_value(json!({"notifications": [{
            "url": format!("https://127.0.0.1:{other_port}/steal"),
            "credentialsSecret": "sink-token"}]}))
        .unwrap(),
    );
    api.create(&PostParams::default(), &stealing).await.unwrap();
    let plain = format!("{ns}-plain");
    let mut over_http = hcpkg(
        &plain,
        &ns,
        &images[0],
        json!({"rollingUpgrade": {"maxUnavailable": 1}}),
        None,
    );
    over_http.spec.rollout_policy = Some(
        serde_json::from_value(json!({"notifications": [{
            "url": format!("http://127.0.0.1:{other_port}/steal"),
            "credentialsSecret": "sink-token"}]}))
        .unwrap(),
    );
    api.create(&PostParams::default(), &over_http)
        .await
        .unwrap();
    wait_status(
        &api,
        &plain,
        || first.log_tail(),
        "credentials over http refused",
        |h| {
            condition(h, "Available").is_some_and(|c| {
                c.reason == "InvalidSpec"
                    && c.message.contains(
                        "spec.rolloutPolicy.notifications[0].credentialsSecret: credentials are sent only over https://",
                    )
            })
        },
    )
    .await;
    wait_status(
        &api,
        &thief,
        || first.log_tail(),
        "the thief's rollout done, its events held back from its sink",
        |h| all_available(h, 4),
    )
    .await;
    wait_until(
        "the thief's sink retrying without the token",
        TIMEOUT,
        || async {
            let retried = first
                .metric(&format!(
                    "pko_cloudevents_deliveries_total{{sink=\"{thief}/0\",result=\"retried\"}}"
                ))
                .await?;
            if retried > 0 {
                Ok(())
            } else {
                Err("no attempt yet".to_owned())
            }
        },
    )
    .await
    .unwrap();
    assert_eq!(other.requests(), 0, "the thief's receiver got a request");
    api.delete(&thief, &Default::default()).await.unwrap();
    api.delete(&plain, &Default::default()).await.unwrap();
    // A new object of the thief's name (issue 63, item 10): its sink starts at the oldest event of that
    // name in the stream, and gets only its own object's.
    wait_until("the thief gone", TIMEOUT, || async {
        match api.get_opt(&thief).await.map_err(|e| e.to_string())? {
            None => Ok(()),
            Some(_) => Err("still there".to_owned()),
        }
    })
    .await
    .unwrap();
    let mut reborn = hcpkg(
        &thief,
        &ns,
        &images[0],
        json!({"rollingUpgrade": {"maxUnavailable": 1}}),
        None,
    );
    reborn.spec.rollout_policy = Some(
        serde_json::from_value(
            json!({"notifications": [{"url": format!("http://127.0.0.1:{port}/reborn")}]}),
        )
        .unwrap(),
    );
    let reborn = api.create(&PostParams::default(), &reborn).await.unwrap();
    let reborn_uid = reborn.metadata.uid.clone().unwrap();
    wait_until("the new object's rollout at its sink", TIMEOUT, || async {
        let got = receiver.at("/reborn");
        if got
            .iter()
            .any(|r| carried(r).kind == RolloutEventKind::RolloutFinished)
        {
            Ok(got)
        } else {
            Err(format!("{} events", got.len()))
        }
    })
    .await
    .unwrap();
    for r in receiver.at("/reborn") {
        assert_eq!(
            carried(&r).uid,
            reborn_uid,
            "the new object's sink got its predecessor's event {:?}",
            carried(&r)
        );
    }
    api.delete(&thief, &Default::default()).await.unwrap();

    wait_until(
        "the sink at 127.0.0.2 refused for its address",
        TIMEOUT,
        || async {
            match first
                .metric(&format!(
                    "pko_cloudevents_address_refusals_total{{sink=\"{name}/1\"}}"
                ))
                .await?
            {
                0 => Err("none yet".to_owned()),
                refused => Ok(refused),
            }
        },
    )
    .await
    .unwrap();

    // The receiver is down for the whole of release 2: the rollout goes on regardless.
    receiver.down.store(true, Ordering::SeqCst);
    roll_image(&api, &name, &images[1]).await;
    wait_status(
        &api,
        &name,
        || first.log_tail(),
        "4/4 on v2 while the receiver is down",
        |h| h.metadata.generation == Some(2) && all_available(h, 4),
    )
    .await;
    wait_until(
        "deliveries retried while the receiver is down",
        TIMEOUT,
        || async {
            let retried = first
                .metric("pko_cloudevents_deliveries_total{sink=\"manager\",result=\"retried\"}")
                .await?;
            let pending = first
                .metric("pko_cloudevents_pending{sink=\"manager\"}")
                .await?;
            if retried > 0 && pending > 0 {
                Ok(())
            } else {
                Err(format!("retried {retried}, pending {pending}"))
            }
        },
    )
    .await
    .unwrap();

    // Stopped with events pending; the successor delivers them once the receiver is back.
    first.terminate(Duration::from_secs(20)).await.unwrap();
    let second = start_manager(secure_port, &ca).await;
    receiver.down.store(false, Ordering::SeqCst);
    roll_image(&api, &name, &images[2]).await;
    wait_status(
        &api,
        &name,
        || second.log_tail(),
        "4/4 on v3",
        |h| h.metadata.generation == Some(3) && all_available(h, 4),
    )
    .await;

    // Each sink gets what the stream holds of this rollout, as the stream orders it, once.
    let stored: Vec<RolloutEvent> = rollout_events(&name)
        .await
        .into_iter()
        .map(|e| serde_json::from_value(e).unwrap())
        .collect();
    let ids = |events: &mut dyn Iterator<Item = &RolloutEvent>| -> Vec<String> {
        events.map(RolloutEvent::message_id).collect()
    };
    let wanted_kinds: BTreeSet<RolloutEventKind> = wanted
        .iter()
        .map(|k| serde_json::from_value(json!(k)).unwrap())
        .collect();
    let want_all = ids(&mut stored.iter());
    let want_addon = ids(&mut stored.iter().filter(|e| wanted_kinds.contains(&e.kind)));
    assert!(
        stored
            .iter()
            .filter(|e| e.kind == RolloutEventKind::RolloutFinished)
            .count()
            == 3,
        "three releases in the stream: {stored:?}"
    );
    wait_until("every event at both sinks", TIMEOUT * 2, || async {
        // This HostedClusterPackage's only: the manager-wide sink also carries the other tests' events.
        let all: Vec<String> = receiver
            .at("/all")
            .iter()
            .filter(|r| carried(r).hosted_cluster_package == name)
            .map(|r| r.event.id().to_owned())
            .collect();
        let addon: Vec<String> = receiver
            .at("/addon")
            .iter()
            .map(|r| r.event.id().to_owned())
            .collect();
        if all.len() >= want_all.len() && addon.len() >= want_addon.len() {
            Ok(())
        } else {
            Err(format!(
                "/all {}/{}, /addon {}/{}",
                all.len(),
                want_all.len(),
                addon.len(),
                want_addon.len()
            ))
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\nmanager log:\n{}", second.log_tail()));
    // The manager-wide sink also got the other HostedClusterPackages' events.
    let all: Vec<Received> = receiver
        .at("/all")
        .into_iter()
        .filter(|r| carried(r).hosted_cluster_package == name)
        .collect();
    let got_all: Vec<String> = all.iter().map(|r| r.event.id().to_owned()).collect();
    let got_addon: Vec<String> = receiver
        .at("/addon")
        .iter()
        .map(|r| r.event.id().to_owned())
        .collect();
    assert_eq!(
        got_all, want_all,
        "the manager's sink: every event once, in stream order"
    );
    assert_eq!(
        got_addon, want_addon,
        "the HostedClusterPackage's sink: its kinds once, in order"
    );
    assert!(*receiver.refused.lock().unwrap() > 0, "the outage was seen");

    for r in &all {
        assert_eq!(r.authorization.as_deref(), Some("Bearer s3cret"));
        let event = carried(r);
        assert_eq!(r.event.id(), event.message_id());
        let kind = serde_json::to_value(event.kind).unwrap();
        assert_eq!(
            r.event.ty(),
            format!("run.package-operator.rollout.{}", kind.as_str().unwrap())
        );
        assert_eq!(
            r.event.source().to_string(),
            format!("/management-clusters/management/hostedclusterpackages/{name}")
        );
        assert!(r.event.time().is_some(), "{r:?} has no time");
    }
    for r in receiver.at("/addon") {
        assert_eq!(r.authorization, None);
    }
    let delivered = second
        .metric("pko_cloudevents_deliveries_total{sink=\"manager\",result=\"delivered\"}")
        .await
        .unwrap();
    assert!(delivered > 0);
    assert_eq!(
        inside.requests(),
        0,
        "the sink inside the cluster's reach was connected to"
    );
    assert_eq!(other.requests(), 0, "the thief's receiver got a request");
}
