//! `pko-manager nats-bootstrap`: the NATS trust pko needs on a management cluster, made once and kept.
//! It creates an operator, its system account and the pko account with a signing key, and writes
//! - Secret `pko-nats-operator`: every key and JWT (read only by this command, on later runs);
//! - Secret `pko-nats-account`: the signing seed and the account's public key, which the manager reads;
//! - ConfigMap `pko-nats-resolver`: `resolver.conf`, which nats-server includes (operator mode).
//!
//! Idempotent: a later run reads the keys back and changes nothing that is already right. Seeds go to
//! stdout only with `--print-seed`.

use std::path::PathBuf;

use crate::bootstrap_writes::{write_file, Written};
use crate::fleet_bootstrap::FleetStep;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::ByteString;
use kube::api::{Api, PostParams};
use kube::Client;
use pko_proto::nats_credentials::{AccountLimits, CredentialsError, OperatorSetup};
use std::collections::BTreeMap;

/// The name of the pko account in its JWT.
const ACCOUNT_NAME: &str = "PKO";
/// Key of the resolver configuration in the ConfigMap.
pub const RESOLVER_KEY: &str = "resolver.conf";
/// Keys of the account Secret (the Deployment in deploy/manager mounts and reads them).
pub const SEED_KEY: &str = "account.seed";
pub const ACCOUNT_KEY: &str = "account";

/// Where the bootstrap keeps what it makes.
#[derive(Debug, Clone, clap::Args)]
pub struct BootstrapArgs {
    /// Namespace pko runs in: the Secrets and the ConfigMap go there (created if missing).
    #[arg(long, env = "POD_NAMESPACE", default_value = "package-operator-system")]
    pub namespace: String,
    /// Secret holding the operator's and accounts' keys and JWTs.
    #[arg(long, default_value = "pko-nats-operator")]
    pub operator_secret: String,
    /// Secret the manager reads the account signing seed and public key from.
    #[arg(long, default_value = "pko-nats-account")]
    pub account_secret: String,
    /// ConfigMap holding resolver.conf for nats-server.
    #[arg(long, default_value = "pko-nats-resolver")]
    pub resolver_configmap: String,
    /// Also write resolver.conf to this file (for a nats-server outside the cluster).
    #[arg(long)]
    pub resolver_file: Option<PathBuf>,
    /// Print the account signing seed to stdout (for a manager outside the cluster).
    #[arg(long)]
    pub print_seed: bool,
    /// The fleet's trust instead, made by the fleet's administrators (not on a management cluster).
    #[command(subcommand)]
    pub fleet: Option<BootstrapFleet>,
}

/// The other trust the command makes.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum BootstrapFleet {
    /// The fleet's NATS trust: the hub's operator and account, per-cluster leaf credentials, viewers.
    #[command(subcommand)]
    Fleet(FleetStep),
}

