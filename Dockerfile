# Build the gateway, then ship it on a slim base with Node.js for stdio MCP servers started through npx.
FROM rust:1.89-bookworm AS build
WORKDIR /src
# Everything Cargo.toml names must be here: the bench target is declared, so benches/ is needed even though
# the image never runs it; src/demo.rs embeds policies/demo.yaml. tests/dockerfile.rs replays these lines.
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY benches ./benches
COPY policies ./policies
RUN cargo build --release --locked

FROM debian:bookworm-slim
# useradd makes no home folder by itself: `install -d` makes it and the data folder, owned by the service user,
# so that a new named volume mounted on the data folder starts out owned by that user too. Its uid is fixed
# (the one useradd --system picked here before): Kubernetes checks runAsNonRoot against a number, and
# deploy/kubernetes runs the gateway as this one (tests/kubernetes.rs holds the two together).
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates nodejs npm \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 999 --user-group --no-create-home --home-dir /var/lib/sealgate --shell /usr/sbin/nologin sealgate \
 && install -d -o sealgate -g sealgate -m 0750 /var/lib/sealgate /var/lib/sealgate/data
COPY --from=build /src/target/release/sealgate /usr/local/bin/sealgate
COPY policies /etc/sealgate/policies
USER sealgate
WORKDIR /var/lib/sealgate
ENV SEALGATE_LISTEN=0.0.0.0:8089 \
    SEALGATE_DATA_DIR=/var/lib/sealgate/data \
    SEALGATE_POLICIES_DIR=/etc/sealgate/policies
EXPOSE 8089
# Asks the running gateway: exits non-zero unless /readyz answers 2xx (the image has no curl).
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s CMD ["/usr/local/bin/sealgate", "health", "--url", "http://127.0.0.1:8089/readyz"]
ENTRYPOINT ["/usr/local/bin/sealgate"]
CMD ["serve", "--config", "/etc/sealgate/sealgate.yaml"]
