//! `/healthz`, `/readyz` and `/metrics` over HTTP/1.1 (hyper). `/metrics` is the manager's registry in
//! the OpenMetrics text format. `/readyz` is ready for a standby waiting for the leader Lease (it can
//! take over at once, and a Deployment's rollout must not wait for it) and for the leader once every
//! watch feed listed its kind; its body says which.
//!
//! Any pod that reaches the port may connect (the shipped NetworkPolicy narrows who), so everything a
//! client can hold is bounded: connection slots overall and per peer address, the time to send a
//! request's head (also the idle limit of a kept-alive connection), a connection's lifetime, the read
//! buffer, and how many `/metrics` renders run at once. Request bodies are never read.

use std::collections::{BTreeSet, HashMap};
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use pko_actors::metrics::exposition::{
    prometheus_text, wants_openmetrics, OPENMETRICS, PROMETHEUS_TEXT,
};
use pko_actors::metrics::listener_metrics::ListenerRefusal;
use pko_actors::metrics::manager_metrics::ManagerMetrics;
use pko_actors::runtime::feed_sync::FeedSync;
use tokio::net::TcpSocket;
use tokio::sync::{Notify, Semaphore};
use tracing::{debug, warn};

/// Connections open at once, from everyone.
const MAX_CONNECTIONS: usize = 256;
/// One peer address's share of them: the kubelet's probes, a Prometheus, an SRE's curl each need one or
/// two; a flood from one pod cannot take the slots the others need.
const MAX_CONNECTIONS_PER_PEER: usize = 8;
/// The least a connection has waited for a request head before a newcomer may displace it: a probe's
/// head is read well within it even on a loaded node, so a burst of connects cannot push out a probe
/// accepted before its task has read what it sent. It also paces the churn of a flood: at most
/// [`MAX_CONNECTIONS`] displacements per this time.
const DISPLACE_AFTER: Duration = Duration::from_millis(50);
/// To send a request's head; also the most a kept-alive connection idles between requests.
const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// The most one connection lives: a client that keeps asking, or never reads its answer, gives its slot
/// back anyway (a response under way gets [`HEADER_TIMEOUT`] more).
const CONNECTION_LIFETIME: Duration = Duration::from_secs(60);
/// The read buffer of a connection (hyper's least): a request here is a line and a few headers.
const READ_BUFFER: usize = 8 * 1024;
/// `/metrics` renders at once (each holds the registry's text); the others wait up to
/// [`METRICS_WAIT`], then get 503.
const METRICS_RENDERS: usize = 2;
const METRICS_WAIT: Duration = Duration::from_secs(10);
/// The kernel's queue of connections not accepted yet (capped by `net.core.somaxconn`): a burst of
/// connects beyond it has SYNs dropped, and a probe caught in the drop waits a second for its
/// retransmission.
const LISTEN_BACKLOG: u32 = 4096;
/// After a failed accept (out of file descriptors), a pause before the next, rather than a spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Where the process stands, for `/readyz`.
#[derive(Debug, Clone)]
pub enum Readiness {
    Starting,
    /// Waiting for the leader Lease.
    Standby,
    /// Reconciling; ready once the feeds listed their kinds.
    Leading(FeedSync),
    /// Sharded: reconciling this replica's share; ready once the feeds listed it.
    ShardMember(FeedSync),
    Stopping,
}

/// What the endpoints report; cheap to clone.
#[derive(Clone)]
pub struct HealthState {
    readiness: Arc<RwLock<Readiness>>,
    metrics: ManagerMetrics,
    renders: Arc<Semaphore>,
}

impl HealthState {
    pub fn new(metrics: ManagerMetrics) -> Self {
        Self {
            readiness: Arc::new(RwLock::new(Readiness::Starting)),
            metrics,
            renders: Arc::new(Semaphore::new(METRICS_RENDERS)),
        }
    }

    pub fn set(&self, readiness: Readiness) {
        *self
            .readiness
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = readiness;
    }

