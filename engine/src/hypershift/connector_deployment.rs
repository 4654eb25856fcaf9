//! The objects that run a hosted cluster's connector in its HCP namespace: a ServiceAccount, a Role and
//! RoleBinding (its leader-election Lease, nothing else), the Secret with the connector's NATS
//! credentials, and the Deployment running `pko-connector` with that Secret and the hosted cluster's
//! `service-network-admin-kubeconfig` mounted.
//!
//! Pure: built from the settings; the HostedCluster actor applies them. Every object carries
//! [`CONNECTOR_LABEL`], which is how they are found for removal and how the local connector runner finds
//! the Deployments it runs.

use pko_proto::well_known::{
    ACCOUNT_ANNOTATION, CONNECTOR_LABEL, CREDENTIALS_CLUSTER_ANNOTATION,
    CREDENTIALS_EXPIRY_ANNOTATION, CREDENTIALS_HASH_ANNOTATION,
};
use serde_json::{json, Value};

use pko_package::canonical_hash::value_hash;

pub use pko_proto::well_known::{
    CONNECTOR_CREDENTIALS_SECRET as CREDENTIALS_SECRET, CONNECTOR_NAME,
};
/// Key of the `.creds` file in [`CREDENTIALS_SECRET`].
pub const CREDENTIALS_KEY: &str = "nats.creds";
/// Where the NATS credentials are mounted.
pub const NATS_MOUNT: &str = "/etc/pko/nats";
/// Where the hosted cluster's kubeconfig Secret is mounted.
pub const KUBECONFIG_MOUNT: &str = "/etc/pko/hosted";
/// HyperShift's Secret with the hosted cluster's admin kubeconfig, in each HCP namespace.
pub const KUBECONFIG_SECRET: &str = "service-network-admin-kubeconfig";

/// What each connector container asks of and is held to by its node. No CPU limit: a throttled connector
/// answers the manager late, and its requests are small.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectorResources {
    pub cpu_request: String,
    pub memory_request: String,
    pub memory_limit: String,
}

impl Default for ConnectorResources {
    /// A connector holds one hosted cluster's phases: tens of MiB, a few percent of a core.
    fn default() -> Self {
        Self {
            cpu_request: "10m".to_owned(),
            memory_request: "64Mi".to_owned(),
            memory_limit: "256Mi".to_owned(),
        }
    }
}

/// Whether `text` is a Kubernetes quantity of the plain forms the connector flags take: digits, an
/// optional fraction, and an optional suffix (`m`, `k`, `M`, `G`, `T`, `Ki`, `Mi`, `Gi`, `Ti`).
pub fn valid_quantity(text: &str) -> bool {
    let suffixes = ["Ki", "Mi", "Gi", "Ti", "m", "k", "M", "G", "T", ""];
    let Some(number) = suffixes.iter().find_map(|s| text.strip_suffix(s)) else {
        return false;
    };
    let (whole, fraction) = number.split_once('.').unwrap_or((number, "0"));
    !whole.is_empty()
        && !fraction.is_empty()
        && whole.chars().all(|c| c.is_ascii_digit())
        && fraction.chars().all(|c| c.is_ascii_digit())
}

/// How the manager runs connectors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectorSettings {
    /// Image with the `pko-connector` binary (the manager's own image).
    pub image: String,
    /// NATS URL the connectors connect to.
    pub nats_url: String,
    /// The trace-export settings connectors get (`telemetry::connector_trace_env`): they trace where the
    /// manager traces.
    pub trace_env: Vec<(String, String)>,
    pub resources: ConnectorResources,
}

fn metadata(namespace: &str, name: &str) -> Value {
    json!({
        "name": name,
        "namespace": namespace,
        "labels": { CONNECTOR_LABEL: "True" },
    })
}

