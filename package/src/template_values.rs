//! Template values as the template function sets need them: conversion to and from JSON, argument
//! access with errors naming the function, and Go's truthiness and printing. Shared by `template_funcs`
//! (pko's and upstream's functions) and `sprig_funcs`, which both build on it and on nothing of each other's.

use gotmpl::{TemplateError, Value};
use serde_json::Value as Json;

type Result<T> = std::result::Result<T, TemplateError>;

pub fn fail(name: &str, message: impl std::fmt::Display) -> TemplateError {
    TemplateError::Exec(format!("{name}: {message}"))
}

/// A template value as JSON (functions are not data: they become null).
pub fn to_json(value: &Value) -> Json {
    match value {
        Value::Nil => Json::Null,
        Value::Bool(b) => Json::Bool(*b),
        Value::Int(i) => Json::from(*i),
        Value::Uint(u) => Json::from(*u),
        Value::Float(f) => serde_json::Number::from_f64(*f).map_or(Json::Null, Json::Number),
        Value::String(s) => Json::String(s.to_string()),
        Value::List(items) => Json::Array(items.iter().map(to_json).collect()),
        Value::Map(map) => Json::Object(
            map.iter()
                .map(|(k, v)| (k.to_string(), to_json(v)))
                .collect(),
        ),
        Value::Function(_) => Json::Null,
    }
}

pub fn from_json(name: &str, json: &Json) -> Result<Value> {
    gotmpl::ser::to_value(json).map_err(|e| fail(name, e))
}

pub fn arg<'a>(name: &str, args: &'a [Value], i: usize) -> Result<&'a Value> {
    args.get(i)
        .ok_or_else(|| fail(name, format!("missing argument {}", i + 1)))
}

pub fn string_arg(name: &str, args: &[Value], i: usize) -> Result<String> {
    match arg(name, args, i)? {
        Value::String(s) => Ok(s.to_string()),
        other => Ok(display(other)),
    }
}

/// How a value prints in a template (strings bare, the rest as JSON).
pub fn display(value: &Value) -> String {
    match value {
        Value::Nil => String::new(),
        Value::String(s) => s.to_string(),
        other => to_json(other).to_string(),
    }
}

pub fn is_empty(value: &Value) -> bool {
    match value {
        Value::Nil => true,
        Value::Bool(b) => !b,
        Value::Int(i) => *i == 0,
        Value::Uint(u) => *u == 0,
        Value::Float(f) => *f == 0.0,
        Value::String(s) => s.is_empty(),
        Value::List(l) => l.is_empty(),
        Value::Map(m) => m.is_empty(),
        Value::Function(_) => false,
    }
}
