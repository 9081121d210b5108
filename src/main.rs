use clap::Parser;

fn main() {
    let cli = fusebox::cli::Cli::parse();
    match fusebox::cli::run(cli) {
        Ok(output) => print!("{output}"),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    }
}
