//! The two exposition formats of `/metrics`: OpenMetrics, which the registry encodes and Prometheus asks
//! for, and the Prometheus text format 0.0.4 for every other reader (`curl | promtool check metrics`,
//! older scrapers). The two differ in how a counter family is named: OpenMetrics names the family
//! `x` and its sample `x_total`, the text format names both `x_total`, and a reader of one format sees
//! the other's counters without HELP or TYPE. This module only rewrites text; it decides nothing.

/// The media type of the OpenMetrics exposition.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// The media type of the Prometheus text exposition.
pub const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Whether a request's `Accept` header asks for OpenMetrics (Prometheus' scrapes do).
pub fn wants_openmetrics(accept: Option<&str>) -> bool {
    accept.is_some_and(|a| a.contains("application/openmetrics-text"))
}

/// `openmetrics` (as the registry encodes it) in the Prometheus text format: counter families named
/// after their `_total` sample, `info` and `stateset` families as gauges, `unknown` as untyped; `# UNIT`,
/// exemplars and `# EOF` dropped.
pub fn prometheus_text(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len());
    // HELP comes before TYPE: read each family's type first.
    let mut types = std::collections::HashMap::new();
    for line in openmetrics.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            if let Some((name, kind)) = rest.split_once(' ') {
                types.insert(name, kind);
            }
        }
    }
    let renamed = |name: &str| -> String {
        match types.get(name).copied() {
            Some("counter") => format!("{name}_total"),
            Some("info") => format!("{name}_info"),
            _ => name.to_owned(),
        }
    };
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            out.push_str(&format!("# HELP {} {help}\n", renamed(name)));
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, "unknown"));
            let kind = match kind {
                "info" | "stateset" => "gauge",
                "unknown" | "gaugehistogram" => "untyped",
                other => other,
            };
            out.push_str(&format!("# TYPE {} {kind}\n", renamed(name)));
        } else {
            // A sample; an exemplar follows ` # ` and has no place in the text format.
            let sample = line.split_once(" # ").map_or(line, |(sample, _)| sample);
            out.push_str(sample);
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_named_after_their_samples_and_the_rest_stays() {
        let openmetrics = "\
# HELP pko_reconcile Reconciles finished.
# TYPE pko_reconcile counter
pko_reconcile_total{controller=\"package\"} 3 # {trace_id=\"a\"} 1.0
# HELP package_operator_managed_cache_objects_total Number of objects.
# TYPE package_operator_managed_cache_objects_total gauge
package_operator_managed_cache_objects_total{gvk=\"v1, Kind=ConfigMap\"} 2
# HELP pko_build Build.
# TYPE pko_build info
pko_build_info{version=\"1\"} 1
# HELP pko_wait_seconds Waits.
# TYPE pko_wait_seconds histogram
# UNIT pko_wait_seconds seconds
pko_wait_seconds_bucket{le=\"+Inf\"} 1
pko_wait_seconds_sum 0.5
pko_wait_seconds_count 1
# EOF
";
        assert_eq!(
            prometheus_text(openmetrics),
            "\
# HELP pko_reconcile_total Reconciles finished.
# TYPE pko_reconcile_total counter
pko_reconcile_total{controller=\"package\"} 3
# HELP package_operator_managed_cache_objects_total Number of objects.
# TYPE package_operator_managed_cache_objects_total gauge
package_operator_managed_cache_objects_total{gvk=\"v1, Kind=ConfigMap\"} 2
# HELP pko_build_info Build.
# TYPE pko_build_info gauge
pko_build_info{version=\"1\"} 1
# HELP pko_wait_seconds Waits.
# TYPE pko_wait_seconds histogram
pko_wait_seconds_bucket{le=\"+Inf\"} 1
pko_wait_seconds_sum 0.5
pko_wait_seconds_count 1
"
        );
    }

    #[test]
    fn prometheus_gets_openmetrics_and_everyone_else_the_text_format() {
        assert!(wants_openmetrics(Some(
            "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"
        )));
        assert!(!wants_openmetrics(Some("*/*")));
        assert!(!wants_openmetrics(None));
    }
}
