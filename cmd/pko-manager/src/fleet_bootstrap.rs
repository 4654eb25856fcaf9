//! `pko-manager nats-bootstrap fleet …`: the fleet's own NATS trust, kept by the fleet's administrators in
//! a directory of theirs, never on a management cluster.
//!
//! - `hub` makes (once) the fleet's operator and the hub-only fleet account, and writes
//!   `hub-resolver.conf`, which the hub's nats-server includes. Management clusters keep their own
//!   operators (`pko-manager nats-bootstrap` on each): no cluster holds a key the hub trusts.
//! - `member --cluster C` issues C's leaf-node credentials for the hub: usable only as a leaf link,
//!   publishing only C's records (into C's own bucket at the hub, which the shared records bucket
//!   sources) and events, expiring; and makes sure the hub has those buckets and the aggregate stream
//!   sourcing C's events (managers may not create or change any of them).
//! - `viewer` issues read-only credentials for `kubectl package fleet` and dashboards.
//!
//! What a compromised management cluster can still do, and what it cannot, is in docs/fleet.md.

use std::path::{Path, PathBuf};
use std::time::Duration;

use async_nats::jetstream::{self, stream};
use pko_proto::fleet::{
    check_cluster_name, cluster_key, domain_api_prefix, fleet_events_subject, member_bucket,
    AGGREGATE_STREAM, DEFAULT_HUB_DOMAIN, HUB_ACCOUNT_LIMITS, MEMBER_LINK_PAYLOAD_BYTES,
    MEMBER_LINK_SUBSCRIPTIONS, MEMBER_RECORDS_MAX_BYTES, RECORD_MAX_AGE, RECORD_MAX_BYTES,
    STATE_BUCKET,
};
use pko_proto::nats_credentials::{expiry_after, CredentialsError, OperatorSetup, UserLimits};
use pko_proto::nats_permissions::{
    fleet_viewer_permissions, member_link_permissions, source_delivery_prefix,
};
use pko_proto::rollout_events::{
    STREAM, STREAM_MAX_AGE, STREAM_MAX_BYTES, SUBJECT_PREFIX as EVENT_PREFIX,
};

use crate::bootstrap_writes::{write_file, Written};

/// The fleet account's name in its JWT.
const FLEET_ACCOUNT_NAME: &str = "PKO_FLEET";
/// Where the fleet's keys are kept in the directory (every key and JWT; private to the administrators).
const KEYS_FILE: &str = "fleet-operator.json";
/// The configuration the hub's nats-server includes (deploy/nats/fleet/hub.conf).
pub const HUB_RESOLVER_FILE: &str = "hub-resolver.conf";
/// How long the short-lived administrator user the member step talks to the hub with is valid.
const ADMIN_VALIDITY: Duration = Duration::from_secs(600);
/// How long one answer of the hub may take.
const HUB_TIMEOUT: Duration = Duration::from_secs(10);

/// The fleet's trust, step by step.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum FleetStep {
    /// Make (once) the fleet's operator and account; write hub-resolver.conf for the hub's nats-server.
    Hub(FleetDir),
    /// Issue a management cluster's leaf-node credentials for the hub (<dir>/members/<cluster>.creds) and
    /// make sure the hub keeps the records bucket and sources the cluster's rollout events.
    Member(MemberArgs),
    /// Issue read-only credentials for the hub (<dir>/viewer.creds).
    Viewer(ViewerArgs),
}

#[derive(Debug, Clone, clap::Args)]
pub struct FleetDir {
    /// Directory of the fleet's keys (created if missing; keep it private).
    #[arg(long)]
    pub dir: PathBuf,
}

#[derive(Debug, Clone, clap::Args)]
pub struct MemberArgs {
    #[command(flatten)]
    pub keys: FleetDir,
    /// The management cluster (its manager's --cluster-name and its NATS's JetStream domain).
    #[arg(long)]
    pub cluster: String,
    /// The hub's client URL, where the bucket and the aggregate stream are checked.
    #[arg(long)]
    pub hub_url: String,
    /// The hub's JetStream domain.
    #[arg(long, default_value = DEFAULT_HUB_DOMAIN)]
    pub hub_domain: String,
    /// Days the credentials are valid; issue them again before then (the leaf link reconnects with the
    /// new file).
    #[arg(long, default_value_t = 90)]
    pub validity_days: u64,
}

