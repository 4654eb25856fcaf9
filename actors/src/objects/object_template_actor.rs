//! The ObjectTemplate actor: one per ObjectTemplate or ClusterObjectTemplate. Reads its sources (each
//! watched, so a changed or newly created source re-renders at once; nothing polls), renders the template
//! with their values as `.config` and the cluster's facts as `.environment` (as a Package in the same
//! namespace sees them), server-side applies the object as its controller, and reports
//! `Invalid` plus the object's own conditions. Apiserver failures retry with backoff (1 s .. 60 s).

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use k8s_openapi::jiff::Timestamp;
use pko_proto::core::object_template::ObjectTemplateStatus;
use serde_json::{Map, Value};
use tracing::{info_span, warn, Instrument};

use crate::engine::object_ref::ObjectKey;
use crate::engine::object_template::{
    copy_items, render_object, source_key, template_conditions, TemplateProblem,
};
use crate::objects::applier::ApplyError;
use crate::objects::object_meta::MetaView;
use crate::objects::template_object::TemplateObject;
use crate::packages::package_object::environment_facts;
use crate::runtime::context::ManagerContext;
use crate::runtime::kind_feed::{FeedTarget, Gone, Observed};
use crate::runtime::reconcile_gate::ReconcileGate;
use crate::runtime::registry::ObjectRef;
use pko_package::environment::{environment_value, package_environment};

const BACKOFF_MIN: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(60);

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
    template: &TemplateObject,
) -> Result<Result<Map<String, Value>, TemplateProblem>, ApplyError> {
    let mut config = Map::new();
    for (index, source) in template.spec.sources.iter().enumerate() {
        let key = match source_key(template.own_namespace(), index, source) {
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
        match context.applier.get(&key).await? {
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
    let config = match read_sources(context, template).await? {
        Ok(config) => config,
        Err(problem) => return Ok((Some(problem), None)),
    };
    // The same `.environment` a Package in the template's namespace sees.
    let hosted_clusters = context
        .rollouts
        .fleet
        .hosted_cluster_for(template.own_namespace())
        .await;
    let facts = environment_facts(context.client.clone(), hosted_clusters)
        .await
        .map_err(|e| ApplyError::Api {
            object: format!("{} {} environment", template.kind(), template.name()),
            source: Box::new(e),
        })?;
    let environment = environment_value(&package_environment(&facts, template.own_namespace()));
    let object = match render_object(
        &template.spec.template,
        config,
        environment,
        template.own_namespace(),
        &template.owner_reference(),
    ) {
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
    match context.applier.apply(&key, &object).await {
        Ok(applied) => {
            context.cache.record(&key, applied.clone());
            Ok((None, Some(applied)))
        }
        Err(e) => classify(e, as_template_problem).map(|p| (Some(p), None)),
    }
}

pub struct ObjectTemplateActor {
    context: ManagerContext,
    template: Option<TemplateObject>,
    gate: ReconcileGate,
}

impl ObjectTemplateActor {
    pub fn new(context: ManagerContext) -> Self {
        Self {
            context,
            template: None,
            gate: ReconcileGate::new(BACKOFF_MIN, BACKOFF_MAX),
        }
    }

    fn reconcile(&mut self, ctx: &mut Context<Self>) {
        let Some(template) = self.template.clone() else {
            return;
        };
        if !self.gate.try_start(ctx) {
            return;
        }
        let context = self.context.clone();
        let span = info_span!(
            "reconcile_object_template",
            kind = template.kind(),
            namespace = template.namespace(),
            name = template.name()
        );
        let work = async move {
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
                    .write_status(context.client.clone(), &status)
                    .await
                    .map_err(|e| ApplyError::Api {
                        object: format!("{} {}", template.kind(), template.name()),
                        source: Box::new(e),
                    })?;
            }
            Ok::<_, ApplyError>(status)
        }
        .instrument(span);
        ctx.spawn(work.into_actor(self).map(|result, act, ctx| {
            let failed = match result {
                Ok(status) => {
                    if let Some(t) = act.template.as_mut() {
                        t.status = status;
                    }
                    false
                }
                Err(e) => {
                    warn!(error = %e, "ObjectTemplate reconcile failed; retrying");
                    true
                }
            };
            if act.gate.finish(ctx, failed, Self::reconcile) {
                act.reconcile(ctx);
            }
        }));
    }
}

impl Actor for ObjectTemplateActor {
    type Context = Context<Self>;

    fn stopped(&mut self, _: &mut Self::Context) {
        if let Some(t) = &self.template {
            self.context.cache.remove_route(t.uid());
        }
    }
}

impl FeedTarget for ObjectTemplateActor {
    type Object = TemplateObject;

    fn start_for(context: &ManagerContext) -> Addr<Self> {
        ObjectTemplateActor::new(context.clone()).start()
    }

    fn key(t: &TemplateObject) -> ObjectRef {
        ObjectRef {
            kind: t.kind(),
            namespace: t.namespace().to_owned(),
            name: t.name().to_owned(),
        }
    }
}

impl Handler<Observed<TemplateObject>> for ObjectTemplateActor {
    type Result = ();
    fn handle(&mut self, Observed(template): Observed<TemplateObject>, ctx: &mut Context<Self>) {
        // Our own status writes come back through the watch; they need no reconcile.
        let unchanged = self.template.as_ref().is_some_and(|known| {
            known.generation() == template.generation() && known.status == template.status
        });
        if self.template.is_none() {
            let addr = ctx.address();
            self.context.cache.add_route(
                template.uid(),
                Arc::new(move |_| addr.do_send(WatchedObjectChanged)),
            );
        }
        self.template = Some(template);
        if !unchanged {
            self.reconcile(ctx);
        }
    }
}

impl Handler<WatchedObjectChanged> for ObjectTemplateActor {
    type Result = ();
    fn handle(&mut self, _: WatchedObjectChanged, ctx: &mut Context<Self>) {
        self.reconcile(ctx);
    }
}

impl Handler<Gone> for ObjectTemplateActor {
    type Result = ();
    fn handle(&mut self, _: Gone, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}
