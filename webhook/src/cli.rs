//! The command line. Each subcommand's flags live beside its code.

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "trainwire-webhook",
    version,
    about = "Turns annotated StatefulSets and Jobs into torchrun worlds"
)]
pub struct Cli {
    /// Without a subcommand and with stdin not a terminal, runs as a KRM
    /// function (kustomize `exec`, kpt): `inject` of the ResourceList on stdin.
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Render manifests offline: inject every annotated StatefulSet/Job.
    Inject(crate::inject::InjectArgs),
    /// Serve the mutating admission webhook over TLS (no controllers).
    Serve(crate::serve::ServeArgs),
    /// Run the controllers (Services, world status, failures) apart from
    /// the admission server.
    Controllers(crate::controllers::ControllersArgs),
    /// Generate a CA and a serving certificate for a self-managed setup.
    Certs(crate::certs::CertsArgs),
    /// Platform policy tools.
    #[command(subcommand)]
    Policy(PolicyCommand),
}

#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Validate a policy file; errors give line, column and field path.
    Check {
        /// The policy file.
        file: std::path::PathBuf,
    },
}

impl Cli {
    pub async fn run(self) -> anyhow::Result<()> {
        let Some(command) = self.command else {
            use std::io::IsTerminal;
            if std::io::stdin().is_terminal() {
                use clap::CommandFactory;
                Cli::command().print_help()?;
                return Ok(());
            }
            return crate::inject::run_function();
        };
        match command {
            Command::Inject(args) => crate::inject::run(args),
            Command::Serve(args) => crate::serve::run(args).await,
            Command::Controllers(args) => crate::controllers::run(args).await,
            Command::Certs(args) => crate::certs::run(args),
            Command::Policy(PolicyCommand::Check { file }) => match crate::policy::check(&file) {
                Ok(summary) => {
                    println!("{summary}");
                    Ok(())
                }
                Err(errors) => {
                    // One line per error, nothing added: editors and CI
                    // annotations read `file:line:column: ...` as is.
                    eprintln!("{errors}");
                    std::process::exit(1);
                }
            },
        }
    }
}