#[derive(Debug, Clone, clap::Args)]
pub struct ViewerArgs {
    #[command(flatten)]
    pub keys: FleetDir,
    /// Days the credentials are valid.
    #[arg(long, default_value_t = 90)]
    pub validity_days: u64,
}

/// Why a fleet step failed.
#[derive(Debug, thiserror::Error)]
pub enum FleetBootstrapError {
    #[error("{path}: {source}")]
    File {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Keys { path: PathBuf, message: String },
    #[error("NATS keys: {0}")]
    Credentials(#[from] CredentialsError),
    #[error("--cluster: {0}")]
    Cluster(String),
    #[error("the hub at {url}: {message}")]
    Hub { url: String, message: String },
}

fn file_error(path: &Path) -> impl FnOnce(std::io::Error) -> FleetBootstrapError + '_ {
    move |source| FleetBootstrapError::File {
        path: path.to_owned(),
        source,
    }
}

/// Writes `text` to `path` in the fleet's directory (made if missing; owner-only when it holds a
/// secret) and says what happened.
fn write(path: &Path, text: &str, secret: bool) -> Result<Written, FleetBootstrapError> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(file_error(parent))?;
    }
    write_file(path, text, secret).map_err(file_error(path))
}

/// The fleet's operator setup, made on the first run and brought to this build's account limits.
fn fleet_setup(dir: &Path) -> Result<OperatorSetup, FleetBootstrapError> {
    let path = dir.join(KEYS_FILE);
    let keys_error = |message: String| FleetBootstrapError::Keys {
        path: path.clone(),
        message,
    };
    let (setup, made) = match std::fs::read_to_string(&path) {
        Ok(text) => (
            OperatorSetup::from_stored_json(&text).map_err(|e| keys_error(e.to_string()))?,
            false,
        ),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => (
            OperatorSetup::generate(FLEET_ACCOUNT_NAME, &HUB_ACCOUNT_LIMITS)?,
            true,
        ),
        Err(source) => return Err(FleetBootstrapError::File { path, source }),
    };
    let limited = setup.with_account_limits(&HUB_ACCOUNT_LIMITS)?;
    let changed = limited.is_some();
    let setup = limited.unwrap_or(setup);
    if made || changed {
        let written = write(&path, &setup.to_stored_json()?, true)?;
        println!("{}: {written}", path.display());
    }
    Ok(setup)
}

/// The expiry of credentials valid `days` (at least one) from now.
fn expires_in(days: u64) -> u64 {
    expiry_after(Duration::from_secs(days.max(1) * 24 * 60 * 60))
}

/// Runs one step.
pub async fn run(step: &FleetStep) -> Result<(), FleetBootstrapError> {
    match step {
        FleetStep::Hub(keys) => {
            let setup = fleet_setup(&keys.dir)?;
            let path = keys.dir.join(HUB_RESOLVER_FILE);
            let written = write(&path, &setup.inline_server_config(), false)?;
            println!("{}: {written}", path.display());
            println!("fleet account: {}", setup.account);
        }
        FleetStep::Member(member) => {
            check_cluster_name(&member.cluster).map_err(FleetBootstrapError::Cluster)?;
            let setup = fleet_setup(&member.keys.dir)?;
            let signer = setup.signer()?;
            let credentials = signer.issue_limited_user(
                &format!("pko-fleet-member-{}", member.cluster),
                &member_link_permissions(&member.cluster, &member.hub_domain),
                &UserLimits {
                    expires_at: expires_in(member.validity_days),
                    subscriptions: MEMBER_LINK_SUBSCRIPTIONS,
                    payload_bytes: MEMBER_LINK_PAYLOAD_BYTES,
                    leaf_node_only: true,
                },
            )?;
            let admin = signer.issue_limited_user(
                "pko-fleet-bootstrap",
                &pko_proto::nats_credentials::NatsPermissions {
                    publish: vec!["$JS.API.>".to_owned()],
                    subscribe: vec!["_INBOX.>".to_owned()],
                    allow_responses: false,
                },
                &UserLimits {
                    expires_at: expiry_after(ADMIN_VALIDITY),
                    subscriptions: 16,
                    payload_bytes: 1 << 20,
                    leaf_node_only: false,
                },
            )?;
            prepare_hub(&member.hub_url, &admin.creds_file(), &member.cluster).await?;
            let path = member
                .keys
                .dir
                .join("members")
                .join(format!("{}.creds", member.cluster));
            // Fresh credentials every run: the file always changes.
            write(&path, &credentials.creds_file(), true)?;
            println!(
                "{}: issued, valid {} days (the cluster's PKO_FLEET_LEAF_CREDENTIALS)",
                path.display(),
                member.validity_days.max(1)
            );
        }
        FleetStep::Viewer(viewer) => {
            let setup = fleet_setup(&viewer.keys.dir)?;
            let credentials = setup.signer()?.issue_limited_user(
                "pko-fleet-viewer",
                &fleet_viewer_permissions(),
                &UserLimits {
                    expires_at: expires_in(viewer.validity_days),
                    subscriptions: 64,
                    payload_bytes: 1 << 20,
                    leaf_node_only: false,
                },
            )?;
            let path = viewer.keys.dir.join("viewer.creds");
            write(&path, &credentials.creds_file(), true)?;
            println!(
                "{}: issued, valid {} days",
                path.display(),
                viewer.validity_days.max(1)
            );
        }
    }
    Ok(())
}

