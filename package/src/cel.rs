//! Compiling CEL rules within a cost budget and evaluating them over JSON with Kubernetes' typing; shared
//! by availability probes, package filtering (`condition` of phases and objects) and the `cel` template
//! function. Pure.
//!
//! The interpreter has no runtime cost limit, so the budget bounds what makes a rule expensive before it
//! runs: its length (parsing), how deeply its comprehensions (`all`, `exists`, `exists_one`, `map`,
//! `filter`) nest, and, before each evaluation, the steps those comprehensions can take over the input:
//! the widest list or map in it raised to the nesting depth (Kubernetes estimates CEL cost the same way,
//! from sizes). A rule over budget is an error naming the limit, never a stalled thread.

use std::collections::HashMap;
use std::sync::Arc;

use kube_cel::cel::common::ast::Expr;
use kube_cel::cel::{self, objects::Key, Context, IdedExpr, Program, Value as CelValue};
use kube_cel::KubeCelExt;
use serde_json::Value;

/// The longest CEL rule compiled.
pub const MAX_RULE_BYTES: usize = 4096;
/// How deeply comprehensions may nest in a rule.
pub const MAX_COMPREHENSION_DEPTH: usize = 2;
/// The comprehension steps one evaluation may take (widest collection ^ nesting depth).
pub const MAX_EVALUATION_STEPS: u64 = 1_000_000;

/// A compiled rule within the compile-time budget, with the nesting depth its evaluations are costed by.
#[derive(Debug)]
pub struct CelRule {
    program: Program,
    depth: usize,
}

/// Compiles `rule` if it is within the budget; the error says which limit it breaks, or why it does not
/// parse.
pub fn compile_bounded(rule: &str) -> Result<CelRule, String> {
    if rule.len() > MAX_RULE_BYTES {
        return Err(format!(
            "rule of {} bytes is longer than the limit of {MAX_RULE_BYTES} bytes",
            rule.len()
        ));
    }
    let program = Program::compile(rule).map_err(|e| e.to_string().trim().to_owned())?;
    let depth = comprehension_depth(program.expression());
    if depth > MAX_COMPREHENSION_DEPTH {
        return Err(format!(
            "comprehensions (all, exists, map, filter) nest {depth} deep, more than the limit of \
             {MAX_COMPREHENSION_DEPTH}"
        ));
    }
    Ok(CelRule { program, depth })
}

/// The most items of any list or map in `value`.
fn widest_collection(value: &Value) -> u64 {
    match value {
        Value::Array(items) => items
            .iter()
            .map(widest_collection)
            .fold(items.len() as u64, u64::max),
        Value::Object(map) => map
            .values()
            .map(widest_collection)
            .fold(map.len() as u64, u64::max),
        _ => 0,
    }
}

/// How deeply comprehensions nest in `expr`.
fn comprehension_depth(expr: &IdedExpr) -> usize {
    let deepest = |exprs: &mut dyn Iterator<Item = &IdedExpr>| {
        exprs.map(comprehension_depth).max().unwrap_or(0)
    };
    match &expr.expr {
        Expr::Comprehension(c) => {
            let range = comprehension_depth(&c.iter_range);
            let body =
                deepest(&mut [&c.accu_init, &c.loop_cond, &c.loop_step, &c.result].into_iter());
            range.max(body + 1)
        }
        Expr::Call(call) => deepest(&mut call.target.iter().map(|t| &**t).chain(&call.args)),
        Expr::List(list) => deepest(&mut list.elements.iter()),
        Expr::Map(map) => deepest(&mut map.entries.iter().flat_map(entry_exprs)),
        Expr::Struct(object) => deepest(&mut object.entries.iter().flat_map(entry_exprs)),
        Expr::Select(select) => comprehension_depth(&select.operand),
        Expr::Ident(_) | Expr::Literal(_) | Expr::Unspecified => 0,
    }
}

