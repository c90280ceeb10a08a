#!/usr/bin/env bash
# Adding unet-attention (or unet-parity without its `hub` feature) to a project that already builds
# candle-transformers 0.11.1 must not rebuild Candle: Cargo unifies the features of a crate that two
# dependencies share, so one feature this workspace turned on in a crate Candle also uses (it was
# gemm's `x86-v4`) changes that crate's build and rebuilds candle-core, candle-nn and
# candle-transformers above it (424 s on 2 cores, issue 57). This compares every package's
# features in a scratch project before and after adding our crates (`cargo tree`, no build) and
# fails naming the packages whose features change.
#
#   bash scripts/check_no_candle_rebuild.sh        # from the repository root
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
mkdir -p "$dir/src"
echo 'fn main() {}' > "$dir/src/main.rs"
# The workspace's lock pins the versions Candle is built with here.
cp "$repo/Cargo.lock" "$dir/"
manifest() {
  cat <<TOML
[package]
name = "candle-user"
version = "0.1.0"
edition = "2021"

[dependencies]
candle-core = "0.11.1"
candle-nn = "0.11.1"
candle-transformers = "0.11.1"
$1
TOML
}
features() {
  (cd "$dir" && cargo tree -q -e normal --prefix none -f '{p} [{f}]') \
    | grep -v -e "^unet-" -e "$repo" | sed 's/ (\*)$//' | sort -u
}
manifest "" > "$dir/Cargo.toml"
features > "$dir/before"
manifest "unet-attention = { path = \"$repo/crates/attention\" }
unet-parity = { path = \"$repo/crates/parity\", default-features = false }" > "$dir/Cargo.toml"
features > "$dir/after"
# A package in both lists with other features is rebuilt, and so is everything above it.
changed="$(join -j1 <(sed 's/ \[/\t[/' "$dir/before" | sort) <(sed 's/ \[/\t[/' "$dir/after" | sort) -t $'\t' \
  | awk -F'\t' '$2 != $3' || true)"
if [ -n "$changed" ]; then
  echo "adding unet-attention / unet-parity changes the features of packages Candle builds with:" >&2
  echo "$changed" | sed 's/^/  /' >&2
  exit 1
fi
echo "adding unet-attention and unet-parity (default-features = false) to a candle-transformers 0.11.1 project changes the features of no package Candle builds with: Candle is not rebuilt"
