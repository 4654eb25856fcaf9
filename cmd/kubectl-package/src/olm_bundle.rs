//! `kickstart --olm-bundle`: an OLM registry+v1 bundle image turned into plain objects. The bundle's
//! `metadata/annotations.yaml` names the package; its `manifests/` hold a ClusterServiceVersion and the
//! objects shipped beside it. The CSV's install strategy becomes what OLM would create: the operator's
//! Deployments, ServiceAccounts, Roles/RoleBindings (`permissions`) and ClusterRoles/ClusterRoleBindings
//! (`clusterPermissions`), in the CSV's suggested namespace or `<package>-system`.

use std::collections::BTreeSet;

use pko_package::files::PackageFiles;
use serde_json::{json, Value};

const PACKAGE_ANNOTATION: &str = "operators.operatorframework.io.bundle.package.v1";
const SUGGESTED_NAMESPACE: &str = "operatorframework.io/suggested-namespace";

/// Kinds a bundle may ship that are cluster-scoped (they get no namespace).
fn cluster_scoped(kind: &str) -> bool {
    matches!(
        kind,
        "CustomResourceDefinition"
            | "ClusterRole"
            | "ClusterRoleBinding"
            | "PriorityClass"
            | "StorageClass"
            | "ValidatingWebhookConfiguration"
            | "MutatingWebhookConfiguration"
            | "APIService"
            | "Namespace"
            | "ConsoleYAMLSample"
            | "ConsoleQuickStart"
            | "ConsoleCLIDownload"
            | "ConsoleLink"
    )
}

/// The package name and the plain objects of a bundle's files.
pub fn convert(files: &PackageFiles) -> Result<(String, Vec<Value>), String> {
    let annotations: Value = files
        .get("metadata/annotations.yaml")
        .map(|b| serde_saphyr::from_slice(b))
        .transpose()
        .map_err(|e| format!("import olm bundle: metadata/annotations.yaml: {e}"))?
        .ok_or("import olm bundle: metadata/annotations.yaml missing")?;
    let package = annotations
        .pointer("/annotations")
        .and_then(|a| a.get(PACKAGE_ANNOTATION))
        .and_then(Value::as_str)
        .ok_or_else(|| format!("import olm bundle: annotation {PACKAGE_ANNOTATION} missing"))?
        .to_owned();
    let mut manifests = Vec::new();
    for (path, bytes) in files
        .iter()
        .filter(|(p, _)| p.starts_with("manifests/"))
        .filter(|(p, _)| p.ends_with(".yaml") || p.ends_with(".yml") || p.ends_with(".json"))
    {
        let text = String::from_utf8_lossy(bytes);
        for document in pko_package::yaml::split_object_file(&text) {
            let value: Value = serde_saphyr::from_str(document)
                .map_err(|e| format!("import olm bundle: {path}: {e}"))?;
            if value.is_object() {
                manifests.push(value);
            }
        }
    }
    let (csvs, others): (Vec<Value>, Vec<Value>) = manifests
        .into_iter()
        .partition(|m| m["kind"] == "ClusterServiceVersion");
    let [csv] = csvs.as_slice() else {
        return Err(format!(
            "import olm bundle: want one ClusterServiceVersion in manifests/, found {}",
            csvs.len()
        ));
    };
    let namespace = csv
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(SUGGESTED_NAMESPACE))
        .and_then(Value::as_str)
        .map_or_else(|| format!("{package}-system"), str::to_owned);
    let mut objects = install_strategy(csv, &package, &namespace);
    for mut other in others {
        let kind = other["kind"].as_str().unwrap_or_default().to_owned();
        if !cluster_scoped(&kind) && other.pointer("/metadata/namespace").is_none() {
            other["metadata"]["namespace"] = json!(namespace);
        }
        objects.push(other);
    }
    Ok((package, objects))
}

