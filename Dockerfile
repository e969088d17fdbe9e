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
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates nodejs npm \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --home /var/lib/sealgate sealgate
COPY --from=build /src/target/release/sealgate /usr/local/bin/sealgate
COPY policies /etc/sealgate/policies
USER sealgate
WORKDIR /var/lib/sealgate
ENV SEALGATE_LISTEN=0.0.0.0:8089 \
    SEALGATE_DATA_DIR=/var/lib/sealgate/data \
    SEALGATE_POLICIES_DIR=/etc/sealgate/policies
EXPOSE 8089
HEALTHCHECK CMD ["/usr/local/bin/sealgate", "--version"]
ENTRYPOINT ["/usr/local/bin/sealgate"]
CMD ["serve", "--config", "/etc/sealgate/sealgate.yaml"]
