//! NATS decentralized-auth credentials: the JWTs nats-server (operator mode) verifies, and the `.creds`
//! file clients connect with.
//!
//! The manager holds an account's signing key and mints a user per hosted-cluster connector whose
//! permissions cover only that cluster's subjects; nats-server checks the user JWT's signature against the
//! account, so new connectors need no server restart or reload. For environments that run their own
//! nats-server (the dev launcher, the tests), [`OperatorSetup`] creates the operator and accounts and the
//! server configuration that trusts them; `pko-manager nats-bootstrap` does the same for a management
//! cluster. NATS set up by its operators (e.g. with `nsc`) works as well: pko only needs a signing seed
//! of the account.
//!
//! This module signs and formats; it must not talk to NATS.

use std::time::{SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use nkeys::KeyPair;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

/// What a NATS user may do (the `pub`/`sub`/`resp` permissions of its JWT).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NatsPermissions {
    /// Subjects it may publish to.
    pub publish: Vec<String>,
    /// Subjects it may subscribe to.
    pub subscribe: Vec<String>,
    /// It may answer requests (publish once to their reply subjects) without a wider publish grant.
    pub allow_responses: bool,
}

/// What a restricted user may use, and until when (enforced by nats-server from the JWT).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UserLimits {
    /// Unix time after which nats-server refuses the credentials (and closes connections using them).
    pub expires_at: u64,
    /// Subscriptions it may hold at once.
    pub subscriptions: i64,
    /// Bytes of one message it may publish.
    pub payload_bytes: i64,
    /// Only a server's leaf-node link may use the credentials, never a client: a stolen copy cannot be
    /// used to talk to the server directly.
    pub leaf_node_only: bool,
}

/// Unix time `validity` from now: the expiry of credentials issued now.
pub fn expiry_after(validity: std::time::Duration) -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|now| (now + validity).as_secs())
        .unwrap_or_default()
}

/// What one account may use on a server (the `limits` of its JWT); -1 is unlimited, 0 forbids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AccountLimits {
    /// Client connections at once.
    pub connections: i64,
    /// Leaf-node connections at once.
    pub leaf_nodes: i64,
    /// Subscriptions at once, over all connections.
    pub subscriptions: i64,
    /// Bytes of one message.
    pub payload_bytes: i64,
    /// JetStream storage and objects; `None` turns JetStream off for the account.
    pub jetstream: Option<JetStreamLimits>,
}

/// What one account may keep in JetStream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JetStreamLimits {
    pub memory_bytes: i64,
    pub disk_bytes: i64,
    pub streams: i64,
    pub consumers: i64,
}

impl AccountLimits {
    /// A management cluster's pko account: the manager's replicas and one connector per hosted cluster,
    /// the rollout event stream and the connectors' few subscriptions each; messages as large as the
    /// server's `max_payload` (a phase travels whole). The storage fits the rollout stream (at most 1 GiB)
    /// and stays within the smallest server store pko ships or tests with (2 GB): an account may not
    /// reserve more than its server has.
    pub const MANAGEMENT_CLUSTER: AccountLimits = AccountLimits {
        connections: 20_000,
        leaf_nodes: 4,
        subscriptions: 200_000,
        payload_bytes: 8 << 20,
        jetstream: Some(JetStreamLimits {
            memory_bytes: 64 << 20,
            disk_bytes: 1536 << 20,
            streams: 16,
            consumers: 1_000,
        }),
    };

    /// The system account: servers' own traffic, no JetStream.
    const SYSTEM: AccountLimits = AccountLimits {
        connections: -1,
        leaf_nodes: -1,
        subscriptions: -1,
        payload_bytes: -1,
        jetstream: None,
    };

