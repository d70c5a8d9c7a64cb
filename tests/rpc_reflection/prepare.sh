#!/usr/bin/env bash
# Installs the third-party Node gRPC reflection client that
# //tests/rpc_reflection:reflection_test uses, into a cache directory outside
# the repository:
#
#   tests/rpc_reflection/prepare.sh [DIR]
#
# DIR defaults to $FERRY_NPM_DIR, else ~/.cache/ferry-npm. Idempotent: when
# DIR already holds the packages it does nothing (no network). Exits 0 when the
# packages are ready, 1 when npm is missing or the install failed (e.g. no
# network); the test then skips with a message naming this script.
set -euo pipefail

PACKAGES=(
  "@grpc/grpc-js@^1.8"
  "@grpc/proto-loader@^0.7 || ^0.8"
  "grpc-js-reflection-client@^1.4"
  "protobufjs"
)
MARKERS=(
  "@grpc/grpc-js" "@grpc/proto-loader" "grpc-js-reflection-client" "protobufjs"
)

home="$(getent passwd "$(id -u)" | cut -d: -f6)"
dir="${1:-${FERRY_NPM_DIR:-${home:-$HOME}/.cache/ferry-npm}}"

ready() {
  local m
  for m in "${MARKERS[@]}"; do
    [[ -f "$1/node_modules/$m/package.json" ]] || return 1
  done
}

if ready "$dir"; then
  echo "prepare.sh: Node reflection client ready in $dir"
  exit 0
fi
if ! command -v npm >/dev/null || ! command -v node >/dev/null; then
  echo "prepare.sh: node/npm not found (Debian: apt-get install nodejs npm)" >&2
  exit 1
fi

# Install into a staging directory, then move it into place, so an
# interrupted or concurrent install never leaves a half-filled DIR.
mkdir -p "$(dirname "$dir")"
stage="$(mktemp -d "$dir.stage.XXXXXX")"
trap 'rm -rf "$stage"' EXIT
echo '{"private": true}' >"$stage/package.json"
if ! (cd "$stage" && timeout "${FERRY_NPM_TIMEOUT:-120}" npm install \
      --no-audit --no-fund --no-save --loglevel=error \
      --fetch-retries=0 --fetch-timeout=20000 \
      --cache "$stage/.npm-cache" "${PACKAGES[@]}" >"$stage/npm.log" 2>&1); then
  echo "prepare.sh: npm install failed (no network?):" >&2
  grep -v "Unknown user config" "$stage/npm.log" | grep -m 3 -i error >&2 || true
  exit 1
fi
rm -rf "$stage/.npm-cache" "$stage/npm.log"
if ! ready "$stage"; then
  echo "prepare.sh: npm install did not produce ${MARKERS[*]}" >&2
  exit 1
fi
if ready "$dir"; then  # Someone else finished first.
  echo "prepare.sh: Node reflection client ready in $dir"
  exit 0
fi
rm -rf "$dir"
mv -T "$stage" "$dir"
trap - EXIT
echo "prepare.sh: installed the Node reflection client into $dir"
