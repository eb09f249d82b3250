#!/usr/bin/env bash
# Print the path of a CPython X.Y interpreter installed on this machine (not a virtualenv's), or
# exit 1 printing nothing. Usage: find-python.sh X.Y; UV names the uv to ask (default: uv on the PATH).
#
# Nothing is downloaded. uv's own search comes first (uv-managed installations, then the PATH); then
# pyenv's installed versions, because pyenv's shims run only the versions `pyenv global` or `pyenv
# local` selects and uv stops at the first shim that refuses.
set -uo pipefail

want=${1:?usage: find-python.sh X.Y}
uv=${UV:-uv}

# A CPython of the wanted version that is an installation, not a virtualenv made from one.
is_it() {
    [ -x "$1" ] && [ "$("$1" -c 'import sys
print("%d.%d" % sys.version_info[:2], sys.implementation.name, sys.prefix == sys.base_prefix)' \
        2>/dev/null)" = "$want cpython True" ]
}

# From / and outside any virtualenv: uv would otherwise pick this checkout's .venv first.
found=$(cd / && env -u VIRTUAL_ENV -u CONDA_PREFIX \
    "$uv" python find --no-project --no-python-downloads "cpython@$want" 2>/dev/null) &&
    is_it "$found" && { echo "$found"; exit 0; }

if command -v pyenv >/dev/null 2>&1; then
    # Newest patch release first.
    for version in $(pyenv versions --bare --skip-aliases --skip-envs 2>/dev/null |
        grep -E "^${want//./\\.}\.[0-9]+$" | sort -t. -k3,3nr); do
        candidate="$(pyenv prefix "$version" 2>/dev/null)/bin/python$want"
        is_it "$candidate" && { echo "$candidate"; exit 0; }
    done
fi
exit 1
