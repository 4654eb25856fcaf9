//! A rollout health check's verdict from a Prometheus instant query's answer: every sample within the
//! check's bounds passes, one outside fails, no samples (or an answer that is not one) is unknown and
//! proves nothing either way. Fetching the answer is the supervisor's.
//!
//! Pure: no I/O, no clock.

use serde_json::Value;

use crate::rollout::rollout_policy::HealthCheck;

/// Names the check in status and events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HealthState {
    Passing,
    Failing,
    /// No samples, an error answer, or Prometheus not reached.
    Unknown,
}

impl HealthState {
    pub fn label(self) -> &'static str {
        match self {
            HealthState::Passing => "Passing",
            HealthState::Failing => "Failing",
            HealthState::Unknown => "Unknown",
        }
    }

    pub fn from_label(label: &str) -> Self {
        match label {
            "Passing" => HealthState::Passing,
            "Failing" => HealthState::Failing,
            _ => HealthState::Unknown,
        }
    }
}

/// The most samples a message names.
const NAMED_SAMPLES: usize = 3;

/// A sample: its series' labels as PromQL writes them, and its value.
fn samples(body: &Value) -> Result<Vec<(String, f64)>, String> {
    if body["status"] != "success" {
        let error = body["error"].as_str().unwrap_or("no status \"success\"");
        return Err(format!("Prometheus answered: {error}"));
    }
    let value_of = |pair: &Value| -> Result<f64, String> {
        pair.get(1)
            .and_then(Value::as_str)
            .and_then(|v| v.parse::<f64>().ok())
            .ok_or_else(|| format!("not a sample value: {pair}"))
    };
    let data = &body["data"];
    match data["resultType"].as_str() {
        Some("vector") => data["result"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .map(|s| {
                let labels: Vec<String> = s["metric"]
                    .as_object()
                    .map(|m| {
                        m.iter()
                            .map(|(k, v)| format!("{k}={:?}", v.as_str().unwrap_or_default()))
                            .collect()
                    })
                    .unwrap_or_default();
                Ok((format!("{{{}}}", labels.join(",")), value_of(&s["value"])?))
            })
            .collect(),
        Some("scalar") => Ok(vec![(String::new(), value_of(&data["result"])?)]),
        other => Err(format!(
            "want an instant vector or a scalar, got {}",
            other.unwrap_or("no result type")
        )),
    }
}

/// The verdict of `check` on Prometheus's JSON answer `body`, and what it saw.
pub fn health_verdict(check: &HealthCheck, body: &[u8]) -> (HealthState, String) {
    let parsed = serde_json::from_slice::<Value>(body)
        .map_err(|e| format!("not a Prometheus answer: {e}"))
        .and_then(|v| samples(&v));
    let samples = match parsed {
        Ok(s) => s,
        Err(why) => return (HealthState::Unknown, why),
    };
    if samples.is_empty() {
        return (
            HealthState::Unknown,
            "no samples: the query selects no series".to_owned(),
        );
    }
    let outside: Vec<String> = samples
        .iter()
        .filter_map(|(series, v)| {
            let why = match (check.max, check.min) {
                (Some(max), _) if *v > max || v.is_nan() => format!("above max {max}"),
                (_, Some(min)) if *v < min || v.is_nan() => format!("below min {min}"),
                _ => return None,
            };
            Some(format!("{series} {v} {why}").trim_start().to_owned())
        })
        .collect();
    if outside.is_empty() {
        let shown: Vec<String> = samples
            .iter()
            .take(NAMED_SAMPLES)
            .map(|(series, v)| format!("{series} {v}").trim_start().to_owned())
            .collect();
        (HealthState::Passing, shown.join("; "))
    } else {
        let mut named: Vec<String> = outside.iter().take(NAMED_SAMPLES).cloned().collect();
        if outside.len() > NAMED_SAMPLES {
            named.push(format!("and {} more", outside.len() - NAMED_SAMPLES));
        }
        (HealthState::Failing, named.join("; "))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn check(max: Option<f64>, min: Option<f64>) -> HealthCheck {
        HealthCheck {
            name: "errors".into(),
            query: "q".into(),
            max,
            min,
        }
    }

    fn vector(values: &[&str]) -> Vec<u8> {
        let result: Vec<Value> = values
            .iter()
            .enumerate()
            .map(
                |(i, v)| serde_json::json!({"metric": {"pod": format!("p{i}")}, "value": [1.0, v]}),
            )
            .collect();
        serde_json::to_vec(&serde_json::json!({"status": "success",
            "data": {"resultType": "vector", "result": result}}))
        .unwrap()
    }

    #[test]
    fn samples_within_bounds_pass_and_one_outside_fails() {
        let c = check(Some(0.05), None);
        assert_eq!(
            health_verdict(&c, &vector(&["0.01", "0.02"])).0,
            HealthState::Passing
        );
        let (state, message) = health_verdict(&c, &vector(&["0.01", "0.2"]));
        assert_eq!(state, HealthState::Failing);
        assert_eq!(message, "{pod=\"p1\"} 0.2 above max 0.05");
        let (state, message) = health_verdict(&check(None, Some(1.0)), &vector(&["0"]));
        assert_eq!(
            (state, message.as_str()),
            (HealthState::Failing, "{pod=\"p0\"} 0 below min 1")
        );
        assert_eq!(
            health_verdict(&c, &vector(&["NaN"])).0,
            HealthState::Failing,
            "NaN is not healthy"
        );
    }

    #[test]
    fn no_samples_errors_and_garbage_prove_nothing() {
        let c = check(Some(1.0), None);
        assert_eq!(health_verdict(&c, &vector(&[])).0, HealthState::Unknown);
        let error = br#"{"status":"error","errorType":"bad_data","error":"parse error"}"#;
        assert_eq!(
            health_verdict(&c, error),
            (
                HealthState::Unknown,
                "Prometheus answered: parse error".to_owned()
            )
        );
        assert_eq!(health_verdict(&c, b"<html>").0, HealthState::Unknown);
        let scalar = br#"{"status":"success","data":{"resultType":"scalar","result":[1,"0.5"]}}"#;
        assert_eq!(health_verdict(&c, scalar).0, HealthState::Passing);
        let matrix = br#"{"status":"success","data":{"resultType":"matrix","result":[]}}"#;
        assert_eq!(health_verdict(&c, matrix).0, HealthState::Unknown);
    }
}
