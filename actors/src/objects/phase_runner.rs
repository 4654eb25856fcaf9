//! Runs one phase against an apiserver: observe each object, decide adoption, apply what drifted, probe,
//! collect mapped conditions; and tears a phase down. The same functions serve the manager's local phases
//! and the hosted-cluster connector, so both follow one set of rules.

use std::collections::HashMap;
use std::time::Duration;

use futures::{stream, StreamExt};
use pko_proto::core::common::ControlledObjectReference;
use serde_json::Value;
use tracing::{instrument, warn};

use crate::engine::conditions::current_condition;
use crate::engine::objects::adoption::{
    controller_of, decide_adoption, handed_over_entirely, reference_applied_only_by, Adopter,
    AdoptionDecision,
};
use crate::engine::objects::desired_object::{DesiredObject, FIELD_MANAGER};
use crate::engine::objects::drift::{apply_is_current, is_subset};
use crate::engine::objects::object_ref::ObjectKey;
use crate::engine::objects::object_set_status::{BlockReason, MappedCondition};
use crate::engine::objects::phase_plan::{PhasePlan, PhaseReport, TeardownReport};
use crate::engine::objects::phase_verdict::{
    blocked, object_finding, phase_progress, ObjectFinding,
};
use crate::engine::objects::probe::ProbeResult;
use crate::objects::applier::{Applier, ApplyError};
use crate::objects::object_cache::ObjectCache;
use pko_package::canonical_hash::value_hash;

/// Objects of one phase are applied with this much concurrency.
const APPLY_CONCURRENCY: usize = 16;

/// An object whose probe fails and whose cached state is at least this old is read from the apiserver
/// on the phase's next look: the net under a watch event pko might have missed. Younger states are an
/// object on its way; reading those on every retry cost a GET per object and retry.
const REREAD_AFTER: Duration = Duration::from_secs(10);

/// Per-phase memory of what was last applied (desired-body hash by object); lets an unchanged phase skip
/// its writes.
pub type AppliedHashes = HashMap<ObjectKey, u64>;

enum ObjectOutcome {
    Ready {
        key: ObjectKey,
        observed: Option<Value>,
        applied_hash: Option<u64>,
    },
    Collision(ObjectKey, String),
    /// A newer revision controls the object now.
    HandedOver(ObjectKey, String),
    Failed(ObjectKey, ApplyError),
}

