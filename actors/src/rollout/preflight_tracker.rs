//! A supervisor's bookkeeping of its release preflights: the one running (at most one; a newer one
//! stops it, and so does the supervisor stopping), and the one that did not finish with when it may run
//! again (a jittered backoff from 5 s to 5 min, so an apiserver or registry outage is not hammered by
//! every HostedClusterPackage at once). No I/O.

use std::time::{Duration, Instant};

use backon::ExponentialBackoff;

use crate::engine::rollout::preflight_gate::PreflightRun;
use crate::runtime::reconcile_gate::Backoff;

const RETRY: Backoff = Backoff::new(Duration::from_secs(5), Duration::from_secs(300));

/// The preflight running now.
struct Running {
    run: PreflightRun,
    task: tokio::task::AbortHandle,
}

impl Drop for Running {
    /// A preflight nobody waits for any more stops.
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A preflight that did not finish, and when it may run again.
struct Retry {
    run: PreflightRun,
    not_before: Instant,
    delays: ExponentialBackoff,
}

#[derive(Default)]
pub struct PreflightTracker {
    running: Option<Running>,
    retry: Option<Retry>,
}

impl PreflightTracker {
    /// Whether `run` should start now: it is not running, and not waiting out a retry delay.
    pub fn may_start(&self, run: &PreflightRun, now: Instant) -> bool {
        let running = self.running.as_ref().is_some_and(|r| r.run == *run);
        let waiting = self
            .retry
            .as_ref()
            .is_some_and(|r| r.run == *run && now < r.not_before);
        !running && !waiting
    }

    /// `run` started as `task` (stopping the one running before).
    pub fn started(&mut self, run: PreflightRun, task: tokio::task::AbortHandle) {
        self.running = Some(Running { run, task });
    }

    /// `run` ended: it no longer runs.
    fn ended(&mut self, run: &PreflightRun) {
        // Its task has sent its result, its last step: stopping it changes nothing.
        if self.running.as_ref().is_some_and(|r| r.run == *run) {
            self.running = None;
        }
    }

    /// `run` finished.
    pub fn finished(&mut self, run: &PreflightRun) {
        self.ended(run);
        self.retry = None;
    }

    /// `run` did not finish: how long until it may run again.
    pub fn failed(&mut self, run: PreflightRun, now: Instant) -> Duration {
        self.ended(&run);
        let mut retry = self
            .retry
            .take()
            .filter(|r| r.run == run)
            .unwrap_or_else(|| Retry {
                run,
                not_before: now,
                delays: RETRY.delays(),
            });
        let delay = retry.delays.next().unwrap_or(RETRY.max);
        retry.not_before = now + delay;
        self.retry = Some(retry);
        delay
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(hash: &str) -> PreflightRun {
        PreflightRun {
            template_hash: hash.into(),
            inputs_hash: "i".into(),
            request: String::new(),
        }
    }

    #[tokio::test]
    async fn a_failed_run_waits_out_its_delay_and_another_run_does_not() {
        let mut tracker = PreflightTracker::default();
        let now = Instant::now();
        assert!(tracker.may_start(&run("a"), now));
        let task = tokio::spawn(std::future::pending::<()>());
        tracker.started(run("a"), task.abort_handle());
        assert!(!tracker.may_start(&run("a"), now), "it runs");
        assert!(
            tracker.may_start(&run("b"), now),
            "a newer template starts at once"
        );
        let first = tracker.failed(run("a"), now);
        assert!(first >= Duration::from_millis(2500) && first < Duration::from_secs(5));
        assert!(!tracker.may_start(&run("a"), now + first / 2));
        assert!(tracker.may_start(&run("a"), now + first));
        assert!(tracker.may_start(&run("b"), now));
        let second = tracker.failed(run("a"), now + first);
        assert!(
            second >= Duration::from_secs(5),
            "the delay grows: {second:?}"
        );
        tracker.finished(&run("a"));
        assert!(tracker.may_start(&run("a"), now + first));
    }

    #[tokio::test]
    async fn a_replaced_run_is_stopped() {
        let mut tracker = PreflightTracker::default();
        let old = tokio::spawn(std::future::pending::<()>());
        tracker.started(run("a"), old.abort_handle());
        let new = tokio::spawn(std::future::pending::<()>());
        tracker.started(run("b"), new.abort_handle());
        assert!(old.await.unwrap_err().is_cancelled());
        drop(tracker);
        assert!(
            new.await.unwrap_err().is_cancelled(),
            "the supervisor went: it stops too"
        );
    }
}
