//! Shared helpers for the integration tests and benchmarks.
