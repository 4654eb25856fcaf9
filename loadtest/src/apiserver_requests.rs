//! What an apiserver served, from its own metrics: the requests per verb and resource
//! (`apiserver_request_total`), for the benchmarks that count requests and writes.

use std::collections::BTreeMap;

use pko_testenv::ApiServer;

/// An apiserver's own metrics (its `/metrics`, as its admin).
pub async fn apiserver_metrics(server: &ApiServer) -> Result<String, String> {
    let client = server.client().await.map_err(|e| e.to_string())?;
    let request = http::Request::get("/metrics")
        .body(Vec::new())
        .map_err(|e| e.to_string())?;
    client
        .request_text(request)
        .await
        .map_err(|e| format!("{} /metrics: {e}", server.name()))
}

/// Requests served by every apiserver so far, per verb and resource (`apiserver_request_total`).
pub async fn request_counts(servers: &[&ApiServer]) -> Result<BTreeMap<String, f64>, String> {
    let mut counts = BTreeMap::new();
    for server in servers {
        let text = apiserver_metrics(server).await?;
        for (key, value) in text.lines().filter_map(request_sample) {
            *counts.entry(key).or_insert(0.0) += value;
        }
    }
    Ok(counts)
}

/// The requests whose count grew between two counts of [`request_counts`], and by how much.
pub fn delta(before: &BTreeMap<String, f64>, after: &BTreeMap<String, f64>) -> Vec<(String, f64)> {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, v)| *v > 0.0)
        .collect()
}

/// `verb resource[/subresource]` and the count of one `apiserver_request_total` sample.
fn request_sample(line: &str) -> Option<(String, f64)> {
    let rest = line.strip_prefix("apiserver_request_total{")?;
    let (labels, value) = rest.rsplit_once("} ")?;
    let label = |name: &str| {
        labels
            .split("\",")
            .find_map(|pair| pair.strip_prefix(&format!("{name}=\"")))
            .map(|v| v.trim_end_matches('"'))
            .unwrap_or_default()
    };
    let resource = match label("subresource") {
        "" => label("resource").to_owned(),
        sub => format!("{}/{sub}", label("resource")),
    };
    Some((
        format!("{} {resource}", label("verb")),
        value.trim().parse().ok()?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_samples_are_keyed_by_verb_and_resource() {
        let line = r#"apiserver_request_total{code="200",component="apiserver",dry_run="",group="package-operator.run",resource="objectsets",scope="resource",subresource="status",verb="PATCH",version="v1alpha1"} 17"#;
        assert_eq!(
            request_sample(line),
            Some(("PATCH objectsets/status".to_owned(), 17.0))
        );
        let line = r#"apiserver_request_total{code="200",resource="widgets",subresource="",verb="LIST"} 3"#;
        assert_eq!(request_sample(line), Some(("LIST widgets".to_owned(), 3.0)));
        assert_eq!(
            request_sample("apiserver_request_duration_seconds_count 4"),
            None
        );
    }
}
