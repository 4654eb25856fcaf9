//! The wire contract between pko-manager and the hosted-cluster connectors (version 1): NATS subjects and
//! JSON messages. Everything for the hosted cluster whose control plane runs in HCP namespace `<ns>` travels
//! under `pko.v1.hc.<ns>.`, so a connector's NATS credentials can be limited to its own subjects:
//!
//! | subject | direction | message | reply |
//! | --- | --- | --- | --- |
//! | `pko.v1.hc.<ns>.phase.apply` | manager → connector, request | [`ApplyPhase`] | [`PhaseReport`] or [`ErrorReply`] |
//! | `pko.v1.hc.<ns>.phase.teardown` | manager → connector, request | [`TeardownPhase`] | [`PhaseReport`] or [`ErrorReply`] |
//! | `pko.v1.hc.<ns>.phase.status` | connector → manager | [`PhaseReport`] (a hosted object changed) | — |
//! | `pko.v1.hc.<ns>.hello` | connector → manager | [`Hello`] (on every (re)connect: re-send desired phases) | — |
//!
//! Every message carries `version`. A receiver accepts its own version and older ones (fields added later
//! are optional and default), ignores fields it does not know, and rejects a newer version, a message over
//! [`MAX_MESSAGE_BYTES`] or malformed JSON with a [`WireError`] (the receiver answers requests with an
//! [`ErrorReply`] and never crashes). W3C trace context travels in the NATS headers [`TRACEPARENT_HEADER`]
//! and [`TRACESTATE_HEADER`].

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::core::common::{ControlledObjectReference, ObjectSetObject, ObjectSetProbe};
use crate::nats_credentials::NatsPermissions;

/// The version this build speaks (and the newest it accepts).
pub const WIRE_VERSION: u32 = 1;
/// Largest accepted message: NATS' default `max_payload`.
pub const MAX_MESSAGE_BYTES: usize = 1024 * 1024;
/// Header carrying the W3C `traceparent` of the sender's span.
pub const TRACEPARENT_HEADER: &str = "traceparent";
/// Header carrying the W3C `tracestate`.
pub const TRACESTATE_HEADER: &str = "tracestate";
/// Subjects of every hosted cluster start here.
pub const SUBJECT_PREFIX: &str = "pko.v1.hc";

/// A message that cannot be sent or accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("message of {size} bytes exceeds the limit of {MAX_MESSAGE_BYTES}")]
    TooLarge { size: usize },
    #[error("malformed message: {0}")]
    Malformed(String),
    #[error("message version {got} is newer than this side's {WIRE_VERSION}")]
    UnsupportedVersion { got: u64 },
    #[error("{namespace:?} is not a valid HCP namespace for NATS subjects: {problem}")]
    InvalidNamespace { namespace: String, problem: String },
}

impl WireError {
    /// The code an [`ErrorReply`] carries for this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            WireError::TooLarge { .. } => ErrorCode::TooLarge,
            WireError::Malformed(_) => ErrorCode::Malformed,
            WireError::UnsupportedVersion { .. } => ErrorCode::UnsupportedVersion,
            WireError::InvalidNamespace { .. } => ErrorCode::WrongNamespace,
        }
    }
}

/// The subjects of one hosted cluster: `pko.v1.hc.<ns>.…`, or `pko.v1.hc.<ns>_<uid>.…` once bound to the
/// UID of the HostedCluster that has the HCP namespace, so credentials minted for an earlier HostedCluster
/// of the same namespace cannot receive the current one's phases. (`_` never occurs in a namespace.)
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostedClusterSubjects {
    namespace: String,
    token: String,
}

impl HostedClusterSubjects {
    /// The subjects of HCP namespace `namespace`, which must be a DNS-1123 label (so it is one NATS token).
    pub fn new(namespace: &str) -> Result<Self, WireError> {
        let invalid = |problem: &str| WireError::InvalidNamespace {
            namespace: namespace.to_owned(),
            problem: problem.to_owned(),
        };
        if namespace.is_empty() || namespace.len() > 63 {
            return Err(invalid("must be 1 to 63 characters"));
        }
        if !namespace
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        {
            return Err(invalid(
                "only lowercase letters, digits and '-' are allowed",
            ));
        }
        if namespace.starts_with('-') || namespace.ends_with('-') {
            return Err(invalid("must start and end with a letter or digit"));
        }
        Ok(Self {
            namespace: namespace.to_owned(),
            token: namespace.to_owned(),
        })
    }

