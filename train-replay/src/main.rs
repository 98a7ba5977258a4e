//! `cargo run --release -p train-replay [-- --help]`: trains an MLP with checkpoint replay,
//! every allocation in ferropool; `--compare` runs it on glibc and mimalloc too.

use std::process::ExitCode;

use clap::Parser;
use train_replay::allocator::Selected;
use train_replay::args::Args;

#[global_allocator]
static ALLOCATOR: Selected = Selected;

fn main() -> ExitCode {
    let args = Args::parse();
    let result = if args.compare {
        train_replay::compare::compare(&args)
    } else {
        train_replay::report::run(&args)
    };
    // Exit code 2 is clap's, for a command line it refused; a run that fails is 1.
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}
