//! The credentials a sink sends: read from a Secret in the manager's namespace that says it is meant for
//! sinks (label `rollout.package-operator.run/sink-credentials: "true"`), so naming a Secret in a
//! HostedClusterPackage cannot send any other Secret of that namespace to an address of one's choosing.

use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use pko_proto::well_known::SINK_CREDENTIALS_LABEL;

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

/// Reads Secret `name` through `secrets` (the manager's namespace).
pub async fn read_credentials(
    secrets: &Api<Secret>,
    name: &str,
) -> Result<SinkCredentials, String> {
    let secret = secrets
        .get(name)
        .await
        .map_err(|e| format!("reading Secret {name}: {e}"))?;
    credentials_of(&secret, name)
}

/// The credentials `secret` holds, if it is meant for sinks.
fn credentials_of(secret: &Secret, name: &str) -> Result<SinkCredentials, String> {
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

    fn secret(labelled: bool, data: serde_json::Value) -> Secret {
        let labels = if labelled {
            json!({SINK_CREDENTIALS_LABEL: "true"})
        } else {
            json!({})
        };
        serde_json::from_value(json!({"metadata": {"name": "s", "labels": labels}, "data": data}))
            .unwrap()
    }

    #[test]
    fn only_a_secret_meant_for_sinks_is_used() {
        let token = json!({"token": "dG9rZW4K"});
        assert_eq!(
            credentials_of(&secret(true, token.clone()), "s").unwrap(),
            SinkCredentials::Bearer("token".into())
        );
        assert_eq!(
            credentials_of(&secret(false, token), "s").unwrap_err(),
            "Secret s is not labelled rollout.package-operator.run/sink-credentials=true: not sent to a sink"
        );
        assert_eq!(
            credentials_of(
                &secret(true, json!({"username": "dQ==", "password": "cA=="})),
                "s"
            )
            .unwrap(),
            SinkCredentials::Basic {
                username: "u".into(),
                password: "p".into()
            }
        );
        assert!(credentials_of(&secret(true, json!({"username": "dQ=="})), "s").is_err());
        assert_eq!(
            format!("{:?}", SinkCredentials::Bearer("x".into())),
            "Bearer(..)"
        );
    }
}