    fn claims(&self) -> Value {
        let js = self.jetstream.unwrap_or(JetStreamLimits {
            memory_bytes: 0,
            disk_bytes: 0,
            streams: 0,
            consumers: 0,
        });
        // `data` stays -1: nats-server (through 2.12.15, its source read) never reads an account's `data`
        // claim, so a bound there would promise what no server keeps. Bytes are bounded by `payload`
        // per message and by the JetStream storage limits below.
        json!({
            "subs": self.subscriptions, "data": -1, "payload": self.payload_bytes,
            "imports": -1, "exports": -1, "wildcards": true,
            "conn": self.connections, "leaf": self.leaf_nodes,
            "mem_storage": js.memory_bytes, "disk_storage": js.disk_bytes,
            "streams": js.streams, "consumer": js.consumers,
        })
    }
}

/// Credentials could not be made.
#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    #[error("NATS signing key: {0}")]
    Key(String),
    #[error("NATS signing key: the seed is a {got} key, an account key is required")]
    NotAnAccountKey { got: String },
    #[error("encoding NATS JWT claims: {0}")]
    Encode(#[from] serde_json::Error),
}

fn key_error(error: nkeys::error::Error) -> CredentialsError {
    CredentialsError::Key(error.to_string())
}

/// A user's JWT and nkey seed: what a client needs to connect.
#[derive(Clone, PartialEq, Eq)]
pub struct UserCredentials {
    pub jwt: String,
    seed: String,
}

impl std::fmt::Debug for UserCredentials {
    // The seed is a secret: keep it out of logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UserCredentials")
            .field("jwt", &self.jwt)
            .finish_non_exhaustive()
    }
}

impl UserCredentials {
    /// Signs the server's connect nonce with the user's key: how a client proves it holds the user.
    pub fn sign_nonce(&self, nonce: &[u8]) -> Result<Vec<u8>, CredentialsError> {
        KeyPair::from_seed(&self.seed)
            .map_err(key_error)?
            .sign(nonce)
            .map_err(key_error)
    }

    /// The standard `.creds` file text (`ConnectOptions::with_credentials`, `nats --creds`).
    pub fn creds_file(&self) -> String {
        format!(
            "-----BEGIN NATS USER JWT-----\n{}\n------END NATS USER JWT------\n\n\
             ************************* IMPORTANT *************************\n\
             NKEY Seed printed below can be used to sign and prove identity.\n\
             NKEYs are sensitive and should be treated as secrets.\n\n\
             -----BEGIN USER NKEY SEED-----\n{}\n------END USER NKEY SEED------\n",
            self.jwt, self.seed
        )
    }
}

/// Mints users of one account.
pub struct AccountSigner {
    key: KeyPair,
    account: String,
}

impl std::fmt::Debug for AccountSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AccountSigner")
            .field("account", &self.account)
            .field("signing_key", &self.key.public_key())
            .finish()
    }
}

impl AccountSigner {
    /// A signer from an account seed (`SA...`). `account` is the account's public key when the seed is one
    /// of its signing keys rather than its identity key; users then name the account they belong to.
    pub fn from_seed(seed: &str, account: Option<&str>) -> Result<Self, CredentialsError> {
        let key = KeyPair::from_seed(seed.trim()).map_err(key_error)?;
        let public = key.public_key();
        if !public.starts_with('A') {
            return Err(CredentialsError::NotAnAccountKey {
                got: format!("{:?}", key.key_pair_type()),
            });
        }
        let account = account.map(str::to_owned).unwrap_or(public);
        Ok(Self { key, account })
    }

    /// The account's public key.
    pub fn account(&self) -> &str {
        &self.account
    }

    /// A new user named `name` with `permissions`, or allowed everything with `None`; it never expires.
    pub fn issue_user(
        &self,
        name: &str,
        permissions: Option<&NatsPermissions>,
    ) -> Result<UserCredentials, CredentialsError> {
        self.issue(name, permissions, None)
    }

    /// A new user named `name` with `permissions`, within `limits`.
    pub fn issue_limited_user(
        &self,
        name: &str,
        permissions: &NatsPermissions,
        limits: &UserLimits,
    ) -> Result<UserCredentials, CredentialsError> {
        self.issue(name, Some(permissions), Some(limits))
    }

