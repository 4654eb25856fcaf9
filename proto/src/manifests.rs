//! `manifests.package-operator.run/v1alpha1`: the files inside a package image, `manifest.yaml`
//! (PackageManifest) and `manifest.lock.yaml` (PackageManifestLock), and the template context their
//! test cases give.
//!
//! These are files, not cluster objects, so they have no CRDs. Package Operator renamed the filter
//! section after the seeds were written (`conditionalFiltering{namedConditions, conditionalPaths}` became
//! `filter{conditions, paths}`); both spellings load. Fields added by later Package Operator versions
//! (`constraints`, `repositories`, `dependencies`, ...) are kept in `PackageManifestSpec::other`. As in
//! Package Operator (Go's JSON decoding), a field left out is its zero value, never an error.

use std::collections::BTreeMap;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::JSONSchemaProps;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::core::ObjectSetProbe;
use crate::string_enum::string_enum;

/// apiVersion of both file kinds.
pub const API_VERSION: &str = "manifests.package-operator.run/v1alpha1";

/// `manifest.yaml`: what a package contains and how it installs.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct PackageManifest {
    /// `manifests.package-operator.run/v1alpha1`.
    pub api_version: String,
    /// `PackageManifest`.
    pub kind: String,
    /// `name` is the package's name.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// Scopes, phases, probes, config schema, images, components, filters.
    pub spec: PackageManifestSpec,
    /// Template test cases and kubeconform settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test: Option<PackageManifestTest>,
}

string_enum! {
    /// Where a package may be installed.
    PackageManifestScope, default = Namespaced {
        /// As a ClusterPackage.
        Cluster = "Cluster",
        /// As a Package in a namespace.
        Namespaced = "Namespaced",
    }
}

/// The package description.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct PackageManifestSpec {
    /// Cluster, Namespaced, or both.
    #[serde(default)]
    pub scopes: Vec<PackageManifestScope>,
    /// Phases of the resulting ObjectDeployment, in order.
    #[serde(default)]
    pub phases: Vec<PackageManifestPhase>,
    /// Probes of the resulting ObjectDeployment.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub availability_probes: Vec<ObjectSetProbe>,
    /// Configuration schema.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<PackageManifestSpecConfig>,
    /// Images the templates refer to by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<PackageManifestImage>,
    /// Present (even empty) when this is a multi-component package.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub components: Option<PackageManifestComponentsConfig>,
    /// Conditional rendering (`filter` in later Package Operator versions).
    #[serde(default, alias = "filter", skip_serializing_if = "Option::is_none")]
    pub conditional_filtering: Option<PackageManifestConditionalFiltering>,
    /// Fields of later Package Operator versions, kept verbatim.
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

/// A phase of the package.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct PackageManifestPhase {
    /// Unique phase name.
    pub name: String,
    /// Delegation class (`hosted-cluster`, `default`, ...).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub class: String,
}

/// Configuration schema of a package.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PackageManifestSpecConfig {
    /// Kubernetes OpenAPI v3 schema the config is pruned, defaulted and validated against.
    #[serde(
        default,
        rename = "openAPIV3Schema",
        skip_serializing_if = "Option::is_none"
    )]
    pub open_api_v3_schema: Option<JSONSchemaProps>,
}

/// An image the templates refer to by name.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct PackageManifestImage {
    /// Name used in templates (`.images.<name>`).
    pub name: String,
    /// `REPOSITORY[:TAG]`.
    pub image: String,
}

/// Multi-component configuration (no fields yet; its presence is the switch).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PackageManifestComponentsConfig {}

/// Conditional rendering of objects.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PackageManifestConditionalFiltering {
    /// Reusable CEL conditions (`cond.<name>`), evaluated once per package.
    #[serde(default, alias = "conditions", skip_serializing_if = "Vec::is_empty")]
    pub named_conditions: Vec<PackageManifestNamedCondition>,
    /// CEL conditions on file paths matching a glob.
    #[serde(default, alias = "paths", skip_serializing_if = "Vec::is_empty")]
    pub conditional_paths: Vec<PackageManifestConditionalPath>,
}

/// A named CEL condition.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct PackageManifestNamedCondition {
    /// CEL identifier (`[_a-zA-Z][_a-zA-Z0-9]*`).
    pub name: String,
    /// Boolean CEL expression over the template context.
    pub expression: String,
}

