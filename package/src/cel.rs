//! Evaluating compiled CEL programs over JSON with Kubernetes' typing; shared by availability probes,
//! package filtering (`condition` of phases and objects) and the `cel` template function. Pure.

use std::collections::HashMap;
use std::sync::Arc;

use kube_cel::cel::{self, objects::Key, Context, Program, Value as CelValue};
use kube_cel::KubeCelExt;
use serde_json::Value;

/// Evaluates a compiled boolean CEL expression with the given JSON values bound as variables.
pub fn evaluate_cel_with<'a>(
    program: &Program,
    variables: impl IntoIterator<Item = (&'a str, &'a Value)>,
) -> Result<bool, String> {
    let mut context = Context::default().with_all();
    for (name, value) in variables {
        context.add_variable_from_value(name, json_to_cel(value));
    }
    match program.execute(&context) {
        Ok(CelValue::Bool(b)) => Ok(b),
        Ok(other) => Err(format!("rule returned {other:?}, not a bool")),
        Err(e) => Err(e.to_string()),
    }
}

/// Converts JSON to a CEL value with Kubernetes' typing: integers are `int` (not `uint`), so
/// `self.spec.replicas == 3` holds for `replicas: 3`.
pub fn json_to_cel(value: &Value) -> CelValue {
    match value {
        Value::Null => CelValue::Null,
        Value::Bool(b) => CelValue::Bool(*b),
        Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => CelValue::Int(i),
            (None, Some(u), _) => CelValue::UInt(u),
            (_, _, Some(f)) => CelValue::Float(f),
            _ => CelValue::Null,
        },
        Value::String(s) => CelValue::String(Arc::new(s.clone())),
        Value::Array(items) => CelValue::List(Arc::new(items.iter().map(json_to_cel).collect())),
        Value::Object(map) => {
            let entries: HashMap<Key, CelValue> = map
                .iter()
                .map(|(k, v)| (Key::String(Arc::new(k.clone())), json_to_cel(v)))
                .collect();
            CelValue::Map(cel::objects::Map {
                map: Arc::new(entries),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    proptest! {
        /// JSON integers compare as CEL ints whatever their size within i64.
        #[test]
        fn any_i64_round_trips_as_int(n in any::<i64>()) {
            prop_assert_eq!(json_to_cel(&json!(n)), CelValue::Int(n));
        }
    }
}