    fn issue(
        &self,
        name: &str,
        permissions: Option<&NatsPermissions>,
        limits: Option<&UserLimits>,
    ) -> Result<UserCredentials, CredentialsError> {
        let user = KeyPair::new_user();
        let (subs, payload) = limits.map_or((-1, -1), |l| (l.subscriptions, l.payload_bytes));
        let mut nats = json!({
            "subs": subs, "data": -1, "payload": payload,
            "type": "user", "version": 2,
        });
        if limits.is_some_and(|l| l.leaf_node_only) {
            nats["allowed_connection_types"] = json!(["LEAFNODE"]);
        }
        if let Some(p) = permissions {
            nats["pub"] = json!({ "allow": p.publish });
            nats["sub"] = json!({ "allow": p.subscribe });
            if p.allow_responses {
                nats["resp"] = json!({ "max": 1, "ttl": 0 });
            }
        }
        if self.key.public_key() != self.account {
            nats["issuer_account"] = json!(self.account);
        }
        let expires_at = limits.map(|l| l.expires_at);
        let jwt = sign_claims(&self.key, name, &user.public_key(), nats, expires_at)?;
        Ok(UserCredentials {
            jwt,
            seed: user.seed().map_err(key_error)?,
        })
    }
}

/// An operator with a system account and one application account that has a signing key: what a
/// nats-server in operator mode needs to trust pko's users. Generated once (`pko-manager nats-bootstrap`,
/// the dev launcher, the tests) and kept as [`OperatorSetup::to_stored`] entries, from which the same
/// JWTs and server configuration come back ([`OperatorSetup::from_stored`]).
#[derive(Clone)]
pub struct OperatorSetup {
    pub operator_jwt: String,
    pub system_account: String,
    system_account_jwt: String,
    /// The application account's public key.
    pub account: String,
    account_jwt: String,
    operator_seed: String,
    system_seed: String,
    account_seed: String,
    signing_seed: String,
}

impl std::fmt::Debug for OperatorSetup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OperatorSetup")
            .field("system_account", &self.system_account)
            .field("account", &self.account)
            .finish_non_exhaustive()
    }
}

/// The names [`OperatorSetup::to_stored`] keeps each part under.
const STORED: [&str; 7] = [
    "operator.jwt",
    "system-account.jwt",
    "account.jwt",
    "operator.seed",
    "system-account.seed",
    "account.seed",
    "signing-key.seed",
];

impl OperatorSetup {
    /// Fresh keys: an operator, its system account, and account `account_name` within `limits`, with one
    /// signing key.
    pub fn generate(account_name: &str, limits: &AccountLimits) -> Result<Self, CredentialsError> {
        let operator = KeyPair::new_operator();
        let system = KeyPair::new_account();
        let account = KeyPair::new_account();
        let signing = KeyPair::new_account();
        let operator_jwt = sign_claims(
            &operator,
            "pko-operator",
            &operator.public_key(),
            json!({ "type": "operator", "version": 2, "system_account": system.public_key() }),
            None,
        )?;
        let system_account_jwt = sign_claims(
            &operator,
            "SYS",
            &system.public_key(),
            account_nats(&AccountLimits::SYSTEM, None),
            None,
        )?;
        let account_jwt = sign_claims(
            &operator,
            account_name,
            &account.public_key(),
            account_nats(limits, Some(&signing.public_key())),
            None,
        )?;
        Ok(Self {
            operator_jwt,
            system_account: system.public_key(),
            system_account_jwt,
            account: account.public_key(),
            account_jwt,
            operator_seed: operator.seed().map_err(key_error)?,
            system_seed: system.seed().map_err(key_error)?,
            account_seed: account.seed().map_err(key_error)?,
            signing_seed: signing.seed().map_err(key_error)?,
        })
    }

