//! More of the Sprig library Package Operator packages use: integer arithmetic, string shaping, list and
//! dict helpers, regular expressions, hashing. Like the rest of `template_funcs.rs`, every function is
//! deterministic: nothing here reads the clock, randomness or the environment.
//!
//! Values go through JSON: lists and dicts are small, and JSON keeps the code plain.

use std::collections::BTreeMap;
use std::sync::Arc;

use gotmpl::{FuncMap, Value};
use serde_json::Value as Json;
use sha2::{Digest, Sha256};

use super::template_values::{arg, display, fail, from_json, is_empty, string_arg, to_json};
use crate::canonical_hash::hex;
use crate::render_budget::check_text;

type Result<T> = std::result::Result<T, gotmpl::TemplateError>;

fn int(name: &str, value: &Value) -> Result<i64> {
    match value {
        Value::Int(i) => Ok(*i),
        Value::Uint(u) => i64::try_from(*u).map_err(|e| fail(name, e)),
        Value::Float(f) => Ok(*f as i64),
        Value::Bool(b) => Ok(i64::from(*b)),
        Value::Nil => Ok(0),
        other => display(other)
            .trim()
            .parse()
            .map_err(|_| fail(name, format!("{:?} is not an integer", display(other)))),
    }
}

fn checked_fold(
    name: &str,
    values: &[i64],
    start: i64,
    op: fn(i64, i64) -> Option<i64>,
) -> Result<Value> {
    values
        .iter()
        .try_fold(start, |acc, v| op(acc, *v))
        .map(Value::Int)
        .ok_or_else(|| fail(name, "integer overflow"))
}

fn ints(name: &str, args: &[Value]) -> Result<Vec<i64>> {
    args.iter().map(|a| int(name, a)).collect()
}

fn list(name: &str, value: &Value) -> Result<Vec<Json>> {
    match to_json(value) {
        Json::Array(items) => Ok(items),
        Json::Null => Ok(Vec::new()),
        other => Err(fail(name, format!("{other} is not a list"))),
    }
}

fn dict(name: &str, value: &Value) -> Result<serde_json::Map<String, Json>> {
    match to_json(value) {
        Json::Object(map) => Ok(map),
        Json::Null => Ok(serde_json::Map::new()),
        other => Err(fail(name, format!("{other} is not a dict"))),
    }
}

fn words(s: &str) -> Vec<String> {
    // Split on separators and on lower→upper boundaries: "fooBar-baz qux" → foo, bar, baz, qux.
    let mut words = Vec::new();
    let mut current = String::new();
    let mut previous_lower = false;
    for c in s.chars() {
        if !c.is_alphanumeric() {
            if !current.is_empty() {
                words.push(std::mem::take(&mut current));
            }
            previous_lower = false;
            continue;
        }
        if c.is_uppercase() && previous_lower && !current.is_empty() {
            words.push(std::mem::take(&mut current));
        }
        previous_lower = c.is_lowercase() || c.is_ascii_digit();
        current.extend(c.to_lowercase());
    }
    if !current.is_empty() {
        words.push(current);
    }
    words
}

fn capitalize(word: &str) -> String {
    let mut chars = word.chars();
    chars
        .next()
        .map(|f| f.to_uppercase().chain(chars).collect())
        .unwrap_or_default()
}

fn insert(
    map: &mut FuncMap,
    name: &'static str,
    f: impl Fn(&[Value]) -> Result<Value> + Send + Sync + 'static,
) {
    map.insert(name.into(), Arc::new(f));
}

/// Adds the functions to `map`.
pub fn register(map: &mut FuncMap) {
    integer_funcs(map);
    string_funcs(map);
    list_funcs(map);
    dict_funcs(map);
    control_funcs(map);
}

