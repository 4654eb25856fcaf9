//! A real Prometheus (Debian's package) scraping targets every second, with its HTTP query API: for
//! tests that check metrics as an SRE's Prometheus sees them, and for the local environment. Started on
//! a free loopback port with its own TSDB directory; it dies with the process that started it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::binaries::on_path;
use crate::error::{io_error, TestEnvError};
use crate::net::{free_port, http_get};
use crate::process::{start_with_retries, ManagedProcess};

const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// A running Prometheus.
#[derive(Debug)]
pub struct Prometheus {
    process: ManagedProcess,
    port: u16,
}

/// One series of an instant query's result: its labels and value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub labels: serde_json::Map<String, Value>,
    pub value: f64,
}

/// One series of a range query: its labels and `(unix seconds, value)` points.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub labels: serde_json::Map<String, Value>,
    pub points: Vec<(f64, f64)>,
}

impl Prometheus {
    /// Starts Prometheus in `dir`, scraping `targets` (`host:port`, path `/metrics`) as job `job` every
    /// `interval`, and waits until it is ready. `rule_files` are loaded as alerting/recording rules.
    pub async fn start(
        dir: &Path,
        job: &str,
        targets: &[String],
        rule_files: &[PathBuf],
        interval: Duration,
    ) -> Result<Self, TestEnvError> {
        std::fs::create_dir_all(dir).map_err(io_error("create", dir))?;
        let binary = on_path("prometheus")?;
        let config = dir.join("prometheus.yml");
        let targets: Vec<String> = targets.iter().map(|t| format!("'{t}'")).collect();
        let rules: Vec<String> = rule_files
            .iter()
            .map(|r| format!("  - '{}'\n", r.display()))
            .collect();
        let interval = format!("{}ms", interval.as_millis().max(10));
        let text = format!(
            "global:\n  scrape_interval: {interval}\n  scrape_timeout: {interval}\n  \
             evaluation_interval: 1s\nrule_files:\n{}\
             scrape_configs:\n- job_name: '{job}'\n  static_configs:\n  - targets: [{}]\n",
            if rules.is_empty() { "  []\n".to_owned() } else { rules.concat() },
            targets.join(", ")
        );
        std::fs::write(&config, text).map_err(io_error("write", &config))?;
        start_with_retries(|attempt| {
            let (binary, config) = (binary.clone(), config.clone());
            async move {
                let port = free_port().map_err(io_error("allocate port", dir))?;
                let mut command = Command::new(&binary);
                command
                    .arg(format!("--config.file={}", config.display()))
                    .arg(format!(
                        "--storage.tsdb.path={}",
                        dir.join(format!("data-{attempt}")).display()
                    ))
                    .arg(format!("--web.listen-address=127.0.0.1:{port}"))
                    .arg("--log.level=warn");
                let process =
                    ManagedProcess::spawn("prometheus", command, &dir.join("prometheus.log"))?;
                process
                    .wait_ready(READY_TIMEOUT, || async move {
                        match http_get(port, "/-/ready").await? {
                            (200, _) => Ok(()),
                            (code, body) => Err(format!("/-/ready answered {code}: {body}")),
                        }
                    })
                    .await?;
                Ok(Prometheus { process, port })
            }
        })
        .await
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Runs the instant query `expr` through the HTTP API. An expression Prometheus cannot parse or
    /// evaluate is an error carrying its message.
    pub async fn query(&self, expr: &str) -> Result<Vec<Sample>, String> {
        let data = self
            .api(expr, &format!("/api/v1/query?query={}", percent_encode(expr)))
            .await?;
        let result = &data["result"];
        let samples = match data["resultType"].as_str() {
            Some("vector") => result
                .as_array()
                .map(|series| {
                    series
                        .iter()
                        .map(|s| Sample {
                            labels: s["metric"].as_object().cloned().unwrap_or_default(),
                            value: parse_value(&s["value"][1]),
                        })
                        .collect()
                })
                .unwrap_or_default(),
            Some("scalar") => vec![Sample {
                labels: serde_json::Map::new(),
                value: parse_value(&result[1]),
            }],
            other => return Err(format!("{expr}: unexpected result type {other:?}")),
        };
        Ok(samples)
    }

    /// Runs `expr` as a graph panel does: a range query over the last `window`, in 300 steps (at least
    /// 100 ms each).
    /// Returns every series with at least one point; an expression Prometheus refuses is an error
    /// carrying its message.
    pub async fn query_range(&self, expr: &str, window: Duration) -> Result<Vec<Series>, String> {
        let end = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_err(|e| e.to_string())?
            .as_secs_f64();
        let start = end - window.as_secs_f64();
        let step = (window.as_secs_f64() / 300.0).max(0.1);
        let path = format!(
            "/api/v1/query_range?query={}&start={start:.3}&end={end:.3}&step={step:.3}",
            percent_encode(expr)
        );
        let data = self.api(expr, &path).await?;
        Ok(data["result"]
            .as_array()
            .map(|series| {
                series
                    .iter()
                    .map(|s| Series {
                        labels: s["metric"].as_object().cloned().unwrap_or_default(),
                        points: s["values"]
                            .as_array()
                            .map(|values| {
                                values
                                    .iter()
                                    .map(|p| (p[0].as_f64().unwrap_or_default(), parse_value(&p[1])))
                                    .collect()
                            })
                            .unwrap_or_default(),
                    })
                    .filter(|s| !s.points.is_empty())
                    .collect()
            })
            .unwrap_or_default())
    }

    /// The `data` of the HTTP API's answer to `path` (a query of `expr`), or the error it names.
    async fn api(&self, expr: &str, path: &str) -> Result<Value, String> {
        let (code, body) = http_get(self.port, path).await?;
        let mut answer: Value =
            serde_json::from_str(&body).map_err(|e| format!("{expr}: {code} {e}: {body}"))?;
        if answer["status"] != "success" {
            return Err(format!("{expr}: {}", answer["error"]));
        }
        Ok(answer["data"].take())
    }

    /// The tail of Prometheus' log.
    pub fn log_tail(&self) -> String {
        self.process.log_tail()
    }
}

fn parse_value(value: &Value) -> f64 {
    value
        .as_str()
        .and_then(|v| v.parse().ok())
        .unwrap_or(f64::NAN)
}

/// Percent-encodes a query parameter (everything but unreserved characters).
fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