    /// Every part, by name: what a Secret keeps so later runs reproduce the same configuration.
    pub fn to_stored(&self) -> Vec<(&'static str, String)> {
        let parts = [
            &self.operator_jwt,
            &self.system_account_jwt,
            &self.account_jwt,
            &self.operator_seed,
            &self.system_seed,
            &self.account_seed,
            &self.signing_seed,
        ];
        STORED
            .iter()
            .zip(parts)
            .map(|(name, value)| (*name, value.clone()))
            .collect()
    }

    /// The setup [`OperatorSetup::to_stored`] kept; `get` reads one part by name.
    pub fn from_stored(get: impl Fn(&str) -> Option<String>) -> Result<Self, CredentialsError> {
        let part = |name: &str| {
            get(name).ok_or_else(|| CredentialsError::Key(format!("{name} is missing")))
        };
        let public = |name: &str| -> Result<String, CredentialsError> {
            Ok(KeyPair::from_seed(part(name)?.trim())
                .map_err(key_error)?
                .public_key())
        };
        Ok(Self {
            operator_jwt: part(STORED[0])?,
            system_account_jwt: part(STORED[1])?,
            account_jwt: part(STORED[2])?,
            system_account: public(STORED[4])?,
            account: public(STORED[5])?,
            operator_seed: part(STORED[3])?,
            system_seed: part(STORED[4])?,
            account_seed: part(STORED[5])?,
            signing_seed: part(STORED[6])?,
        })
    }

    /// This setup with the application account held to `limits`: its JWT signed again by the operator
    /// (same keys, same signing key) when the limits it carries differ; `None` when they already match.
    /// Lets a later bootstrap bring an older installation's account to this build's limits.
    pub fn with_account_limits(
        &self,
        limits: &AccountLimits,
    ) -> Result<Option<Self>, CredentialsError> {
        let claims = jwt_claims(&self.account_jwt)?;
        if claims["nats"]["limits"] == limits.claims() {
            return Ok(None);
        }
        let operator = KeyPair::from_seed(&self.operator_seed).map_err(key_error)?;
        let signing = KeyPair::from_seed(&self.signing_seed).map_err(key_error)?;
        let name = claims["name"].as_str().unwrap_or("PKO");
        let account_jwt = sign_claims(
            &operator,
            name,
            &self.account,
            account_nats(limits, Some(&signing.public_key())),
            None,
        )?;
        Ok(Some(Self {
            account_jwt,
            ..self.clone()
        }))
    }

    /// A signer of the application account's users, through its signing key.
    pub fn signer(&self) -> Result<AccountSigner, CredentialsError> {
        AccountSigner::from_seed(&self.signing_seed, Some(&self.account))
    }

    /// Every part as one JSON object of [`OperatorSetup::to_stored`]'s names: the file the fleet's keys are
    /// kept in.
    pub fn to_stored_json(&self) -> Result<String, CredentialsError> {
        let parts: std::collections::BTreeMap<&str, String> =
            self.to_stored().into_iter().collect();
        Ok(serde_json::to_string_pretty(&parts)?)
    }

    /// The setup [`OperatorSetup::to_stored_json`] wrote.
    pub fn from_stored_json(text: &str) -> Result<Self, CredentialsError> {
        let parts: std::collections::BTreeMap<String, String> = serde_json::from_str(text)?;
        Self::from_stored(|name| parts.get(name).cloned())
    }

    /// The application account's own seed, which [`AccountSigner::from_seed`] takes.
    pub fn account_seed(&self) -> &str {
        &self.account_seed
    }

    /// The seed of the application account's signing key: what the manager signs users with (with
    /// [`OperatorSetup::account`] as the account they belong to).
    pub fn signing_seed(&self) -> &str {
        &self.signing_seed
    }

    /// The nats-server configuration lines that trust this operator (the operator JWT is read from
    /// `operator_jwt_path`, where the caller writes [`OperatorSetup::operator_jwt`]).
    pub fn server_config(&self, operator_jwt_path: &str) -> String {
        self.resolver_config(&format!("\"{operator_jwt_path}\""))
    }