    /// These subjects bound to the HostedCluster `cluster_uid` (a Kubernetes UID: letters, digits, `-`).
    pub fn bound_to(self, cluster_uid: &str) -> Result<Self, WireError> {
        let valid = !cluster_uid.is_empty()
            && cluster_uid
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-');
        if !valid {
            return Err(WireError::InvalidNamespace {
                namespace: format!("{}_{cluster_uid}", self.namespace),
                problem: "a HostedCluster UID has only letters, digits and '-'".to_owned(),
            });
        }
        Ok(Self {
            token: format!("{}_{cluster_uid}", self.namespace),
            namespace: self.namespace,
        })
    }

    /// The subjects of HCP namespace `namespace`, bound to `cluster_uid` when its HostedCluster is known.
    pub fn of(namespace: &str, cluster_uid: Option<&str>) -> Result<Self, WireError> {
        let subjects = Self::new(namespace)?;
        match cluster_uid {
            Some(uid) => subjects.bound_to(uid),
            None => Ok(subjects),
        }
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    fn subject(&self, suffix: &str) -> String {
        format!("{SUBJECT_PREFIX}.{}.{suffix}", self.token)
    }

    /// Requests to apply a phase.
    pub fn apply(&self) -> String {
        self.subject("phase.apply")
    }

    /// Requests to tear a phase down.
    pub fn teardown(&self) -> String {
        self.subject("phase.teardown")
    }

    /// Requests to dry-run a release's hosted objects (a HostedClusterPackage's preflight).
    pub fn preview(&self) -> String {
        self.subject("phase.preview")
    }

    /// Phase reports the connector pushes.
    pub fn status(&self) -> String {
        self.subject("phase.status")
    }

    /// The connector's hello.
    pub fn hello(&self) -> String {
        self.subject("hello")
    }

    /// Every subject of this hosted cluster (`pko.v1.hc.<ns>.>`).
    pub fn all(&self) -> String {
        self.subject(">")
    }

    /// The least a connector needs: receive requests, push reports and hellos, answer requests.
    pub fn connector_permissions(&self) -> NatsPermissions {
        NatsPermissions {
            publish: vec![self.status(), self.hello()],
            subscribe: vec![self.apply(), self.teardown(), self.preview()],
            allow_responses: true,
        }
    }

    /// The operation a subject names: its last token (`apply`, `teardown`, `status`, `hello`).
    pub fn operation_of(subject: &str) -> &str {
        subject.rsplit('.').next().unwrap_or(subject)
    }

    /// The HostedCluster UID a subject under [`SUBJECT_PREFIX`] is bound to (`None`: not bound).
    pub fn cluster_uid_of(subject: &str) -> Option<&str> {
        let rest = subject.strip_prefix(SUBJECT_PREFIX)?.strip_prefix('.')?;
        let token = rest.split('.').next()?;
        token.split_once('_').map(|(_, uid)| uid)
    }

    /// The HCP namespace of a subject under [`SUBJECT_PREFIX`], if it is one (bound or not).
    pub fn namespace_of(subject: &str) -> Option<&str> {
        let rest = subject.strip_prefix(SUBJECT_PREFIX)?.strip_prefix('.')?;
        let token = rest.split('.').next()?;
        token.split('_').next().filter(|ns| !ns.is_empty())
    }
}

/// Which ObjectSetPhase (in the management cluster) a message is about. `generation` orders requests: a
/// connector ignores a request older than one it already applied.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PhaseRef {
    /// Namespace of the ObjectSetPhase (the HCP namespace).
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub generation: i64,
}

/// Apply a phase in the hosted cluster and report on it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApplyPhase {
    pub version: u32,
    pub phase: PhaseRef,
    /// Revision of the owning ObjectSet (the objects' revision annotation).
    pub revision: i64,
    /// The phase's objects, slices inlined.
    #[serde(default)]
    pub objects: Vec<ObjectSetObject>,
    /// Objects the phase observes and probes but never writes.
    #[serde(default)]
    pub external_objects: Vec<ObjectSetObject>,
    /// The owning set's availability probes.
    #[serde(default)]
    pub availability_probes: Vec<ObjectSetProbe>,
    /// UIDs of the previous revisions' ObjectSetPhases for this phase: hosted objects they control may be
    /// adopted under collision protection `Prevent`.
    #[serde(default)]
    pub previous_uids: Vec<String>,
    /// Paused: report, but change nothing.
    #[serde(default)]
    pub paused: bool,
}

