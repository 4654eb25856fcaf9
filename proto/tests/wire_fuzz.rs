//! Fuzzing the connector wire decoder by property (issue 17, item 8): any bytes a NATS subject carries,
//! including truncated and altered valid messages, decode to a message or an error, never a panic. A
//! bounded number of cases per run keeps CI time fixed.
#![allow(clippy::unwrap_used)]

use pko_proto::connector_wire::{decode, encode, ApplyPhase, PhaseReport, Reply, TeardownPhase};
use proptest::prelude::*;

fn valid_apply() -> Vec<u8> {
    let apply: ApplyPhase = serde_json::from_value(serde_json::json!({
        "version": 1,
        "phase": {"namespace": "clusters-a", "name": "p", "uid": "u", "generation": 1},
        "revision": 1,
        "objects": [{"object": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}}],
    }))
    .unwrap();
    encode(&apply).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn arbitrary_bytes_decode_or_fail(bytes in prop::collection::vec(any::<u8>(), 0..2048)) {
        let _ = decode::<ApplyPhase>(&bytes);
        let _ = decode::<TeardownPhase>(&bytes);
        let _ = decode::<Reply<PhaseReport>>(&bytes);
    }

    #[test]
    fn altered_valid_messages_decode_or_fail(cut in 0usize..400, flips in prop::collection::vec((0usize..400, any::<u8>()), 0..8)) {
        let mut bytes = valid_apply();
        for (at, value) in flips {
            if let Some(b) = bytes.get_mut(at) {
                *b = value;
            }
        }
        bytes.truncate(cut.max(1).min(bytes.len()));
        let _ = decode::<ApplyPhase>(&bytes);
    }
}
