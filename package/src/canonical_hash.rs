//! Order-independent hashes of JSON values: a 64-bit one (ObjectDeployment template hashes, the names of
//! package slices, the "last applied" memory of phases) and a SHA-256 digest where equal digests must mean
//! equal content even against crafted input (an ObjectDeployment telling its own revision from a set that
//! took its name). Both feed the same canonical encoding. Pure.

use serde_json::Value;
use sha2::{Digest, Sha256};

/// Bytes (a digest, or the first bytes of one) as lowercase hex, as digests are written in names,
/// annotations and reports.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// What a canonical encoding is fed to.
trait CanonicalSink {
    fn write(&mut self, bytes: &[u8]);
}

/// SHA-256 of the canonical encoding of a JSON value: equal for equal values whatever their field order.
pub fn value_digest(value: &Value) -> [u8; 32] {
    let mut sink = Sha256Sink(Sha256::new());
    write_canonical(value, &mut sink);
    sink.0.finalize().into()
}

struct Sha256Sink(Sha256);

impl CanonicalSink for Sha256Sink {
    fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }
}

/// Order-independent 64-bit hash of a JSON value (remembers what was last applied without keeping it).
pub fn value_hash(value: &Value) -> u64 {
    let mut hasher = CanonicalHasher::default();
    hasher.write_value(value);
    hasher.finish()
}

/// FNV-1a over a canonical encoding of JSON (object keys sorted), so equal values hash equal whatever
/// their field order.
#[derive(Clone, Copy)]
pub struct CanonicalHasher(u64);

impl Default for CanonicalHasher {
    fn default() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }
}

impl CanonicalHasher {
    /// Feeds raw bytes.
    pub fn write(&mut self, bytes: &[u8]) {
        CanonicalSink::write(self, bytes);
    }

    /// Feeds a JSON value canonically.
    pub fn write_value(&mut self, value: &Value) {
        write_canonical(value, self);
    }

    /// The hash of everything fed so far.
    pub fn finish(&self) -> u64 {
        self.0
    }
}

impl CanonicalSink for CanonicalHasher {
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }
}

/// Feeds a JSON value with object keys sorted, so the hash ignores key order.
fn write_canonical(value: &Value, h: &mut impl CanonicalSink) {
    match value {
        Value::Null => h.write(b"n"),
        Value::Bool(b) => h.write(if *b { b"t" } else { b"f" }),
        Value::Number(n) => {
            h.write(b"#");
            h.write(n.to_string().as_bytes());
        }
        Value::String(s) => {
            h.write(b"\"");
            h.write(&(s.len() as u64).to_le_bytes());
            h.write(s.as_bytes());
        }
        Value::Array(items) => {
            h.write(b"[");
            h.write(&(items.len() as u64).to_le_bytes());
            items.iter().for_each(|i| write_canonical(i, h));
        }
        Value::Object(map) => {
            h.write(b"{");
            h.write(&(map.len() as u64).to_le_bytes());
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            for k in keys {
                write_canonical(&Value::String(k.clone()), h);
                write_canonical(&map[k], h);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_digest_ignores_field_order_but_not_content() {
        let a = json!({"a": 1, "b": {"x": [1, "y"], "z": null}});
        let b = json!({"b": {"z": null, "x": [1, "y"]}, "a": 1});
        assert_eq!(value_digest(&a), value_digest(&b));
        assert_ne!(
            value_digest(&a),
            value_digest(&json!({"a": 1, "b": {"x": [1, "y"]}}))
        );
        assert_ne!(
            value_digest(&json!(["ab", "c"])),
            value_digest(&json!(["a", "bc"]))
        );
    }

    #[test]
    fn field_order_does_not_matter_but_content_does() {
        let a = json!({"a": 1, "b": [1, "x", null, true]});
        let b = json!({"b": [1, "x", null, true], "a": 1});
        assert_eq!(value_hash(&a), value_hash(&b));
        assert_ne!(
            value_hash(&a),
            value_hash(&json!({"a": 2, "b": [1, "x", null, true]}))
        );
        assert_ne!(
            value_hash(&json!(["ab", "c"])),
            value_hash(&json!(["a", "bc"]))
        );
    }
}
