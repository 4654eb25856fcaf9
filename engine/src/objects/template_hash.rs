//! The ObjectDeployment template hash: names each revision's ObjectSet (`<deployment>-<hash>`) and changes
//! with the template or the collision count, never with field order.

use pko_package::canonical_hash::CanonicalHasher;
use pko_proto::core::common::ObjectSetTemplate;
use serde_json::Value;

/// Characters Kubernetes uses for generated name suffixes: no vowels (no accidental words), no look-alikes.
const SAFE_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

/// Hash of a template and collision count, as a DNS-safe string.
pub fn template_hash(template: &ObjectSetTemplate, collision_count: i32) -> String {
    let value = serde_json::to_value(template).unwrap_or(Value::Null);
    let mut hasher = CanonicalHasher::default();
    hasher.write_value(&value);
    hasher.write(&collision_count.to_le_bytes());
    encode(hasher.finish())
}

fn encode(mut n: u64) -> String {
    let base = SAFE_ALPHABET.len() as u64;
    let mut out = String::with_capacity(10);
    for _ in 0..10 {
        out.push(char::from(SAFE_ALPHABET[(n % base) as usize]));
        n /= base;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use pko_proto::core::common::{ObjectSetObject, ObjectSetTemplatePhase};
    use proptest::prelude::*;
    use serde_json::json;

    fn template(name: &str) -> ObjectSetTemplate {
        let mut t = ObjectSetTemplate::default();
        t.spec.phases.push(ObjectSetTemplatePhase {
            name: name.to_owned(),
            objects: vec![ObjectSetObject {
                object: json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}, "data": {"x": "1", "y": "2"}}),
                ..Default::default()
            }],
            ..Default::default()
        });
        t
    }

    #[test]
    fn key_order_does_not_matter() {
        let a = template("p");
        let mut b = template("p");
        b.spec.phases[0].objects[0].object = json!({"data": {"y": "2", "x": "1"}, "metadata": {"name": "a"}, "kind": "ConfigMap", "apiVersion": "v1"});
        assert_eq!(template_hash(&a, 0), template_hash(&b, 0));
    }

    proptest! {
        #[test]
        fn hash_is_dns_safe_and_sensitive(name in "[a-z]{1,12}", other in "[a-z]{1,12}", count in 0i32..50) {
            let h = template_hash(&template(&name), count);
            prop_assert_eq!(h.len(), 10);
            prop_assert!(h.bytes().all(|b| SAFE_ALPHABET.contains(&b)));
            prop_assert_ne!(&h, &template_hash(&template(&name), count + 1));
            if name != other {
                prop_assert_ne!(&h, &template_hash(&template(&other), count));
            }
        }
    }
}
