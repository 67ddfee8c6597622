//! The fuzzing campaign over trainwire's outside-input surfaces
//! (`trainwire_tests::fuzz`): admission, inject, policy, sidecar-env.
//!
//! ```sh
//! cargo build --profile fuzz -p trainwire-tests --bin fuzz
//! ./target/fuzz/fuzz admission 1000000 --seed 1
//! ```
//!
//! Arguments: the surface (`admission`, `inject`, `policy`, `sidecar-env`
//! or `all`), the number of inputs (default 100,000), `--seed N` (default
//! 1). Prints one summary line per surface (and each finding); exits
//! non-zero when an oracle broke.

use trainwire_tests::fuzz::{self, Limits, Seeds, Surface};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let mut positional = Vec::new();
    let mut seed = 1u64;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--seed" => {
                seed = args
                    .next()
                    .ok_or_else(|| anyhow::anyhow!("--seed needs a number"))?
                    .parse()?
            }
            "-h" | "--help" => {
                println!(
                    "fuzz SURFACE [COUNT] [--seed N]\nSURFACE: admission, inject, policy, sidecar-env or all"
                );
                return Ok(());
            }
            _ => positional.push(a),
        }
    }
    let surfaces: Vec<Surface> = match positional.first().map(String::as_str) {
        None | Some("all") => Surface::ALL.to_vec(),
        Some(name) => vec![Surface::from_name(name).ok_or_else(|| {
            anyhow::anyhow!(
                "unknown surface {name:?}: admission, inject, policy, sidecar-env or all"
            )
        })?],
    };
    let count: u64 = positional
        .get(1)
        .map(|c| c.replace('_', "").parse())
        .transpose()?
        .unwrap_or(100_000);
    let seeds = Seeds::load(&trainwire_tests::repo_root())?;
    let mut failed = false;
    for surface in surfaces {
        let report = fuzz::run_with_progress(
            surface,
            &seeds,
            count,
            seed,
            Limits::default(),
            20,
            |so_far| println!("  {}", so_far.summary(surface, seed)),
        );
        println!("{}", report.summary(surface, seed));
        failed |= !report.findings.is_empty();
    }
    if failed {
        anyhow::bail!("findings");
    }
    Ok(())
}
