//! Running a command-line tool with input on its standard input and its output captured, as the tests of
//! the package CLI and of the shipped install do. It starts no server.

use std::io::Write;
use std::process::{Command, Output, Stdio};

/// Runs `command` with `input` on its standard input; its output (stdout and stderr captured).
pub fn run_with_input(command: &mut Command, input: &str) -> std::io::Result<Output> {
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    if let Some(mut stdin) = child.stdin.take() {
        // Closed when dropped here: the command sees the end of its input.
        stdin.write_all(input.as_bytes())?;
    }
    child.wait_with_output()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_input_reaches_the_command_and_its_output_comes_back() {
        let out = run_with_input(&mut Command::new("cat"), "hello\n").unwrap();
        assert!(out.status.success());
        assert_eq!(out.stdout, b"hello\n");
    }
}
