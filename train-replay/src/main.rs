//! `cargo run --release -p train-replay [-- --help]`: trains a GPT (or `--model mlp`) with
//! checkpoint replay, every tensor in ferropool; `compare` runs it on glibc and mimalloc (and
//! PyTorch) too.

use std::process::ExitCode;

use clap::CommandFactory;
use ferropool_choice::ChosenAllocator;
use train_replay::args::{Cli, Command};
use train_replay::error::BadInput;

#[global_allocator]
static GLOBAL: &ChosenAllocator = &train_replay::allocator::ALLOCATOR;

fn main() -> ExitCode {
    let matches = Cli::command().get_matches();
    let cli = match Cli::from_matches(&matches) {
        Ok(cli) => cli,
        Err(error) => error.exit(),
    };
    let training = matches.subcommand().map_or(&matches, |(_, sub)| sub);
    if let Err(error) = train_replay::args::refuse_foreign_flags(training) {
        eprintln!("error: {error}");
        return ExitCode::from(2);
    }
    if let Some(error) = train_replay::allocator::ALLOCATOR.unknown_value_error() {
        eprintln!("error: {error}");
        return ExitCode::FAILURE;
    }
    let result = match &cli.command {
        Some(Command::Compare(args)) => train_replay::compare::compare(args),
        Some(Command::Train(args)) => train_replay::train::run(args),
        Some(Command::Sweep(args)) => train_replay::sweep::sweep(args),
        None => train_replay::train::run(&cli.train),
    };
    // Exit code 2 is clap's, for a command line it refused, and ours for one it asks what
    // the job cannot do (`BadInput`); a run that fails is 1.
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message:#}");
            match message.downcast_ref::<BadInput>() {
                Some(_) => ExitCode::from(2),
                None => ExitCode::FAILURE,
            }
        }
    }
}
