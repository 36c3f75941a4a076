//! `cargo run --release -p loadtest -- --profile sale` against `scripts/up.sh`.
//! Exit code 0 when every threshold is met and the verdict is PASS, 1 when
//! not, 2 when the run could not be made (nothing answers, a bad option).

use clap::Parser;
use loadtest::{report, run, Cli};

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match run::run(cli.options, cli.goose, run::Targets { pool: None }).await {
        Ok(outcome) => {
            println!("{}", report::markdown(&outcome.report));
            println!(
                "Reports: {}/{{summary.md,summary.json,report.html,goose.html}}",
                outcome.report_dir.display()
            );
            if outcome.pass {
                std::process::ExitCode::SUCCESS
            } else {
                eprintln!("loadtest: FAIL (see the thresholds and the verdict above)");
                std::process::ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("loadtest: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}
