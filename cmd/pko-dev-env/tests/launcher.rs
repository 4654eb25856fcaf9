//! The README's "run it" command works as a newcomer would use it: the launcher becomes ready, kubectl
//! reaches the management cluster through the env file, the simulated HostedClusters are there, the
//! manager rolls the sample ObjectDeployment out, and SIGTERM (while the later samples may still be
//! rolling out) stops everything and cleans up.

#![allow(clippy::unwrap_used)] // tests fail loudly on the first unexpected error

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use pko_testenv::{http_get, wait_until};

fn kubectl(kubeconfig: &str, args: &[&str]) -> String {
    let output = Command::new(pko_testenv::kubectl())
        .arg(format!("--kubeconfig={kubeconfig}"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

#[tokio::test]
async fn launcher_runs_until_terminated() {
    let state_dir = std::env::temp_dir().join(format!("pko-dev-env-test-{}", std::process::id()));
    let launcher = tokio::process::Command::new(env!("CARGO_BIN_EXE_pko-dev-env"))
        .args(["--hosted-clusters", "1", "--state-dir"])
        .arg(&state_dir)
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let env_file = state_dir.join("env.sh");
    wait_until("env.sh written", Duration::from_secs(120), || {
        let env_file = env_file.clone();
        async move { std::fs::read_to_string(&env_file).map_err(|error| error.to_string()) }
    })
    .await
    .unwrap();
    let env = std::fs::read_to_string(&env_file).unwrap();
    let value = |key: &str| {
        env.lines()
            .find_map(|line| line.strip_prefix(&format!("export {key}=")))
            .unwrap_or_else(|| panic!("{key} missing from env.sh:\n{env}"))
            .to_owned()
    };
    let kubeconfig = value("KUBECONFIG");
    assert!(value("PKO_NATS_URL").starts_with("nats://127.0.0.1:"));
    assert!(value("PKO_REGISTRY").starts_with("127.0.0.1:"));
    // Prometheus scrapes the manager: the manager's own metrics can be queried.
    let prometheus = value("PKO_PROMETHEUS_URL");
    let port: u16 = prometheus.rsplit(':').next().unwrap().parse().unwrap();
    wait_until(
        "Prometheus has the manager's metrics",
        Duration::from_secs(60),
        || async move {
            let (_, answer) = http_get(port, "/api/v1/query?query=pko_reconcile_active").await?;
            if answer.contains("\"controller\"") {
                Ok(())
            } else {
                Err(answer)
            }
        },
    )
    .await
    .unwrap();
    let hosted_kubeconfig = value("PKO_HOSTED_KUBECONFIGS");

    let crds = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy/crds");
    kubectl(&kubeconfig, &["apply", "-k", &crds.display().to_string()]);
    let clusters = kubectl(
        &kubeconfig,
        &["get", "hostedclusters", "-A", "--no-headers"],
    );
    assert!(clusters.contains("hosted-0"), "{clusters}");
    kubectl(&kubeconfig, &["get", "hcpkg"]);
    kubectl(&hosted_kubeconfig, &["get", "namespaces"]);
    // The manager runs and rolls the sample out.
    kubectl(
        &kubeconfig,
        &[
            "wait",
            "--for=condition=Available",
            "objectdeployment/sample",
            "-n",
            "pko-sample",
            "--timeout=120s",
        ],
    );
    let sets = kubectl(
        &kubeconfig,
        &["get", "objectsets", "-n", "pko-sample", "--no-headers"],
    );
    assert!(sets.contains("Available"), "{sets}");

    let pid = launcher.id().unwrap().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let output = tokio::time::timeout(Duration::from_secs(60), launcher.wait_with_output())
        .await
        .expect("launcher stops within a minute of SIGTERM")
        .unwrap();
    assert!(output.status.success(), "exit status {}", output.status);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("Ready in"), "{stdout}");
    assert!(stdout.contains("Sample rollout"), "{stdout}");
    assert!(stdout.contains("Stopped."), "{stdout}");
    assert!(
        !PathBuf::from(&kubeconfig).exists(),
        "environment files left behind"
    );
    assert!(!env_file.exists(), "env.sh left behind");
    let _ = std::fs::remove_dir_all(&state_dir);
}