    /// Like [`OperatorSetup::server_config`] with the operator JWT inline: one file to include.
    pub fn inline_server_config(&self) -> String {
        self.resolver_config(&self.operator_jwt)
    }

    fn resolver_config(&self, operator: &str) -> String {
        format!(
            "operator: {operator}\nsystem_account: {sys}\nresolver: MEMORY\n\
             resolver_preload: {{\n  {sys}: \"{sys_jwt}\"\n  {acc}: \"{acc_jwt}\"\n}}\n",
            sys = self.system_account,
            sys_jwt = self.system_account_jwt,
            acc = self.account,
            acc_jwt = self.account_jwt,
        )
    }
}

/// An account's claims within `limits`; users may be signed by `signing_key` too.
fn account_nats(limits: &AccountLimits, signing_key: Option<&str>) -> Value {
    let mut nats = json!({
        "limits": limits.claims(),
        "default_permissions": { "pub": {}, "sub": {} },
        "type": "account",
        "version": 2,
    });
    if let Some(key) = signing_key {
        nats["signing_keys"] = json!([key]);
    }
    nats
}

/// The claims of a JWT (its signature is not checked: the JWT is one this installation keeps).
fn jwt_claims(jwt: &str) -> Result<Value, CredentialsError> {
    let body = jwt
        .split('.')
        .nth(1)
        .ok_or_else(|| CredentialsError::Key("a JWT without claims".to_owned()))?;
    let bytes = URL_SAFE_NO_PAD
        .decode(body)
        .map_err(|e| CredentialsError::Key(format!("JWT claims: {e}")))?;
    Ok(serde_json::from_slice(&bytes)?)
}

