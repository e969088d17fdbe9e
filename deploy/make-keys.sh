#!/bin/sh
# Makes the two Ed25519 key pairs that deploy/sealgate.yaml trusts:
#   operators  signs the operator tokens that register and revoke sessions (the orchestrator holds it)
#   agents     signs the agents' tokens (the orchestrator holds it)
# The public halves go to PUBLIC_DIR (default deploy/keys, mounted into the gateway); the private halves to
# PRIVATE_DIR (default deploy/private, never mounted), readable by their owner only.
# Usage: deploy/make-keys.sh [PUBLIC_DIR [PRIVATE_DIR]]
set -eu

here=$(cd "$(dirname "$0")" && pwd)
public_dir=${1:-$here/keys}
private_dir=${2:-$here/private}

command -v openssl >/dev/null 2>&1 || { echo "make-keys.sh: openssl is needed (apt-get install openssl)" >&2; exit 1; }

# Refuse before writing anything: replacing a key silently would lock out every token signed with the old one.
for name in operators agents; do
    for file in "$public_dir/$name.pub.pem" "$private_dir/$name.key"; do
        if [ -e "$file" ]; then
            echo "make-keys.sh: $file already exists; remove it first to make a new key" >&2
            exit 1
        fi
    done
done

mkdir -p "$public_dir" "$private_dir"
chmod 700 "$private_dir"
for name in operators agents; do
    (umask 077 && openssl genpkey -algorithm ed25519 -out "$private_dir/$name.key")
    openssl pkey -in "$private_dir/$name.key" -pubout -out "$public_dir/$name.pub.pem"
    chmod 644 "$public_dir/$name.pub.pem"
    echo "$name: private $private_dir/$name.key, public $public_dir/$name.pub.pem"
done
