//! `hrperf`: the command line. Arguments become library configuration first
//! ([`args`]); each subcommand lives in its own module; `main` maps errors to one line on
//! stderr and exit status 2, and a closed stdout (e.g. `| head`) to success.

mod args;
mod decode;
mod import;
mod kmod;
mod record;
mod report;
mod stack_report;

use std::io::{self, Write};
use std::process::ExitCode;

use clap::Parser;

use args::{Cli, Command};

/// A user-facing failure: one line saying what was wrong and what to do.
#[derive(Debug)]
pub struct CliError(pub String);

impl<E: std::fmt::Display> From<E> for CliError {
    fn from(e: E) -> Self {
        CliError(e.to_string())
    }
}

/// Result of a subcommand: the exit status to return.
pub type CliResult = Result<ExitCode, CliError>;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Record(a) => record::run(a),
        Command::Decode(a) => decode::run_decode(a),
        Command::Info(a) => decode::run_info(a),
        Command::Formats => decode::run_formats(),
        Command::Status(a) => kmod::run_status(a),
        Command::Start(a) => kmod::run_start(a),
        Command::Pause(a) => kmod::run_ctl(a, kmod::Ctl::Pause),
        Command::Poll(a) => kmod::run_ctl(a, kmod::Ctl::Poll),
        Command::Log(a) => kmod::run_ctl(a, kmod::Ctl::Log),
        Command::PollLog(a) => kmod::run_ctl(a, kmod::Ctl::PollLog),
        Command::Stop(a) => kmod::run_ctl(a, kmod::Ctl::Stop),
        Command::Report(a) => report::run(a),
        Command::Import(a) => import::run(a),
    };
    match result {
        Ok(code) => code,
        Err(CliError(msg)) => {
            let _ = io::stdout().flush();
            eprintln!("hrperf: error: {msg}");
            ExitCode::from(2)
        }
    }
}
