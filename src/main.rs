use clap::Parser;
use fusebox::cli::terminal::{self, Printed};

/// Runs the command and prints its output or its error, escaped for the terminal (names in
/// graph files are untrusted). Exit status 1 for any error, including output that could not
/// be written (`> /dev/full`); a reader that stopped early (`fusebox optimize … | head`)
/// closed the pipe by choice, so that ends the process quietly with status 0.
fn main() {
    let cli = fusebox::cli::Cli::parse();
    let error = match fusebox::cli::run(cli) {
        Ok(output) => match terminal::print(&output) {
            Ok(Printed::Done | Printed::Closed) => return,
            Err(e) => fusebox::cli::stdout_error(&e),
        },
        Err(e) => e,
    };
    terminal::print_error(&format!("error: {error}\n"));
    std::process::exit(1);
}
