//! The preflight of a release, as the supervisor runs it: started off the actor when a decision says
//! one is due (`engine::rollout::preflight_gate`), at most one at a time (a newer one stops the older),
//! its result kept for the next decisions (which write it to `status.preflight`), told as an Event, and
//! the supervisor woken. A preflight that does not finish runs again after a backoff (5 s .. 5 min).

use std::time::Instant;

use actix::prelude::*;
use pko_proto::core::hosted_cluster_package::HostedClusterPackage;
use pko_proto::core::rollout_preflight::HostedClusterPackagePreflightStatus;
use pko_proto::rollout_events::{RolloutEvent, RolloutEventKind, EVENT_VERSION};
use tracing::{info_span, warn, Instrument};

use super::HostedClusterPackageActor;
use crate::engine::rollout::preflight_gate::PreflightRun;
use crate::engine::transition_events::{event_note, TransitionEvent};
use crate::objects::object_meta::event_reference;
use crate::rollout::preflight_runner::{
    run_preflight, PreflightError, PreflightJob, PreflightTarget,
};

/// A preflight ended.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(super) struct PreflightEnded {
    run: PreflightRun,
    result: Result<HostedClusterPackagePreflightStatus, PreflightError>,
}

impl HostedClusterPackageActor {
    /// Starts the preflight `run` of `hcpkg`'s template unless it runs already.
    pub(super) fn start_preflight(
        &mut self,
        run: Option<PreflightRun>,
        hcpkg: &HostedClusterPackage,
        ctx: &mut Context<Self>,
    ) {
        let Some(run) = run else {
            return;
        };
        if !self.state.preflights.may_start(&run, Instant::now()) {
            // Running, or woken when it may run again (`PreflightEnded`).
            return;
        }
        let selector = &hcpkg.spec.hosted_cluster_selector;
        let targets = self
            .context
            .rollouts
            .clusters
            .selected(selector)
            .iter()
            .filter(|hc| hc.is_available())
            .filter_map(|hc| {
                Some(PreflightTarget {
                    namespace: hc.hosted_control_plane_namespace()?,
                    hosted_cluster: hc.metadata.name.clone().unwrap_or_default(),
                    hosted_cluster_uid: hc.metadata.uid.clone(),
                })
            })
            .collect();
        let job = PreflightJob {
            hcpkg: hcpkg.clone(),
            template: hcpkg.spec.template.clone(),
            run: run.clone(),
            targets,
        };
        // A trace of its own: it outlives the decision that started it.
        let span = info_span!(
            parent: None,
            "preflight",
            pko.hostedclusterpackage = %self.name(),
            pko.template_hash = %run.template_hash,
        );
        let context = self.context.clone();
        let address = ctx.address();
        let ended = run.clone();
        let task = tokio::spawn(
            async move {
                let result = run_preflight(context, job).await;
                address.do_send(PreflightEnded { run: ended, result });
            }
            .instrument(span),
        );
        self.state.preflights.started(run, task.abort_handle());
    }
}

/// The rollout event that tells what a preflight found, from `source` (this management cluster).
fn preflight_event(
    hcpkg: &HostedClusterPackage,
    source: &str,
    status: &HostedClusterPackagePreflightStatus,
) -> RolloutEvent {
    let first = status
        .refusals
        .first()
        .map(|r| {
            format!(
                " First refused: {}: {}: {}.",
                r.namespace, r.object, r.message
            )
        })
        .unwrap_or_default();
    RolloutEvent {
        version: EVENT_VERSION,
        kind: RolloutEventKind::PreflightFinished,
        hosted_cluster_package: hcpkg.metadata.name.clone().unwrap_or_default(),
        uid: hcpkg.metadata.uid.clone().unwrap_or_default(),
        generation: hcpkg.metadata.generation.unwrap_or_default(),
        group: None,
        namespace: None,
        message: format!(
            "Template {}: {} of {} namespaces change, in {} groups; {} refused, {} unchecked; digest {}.{first}",
            status.template_hash,
            status.changed,
            status.namespaces,
            status.groups.len(),
            status.refused,
            status.unchecked,
            status.digest
        ),
        source: source.to_owned(),
        trace_id: None,
        traceparent: None,
    }
}

impl Handler<PreflightEnded> for HostedClusterPackageActor {
    type Result = ();
    fn handle(&mut self, ended: PreflightEnded, ctx: &mut Context<Self>) {
        let name = self.name();
        match ended.result {
            Ok(status) => {
                if let Some(hcpkg) = &self.object {
                    let (reason, warning) = if status.refused > 0 {
                        ("PreflightRefused", true)
                    } else {
                        ("PreflightPassed", false)
                    };
                    let note = format!(
                        "Preflight of template {}: {} of {} namespaces change, in {} groups; {} refused, {} unchecked (digest {}). kubectl package rollout diff hostedclusterpackage/{name}",
                        status.template_hash, status.changed, status.namespaces, status.groups.len(),
                        status.refused, status.unchecked, status.digest
                    );
                    let reference = event_reference("HostedClusterPackage", &hcpkg.metadata);
                    if let Some(publisher) = &self.context.rollouts.publisher {
                        publisher.enqueue(vec![preflight_event(
                            hcpkg,
                            &self.context.rollouts.source,
                            &status,
                        )]);
                    }
                    self.context.runtime.events.raise_transitions(
                        &reference,
                        vec![TransitionEvent {
                            warning,
                            reason,
                            action: "Preflight",
                            note: event_note(note),
                        }],
                    );
                }
                self.state.preflight = Some(status);
                self.state.preflights.finished(&ended.run);
                self.request_reconcile(ctx);
            }
            Err(error) => {
                self.context.metrics.rollouts.preflight.failed(&name);
                let delay = self.state.preflights.failed(ended.run, Instant::now());
                warn!(hostedclusterpackage = %name, %error, ?delay, "preflight did not finish; it runs again after the delay");
                ctx.run_later(delay, |act, ctx| act.request_reconcile(ctx));
            }
        }
    }
}
