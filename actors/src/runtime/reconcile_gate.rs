//! One run at a time per actor: a request arriving during a run is coalesced into one more run after it,
//! and a failed run is retried after a jittered exponential backoff (`backon`), which a success resets.
//! Used by the reconcile shell (`runtime/object_actor.rs`) and by the HCP namespace writer.

use std::time::Duration;

use actix::prelude::*;
use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};

/// The bounds of a retry backoff. Each delay is drawn from `[d/2, d)` where `d` doubles from `min` up to
/// `max`, so actors that failed together (an apiserver outage) do not retry in lockstep, and no delay
/// exceeds `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub min: Duration,
    pub max: Duration,
}

impl Backoff {
    pub const fn new(min: Duration, max: Duration) -> Self {
        Self { min, max }
    }

    /// A delay drawn from `[d/2, d)`: periodic work of many actors spread out.
    pub fn jittered(d: Duration) -> Duration {
        Self::new(d, d).delays().next().unwrap_or(d)
    }

    /// The delays from `min` doubling to `max`, each drawn from `[d/2, d)`, without end.
    pub fn delays(self) -> ExponentialBackoff {
        // backon's jitter adds up to 100%: halving its bounds keeps every delay below `d`.
        ExponentialBuilder::new()
            .with_min_delay(self.min / 2)
            .with_max_delay(self.max / 2)
            .with_jitter()
            .without_max_times()
            .build()
    }
}

/// The run state of one actor's reconciles.
pub struct ReconcileGate {
    running: bool,
    dirty: bool,
    retry: Option<SpawnHandle>,
    backoff: Backoff,
    delays: ExponentialBackoff,
}

impl ReconcileGate {
    pub fn new(backoff: Backoff) -> Self {
        Self {
            running: false,
            dirty: false,
            retry: None,
            backoff,
            delays: backoff.delays(),
        }
    }

    /// Whether a run is under way.
    pub fn is_running(&self) -> bool {
        self.running
    }

    /// True when a run may start now (a pending retry is cancelled); false when one is running, in which
    /// case another run follows it.
    pub fn try_start<A>(&mut self, ctx: &mut Context<A>) -> bool
    where
        A: Actor<Context = Context<A>>,
    {
        if self.running {
            self.dirty = true;
            return false;
        }
        if let Some(handle) = self.retry.take() {
            ctx.cancel_future(handle);
        }
        self.running = true;
        true
    }

    /// Ends a run. A failed one schedules `rerun` after the next backoff delay. Returns whether a request
    /// arrived during the run, so the caller runs again now.
    pub fn finish<A>(
        &mut self,
        ctx: &mut Context<A>,
        failed: bool,
        rerun: fn(&mut A, &mut Context<A>),
    ) -> bool
    where
        A: Actor<Context = Context<A>>,
    {
        self.running = false;
        if failed {
            let delay = self.delays.next().unwrap_or(self.backoff.max);
            self.retry = Some(ctx.run_later(delay, rerun));
        } else {
            self.reset_backoff();
        }
        std::mem::take(&mut self.dirty)
    }

    /// Starts the backoff over (the object changed: old failures say nothing about it).
    pub fn reset_backoff(&mut self) {
        self.delays = self.backoff.delays();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_within_jitter_and_never_exceed_the_maximum() {
        let backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(8));
        let delays: Vec<Duration> = backoff.delays().take(6).collect();
        let ceilings = [1, 2, 4, 8, 8, 8];
        for (delay, ceiling) in delays.iter().zip(ceilings) {
            let ceiling = Duration::from_secs(ceiling);
            assert!(
                *delay >= ceiling / 2 && *delay < ceiling,
                "{delay:?} not in [{:?}, {ceiling:?})",
                ceiling / 2
            );
        }
    }
}