    fn readyz(&self) -> (StatusCode, String) {
        let readiness = self
            .readiness
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone();
        match readiness {
            Readiness::Starting => (StatusCode::SERVICE_UNAVAILABLE, "starting\n".into()),
            Readiness::Stopping => (StatusCode::SERVICE_UNAVAILABLE, "stopping\n".into()),
            Readiness::Standby => (StatusCode::OK, "ok: standby\n".into()),
            Readiness::Leading(feeds) if feeds.all_synced() => {
                (StatusCode::OK, "ok: leader, caches synced\n".into())
            }
            Readiness::Leading(feeds) => {
                let (all, synced) = feeds.progress();
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("leader, caches syncing ({synced}/{all} feeds listed)\n"),
                )
            }
            Readiness::ShardMember(feeds) if feeds.all_synced() => {
                (StatusCode::OK, "ok: shard member, caches synced\n".into())
            }
            Readiness::ShardMember(feeds) => {
                let (all, synced) = feeds.progress();
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("shard member, caches syncing ({synced}/{all} feeds listed)\n"),
                )
            }
        }
    }

    /// The registry's text, rendered off the runtime's workers, at most [`METRICS_RENDERS`] at once.
    async fn render_metrics(&self, openmetrics: bool) -> Option<String> {
        let permit = tokio::time::timeout(METRICS_WAIT, self.renders.clone().acquire_owned())
            .await
            .ok()?
            .ok()?;
        let metrics = self.metrics.clone();
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            let text = metrics.encode();
            if openmetrics {
                text
            } else {
                prometheus_text(&text)
            }
        })
        .await
        .ok()
    }

    async fn respond(&self, request: &Request<Incoming>) -> Response<Full<Bytes>> {
        let (status, content_type, body) = match (request.method(), request.uri().path()) {
            (&Method::GET, "/healthz") => (StatusCode::OK, "text/plain", "ok\n".to_owned()),
            (&Method::GET, "/readyz") => {
                let (status, body) = self.readyz();
                (status, "text/plain", body)
            }
            (&Method::GET, "/metrics") => {
                let accept = request
                    .headers()
                    .get(hyper::header::ACCEPT)
                    .and_then(|v| v.to_str().ok());
                let openmetrics = wants_openmetrics(accept);
                match self.render_metrics(openmetrics).await {
                    Some(text) if openmetrics => (StatusCode::OK, OPENMETRICS, text),
                    Some(text) => (StatusCode::OK, PROMETHEUS_TEXT, text),
                    None => {
                        self.metrics.listener.refused(ListenerRefusal::MetricsBusy);
                        (
                            StatusCode::SERVICE_UNAVAILABLE,
                            "text/plain",
                            "busy: other scrapes are being rendered\n".to_owned(),
                        )
                    }
                }
            }
            (&Method::GET, _) => (
                StatusCode::NOT_FOUND,
                "text/plain",
                "not found\n".to_owned(),
            ),
            _ => (
                StatusCode::METHOD_NOT_ALLOWED,
                "text/plain",
                "only GET\n".to_owned(),
            ),
        };
        let mut response = Response::new(Full::new(Bytes::from(body)));
        *response.status_mut() = status;
        if let Ok(value) = content_type.parse() {
            response
                .headers_mut()
                .insert(hyper::header::CONTENT_TYPE, value);
        }
        response
    }
}

/// The listener's connection slots: [`MAX_CONNECTIONS`] overall, [`MAX_CONNECTIONS_PER_PEER`] per peer
/// address. When every slot is taken, a newcomer waits in the accept queue while the connection that has
/// waited longest for a request head (new, or idle between requests), and at least [`DISPLACE_AFTER`],
/// is told to go; its slot is the newcomer's once it is gone. A flood from many addresses then churns
/// through its own connections, while a probe, which sends its head at once, gets in and is answered:
/// the accept loop never runs ahead of the connections it has admitted.
struct ConnectionSlots {
    max: usize,
    per_peer: usize,
    displace_after: Duration,
    taken: Mutex<SlotsTaken>,
    /// Told when a slot is given back or a connection starts waiting for a head again.
    changed: Notify,
}

