# syntax=docker/dockerfile:1
# trainwire-webhook. Build from the repository root:
#   docker build -f docker/webhook.Dockerfile -t ghcr.io/trainwire/trainwire-webhook:0.1.0 .
# The builder runs the same release build as CI (.ci/run):
#   cargo build --release --locked -p trainwire-webhook

FROM docker.io/library/rust:1.95-bookworm AS builder
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p trainwire-webhook \
    && install -D -m 0755 target/release/trainwire-webhook /out/trainwire-webhook

# glibc and libgcc, nothing else: no shell, no package manager.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=builder /out/trainwire-webhook /usr/local/bin/trainwire-webhook
# Numeric, so that runAsNonRoot can verify it without a passwd lookup.
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/trainwire-webhook"]
