//! The one error of the job that is the user's to mend rather than the run's.

/// A command line that parsed but asks for something the job cannot do (a width that the
/// heads do not divide, a data file too short): the run stops with exit code 2 and this
/// message, which names the flag and what it takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadInput(pub String);

impl std::fmt::Display for BadInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BadInput {}
