//! `package`: the issue-4 figures. (1) Time from creating a Package to its Available condition, with an
//! image the manager has not pulled yet (uncached: each run pushes new content) and with one it has
//! (cached: a second Package of the same image); (2) time to load and render a package of N objects, in
//! process (manifest, template over N items, YAML split, checks).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::api::PostParams;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use oci_client::secrets::RegistryAuth;
use pko_package::files::PackageFiles;
use pko_package::image::ImageStore;
use pko_package::loader::load_installable;
use pko_proto::core::package::Package;
use serde_json::{json, Value};

use crate::object_set_bench::{manager_path, percentile, start_with_manager};

const TIMEOUT: Duration = Duration::from_secs(120);

const MANIFEST: &str = "apiVersion: manifests.package-operator.run/v1alpha1
kind: PackageManifest
metadata:
  name: bench
spec:
  scopes: [Namespaced]
  phases:
  - name: config
  - name: app
  config:
    openAPIV3Schema:
      type: object
      properties:
        items:
          type: array
          items:
            type: string
          default: [one]
";

const OBJECTS: &str = "{{- range $i, $name := .config.items }}
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: {{ $.package.metadata.name }}-{{ $name }}
  labels:
    app.kubernetes.io/name: {{ $.package.metadata.name | quote }}
  annotations:
    package-operator.run/phase: {{ if eq (printf \"%d\" $i) \"0\" }}config{{ else }}app{{ end }}
data:
  index: \"{{ $i }}\"
  payload: {{ printf \"%s-%s\" $name $.package.metadata.name | b64enc | quote }}
{{- end }}
";

pub fn package_files(nonce: usize) -> PackageFiles {
    files_with(nonce, OBJECTS.to_owned())
}

/// Like [`package_files`], with every object naming the image it came from: each release changes
/// every object (new revisions, and a preflight that dry-runs them all).
pub fn changing_package_files(nonce: usize) -> PackageFiles {
    let objects = OBJECTS.replace(
        "\ndata:\n",
        "\ndata:\n  release: {{ $.package.image | quote }}\n",
    );
    files_with(nonce, objects)
}

fn files_with(nonce: usize, objects: String) -> PackageFiles {
    [
        ("manifest.yaml", MANIFEST.to_owned()),
        ("objects.yaml.gotmpl", objects),
        // Different bytes, different digest: a cold pull for every run.
        ("nonce.txt", nonce.to_string()),
    ]
    .into_iter()
    .map(|(p, c)| (p.to_owned(), c.into_bytes()))
    .collect()
}

fn stats(label: &str, samples: &mut [Duration]) {
    samples.sort();
    println!(
        "{label}: min {:.0} ms, median {:.0} ms, max {:.0} ms ({} runs)",
        samples[0].as_secs_f64() * 1e3,
        percentile(samples, 0.5).as_secs_f64() * 1e3,
        samples[samples.len() - 1].as_secs_f64() * 1e3,
        samples.len()
    );
}

/// Creates a Package and returns the time until it reports Available=True for its generation.
async fn time_to_available(client: &Client, ns: &str, image: &str) -> Result<Duration, String> {
    let api: Api<Package> = Api::namespaced(client.clone(), ns);
    let package: Package = serde_json::from_value(json!({
        "apiVersion": "package-operator.run/v1alpha1", "kind": "Package",
        "metadata": {"name": "bench"}, "spec": {"image": image, "config": {"items": ["a", "b", "c"]}},
    }))
    .map_err(|e| e.to_string())?;
    let mut events = watcher::watcher(api.clone(), watcher::Config::default()).boxed();
    let started = Instant::now();
    api.create(&PostParams::default(), &package)
        .await
        .map_err(|e| e.to_string())?;
    let available = async {
        while let Some(event) = events.next().await {
            let (Ok(Event::Apply(p)) | Ok(Event::InitApply(p))) = event else {
                continue;
            };
            let generation = p.metadata.generation;
            let done = p.status.as_ref().is_some_and(|s| {
                s.conditions.iter().any(|c| {
                    c.type_ == "Available"
                        && c.status == "True"
                        && c.observed_generation == generation
                })
            });
            if done {
                return Ok(started.elapsed());
            }
        }
        Err("package watch ended".to_owned())
    };
    tokio::time::timeout(TIMEOUT, available)
        .await
        .map_err(|_| format!("Package {ns}/bench not Available after {TIMEOUT:?}"))?
}

/// Load-and-render time of a package with `objects` objects, best and median of `runs`.
fn render_times(objects: usize, runs: usize) -> Result<Vec<Duration>, String> {
    let files = package_files(0);
    let items: Vec<Value> = (0..objects)
        .map(|i| json!(format!("item-{i:05}")))
        .collect();
    let config = json!({ "items": items });
    let mut samples = Vec::new();
    for _ in 0..runs {
        let started = Instant::now();
        let loaded = load_installable(&files, None, Some(&config), |_, config| {
            json!({
                "package": {"metadata": {"name": "bench", "namespace": "default", "labels": {}, "annotations": {}}, "image": ""},
                "config": config,
                "environment": {"kubernetes": {"version": "v1.37.2"}},
            })
        })
        .map_err(|e| e.to_string())?;
        samples.push(started.elapsed());
        let count: usize = loaded.phases.iter().map(|p| p.objects.len()).sum();
        if count != objects {
            return Err(format!("rendered {count} objects, want {objects}"));
        }
    }
    Ok(samples)
}

pub async fn run(runs: usize, render_objects: usize, manager: Option<PathBuf>) -> ExitCode {
    match measure(runs, render_objects, manager).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pko-loadtest package: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn measure(
    runs: usize,
    render_objects: usize,
    manager: Option<PathBuf>,
) -> Result<(), String> {
    let mut render = render_times(render_objects, runs.max(3))?;
    stats(
        &format!("load + render of {render_objects} objects"),
        &mut render,
    );

    let (env, client, pko) = start_with_manager(&manager_path(manager)?, 0).await?;
    let mgmt = env.management();
    pko.wait_ready(TIMEOUT).await.map_err(|e| e.to_string())?;
    let host = env.registry().host();
    let store = ImageStore::new(vec![host.clone()]);

    let (mut uncached, mut cached) = (Vec::new(), Vec::new());
    for run in 0..runs {
        let image = format!("{host}/bench/package:run-{run}");
        store
            .push(&image, &package_files(run + 1), &RegistryAuth::Anonymous)
            .await
            .map_err(|e| e.to_string())?;
        for samples in [&mut uncached, &mut cached] {
            let ns = mgmt
                .create_namespace("bench-pkg")
                .await
                .map_err(|e| e.to_string())?;
            samples.push(time_to_available(&client, &ns, &image).await?);
        }
    }
    stats(
        "Package created -> Available, image not pulled yet",
        &mut uncached,
    );
    stats(
        "Package created -> Available, image already pulled",
        &mut cached,
    );
    Ok(())
}
