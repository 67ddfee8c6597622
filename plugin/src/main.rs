use std::io::Write;
use std::process::ExitCode;

use clap::Parser;

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    // One crypto provider for rustls and kube: ring.
    let _ = rustls::crypto::ring::default_provider().install_default();
    match kubectl_trainwire::Cli::parse().run().await {
        Ok(text) => {
            let mut out = std::io::stdout().lock();
            // A closed pipe (`| head`) is not an error worth a message.
            let _ = out.write_all(text.as_bytes());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