/// What OLM creates for the CSV's `spec.install.spec`.
fn install_strategy(csv: &Value, package: &str, namespace: &str) -> Vec<Value> {
    let install = csv
        .pointer("/spec/install/spec")
        .cloned()
        .unwrap_or_default();
    let list = |key: &str| install[key].as_array().cloned().unwrap_or_default();
    let mut accounts = BTreeSet::new();
    let mut objects = Vec::new();
    for deployment in list("deployments") {
        let name = deployment["name"].as_str().unwrap_or_default();
        if let Some(sa) = deployment
            .pointer("/spec/template/spec/serviceAccountName")
            .and_then(Value::as_str)
        {
            accounts.insert(sa.to_owned());
        }
        let mut object = json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": namespace},
            "spec": deployment["spec"],
        });
        if let Some(labels) = deployment.get("label").filter(|l| l.is_object()) {
            object["metadata"]["labels"] = labels.clone();
        }
        objects.push(object);
    }
    let rbac = "rbac.authorization.k8s.io/v1";
    for (scope, key) in [
        ("Role", "permissions"),
        ("ClusterRole", "clusterPermissions"),
    ] {
        for (i, permission) in list(key).iter().enumerate() {
            let sa = permission["serviceAccountName"]
                .as_str()
                .unwrap_or_default();
            accounts.insert(sa.to_owned());
            let suffix = if scope == "Role" { "" } else { "-cluster" };
            let name = format!("{package}-{sa}{suffix}-{i}");
            let mut role = json!({
                "apiVersion": rbac, "kind": scope,
                "metadata": {"name": name},
                "rules": permission["rules"],
            });
            let mut binding = json!({
                "apiVersion": rbac, "kind": format!("{scope}Binding"),
                "metadata": {"name": name},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": scope, "name": name},
                "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": namespace}],
            });
            if scope == "Role" {
                role["metadata"]["namespace"] = json!(namespace);
                binding["metadata"]["namespace"] = json!(namespace);
            }
            objects.push(role);
            objects.push(binding);
        }
    }
    for sa in accounts.into_iter().filter(|s| !s.is_empty()) {
        objects.push(json!({
            "apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": sa, "namespace": namespace},
        }));
    }
    objects
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_install_strategy_becomes_plain_objects() {
        let csv = "apiVersion: operators.coreos.com/v1alpha1\nkind: ClusterServiceVersion\nmetadata:\n  name: op.v1\nspec:\n  install:\n    strategy: deployment\n    spec:\n      deployments:\n      - name: op\n        label: {app: op}\n        spec:\n          template:\n            spec:\n              serviceAccountName: op\n              containers: [{name: op, image: quay.io/op:1}]\n      permissions:\n      - serviceAccountName: op\n        rules: [{apiGroups: [\"\"], resources: [configmaps], verbs: [get]}]\n      clusterPermissions:\n      - serviceAccountName: op\n        rules: [{apiGroups: [\"\"], resources: [nodes], verbs: [list]}]\n";
        let files: PackageFiles = [
            (
                "metadata/annotations.yaml",
                format!("annotations:\n  {PACKAGE_ANNOTATION}: op\n"),
            ),
            ("manifests/op.csv.yaml", csv.to_owned()),
            (
                "manifests/svc.yaml",
                "apiVersion: v1\nkind: Service\nmetadata: {name: op-metrics}\n".to_owned(),
            ),
        ]
        .into_iter()
        .map(|(p, c)| (p.to_owned(), c.into_bytes()))
        .collect();
        let (package, objects) = convert(&files).unwrap();
        assert_eq!(package, "op");
        let kinds: Vec<(&str, &str)> = objects
            .iter()
            .map(|o| {
                (
                    o["kind"].as_str().unwrap(),
                    o.pointer("/metadata/namespace")
                        .and_then(Value::as_str)
                        .unwrap_or(""),
                )
            })
            .collect();
        assert_eq!(
            kinds,
            [
                ("Deployment", "op-system"),
                ("Role", "op-system"),
                ("RoleBinding", "op-system"),
                ("ClusterRole", ""),
                ("ClusterRoleBinding", ""),
                ("ServiceAccount", "op-system"),
                ("Service", "op-system"),
            ]
        );
        assert_eq!(objects[0]["metadata"]["labels"], json!({"app": "op"}));
        assert!(convert(&PackageFiles::new()).is_err());
    }
}
