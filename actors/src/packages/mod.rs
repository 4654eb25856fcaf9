//! Package and ClusterPackage actors: pull, load and render through `pko-package`, write the
//! ObjectDeployment, report conditions; plus the pull-secret lookup. Loading rules live in `pko-package`,
//! the Package → ObjectDeployment rules in `engine::packages::package_deployment`; the cluster's facts every
//! render shares.

pub mod cluster_facts;
pub mod package_actor;
pub mod package_object;
pub mod package_render;
pub mod pull_secrets;