/// Integers and checked arithmetic.
fn integer_funcs(map: &mut FuncMap) {
    insert(map, "int", |a| {
        Ok(Value::Int(int("int", arg("int", a, 0)?)?))
    });
    insert(map, "int64", |a| {
        Ok(Value::Int(int("int64", arg("int64", a, 0)?)?))
    });
    insert(map, "float64", |a| match arg("float64", a, 0)? {
        Value::Float(f) => Ok(Value::Float(*f)),
        other => display(other)
            .trim()
            .parse()
            .map(Value::Float)
            .map_err(|e| fail("float64", e)),
    });
    // Overflow is an error naming the function, never a wrapped or panicking result.
    insert(map, "add", |a| {
        checked_fold("add", &ints("add", a)?, 0, i64::checked_add)
    });
    insert(map, "add1", |a| {
        checked_fold(
            "add1",
            &[int("add1", arg("add1", a, 0)?)?, 1],
            0,
            i64::checked_add,
        )
    });
    insert(map, "mul", |a| {
        checked_fold("mul", &ints("mul", a)?, 1, i64::checked_mul)
    });
    insert(map, "sub", |a| {
        let (x, y) = (
            int("sub", arg("sub", a, 0)?)?,
            int("sub", arg("sub", a, 1)?)?,
        );
        x.checked_sub(y)
            .map(Value::Int)
            .ok_or_else(|| fail("sub", "integer overflow"))
    });
    insert(map, "div", |a| {
        let d = int("div", arg("div", a, 1)?)?;
        if d == 0 {
            return Err(fail("div", "division by zero"));
        }
        int("div", arg("div", a, 0)?)?
            .checked_div(d)
            .map(Value::Int)
            .ok_or_else(|| fail("div", "integer overflow"))
    });
    insert(map, "mod", |a| {
        let d = int("mod", arg("mod", a, 1)?)?;
        if d == 0 {
            return Err(fail("mod", "division by zero"));
        }
        int("mod", arg("mod", a, 0)?)?
            .checked_rem(d)
            .map(Value::Int)
            .ok_or_else(|| fail("mod", "integer overflow"))
    });
    insert(map, "max", |a| {
        ints("max", a)?
            .into_iter()
            .max()
            .map(Value::Int)
            .ok_or_else(|| fail("max", "no arguments"))
    });
    insert(map, "min", |a| {
        ints("min", a)?
            .into_iter()
            .min()
            .map(Value::Int)
            .ok_or_else(|| fail("min", "no arguments"))
    });
}

/// Strings.
fn string_funcs(map: &mut FuncMap) {
    insert(map, "title", |a| {
        let s = string_arg("title", a, 0)?;
        Ok(Value::from(
            s.split(' ').map(capitalize).collect::<Vec<_>>().join(" "),
        ))
    });
    insert(map, "repeat", |a| {
        let n = usize::try_from(int("repeat", arg("repeat", a, 0)?)?.max(0)).unwrap_or(usize::MAX);
        let s = string_arg("repeat", a, 1)?;
        // Checked before anything is allocated: `repeat 100000000000 "x"` must not reach the allocator.
        check_text("repeat", n.saturating_mul(s.len()))?;
        Ok(Value::from(s.repeat(n)))
    });
    insert(map, "substr", |a| {
        let chars: Vec<char> = string_arg("substr", a, 2)?.chars().collect();
        let start = int("substr", arg("substr", a, 0)?)?.clamp(0, chars.len() as i64) as usize;
        let end = match int("substr", arg("substr", a, 1)?)? {
            e if e < 0 => chars.len(),
            e => (e as usize).min(chars.len()),
        };
        Ok(Value::from(
            chars[start..end.max(start)].iter().collect::<String>(),
        ))
    });
    insert(map, "nospace", |a| {
        Ok(Value::from(
            string_arg("nospace", a, 0)?
                .split_whitespace()
                .collect::<String>(),
        ))
    });
    insert(map, "cat", |a| {
        Ok(Value::from(
            a.iter()
                .filter(|v| !matches!(v, Value::Nil))
                .map(display)
                .collect::<Vec<_>>()
                .join(" "),
        ))
    });
    insert(map, "trimAll", |a| {
        let cutset: Vec<char> = string_arg("trimAll", a, 0)?.chars().collect();
        Ok(Value::from(
            string_arg("trimAll", a, 1)?
                .trim_matches(cutset.as_slice())
                .to_owned(),
        ))
    });
    insert(map, "snakecase", |a| {
        Ok(Value::from(
            words(&string_arg("snakecase", a, 0)?).join("_"),
        ))
    });
    insert(map, "kebabcase", |a| {
        Ok(Value::from(
            words(&string_arg("kebabcase", a, 0)?).join("-"),
        ))
    });
    insert(map, "camelcase", |a| {
        Ok(Value::from(
            words(&string_arg("camelcase", a, 0)?)
                .iter()
                .map(|w| capitalize(w))
                .collect::<String>(),
        ))
    });
    insert(map, "sha256sum", |a| {
        let hash = Sha256::digest(string_arg("sha256sum", a, 0)?.as_bytes());
        Ok(Value::from(hex(&hash)))
    });
    insert(map, "regexMatch", |a| {
        let re = regex::Regex::new(&string_arg("regexMatch", a, 0)?)
            .map_err(|e| fail("regexMatch", e))?;
        Ok(Value::Bool(re.is_match(&string_arg("regexMatch", a, 1)?)))
    });
    insert(map, "regexReplaceAll", |a| {
        let re = regex::Regex::new(&string_arg("regexReplaceAll", a, 0)?)
            .map_err(|e| fail("regexReplaceAll", e))?;
        let text = string_arg("regexReplaceAll", a, 1)?;
        let replacement = string_arg("regexReplaceAll", a, 2)?;
        // Bound the result before building it: each match becomes the replacement, whose every `$`
        // reference expands to at most the match.
        let references = replacement.matches('$').count();
        let mut bound = text.len();
        for m in re.find_iter(&text) {
            bound = bound
                .saturating_add(replacement.len())
                .saturating_add(references.saturating_mul(m.len()));
            check_text("regexReplaceAll", bound)?;
        }
        Ok(Value::from(
            re.replace_all(&text, replacement.as_str()).into_owned(),
        ))
    });
    insert(map, "toPrettyJson", |a| {
        serde_json::to_string_pretty(&to_json(arg("toPrettyJson", a, 0)?))
            .map(Value::from)
            .map_err(|e| fail("toPrettyJson", e))
    });
    insert(map, "toStrings", |a| {
        let items = list("toStrings", arg("toStrings", a, 0)?)?;
        Ok(Value::from(
            items
                .iter()
                .map(|j| {
                    Value::from(match j {
                        Json::String(s) => s.clone(),
                        other => other.to_string(),
                    })
                })
                .collect::<Vec<_>>(),
        ))
    });
}