/// The ServiceAccount, Role, RoleBinding and Deployment of the connector in `namespace` for the
/// HostedCluster `cluster_uid` (its subjects are bound to it); `credentials_hash` identifies the current
/// credentials.
pub fn connector_objects(
    namespace: &str,
    cluster_uid: &str,
    settings: &ConnectorSettings,
    credentials_hash: &str,
) -> Vec<Value> {
    let labels = json!({ CONNECTOR_LABEL: "True", "app.kubernetes.io/name": CONNECTOR_NAME });
    let mut env = vec![
        json!({"name": "POD_NAMESPACE",
               "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}),
        json!({"name": "POD_NAME",
               "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}),
    ];
    env.extend(
        settings
            .trace_env
            .iter()
            .map(|(name, value)| json!({"name": name, "value": value})),
    );
    vec![
        json!({
            "apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": metadata(namespace, CONNECTOR_NAME),
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": metadata(namespace, CONNECTOR_NAME),
            // Its leader-election Lease, nothing else: phases reach it over NATS, not through the apiserver.
            "rules": [
                // Its own Lease only; RBAC cannot name the object of a create, so create stands alone.
                {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                 "resourceNames": [CONNECTOR_NAME], "verbs": ["get", "update"]},
                {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                 "verbs": ["create"]},
            ],
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": metadata(namespace, CONNECTOR_NAME),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": CONNECTOR_NAME},
            "subjects": [{"kind": "ServiceAccount", "name": CONNECTOR_NAME, "namespace": namespace}],
        }),
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": metadata(namespace, CONNECTOR_NAME),
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {
                        "labels": labels,
                        "annotations": { CREDENTIALS_HASH_ANNOTATION: credentials_hash },
                    },
                    "spec": {
                        "serviceAccountName": CONNECTOR_NAME,
                        "securityContext": {
                            "runAsNonRoot": true,
                            "seccompProfile": {"type": "RuntimeDefault"},
                        },
                        "containers": [{
                            "name": "connector",
                            "image": settings.image,
                            "command": ["pko-connector"],
                            "securityContext": {
                                "allowPrivilegeEscalation": false,
                                "readOnlyRootFilesystem": true,
                                "capabilities": {"drop": ["ALL"]},
                            },
                            "args": [
                                format!("--nats-url={}", settings.nats_url),
                                format!("--nats-creds={NATS_MOUNT}/{CREDENTIALS_KEY}"),
                                format!("--hosted-kubeconfig={KUBECONFIG_MOUNT}/kubeconfig"),
                                format!("--hosted-cluster-uid={cluster_uid}"),
                                "--leader-election".to_owned(),
                            ],
                            "env": env,
                            "resources": {
                                "requests": {
                                    "cpu": settings.resources.cpu_request,
                                    "memory": settings.resources.memory_request,
                                },
                                "limits": {"memory": settings.resources.memory_limit},
                            },
                            "volumeMounts": [
                                {"name": "nats", "mountPath": NATS_MOUNT, "readOnly": true},
                                {"name": "hosted-kubeconfig", "mountPath": KUBECONFIG_MOUNT,
                                 "readOnly": true},
                            ],
                        }],
                        "volumes": [
                            {"name": "nats", "secret": {"secretName": CREDENTIALS_SECRET}},
                            {"name": "hosted-kubeconfig", "secret": {"secretName": KUBECONFIG_SECRET}},
                        ],
                    },
                },
            },
        }),
    ]
}

/// Whom credentials are minted for, and until when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CredentialsBinding {
    /// The NATS account that signs them.
    pub account: String,
    /// The HostedCluster they serve.
    pub cluster_uid: String,
    /// Unix time at which they expire.
    pub expires_at: u64,
}

