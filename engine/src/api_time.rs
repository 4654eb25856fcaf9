//! Times as the Kubernetes API keeps them: whole seconds (a finer time would differ from the API's own
//! echo of it), written as RFC 3339, and the span between two of them. Pure.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

/// `at` cut to whole seconds.
pub fn whole_seconds(at: Timestamp) -> Timestamp {
    Timestamp::from_second(at.as_second()).unwrap_or(at)
}

/// `at` in whole seconds, RFC 3339, as status fields keep times.
pub fn stamp(at: Timestamp) -> String {
    whole_seconds(at).to_string()
}

/// How long from `from` to `to`; zero when `to` is earlier.
pub fn elapsed(from: Timestamp, to: Timestamp) -> Duration {
    to.duration_since(from).try_into().unwrap_or(Duration::ZERO)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn times_are_whole_seconds_and_spans_never_negative() {
        let at: Timestamp = "2026-03-01T00:00:00.750Z".parse().unwrap();
        assert_eq!(stamp(at), "2026-03-01T00:00:00Z");
        let later: Timestamp = "2026-03-01T00:01:30Z".parse().unwrap();
        assert_eq!(elapsed(whole_seconds(at), later), Duration::from_secs(90));
        assert_eq!(elapsed(later, at), Duration::ZERO);
    }
}
