//! The `xinf` command.

use std::process::ExitCode;

fn main() -> ExitCode {
    xinf::cli::main()
}