#[derive(Default)]
struct SlotsTaken {
    /// Connections open, the ones told to go included until they are gone.
    total: usize,
    /// Of them, told to go and not gone yet.
    leaving: usize,
    peers: HashMap<IpAddr, usize>,
    next: u64,
    connections: HashMap<u64, ConnectionState>,
    /// Connections waiting for a request head, by since when, then by number.
    waiting: BTreeSet<(Instant, u64)>,
}

struct ConnectionState {
    /// Since when it waits for a request head; `None` while a request is answered.
    waiting_since: Option<Instant>,
    /// Told to go, to make room for a newcomer.
    told: bool,
    displaced: Arc<Notify>,
}

/// What a newcomer gets.
enum Admission {
    Slot(ConnectionSlot),
    /// Every slot is taken: wait for one to be given back, or until `retry_at` (when the longest-waiting
    /// connection may be displaced). `displaced` says whether one was just told to go.
    Full {
        displaced: bool,
        retry_at: Option<Instant>,
    },
}

/// A connection's slot, given back when it is dropped.
struct ConnectionSlot {
    slots: Arc<ConnectionSlots>,
    peer: IpAddr,
    number: u64,
    /// Told when a newcomer displaces this connection.
    displaced: Arc<Notify>,
}

impl ConnectionSlots {
    fn new(max: usize, per_peer: usize, displace_after: Duration) -> Arc<Self> {
        Arc::new(Self {
            max,
            per_peer,
            displace_after,
            taken: Mutex::new(SlotsTaken::default()),
            changed: Notify::new(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SlotsTaken> {
        self.taken
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Admission of a connection from `peer` at `now`; refused at once only when its peer holds its
    /// share.
    fn take(self: &Arc<Self>, peer: IpAddr, now: Instant) -> Result<Admission, ListenerRefusal> {
        let peer = peer.to_canonical();
        let mut taken = self.lock();
        if taken.peers.get(&peer).copied().unwrap_or(0) >= self.per_peer {
            return Err(ListenerRefusal::Peer);
        }
        if taken.total >= self.max {
            if taken.leaving > 0 {
                // A slot is on its way.
                return Ok(Admission::Full {
                    displaced: false,
                    retry_at: None,
                });
            }
            let Some(&(since, number)) = taken.waiting.first() else {
                return Ok(Admission::Full {
                    displaced: false,
                    retry_at: None,
                });
            };
            let displaceable_at = since + self.displace_after;
            if displaceable_at > now {
                return Ok(Admission::Full {
                    displaced: false,
                    retry_at: Some(displaceable_at),
                });
            }
            taken.waiting.remove(&(since, number));
            taken.leaving += 1;
            if let Some(state) = taken.connections.get_mut(&number) {
                state.waiting_since = None;
                state.told = true;
                state.displaced.notify_one();
            }
            return Ok(Admission::Full {
                displaced: true,
                retry_at: None,
            });
        }
        *taken.peers.entry(peer).or_default() += 1;
        taken.total += 1;
        let number = taken.next;
        taken.next += 1;
        let displaced = Arc::new(Notify::new());
        taken.waiting.insert((now, number));
        taken.connections.insert(
            number,
            ConnectionState {
                waiting_since: Some(now),
                told: false,
                displaced: displaced.clone(),
            },
        );
        Ok(Admission::Slot(ConnectionSlot {
            slots: self.clone(),
            peer,
            number,
            displaced,
        }))
    }

    /// Until a slot is given back or a connection waits for a head again, or until `retry_at`.
    async fn wait_for_change(&self, retry_at: Option<Instant>) {
        match retry_at {
            Some(at) => {
                tokio::select! {
                    () = self.changed.notified() => {}
                    () = tokio::time::sleep_until(at.into()) => {}
                }
            }
            None => self.changed.notified().await,
        }
    }
}

impl ConnectionSlot {
    /// A request is being answered: not to be displaced.
    fn busy(&self) {
        let mut taken = self.slots.lock();
        let since = taken
            .connections
            .get_mut(&self.number)
            .and_then(|state| state.waiting_since.take());
        if let Some(since) = since {
            taken.waiting.remove(&(since, self.number));
        }
    }

    /// Answered; waiting for the next head again (displaceable, as the longest waiting goes first).
    fn idle(&self) {
        let now = Instant::now();
        {
            let mut taken = self.slots.lock();
            let Some(state) = taken.connections.get_mut(&self.number) else {
                return;
            };
            if state.told {
                return;
            }
            state.waiting_since = Some(now);
            taken.waiting.insert((now, self.number));
        }
        self.slots.changed.notify_one();
    }
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        {
            let mut taken = self.slots.lock();
            if let Some(state) = taken.connections.remove(&self.number) {
                if let Some(since) = state.waiting_since {
                    taken.waiting.remove(&(since, self.number));
                }
                if state.told {
                    taken.leaving = taken.leaving.saturating_sub(1);
                }
            }
            taken.total = taken.total.saturating_sub(1);
            if let Some(held) = taken.peers.get_mut(&self.peer) {
                *held = held.saturating_sub(1);
                if *held == 0 {
                    taken.peers.remove(&self.peer);
                }
            }
        }
        self.slots.changed.notify_one();
    }
}

/// Binds the listener; serving runs in the background until the process ends.
pub async fn serve(addr: SocketAddr, state: HealthState) -> std::io::Result<SocketAddr> {
    let socket = match addr {
        SocketAddr::V4(_) => TcpSocket::new_v4()?,
        SocketAddr::V6(_) => TcpSocket::new_v6()?,
    };
    // As TcpListener::bind does: a restarted manager binds at once.
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    let listener = socket.listen(LISTEN_BACKLOG)?;
    let bound = listener.local_addr()?;
    let slots = ConnectionSlots::new(MAX_CONNECTIONS, MAX_CONNECTIONS_PER_PEER, DISPLACE_AFTER);
    tokio::spawn(async move {
        loop {
            let (stream, peer) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(error) => {
                    warn!(%error, "health listener accept failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            };
            let slot = loop {
                match slots.take(peer.ip(), Instant::now()) {
                    Ok(Admission::Slot(slot)) => break Some(slot),
                    Ok(Admission::Full {
                        displaced,
                        retry_at,
                    }) => {
                        if displaced {
                            state.metrics.listener.refused(ListenerRefusal::Displaced);
                        }
                        // The newcomers behind this one wait in the kernel's backlog meanwhile.
                        slots.wait_for_change(retry_at).await;
                    }
                    Err(refusal) => {
                        state.metrics.listener.refused(refusal);
                        break None;
                    }
                }
            };
            // Refused: closed at once, the backlog keeps moving for everyone else.
            let Some(slot) = slot else {
                drop(stream);
                continue;
            };
            tokio::spawn(serve_connection(stream, slot, state.clone()));
        }
    });
    Ok(bound)
}

async fn serve_connection(stream: tokio::net::TcpStream, slot: ConnectionSlot, state: HealthState) {
    let listener = state.metrics.listener.clone();
    listener.opened();
    let slot = Arc::new(slot);
    let displaced = slot.displaced.clone();
    let answering = slot.clone();
    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
        let state = state.clone();
        let slot = answering.clone();
        async move {
            slot.busy();
            let response = state.respond(&request).await;
            slot.idle();
            Ok::<_, Infallible>(response)
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .max_buf_size(READ_BUFFER);
    let connection = builder.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(connection);
    let served = tokio::select! {
        served = connection.as_mut() => served,
        // Dropped: the socket closes with the connection.
        () = displaced.notified() => Ok(()),
        () = tokio::time::sleep(CONNECTION_LIFETIME) => {
            listener.refused(ListenerRefusal::Lifetime);
            connection.as_mut().graceful_shutdown();
            tokio::time::timeout(HEADER_TIMEOUT, connection).await.unwrap_or(Ok(()))
        }
    };
    if let Err(error) = served {
        debug!(%error, "health connection failed");
    }
    listener.closed();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    const GRACE: Duration = Duration::from_millis(100);

    fn slot(admission: Result<Admission, ListenerRefusal>) -> ConnectionSlot {
        match admission {
            Ok(Admission::Slot(slot)) => slot,
            Ok(Admission::Full { .. }) => panic!("no slot: full"),
            Err(refusal) => panic!("no slot: {refusal:?}"),
        }
    }

    fn full(admission: Result<Admission, ListenerRefusal>) -> (bool, Option<Instant>) {
        match admission {
            Ok(Admission::Full {
                displaced,
                retry_at,
            }) => (displaced, retry_at),
            Ok(Admission::Slot(_)) => panic!("admitted, not full"),
            Err(refusal) => panic!("refused: {refusal:?}"),
        }
    }

    #[test]
    fn a_peer_holds_only_its_share_and_slots_come_back() {
        let slots = ConnectionSlots::new(3, 2, GRACE);
        let now = Instant::now();
        let first = slot(slots.take(ip("10.0.0.9"), now));
        let _second = slot(slots.take(ip("10.0.0.9"), now));
        assert_eq!(
            slots.take(ip("10.0.0.9"), now).err(),
            Some(ListenerRefusal::Peer)
        );
        // The same peer as an IPv4-mapped IPv6 address is the same peer.
        assert_eq!(
            slots.take(ip("::ffff:10.0.0.9"), now).err(),
            Some(ListenerRefusal::Peer)
        );
        drop(first);
        let _again = slot(slots.take(ip("10.0.0.9"), now));
    }

    #[tokio::test]
    async fn a_newcomer_waits_for_the_longest_waiting_connection_to_go() {
        let slots = ConnectionSlots::new(2, 2, GRACE);
        let start = Instant::now();
        let oldest = slot(slots.take(ip("10.0.0.9"), start));
        let answering = slot(slots.take(ip("10.0.0.8"), start));
        answering.busy();
        // Nobody has waited long enough to be displaced: the newcomer waits until one has.
        assert_eq!(
            full(slots.take(ip("10.0.0.1"), start)),
            (false, Some(start + GRACE))
        );
        assert!(!told(&oldest.displaced).await);
        // Then the longest waiting is told to go, not the busy one; the newcomer waits for it to be gone
        // and no second connection is told meanwhile.
        let later = start + GRACE;
        assert_eq!(full(slots.take(ip("10.0.0.1"), later)), (true, None));
        assert!(told(&oldest.displaced).await);
        assert!(!told(&answering.displaced).await);
        assert_eq!(full(slots.take(ip("10.0.0.1"), later)), (false, None));
        drop(oldest);
        let probe = slot(slots.take(ip("10.0.0.1"), later));
        // Every slot busy: nobody to displace, wait for a slot to come back.
        probe.busy();
        assert_eq!(full(slots.take(ip("10.0.0.2"), later)), (false, None));
        // Idle again, the connection that answered waits from now on: the one idle longest goes first.
        answering.idle();
        probe.idle();
        let much_later = Instant::now() + GRACE;
        assert_eq!(full(slots.take(ip("10.0.0.2"), much_later)), (true, None));
        assert!(told(&answering.displaced).await);
        assert!(!told(&probe.displaced).await);
        // A connection told to go does not come back as waiting.
        answering.idle();
        assert_eq!(full(slots.take(ip("10.0.0.2"), much_later)), (false, None));
    }

    /// Whether `notify` was told (holds a permit), without waiting; the permit is kept.
    async fn told(notify: &Notify) -> bool {
        let told = tokio::time::timeout(Duration::ZERO, notify.notified())
            .await
            .is_ok();
        if told {
            notify.notify_one();
        }
        told
    }
}