fn entry_exprs(entry: &cel::common::ast::IdedEntryExpr) -> Vec<&IdedExpr> {
    use cel::common::ast::EntryExpr;
    match &entry.expr {
        EntryExpr::StructField(field) => vec![&field.value],
        EntryExpr::MapEntry(map_entry) => vec![&map_entry.key, &map_entry.value],
    }
}

/// Evaluates a compiled boolean CEL rule with the given JSON values bound as variables, if its
/// comprehensions stay within [`MAX_EVALUATION_STEPS`] over them.
pub fn evaluate_cel_with<'a>(
    rule: &CelRule,
    variables: impl IntoIterator<Item = (&'a str, &'a Value)>,
) -> Result<bool, String> {
    let variables: Vec<(&str, &Value)> = variables.into_iter().collect();
    if rule.depth > 0 {
        let widest = variables
            .iter()
            .map(|(_, v)| widest_collection(v))
            .max()
            .unwrap_or(0);
        let steps = widest.saturating_pow(u32::try_from(rule.depth).unwrap_or(u32::MAX));
        if steps > MAX_EVALUATION_STEPS {
            return Err(format!(
                "over the evaluation budget: comprehensions {} deep over a collection of {widest} items \
                 take up to {steps} steps, more than the limit of {MAX_EVALUATION_STEPS}",
                rule.depth
            ));
        }
    }
    let mut context = Context::default().with_all();
    for (name, value) in variables {
        context.add_variable_from_value(name, json_to_cel(value));
    }
    match rule.program.execute(&context) {
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

    #[test]
    fn rules_over_the_budget_are_refused_by_name() {
        assert!(compile_bounded("self.a.all(x, self.b.exists(y, x == y))").is_ok());
        let three = "self.a.all(x, self.a.all(y, self.a.all(z, x + y == z)))";
        assert_eq!(
            compile_bounded(three).err().unwrap(),
            "comprehensions (all, exists, map, filter) nest 3 deep, more than the limit of 2"
        );
        // Nesting counts wherever it hides: in a call's argument, a list, a map value.
        assert!(compile_bounded(
            "size([self.a.map(x, self.a.filter(y, self.a.exists(z, z)))]) > 0"
        )
        .is_err());
        // Chained (not nested) comprehensions are one level each.
        assert!(compile_bounded("self.a.map(x, x).filter(y, y > 1).all(z, z < 9)").is_ok());
        let long = format!("{} == 1", "1 + ".repeat(2000));
        assert!(compile_bounded(&long)
            .err()
            .unwrap()
            .contains("longer than the limit of 4096 bytes"));
        assert!(compile_bounded("self.(").is_err());
    }

    #[test]
    fn evaluations_over_the_step_budget_are_refused_before_they_run() {
        let pairs = compile_bounded("self.a.all(x, self.a.exists(y, x == y))").unwrap();
        let small = serde_json::json!({"a": (0..1000).collect::<Vec<_>>()});
        assert_eq!(evaluate_cel_with(&pairs, [("self", &small)]), Ok(true));
        let wide = serde_json::json!({"a": (0..1001).collect::<Vec<_>>()});
        let refused = evaluate_cel_with(&pairs, [("self", &wide)]).unwrap_err();
        assert_eq!(
            refused,
            "over the evaluation budget: comprehensions 2 deep over a collection of 1001 items take \
             up to 1002001 steps, more than the limit of 1000000"
        );
        // Without comprehensions the width does not matter.
        let plain = compile_bounded("size(self.a) > 3").unwrap();
        assert_eq!(evaluate_cel_with(&plain, [("self", &wide)]), Ok(true));
    }

    proptest! {
        /// JSON integers compare as CEL ints whatever their size within i64.
        #[test]
        fn any_i64_round_trips_as_int(n in any::<i64>()) {
            prop_assert_eq!(json_to_cel(&json!(n)), CelValue::Int(n));
        }
    }
}
