//! What a build of trainwire is: the version both programs report
//! (`--version`, the `trainwire_build_info` metric, the injected status) and
//! the source revision when the build was given one.

/// The workspace version.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The source revision (a git commit), from `TRAINWIRE_REVISION` at build
/// time: `images/build` sets it; a plain `cargo build` leaves it out.
pub const REVISION: Option<&str> = match option_env!("TRAINWIRE_REVISION") {
    Some(r) if !r.is_empty() => Some(r),
    _ => None,
};

#[cfg(test)]
mod tests {
    #[test]
    fn the_version_is_semver() {
        let parts: Vec<&str> = super::VERSION.split('.').collect();
        assert_eq!(parts.len(), 3, "{}", super::VERSION);
        assert!(parts.iter().all(|p| p.parse::<u32>().is_ok()));
    }
}
