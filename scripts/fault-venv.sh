# shellcheck shell=bash
# Sourced by scripts/soak and scripts/netem: makes sure the project-local venv .build/venv has the pinned
# `websockets` and sets FAULT_PY to its python. Never installs into the system Python.
#
# When the shared helper scripts/lib/venv.sh and scripts/requirements-test.txt exist, they are used (one venv for
# every script of the project). Until then, this makes the same venv itself with the same pin.
FAULT_WEBSOCKETS_PIN="websockets==15.0.1"

fault_venv() {
    local who=$1 root=$2 venv="$2/.build/venv"
    if [ -f "$root/scripts/lib/venv.sh" ] && [ -f "$root/scripts/requirements-test.txt" ]; then
        # shellcheck disable=SC1091
        . "$root/scripts/lib/venv.sh"
        HUB_VENV_WHO=$who hub_venv "$venv" "$root/scripts/requirements-test.txt" || return 1
    else
        if ! "$venv/bin/python" -m pip --version > /dev/null 2>&1; then
            rm -rf "$venv"
            if ! python3 -c 'import venv, ensurepip' > /dev/null 2>&1; then
                if [ "$(id -u)" = 0 ] && command -v apt-get > /dev/null 2>&1; then
                    echo "$who: python3 cannot make a venv: installing python3-venv (apt)" >&2
                    apt-get update -qq < /dev/null >&2
                    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv < /dev/null >&2
                else
                    echo "$who: python3 cannot make a venv: install python3-venv" >&2
                    return 1
                fi
            fi
            echo "$who: creating the venv $venv" >&2
            mkdir -p "$root/.build"
            python3 -m venv "$venv" >&2 || return 1
        fi
        if [ "$("$venv/bin/python" -c 'import websockets; print(websockets.__version__)' 2> /dev/null)" != "${FAULT_WEBSOCKETS_PIN#websockets==}" ]; then
            echo "$who: pip install $FAULT_WEBSOCKETS_PIN into $venv" >&2
            "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$FAULT_WEBSOCKETS_PIN" < /dev/null >&2 || return 1
        fi
    fi
    # shellcheck disable=SC2034 # used by the scripts that source this file
    FAULT_PY="$venv/bin/python"
}
