//! The rollout policy's health checks, as the supervisor runs them: each due check evaluated off the
//! actor (Prometheus), at most once per interval, its observation kept by (group, check) and counted; a
//! new observation wakes the supervisor.

use std::time::Duration;

use actix::prelude::*;
use k8s_openapi::jiff::Timestamp;

use super::HostedClusterPackageActor;
use crate::engine::api_time::elapsed;
use crate::engine::rollout::health_check::HealthState;
use crate::engine::rollout::rollout_guard::HealthObservation;
use crate::engine::rollout::rollout_policy::HealthCheck;
use crate::rollout::health_queries::unconfigured;

/// How often a health check of a soaking group is evaluated.
pub(super) const HEALTH_CHECK_INTERVAL: Duration = Duration::from_secs(10);

/// One health check evaluated.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(super) struct HealthEvaluated {
    group: String,
    check: String,
    observation: HealthObservation,
}

impl Handler<HealthEvaluated> for HostedClusterPackageActor {
    type Result = ();
    fn handle(&mut self, evaluated: HealthEvaluated, ctx: &mut Context<Self>) {
        let key = (evaluated.group, evaluated.check);
        self.state.evaluating.remove(&key);
        let result = match evaluated.observation.state {
            HealthState::Passing => "passing",
            HealthState::Failing => "failing",
            HealthState::Unknown => "unknown",
        };
        self.context
            .metrics
            .rollouts
            .health_check(&self.name(), result);
        self.state.health.insert(key, evaluated.observation);
        self.request_reconcile(ctx);
    }
}

impl HostedClusterPackageActor {
    /// Evaluates the due health checks that were not evaluated within the interval, off the actor.
    /// Returns when the soonest check skipped now falls due.
    pub(super) fn evaluate_health(
        &mut self,
        due: Vec<(String, HealthCheck)>,
        ctx: &mut Context<Self>,
    ) -> Option<Duration> {
        let now = Timestamp::now();
        let mut soonest: Option<Duration> = None;
        for (group, check) in due {
            let key = (group.clone(), check.name.clone());
            if self.state.evaluating.contains(&key) {
                continue;
            }
            let age = self.state.health.get(&key).map(|o| elapsed(o.at, now));
            if let Some(age) = age.filter(|a| *a < HEALTH_CHECK_INTERVAL) {
                // Evaluated lately: again once the interval is over.
                let left = HEALTH_CHECK_INTERVAL - age;
                soonest = Some(soonest.map_or(left, |s| s.min(left)));
                continue;
            }
            self.state.evaluating.insert(key);
            let prometheus = self.context.rollouts.prometheus.clone();
            let address = ctx.address();
            actix::spawn(async move {
                let observation = match prometheus {
                    Some(p) => p.evaluate(&check).await,
                    None => unconfigured(),
                };
                address.do_send(HealthEvaluated {
                    group,
                    check: check.name,
                    observation,
                });
            });
        }
        soonest
    }
}
