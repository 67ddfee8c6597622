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

use crate::output::{Exit, Format};

const INJECT_HELP: &str = "\
Diagnostics (stderr):
  FILE:LINE: Kind/name: warning: ...   a value kept, a setting overwritten, a kind not managed
  FILE:LINE: Kind/name: note: ...      an object added (a Job's headless Service)
  FILE:LINE: Kind/name: refused: ...   nothing is rendered; exit status 1
  -o json prints them as one JSON document instead (docs/cli.md).

KRM function mode: given a config.kubernetes.io/v1 ResourceList (on stdin or
-f), the answer is the same ResourceList with its items injected and every
message in `results`. Without a subcommand and with stdin not a terminal,
trainwire-webhook runs as such a function (kustomize exec, kpt fn eval
--exec), configured by TRAINWIRE_POLICY, TRAINWIRE_SIDECAR_IMAGE,
TRAINWIRE_CLUSTER_DOMAIN and TRAINWIRE_NAMESPACE.";

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Render manifests offline: inject every annotated StatefulSet/Job.
    #[command(after_help = INJECT_HELP)]
    Inject(crate::inject::InjectArgs),
    /// Serve the mutating admission webhook over TLS (no controllers).
    Serve(crate::serve::ServeArgs),
    /// Moved: the controllers are the program `trainwire-controllers`.
    #[command(hide = true)]
    Controllers {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
        args: Vec<String>,
    },
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
        /// `text`: the summary or one line per error; `json`: one JSON
        /// document on stdout (docs/cli.md).
        #[arg(short = 'o', long = "output", value_enum, default_value_t = Format::Text)]
        output: Format,
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
            Command::Controllers { .. } => Err(anyhow::anyhow!(
                "the controllers are a program of their own: run trainwire-controllers with the same flags (the image ships it beside trainwire-webhook; manifests/base/controllers.yaml)"
            )),
            Command::Certs(args) => crate::certs::run(args),
            Command::Policy(PolicyCommand::Check { file, output }) => policy_check(&file, output),
        }
    }
}

/// `policy check`: the summary on stdout, or the errors, one line each
/// (`file:line:column: field.path: message`, as editors and CI annotations
/// read them) on stderr and exit status 1. With `-o json`, one
/// [`trainwire_policyfile::CheckReport`] on stdout either way.
fn policy_check(file: &std::path::Path, output: Format) -> anyhow::Result<()> {
    match output {
        Format::Json => {
            let report = trainwire_policyfile::CheckReport::of(file);
            println!("{}", serde_json::to_string_pretty(&report)?);
            if report.valid {
                Ok(())
            } else {
                Err(Exit(1).into())
            }
        }
        Format::Text => match trainwire_policyfile::check(file) {
            Ok(summary) => {
                println!("{summary}");
                Ok(())
            }
            Err(errors) => {
                eprintln!("{errors}");
                Err(Exit(1).into())
            }
        },
    }
}