/// Lists.
fn list_funcs(map: &mut FuncMap) {
    insert(map, "first", |a| {
        from_json(
            "first",
            list("first", arg("first", a, 0)?)?
                .first()
                .unwrap_or(&Json::Null),
        )
    });
    insert(map, "last", |a| {
        from_json(
            "last",
            list("last", arg("last", a, 0)?)?
                .last()
                .unwrap_or(&Json::Null),
        )
    });
    insert(map, "rest", |a| {
        let items = list("rest", arg("rest", a, 0)?)?;
        from_json("rest", &Json::Array(items.into_iter().skip(1).collect()))
    });
    insert(map, "initial", |a| {
        let mut items = list("initial", arg("initial", a, 0)?)?;
        items.pop();
        from_json("initial", &Json::Array(items))
    });
    insert(map, "append", |a| {
        let mut items = list("append", arg("append", a, 0)?)?;
        items.push(to_json(arg("append", a, 1)?));
        from_json("append", &Json::Array(items))
    });
    insert(map, "prepend", |a| {
        let mut items = list("prepend", arg("prepend", a, 0)?)?;
        items.insert(0, to_json(arg("prepend", a, 1)?));
        from_json("prepend", &Json::Array(items))
    });
    insert(map, "concat", |a| {
        let mut all = Vec::new();
        for v in a {
            all.extend(list("concat", v)?);
        }
        from_json("concat", &Json::Array(all))
    });
    insert(map, "uniq", |a| {
        let mut out: Vec<Json> = Vec::new();
        for item in list("uniq", arg("uniq", a, 0)?)? {
            if !out.contains(&item) {
                out.push(item);
            }
        }
        from_json("uniq", &Json::Array(out))
    });
    insert(map, "has", |a| {
        let needle = to_json(arg("has", a, 0)?);
        Ok(Value::Bool(
            list("has", arg("has", a, 1)?)?.contains(&needle),
        ))
    });
    insert(map, "without", |a| {
        let drop: Vec<Json> = a.iter().skip(1).map(to_json).collect();
        let items = list("without", arg("without", a, 0)?)?;
        from_json(
            "without",
            &Json::Array(items.into_iter().filter(|i| !drop.contains(i)).collect()),
        )
    });
    insert(map, "compact", |a| {
        let items = list("compact", arg("compact", a, 0)?)?;
        let kept = items
            .into_iter()
            .filter(|i| !is_empty(&from_json("compact", i).unwrap_or(Value::Nil)))
            .collect();
        from_json("compact", &Json::Array(kept))
    });
    insert(map, "sortAlpha", |a| {
        let mut items: Vec<String> = list("sortAlpha", arg("sortAlpha", a, 0)?)?
            .into_iter()
            .map(|j| match j {
                Json::String(s) => s,
                other => other.to_string(),
            })
            .collect();
        items.sort();
        Ok(Value::from(
            items.into_iter().map(Value::from).collect::<Vec<_>>(),
        ))
    });
    insert(map, "reverse", |a| {
        let mut items = list("reverse", arg("reverse", a, 0)?)?;
        items.reverse();
        from_json("reverse", &Json::Array(items))
    });
    insert(map, "until", |a| {
        let n = int("until", arg("until", a, 0)?)?;
        if n > 100_000 {
            return Err(fail("until", "more than 100000 items"));
        }
        Ok(Value::from(
            (0..n.max(0)).map(Value::Int).collect::<Vec<_>>(),
        ))
    });
}

