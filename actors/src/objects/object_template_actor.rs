//! The ObjectTemplate actor: one per ObjectTemplate or ClusterObjectTemplate. Reads its sources (each
//! watched, so a changed or newly created source re-renders at once; nothing polls), renders the template
//! with their values as `.config` and the cluster's facts as `.environment` (as a Package in the same
//! namespace sees them), server-side applies the object as its controller, and reports
//! `Invalid` plus the object's own conditions. Apiserver failures retry with backoff (1 s .. 60 s).

use std::collections::HashSet;
use std::sync::Arc;

use actix::prelude::*;
use k8s_openapi::jiff::Timestamp;
use pko_proto::core::object_template::ObjectTemplateStatus;
use serde_json::{Map, Value};

use crate::engine::objects::object_ref::ObjectKey;
use crate::engine::objects::object_template::{
    copy_items, render_object, source_key, template_conditions, TemplateProblem,
};
use crate::manager::context::ManagerContext;
use crate::objects::applier::{Applier, ApplyError};
use crate::objects::owner_identity::owner_applier;
use crate::objects::template_object::TemplateObject;
use crate::runtime::meta_view::MetaView;
use crate::runtime::object_actor::{
    work, Action, Change, ObjectActor, Reconcile, ReconcileError, Work,
};
use pko_package::environment::{environment_value, package_environment};

/// A source or the templated object changed.
#[derive(Debug, Message)]
#[rtype(result = "()")]
struct WatchedObjectChanged;

/// A permanent problem becomes the template's `Invalid` condition; the rest is retried.
fn classify(
    error: ApplyError,
    as_problem: impl FnOnce(String) -> TemplateProblem,
) -> Result<TemplateProblem, ApplyError> {
    if error.is_permanent() {
        Ok(as_problem(error.to_string()))
    } else {
        Err(error)
    }
}

/// Reads the sources into `.config`; a problem stops at the first bad source.
async fn read_sources(
    context: &ManagerContext,
    applier: &Applier,
    template: &TemplateObject,
) -> Result<Result<Map<String, Value>, TemplateProblem>, ApplyError> {
    let mut config = Map::new();
    let keys: Vec<Result<ObjectKey, TemplateProblem>> = template
        .spec
        .sources
        .iter()
        .enumerate()
        .map(|(index, source)| source_key(template.own_namespace(), index, source))
        .collect();
    // Sources no longer named stop being watched for this template.
    let named: HashSet<ObjectKey> = keys
        .iter()
        .filter_map(|k| k.as_ref().ok())
        .cloned()
        .collect();
    context.cache.read_external_only(template.uid(), &named);
    for (index, (source, key)) in template.spec.sources.iter().zip(keys).enumerate() {
        let key = match key {
            Ok(key) => key,
            Err(problem) => return Ok(Err(problem)),
        };
        let kind = match context.applier.resolve(&key).await {
            Ok(kind) => kind,
            Err(e) => {
                return classify(e, |m| {
                    TemplateProblem::Source(format!("spec.sources[{index}]: {m}"))
                })
                .map(Err)
            }
        };
        context.cache.watch_external(&key, &kind, template.uid());
        match applier.get(&key).await? {
            Some(object) => {
                if let Err(problem) = copy_items(index, source, &object, &mut config) {
                    return Ok(Err(problem));
                }
            }
            // Its watch brings the template back when it appears.
            None if source.optional => {}
            None => {
                return Ok(Err(TemplateProblem::Source(format!(
                    "spec.sources[{index}]: {key} not found"
                ))))
            }
        }
    }
    Ok(Ok(config))
}

