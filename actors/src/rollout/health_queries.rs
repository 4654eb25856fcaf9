//! Rollout health checks against the Prometheus the manager is pointed at (`--prometheus-url`): one
//! instant query per evaluation, bounded in time, its answer judged by `engine::rollout::health_check`. It owns
//! the HTTP client; it must not decide anything about the rollout.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use crate::engine::rollout::health_check::{health_verdict, HealthState};
use crate::engine::rollout::rollout_guard::HealthObservation;
use crate::engine::rollout::rollout_policy::HealthCheck;

/// How long one query may take; a slower Prometheus proves nothing for this evaluation.
const QUERY_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest answer read; a query selecting more than this is not a health check.
const MAX_ANSWER_BYTES: usize = 1 << 20;

/// Instant queries against one Prometheus; cheap to clone.
#[derive(Clone, Debug)]
pub struct PrometheusQueries {
    endpoint: url::Url,
    http: reqwest::Client,
}

#[derive(Debug, thiserror::Error)]
pub enum PrometheusQueriesError {
    #[error("--prometheus-url {0:?}: {1}")]
    Url(String, url::ParseError),
    #[error("building the HTTP client: {0}")]
    Client(#[from] reqwest::Error),
}

impl PrometheusQueries {
    /// Queries against the Prometheus at `base` (`http://prometheus:9090`).
    pub fn new(base: &str) -> Result<Self, PrometheusQueriesError> {
        let endpoint = url::Url::parse(base)
            .and_then(|u| u.join("api/v1/query"))
            .map_err(|e| PrometheusQueriesError::Url(base.to_owned(), e))?;
        let http = reqwest::Client::builder().timeout(QUERY_TIMEOUT).build()?;
        Ok(Self { endpoint, http })
    }

    /// Evaluates `check` now.
    pub async fn evaluate(&self, check: &HealthCheck) -> HealthObservation {
        let mut url = self.endpoint.clone();
        url.query_pairs_mut().append_pair("query", &check.query);
        let (state, message) = match self.fetch(url).await {
            Ok(body) => health_verdict(check, &body),
            Err(why) => (HealthState::Unknown, why),
        };
        HealthObservation {
            state,
            message,
            at: Timestamp::now(),
        }
    }

    async fn fetch(&self, url: url::Url) -> Result<Vec<u8>, String> {
        let unreachable = |e: reqwest::Error| format!("Prometheus not reached: {e}");
        let mut response = self.http.get(url).send().await.map_err(unreachable)?;
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(unreachable)? {
            if body.len() + chunk.len() > MAX_ANSWER_BYTES {
                return Err(format!(
                    "the answer is larger than {MAX_ANSWER_BYTES} bytes: select fewer series"
                ));
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    }
}

/// What a check says when no Prometheus is configured.
pub fn unconfigured() -> HealthObservation {
    HealthObservation {
        state: HealthState::Unknown,
        message: "no --prometheus-url is configured for the manager".to_owned(),
        at: Timestamp::now(),
    }
}
