//! The `.environment` section of a package's template context: the Kubernetes version always, and the
//! HyperShift section when the package is installed in the HCP namespace of a HostedCluster (the
//! cluster's metadata, its namespace, and its control-plane node selector if it sets one).
//!
//! Pure: the caller reads the version and the HostedClusters.

use pko_proto::hypershift::HostedCluster;
use pko_proto::manifests::{
    PackageEnvironment, PackageEnvironmentHyperShift, PackageEnvironmentHyperShiftHostedCluster,
    PackageEnvironmentKubernetes, TemplateContextObjectMeta,
};
use serde_json::Value;

/// The environment of a package in `package_namespace` (None for a ClusterPackage).
pub fn package_environment(
    kubernetes_version: &str,
    package_namespace: Option<&str>,
    hosted_clusters: &[HostedCluster],
) -> PackageEnvironment {
    let hosted_cluster = package_namespace.and_then(|ns| {
        hosted_clusters
            .iter()
            .find(|hc| hc.hosted_control_plane_namespace().as_deref() == Some(ns))
    });
    PackageEnvironment {
        kubernetes: PackageEnvironmentKubernetes {
            version: kubernetes_version.to_owned(),
        },
        open_shift: None,
        proxy: None,
        hyper_shift: hosted_cluster.map(|hc| PackageEnvironmentHyperShift {
            hosted_cluster: PackageEnvironmentHyperShiftHostedCluster {
                metadata: TemplateContextObjectMeta {
                    name: hc.metadata.name.clone().unwrap_or_default(),
                    namespace: hc.metadata.namespace.clone().unwrap_or_default(),
                    labels: hc.metadata.labels.clone().unwrap_or_default(),
                    annotations: hc.metadata.annotations.clone().unwrap_or_default(),
                },
                hosted_cluster_namespace: hc.hosted_control_plane_namespace().unwrap_or_default(),
                node_selector: hc
                    .spec
                    .as_ref()
                    .and_then(|s| s.get("nodeSelector"))
                    .and_then(|n| serde_json::from_value(n.clone()).ok())
                    .filter(|n: &std::collections::BTreeMap<String, String>| !n.is_empty()),
            },
        }),
    }
}

/// The environment as template data.
pub fn environment_value(environment: &PackageEnvironment) -> Value {
    serde_json::to_value(environment).unwrap_or(Value::Null)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn hosted_cluster(ns: &str, name: &str, spec: Value) -> HostedCluster {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": ns, "labels": {"risk": "low"}}, "spec": spec,
        }))
        .unwrap()
    }

    #[test]
    fn the_hypershift_section_appears_only_in_an_hcp_namespace() {
        let clusters = vec![
            hosted_cluster("clusters", "a.b", json!({"nodeSelector": {"role": "cp"}})),
            hosted_cluster("clusters", "c", json!({})),
        ];
        let env = environment_value(&package_environment(
            "v1.20.2",
            Some("clusters-a-b"),
            &clusters,
        ));
        assert_eq!(env["kubernetes"]["version"], "v1.20.2");
        let hc = &env["hyperShift"]["hostedCluster"];
        assert_eq!(hc["metadata"]["name"], "a.b");
        assert_eq!(hc["metadata"]["labels"]["risk"], "low");
        assert_eq!(hc["hostedClusterNamespace"], "clusters-a-b");
        assert_eq!(hc["nodeSelector"]["role"], "cp");

        let plain = environment_value(&package_environment(
            "v1.20.2",
            Some("clusters-c"),
            &clusters,
        ));
        assert!(plain["hyperShift"]["hostedCluster"]
            .get("nodeSelector")
            .is_none());
        for ns in [Some("team-a"), None] {
            let env = environment_value(&package_environment("v1.20.2", ns, &clusters));
            assert!(env.get("hyperShift").is_none(), "{env}");
        }
    }
}
