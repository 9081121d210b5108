use clap::Parser;
use std::io::Write;

fn main() {
    let cli = fusebox::cli::Cli::parse();
    match fusebox::cli::run(cli) {
        Ok(output) => {
            // A reader that stops early (`fusebox optimize … | head`) closes the pipe: that is
            // not an error worth a panic, so a failed write just ends the process quietly.
            let mut stdout = std::io::stdout().lock();
            if stdout
                .write_all(output.as_bytes())
                .and_then(|()| stdout.flush())
                .is_err()
            {
                std::process::exit(0);
            }
        }
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    }
}
