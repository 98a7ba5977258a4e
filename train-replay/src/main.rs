//! `cargo run --release -p train-replay [-- --help]`: trains an MLP with checkpoint replay,
//! every allocation in ferropool; `compare` runs it on glibc and mimalloc (and PyTorch) too.

use std::process::ExitCode;

use clap::Parser;
use ferropool_choice::ChosenAllocator;
use train_replay::args::{Cli, Command};

#[global_allocator]
static GLOBAL: &ChosenAllocator = &train_replay::allocator::ALLOCATOR;

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(error) = train_replay::allocator::ALLOCATOR.unknown_value_error() {
        eprintln!("error: {error}");
        return ExitCode::FAILURE;
    }
    let result = match &cli.command {
        Some(Command::Compare(args)) => train_replay::compare::compare(args),
        Some(Command::Train(args)) => train_replay::report::run(args),
        Some(Command::Sweep(args)) => train_replay::sweep::sweep(args),
        None => train_replay::report::run(&cli.train),
    };
    // Exit code 2 is clap's, for a command line it refused; a run that fails is 1.
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message:#}");
            ExitCode::FAILURE
        }
    }
}
