//! `inject` as a command: reading the input (a file, stdin, a bounded
//! size), printing the rendering and the diagnostics, the exit status; and
//! the KRM function mode (`run_function`).

use super::*;

/// The manifest's text and the name messages give it (`<stdin>` for `-`).
fn read_input(file: &std::path::Path) -> Result<(String, String), InjectError> {
    let stdin = file.as_os_str() == "-";
    let name = if stdin {
        "<stdin>".to_string()
    } else {
        file.display().to_string()
    };
    let read = |r: &mut dyn Read| -> Result<String, InjectError> {
        let mut bytes = Vec::new();
        r.take(MAX_INPUT_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(|error| InjectError::Read {
                path: name.clone(),
                error,
            })?;
        if bytes.len() as u64 > MAX_INPUT_BYTES {
            return Err(InjectError::TooLarge { path: name.clone() });
        }
        String::from_utf8(bytes).map_err(|e| InjectError::Read {
            path: name.clone(),
            error: std::io::Error::new(std::io::ErrorKind::InvalidData, e.utf8_error()),
        })
    };
    let text = if stdin {
        read(&mut std::io::stdin().lock())?
    } else {
        let mut f = std::fs::File::open(file).map_err(|error| InjectError::Read {
            path: name.clone(),
            error,
        })?;
        read(&mut f)?
    };
    Ok((text, name))
}

/// Print diagnostics on stderr: one line each, or one JSON [`Report`].
fn print_diagnostics(
    format: Format,
    diagnostics: &[Diagnostic],
    rendered: bool,
) -> std::io::Result<()> {
    let mut err = std::io::stderr().lock();
    match format {
        Format::Text => {
            for d in diagnostics {
                writeln!(err, "{d}")?;
            }
        }
        Format::Json => {
            let report = Report {
                rendered,
                diagnostics,
            };
            serde_json::to_writer_pretty(&mut err, &report)?;
            writeln!(err)?;
        }
    }
    err.flush()
}

/// Print a rendering: YAML on stdout unless refused (a ResourceList answer
/// is printed even then, as KRM functions do), diagnostics on stderr.
fn emit(rendered: &Rendered, format: Format) -> anyhow::Result<()> {
    let print = rendered.refusals.is_empty() || rendered.resource_list;
    if print {
        let mut out = std::io::stdout().lock();
        out.write_all(rendered.output.as_bytes())?;
        out.flush()?;
    }
    print_diagnostics(format, &rendered.diagnostics, print)?;
    if !rendered.refusals.is_empty() {
        if format == Format::Text {
            eprintln!(
                "error: {} workload(s) refused; nothing was rendered",
                rendered.refusals.len()
            );
        }
        return Err(Exit(1).into());
    }
    Ok(())
}

pub fn run(args: InjectArgs) -> anyhow::Result<()> {
    let format = args.output;
    let rendered = Options::from_args(&args.policy, args.namespace).and_then(|opts| {
        if args.file.as_os_str() == "-" && std::io::stdin().is_terminal() {
            return Err(InjectError::Terminal);
        }
        let (input, name) = read_input(&args.file)?;
        render_file(&input, &name, &opts)
    });
    match rendered {
        Ok(rendered) => emit(&rendered, format),
        Err(e) => {
            print_diagnostics(format, &e.diagnostics(), false)?;
            Err(Exit(1).into())
        }
    }
}

/// Run as a KRM function (no subcommand, stdin not a terminal): read a
/// ResourceList (or any manifest) from stdin with the env-configured policy.
pub fn run_function() -> anyhow::Result<()> {
    let policy = PolicyArgs {
        policy: std::env::var_os("TRAINWIRE_POLICY").map(PathBuf::from),
        sidecar_image: std::env::var("TRAINWIRE_SIDECAR_IMAGE").ok(),
        cluster_domain: std::env::var("TRAINWIRE_CLUSTER_DOMAIN").ok(),
    };
    run(InjectArgs {
        file: PathBuf::from("-"),
        namespace: std::env::var("TRAINWIRE_NAMESPACE").ok(),
        output: Format::Text,
        policy,
    })
}
