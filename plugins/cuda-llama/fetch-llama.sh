#!/usr/bin/env bash
# Fetches the pinned llama.cpp tree (mk/llama-pin.mk) from the npm registry:
#
#   fetch-llama.sh PACKAGE@VERSION INTEGRITY COMMIT DEST
#
# `npm pack` downloads PACKAGE@VERSION's tarball (node-llama-cpp ships the
# whole llama.cpp tree in it as the git bundle llama/gitRelease.bundle); its
# SHA-512 must be INTEGRITY (npm's "sha512-BASE64" form), and the clone of
# the bundle is checked out at COMMIT (a full hash), which must exist in it.
# DEST receives the tree, and in DEST/.hydra the pin fetched (pin) and the
# tree's commit as a C header (hydra-llama-commit.h, read by the plugin's
# build); a DEST whose .hydra/pin names the same pin is reused as it is.
# Needs npm, node (the hash), tar and git.
set -euo pipefail

pkg=${1:?usage: fetch-llama.sh PACKAGE@VERSION INTEGRITY COMMIT DEST}
integrity=${2:?INTEGRITY}
commit=${3:?COMMIT}
dest=${4:?DEST}
pin="$pkg $integrity $commit"

die() { echo "fetch-llama: $*" >&2; exit 1; }

[[ $commit =~ ^[0-9a-f]{40}$ ]] || die "COMMIT must be a full 40-digit hash, not '$commit'"
[[ $integrity == sha512-* ]] || die "INTEGRITY must be npm's sha512-BASE64, not '$integrity'"
if [[ -f $dest/.hydra/pin && $(<"$dest/.hydra/pin") == "$pin" ]]; then
	exit 0
fi
for tool in npm node tar git; do
	command -v "$tool" >/dev/null || die "$tool not found (the llama.cpp tree comes from the npm registry as a git bundle)"
done

mkdir -p "$(dirname "$dest")"
tmp=$(mktemp -d "$dest.fetch.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
start=$(date +%s)
echo "fetch-llama: $pkg from the npm registry, llama.cpp $commit -> $dest"
(cd "$tmp" && npm pack --silent "$pkg" >/dev/null) || die "npm pack $pkg failed"
tarballs=("$tmp"/*.tgz)
[[ ${#tarballs[@]} == 1 && -f ${tarballs[0]} ]] || die "npm pack $pkg left no single tarball in $tmp"
tarball=${tarballs[0]}
got=$(node -e 'const c = require("crypto"), fs = require("fs");
process.stdout.write("sha512-" + c.createHash("sha512").update(fs.readFileSync(process.argv[1])).digest("base64"))' "$tarball")
[[ $got == "$integrity" ]] || die "$pkg: the tarball's integrity is $got, the pin says $integrity"

tar -xzf "$tarball" -C "$tmp" package/llama/gitRelease.bundle || die "$pkg has no llama/gitRelease.bundle"
bundle=$tmp/package/llama/gitRelease.bundle
git clone --quiet --no-checkout "$bundle" "$tmp/tree" || die "cloning $bundle failed"
git -C "$tmp/tree" cat-file -e "$commit^{commit}" 2>/dev/null || die "the bundle of $pkg has no commit $commit"
git -C "$tmp/tree" -c advice.detachedHead=false checkout --quiet --detach "$commit"
[[ $(git -C "$tmp/tree" rev-parse HEAD) == "$commit" ]] || die "checking out $commit failed"
git -C "$tmp/tree" remote remove origin # the bundle is deleted below
mkdir "$tmp/tree/.hydra"
printf '// The llama.cpp commit of this tree, written by fetch-llama.sh.\n#define HYDRA_LLAMA_COMMIT "%s"\n' \
	"$(git -C "$tmp/tree" rev-parse HEAD)" >"$tmp/tree/.hydra/hydra-llama-commit.h"
echo "$pin" >"$tmp/tree/.hydra/pin"

rm -rf "$dest"
mv "$tmp/tree" "$dest"
echo "fetch-llama: $dest ($(du -sm "$dest" | cut -f1) MB, $(($(date +%s) - start)) s)"
