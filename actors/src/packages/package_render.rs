//! A package's render, as a Package's unpack does it and as a HostedClusterPackage's preflight repeats it
//! for every HCP namespace: the image pulled with the credentials it needs (cached by digest), the
//! cluster's facts and the namespace's HostedCluster in `.environment`, the templates rendered off the
//! actor threads. It applies nothing.

use std::sync::Arc;

use pko_package::environment::{environment_value, package_environment};
use pko_package::files::PackageFiles;
use pko_package::loader::{load_installable, LoadedPackage};
use tracing::{info_span, Instrument};

use crate::engine::packages::package_deployment::{scope_error, UnpackOutcome};
use crate::manager::context::ManagerContext;
use crate::packages::package_object::PackageObject;
use crate::runtime::meta_view::MetaView;

/// The files of package image `image`, or why they cannot be had (an unpack limit, a failed pull).
/// Errors are the apiserver's (reading the pull secrets).
pub async fn pull_package(
    context: &ManagerContext,
    image: &str,
) -> Result<Result<Arc<PackageFiles>, UnpackOutcome>, kube::Error> {
    let (auth, credentials) = context
        .pull_secrets
        .auth_for(&context.runtime.client, image)
        .await?;
    context.metrics.images.credentials(credentials);
    let started = std::time::Instant::now();
    let fetched = context
        .images
        .fetch(image, &auth)
        .instrument(info_span!("pull image", pko.image = %image))
        .await;
    context
        .metrics
        .images
        .fetched(started.elapsed().as_secs_f64());
    Ok(match fetched {
        Ok((_, files)) => Ok(files),
        Err(e) if e.is_limit() => Err(UnpackOutcome::ImageRefused(e.to_string())),
        Err(e) => {
            // The fix may be a pull secret added or rotated since they were read.
            context.pull_secrets.forget().await;
            Err(UnpackOutcome::PullFailed(e.to_string()))
        }
    })
}

/// `package` rendered from `files` with its template context, or why it cannot be (`Invalid`).
/// Errors are the apiserver's (reading the cluster's facts).
pub async fn render_package(
    context: &ManagerContext,
    package: &PackageObject,
    files: Arc<PackageFiles>,
) -> Result<Result<LoadedPackage, UnpackOutcome>, kube::Error> {
    let hosted_clusters = context
        .rollouts
        .clusters
        .hosted_cluster_for((!package.cluster).then(|| package.namespace()))
        .await;
    let facts = context
        .cluster_facts
        .read(&context.runtime.client, hosted_clusters)
        .await?;
    let environment = environment_value(&package_environment(
        &facts,
        (!package.cluster).then(|| package.namespace()),
    ));
    // Loading renders the package's templates: CPU work bounded by the render budget
    // (`pko_package::render_budget`), run on the blocking pool so no template stalls the actors or the
    // leader Lease, and a panic in it is this package's problem only.
    let for_render = package.clone();
    let render = info_span!("render package");
    let loaded = tokio::task::spawn_blocking(move || {
        let _entered = render.enter();
        load_installable(
            &files,
            Some(for_render.spec.component.as_str()),
            for_render.spec.config.as_ref(),
            |_, config| for_render.template_context(config, environment),
        )
        .map_err(|e| e.to_string())
    })
    .await
    .unwrap_or_else(|e| Err(format!("loading the package failed unexpectedly: {e}")));
    let loaded = match loaded {
        Ok(loaded) => loaded,
        Err(message) => return Ok(Err(UnpackOutcome::Invalid(message))),
    };
    Ok(match scope_error(&package.package_ref(), &loaded) {
        Some(message) => Err(UnpackOutcome::Invalid(message)),
        None => Ok(loaded),
    })
}