/// A CEL condition on the files whose path matches a glob.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct PackageManifestConditionalPath {
    /// doublestar glob.
    pub glob: String,
    /// Boolean CEL expression; false drops the matching objects.
    pub expression: String,
}

/// Test configuration of a package.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PackageManifestTest {
    /// Template test cases, each rendered into fixtures.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub template: Vec<PackageManifestTestCaseTemplate>,
    /// kubeconform settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubeconform: Option<PackageManifestTestKubeconform>,
}

/// One template test case.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct PackageManifestTestCaseTemplate {
    /// Test case name (fixture directory).
    pub name: String,
    /// Template context of the case.
    #[serde(default)]
    pub context: TemplateContext,
}

/// kubeconform settings.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct PackageManifestTestKubeconform {
    /// Kubernetes version whose schemas to use.
    pub kubernetes_version: String,
    /// Schema locations.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub schema_locations: Vec<String>,
}

/// Everything a template sees.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TemplateContext {
    /// The (Cluster)Package being rendered.
    #[serde(default)]
    pub package: TemplateContextPackage,
    /// Admitted configuration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<Value>,
    /// Facts about the cluster.
    #[serde(default)]
    pub environment: PackageEnvironment,
}

/// The Package as templates see it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TemplateContextPackage {
    /// Name, namespace, labels, annotations.
    #[serde(default)]
    pub metadata: TemplateContextObjectMeta,
    /// Package image.
    #[serde(default)]
    pub image: String,
}

/// ObjectMeta reduced for templates.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TemplateContextObjectMeta {
    /// Name.
    #[serde(default)]
    pub name: String,
    /// Namespace.
    #[serde(default)]
    pub namespace: String,
    /// Labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Annotations.
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
}

/// Facts about the cluster a package is installed in.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PackageEnvironment {
    /// Always set.
    #[serde(default)]
    pub kubernetes: PackageEnvironmentKubernetes,
    /// Set on OpenShift.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open_shift: Option<PackageEnvironmentOpenShift>,
    /// Set on OpenShift with a cluster-wide proxy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy: Option<PackageEnvironmentProxy>,
    /// Set when the package is installed into a HostedCluster's HCP namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hyper_shift: Option<PackageEnvironmentHyperShift>,
}

/// Kubernetes facts.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PackageEnvironmentKubernetes {
    /// Server version.
    #[serde(default)]
    pub version: String,
}

/// OpenShift facts.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PackageEnvironmentOpenShift {
    /// Server version.
    #[serde(default)]
    pub version: String,
    /// Set on managed OpenShift.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub managed: Option<PackageEnvironmentManagedOpenShift>,
}

/// Managed OpenShift facts.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PackageEnvironmentManagedOpenShift {
    /// Key-value facts.
    #[serde(default)]
    pub data: BTreeMap<String, String>,
}

/// Proxy settings.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PackageEnvironmentProxy {
    /// HTTP_PROXY.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub http_proxy: String,
    /// HTTPS_PROXY.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub https_proxy: String,
    /// NO_PROXY.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub no_proxy: String,
}

/// HyperShift facts.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PackageEnvironmentHyperShift {
    /// The HostedCluster whose HCP namespace the package is in; absent elsewhere (the section itself
    /// is present whenever the HostedCluster API is served).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hosted_cluster: Option<PackageEnvironmentHyperShiftHostedCluster>,
}

/// The HostedCluster as templates see it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PackageEnvironmentHyperShiftHostedCluster {
    /// HostedCluster metadata.
    #[serde(default)]
    pub metadata: TemplateContextObjectMeta,
    /// The HCP namespace.
    #[serde(default)]
    pub hosted_cluster_namespace: String,
    /// Node selector for control-plane workloads, when HyperShift sets one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<BTreeMap<String, String>>,
}

/// `manifest.lock.yaml`: image digests resolved for a manifest's images.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct PackageManifestLock {
    /// `manifests.package-operator.run/v1alpha1`.
    pub api_version: String,
    /// `PackageManifestLock`.
    pub kind: String,
    /// Metadata (unused by pko).
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// The resolved images.
    pub spec: PackageManifestLockSpec,
}

/// Resolved images.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct PackageManifestLockSpec {
    /// One entry per manifest image.
    pub images: Vec<PackageManifestLockImage>,
}

/// An image with its resolved digest.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct PackageManifestLockImage {
    /// Name used in templates.
    pub name: String,
    /// `REPOSITORY[:TAG]` as in the manifest.
    pub image: String,
    /// Resolved digest.
    pub digest: String,
}
