//! The write fence: until when this replica may change anything on the apiserver. The leader Lease
//! keeps it open up to its renew deadline; a client built with [`WriteFenceLayer`] refuses every request
//! that is not a read once that time has passed, whatever thread sends it and however long the process
//! was stopped. It must not decide leadership itself: only the Lease thread moves the deadline, and a
//! take-over recorded on a shard member's Lease seals it for good (`shard_membership`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use futures::future::{Either, Ready};
use http::{Method, Request};

/// A write was refused because this replica's leadership is not (or no longer) confirmed.
#[derive(Debug, thiserror::Error)]
#[error("write refused: this replica does not hold the leader Lease (renew deadline passed)")]
pub struct WriteFenceClosed;

#[derive(Debug)]
struct Deadline {
    origin: Instant,
    /// Nanoseconds after `origin` until which writes pass; `u64::MAX` for a fence that never closes.
    until: AtomicU64,
    /// Closed for good: no renewal opens it again.
    sealed: AtomicBool,
}

/// Until when writes may go out; cheap to clone, shared by the Lease thread and the clients.
#[derive(Debug, Clone)]
pub struct WriteFence(Arc<Deadline>);

impl WriteFence {
    /// A fence that never closes: a process without leader election.
    pub fn open() -> Self {
        Self::with_until(u64::MAX)
    }

    /// The fence of a process's writing client: closed until a Lease is held under leader election,
    /// open for good without it.
    pub fn for_leader_election(enabled: bool) -> Self {
        if enabled {
            Self::closed()
        } else {
            Self::open()
        }
    }

    /// A fence that refuses writes until [`WriteFence::open_until`] moves it.
    pub fn closed() -> Self {
        Self::with_until(0)
    }

    fn with_until(until: u64) -> Self {
        Self(Arc::new(Deadline {
            origin: Instant::now(),
            until: AtomicU64::new(until),
            sealed: AtomicBool::new(false),
        }))
    }

    /// Writes may go out until `deadline` (monotonic: time a stopped process spent stopped counts).
    pub fn open_until(&self, deadline: Instant) {
        if self.0.sealed.load(Ordering::SeqCst) {
            return;
        }
        let nanos = deadline.saturating_duration_since(self.0.origin).as_nanos();
        let nanos = u64::try_from(nanos).unwrap_or(u64::MAX - 1);
        self.0.until.store(nanos, Ordering::SeqCst);
    }

    /// Refuses writes from now on.
    pub fn close(&self) {
        self.0.until.store(0, Ordering::SeqCst);
    }

    /// Refuses writes for good, whatever a renewal in flight does next: this replica's tenure ended.
    /// Returns whether it was not sealed before.
    pub fn seal(&self) -> bool {
        self.close();
        !self.0.sealed.swap(true, Ordering::SeqCst)
    }

    /// Whether a write may go out now.
    pub fn allows_writes(&self) -> bool {
        if self.0.sealed.load(Ordering::SeqCst) {
            return false;
        }
        let until = self.0.until.load(Ordering::SeqCst);
        if until == u64::MAX {
            return true;
        }
        let now = Instant::now()
            .saturating_duration_since(self.0.origin)
            .as_nanos();
        now < u128::from(until)
    }
}

/// Whether a request only reads.
fn reads_only(method: &Method) -> bool {
    matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

/// Adds the fence to a client's request stack.
#[derive(Debug, Clone)]
pub struct WriteFenceLayer(pub WriteFence);

impl<S> tower::Layer<S> for WriteFenceLayer {
    type Service = Fenced<S>;

    fn layer(&self, inner: S) -> Fenced<S> {
        Fenced {
            inner,
            fence: self.0.clone(),
        }
    }
}

/// A request service that refuses writes while its fence is closed.
#[derive(Debug, Clone)]
pub struct Fenced<S> {
    inner: S,
    fence: WriteFence,
}

impl<S, B> tower::Service<Request<B>> for Fenced<S>
where
    S: tower::Service<Request<B>>,
    S::Error: From<WriteFenceClosed>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Either<Ready<Result<S::Response, S::Error>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        if reads_only(request.method()) || self.fence.allows_writes() {
            Either::Right(self.inner.call(request))
        } else {
            Either::Left(futures::future::ready(Err(WriteFenceClosed.into())))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_fence_closes_at_its_deadline_and_reads_always_pass() {
        let fence = WriteFence::closed();
        assert!(!fence.allows_writes());
        fence.open_until(Instant::now() + Duration::from_secs(60));
        assert!(fence.allows_writes());
        fence.open_until(Instant::now() - Duration::from_millis(1));
        assert!(!fence.allows_writes());
        fence.open_until(Instant::now() + Duration::from_secs(60));
        fence.close();
        assert!(!fence.allows_writes());
        assert!(WriteFence::open().allows_writes());
        assert!(reads_only(&Method::GET));
        for write in [Method::POST, Method::PUT, Method::PATCH, Method::DELETE] {
            assert!(!reads_only(&write));
        }
    }

    #[test]
    fn a_sealed_fence_stays_closed_whatever_a_renewal_does() {
        let fence = WriteFence::closed();
        fence.open_until(Instant::now() + Duration::from_secs(60));
        assert!(fence.seal(), "sealed the first time");
        assert!(!fence.seal(), "only once");
        fence.open_until(Instant::now() + Duration::from_secs(60));
        assert!(!fence.allows_writes());
        let never_closing = WriteFence::open();
        never_closing.seal();
        assert!(!never_closing.allows_writes());
    }

    #[tokio::test]
    async fn a_closed_fence_refuses_writes_before_they_reach_the_client() {
        use tower::{Layer, ServiceExt};
        type BoxError = Box<dyn std::error::Error + Send + Sync>;
        let sent = Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = sent.clone();
        let inner = tower::service_fn(move |request: Request<()>| {
            seen.lock().unwrap().push(request.method().clone());
            async { Ok::<_, BoxError>(()) }
        });
        let fence = WriteFence::closed();
        let service = WriteFenceLayer(fence.clone()).layer(inner);
        let request = |method: Method| Request::builder().method(method).body(()).unwrap();
        service.clone().oneshot(request(Method::GET)).await.unwrap();
        let refused = service.clone().oneshot(request(Method::PATCH)).await;
        assert!(refused.unwrap_err().is::<WriteFenceClosed>());
        fence.open_until(Instant::now() + Duration::from_secs(60));
        service
            .clone()
            .oneshot(request(Method::PATCH))
            .await
            .unwrap();
        assert_eq!(*sent.lock().unwrap(), [Method::GET, Method::PATCH]);
    }
}