/// Renders and applies; returns the problem, if any, and the applied object.
async fn apply_template(
    context: &ManagerContext,
    template: &TemplateObject,
) -> Result<(Option<TemplateProblem>, Option<Value>), ApplyError> {
    // Sources are read and the object written with the template's identity.
    let applier = match owner_applier(context, template.own_namespace(), &template.meta).await {
        Ok((_, applier)) => applier,
        Err(problem) => return Ok((Some(TemplateProblem::Template(problem.to_string())), None)),
    };
    let config = match read_sources(context, &applier, template).await? {
        Ok(config) => config,
        Err(problem) => return Ok((Some(problem), None)),
    };
    // The same `.environment` a Package in the template's namespace sees.
    let hosted_clusters = context
        .rollouts
        .clusters
        .hosted_cluster_for(template.own_namespace())
        .await;
    let facts = context
        .cluster_facts
        .read(&context.runtime.client, hosted_clusters)
        .await
        .map_err(|e| ApplyError::Api {
            object: format!("{} {} environment", template.kind(), template.name()),
            source: Box::new(e),
        })?;
    let environment = environment_value(&package_environment(&facts, template.own_namespace()));
    // Rendering runs on the blocking pool, bounded by the render budget: no template stalls the actors.
    let source = template.spec.template.clone();
    let namespace = template.own_namespace().map(str::to_owned);
    let owner = template.owner_reference();
    let rendered = tokio::task::spawn_blocking(move || {
        render_object(&source, config, environment, namespace.as_deref(), &owner)
    })
    .await
    .unwrap_or_else(|e| {
        Err(TemplateProblem::Template(format!(
            "spec.template: rendering failed unexpectedly: {e}"
        )))
    });
    let object = match rendered {
        Ok(object) => object,
        Err(problem) => return Ok((Some(problem), None)),
    };
    let Some(key) = ObjectKey::of(&object) else {
        return Ok((None, None));
    };
    let as_template_problem = |m: String| TemplateProblem::Template(format!("spec.template: {m}"));
    let kind = match context.applier.resolve(&key).await {
        Ok(kind) => kind,
        Err(e) => return classify(e, as_template_problem).map(|p| (Some(p), None)),
    };
    context.cache.ensure_watch(&key, &kind);
    let sent = context.cache.mark();
    match applier.apply(&key, &object).await {
        Ok(applied) => {
            context.cache.record(&key, applied.clone(), sent);
            Ok((None, Some(applied)))
        }
        Err(e) => classify(e, as_template_problem).map(|p| (Some(p), None)),
    }
}

/// The ObjectTemplate controller reads its sources on every reconcile; it only remembers that its route
/// is registered.
#[derive(Default)]
pub struct ObjectTemplateController {
    routed: bool,
}

pub type ObjectTemplateActor = ObjectActor<ObjectTemplateController>;

impl Reconcile for ObjectTemplateController {
    type Shared = ManagerContext;
    type Object = TemplateObject;
    type Reported = ();
    const CONTROLLER: &'static str = "object_template";
    fn observed(
        actor: &mut ObjectTemplateActor,
        change: Change,
        ctx: &mut Context<ObjectTemplateActor>,
    ) -> Change {
        if !actor.state.routed {
            if let Some(template) = &actor.object {
                let addr = ctx.address();
                actor.context.cache.add_route(
                    template.uid(),
                    Arc::new(move |_| addr.do_send(WatchedObjectChanged)),
                );
                actor.state.routed = true;
            }
        }
        change
    }

    fn reconcile(
        actor: &mut ObjectTemplateActor,
        template: TemplateObject,
        _: &mut Context<ObjectTemplateActor>,
    ) -> Work<Self> {
        let context = actor.context.clone();
        let run = async move {
            let (problem, object) = apply_template(&context, &template).await?;
            let status = ObjectTemplateStatus {
                conditions: template_conditions(
                    &template.status.conditions,
                    template.generation(),
                    problem.as_ref(),
                    object.as_ref(),
                    Timestamp::now(),
                ),
                phase: Some(
                    if problem.is_some() {
                        "Invalid"
                    } else {
                        "Applied"
                    }
                    .to_owned(),
                ),
            };
            if status != template.status {
                template
                    .write_status(context.runtime.client.clone(), &status)
                    .await
                    .map_err(|e| ApplyError::Api {
                        object: format!("{} {}", template.kind(), template.name()),
                        source: Box::new(e),
                    })?;
            }
            Ok::<_, ApplyError>(status)
        };
        work(
            run,
            |result, actor: &mut ObjectTemplateActor, _| match result {
                Ok(status) => {
                    if let Some(t) = actor.object.as_mut() {
                        t.status = status;
                    }
                    Ok(Action::AwaitChange)
                }
                Err(e) => Err(ReconcileError::Failed(e.to_string())),
            },
        )
    }

    fn stopped(actor: &mut ObjectTemplateActor) {
        if let Some(t) = &actor.object {
            actor.context.cache.remove_route(t.uid());
        }
    }
}

impl Handler<WatchedObjectChanged> for ObjectTemplateActor {
    type Result = ();
    fn handle(&mut self, _: WatchedObjectChanged, ctx: &mut Context<Self>) {
        self.request_reconcile(ctx);
    }
}
