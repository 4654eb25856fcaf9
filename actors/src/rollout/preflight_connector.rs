//! The hosted-cluster part of a release's preflight: the objects a release creates or changes in a
//! hosted cluster go to that cluster's connector (`phase.preview` on its NATS subjects), which dry-runs
//! them against the hosted apiserver and answers with a verdict per object. A connector that does not
//! answer (none runs, or one built before the preview existed) leaves them unchecked, never refused.

use std::time::Instant;

use pko_proto::connector_wire::{
    HostedClusterSubjects, PreviewObjects, PreviewOutcome, PreviewReport, Reply, WIRE_VERSION,
};

use crate::engine::conditions::foreign_text;
use crate::engine::objects::desired_object::{DesiredObject, InvalidObject};
use crate::engine::rollout::preflight_diff::{as_applied, ObjectChange, Verdict};
use crate::hypershift::connector_link::LinkError;
use crate::manager::context::ManagerContext;

/// A verdict for each of `changes` (hosted ones of HCP namespace `namespace`, whose HostedCluster has
/// UID `cluster_uid`), in their order: the object engine's refusal, or the connector's dry run of the
/// object as its phase would apply it.
pub async fn hosted_verdicts(
    context: &ManagerContext,
    namespace: &str,
    cluster_uid: Option<&str>,
    changes: &[&ObjectChange],
) -> Vec<Verdict> {
    let prepared: Vec<Option<Result<DesiredObject, InvalidObject>>> =
        changes.iter().map(|c| as_applied(c, namespace)).collect();
    let objects: Vec<serde_json::Value> = prepared
        .iter()
        .flatten()
        .flatten()
        .map(|d| d.object.clone())
        .collect();
    let answers = if objects.is_empty() {
        Ok(Vec::new())
    } else {
        ask_connector(context, namespace, cluster_uid, objects).await
    };
    let mut answers = answers.map(Vec::into_iter);
    prepared
        .into_iter()
        .map(|object| match (object, &mut answers) {
            (None, _) => Verdict::Unchecked("a delete is not dry-run".into()),
            (Some(Err(refused)), _) => Verdict::Refused(refused.to_string()),
            (Some(Ok(_)), Err(why)) => Verdict::Unchecked(why.clone()),
            (Some(Ok(_)), Ok(answers)) => answers.next().unwrap_or_else(|| {
                Verdict::Unchecked("the connector answered fewer verdicts than objects".into())
            }),
        })
        .collect()
}

/// The connector's verdicts on `objects`, or why there are none.
async fn ask_connector(
    context: &ManagerContext,
    namespace: &str,
    cluster_uid: Option<&str>,
    objects: Vec<serde_json::Value>,
) -> Result<Vec<Verdict>, String> {
    let Some(link) = &context.connectors else {
        return Err(
            "hosted-cluster phases travel over NATS, and this manager runs without --nats-url"
                .into(),
        );
    };
    // Bound to the namespace's HostedCluster, whose connector alone holds credentials for them.
    let subjects = HostedClusterSubjects::of(namespace, cluster_uid).map_err(|e| e.to_string())?;
    let request = PreviewObjects {
        version: WIRE_VERSION,
        namespace: namespace.to_owned(),
        objects,
    };
    let started = Instant::now();
    let reply: Result<Reply<PreviewReport>, LinkError> =
        link.request(subjects.preview(), &request).await;
    let result = LinkError::result_of(&reply);
    context.metrics.connectors.request(
        namespace,
        "preview",
        result,
        started.elapsed().as_secs_f64(),
    );
    match reply {
        Ok(Reply::Answer(report)) => Ok(report
            .verdicts
            .into_iter()
            .map(|v| match v.outcome {
                PreviewOutcome::Accepted => Verdict::Accepted,
                PreviewOutcome::Refused => Verdict::Refused(foreign_text(&v.message)),
                PreviewOutcome::Unchecked => Verdict::Unchecked(foreign_text(&v.message)),
            })
            .collect()),
        Ok(Reply::Refused(e)) => Err(format!(
            "the connector refused the dry run: {}",
            foreign_text(&e.message)
        )),
        Err(LinkError::NoConnector { .. }) => Err(
            "no connector answered the dry run (none runs, or it is older than this manager)"
                .into(),
        ),
        Err(e) => Err(e.to_string()),
    }
}
