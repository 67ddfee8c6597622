# syntax=docker/dockerfile:1
# trainwire-sidecar. Build from the repository root:
#   docker build -f docker/sidecar.Dockerfile -t ghcr.io/trainwire/trainwire-sidecar:0.1.0 .
# The builder runs the same release build as CI (.ci/run):
#   cargo build --release --locked -p trainwire-sidecar

FROM docker.io/library/rust:1.95-bookworm AS builder
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p trainwire-sidecar \
    && install -D -m 0755 target/release/trainwire-sidecar /out/trainwire-sidecar

# glibc and libgcc, nothing else: no shell, no package manager.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=builder /out/trainwire-sidecar /usr/local/bin/trainwire-sidecar
# Numeric, so that runAsNonRoot can verify it without a passwd lookup.
USER 65532:65532
# The webhook injects this image as a native sidecar and always sets its user:
# the trainer's UID with no capability when known, else UID 0 with only KILL
# (a non-root user loses added capabilities at exec; see docs/sidecar.md).
ENTRYPOINT ["/usr/local/bin/trainwire-sidecar"]
