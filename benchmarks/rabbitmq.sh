#!/usr/bin/env bash
# A throw-away RabbitMQ node for benchmarks/suite.py, listening on 127.0.0.1 only.
#
#   benchmarks/rabbitmq.sh start    # install rabbitmq-server if missing, start, wait until ready
#   benchmarks/rabbitmq.sh stop     # stop the node and its epmd
#   benchmarks/rabbitmq.sh status   # is it running? which ports does it listen on?
#
# Needs root (apt-get; the node runs as the package's `rabbitmq` user). Does not use systemd:
# the node runs in the background with its own pid file. Its state (config, Mnesia, logs) lives
# in $RAYBUS_RMQ_DIR (default /var/lib/rabbitmq/raybus-bench); the package's own config in
# /etc/rabbitmq is neither read nor changed. AMQP: 127.0.0.1:5672 ($RAYBUS_RMQ_PORT);
# distribution: 127.0.0.1:25672 ($RAYBUS_RMQ_DIST_PORT); epmd: 127.0.0.1:4369. No management
# plugin, no other plugins.
set -euo pipefail

DIR=${RAYBUS_RMQ_DIR:-/var/lib/rabbitmq/raybus-bench}
PORT=${RAYBUS_RMQ_PORT:-5672}
DIST_PORT=${RAYBUS_RMQ_DIST_PORT:-25672}
NODE=${RAYBUS_RMQ_NODE:-raybusbench@localhost}
PIDFILE=$DIR/rabbitmq.pid
BIN=/usr/lib/rabbitmq/bin

log() { echo "rabbitmq.sh: $*" >&2; }

need_root() {
    if [ "$(id -u)" != 0 ]; then
        log "needs root (apt-get, and to run the node as the rabbitmq user)"
        exit 2
    fi
}

install() {
    # ss (iproute2) is how start() checks that epmd listens on loopback only.
    if ! command -v ss >/dev/null 2>&1; then
        log "installing the Debian package iproute2 (ss)"
        apt-get -y -q update >/dev/null || true
        DEBIAN_FRONTEND=noninteractive apt-get -y -q install --no-install-recommends \
            iproute2 >/dev/null
    fi
    if [ -x "$BIN/rabbitmq-server" ]; then
        return
    fi
    log "installing the Debian package rabbitmq-server"
    export DEBIAN_FRONTEND=noninteractive
    apt-get -y -q update >/dev/null || true
    # RUNLEVEL=1 / policy-rc.d: the package must not start its own (all-interfaces) node.
    RUNLEVEL=1 apt-get -y -q install --no-install-recommends rabbitmq-server >/dev/null
    # Just in case the package's init script did start the default node, stop it.
    if command -v service >/dev/null 2>&1; then
        service rabbitmq-server stop >/dev/null 2>&1 || true
    fi
}

write_config() {
    mkdir -p "$DIR/mnesia" "$DIR/log"
    cat >"$DIR/rabbitmq.conf" <<EOF
# Written by benchmarks/rabbitmq.sh: loopback only, no management plugin.
listeners.tcp.1 = 127.0.0.1:$PORT
listeners.ssl = none
loopback_users.guest = true
log.file.level = warning
log.console = false
EOF
    echo "[]." >"$DIR/enabled_plugins"
    chown -R rabbitmq:rabbitmq "$DIR"
}

# Run a RabbitMQ program as the rabbitmq user with this node's environment.
as_rabbitmq() {
    runuser -u rabbitmq -- env \
        HOME=/var/lib/rabbitmq \
        RABBITMQ_NODENAME="$NODE" \
        RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 \
        RABBITMQ_NODE_PORT="$PORT" \
        RABBITMQ_DIST_PORT="$DIST_PORT" \
        ERL_EPMD_ADDRESS=127.0.0.1 \
        RABBITMQ_CONFIG_FILE="$DIR/rabbitmq.conf" \
        RABBITMQ_ENABLED_PLUGINS_FILE="$DIR/enabled_plugins" \
        RABBITMQ_ENABLED_PLUGINS="" \
        RABBITMQ_MNESIA_BASE="$DIR/mnesia" \
        RABBITMQ_LOG_BASE="$DIR/log" \
        RABBITMQ_PID_FILE="$PIDFILE" \
        RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}" \
        RABBITMQ_CTL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}" \
        "$@"
}

# epmd's listening addresses (port 4369), one per line.
epmd_addresses() {
    ss -ltnH "sport = :4369" 2>/dev/null | awk '{print $4}'
}

epmd_listening() {
    [ -n "$(epmd_addresses)" ]
}