/// The Secret with freshly minted credentials, annotated with their binding.
pub fn credentials_secret(namespace: &str, binding: &CredentialsBinding, creds: &str) -> Value {
    let mut meta = metadata(namespace, CREDENTIALS_SECRET);
    meta["annotations"] = json!({
        ACCOUNT_ANNOTATION: binding.account,
        CREDENTIALS_CLUSTER_ANNOTATION: binding.cluster_uid,
        CREDENTIALS_EXPIRY_ANNOTATION: binding.expires_at.to_string(),
    });
    json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": meta,
        "type": "Opaque",
        "stringData": { CREDENTIALS_KEY: creds },
    })
}

/// Whether an existing credentials Secret (as JSON) still serves: it holds credentials signed for the
/// binding's account, minted for the same HostedCluster (not one that had this namespace before), and
/// valid past `renew_at` (Unix time). Re-minting only then keeps the connector pods from restarting on
/// every reconcile.
pub fn credentials_current(existing: &Value, wanted: &CredentialsBinding, renew_at: u64) -> bool {
    let annotation = |name: &str| {
        existing
            .pointer("/metadata/annotations")
            .and_then(|a| a.get(name))
            .and_then(Value::as_str)
    };
    let has_creds = existing
        .pointer("/data")
        .and_then(|d| d.get(CREDENTIALS_KEY))
        .and_then(Value::as_str)
        .is_some_and(|c| !c.is_empty());
    let expires_at = annotation(CREDENTIALS_EXPIRY_ANNOTATION).and_then(|e| e.parse::<u64>().ok());
    annotation(ACCOUNT_ANNOTATION) == Some(wanted.account.as_str())
        && annotation(CREDENTIALS_CLUSTER_ANNOTATION) == Some(wanted.cluster_uid.as_str())
        && expires_at.is_some_and(|e| e > renew_at)
        && has_creds
}