/// Signs a v2 JWT: `base64url(header).base64url(claims).base64url(ed25519 signature)`. `jti` is the
/// base32 SHA-256 of the claims without it, as NATS' own tooling computes it.
fn sign_claims(
    issuer: &KeyPair,
    name: &str,
    subject: &str,
    nats: Value,
    expires_at: Option<u64>,
) -> Result<String, CredentialsError> {
    let issued_at = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    let mut claims = json!({
        "iat": issued_at,
        "iss": issuer.public_key(),
        "name": name,
        "sub": subject,
        "nats": nats,
    });
    if let Some(expires_at) = expires_at {
        claims["exp"] = json!(expires_at);
    }
    let digest = Sha256::digest(serde_json::to_vec(&claims)?);
    claims["jti"] = json!(data_encoding::BASE32_NOPAD.encode(&digest));
    let header = URL_SAFE_NO_PAD.encode(br#"{"typ":"JWT","alg":"ed25519-nkey"}"#);
    let body = URL_SAFE_NO_PAD.encode(serde_json::to_vec(&claims)?);
    let signing_input = format!("{header}.{body}");
    let signature = issuer.sign(signing_input.as_bytes()).map_err(key_error)?;
    Ok(format!(
        "{signing_input}.{}",
        URL_SAFE_NO_PAD.encode(signature)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(jwt: &str) -> (Value, Vec<u8>, String) {
        let parts: Vec<&str> = jwt.split('.').collect();
        assert_eq!(parts.len(), 3, "{jwt}");
        let claims = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(parts[1]).unwrap()).unwrap();
        let signature = URL_SAFE_NO_PAD.decode(parts[2]).unwrap();
        (claims, signature, format!("{}.{}", parts[0], parts[1]))
    }

    #[test]
    fn a_stored_setup_comes_back_with_the_same_configuration_and_signs_through_its_signing_key() {
        let setup = OperatorSetup::generate("PKO", &AccountLimits::MANAGEMENT_CLUSTER).unwrap();
        let stored: std::collections::BTreeMap<&str, String> =
            setup.to_stored().into_iter().collect();
        let again = OperatorSetup::from_stored(|name| stored.get(name).cloned()).unwrap();
        assert_eq!(again.inline_server_config(), setup.inline_server_config());
        let json = OperatorSetup::from_stored_json(&setup.to_stored_json().unwrap()).unwrap();
        assert_eq!(json.inline_server_config(), setup.inline_server_config());
        assert_eq!(again.account, setup.account);
        let (account_claims, _, _) = decode(&setup.account_jwt);
        let signer = AccountSigner::from_seed(setup.signing_seed(), Some(&setup.account)).unwrap();
        let user = signer.issue_user("manager", None).unwrap();
        let (claims, _, _) = decode(&user.jwt);
        assert_eq!(account_claims["nats"]["signing_keys"][0], claims["iss"]);
        assert_eq!(claims["nats"]["issuer_account"], setup.account);
        let missing = OperatorSetup::from_stored(|name| {
            (name != "signing-key.seed")
                .then(|| stored.get(name).cloned())
                .flatten()
        });
        assert!(missing
            .unwrap_err()
            .to_string()
            .contains("signing-key.seed"));
    }

    #[test]
    fn users_are_signed_by_the_account_and_carry_their_permissions() {
        let setup = OperatorSetup::generate("PKO", &AccountLimits::MANAGEMENT_CLUSTER).unwrap();
        let signer = AccountSigner::from_seed(setup.account_seed(), None).unwrap();
        assert_eq!(signer.account(), setup.account);
        let permissions = NatsPermissions {
            publish: vec!["a.status".into()],
            subscribe: vec!["a.apply".into()],
            allow_responses: true,
        };
        let user = signer
            .issue_user("connector-a", Some(&permissions))
            .unwrap();
        let (claims, signature, input) = decode(&user.jwt);
        assert_eq!(claims["iss"], setup.account);
        assert_eq!(claims["nats"]["pub"]["allow"], json!(["a.status"]));
        assert_eq!(claims["nats"]["sub"]["allow"], json!(["a.apply"]));
        assert_eq!(claims["nats"]["resp"]["max"], 1);
        assert!(claims["nats"].get("issuer_account").is_none());
        let account = KeyPair::from_public_key(&setup.account).unwrap();
        account.verify(input.as_bytes(), &signature).unwrap();
        // The creds file holds the JWT and a user seed whose public key is the JWT's subject.
        let creds = user.creds_file();
        assert!(creds.contains(&user.jwt));
        let seed = creds
            .lines()
            .find(|l| l.starts_with("SU"))
            .expect("user seed line");
        assert_eq!(
            KeyPair::from_seed(seed).unwrap().public_key(),
            claims["sub"].as_str().unwrap()
        );
        assert!(
            !format!("{user:?}").contains(seed),
            "seed must not be logged"
        );
    }

    #[test]
    fn limited_users_expire_and_carry_their_limits() {
        let setup = OperatorSetup::generate("PKO", &AccountLimits::MANAGEMENT_CLUSTER).unwrap();
        let signer = AccountSigner::from_seed(setup.account_seed(), None).unwrap();
        let permissions = NatsPermissions {
            publish: vec![],
            subscribe: vec!["a.apply".into()],
            allow_responses: true,
        };
        let limits = UserLimits {
            expires_at: 2_000_000_000,
            subscriptions: 8,
            payload_bytes: 1 << 21,
            leaf_node_only: false,
        };
        let user = signer
            .issue_limited_user("connector-a", &permissions, &limits)
            .unwrap();
        let (claims, _, _) = decode(&user.jwt);
        assert_eq!(claims["exp"], 2_000_000_000u64);
        assert_eq!(claims["nats"]["subs"], 8);
        assert_eq!(claims["nats"]["payload"], 1 << 21);
        let (unlimited, _, _) = decode(&signer.issue_user("manager", None).unwrap().jwt);
        assert!(unlimited.get("exp").is_none());
        assert_eq!(unlimited["nats"]["subs"], -1);
    }

    #[test]
    fn unrestricted_users_and_signing_keys() {
        let setup = OperatorSetup::generate("PKO", &AccountLimits::MANAGEMENT_CLUSTER).unwrap();
        let signing = KeyPair::new_account();
        let signer =
            AccountSigner::from_seed(&signing.seed().unwrap(), Some(&setup.account)).unwrap();
        let (claims, _, _) = decode(&signer.issue_user("manager", None).unwrap().jwt);
        assert!(claims["nats"].get("pub").is_none());
        assert!(claims["nats"].get("sub").is_none());
        assert_eq!(claims["nats"]["issuer_account"], setup.account);
        assert_eq!(claims["iss"], signing.public_key());
    }

    #[test]
    fn operator_setup_trusts_both_accounts() {
        let setup = OperatorSetup::generate("PKO", &AccountLimits::MANAGEMENT_CLUSTER).unwrap();
        let (operator, _, _) = decode(&setup.operator_jwt);
        assert_eq!(operator["nats"]["system_account"], setup.system_account);
        let config = setup.server_config("/tmp/op.jwt");
        assert!(config.contains("resolver: MEMORY"), "{config}");
        assert!(config.contains(&setup.account) && config.contains(&setup.system_account));
        let (account, _, _) = decode(&setup.account_jwt);
        assert_eq!(account["iss"], operator["sub"]);
        assert_eq!(account["nats"]["limits"]["disk_storage"], 1536i64 << 20);
        assert_eq!(account["nats"]["limits"]["conn"], 20_000);
    }

    #[test]
    fn an_account_is_signed_again_only_when_its_limits_change() {
        let setup = OperatorSetup::generate("PKO", &AccountLimits::MANAGEMENT_CLUSTER).unwrap();
        assert!(setup
            .with_account_limits(&AccountLimits::MANAGEMENT_CLUSTER)
            .unwrap()
            .is_none());
        let tighter = AccountLimits {
            connections: 5,
            ..AccountLimits::MANAGEMENT_CLUSTER
        };
        let limited = setup.with_account_limits(&tighter).unwrap().unwrap();
        let (claims, signature, input) = decode(&limited.account_jwt);
        assert_eq!(claims["nats"]["limits"]["conn"], 5);
        assert_eq!(claims["sub"], setup.account);
        let (operator, _, _) = decode(&setup.operator_jwt);
        KeyPair::from_public_key(operator["sub"].as_str().unwrap())
            .unwrap()
            .verify(input.as_bytes(), &signature)
            .unwrap();
        // Same keys: users the old signing key minted still belong to the account.
        assert_eq!(limited.signing_seed(), setup.signing_seed());
        assert!(limited.with_account_limits(&tighter).unwrap().is_none());
    }

    #[test]
    fn leaf_only_users_say_so() {
        let setup = OperatorSetup::generate("PKO", &AccountLimits::MANAGEMENT_CLUSTER).unwrap();
        let permissions = NatsPermissions {
            publish: vec!["a".into()],
            subscribe: vec![],
            allow_responses: false,
        };
        let limits = UserLimits {
            expires_at: 2_000_000_000,
            subscriptions: 8,
            payload_bytes: 1024,
            leaf_node_only: true,
        };
        let user = setup
            .signer()
            .unwrap()
            .issue_limited_user("member", &permissions, &limits)
            .unwrap();
        let (claims, _, _) = decode(&user.jwt);
        assert_eq!(
            claims["nats"]["allowed_connection_types"],
            json!(["LEAFNODE"])
        );
        // The nonce signature verifies with the user's public key (the JWT's subject).
        let signature = user.sign_nonce(b"nonce").unwrap();
        KeyPair::from_public_key(claims["sub"].as_str().unwrap())
            .unwrap()
            .verify(b"nonce", &signature)
            .unwrap();
    }

    #[test]
    fn non_account_seeds_are_refused() {
        let user = KeyPair::new_user().seed().unwrap();
        let error = AccountSigner::from_seed(&user, None).unwrap_err();
        assert!(
            error.to_string().contains("account key is required"),
            "{error}"
        );
        let error = AccountSigner::from_seed("not a seed", None).unwrap_err();
        assert!(error.to_string().starts_with("NATS signing key"), "{error}");
    }
}