# True when no epmd listens, or every address it listens on is a loopback one.
epmd_loopback_only() {
    ! epmd_addresses | grep -qvE '^(127\.0\.0\.1|\[::1\]):4369$'
}

running() {
    [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null
}

# True when every port the node (pid $1) listens on is a loopback one.
node_loopback_only() {
    ! ss -ltnpH 2>/dev/null | grep -F "pid=$1," | awk '{print $4}' |
        grep -qvE '^(127\.0\.0\.1|\[::1\]):[0-9]+$'
}

start() {
    need_root
    install
    if running; then
        # Started earlier, perhaps by another version of this script: it must still listen
        # on loopback only, and so must its epmd.
        if ! node_loopback_only "$(cat "$PIDFILE")" || ! epmd_loopback_only; then
            log "the running node or its epmd listens beyond loopback; stop it first"
            ss -ltnp 2>/dev/null | grep -E 'beam|epmd' >&2 || true
            exit 1
        fi
        log "already running (pid $(cat "$PIDFILE")), loopback only"
        return
    fi
    write_config
    log "starting node $NODE on 127.0.0.1:$PORT"
    # epmd first, bound to loopback (the node would otherwise start one itself). Installing
    # the package starts one that listens on every interface (seen on Debian 12): replace it.
    if ! epmd_loopback_only; then
        log "an epmd listens beyond loopback: stopping it"
        pkill -x epmd || true
        sleep 0.5
    fi
    runuser -u rabbitmq -- env ERL_EPMD_ADDRESS=127.0.0.1 epmd -daemon
    local e=0
    until epmd_listening; do
        sleep 0.2
        e=$((e + 1))
        if [ $e -gt 50 ]; then
            log "epmd did not start"
            exit 1
        fi
    done
    if ! epmd_loopback_only; then
        log "epmd listens beyond loopback; refusing to start"
        ss -ltnp "sport = :4369" >&2 || true
        exit 1
    fi
    (cd /var/lib/rabbitmq && as_rabbitmq setsid "$BIN/rabbitmq-server" \
        >"$DIR/log/startup.out" 2>"$DIR/log/startup.err" </dev/null &)
    local t=0
    while [ ! -s "$PIDFILE" ]; do
        sleep 0.5
        t=$((t + 1))
        if [ $t -gt 120 ]; then
            log "no pid file after 60 s"
            tail -20 "$DIR/log/startup.err" "$DIR/log/startup.out" >&2 || true
            exit 1
        fi
    done
    if ! timeout 120 bash -c "$(declare -f as_rabbitmq); DIR='$DIR' PORT='$PORT' \
        DIST_PORT='$DIST_PORT' NODE='$NODE' PIDFILE='$PIDFILE' BIN='$BIN'; \
        as_rabbitmq $BIN/rabbitmqctl -q wait --timeout 110 '$PIDFILE'" >/dev/null; then
        log "node did not become ready"
        tail -20 "$DIR/log/startup.err" "$DIR/log/startup.out" >&2 || true
        exit 1
    fi
    log "ready (pid $(cat "$PIDFILE"))"
}

stop() {
    need_root
    if running; then
        local pid
        pid=$(cat "$PIDFILE")
        log "stopping node $NODE (pid $pid)"
        timeout 60 bash -c "$(declare -f as_rabbitmq); DIR='$DIR' PORT='$PORT' \
            DIST_PORT='$DIST_PORT' NODE='$NODE' PIDFILE='$PIDFILE' BIN='$BIN'; \
            as_rabbitmq $BIN/rabbitmqctl -q stop '$PIDFILE'" >/dev/null 2>&1 ||
            kill "$pid" 2>/dev/null || true
        for _ in $(seq 1 60); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.5
        done
        kill -9 "$pid" 2>/dev/null || true
    fi
    rm -f "$PIDFILE"
    # epmd: ask it to stop (only when no other node is registered with it).
    if pgrep -x epmd >/dev/null 2>&1; then
        runuser -u rabbitmq -- env ERL_EPMD_ADDRESS=127.0.0.1 epmd -stop >/dev/null 2>&1 ||
            true
        runuser -u rabbitmq -- env ERL_EPMD_ADDRESS=127.0.0.1 epmd -kill >/dev/null 2>&1 ||
            true
    fi
    log "stopped"
}

status() {
    if running; then
        echo "running (pid $(cat "$PIDFILE"))"
    else
        echo "not running"
    fi
    if command -v ss >/dev/null 2>&1; then
        ss -ltnp 2>/dev/null | grep -E 'beam|epmd|erl' || true
    fi
}

case "${1:-}" in
start) start ;;
stop) stop ;;
status) status ;;
*)
    echo "usage: $0 start|stop|status" >&2
    exit 2
    ;;
esac