/// Tear a phase down in the hosted cluster: delete the objects it still controls. The objects travel
/// with the request, so a connector that restarted (and kept no state) can still do it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TeardownPhase {
    pub version: u32,
    pub phase: PhaseRef,
    #[serde(default)]
    pub objects: Vec<ObjectSetObject>,
}

/// Dry-run these objects in the hosted cluster (`dryRun=All`) and say what its apiserver thinks of
/// each: a release's preflight. Nothing is written.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreviewObjects {
    pub version: u32,
    /// The HCP namespace the connector serves.
    pub namespace: String,
    /// The objects the release creates or changes there.
    #[serde(default)]
    pub objects: Vec<Value>,
}

/// The verdicts of a [`PreviewObjects`], one per object in its order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreviewReport {
    pub version: u32,
    pub verdicts: Vec<PreviewVerdict>,
}

/// What the hosted cluster's apiserver said of one object's dry run.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreviewVerdict {
    pub outcome: PreviewOutcome,
    /// The refusal, or why it was not checked.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum PreviewOutcome {
    #[default]
    Accepted,
    Refused,
    Unchecked,
}

/// Where a phase stands in the hosted cluster.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum PhaseOutcome {
    /// Applied and every probe passes.
    Available,
    /// Applied; some probe does not pass yet (the message says which).
    #[default]
    ProbeFailure,
    /// Applied; probes fail only because the objects' status is not yet written for their generation.
    AwaitingStatus,
    /// An object is owned by someone the collision protection does not allow adopting from.
    CollisionDetected,
    /// A newer revision's phase controls some of the objects now (handover).
    HandedOver,
    /// The phase was refused before any write (unknown kind, bad namespace, ...).
    PreflightError,
    /// Teardown is deleting objects.
    TeardownInProgress,
    /// Teardown finished: nothing of the phase is left.
    TornDown,
}

/// A connector's report on one phase: the reply to a request, or pushed when hosted objects change.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PhaseReport {
    pub version: u32,
    pub phase: PhaseRef,
    pub outcome: PhaseOutcome,
    /// Human-readable detail in pko's condition message style.
    #[serde(default)]
    pub message: String,
    /// The hosted objects the phase controls.
    #[serde(default)]
    pub controller_of: Vec<ControlledObjectReference>,
    /// Conditions copied from hosted objects through their conditionMappings (`domain/Type`).
    #[serde(default)]
    pub mapped_conditions: Vec<MappedCondition>,
}

/// A condition copied from a hosted object, for the ObjectSetPhase and the objects above it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MappedCondition {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: bool,
    pub reason: String,
    #[serde(default)]
    pub message: String,
}

/// Sent by a connector on every (re)connect; the manager answers by re-sending the desired phases.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Hello {
    pub version: u32,
    /// The HCP namespace the connector serves.
    pub namespace: String,
    /// Identifies this connector process (pod name and start), to tell restarts apart.
    pub connector: String,
}

/// Why a request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ErrorCode {
    Malformed,
    TooLarge,
    UnsupportedVersion,
    /// The request names a namespace other than the connector's.
    WrongNamespace,
    /// The connector could not carry out the request (hosted apiserver unreachable, ...); retry.
    Unavailable,
}

/// The reply to a request that could not be served.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ErrorReply {
    pub version: u32,
    pub code: ErrorCode,
    pub message: String,
}

/// The answer to a request: the message asked for, or the reason it was refused.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum Reply<T> {
    /// Tried first: a refusal has `code`, which no answer has.
    Refused(ErrorReply),
    Answer(T),
}

impl ErrorReply {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            version: WIRE_VERSION,
            code,
            message: message.into(),
        }
    }
}

/// Serializes a message, refusing one over [`MAX_MESSAGE_BYTES`].
pub fn encode<T: Serialize>(message: &T) -> Result<Vec<u8>, WireError> {
    let bytes = serde_json::to_vec(message).map_err(|e| WireError::Malformed(e.to_string()))?;
    if bytes.len() > MAX_MESSAGE_BYTES {
        return Err(WireError::TooLarge { size: bytes.len() });
    }
    Ok(bytes)
}