/// Dicts.
fn dict_funcs(map: &mut FuncMap) {
    insert(map, "get", |a| {
        let d = dict("get", arg("get", a, 0)?)?;
        d.get(&string_arg("get", a, 1)?)
            .map_or(Ok(Value::from("")), |v| from_json("get", v))
    });
    insert(map, "set", |a| {
        let mut d = dict("set", arg("set", a, 0)?)?;
        d.insert(string_arg("set", a, 1)?, to_json(arg("set", a, 2)?));
        from_json("set", &Json::Object(d))
    });
    insert(map, "unset", |a| {
        let mut d = dict("unset", arg("unset", a, 0)?)?;
        d.remove(&string_arg("unset", a, 1)?);
        from_json("unset", &Json::Object(d))
    });
    insert(map, "merge", |a| {
        // Earlier dicts win, recursively, as in Sprig.
        fn merge_into(dst: &mut serde_json::Map<String, Json>, src: serde_json::Map<String, Json>) {
            for (k, v) in src {
                match (dst.get_mut(&k), v) {
                    (Some(Json::Object(d)), Json::Object(s)) => merge_into(d, s),
                    (Some(_), _) => {}
                    (None, v) => {
                        dst.insert(k, v);
                    }
                }
            }
        }
        let mut out = dict("merge", arg("merge", a, 0)?)?;
        for src in &a[1..] {
            merge_into(&mut out, dict("merge", src)?);
        }
        from_json("merge", &Json::Object(out))
    });
    insert(map, "pick", |a| {
        let d = dict("pick", arg("pick", a, 0)?)?;
        let keys: Vec<String> = a.iter().skip(1).map(display).collect();
        from_json(
            "pick",
            &Json::Object(d.into_iter().filter(|(k, _)| keys.contains(k)).collect()),
        )
    });
    insert(map, "omit", |a| {
        let d = dict("omit", arg("omit", a, 0)?)?;
        let keys: Vec<String> = a.iter().skip(1).map(display).collect();
        from_json(
            "omit",
            &Json::Object(d.into_iter().filter(|(k, _)| !keys.contains(k)).collect()),
        )
    });
    insert(map, "values", |a| {
        let d: BTreeMap<String, Json> = dict("values", arg("values", a, 0)?)?.into_iter().collect();
        from_json("values", &Json::Array(d.into_values().collect()))
    });
    insert(map, "dig", |a| {
        // dig "a" "b" DEFAULT DICT
        if a.len() < 3 {
            return Err(fail("dig", "needs keys, a default and a dict"));
        }
        let (keys, rest) = a.split_at(a.len() - 2);
        let mut current = Json::Object(dict("dig", &rest[1])?);
        for key in keys {
            match current.get(display(key)) {
                Some(next) => current = next.clone(),
                None => return Ok(rest[0].clone()),
            }
        }
        from_json("dig", &current)
    });
}

