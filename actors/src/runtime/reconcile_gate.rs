//! One reconcile at a time per actor: a request arriving during a run is coalesced into one more run
//! after it, and a failed run is retried after an exponential backoff, which a success resets. Shared by
//! the actors that own one object each (ObjectDeployment, Package, ObjectTemplate).

use std::time::Duration;

use actix::prelude::*;

/// The run state of one actor's reconciles.
pub struct ReconcileGate {
    running: bool,
    dirty: bool,
    retry: Option<SpawnHandle>,
    backoff: Duration,
    min: Duration,
    max: Duration,
}

impl ReconcileGate {
    /// Backoff from `min`, doubling up to `max`.
    pub fn new(min: Duration, max: Duration) -> Self {
        Self {
            running: false,
            dirty: false,
            retry: None,
            backoff: min,
            min,
            max,
        }
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

    /// Ends a run. A failed one schedules `rerun` after the backoff. Returns whether a request arrived
    /// during the run, so the caller runs again now.
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
            let delay = self.backoff;
            self.backoff = (self.backoff * 2).min(self.max);
            self.retry = Some(ctx.run_later(delay, rerun));
        } else {
            self.backoff = self.min;
        }
        std::mem::take(&mut self.dirty)
    }

    /// Starts the backoff over (the object changed: old failures say nothing about it).
    pub fn reset_backoff(&mut self) {
        self.backoff = self.min;
    }
}
