//! Orphaning a set (deleted with `propagationPolicy: Orphan`): its objects stay, and none of them may
//! keep a reference to it once it is gone, or the garbage collector deletes them as dependents of a
//! deleted owner. The collector takes the references off when the apiserver adds the `orphan`
//! finalizer, but an apply of this set sent before pko saw the deletion can land after that and write
//! the reference back (the chaos run, seed 839: the collector's removal, then pko's apply 2 revisions
//! later, then the ConfigMap deleted with the set). So the set waits for its phases to stop, takes its
//! own reference off every object it planned, and only then drops its finalizer. The collector drops
//! the `orphan` finalizer meanwhile; the set stays orphaning for the rest of its deletion (seed 839
//! again: the plan that followed that change tore the written-back ConfigMap down).

use actix::prelude::*;
use tracing::{info, warn};

use super::{ObjectSetActor, FINALIZER_RETRY};
use crate::engine::objects::object_ref::ObjectKey;
use crate::objects::applier::ApplyError;

impl ObjectSetActor {
    /// Lets go of the set's objects (`planned`, or those of the plan its phases run) once its phases
    /// stopped, then drops the finalizer; retried on failure. The objects are those of the first call;
    /// every later change of the set looks at them again, as a reference written back after a pass
    /// would make them the set's dependents again.
    pub(super) fn orphan_objects(
        &mut self,
        planned: Option<Vec<ObjectKey>>,
        ctx: &mut Context<Self>,
    ) {
        if self.state.orphaned.is_none() {
            let keys = planned.unwrap_or_else(|| self.state.object_phase.keys().cloned().collect());
            self.state.orphaned = Some(keys);
        }
        if self.state.releasing {
            self.state.release_again = true;
            return;
        }
        self.release_references(ctx);
    }

    fn release_references(&mut self, ctx: &mut Context<Self>) {
        let (Some(keys), Some(applier)) = (self.state.orphaned.clone(), self.state.applier.clone())
        else {
            // Never planned: no phase of it wrote anything.
            self.stop_phases();
            return self.write_finalizer(false, ctx);
        };
        self.state.releasing = true;
        let uid = self
            .object
            .as_ref()
            .and_then(|s| s.meta.uid.clone())
            .unwrap_or_default();
        let stopped = self.phases_stopped();
        let work = async move {
            stopped.await;
            let mut released = 0;
            for key in &keys {
                let Some(observed) = applier.get_served(key).await? else {
                    continue;
                };
                match applier.release_owner(key, &observed, &uid).await {
                    Ok(stored) => released += usize::from(stored != observed),
                    // Gone between the read and the write: nothing left to let go of.
                    Err(e) if e.is_not_found() => {}
                    Err(e) => return Err(e),
                }
            }
            Ok::<usize, ApplyError>(released)
        };
        self.spawn_write(
            ctx,
            work.into_actor(self).map(|result, act, ctx| match result {
                Ok(released) => {
                    act.state.releasing = false;
                    if released > 0 {
                        info!(
                            released,
                            "took this orphaned set's reference off objects it was written back to"
                        );
                    }
                    act.write_finalizer(false, ctx);
                    if std::mem::take(&mut act.state.release_again) {
                        act.release_references(ctx);
                    }
                }
                Err(error) => {
                    warn!(%error, "letting go of an orphaned set's objects failed; retrying");
                    ctx.run_later(FINALIZER_RETRY, Self::release_references);
                }
            }),
        );
    }
}
