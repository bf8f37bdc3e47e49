#!/usr/bin/env bash
# Prints the path of a CPython 3.13 interpreter, building it first if this machine has none.
#
# Why: openpipe-art 0.5.20 and later need Python >= 3.12, and CI must prove artstore on the
# newest ART as well as on 0.5.18 (Python 3.11). Debian 12 ships only 3.11, so CPython 3.13 is
# built once from the source package of Debian 13 ("trixie"), fetched with apt from the
# machine's own Debian mirror, and kept under $PY313_PREFIX (default /opt/py313). The first
# build takes 5 to 10 minutes on 2 cores; later calls print the kept interpreter at once.
set -euo pipefail

# pyenv's builds count too: a machine with pyenv often has 3.13 without it on PATH.
for found in python3.13 "${PY313_PREFIX:-/opt/py313}/bin/python3.13" \
  "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.13*/bin/python3.13; do
  if command -v "$found" >/dev/null 2>&1 \
    && "$found" -c "import ssl, sqlite3, ctypes, lzma, bz2, zlib, ensurepip" 2>/dev/null; then
    command -v "$found"
    exit 0
  fi
done

prefix="${PY313_PREFIX:-/opt/py313}"
python="$prefix/bin/python3.13"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The first mirror of the machine's apt sources, asked for Debian 13's source packages.
mirror=$(grep -hE '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -1 | awk '{print $2}')
[ -n "$mirror" ] || mirror=$(grep -hE '^deb ' /etc/apt/sources.list 2>/dev/null | head -1 | awk '{print $2}')
[ -n "$mirror" ] || { echo "no Debian mirror in the apt sources" >&2; exit 1; }
printf 'Types: deb-src\nURIs: %s\nSuites: trixie\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
  "$mirror" >"$work/trixie.sources"
mkdir -p "$work/lists/partial"
apt_options=(-o "Dir::Etc::sourcelist=$work/trixie.sources" -o Dir::Etc::sourceparts=/dev/null
  -o "Dir::State::Lists=$work/lists")

# What the standard library's C modules link against, from the machine's own release.
build_deps=(libssl-dev libffi-dev zlib1g-dev libsqlite3-dev libbz2-dev liblzma-dev libreadline-dev uuid-dev)
if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${build_deps[@]}" >/dev/null 2>&1; then
  apt-get update -qq >/dev/null 2>&1
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${build_deps[@]}" >/dev/null
fi
apt-get "${apt_options[@]}" update -qq >/dev/null 2>&1
(cd "$work" && apt-get "${apt_options[@]}" source --download-only python3.13 >/dev/null 2>&1)
tar -xf "$work"/python3.13_*.orig.tar.xz -C "$work"
cd "$work"/Python-3.13.*
./configure --prefix="$prefix" --without-ensurepip -q >"$work/configure.log" 2>&1
make -j"$(nproc)" -s >"$work/make.log" 2>&1 || { tail -30 "$work/make.log" >&2; exit 1; }
make -s install >"$work/install.log" 2>&1
"$python" -c "import ssl, sqlite3, ctypes, lzma, bz2, zlib, ensurepip" >/dev/null
echo "$python"
