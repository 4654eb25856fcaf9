//! The supervisor and the fleet's hub: the rollout record it keeps there (where this rollout stands, its
//! gate, a halted release), the promotion gate's own rollout events, and the hub's changes waking it.

use actix::prelude::*;
use k8s_openapi::jiff::Timestamp;
use pko_proto::core::hosted_cluster_package::HostedClusterPackageStatus;
use pko_proto::rollout_events::RolloutEventKind;

use super::{HostedClusterPackageActor, HubReport};
use crate::engine::fleet::promotion_gate::{
    record_changed, rollout_record, GateVerdict, OwnRollout,
};
use crate::engine::rollout::rollout_status::AVAILABLE;
use crate::fleet::hub_link::HubLink;

/// What the fleet's hub reports changed.
#[derive(Debug, Message)]
#[rtype(result = "()")]
struct HubChanged;

/// The hub's changes as a stream of [`HubChanged`].
fn hub_changes(
    changes: tokio::sync::watch::Receiver<u64>,
) -> impl futures::Stream<Item = HubChanged> {
    futures::stream::unfold(changes, |mut changes| async move {
        changes.changed().await.ok()?;
        Some((HubChanged, changes))
    })
}

impl StreamHandler<HubChanged> for HostedClusterPackageActor {
    fn handle(&mut self, _: HubChanged, ctx: &mut Context<Self>) {
        self.request_reconcile(ctx);
    }

    /// The hub link lives as long as the manager.
    fn finished(&mut self, _: &mut Context<Self>) {}
}

impl HostedClusterPackageActor {
    /// Decides again whenever the hub's records or reachability change (once per supervisor): a gate
    /// may open, and a release halted elsewhere halts here.
    pub(super) fn follow_hub(&mut self, hub: &HubLink, ctx: &mut Context<Self>) {
        if !std::mem::replace(&mut self.state.following_hub, true) {
            ctx.add_stream(hub_changes(hub.subscribe()));
        }
    }

    /// The promotion gate's own step: `promotionOpened` when it opened now, `promotionWaiting` when whom
    /// it waits for changed.
    pub(super) fn gate_step(
        &mut self,
        gate: &GateVerdict,
        generation: i64,
    ) -> Option<crate::engine::rollout::rollout_events::RolloutStep> {
        let (kind, message) = match gate {
            GateVerdict::Ungated | GateVerdict::Open { opened: None } => return None,
            GateVerdict::Open { opened: Some(_) } => {
                self.state.gate_told = None;
                (RolloutEventKind::PromotionOpened, String::new())
            }
            GateVerdict::Closed(closed) => {
                let told = (
                    generation,
                    format!("{}: {}", closed.reason, closed.waiting_for),
                );
                if self.state.gate_told.as_ref() == Some(&told) {
                    return None;
                }
                self.state.gate_told = Some(told);
                (RolloutEventKind::PromotionWaiting, closed.message.clone())
            }
        };
        Some(crate::engine::rollout::rollout_events::RolloutStep {
            kind,
            group: None,
            namespace: None,
            message,
        })
    }

    /// Tells the fleet's hub (when in a fleet) where this rollout stands.
    pub(super) fn report_to_hub(&self, status: &HostedClusterPackageStatus, report: &HubReport) {
        let HubReport {
            gate,
            template_hash,
            counts,
            partition,
        } = report;
        let Some(hub) = &self.context.rollouts.hub else {
            return;
        };
        let name = self.name();
        let generation = self
            .object
            .as_ref()
            .and_then(|h| h.metadata.generation)
            .unwrap_or_default();
        let available = status
            .conditions
            .iter()
            .any(|c| c.type_ == AVAILABLE && c.status == "True");
        let own = OwnRollout {
            cluster: hub.cluster(),
            name: &name,
            generation,
            template_hash,
            partition: partition.clone(),
            counts,
            available,
            gate,
            last_event_at: self.state.last_event_at,
            halted: status.halted.as_ref().map(|h| h.template_hash.as_str()),
        };
        let previous = hub.own_record(&name);
        let record = rollout_record(&own, previous.as_ref(), Timestamp::now());
        let changed = previous.as_ref().is_none_or(|p| record_changed(p, &record));
        hub.report(record, changed);
        let open = match gate {
            GateVerdict::Ungated => None,
            GateVerdict::Open { .. } => Some(true),
            GateVerdict::Closed(_) => Some(false),
        };
        hub.metrics().gate(&name, open);
    }
}