/// Why the bootstrap failed.
#[derive(Debug, thiserror::Error)]
pub enum BootstrapError {
    #[error("{what}: {source}")]
    Kube {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error("Secret {secret}: {source}")]
    Stored {
        secret: String,
        #[source]
        source: CredentialsError,
    },
    #[error("generating NATS keys: {0}")]
    Generate(#[source] CredentialsError),
    #[error("writing {path}: {source}")]
    File {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

fn kube_error(what: impl Into<String>) -> impl FnOnce(kube::Error) -> BootstrapError {
    let what = what.into();
    move |source| BootstrapError::Kube { what, source }
}

fn meta(name: &str, namespace: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        namespace: Some(namespace.to_owned()),
        labels: Some(BTreeMap::from([(
            "app.kubernetes.io/part-of".to_owned(),
            "pko".to_owned(),
        )])),
        ..Default::default()
    }
}

fn secret_data(entries: Vec<(&str, String)>) -> BTreeMap<String, ByteString> {
    entries
        .into_iter()
        .map(|(k, v)| (k.to_owned(), ByteString(v.into_bytes())))
        .collect()
}

/// The operator setup kept in the operator Secret, made and stored on the first run; an account signed
/// with other limits than this build's is signed again (same keys) and stored.
async fn operator_setup(
    secrets: &Api<Secret>,
    name: &str,
) -> Result<(OperatorSetup, Written), BootstrapError> {
    let (setup, written) = stored_or_new_setup(secrets, name).await?;
    let stored_error = |source| BootstrapError::Stored {
        secret: name.to_owned(),
        source,
    };
    let Some(limited) = setup
        .with_account_limits(&AccountLimits::MANAGEMENT_CLUSTER)
        .map_err(stored_error)?
    else {
        return Ok((setup, written));
    };
    let what = format!("Secret {name}");
    let mut secret = secrets.get(name).await.map_err(kube_error(&what))?;
    secret.data = Some(secret_data(limited.to_stored()));
    secrets
        .replace(name, &PostParams::default(), &secret)
        .await
        .map_err(kube_error(what))?;
    Ok((limited, Written::Updated))
}

async fn stored_or_new_setup(
    secrets: &Api<Secret>,
    name: &str,
) -> Result<(OperatorSetup, Written), BootstrapError> {
    let read = |secret: &Secret| {
        let data = secret.data.clone().unwrap_or_default();
        OperatorSetup::from_stored(|key| {
            data.get(key)
                .and_then(|v| String::from_utf8(v.0.clone()).ok())
        })
        .map_err(|source| BootstrapError::Stored {
            secret: name.to_owned(),
            source,
        })
    };
    let what = format!("Secret {name}");
    if let Some(secret) = secrets.get_opt(name).await.map_err(kube_error(&what))? {
        return Ok((read(&secret)?, Written::Unchanged));
    }
    let setup = OperatorSetup::generate(ACCOUNT_NAME, &AccountLimits::MANAGEMENT_CLUSTER)
        .map_err(BootstrapError::Generate)?;
    let secret = Secret {
        metadata: meta(name, secrets.namespace().unwrap_or_default()),
        data: Some(secret_data(setup.to_stored())),
        ..Default::default()
    };
    match secrets.create(&PostParams::default(), &secret).await {
        Ok(_) => Ok((setup, Written::Created)),
        // Another run made it first: use its keys.
        Err(kube::Error::Api(status)) if status.code == 409 => {
            let secret = secrets.get(name).await.map_err(kube_error(&what))?;
            Ok((read(&secret)?, Written::Unchanged))
        }
        Err(error) => Err(kube_error(what)(error)),
    }
}

/// Creates `desired`, or replaces the stored object when `same` says it differs.
async fn ensure<K>(
    api: &Api<K>,
    desired: K,
    same: impl Fn(&K, &K) -> bool,
) -> Result<Written, BootstrapError>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + k8s_openapi::serde::Serialize
        + k8s_openapi::serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let name = desired.meta().name.clone().unwrap_or_default();
    let what = format!("{} {name}", K::kind(&()));
    match api.get_opt(&name).await.map_err(kube_error(&what))? {
        None => {
            api.create(&PostParams::default(), &desired)
                .await
                .map_err(kube_error(&what))?;
            Ok(Written::Created)
        }
        Some(stored) if same(&stored, &desired) => Ok(Written::Unchanged),
        Some(stored) => {
            let mut replacement = desired;
            replacement.meta_mut().resource_version = stored.meta().resource_version.clone();
            api.replace(&name, &PostParams::default(), &replacement)
                .await
                .map_err(kube_error(&what))?;
            Ok(Written::Updated)
        }
    }
}

/// Makes or checks everything; prints what it did (never a seed unless asked).
pub async fn run(client: Client, args: &BootstrapArgs) -> Result<(), BootstrapError> {
    let ns = args.namespace.as_str();
    let namespaces: Api<Namespace> = Api::all(client.clone());
    if namespaces
        .get_opt(ns)
        .await
        .map_err(kube_error(format!("Namespace {ns}")))?
        .is_none()
    {
        let namespace = Namespace {
            metadata: ObjectMeta {
                name: Some(ns.to_owned()),
                ..Default::default()
            },
            ..Default::default()
        };
        match namespaces.create(&PostParams::default(), &namespace).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(error) => return Err(kube_error(format!("Namespace {ns}"))(error)),
        }
    }
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let (setup, operator) = operator_setup(&secrets, &args.operator_secret).await?;
    let account = ensure(
        &secrets,
        Secret {
            metadata: meta(&args.account_secret, ns),
            data: Some(secret_data(vec![
                (SEED_KEY, setup.signing_seed().to_owned()),
                (ACCOUNT_KEY, setup.account.clone()),
            ])),
            ..Default::default()
        },
        |stored, desired| stored.data == desired.data,
    )
    .await?;
    let resolver_config = setup.inline_server_config();
    let resolver = ensure(
        &Api::<ConfigMap>::namespaced(client, ns),
        ConfigMap {
            metadata: meta(&args.resolver_configmap, ns),
            data: Some(BTreeMap::from([(
                RESOLVER_KEY.to_owned(),
                resolver_config.clone(),
            )])),
            ..Default::default()
        },
        |stored, desired| stored.data == desired.data,
    )
    .await?;
    println!("Secret {ns}/{}: {operator}", args.operator_secret);
    println!("Secret {ns}/{}: {account}", args.account_secret);
    println!("ConfigMap {ns}/{}: {resolver}", args.resolver_configmap);
    if let Some(path) = &args.resolver_file {
        let written =
            write_file(path, &resolver_config, false).map_err(|source| BootstrapError::File {
                path: path.clone(),
                source,
            })?;
        println!("{}: {written}", path.display());
    }
    println!("account: {}", setup.account);
    if args.print_seed {
        println!("signing seed: {}", setup.signing_seed());
    }
    Ok(())
}