/// The stream of records bucket `bucket`: the last record of each key, none larger than a record may be,
/// none older than a week; no roll-ups, purges or message deletes, so whoever may put a key can change
/// only that key.
fn records_bucket(bucket: &str) -> stream::Config {
    stream::Config {
        name: format!("KV_{bucket}"),
        subjects: vec![format!("$KV.{bucket}.>")],
        max_messages_per_subject: 1,
        max_message_size: RECORD_MAX_BYTES,
        max_age: RECORD_MAX_AGE,
        storage: stream::StorageType::File,
        discard: stream::DiscardPolicy::New,
        allow_rollup: false,
        deny_purge: true,
        deny_delete: true,
        duplicate_window: Duration::from_secs(120),
        ..Default::default()
    }
}

/// How the shared records bucket sources `cluster`'s own bucket: only the keys `cluster` may write,
/// under the shared bucket's subjects.
fn member_records_source(cluster: &str) -> stream::Source {
    let own = member_bucket(cluster);
    let key = |bucket: &str, key: &str| format!("$KV.{bucket}.{key}");
    stream::Source {
        name: format!("KV_{own}"),
        subject_transforms: vec![
            stream::SubjectTransform {
                source: key(&own, &cluster_key(cluster)),
                destination: key(STATE_BUCKET, &cluster_key(cluster)),
            },
            stream::SubjectTransform {
                source: key(&own, &format!("rollout.*.{cluster}")),
                destination: key(
                    STATE_BUCKET,
                    &format!("rollout.{{{{wildcard(1)}}}}.{cluster}"),
                ),
            },
        ],
        ..Default::default()
    }
}