/// Reconciles one phase. With `paused`, objects are only observed and probed, nothing is written, except a
/// delegated phase's ObjectSetPhase, which takes the pause to where the objects are.
#[instrument(skip_all, fields(phase = %plan.name, owner = %plan.owner_uid, objects = plan.objects.len()))]
pub async fn reconcile_phase(
    applier: &Applier,
    cache: &ObjectCache,
    plan: &PhasePlan,
    applied: &mut AppliedHashes,
    paused: bool,
) -> PhaseReport {
    // Every kind known and every namespace fitting its scope before the first write: a phase with a bad
    // object writes nothing.
    let preflight: Vec<ApplyError> =
        each_in_plan_order(&plan.objects, |d| applier.preflight(&d.key))
            .await
            .into_iter()
            .filter_map(Result::err)
            .collect();
    if !preflight.is_empty() {
        let transient_error = preflight.iter().any(is_transient);
        let messages: Vec<String> = preflight.iter().map(ToString::to_string).collect();
        return PhaseReport {
            progress: blocked(BlockReason::PreflightError, &messages),
            controlled: Vec::new(),
            phase_controls: Vec::new(),
            mapped: Vec::new(),
            transient_error,
        };
    }
    let snapshot: &AppliedHashes = applied;
    let prefetched = &prefetch(applier, cache, &plan.objects).await;
    let outcomes: Vec<ObjectOutcome> = each_in_plan_order(&plan.objects, |desired| async move {
        let last = snapshot.get(&desired.key).copied();
        reconcile_object(applier, cache, prefetched, plan, desired, last, paused)
            .await
            .unwrap_or_else(|e| ObjectOutcome::Failed(desired.key.clone(), e))
    })
    .await;

    let mut probed = probe_off_thread(plan, &outcomes).await;
    let mut findings = Vec::with_capacity(plan.objects.len());
    let mut controlled = Vec::new();
    let mut phase_controls = Vec::new();
    let mut mapped = Vec::new();
    let mut transient_error = false;
    for (desired, outcome) in plan.objects.iter().zip(outcomes) {
        let finding = match outcome {
            ObjectOutcome::Ready {
                key,
                observed,
                applied_hash,
            } => {
                if let Some(h) = applied_hash {
                    applied.insert(key.clone(), h);
                }
                let Some(observed) = observed else {
                    findings.push(ObjectFinding::Missing(format!("{key}: object not found")));
                    continue;
                };
                if desired.managed
                    && controller_of(&observed).is_some_and(|(uid, _, _)| uid == plan.owner_uid)
                {
                    let uid = observed
                        .pointer("/metadata/uid")
                        .and_then(Value::as_str)
                        .unwrap_or_default();
                    controlled.push((key.clone(), uid.to_owned()));
                    if plan.delegated {
                        phase_controls.extend(
                            observed
                                .pointer("/status/controllerOf")
                                .cloned()
                                .and_then(|c| {
                                    serde_json::from_value::<Vec<ControlledObjectReference>>(c).ok()
                                })
                                .unwrap_or_default(),
                        );
                    }
                }
                // What a delegated phase's ObjectSetPhase says of itself, for its current generation.
                let delegated = plan.delegated.then(|| phase_availability(&observed));
                let result = probed
                    .remove(&key)
                    .unwrap_or_else(|| plan.probes.evaluate(&key, &observed));
                let finding = object_finding(&key.to_string(), result, delegated);
                if matches!(
                    finding,
                    ObjectFinding::ProbeFailed { .. } | ObjectFinding::Unreported(_)
                ) {
                    // Should the watch have missed its change, the next look reads the apiserver.
                    cache.forget_if_unchanged_for(&key, &observed, REREAD_AFTER);
                }
                mapped.extend(mapped_conditions(desired, &observed));
                finding
            }
            ObjectOutcome::Collision(key, reason) => {
                ObjectFinding::Collision(format!("{key}: {reason}"))
            }
            ObjectOutcome::HandedOver(key, reason) => {
                ObjectFinding::HandedOver(format!("{key}: {reason}"))
            }
            ObjectOutcome::Failed(key, error) => {
                transient_error |= is_transient(&error);
                warn!(object = %key, %error, "phase object failed");
                ObjectFinding::Failed(error.to_string())
            }
        };
        findings.push(finding);
    }
    PhaseReport {
        progress: phase_progress(&findings),
        controlled,
        phase_controls,
        mapped,
        transient_error,
    }
}

/// Probe results of the observed objects, evaluated on the blocking pool when the phase's probes run CEL
/// (within its step budget that is still up to a million steps per object, too long for the thread every
/// actor shares); empty otherwise, and the cheap probes run inline.
async fn probe_off_thread(
    plan: &PhasePlan,
    outcomes: &[ObjectOutcome],
) -> HashMap<ObjectKey, ProbeResult> {
    if !plan.probes.has_cel() {
        return HashMap::new();
    }
    let observed: Vec<(ObjectKey, Value)> = outcomes
        .iter()
        .filter_map(|o| match o {
            ObjectOutcome::Ready {
                key,
                observed: Some(observed),
                ..
            } => Some((key.clone(), observed.clone())),
            _ => None,
        })
        .collect();
    let keys: Vec<ObjectKey> = observed.iter().map(|(key, _)| key.clone()).collect();
    let probes = plan.probes.clone();
    let evaluated = tokio::task::spawn_blocking(move || {
        observed
            .into_iter()
            .map(|(key, object)| {
                let result = probes.evaluate(&key, &object);
                (key, result)
            })
            .collect()
    })
    .await;
    // A panic while probing fails this phase's probes, not the actor.
    evaluated.unwrap_or_else(|e| {
        let failed = ProbeResult::Failed(vec![format!("evaluating the probes failed: {e}")]);
        keys.into_iter().map(|key| (key, failed.clone())).collect()
    })
}

