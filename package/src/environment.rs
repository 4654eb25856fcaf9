//! The `.environment` section of a package's template context, from facts the caller read:
//! - `kubernetes.version`, always;
//! - `openShift.version` (the last completed update of ClusterVersion `version`) and `openShift.managed.data`
//!   (ConfigMap `openshift-config/osd-cluster-metadata`) on OpenShift;
//! - `proxy` from the cluster Proxy's status, on OpenShift, when any of its fields is set;
//! - `hyperShift` whenever the HostedCluster API is served, with `hostedCluster` (metadata, HCP namespace,
//!   node selector) when the package is in a HostedCluster's HCP namespace.
//!
//! Pure: reading the objects is the Package actor's (`package_object.rs`).

use std::collections::BTreeMap;

use pko_proto::hypershift::HostedCluster;
use pko_proto::manifests::{
    PackageEnvironment, PackageEnvironmentHyperShift, PackageEnvironmentHyperShiftHostedCluster,
    PackageEnvironmentKubernetes, PackageEnvironmentManagedOpenShift, PackageEnvironmentOpenShift,
    PackageEnvironmentProxy, TemplateContextObjectMeta,
};
use serde_json::Value;

/// What the cluster says about itself.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EnvironmentFacts {
    pub kubernetes_version: String,
    /// ClusterVersion `version`, when the OpenShift config API is served.
    pub cluster_version: Option<Value>,
    /// Data of `openshift-config/osd-cluster-metadata`, when it exists.
    pub managed_openshift: Option<BTreeMap<String, String>>,
    /// Proxy `cluster`, when it exists.
    pub proxy: Option<Value>,
    /// When the HostedCluster API is served: the HostedClusters to find the package's own among (the
    /// manager passes only the one whose HCP namespace the package is in, if any).
    pub hosted_clusters: Option<Vec<HostedCluster>>,
}

fn openshift(facts: &EnvironmentFacts) -> Option<PackageEnvironmentOpenShift> {
    let cluster_version = facts.cluster_version.as_ref()?;
    let version = cluster_version
        .pointer("/status/history")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find(|update| update["state"] == "Completed")
        .and_then(|update| update["version"].as_str())
        .unwrap_or_default()
        .to_owned();
    Some(PackageEnvironmentOpenShift {
        version,
        managed: facts
            .managed_openshift
            .clone()
            .map(|data| PackageEnvironmentManagedOpenShift { data }),
    })
}

fn proxy(facts: &EnvironmentFacts) -> Option<PackageEnvironmentProxy> {
    let status = facts.proxy.as_ref()?.get("status")?;
    let field = |name: &str| {
        status
            .get(name)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    let proxy = PackageEnvironmentProxy {
        http_proxy: field("httpProxy"),
        https_proxy: field("httpsProxy"),
        no_proxy: field("noProxy"),
    };
    (proxy != PackageEnvironmentProxy::default()).then_some(proxy)
}

fn hosted_cluster(hc: &HostedCluster) -> PackageEnvironmentHyperShiftHostedCluster {
    PackageEnvironmentHyperShiftHostedCluster {
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
            .and_then(|n| serde_json::from_value::<BTreeMap<String, String>>(n.clone()).ok())
            .filter(|n| !n.is_empty()),
    }
}

/// The environment of a package in `package_namespace` (None for a ClusterPackage).
pub fn package_environment(
    facts: &EnvironmentFacts,
    package_namespace: Option<&str>,
) -> PackageEnvironment {
    let openshift = openshift(facts);
    PackageEnvironment {
        kubernetes: PackageEnvironmentKubernetes {
            version: facts.kubernetes_version.clone(),
        },
        proxy: openshift.as_ref().and_then(|_| proxy(facts)),
        open_shift: openshift,
        hyper_shift: facts
            .hosted_clusters
            .as_ref()
            .map(|clusters| PackageEnvironmentHyperShift {
                hosted_cluster: package_namespace.and_then(|ns| {
                    clusters
                        .iter()
                        .find(|hc| hc.hosted_control_plane_namespace().as_deref() == Some(ns))
                        .map(hosted_cluster)
                }),
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

    fn facts() -> EnvironmentFacts {
        EnvironmentFacts {
            kubernetes_version: "v1.37.2".to_owned(),
            ..Default::default()
        }
    }

    #[test]
    fn plain_kubernetes_has_only_the_version() {
        let env = environment_value(&package_environment(&facts(), Some("team")));
        assert_eq!(env, json!({"kubernetes": {"version": "v1.37.2"}}));
    }

    #[test]
    fn the_hypershift_section_names_the_hosted_cluster_only_in_its_hcp_namespace() {
        let facts = EnvironmentFacts {
            hosted_clusters: Some(vec![
                hosted_cluster("clusters", "a.b", json!({"nodeSelector": {"role": "cp"}})),
                hosted_cluster("clusters", "c", json!({})),
            ]),
            ..facts()
        };
        let env = environment_value(&package_environment(&facts, Some("clusters-a-b")));
        let hc = &env["hyperShift"]["hostedCluster"];
        assert_eq!(hc["metadata"]["name"], "a.b");
        assert_eq!(hc["metadata"]["labels"]["risk"], "low");
        assert_eq!(hc["hostedClusterNamespace"], "clusters-a-b");
        assert_eq!(hc["nodeSelector"]["role"], "cp");
        let plain = environment_value(&package_environment(&facts, Some("clusters-c")));
        assert!(plain["hyperShift"]["hostedCluster"]
            .get("nodeSelector")
            .is_none());
        for ns in [Some("team-a"), None] {
            let env = environment_value(&package_environment(&facts, ns));
            assert_eq!(env["hyperShift"], json!({}), "{env}");
        }
    }

    #[test]
    fn openshift_version_managed_data_and_proxy() {
        let facts = EnvironmentFacts {
            cluster_version: Some(json!({"status": {"history": [
                {"state": "Partial", "version": "4.16.0"},
                {"state": "Completed", "version": "4.15.2"},
            ]}})),
            managed_openshift: Some(BTreeMap::from([("provider".to_owned(), "rosa".to_owned())])),
            proxy: Some(
                json!({"status": {"httpProxy": "http://proxy:3128", "noProxy": ".cluster.local"}}),
            ),
            ..facts()
        };
        let env = environment_value(&package_environment(&facts, None));
        assert_eq!(env["openShift"]["version"], "4.15.2");
        assert_eq!(env["openShift"]["managed"]["data"]["provider"], "rosa");
        assert_eq!(
            env["proxy"],
            json!({"httpProxy": "http://proxy:3128", "noProxy": ".cluster.local"})
        );

        let empty_proxy = EnvironmentFacts {
            proxy: Some(json!({"status": {}})),
            ..facts.clone()
        };
        assert!(environment_value(&package_environment(&empty_proxy, None))
            .get("proxy")
            .is_none());
        let not_openshift = EnvironmentFacts {
            cluster_version: None,
            ..facts
        };
        let env = environment_value(&package_environment(&not_openshift, None));
        assert!(
            env.get("openShift").is_none() && env.get("proxy").is_none(),
            "{env}"
        );
    }
}
