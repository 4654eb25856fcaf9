//! From a Package and its loaded contents to the ObjectDeployment that rolls it out, and the Package's
//! conditions from what happened (unpack, load) and what the ObjectDeployment reports. Pure.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;
use pko_package::loader::LoadedPackage;
use pko_package::violation::{reason, Violation};
use pko_proto::manifests::PackageManifestScope;
use pko_proto::well_known::{
    INSTANCE_LABEL, PACKAGE_LABEL, SERVICE_ACCOUNT_ANNOTATION, SOURCE_IMAGE_ANNOTATION,
};
use serde_json::{json, Value};

use crate::conditions::{
    is_current, is_mapped, mirror_conditions, remove_condition, set_condition, ConditionUpdate,
};

/// The Package (or ClusterPackage) being reconciled, as these rules need it.
#[derive(Debug, Clone, PartialEq)]
pub struct PackageRef {
    pub name: String,
    /// `None` for ClusterPackages.
    pub namespace: Option<String>,
    pub uid: String,
    pub image: String,
    pub paused: bool,
    /// The Package's `package-operator.run/service-account`, carried to its ObjectDeployment.
    pub service_account: Option<String>,
}

impl PackageRef {
    fn kind(&self) -> &'static str {
        if self.namespace.is_some() {
            "Package"
        } else {
            "ClusterPackage"
        }
    }
}

/// A package installed in a scope its manifest does not declare.
pub fn scope_error(package: &PackageRef, loaded: &LoadedPackage) -> Option<String> {
    let wanted = match package.namespace {
        Some(_) => PackageManifestScope::Namespaced,
        None => PackageManifestScope::Cluster,
    };
    // Upstream's wording, then which scope was asked for and what the manifest declares.
    (!loaded.manifest.spec.scopes.contains(&wanted)).then(|| {
        Violation::new(reason::UNSUPPORTED_SCOPE)
            .in_file(loaded.manifest_file.clone())
            .details(format!(
                "installed as {}, the manifest declares {}",
                package.kind(),
                loaded
                    .manifest
                    .spec
                    .scopes
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
            .to_string()
    })
}

/// The ObjectDeployment (or ClusterObjectDeployment) of a package: same name (and namespace), controlled
/// by the Package, labelled with the manifest and instance names.
pub fn package_deployment(package: &PackageRef, loaded: &LoadedPackage) -> Value {
    let manifest_name = loaded.manifest.metadata.name.clone().unwrap_or_default();
    let labels = json!({ PACKAGE_LABEL: manifest_name, INSTANCE_LABEL: package.name });
    let mut metadata = json!({
        "name": package.name,
        "labels": labels,
        "annotations": { SOURCE_IMAGE_ANNOTATION: package.image },
        "ownerReferences": [{
            "apiVersion": format!("{}/{}", pko_proto::GROUP, pko_proto::VERSION),
            "kind": package.kind(),
            "name": package.name,
            "uid": package.uid,
            "controller": true,
            "blockOwnerDeletion": true,
        }],
    });
    if let Some(ns) = &package.namespace {
        metadata["namespace"] = json!(ns);
    }
    if let Some(account) = &package.service_account {
        metadata["annotations"][SERVICE_ACCOUNT_ANNOTATION] = json!(account);
    }
    json!({
        "apiVersion": format!("{}/{}", pko_proto::GROUP, pko_proto::VERSION),
        "kind": if package.namespace.is_some() { "ObjectDeployment" } else { "ClusterObjectDeployment" },
        "metadata": metadata,
        "spec": {
            "paused": package.paused,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": loaded.template_spec(),
            },
        },
    })
}

/// What the last unpack of the package's current spec came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UnpackOutcome {
    /// Image pulled, package loaded, deployment applied.
    Unpacked,
    /// The image could not be pulled; retried with backoff.
    PullFailed(String),
    /// The image breaks an unpack limit or holds what no package may (a link, a path leaving its root);
    /// the message names the limit. Pulled again only when the spec changes.
    ImageRefused(String),
    /// The package's content is wrong; retried when the spec changes.
    Invalid(String),
}