/// (reason, message) of an ObjectSetPhase's `Available` condition, when written for its current
/// generation.
fn phase_availability(phase: &Value) -> Option<(String, String)> {
    let text = |c: &Value, field: &str| {
        c.get(field)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    current_condition(phase, "Available").map(|c| (text(c, "reason"), text(c, "message")))
}

/// Runs `run` for each of `items` with [`APPLY_CONCURRENCY`] requests in flight the whole time, and
/// returns the outputs in the items' order. An ordered buffer (`buffered`) starts the next request
/// only once the oldest one answered, so one slow answer held back every request behind it and the
/// phase ran with fewer in flight than allowed.
async fn each_in_plan_order<'a, I, T, F, Fut>(items: &'a [I], run: F) -> Vec<T>
where
    F: Fn(&'a I) -> Fut,
    Fut: std::future::Future<Output = T>,
{
    let mut outputs: Vec<(usize, T)> = stream::iter(items.iter().enumerate())
        .map(|(index, item)| {
            let output = run(item);
            async move { (index, output.await) }
        })
        .buffer_unordered(APPLY_CONCURRENCY)
        .collect()
        .await;
    outputs.sort_unstable_by_key(|(index, _)| *index);
    outputs.into_iter().map(|(_, output)| output).collect()
}

fn is_transient(error: &ApplyError) -> bool {
    match error {
        ApplyError::Api { source, .. } => match source.as_ref() {
            kube::Error::Api(s) => s.code == 409 || s.code == 429 || s.code >= 500,
            _ => true,
        },
        _ => false,
    }
}

/// What one LIST per kind and namespace found for objects the cache did not know (`None`: absent).
type Prefetched = HashMap<ObjectKey, Option<Value>>;

/// Below this many cache misses of one kind in one namespace, single GETs are cheaper than a LIST.
const LIST_THRESHOLD: usize = 8;

/// For kinds and namespaces with many objects the cache does not hold (a new set, or objects that exist
/// without pko's label), one LIST replaces a GET per object.
async fn prefetch(applier: &Applier, cache: &ObjectCache, objects: &[DesiredObject]) -> Prefetched {
    let mut misses: HashMap<(String, String, String, String), Vec<&ObjectKey>> = HashMap::new();
    for o in objects.iter().filter(|o| cache.get(&o.key).is_none()) {
        let k = &o.key;
        misses
            .entry((
                k.group.clone(),
                k.version.clone(),
                k.kind.clone(),
                k.namespace.clone(),
            ))
            .or_default()
            .push(k);
    }
    let mut found = Prefetched::new();
    for keys in misses.values().filter(|keys| keys.len() >= LIST_THRESHOLD) {
        // A failed LIST only loses the shortcut: those objects fall back to GETs.
        let Ok(listed) = applier.list_like(keys[0]).await else {
            continue;
        };
        let by_name: HashMap<&str, &Value> = listed
            .iter()
            .filter_map(|v| Some((v.pointer("/metadata/name")?.as_str()?, v)))
            .collect();
        for key in keys {
            found.insert(
                (*key).clone(),
                by_name.get(key.name.as_str()).map(|v| (*v).clone()),
            );
        }
    }
    found
}

async fn observe(
    applier: &Applier,
    cache: &ObjectCache,
    prefetched: &Prefetched,
    key: &ObjectKey,
) -> Result<Option<Value>, ApplyError> {
    if let Some(v) = cache.get(key) {
        return Ok(Some((*v).clone()));
    }
    if let Some(known) = prefetched.get(key) {
        return Ok(known.clone());
    }
    applier.get(key).await
}

async fn reconcile_object(
    applier: &Applier,
    cache: &ObjectCache,
    prefetched: &Prefetched,
    plan: &PhasePlan,
    desired: &DesiredObject,
    last_applied: Option<u64>,
    paused: bool,
) -> Result<ObjectOutcome, ApplyError> {
    let key = &desired.key;
    let kind = applier.resolve(key).await?;
    if desired.managed {
        cache.ensure_watch(key, &kind);
    } else {
        cache.watch_external(key, &kind, &plan.owner_uid);
    }
    let observed = observe(applier, cache, prefetched, key).await?;
    // A paused set still writes its ObjectSetPhases: they carry the pause to the phase's own reconciler,
    // which then leaves the phase's objects alone too.
    if !desired.managed || (paused && !plan.delegated) {
        return Ok(ObjectOutcome::Ready {
            key: key.clone(),
            observed,
            applied_hash: None,
        });
    }
    let hash = value_hash(&desired.object);
    let mut demoted = None;
    // Taking an object over is decided on the version observed: the apply carries it as a precondition.
    let mut taken_over_at: Option<String> = None;
    if let Some(existing) = &observed {
        let adopter = Adopter {
            uid: &plan.owner_uid,
            revision: plan.revision,
            previous_uids: &plan.previous_uids,
        };
        match decide_adoption(&adopter, &desired.collision_protection, existing) {
            AdoptionDecision::Refuse(reason) => {
                return Ok(ObjectOutcome::Collision(key.clone(), reason))
            }
            AdoptionDecision::Superseded(reason) => {
                return Ok(ObjectOutcome::HandedOver(key.clone(), reason))
            }
            AdoptionDecision::AlreadyOwned if is_subset(&desired.object, existing) => {
                if last_applied == Some(hash) {
                    return Ok(ObjectOutcome::Ready {
                        key: key.clone(),
                        observed,
                        applied_hash: None,
                    });
                }
                // This phase does not know its last apply (the manager restarted, or the phase actor is
                // new): the object read whole tells what that apply set. The cache keeps no field
                // records, so this costs one read, once, instead of a write.
                if last_applied.is_none() {
                    if let Some(whole) = applier.get(key).await? {
                        if apply_is_current(&desired.object, &whole, FIELD_MANAGER) {
                            return Ok(ObjectOutcome::Ready {
                                key: key.clone(),
                                observed,
                                applied_hash: Some(hash),
                            });
                        }
                    }
                }
            }
            AdoptionDecision::AlreadyOwned => {}
            // A reference only pko's applies wrote (a previous revision's, the usual handover) goes
            // with the taking apply itself; any other is demoted first.
            AdoptionDecision::Adopt { demote: Some(uid) }
                if reference_applied_only_by(existing, &uid, FIELD_MANAGER) =>
            {
                taken_over_at = resource_version(existing);
                demoted = Some(uid);
            }
            AdoptionDecision::Adopt { demote: Some(uid) } => {
                let demoted_to = applier.demote_controller(key, existing, &uid).await?;
                taken_over_at = resource_version(&demoted_to);
                demoted = Some(uid);
            }
            AdoptionDecision::Adopt { demote: None } => taken_over_at = resource_version(existing),
        }
    }
    let sent = cache.mark();
    let applied = match &taken_over_at {
        Some(version) => applier.apply_over(key, &desired.object, version).await,
        None => applier.apply(key, &desired.object).await,
    };
    let stored = match applied {
        Ok(stored) => stored,
        Err(e) => {
            if e.is_conflict() {
                // Decided on a stale state: the next run reads the object afresh.
                cache.forget(key);
            }
            return Err(e);
        }
    };
    cache.record(key, stored.clone(), sent);
    if let Some(uid) = demoted {
        // The cache tells the former controller only when it held the object's earlier state; the
        // adopter knows whose object it took, so it says so too.
        cache.notify(key, &uid);
    }
    Ok(ObjectOutcome::Ready {
        key: key.clone(),
        observed: Some(stored),
        applied_hash: Some(hash),
    })
}

fn resource_version(object: &Value) -> Option<String> {
    object
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .map(str::to_owned)
}

/// Copies the conditions named by the object's conditionMappings, if written for its current generation.
fn mapped_conditions(desired: &DesiredObject, observed: &Value) -> Vec<MappedCondition> {
    if desired.condition_mappings.is_empty() {
        return Vec::new();
    }
    desired
        .condition_mappings
        .iter()
        .filter_map(|m| {
            let c = current_condition(observed, &m.source_type)?;
            let text = |field: &str| c.get(field).and_then(Value::as_str);
            Some(MappedCondition::bounded(
                &m.destination_type,
                text("status") == Some("True"),
                text("reason").unwrap_or("Mapped"),
                text("message").unwrap_or_default(),
            ))
        })
        .collect()
}

/// Deletes the objects of a phase that this owner still controls. Objects another revision took over are
/// left alone (handover). Deletes carry UID and resourceVersion preconditions, so an object changed since it
/// was observed is re-examined instead of deleted blindly.
#[instrument(skip_all, fields(phase = %plan.name, owner = %plan.owner_uid))]
pub async fn teardown_phase(
    applier: &Applier,
    cache: &ObjectCache,
    plan: &PhasePlan,
) -> TeardownReport {
    let mut report = TeardownReport {
        remaining: Vec::new(),
        errors: Vec::new(),
    };
    for desired in plan.objects.iter().filter(|d| d.managed) {
        let key = &desired.key;
        // Handed over with no reference of ours left (the cache holds the taking revision's apply or a
        // later state): nothing to delete or release, and no read needed to know it.
        if cache
            .get(key)
            .is_some_and(|cached| handed_over_entirely(&cached, &plan.owner_uid))
        {
            continue;
        }
        let observed = match applier.get_served(key).await {
            Ok(o) => o,
            Err(e) => {
                report.errors.push(e.to_string());
                continue;
            }
        };
        let Some(observed) = observed else {
            cache.forget_deleted(key);
            continue;
        };
        if controller_of(&observed).is_none_or(|(uid, _, _)| uid != plan.owner_uid) {
            // Not ours to delete. A plain owner reference of ours would let the garbage collector take it
            // with this set: drop it.
            match applier.release_owner(key, &observed, &plan.owner_uid).await {
                Ok(_) => {}
                Err(e) if e.is_conflict() => report.remaining.push(key.clone()),
                Err(e) => report.errors.push(e.to_string()),
            }
            continue;
        }
        if observed.pointer("/metadata/deletionTimestamp").is_some() {
            report.remaining.push(key.clone());
            continue;
        }
        match applier.delete_observed(key, &observed).await {
            Ok(_) => {
                if let Ok(Some(_)) = applier.get(key).await {
                    report.remaining.push(key.clone());
                } else {
                    cache.forget_deleted(key);
                }
            }
            Err(e) if e.is_conflict() => report.remaining.push(key.clone()),
            Err(e) => report.errors.push(e.to_string()),
        }
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use tokio::time::{sleep, Instant};

    /// One slow answer does not hold back the requests behind it, and the outputs keep their order.
    #[tokio::test(start_paused = true)]
    async fn a_slow_request_does_not_hold_back_the_ones_behind_it() {
        let started = Instant::now();
        let items: Vec<usize> = (0..APPLY_CONCURRENCY * 2).collect();
        let outputs = each_in_plan_order(&items, |i| async move {
            let waited_for_a_slot = started.elapsed();
            sleep(Duration::from_millis(if *i == 0 { 10_000 } else { 10 })).await;
            (*i, waited_for_a_slot)
        })
        .await;
        assert_eq!(
            outputs.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
            items,
            "outputs in the items' order"
        );
        let last_start = outputs.iter().map(|(_, w)| *w).max().unwrap();
        assert!(
            last_start < Duration::from_secs(1),
            "the last request started only after {last_start:?}: the slow first one held it back"
        );
    }

    #[test]
    fn a_delegated_phase_says_why_only_for_its_current_generation() {
        let phase = |reason: &str, observed: i64| {
            json!({"metadata": {"generation": 2}, "status": {"conditions": [
                {"type": "Available", "status": "False", "reason": reason,
                 "message": "why", "observedGeneration": observed}]}})
        };
        assert_eq!(
            phase_availability(&phase("HandedOver", 2)),
            Some(("HandedOver".to_owned(), "why".to_owned()))
        );
        assert_eq!(
            phase_availability(&phase("AwaitingStatus", 1)),
            None,
            "said for an older generation"
        );
        assert_eq!(
            phase_availability(&json!({"metadata": {"generation": 1}})),
            None
        );
    }
}
