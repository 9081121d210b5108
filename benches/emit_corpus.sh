#!/usr/bin/env bash
# The emission corpus of the working tree (tests/emit_corpus.rs: C and CUDA source for every
# example under each AMP policy, every graph of the book and 500 random graphs), written to
# DIR. With a second argument REV, also the corpus of git revision REV (checked out in a
# temporary worktree) and the difference of the two: the check that a refactor of the
# lowering or the emitters changed no emitted byte.
#
#   benches/emit_corpus.sh /tmp/corpus            # this tree's corpus
#   benches/emit_corpus.sh /tmp/corpus main~3     # ... and main~3's, compared
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: emit_corpus.sh DIR [REV]}"
corpus() { # $1: tree, $2: directory
    rm -rf "$2"
    (cd "$1" && FUSEBOX_EMIT_CORPUS="$2" cargo test --quiet --release --test backends \
        emit_corpus -- --ignored >/dev/null)
    echo "$2: $(ls "$2" | wc -l) files"
}
mkdir -p "$out"
out="$(cd "$out" && pwd)"
corpus . "$out/current"
if [ -n "${2:-}" ]; then
    tree="$(mktemp -d)/tree"
    git worktree add --quiet --detach "$tree" "$2"
    trap 'git worktree remove --force "$tree"' EXIT
    CARGO_TARGET_DIR="$PWD/target/emit_corpus" corpus "$tree" "$out/base"
    if diff -r "$out/base" "$out/current" >"$out/diff.txt"; then
        echo "byte-identical: every file of the corpus"
    else
        echo "differences: $(grep -c '^diff' "$out/diff.txt" || true) files (see $out/diff.txt)"
        exit 1
    fi
fi