/// Makes sure the hub keeps `cluster`'s own records bucket, the shared records bucket sourcing it and
/// the aggregate stream, and that the stream sources `cluster`'s rollout events (delivered under the cluster's own prefix, which only its link may use).
async fn prepare_hub(url: &str, creds: &str, cluster: &str) -> Result<(), FleetBootstrapError> {
    let hub_error = |message: String| FleetBootstrapError::Hub {
        url: url.to_owned(),
        message,
    };
    let timed = |what: &'static str| move |_| hub_error(format!("{what}: no answer within 10s"));
    let nats = async_nats::ConnectOptions::with_credentials(creds)
        .map_err(|e| hub_error(e.to_string()))?
        .name("pko-fleet-bootstrap")
        .connect(url)
        .await
        .map_err(|e| hub_error(e.to_string()))?;
    let hub = jetstream::new(nats);
    // Made as a key-value bucket's stream, by hand: the client's bucket creation always allows roll-ups,
    // and a roll-up (`Nats-Rollup: all` on any put) would purge the whole bucket.
    let own = member_bucket(cluster);
    let own_config = stream::Config {
        max_bytes: MEMBER_RECORDS_MAX_BYTES,
        ..records_bucket(&own)
    };
    match tokio::time::timeout(HUB_TIMEOUT, hub.get_stream(&own_config.name))
        .await
        .map_err(timed("reading the cluster's records bucket"))?
    {
        Ok(_) => {
            tokio::time::timeout(HUB_TIMEOUT, hub.update_stream(own_config))
                .await
                .map_err(timed("updating the cluster's records bucket"))?
                .map_err(|e| hub_error(format!("updating bucket {own}: {e}")))?;
            println!("bucket {own}: present");
        }
        Err(_) => {
            tokio::time::timeout(HUB_TIMEOUT, hub.create_stream(own_config))
                .await
                .map_err(timed("creating the cluster's records bucket"))?
                .map_err(|e| hub_error(format!("creating bucket {own}: {e}")))?;
            println!("bucket {own}: created");
        }
    }
    let records_source = member_records_source(cluster);
    match tokio::time::timeout(HUB_TIMEOUT, hub.get_stream(format!("KV_{STATE_BUCKET}")))
        .await
        .map_err(timed("reading the records bucket"))?
    {
        Ok(shared) => {
            let mut config = shared.cached_info().config.clone();
            let sources = config.sources.get_or_insert_with(Vec::new);
            let sourced = sources.contains(&records_source);
            if !sourced {
                sources.retain(|s| s.name != records_source.name);
                sources.push(records_source);
            }
            // A bucket made before roll-ups were denied is brought to the same rules.
            let guarded = !config.allow_rollup && config.deny_purge && config.deny_delete;
            if sourced && guarded {
                println!("bucket {STATE_BUCKET}: sources {own}");
            } else {
                config.allow_rollup = false;
                config.deny_purge = true;
                config.deny_delete = true;
                tokio::time::timeout(HUB_TIMEOUT, hub.update_stream(config))
                    .await
                    .map_err(timed("updating the records bucket"))?
                    .map_err(|e| hub_error(format!("updating bucket {STATE_BUCKET}: {e}")))?;
                println!("bucket {STATE_BUCKET}: now sources {own}, roll-ups and purges denied");
            }
        }
        Err(_) => {
            let config = stream::Config {
                sources: Some(vec![records_source]),
                ..records_bucket(STATE_BUCKET)
            };
            tokio::time::timeout(HUB_TIMEOUT, hub.create_stream(config))
                .await
                .map_err(timed("creating the records bucket"))?
                .map_err(|e| hub_error(format!("creating bucket {STATE_BUCKET}: {e}")))?;
            println!("bucket {STATE_BUCKET}: created, sources {own}");
        }
    }
    let source = stream::Source {
        name: STREAM.to_owned(),
        external: Some(stream::External {
            api_prefix: domain_api_prefix(cluster),
            delivery_prefix: Some(source_delivery_prefix(cluster)),
        }),
        // Stored under the cluster's name, which the hub, not the sender, decides: readers attribute an
        // event by it, never by the `source` the sending manager wrote.
        subject_transforms: vec![stream::SubjectTransform {
            source: format!("{EVENT_PREFIX}.>"),
            destination: format!("{}.>", fleet_events_subject(cluster)),
        }],
        ..Default::default()
    };
    let found = tokio::time::timeout(HUB_TIMEOUT, hub.get_stream(AGGREGATE_STREAM))
        .await
        .map_err(timed("reading the aggregate stream"))?;
    match found {
        Ok(aggregate) => {
            let mut config = aggregate.cached_info().config.clone();
            let sources = config.sources.get_or_insert_with(Vec::new);
            let own = |s: &stream::Source| {
                s.external
                    .as_ref()
                    .is_some_and(|e| e.api_prefix == domain_api_prefix(cluster))
            };
            if sources.iter().any(|s| own(s) && *s == source) {
                println!("stream {AGGREGATE_STREAM}: sources {cluster}");
                return Ok(());
            }
            // An older source of this cluster (another delivery prefix) is replaced.
            sources.retain(|s| !own(s));
            sources.push(source);
            tokio::time::timeout(HUB_TIMEOUT, hub.update_stream(config))
                .await
                .map_err(timed("updating the aggregate stream"))?
                .map_err(|e| hub_error(format!("adding {cluster} to {AGGREGATE_STREAM}: {e}")))?;
            println!("stream {AGGREGATE_STREAM}: now sources {cluster}");
        }
        Err(_) => {
            tokio::time::timeout(
                HUB_TIMEOUT,
                hub.create_stream(stream::Config {
                    name: AGGREGATE_STREAM.to_owned(),
                    sources: Some(vec![source]),
                    max_age: STREAM_MAX_AGE,
                    max_bytes: STREAM_MAX_BYTES,
                    discard: stream::DiscardPolicy::Old,
                    storage: stream::StorageType::File,
                    deny_delete: true,
                    deny_purge: true,
                    ..Default::default()
                }),
            )
            .await
            .map_err(timed("creating the aggregate stream"))?
            .map_err(|e| hub_error(format!("creating {AGGREGATE_STREAM}: {e}")))?;
            println!("stream {AGGREGATE_STREAM}: created, sources {cluster}");
        }
    }
    Ok(())
}
