# Benchmarks/lib.sh: what the single-measurement scripts (setup-cost, setup-cpu, delivery-cost, delivery-cpu)
# share. Source it after `set -euo pipefail` with `tool` (the script's name, for messages) and `servers` (the
# SERVER arguments) set; it sets `here`, `root`, `bench`, `work` (removed on exit), `pid` (the server running now,
# stopped on exit) and exports one random JWT secret to the hub, hubbench and the peers.
#
# A SERVER is `hub` (this checkout's release build), `uws` (Peers/uws, one thread; Peers/install builds it), or
# the path of another hub binary; NAME@T runs a hub with --threads T; NAME,FLAG[,FLAG...] passes a hub those flags
# (`hub,--history-size=0`: the same build without retained history, in the same rounds).

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
bench=$here/.build/release/hubbench
say() { echo "$tool: $*" >&2; }

# need COMMAND PACKAGE: installs Debian's PACKAGE when COMMAND is missing.
need() {
    command -v "$1" > /dev/null && return
    say "apt-get install $2"
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$2" > /dev/null 2>&1 \
        || { apt-get update > /dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$2" > /dev/null; }
}

[ -x "$bench" ] || { say "building hubbench (release)"; swift build -c release --package-path "$here" --product hubbench 2>&1 | tail -1 >&2; }
if [[ " ${servers[*]} " =~ \ hub[@,\ ] ]] && [ ! -x "$root/.build/release/hub" ]; then
    say "building the hub (release)"; swift build -c release --package-path "$root" --product hub 2>&1 | tail -1 >&2
fi

work=$(mktemp -d "/tmp/hub-$tool.XXXXXX")
pid=
cleanup() { [ -n "$pid" ] && kill -TERM "$pid" 2> /dev/null; rm -rf "$work"; }
trap cleanup EXIT
secret=$(head -c 32 /dev/urandom | base64 | tr -d '/+=\n' | head -c 43)
export HUB_JWT_SECRET=$secret HUBBENCH_SECRET=$secret PEER_JWT_SECRET=$secret
port_open() { (exec 3<> "/dev/tcp/127.0.0.1/$1") 2> /dev/null; }

# server_command SERVER DIR: sets `port` (a free one), `cmd` (the server's command line, state in DIR) and
# `args` (hubbench's arguments for that server).
server_command() {
    local spec=$1 d=$2 base bin threads=() flags=()
    port=$((29000 + RANDOM % 2000))
    while port_open $port; do port=$((port + 1)); done
    base=${spec%%,*}
    [ "$base" != "$spec" ] && IFS=, read -r -a flags <<< "${spec#*,}"
    bin=${base%@*}
    [ "$base" != "$bin" ] && threads=(--threads "${base#*@}")
    case "$bin" in
    uws)
        [ ${#threads[@]} -eq 0 ] && [ ${#flags[@]} -eq 0 ] || { say "$spec: the uws peer takes no @T or flags"; exit 1; }
        cmd=("$root/.build/uws-peer" --port "$port")
        [ -x "${cmd[0]}" ] || { say "${cmd[0]} is not built: run Benchmarks/Peers/install"; exit 1; }
        args=(--server uws --kind jwt --port "$port" --publish "http://127.0.0.1:$port/publish") ;;
    *)
        [ "$bin" = hub ] && bin=$root/.build/release/hub
        cmd=("$bin" "${threads[@]}" "${flags[@]}" --listen "127.0.0.1:$port" --socket "$d/hub.sock" --state-dir "$d/state")
        args=(--server hub --kind hub --port "$port" --publish "unix:$d/hub.sock") ;;
    esac
}

# wait_listening SERVER TRIES LOG: waits (0.2 s a try) for the server's port, or says so (pointing at LOG) and exits.
wait_listening() {
    for _ in $(seq "$2"); do port_open "$port" && return; sleep 0.2; done
    say "$1 did not come up ($3)"
    exit 1
}

# per_round_ratios FILE: FILE has a line per run, "SERVER CPU ...", every server once per round in the same order.
# With two servers or more, prints each one's CPU over the last one's, round by round, and the median of those
# ratios: each round measures every server back to back, so a ratio inside one round cancels the machine's drift
# between rounds, which a ratio of two medians does not.
per_round_ratios() {
    python3 - "$1" <<'PY'
import sys, statistics, collections
rows = collections.OrderedDict()
for line in open(sys.argv[1]):
    f = line.split()
    rows.setdefault(f[0], []).append(float(f[1]))
names = list(rows)
for s in names[:-1]:
    r = [a / b for a, b in zip(rows[s], rows[names[-1]]) if b > 0]
    if r:
        print('%-34s CPU / %s per round: %s; median %.3f'
              % (s[-34:], names[-1][-34:], ' '.join('%.3f' % x for x in r), statistics.median(r)))
PY
}

# stop_server SECONDS: SIGTERM, then waits up to SECONDS for the server to exit; fails (after a SIGKILL) if it
# did not.
stop_server() {
    kill -TERM "$pid"
    if timeout "$1" tail --pid="$pid" -f /dev/null; then pid=; return 0; fi
    kill -KILL "$pid" 2> /dev/null || true
    pid=
    return 1
}
