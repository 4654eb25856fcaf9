//! Letting an object go to the replica it moved to (sharded). Its actor stops once its running work is
//! done; when the coordinator drained it, the shard labels are then removed, and only that tells the
//! coordinator it may label the object for its new owner. So the labels go only once nothing this
//! replica ran for the object still runs, and only while they say what the feed decided on.
//!
//! The feed keeps one stop per object. An event that comes while the actor stops (a re-list of the
//! drained object, a parent's apply that labels it for this replica again, another drain) changes only
//! what is done once it stopped: no second actor starts beside the stopping one, and no release is sent
//! for it meanwhile. The chaos run caught both: a re-list released an ObjectSetPhase whose actor still
//! waited for its connector, and the stale release of a second actor later stripped the new owner's
//! label. The labels are removed by a JSON patch that tests them first, so a release answered late
//! changes nothing of an object labelled since.

use actix::prelude::*;
use pko_proto::well_known::{SHARD_DRAIN_LABEL, SHARD_OWNER_LABEL};
use tracing::{info, warn};

use super::{AfterStop, FeedTarget, Gone, KindFeed, LabelledAs, Observed, Release, WatchedKind};
use crate::runtime::registry::ObjectRef;
use actix::dev::ToEnvelope;

impl<K, A> KindFeed<K, A>
where
    A: FeedTarget,
    A::Object: From<K> + Clone + Unpin,
    K: WatchedKind,
    A::Context: ToEnvelope<A, Observed<A::Object>> + ToEnvelope<A, Gone>,
{
    /// An object this replica works on is labelled for another, or drained: its actor stops, and when
    /// the coordinator drained it, the labels go so the new owner may start.
    pub(super) fn let_go(
        &mut self,
        ctx: &mut Context<Self>,
        key: &ObjectRef,
        object: &A::Object,
        labelled: LabelledAs,
        drained: bool,
    ) {
        let after = if drained && A::wants(object) {
            AfterStop::RemoveLabels(labelled)
        } else {
            AfterStop::Nothing
        };
        self.stop_actor(ctx, key, after);
    }

    /// Stops the object's actor once its running work is done (it keeps the object as it is), then does
    /// `after`.
    pub(super) fn stop_actor(
        &mut self,
        ctx: &mut Context<Self>,
        key: &ObjectRef,
        after: AfterStop<A::Object>,
    ) {
        let actor = self.registry.remove(key);
        self.stop_working(key);
        if let Some(pending) = self.stopping.get_mut(key) {
            // Its actor is still stopping: whatever follows waits for it.
            *pending = after;
            return;
        }
        let Some(actor) = actor else {
            self.after_stop(key, after);
            return;
        };
        self.stopping.insert(key.clone(), after);
        let stopped = async move {
            let (done, stopped) = tokio::sync::oneshot::channel();
            if actor.send(Release(done)).await.is_ok() {
                let _ = stopped.await;
            }
        };
        let key = key.clone();
        ctx.spawn(stopped.into_actor(self).map(move |(), feed, _| {
            if let Some(after) = feed.stopping.remove(&key) {
                feed.after_stop(&key, after);
            }
        }));
    }

    fn after_stop(&mut self, key: &ObjectRef, after: AfterStop<A::Object>) {
        match after {
            AfterStop::RemoveLabels(labelled) => self.remove_labels(key.kind, labelled),
            AfterStop::Resume(object) => self.deliver(key, object),
            AfterStop::Nothing => {}
        }
    }

    /// Removes both shard labels if they still say what `labelled` says, with the drain mark.
    fn remove_labels(&self, kind: &'static str, labelled: LabelledAs) {
        let api = self.dynamic_api(&self.runtime.client, labelled.namespace.as_deref());
        let metrics = self.runtime.metrics.clone();
        actix::spawn(async move {
            let name = labelled.name;
            match remove_shard_labels(&api, &name, labelled.holder.as_deref()).await {
                Ok(ReleaseOutcome::Released) => metrics.shard_released(kind),
                Ok(ReleaseOutcome::Gone) => {}
                Ok(ReleaseOutcome::LabelsChanged) => {
                    info!(%kind, %name, "labels changed before the release; left as they are");
                    metrics.shard_release_refused(kind);
                }
                Err(error) => warn!(%kind, %name, %error, "releasing to another replica failed"),
            }
        });
    }
}

/// What a release of an object's shard labels did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseOutcome {
    Released,
    /// The labels no longer said what the release was decided on; nothing was written.
    LabelsChanged,
    Gone,
}

/// Removes the shard labels of the object `name` if, in the same write, they still say it is drained
/// and held by `holder` (or by no one): a JSON patch whose tests the apiserver checks.
pub async fn remove_shard_labels(
    api: &kube::Api<kube::api::DynamicObject>,
    name: &str,
    holder: Option<&str>,
) -> Result<ReleaseOutcome, kube::Error> {
    let patch = serde_json::from_value(release_patch(holder)).map_err(kube::Error::SerdeError)?;
    let params = kube::api::PatchParams::default();
    match api
        .patch(name, &params, &kube::api::Patch::Json::<()>(patch))
        .await
    {
        Ok(_) => Ok(ReleaseOutcome::Released),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(ReleaseOutcome::Gone),
        // A test failed.
        Err(kube::Error::Api(e)) if e.code == 422 => Ok(ReleaseOutcome::LabelsChanged),
        Err(error) => Err(error),
    }
}

/// The JSON patch (RFC 6902) that removes the shard labels of a drained object held by `holder` (or by
/// no one), and nothing if they say anything else by the time it is applied.
fn release_patch(holder: Option<&str>) -> serde_json::Value {
    let path = |label: &str| {
        format!(
            "/metadata/labels/{}",
            label.replace('~', "~0").replace('/', "~1")
        )
    };
    let mut operations = vec![serde_json::json!({
        "op": "test", "path": path(SHARD_DRAIN_LABEL), "value": "true",
    })];
    if let Some(holder) = holder {
        operations.push(serde_json::json!({
            "op": "test", "path": path(SHARD_OWNER_LABEL), "value": holder,
        }));
        operations.push(serde_json::json!({"op": "remove", "path": path(SHARD_OWNER_LABEL)}));
    }
    operations.push(serde_json::json!({"op": "remove", "path": path(SHARD_DRAIN_LABEL)}));
    serde_json::Value::Array(operations)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_release_tests_the_labels_it_removes() {
        let patch = release_patch(Some("a-1"));
        let ops: Vec<(&str, &str)> = patch
            .as_array()
            .unwrap()
            .iter()
            .map(|op| (op["op"].as_str().unwrap(), op["path"].as_str().unwrap()))
            .collect();
        assert_eq!(
            ops,
            [
                ("test", "/metadata/labels/shard.package-operator.run~1drain"),
                ("test", "/metadata/labels/shard.package-operator.run~1owner"),
                (
                    "remove",
                    "/metadata/labels/shard.package-operator.run~1owner"
                ),
                (
                    "remove",
                    "/metadata/labels/shard.package-operator.run~1drain"
                ),
            ]
        );
        assert_eq!(patch[1]["value"], "a-1");
    }
}
