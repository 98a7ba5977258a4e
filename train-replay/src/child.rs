//! One child run of `compare` and `sweep`: a process that trains and prints its figures as
//! one JSON line (`train --json`, or a PyTorch script), and what it ended with.

use std::process::Command;

use crate::measure::Summary;

/// Why a child run gave no summary.
#[derive(Debug, Clone)]
pub struct Failed {
    /// What it said (its standard error, without the `error: ` in front), or how it ended
    /// when it said nothing.
    pub message: String,
    /// It refused its command line (exit code 2): the command line is the caller's to mend.
    pub refused: bool,
}

/// Runs `command` and reads its JSON line.
pub fn run(command: &mut Command) -> Result<Summary, Failed> {
    let output = command.output().map_err(|e| Failed {
        message: format!("did not start: {e}"),
        refused: false,
    })?;
    let text = String::from_utf8_lossy(&output.stdout);
    match Summary::parse(&text) {
        Some(summary) if output.status.success() => Ok(summary),
        _ => {
            let stderr = String::from_utf8_lossy(&output.stderr);
            let why = stderr.trim().trim_start_matches("error: ");
            Err(Failed {
                message: match why.is_empty() {
                    true => format!("it ended ({}) and said nothing", output.status),
                    false => why.to_owned(),
                },
                refused: output.status.code() == Some(2),
            })
        }
    }
}