/// Parses a message: size, JSON, then `version` (present, at least 1, not newer than ours).
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, WireError> {
    if bytes.len() > MAX_MESSAGE_BYTES {
        return Err(WireError::TooLarge { size: bytes.len() });
    }
    let value: Value =
        serde_json::from_slice(bytes).map_err(|e| WireError::Malformed(e.to_string()))?;
    match value.get("version").and_then(Value::as_u64) {
        None | Some(0) => {
            return Err(WireError::Malformed(
                "missing or invalid \"version\"".to_owned(),
            ))
        }
        Some(v) if v > u64::from(WIRE_VERSION) => {
            return Err(WireError::UnsupportedVersion { got: v })
        }
        Some(_) => {}
    }
    serde_json::from_value(value).map_err(|e| WireError::Malformed(e.to_string()))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn phase() -> PhaseRef {
        PhaseRef {
            namespace: "clusters-hosted-0".to_owned(),
            name: "pkg-abc-remote".to_owned(),
            uid: "u-1".to_owned(),
            generation: 3,
        }
    }

    #[test]
    fn subjects_are_per_namespace_and_permissions_minimal() {
        let s = HostedClusterSubjects::new("clusters-hosted-0").unwrap();
        assert_eq!(s.apply(), "pko.v1.hc.clusters-hosted-0.phase.apply");
        assert_eq!(s.teardown(), "pko.v1.hc.clusters-hosted-0.phase.teardown");
        assert_eq!(s.preview(), "pko.v1.hc.clusters-hosted-0.phase.preview");
        assert_eq!(s.status(), "pko.v1.hc.clusters-hosted-0.phase.status");
        assert_eq!(s.hello(), "pko.v1.hc.clusters-hosted-0.hello");
        assert_eq!(s.all(), "pko.v1.hc.clusters-hosted-0.>");
        let p = s.connector_permissions();
        assert_eq!(p.subscribe, vec![s.apply(), s.teardown(), s.preview()]);
        assert_eq!(p.publish, vec![s.status(), s.hello()]);
        assert!(p.allow_responses);
        assert_eq!(
            HostedClusterSubjects::namespace_of(&s.status()),
            Some("clusters-hosted-0")
        );
        assert_eq!(HostedClusterSubjects::operation_of(&s.apply()), "apply");
        assert_eq!(HostedClusterSubjects::operation_of(&s.hello()), "hello");
        let bound = s.clone().bound_to("0a1b-2c3d").unwrap();
        assert_eq!(
            bound.apply(),
            "pko.v1.hc.clusters-hosted-0_0a1b-2c3d.phase.apply"
        );
        assert_eq!(bound.namespace(), "clusters-hosted-0");
        assert_eq!(
            HostedClusterSubjects::namespace_of(&bound.hello()),
            Some("clusters-hosted-0")
        );
        assert_eq!(
            HostedClusterSubjects::cluster_uid_of(&bound.hello()),
            Some("0a1b-2c3d")
        );
        assert_eq!(HostedClusterSubjects::cluster_uid_of(&s.hello()), None);
        assert_ne!(
            bound.connector_permissions(),
            s.clone()
                .bound_to("another")
                .unwrap()
                .connector_permissions()
        );
        assert_eq!(
            HostedClusterSubjects::of("clusters-hosted-0", Some("0a1b-2c3d")).unwrap(),
            bound
        );
        assert_eq!(
            HostedClusterSubjects::of("clusters-hosted-0", None).unwrap(),
            s
        );
        assert!(s.bound_to("a.b").is_err());
        assert_eq!(HostedClusterSubjects::namespace_of("other.subject"), None);
    }

    #[test]
    fn namespaces_that_would_break_subjects_are_refused() {
        for bad in [
            "",
            "a.b",
            "a*",
            "a>",
            "A",
            "-a",
            "a-",
            "a b",
            &"x".repeat(64),
        ] {
            assert!(HostedClusterSubjects::new(bad).is_err(), "{bad:?}");
        }
        let err = HostedClusterSubjects::new("a.b").unwrap_err();
        assert_eq!(err.code(), ErrorCode::WrongNamespace);
    }

    #[test]
    fn replies_tell_answers_from_refusals() {
        let refusal = ErrorReply::new(ErrorCode::WrongNamespace, "not mine");
        let report = PhaseReport {
            version: WIRE_VERSION,
            phase: phase(),
            outcome: PhaseOutcome::Available,
            message: String::new(),
            controller_of: Vec::new(),
            mapped_conditions: Vec::new(),
        };
        assert_eq!(
            decode::<Reply<PhaseReport>>(&encode(&refusal).unwrap()).unwrap(),
            Reply::Refused(refusal)
        );
        assert_eq!(
            decode::<Reply<PhaseReport>>(&encode(&report).unwrap()).unwrap(),
            Reply::Answer(report)
        );
    }

    #[test]
    fn messages_round_trip() {
        let apply = ApplyPhase {
            version: WIRE_VERSION,
            phase: phase(),
            revision: 2,
            objects: vec![ObjectSetObject {
                object: json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "app"}}),
                ..Default::default()
            }],
            external_objects: Vec::new(),
            availability_probes: Vec::new(),
            previous_uids: vec!["uid-of-pkg-old-remote".to_owned()],
            paused: false,
        };
        assert_eq!(
            decode::<ApplyPhase>(&encode(&apply).unwrap()).unwrap(),
            apply
        );
        let report = PhaseReport {
            version: WIRE_VERSION,
            phase: phase(),
            outcome: PhaseOutcome::CollisionDetected,
            message: "core Namespace app: controlled by someone else".to_owned(),
            controller_of: Vec::new(),
            mapped_conditions: Vec::new(),
        };
        assert_eq!(
            decode::<PhaseReport>(&encode(&report).unwrap()).unwrap(),
            report
        );
        let teardown = TeardownPhase {
            version: 1,
            phase: phase(),
            objects: apply.objects.clone(),
        };
        assert_eq!(
            decode::<TeardownPhase>(&encode(&teardown).unwrap()).unwrap(),
            teardown
        );
        let hello = Hello {
            version: 1,
            namespace: "clusters-hosted-0".to_owned(),
            connector: "c-1".to_owned(),
        };
        assert_eq!(decode::<Hello>(&encode(&hello).unwrap()).unwrap(), hello);
        let error = ErrorReply::new(ErrorCode::Unavailable, "hosted apiserver unreachable");
        assert_eq!(
            decode::<ErrorReply>(&encode(&error).unwrap()).unwrap(),
            error
        );
    }

    /// Version-1 messages as first written: optional fields absent, and fields a later version adds are
    /// ignored by this one.
    #[test]
    fn minimal_and_future_field_messages_decode() {
        let minimal = br#"{"version":1,"phase":{"namespace":"ns","name":"p","uid":"u","generation":1},"revision":1}"#;
        let apply: ApplyPhase = decode(minimal).unwrap();
        assert!(apply.objects.is_empty() && !apply.paused);
        let extra = br#"{"version":1,"phase":{"namespace":"ns","name":"p","uid":"u","generation":1},"outcome":"Available","addedLater":{"x":1}}"#;
        let report: PhaseReport = decode(extra).unwrap();
        assert_eq!(report.outcome, PhaseOutcome::Available);
    }

    proptest::proptest! {
        /// Any bytes give a message or an error, never a panic; any report survives a round trip.
        #[test]
        fn decoding_is_total_and_round_trips(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..256),
            message in ".{0,64}",
            generation in proptest::prelude::any::<i64>(),
        ) {
            let _ = decode::<ApplyPhase>(&bytes);
            let report = PhaseReport {
                version: WIRE_VERSION,
                phase: PhaseRef { generation, ..phase() },
                outcome: PhaseOutcome::ProbeFailure,
                message,
                controller_of: Vec::new(),
                mapped_conditions: Vec::new(),
            };
            proptest::prop_assert_eq!(decode::<PhaseReport>(&encode(&report).unwrap()).unwrap(), report);
        }
    }

    #[test]
    fn malformed_oversized_and_newer_messages_are_rejected() {
        assert!(matches!(
            decode::<Hello>(b"{not json"),
            Err(WireError::Malformed(_))
        ));
        assert!(matches!(
            decode::<Hello>(br#"{"namespace":"x"}"#),
            Err(WireError::Malformed(_))
        ));
        assert!(matches!(
            decode::<Hello>(br#"{"version":0}"#),
            Err(WireError::Malformed(_))
        ));
        assert_eq!(
            decode::<Hello>(br#"{"version":2,"namespace":"x","connector":"c"}"#).unwrap_err(),
            WireError::UnsupportedVersion { got: 2 }
        );
        assert!(matches!(
            decode::<PhaseReport>(br#"{"version":1,"phase":{},"outcome":"Exploded"}"#),
            Err(WireError::Malformed(_))
        ));
        let huge = vec![b' '; MAX_MESSAGE_BYTES + 1];
        assert_eq!(
            decode::<Hello>(&huge).unwrap_err().code(),
            ErrorCode::TooLarge
        );
        let big = ApplyPhase {
            version: 1,
            objects: vec![ObjectSetObject {
                object: json!({"data": "x".repeat(MAX_MESSAGE_BYTES)}),
                ..Default::default()
            }],
            ..Default::default()
        };
        assert!(matches!(encode(&big), Err(WireError::TooLarge { .. })));
    }
}