/// Control: failing on purpose and type tests.
fn control_funcs(map: &mut FuncMap) {
    insert(map, "fail", |a| {
        Err(fail("fail", string_arg("fail", a, 0)?))
    });
    insert(map, "kindIs", |a| {
        let kind = match arg("kindIs", a, 1)? {
            Value::Nil => "invalid",
            Value::Bool(_) => "bool",
            Value::Int(_) => "int",
            Value::Uint(_) => "uint",
            Value::Float(_) => "float64",
            Value::String(_) => "string",
            Value::List(_) => "slice",
            Value::Map(_) => "map",
            Value::Function(_) => "func",
        };
        Ok(Value::Bool(string_arg("kindIs", a, 0)? == kind))
    });
}

#[cfg(test)]
mod tests {
    use crate::files::PackageFiles;
    use crate::template::render;
    use crate::template_funcs::package_funcs;
    use serde_json::json;
    use std::sync::Arc;

    fn run(source: &str) -> Result<String, String> {
        let ctx = json!({"config": {"replicas": "3", "name": "myApp-server", "labels": {"b": "2", "a": "1"},
                                     "nested": {"x": {"y": "deep"}}, "items": ["c", "a", "b", "a"]}});
        let funcs = package_funcs(Arc::new(PackageFiles::new()), Arc::new(ctx.clone()));
        render("t.gotmpl", source, &[], &funcs, &ctx).map_err(|e| e.message)
    }

    #[test]
    fn arithmetic() {
        assert_eq!(run("{{ add 1 2 3 }} {{ sub 5 2 }} {{ mul 2 3 }} {{ div 7 2 }} {{ mod 7 2 }} {{ max 1 9 3 }} {{ min 4 2 }} {{ add1 (int .config.replicas) }}").unwrap(), "6 3 6 3 1 9 2 4");
        assert!(run("{{ div 1 0 }}")
            .unwrap_err()
            .contains("division by zero"));
        assert!(run("{{ int \"x\" }}")
            .unwrap_err()
            .contains("not an integer"));
    }

    #[test]
    fn strings() {
        assert_eq!(
            run("{{ .config.name | snakecase }} {{ .config.name | kebabcase }} {{ .config.name | camelcase }} {{ title \"hello world\" }}").unwrap(),
            "my_app_server my-app-server MyAppServer Hello World"
        );
        assert_eq!(run("{{ repeat 3 \"ab\" }}|{{ substr 1 3 \"hello\" }}|{{ nospace \"a b  c\" }}|{{ cat \"a\" 1 }}|{{ trimAll \"-\" \"--x--\" }}").unwrap(), "ababab|el|abc|a 1|x");
        assert_eq!(run("{{ regexMatch \"^v[0-9]+\" \"v12\" }} {{ regexReplaceAll \"[0-9]\" \"a1b2\" \"#\" }}").unwrap(), "true a#b#");
        assert_eq!(
            run("{{ sha256sum \"abc\" }}").unwrap(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert!(run("{{ regexMatch \"(\" \"x\" }}")
            .unwrap_err()
            .contains("regexMatch"));
    }

    #[test]
    fn lists_and_dicts() {
        assert_eq!(
            run("{{ first .config.items }}{{ last .config.items }} {{ uniq .config.items | sortAlpha | join \",\" }} {{ has \"c\" .config.items }} {{ without .config.items \"a\" | join \"\" }} {{ until 3 | toStrings | join \"\" }}").unwrap(),
            "ca a,b,c true cb 012"
        );
        assert_eq!(
            run("{{ get .config.labels \"a\" }} {{ values .config.labels | join \",\" }} {{ pick .config.labels \"b\" | toJson }} {{ omit .config.labels \"b\" | toJson }} {{ dig \"x\" \"y\" \"none\" .config.nested }} {{ dig \"x\" \"z\" \"none\" .config.nested }}").unwrap(),
            "1 1,2 {\"b\":\"2\"} {\"a\":\"1\"} deep none"
        );
        assert_eq!(
            run("{{ merge (dict \"a\" \"keep\") .config.labels | toJson }} {{ set .config.labels \"c\" \"3\" | keys | join \"\" }}").unwrap(),
            "{\"a\":\"keep\",\"b\":\"2\"} abc"
        );
        assert!(run("{{ fail \"config.x must be set\" }}")
            .unwrap_err()
            .contains("config.x must be set"));
        assert_eq!(
            run("{{ kindIs \"map\" .config.labels }} {{ kindIs \"string\" 1 }}").unwrap(),
            "true false"
        );
    }
}
