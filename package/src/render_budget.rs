//! The limits one template render stays within, so a hostile or broken template ends as an error that
//! names the limit instead of exhausting the manager's memory or time: the size of any text a function
//! returns or a template writes, the time one render may take, and the number of `include` calls.
//!
//! The budget lives in thread-locals of the rendering thread (a render runs on one thread, nested
//! `include`s included); [`RenderBudget::start`] opens it for a top-level render. Outside a render the
//! checks pass, so functions stay usable on their own.

use std::cell::{Cell, RefCell};
use std::fmt::{self, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gotmpl::{FuncMap, TemplateError, Value};

/// The most text one function may return or one template may write: 16 MiB, over ten times the largest
/// object the apiserver stores.
pub const MAX_TEXT_BYTES: usize = 16 * 1024 * 1024;
/// The longest one top-level render (with everything it includes) may take.
pub const MAX_RENDER_TIME: Duration = Duration::from_secs(10);
/// The most `include` calls one top-level render may make (a helper that includes itself twice per level
/// would otherwise take exponential time within the nesting limit).
pub const MAX_INCLUDES: usize = 10_000;

thread_local! {
    static DEADLINE: Cell<Option<Instant>> = const { Cell::new(None) };
    static INCLUDES: Cell<usize> = const { Cell::new(0) };
    static EXCEEDED: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// An open budget; the top-level render holds it, and dropping it closes the budget.
pub struct RenderBudget {
    outermost: bool,
}

impl RenderBudget {
    /// Opens the budget unless a render on this thread already holds one (a nested `include`).
    pub fn start() -> Self {
        let outermost = DEADLINE.with(|d| d.get()).is_none();
        if outermost {
            DEADLINE.with(|d| d.set(Some(Instant::now() + MAX_RENDER_TIME)));
            INCLUDES.with(|c| c.set(0));
            EXCEEDED.with(|e| e.replace(None));
        }
        Self { outermost }
    }

    /// The limit this render ran into and where, if any: the reason to report instead of the engine's
    /// own error.
    pub fn exceeded(&self) -> Option<String> {
        EXCEEDED.with(|e| e.borrow().clone())
    }
}

impl Drop for RenderBudget {
    fn drop(&mut self) {
        if self.outermost {
            DEADLINE.with(|d| d.set(None));
        }
    }
}

/// Records that `name` ran into `limit` (the first one counts) and returns the error saying so.
fn exceed(name: &str, limit: &str) -> TemplateError {
    let message = format!("{name}: {limit}");
    EXCEEDED.with(|e| {
        e.borrow_mut().get_or_insert_with(|| message.clone());
    });
    TemplateError::Exec(message)
}

const TIME_LIMIT: &str = "rendering takes longer than the 10 s limit";
const TEXT_LIMIT: &str = "text larger than the 16 MiB limit";
const INCLUDE_LIMIT: &str = "more than 10000 include calls";

/// Fails once the render is past its deadline.
pub fn check_time(name: &str) -> Result<(), TemplateError> {
    match DEADLINE.with(|d| d.get()) {
        Some(deadline) if Instant::now() > deadline => Err(exceed(name, TIME_LIMIT)),
        _ => Ok(()),
    }
}

/// Fails when `bytes` of text would exceed [`MAX_TEXT_BYTES`].
pub fn check_text(name: &str, bytes: usize) -> Result<(), TemplateError> {
    if bytes > MAX_TEXT_BYTES {
        return Err(exceed(name, TEXT_LIMIT));
    }
    Ok(())
}

/// Counts one `include`; fails past [`MAX_INCLUDES`].
pub fn count_include() -> Result<(), TemplateError> {
    let calls = INCLUDES.with(|c| {
        c.set(c.get() + 1);
        c.get()
    });
    if calls > MAX_INCLUDES {
        return Err(exceed("include", INCLUDE_LIMIT));
    }
    check_time("include")
}

/// `funcs` with every function checked: it may not start past the deadline, and a text it returns may
/// not exceed [`MAX_TEXT_BYTES`].
pub fn guarded(funcs: FuncMap) -> FuncMap {
    funcs
        .into_iter()
        .map(|(name, f)| {
            let label = name.clone();
            let checked: gotmpl::ValueFunc = Arc::new(move |args: &[Value]| {
                check_time(&label)?;
                let out = f(args)?;
                if let Value::String(s) = &out {
                    check_text(&label, s.len())?;
                }
                Ok(out)
            });
            (name, checked)
        })
        .collect()
}

/// Go's builtins that build text from their arguments, with how far their output can outgrow them: bytes
/// per input byte, and bytes per argument (printf pads to a width of at most 65535).
const TEXT_BUILTINS: [(&str, usize, usize); 6] = [
    ("print", 1, 1),
    ("println", 1, 1),
    ("printf", 1, 65_535),
    ("html", 6, 0),
    ("js", 6, 0),
    ("urlquery", 3, 0),
];

/// Adds to `funcs` Go's text-building builtins, checked like every other function and refused before
/// they run when their result could pass [`MAX_TEXT_BYTES`] (`$s = printf "%s%s" $s $s` in a loop
/// doubles a string per step). Each runs the engine's own builtin through a one-call template.
pub fn guard_text_builtins(funcs: &mut FuncMap) {
    for (name, per_byte, per_argument) in TEXT_BUILTINS {
        funcs.insert(
            name.into(),
            Arc::new(move |args: &[Value]| {
                let input: usize = args.iter().map(display_len).sum();
                check_text(
                    name,
                    input
                        .saturating_mul(per_byte)
                        .saturating_add(args.len().saturating_mul(per_argument)),
                )?;
                call_builtin(name, args)
            }),
        );
    }
}

/// The length of a value as Go prints it, at least: strings and numbers exactly, collections by their
/// parts.
fn display_len(value: &Value) -> usize {
    match value {
        Value::String(s) => s.len(),
        Value::List(items) => items.iter().map(display_len).sum::<usize>() + items.len() + 2,
        Value::Map(entries) => entries
            .iter()
            .map(|(k, v)| k.len() + display_len(v) + 2)
            .sum::<usize>()
            .saturating_add(5),
        _ => 24,
    }
}

/// Runs builtin `name` on `args` with the engine's own implementation.
fn call_builtin(name: &str, args: &[Value]) -> Result<Value, TemplateError> {
    let call: String = std::iter::once(name.to_owned())
        .chain((0..args.len()).map(|i| format!("(index . {i})")))
        .collect::<Vec<_>>()
        .join(" ");
    let template = gotmpl::Template::new(name).parse(&format!("{{{{ {call} }}}}"))?;
    let mut out = BoundedText::default();
    template.execute_fmt(&mut out, &Value::from(args.to_vec()))?;
    Ok(Value::from(out.text))
}

/// A template's output, refusing to grow past [`MAX_TEXT_BYTES`] or the deadline.
#[derive(Default)]
pub struct BoundedText {
    pub text: String,
}

impl Write for BoundedText {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        if self.text.len() + s.len() > MAX_TEXT_BYTES {
            exceed("output", TEXT_LIMIT);
            return Err(fmt::Error);
        }
        if check_time("output").is_err() {
            return Err(fmt::Error);
        }
        self.text.push_str(s);
        Ok(())
    }
}

/// Handlebars writes through `std::io::Write`, whole `str`s at a time.
impl std::io::Write for BoundedText {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let text = std::str::from_utf8(bytes)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
        self.write_str(text)
            .map_err(|_| std::io::Error::other("render budget exceeded"))?;
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_output_stops_at_the_limit_and_says_which() {
        let budget = RenderBudget::start();
        let mut out = BoundedText::default();
        let chunk = "x".repeat(1024 * 1024);
        let mut written = 0;
        while out.write_str(&chunk).is_ok() {
            written += 1;
        }
        assert_eq!(written, 16);
        assert_eq!(budget.exceeded(), Some(format!("output: {TEXT_LIMIT}")));
    }

    #[test]
    fn text_builtins_run_as_the_engine_does_and_refuse_what_would_pass_the_limit() {
        let mut funcs = FuncMap::new();
        guard_text_builtins(&mut funcs);
        let call = |name: &str, args: Vec<Value>| funcs[name](&args);
        let printed = call(
            "printf",
            vec![Value::from("%s-%d"), Value::from("a"), Value::Int(3)],
        );
        assert_eq!(printed.unwrap_or(Value::Nil), Value::from("a-3"));
        assert_eq!(
            call("html", vec![Value::from("<a>")]).unwrap_or(Value::Nil),
            Value::from("&lt;a&gt;")
        );
        let big = Value::from("x".repeat(MAX_TEXT_BYTES / 2 + 1));
        let doubled = call("printf", vec![Value::from("%s%s"), big.clone(), big]);
        assert!(doubled.is_err_and(|e| e.to_string().contains("16 MiB limit")));
    }

    #[test]
    fn include_calls_are_counted_per_render() {
        for _ in 0..2 {
            let _budget = RenderBudget::start();
            for _ in 0..MAX_INCLUDES {
                count_include()
                    .map_err(|e| e.to_string())
                    .unwrap_or_else(|e| panic!("{e}"));
            }
            assert!(count_include().is_err());
        }
    }

    #[test]
    fn a_nested_start_keeps_the_outer_budget() {
        let outer = RenderBudget::start();
        {
            let _inner = RenderBudget::start();
        }
        // The inner budget closing did not close the outer one.
        assert!(DEADLINE.with(|d| d.get()).is_some());
        drop(outer);
        assert!(DEADLINE.with(|d| d.get()).is_none());
    }
}
