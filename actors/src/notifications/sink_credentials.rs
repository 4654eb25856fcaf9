//! The credentials a sink sends: read from a Secret in the manager's namespace that says it is meant for
//! sinks (label `rollout.package-operator.run/sink-credentials: "true"`) and names the URL origins it may
//! be sent to (annotation `rollout.package-operator.run/sink-origins`). So naming a Secret in a
//! HostedClusterPackage can neither send any other Secret of that namespace, nor another team's sink
//! credentials, to an address of one's choosing. (Credentials go only over https: the sink's own check.)

use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use pko_proto::well_known::{SINK_CREDENTIALS_LABEL, SINK_ORIGINS_ANNOTATION};

/// What a delivery authenticates with.
#[derive(Clone, PartialEq, Eq)]
pub enum SinkCredentials {
    None,
    Bearer(String),
    Basic { username: String, password: String },
}

impl std::fmt::Debug for SinkCredentials {
    /// Never the secret values.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::None => write!(f, "None"),
            Self::Bearer(_) => write!(f, "Bearer(..)"),
            Self::Basic { username, .. } => write!(f, "Basic({username}, ..)"),
        }
    }
}

impl SinkCredentials {
    /// `request` with these credentials.
    pub fn apply(&self, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match self {
            Self::None => request,
            Self::Bearer(token) => request.bearer_auth(token),
            Self::Basic { username, password } => request.basic_auth(username, Some(password)),
        }
    }
}

/// Reads Secret `name` through `secrets` (the manager's namespace) for a sink at `url`.
pub async fn read_credentials(
    secrets: &Api<Secret>,
    name: &str,
    url: &str,
) -> Result<SinkCredentials, String> {
    let secret = secrets
        .get(name)
        .await
        .map_err(|e| format!("reading Secret {name}: {e}"))?;
    credentials_of(&secret, name, url)
}

/// Whether `secret` lets its credentials go to `url`'s origin.
fn origin_allowed(secret: &Secret, name: &str, url: &str) -> Result<(), String> {
    let origin = |text: &str| {
        url::Url::parse(text.trim())
            .ok()
            .map(|u| u.origin())
            .filter(url::Origin::is_tuple)
            .map(|o| o.ascii_serialization())
    };
    let wanted = origin(url).ok_or_else(|| format!("{url:?} has no origin"))?;
    let listed = secret
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(SINK_ORIGINS_ANNOTATION));
    let Some(listed) = listed else {
        return Err(format!(
            "Secret {name} names no origin its credentials may be sent to (annotation \
             {SINK_ORIGINS_ANNOTATION}): not sent to {wanted}"
        ));
    };
    if listed.split(',').filter_map(origin).any(|o| o == wanted) {
        Ok(())
    } else {
        Err(format!(
            "Secret {name} may be sent to {listed:?} ({SINK_ORIGINS_ANNOTATION}), not to {wanted}"
        ))
    }
}

/// The credentials `secret` holds, if it is meant for sinks and for `url`'s origin.
fn credentials_of(secret: &Secret, name: &str, url: &str) -> Result<SinkCredentials, String> {
    let meant = secret
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(SINK_CREDENTIALS_LABEL))
        .is_some_and(|v| v == "true");
    if !meant {
        return Err(format!(
            "Secret {name} is not labelled {SINK_CREDENTIALS_LABEL}=true: not sent to a sink"
        ));
    }
    origin_allowed(secret, name, url)?;
    let value = |key: &str| {
        secret
            .data
            .as_ref()
            .and_then(|d| d.get(key))
            .map(|v| String::from_utf8_lossy(&v.0).trim_end().to_owned())
            .filter(|v| !v.is_empty())
    };
    match (value("token"), value("username"), value("password")) {
        (Some(token), _, _) => Ok(SinkCredentials::Bearer(token)),
        (None, Some(username), Some(password)) => Ok(SinkCredentials::Basic { username, password }),
        _ => Err(format!(
            "Secret {name} has neither key token nor keys username and password"
        )),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    const HOOK: &str = "https://hooks.example.com/pko";

    fn secret(labelled: bool, data: serde_json::Value) -> Secret {
        let labels = if labelled {
            json!({SINK_CREDENTIALS_LABEL: "true"})
        } else {
            json!({})
        };
        serde_json::from_value(json!({"metadata": {"name": "s", "labels": labels,
            "annotations": {SINK_ORIGINS_ANNOTATION: "https://alerts.example.org:8443, https://hooks.example.com"}},
            "data": data}))
        .unwrap()
    }

    #[test]
    fn only_a_secret_meant_for_sinks_is_used() {
        let token = json!({"token": "dG9rZW4K"});
        assert_eq!(
            credentials_of(&secret(true, token.clone()), "s", HOOK).unwrap(),
            SinkCredentials::Bearer("token".into())
        );
        assert_eq!(
            credentials_of(&secret(false, token), "s", HOOK).unwrap_err(),
            "Secret s is not labelled rollout.package-operator.run/sink-credentials=true: not sent to a sink"
        );
        assert_eq!(
            credentials_of(
                &secret(true, json!({"username": "dQ==", "password": "cA=="})),
                "s",
                "https://alerts.example.org:8443/x"
            )
            .unwrap(),
            SinkCredentials::Basic {
                username: "u".into(),
                password: "p".into()
            }
        );
        assert!(credentials_of(&secret(true, json!({"username": "dQ=="})), "s", HOOK).is_err());
        assert_eq!(
            format!("{:?}", SinkCredentials::Bearer("x".into())),
            "Bearer(..)"
        );
    }

    #[test]
    fn credentials_go_only_to_the_origins_their_secret_names() {
        let token = secret(true, json!({"token": "dG9rZW4K"}));
        for elsewhere in [
            "https://attacker.example/collect",
            // Another port, another scheme, a look-alike host: other origins.
            "https://hooks.example.com:8443/pko",
            "http://hooks.example.com/pko",
            "https://hooks.example.com.attacker.example/pko",
            "https://alerts.example.org/x",
        ] {
            let refused = credentials_of(&token, "s", elsewhere).unwrap_err();
            assert!(refused.contains("may be sent to"), "{elsewhere}: {refused}");
        }
        // The default port is the same origin written or not.
        assert!(credentials_of(&token, "s", "https://hooks.example.com:443/other").is_ok());
        let mut unbound = token.clone();
        unbound.metadata.annotations = None;
        assert!(credentials_of(&unbound, "s", HOOK)
            .unwrap_err()
            .contains("names no origin"));
    }
}
