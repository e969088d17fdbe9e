#!/usr/bin/env bash
# The one test command (README and CI): installs what the tests need, then runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."
# strace traces the gateway's syncs in tests/durability.rs and tests/crash.rs (a Debian package).
if ! command -v strace >/dev/null 2>&1; then
  apt-get update -qq && apt-get install -y -qq strace
fi
# tests/cli_tokens.rs round-trips keys through openssl and Python `cryptography` (Debian packages);
# tests/quickstart.rs runs docs/quickstart.md, which uses openssl and curl.
if ! command -v openssl >/dev/null 2>&1 || ! command -v curl >/dev/null 2>&1 ||
  ! python3 -c 'import cryptography' >/dev/null 2>&1; then
  apt-get update -qq && apt-get install -y -qq openssl curl python3-cryptography
fi
# The store's unit tests read a packed row with the sqlite3 and zstd tools, as docs/durability.md shows.
if ! command -v sqlite3 >/dev/null 2>&1 || ! command -v zstd >/dev/null 2>&1; then
  apt-get update -qq && apt-get install -y -qq sqlite3 zstd
fi
# Real MCP servers for the integration tests, pinned by tests/mcp-servers/package-lock.json.
if [ -f tests/mcp-servers/package-lock.json ]; then
  npm ci --prefix tests/mcp-servers --no-audit --no-fund --loglevel=error
fi
# tests/console.rs drives the operator console in Debian's Chromium through playwright-core (npm, pinned by
# tests/console/package-lock.json); playwright's own browser downloads are not used.
if [ ! -x /usr/bin/chromium ]; then
  apt-get update -qq && apt-get install -y -qq chromium
fi
npm ci --prefix tests/console --no-audit --no-fund --loglevel=error
# tests/sign_in.rs and tests/console.rs sign people in with a real OpenID provider: the certified oidc-provider package (npm,
# pinned by tests/oidc/package-lock.json; 8.x, which supports the machine's Node 20), run by tests/oidc/server.mjs.
npm ci --prefix tests/oidc --no-audit --no-fund --loglevel=error
# Python tools from PyPI, each pinned and in a venv of its own under target/venvs (their dependencies
# differ); a venv is made again only when its pins change. The venvs do not see the system's packages: a
# tool already installed there would satisfy pip without putting its script into the venv.
python_tools() {
  local name=$1; shift
  local dir=target/venvs/$name
  local pins="isolated $*"
  if [ "$(cat "$dir/.pins" 2>/dev/null)" != "$pins" ]; then
    rm -rf "$dir"
    python3 -m venv "$dir"
    "$dir/bin/pip" install --quiet --disable-pip-version-check "$@"
    echo "$pins" > "$dir/.pins"
  fi
}
# schemathesis checks the served OpenAPI document against the real binary (tests/openapi.rs).
python_tools schemathesis schemathesis==4.32.5
# The official MCP Python SDK drives `sealgate connect` (tests/connect.rs); the TypeScript SDK
# (@modelcontextprotocol/sdk, pinned by tests/connect-clients/package-lock.json) does too.
python_tools mcp mcp==2.3.0
npm ci --prefix tests/connect-clients --no-audit --no-fund --loglevel=error
# The TypeScript SDK and the MCP Inspector CLI as OAuth MCP hosts of tests/mcp_oauth.rs (tests/mcp-hosts/package-lock.json).
npm ci --prefix tests/mcp-hosts --no-audit --no-fund --loglevel=error
# standardwebhooks checks the signed approval webhooks as a receiver would (tests/approvals.rs, and the
# Quickstart page's receiver in tests/quickstart.rs).
python_tools standardwebhooks standardwebhooks==1.1.0
# rfc8785 (JCS) and `cryptography` verify receipts and checkpoints with code we did not write
# (tests/evidence.rs).
python_tools evidence rfc8785==0.1.4 cryptography==48.0.0
# kubernetes-validate checks deploy/kubernetes against the Kubernetes schemas that it ships (tests/kubernetes.rs,
# which renders the setups with the kustomize of the machine image's kubectl).
python_tools kubernetes-validate kubernetes-validate==1.37.0
# junitparser reads `policy test --junit` reports back and xmlschema validates them against junit-10.xsd, the
# Jenkins xunit plugin's JUnit schema as shipped in pytest's pinned sdist (tests/policy_cases.rs).
python_tools junit junitparser==5.0.3 xmlschema==4.3.2
if [ ! -f target/venvs/junit/junit-10.xsd ]; then
  target/venvs/junit/bin/pip download --quiet --disable-pip-version-check --no-binary :all: --no-deps pytest==8.4.2 -d target/venvs/junit/sdist
  tar -xzOf target/venvs/junit/sdist/pytest-8.4.2.tar.gz pytest-8.4.2/testing/example_scripts/junit-10.xsd > target/venvs/junit/junit-10.xsd
fi
cargo test --locked "$@"

# The black-box suite again with every gateway on PostgreSQL (a database of its own per gateway, made by
# tests/common and dropped here). Left out: durability and crash (they trace the embedded store's own files),
# store_failure (it takes the embedded store's folder away), store_commands (the embedded store's own
# commands), replicas (PostgreSQL already), dockerfile and the suites that start no gateway.
POSTGRES=${SEALGATE_TEST_POSTGRES:-postgres://postgres@127.0.0.1:5432/test}
drop_test_databases() {
  psql "$POSTGRES" -Atqc "SELECT datname FROM pg_database WHERE datname LIKE 'sealgate\_test\_%'" |
    while read -r name; do psql "$POSTGRES" -qc "DROP DATABASE IF EXISTS $name WITH (FORCE)"; done
}
trap drop_test_databases EXIT
SEALGATE_TEST_STORE=postgres cargo test --locked \
  --test approvals --test approvers --test audit_trail --test claims --test cli_tokens --test connect --test console --test front_door --test gateway_core --test hardening \
  --test mcp_gateway --test metrics --test observability --test openapi --test operability --test policy_api --test teams \
  --test upstream_mcp --test file_modes --test retention --test sign_in --test mcp_server --test mcp_oauth --test flows --test answer_guard --test tool_pins --test shadow "$@"
