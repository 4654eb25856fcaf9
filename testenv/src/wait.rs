//! Waiting on a condition with a deadline: the only way the harness (and tests built on it) synchronise
//! with servers.

use std::future::Future;
use std::time::{Duration, Instant};

use crate::error::TestEnvError;

/// Interval between checks; short, because every check is a cheap local request.
const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// One check's verdict.
pub(crate) enum Check<T> {
    /// The condition holds.
    Ready(T),
    /// Not yet, for this reason.
    Pending(String),
    /// It never will (a server exited); stop waiting.
    Failed(TestEnvError),
}

/// Calls `check` until it returns `Ok(value)` or `timeout` passes; the error then carries the last reason
/// `check` gave.
pub async fn wait_until<T, F, Fut>(
    what: &str,
    timeout: Duration,
    mut check: F,
) -> Result<T, TestEnvError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    poll_until(what, timeout, || {
        let attempt = check();
        async move {
            match attempt.await {
                Ok(value) => Check::Ready(value),
                Err(reason) => Check::Pending(reason),
            }
        }
    })
    .await
}

/// Like [`wait_until`], but a check may also fail for good.
pub(crate) async fn poll_until<T, F, Fut>(
    what: &str,
    timeout: Duration,
    mut check: F,
) -> Result<T, TestEnvError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Check<T>>,
{
    let started = Instant::now();
    loop {
        let last_error = match check().await {
            Check::Ready(value) => return Ok(value),
            Check::Failed(error) => return Err(error),
            Check::Pending(reason) => reason,
        };
        if started.elapsed() >= timeout {
            return Err(TestEnvError::NotReady {
                what: what.to_owned(),
                after: timeout,
                last_error,
                log_tail: None,
            });
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}