/// The Package's conditions and summary phase. `deployment` is the ObjectDeployment's (conditions,
/// generation) when it exists.
pub fn package_conditions(
    previous: &[Condition],
    generation: i64,
    paused: bool,
    outcome: &UnpackOutcome,
    deployment: Option<(&[Condition], i64)>,
    now: Timestamp,
) -> (Vec<Condition>, &'static str) {
    let mut conditions = previous.to_vec();
    let set = |c: &mut Vec<Condition>, u| set_condition(c, u, generation, now);
    match outcome {
        UnpackOutcome::Unpacked => {
            set(
                &mut conditions,
                ConditionUpdate::new("Unpacked", true, "UnpackSuccess", "Unpack job succeeded"),
            );
            remove_condition(&mut conditions, "Invalid");
        }
        UnpackOutcome::PullFailed(message) => {
            set(
                &mut conditions,
                ConditionUpdate::new("Unpacked", false, "ImagePullBackOff", message.clone()),
            );
        }
        UnpackOutcome::ImageRefused(message) => {
            set(
                &mut conditions,
                ConditionUpdate::new("Unpacked", false, "ImageRefused", message.clone()),
            );
        }
        UnpackOutcome::Invalid(message) => {
            set(
                &mut conditions,
                ConditionUpdate::new("Invalid", true, "LoadError", message.clone()),
            );
        }
    }
    // Available, Progressing, Paused and mapped conditions come from the deployment, when fresh there
    // (kept in place: at 500 Packages a fresh transition time on every reconcile meant a rewrite of
    // every Package each second).
    let from_deployment =
        |t: &str| is_mapped(t) || matches!(t, "Available" | "Progressing" | "Paused");
    let fresh = deployment
        .into_iter()
        .flat_map(|(od_conditions, od_generation)| {
            od_conditions
                .iter()
                .filter(move |c| is_current(c, od_generation))
        });
    mirror_conditions(&mut conditions, fresh, from_deployment, generation, now);
    // The deployment still runs what the previous spec rendered: the current spec is not rolled out, so
    // the Package is progressing whatever the deployment says of itself.
    let not_rolled_out = match outcome {
        UnpackOutcome::Unpacked => None,
        UnpackOutcome::PullFailed(message) => Some(("ImagePullBackOff", message)),
        UnpackOutcome::ImageRefused(message) => Some(("ImageRefused", message)),
        UnpackOutcome::Invalid(message) => Some(("LoadError", message)),
    };
    if let Some((reason, message)) = not_rolled_out {
        set(
            &mut conditions,
            ConditionUpdate::new(
                "Progressing",
                true,
                reason,
                format!("The current spec cannot be rolled out: {message}"),
            ),
        );
    }
    let is_true = |t: &str| {
        conditions
            .iter()
            .any(|c| c.type_ == t && c.status == "True")
    };
    let phase = match outcome {
        UnpackOutcome::Invalid(_) | UnpackOutcome::ImageRefused(_) => "Invalid",
        UnpackOutcome::PullFailed(_) => "Unpacking",
        UnpackOutcome::Unpacked if paused => "Paused",
        UnpackOutcome::Unpacked if is_true("Available") => "Available",
        UnpackOutcome::Unpacked => "Progressing",
    };
    (conditions, phase)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pko_package::files::PackageFiles;
    use pko_package::loader::load_package;

    fn loaded(scopes: &str) -> LoadedPackage {
        let mut files = PackageFiles::new();
        files.insert(
            "manifest.yaml".into(),
            format!("apiVersion: manifests.package-operator.run/v1alpha1\nkind: PackageManifest\nmetadata: {{name: shop}}\nspec:\n  scopes: [{scopes}]\n  phases: [{{name: main}}]\n").into(),
        );
        files.insert("cm.yaml".into(), b"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\n  annotations: {package-operator.run/phase: main}\n".to_vec());
        load_package(&files, &json!({})).unwrap()
    }

    fn package(namespace: Option<&str>) -> PackageRef {
        PackageRef {
            name: "my-shop".into(),
            namespace: namespace.map(str::to_owned),
            uid: "u".into(),
            image: "reg/shop:v1".into(),
            service_account: None,
            paused: false,
        }
    }

    #[test]
    fn deployment_carries_the_package() {
        let od = package_deployment(&package(Some("ns")), &loaded("Namespaced"));
        assert_eq!(od["kind"], "ObjectDeployment");
        assert_eq!(od["metadata"]["namespace"], "ns");
        assert_eq!(od["metadata"]["labels"][PACKAGE_LABEL], "shop");
        assert_eq!(od["metadata"]["labels"][INSTANCE_LABEL], "my-shop");
        assert_eq!(od["metadata"]["ownerReferences"][0]["kind"], "Package");
        assert_eq!(
            od["spec"]["template"]["spec"]["phases"][0]["objects"][0]["object"]["metadata"]["name"],
            "c"
        );
        let cluster = package_deployment(&package(None), &loaded("Cluster"));
        assert_eq!(cluster["kind"], "ClusterObjectDeployment");
        assert!(cluster["metadata"].get("namespace").is_none());
    }

    #[test]
    fn scopes_are_enforced() {
        assert!(scope_error(&package(Some("ns")), &loaded("Namespaced")).is_none());
        let err = scope_error(&package(None), &loaded("Namespaced")).unwrap();
        assert_eq!(
            err,
            "Package unsupported scope in manifest.yaml: installed as ClusterPackage, the manifest declares Namespaced"
        );
    }

    #[test]
    fn conditions_follow_unpack_and_deployment() {
        let now = Timestamp::from_second(5).unwrap();
        let (c, phase) = package_conditions(
            &[],
            1,
            false,
            &UnpackOutcome::PullFailed("image x not found".into()),
            None,
            now,
        );
        assert_eq!(phase, "Unpacking");
        assert!(c.iter().any(|c| c.type_ == "Unpacked"
            && c.reason == "ImagePullBackOff"
            && c.message == "image x not found"));
        let od = vec![Condition {
            type_: "Available".into(),
            status: "True".into(),
            reason: "Available".into(),
            message: "ok".into(),
            observed_generation: Some(2),
            last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now),
        }];
        let (c, phase) =
            package_conditions(&c, 1, false, &UnpackOutcome::Unpacked, Some((&od, 2)), now);
        assert_eq!(phase, "Available");
        assert!(c
            .iter()
            .any(|c| c.type_ == "Unpacked" && c.status == "True" && c.reason == "UnpackSuccess"));
        let (c, phase) = package_conditions(
            &c,
            1,
            false,
            &UnpackOutcome::Invalid("manifest.yaml: bad".into()),
            None,
            now,
        );
        assert_eq!(phase, "Invalid");
        assert!(c
            .iter()
            .any(|c| c.type_ == "Invalid" && c.reason == "LoadError"));
        assert!(
            !c.iter().any(|c| c.type_ == "Available"),
            "no deployment, no Available"
        );
        // A spec that cannot be rolled out is progressing, whatever the previous deployment says.
        let mut settled = od.clone();
        settled.push(Condition {
            type_: "Progressing".into(),
            status: "False".into(),
            reason: "Idle".into(),
            message: "Update concluded.".into(),
            ..od[0].clone()
        });
        let bad = &UnpackOutcome::Invalid("manifest.yaml: bad".into());
        let (c, _) = package_conditions(&c, 3, false, bad, Some((&settled, 2)), now);
        let progressing = c.iter().find(|c| c.type_ == "Progressing").unwrap();
        assert_eq!(
            (progressing.status.as_str(), progressing.reason.as_str()),
            ("True", "LoadError")
        );
        assert_eq!(
            progressing.message,
            "The current spec cannot be rolled out: manifest.yaml: bad"
        );
    }

    #[test]
    fn deployment_conditions_keep_their_transition_time_while_their_status_holds() {
        let at = |s: i64| Timestamp::from_second(s).unwrap();
        let od = |status: &str| {
            vec![Condition {
                type_: "Available".into(),
                status: status.into(),
                reason: "Available".into(),
                message: "ok".into(),
                observed_generation: Some(2),
                last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(at(0)),
            }]
        };
        let available = |c: &[Condition]| {
            c.iter()
                .find(|c| c.type_ == "Available")
                .map(|c| (c.status.clone(), c.last_transition_time.0))
        };
        let unpacked = &UnpackOutcome::Unpacked;
        let (first, _) = package_conditions(&[], 1, false, unpacked, Some((&od("True"), 2)), at(5));
        let (again, _) =
            package_conditions(&first, 1, false, unpacked, Some((&od("True"), 2)), at(9));
        assert_eq!(again, first, "nothing changed, nothing to write");
        let (flipped, _) =
            package_conditions(&again, 1, false, unpacked, Some((&od("False"), 2)), at(12));
        assert_eq!(available(&flipped), Some(("False".into(), at(12))));
    }
}
