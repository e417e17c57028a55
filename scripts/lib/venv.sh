# shellcheck shell=bash
# Sourced, not run. Project-local Python virtual environments: no script of this project installs a Python
# package anywhere else (a stock Debian's python3 is EXTERNALLY-MANAGED, PEP 668).
#
#   . scripts/lib/venv.sh
#   hub_venv DIR REQUIREMENTS_FILE     # makes DIR a venv with exactly those pinned packages, or reuses it
#   PATH="DIR/bin:$PATH"               # then `python3` is the venv's
#
# - The base interpreter is $HUB_PYTHON, default `python3` on PATH.
# - When that python cannot make a venv (Debian ships `venv`/`ensurepip` in the separate package python3-venv),
#   and we are root with apt-get, installs python3-venv (apt-get update first); otherwise says what to install.
# - Reuse: DIR/.hub-venv-stamp records the interpreter's version and the requirements file's content; pip runs
#   again only when either changed, and a broken venv (its interpreter gone, no pip) is made again from scratch.
# - Concurrent callers on the same DIR wait for each other (flock on DIR.lock).
# Messages go to stderr, prefixed with the calling script's name.

hub_venv_say() { echo "${HUB_VENV_WHO:-$(basename "$0")}: $*" >&2; }

# hub_venv_python_ok PY: PY can make a venv with pip in it.
hub_venv_python_ok() { "$1" -c 'import venv, ensurepip' > /dev/null 2>&1; }

# hub_venv_ensure_base: sets HUB_VENV_BASE to a python3 that can make venvs, installing python3-venv if needed.
hub_venv_ensure_base() {
    HUB_VENV_BASE=${HUB_PYTHON:-python3}
    if ! command -v "$HUB_VENV_BASE" > /dev/null 2>&1; then
        if [ "$(id -u)" = 0 ] && command -v apt-get > /dev/null 2>&1; then
            hub_venv_say "no $HUB_VENV_BASE: installing python3 and python3-venv (apt)"
            apt-get update -qq < /dev/null >&2
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 python3-venv < /dev/null >&2
        fi
        command -v "$HUB_VENV_BASE" > /dev/null 2>&1 || { hub_venv_say "no $HUB_VENV_BASE on PATH (install Python >= 3.9)"; return 1; }
    fi
    hub_venv_python_ok "$HUB_VENV_BASE" && return 0
    if [ "$(id -u)" = 0 ] && command -v apt-get > /dev/null 2>&1; then
        hub_venv_say "$HUB_VENV_BASE cannot make a venv (no ensurepip): installing python3-venv (apt)"
        apt-get update -qq < /dev/null >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv < /dev/null >&2
    fi
    if ! hub_venv_python_ok "$HUB_VENV_BASE"; then
        hub_venv_say "$HUB_VENV_BASE cannot make a venv: install python3-venv (Debian/Ubuntu: apt-get install python3-venv)"
        return 1
    fi
}

# hub_venv DIR REQUIREMENTS_FILE
hub_venv() {
    local dir=$1 req=$2 fd stamp rc=0
    [ -f "$req" ] || { hub_venv_say "requirements file $req not found"; return 1; }
    mkdir -p "$(dirname "$dir")"
    exec {fd}> "$dir.lock"
    flock "$fd"
    hub_venv_make "$dir" "$req" || rc=$?
    exec {fd}>&-
    return $rc
}

hub_venv_make() {
    local dir=$1 req=$2 want have
    if [ -e "$dir" ] && ! "$dir/bin/python" -m pip --version > /dev/null 2>&1; then
        hub_venv_say "$dir is not a working venv: making it again"
        rm -rf "$dir"
    fi
    if [ ! -x "$dir/bin/python" ]; then
        hub_venv_ensure_base || return 1
        hub_venv_say "creating the venv $dir ($("$HUB_VENV_BASE" -c 'import sys; print(sys.executable, sys.version.split()[0])'))"
        if ! "$HUB_VENV_BASE" -m venv "$dir" >&2; then
            rm -rf "$dir"
            hub_venv_say "$HUB_VENV_BASE -m venv $dir failed"
            return 1
        fi
    fi
    want="python $("$dir/bin/python" -c 'import sys; print(sys.version.split()[0])')
$(cat "$req")"
    have=$(cat "$dir/.hub-venv-stamp" 2> /dev/null || true)
    if [ "$want" != "$have" ]; then
        hub_venv_say "pip install -r $req into $dir"
        rm -f "$dir/.hub-venv-stamp"
        if ! "$dir/bin/python" -m pip install --quiet --disable-pip-version-check -r "$req" < /dev/null >&2; then
            hub_venv_say "pip install -r $req failed (the venv is left unstamped and will be retried)"
            return 1
        fi
        printf '%s\n' "$want" > "$dir/.hub-venv-stamp"
    fi
}