/// Identifies a credentials Secret's content for the pod template annotation.
pub fn credentials_hash(secret: &Value) -> String {
    format!(
        "{:016x}",
        value_hash(secret.pointer("/data").unwrap_or(&Value::Null))
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn settings() -> ConnectorSettings {
        ConnectorSettings {
            image: "quay.io/example/pko:v1".into(),
            nats_url: "nats://nats.pko:4222".into(),
            trace_env: Vec::new(),
            resources: ConnectorResources::default(),
        }
    }

    #[test]
    fn the_connector_container_has_requests_and_a_memory_limit() {
        let objects = connector_objects("clusters-a", "uid", &settings(), "hash");
        let deployment = objects.iter().find(|o| o["kind"] == "Deployment").unwrap();
        let resources = &deployment["spec"]["template"]["spec"]["containers"][0]["resources"];
        assert_eq!(resources["requests"]["cpu"], "10m");
        assert_eq!(resources["requests"]["memory"], "64Mi");
        assert_eq!(resources["limits"]["memory"], "256Mi");
        assert!(resources["limits"].get("cpu").is_none());
        for good in ["10m", "1", "0.5", "64Mi", "1Gi", "2k"] {
            assert!(valid_quantity(good), "{good}");
        }
        for bad in ["", "Mi", "1.Mi", "-1", "64MiB", "1e3", "ten"] {
            assert!(!valid_quantity(bad), "{bad}");
        }
    }

    /// deploy/connector/connector-rbac.yaml shows SREs the RBAC the manager grants each connector: it
    /// must be exactly what this code creates (`PKO_UPDATE_CONNECTOR_RBAC=1` rewrites it).
    #[test]
    fn the_documented_connector_rbac_is_what_the_manager_grants() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../deploy/connector/connector-rbac.yaml");
        let mut text = String::from(
            "# The RBAC pko-manager creates for the connector in every HCP namespace (shown for the\n\
             # namespace HCP_NAMESPACE; generated from the code by the connector_deployment tests).\n\
             # It is created by the manager; there is nothing to apply.\n",
        );
        for object in &connector_objects("HCP_NAMESPACE", "", &settings(), "")[..3] {
            text.push_str("---\n");
            text.push_str(&serde_saphyr::to_string(object).unwrap());
        }
        if std::env::var_os("PKO_UPDATE_CONNECTOR_RBAC").is_some() {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, &text).unwrap();
        }
        assert_eq!(
            std::fs::read_to_string(&path).unwrap_or_default(),
            text,
            "{} is stale; regenerate with PKO_UPDATE_CONNECTOR_RBAC=1 cargo test -p pko-engine connector_rbac",
            path.display()
        );
    }

    #[test]
    fn the_deployment_mounts_both_secrets_and_runs_the_connector() {
        let objects = connector_objects("clusters-a", "uid-a", &settings(), "abc");
        let kinds: Vec<&str> = objects
            .iter()
            .map(|o| o["kind"].as_str().unwrap())
            .collect();
        assert_eq!(
            kinds,
            ["ServiceAccount", "Role", "RoleBinding", "Deployment"]
        );
        for o in &objects {
            assert_eq!(o["metadata"]["namespace"], "clusters-a");
            assert_eq!(o["metadata"]["labels"][CONNECTOR_LABEL], "True");
        }
        let deployment = &objects[3];
        let pod = &deployment["spec"]["template"];
        assert_eq!(
            pod["metadata"]["annotations"][CREDENTIALS_HASH_ANNOTATION],
            "abc"
        );
        let container = &pod["spec"]["containers"][0];
        assert_eq!(container["image"], "quay.io/example/pko:v1");
        let args: Vec<&str> = container["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        assert_eq!(
            args,
            [
                "--nats-url=nats://nats.pko:4222",
                "--nats-creds=/etc/pko/nats/nats.creds",
                "--hosted-kubeconfig=/etc/pko/hosted/kubeconfig",
                "--hosted-cluster-uid=uid-a",
                "--leader-election",
            ]
        );
        let secrets: Vec<&str> = pod["spec"]["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["secret"]["secretName"].as_str().unwrap())
            .collect();
        assert_eq!(secrets, [CREDENTIALS_SECRET, KUBECONFIG_SECRET]);
        // Least privilege: its lease only.
        let resources: Vec<&str> = objects[1]["rules"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|r| r["resources"].as_array().unwrap())
            .map(|r| r.as_str().unwrap())
            .collect();
        assert_eq!(resources, ["leases", "leases"]);
        assert_eq!(
            objects[1]["rules"][0]["resourceNames"],
            json!([CONNECTOR_NAME])
        );
        assert_eq!(objects[1]["rules"][1]["verbs"], json!(["create"]));
    }

    #[test]
    fn credentials_are_kept_while_bound_alike_and_far_from_expiry() {
        let binding = CredentialsBinding {
            account: "ACCOUNT".into(),
            cluster_uid: "uid-1".into(),
            expires_at: 1_000,
        };
        let minted = credentials_secret("ns", &binding, "creds");
        assert_eq!(minted["stringData"][CREDENTIALS_KEY], "creds");
        // As the apiserver stores it: base64 data.
        let mut stored = minted.clone();
        stored["data"] = json!({ CREDENTIALS_KEY: "Y3JlZHM=" });
        assert!(credentials_current(&stored, &binding, 999));
        // Due for renewal, another account, or another HostedCluster in the same namespace.
        assert!(!credentials_current(&stored, &binding, 1_000));
        let other_account = CredentialsBinding {
            account: "OTHER".into(),
            ..binding.clone()
        };
        assert!(!credentials_current(&stored, &other_account, 0));
        let recreated = CredentialsBinding {
            cluster_uid: "uid-2".into(),
            ..binding.clone()
        };
        assert!(!credentials_current(&stored, &recreated, 0));
        stored["data"] = json!({});
        assert!(!credentials_current(&stored, &binding, 0));
        let a = credentials_hash(&json!({"data": {"k": "1"}}));
        assert_ne!(a, credentials_hash(&json!({"data": {"k": "2"}})));
        assert_eq!(a.len(), 16);
    }
}
