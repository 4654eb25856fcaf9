//! Registers pko's admission webhook (`deploy/webhook/webhook.yaml`, the manifest SREs install) on the
//! management apiserver, its Service reference swapped for a loopback URL. Every manager the environment
//! starts serves that port (they share it with SO_REUSEPORT), so reviews keep working while managers
//! come and go; the managers fill in the caBundle themselves.

use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, Patch, PatchParams, PostParams};

use crate::apiserver::ApiServer;
use crate::error::TestEnvError;

/// Namespace of the Secret the managers keep the webhook's certificate in.
pub(crate) const CERT_NAMESPACE: &str = "pko-system";

const MANIFEST: &str = include_str!("../../deploy/webhook/webhook.yaml");

fn kube_error(what: &str) -> impl FnOnce(kube::Error) -> TestEnvError + '_ {
    move |error| TestEnvError::Kube {
        server: what.to_owned(),
        source: Box::new(error),
    }
}

/// The shipped configuration, calling `https://127.0.0.1:{port}` instead of the Service.
fn configuration(port: u16) -> Result<ValidatingWebhookConfiguration, TestEnvError> {
    let malformed = |message: String| TestEnvError::Kube {
        server: "deploy/webhook/webhook.yaml".to_owned(),
        source: Box::new(kube::Error::Service(message.into())),
    };
    let documents: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(MANIFEST).map_err(|e| malformed(e.to_string()))?;
    let document = documents
        .into_iter()
        .find(|d| d["kind"] == "ValidatingWebhookConfiguration")
        .ok_or_else(|| malformed("no ValidatingWebhookConfiguration".to_owned()))?;
    let mut configuration: ValidatingWebhookConfiguration =
        serde_json::from_value(document).map_err(|e| malformed(e.to_string()))?;
    for webhook in configuration.webhooks.iter_mut().flatten() {
        let path = webhook
            .client_config
            .service
            .take()
            .and_then(|service| service.path)
            .unwrap_or_default();
        webhook.client_config.url = Some(format!("https://127.0.0.1:{port}{path}"));
    }
    Ok(configuration)
}

/// Creates the certificate's namespace and registers the webhook at `port`.
pub(crate) async fn register(management: &ApiServer, port: u16) -> Result<(), TestEnvError> {
    let client = management.client().await?;
    let namespace = Namespace {
        metadata: ObjectMeta {
            name: Some(CERT_NAMESPACE.to_owned()),
            ..Default::default()
        },
        ..Default::default()
    };
    match Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
    {
        Err(kube::Error::Api(status)) if status.code == 409 => {}
        other => {
            other.map_err(kube_error("namespace pko-system"))?;
        }
    }
    let configuration = configuration(port)?;
    let name = configuration.metadata.name.clone().unwrap_or_default();
    Api::<ValidatingWebhookConfiguration>::all(client)
        .patch(
            &name,
            &PatchParams::apply("pko-testenv").force(),
            &Patch::Apply(&configuration),
        )
        .await
        .map_err(kube_error("ValidatingWebhookConfiguration"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_manifest_points_at_the_loopback_port() {
        let configuration = configuration(9443).unwrap();
        let webhook = &configuration.webhooks.unwrap()[0];
        assert_eq!(
            webhook.client_config.url.as_deref(),
            Some("https://127.0.0.1:9443/validate/immutable-fields")
        );
        assert!(webhook.client_config.service.is_none());
        assert_eq!(webhook.failure_policy.as_deref(), Some("Fail"));
    }
}
