#!/usr/bin/env bash
# Make this machine able to run kind: a Docker daemon, and on kernels without CAP_SYS_RESOURCE a
# runc wrapper as Docker's default runtime (kind's node containers are privileged). Also the
# Debian tools the image builds use (mmdebstrap, jq). Idempotent: a second run changes nothing and
# only starts daemons that are not running.
#
# Needs root and apt-get for what is missing; says so and stops otherwise. Before it installs a
# package or changes Docker's default runtime it asks (on a terminal), unless POSTTRAIN_ASSUME_YES=1
# (`make test YES=1`); without a terminal and without that, it stops and says what it would change.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
LOG_DIR=${DOCKER_SETUP_LOG_DIR:-/var/log/posttrain-docker}
WRAPPER=/usr/local/sbin/runc-without-sys-resource
RUNTIME_NAME=runc-without-sys-resource
DAEMON_JSON=/etc/docker/daemon.json
PACKAGES=(docker.io containerd runc jq mmdebstrap iptables)

say() { echo "[docker-setup] $*" >&2; }
die() { say "ERROR: $*"; exit 1; }

docker_works() { docker info >/dev/null 2>&1; }

# confirm WHAT: go on if told to (POSTTRAIN_ASSUME_YES=1) or if the person at the terminal says yes.
confirm() {
    [[ ${POSTTRAIN_ASSUME_YES:-0} == 1 ]] && return 0
    if [[ ! -t 0 ]]; then
        die "this would $1. Say yes with POSTTRAIN_ASSUME_YES=1 (make test YES=1), or do it by hand (README: What make test changes on this machine)"
    fi
    local answer
    read -r -p "[docker-setup] this will $1. Go on? [y/N] " answer
    [[ $answer == [yY] || $answer == [yY][eE][sS] ]] || die "stopped: nothing was changed by this step"
}

# CAP_SYS_RESOURCE is capability 24; CapBnd is the bounding set in hex.
kernel_lacks_sys_resource() {
    local bnd
    bnd=$(awk '/^CapBnd:/ {print $2}' /proc/self/status)
    (( (16#$bnd >> 24 & 1) == 0 ))
}

need_root() {
    [[ $(id -u) == 0 ]] || die "$1 needs root. Run \`sudo make docker-host\` once, or do it by hand: $2"
}

install_packages() {
    local missing=()
    for pkg in "${PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
    done
    [[ ${#missing[@]} == 0 ]] && return 0
    need_root "installing ${missing[*]}" "apt-get install ${missing[*]}"
    command -v apt-get >/dev/null || die "no apt-get here: install ${missing[*]} (or Docker and mmdebstrap) with this system's package manager"
    confirm "install the system packages ${missing[*]} (apt-get)"
    say "installing ${missing[*]} (apt-get)"
    # Debian's postinst scripts must not start daemons we start ourselves below.
    local policy=/usr/sbin/policy-rc.d
    local own_policy=0
    if [[ ! -e $policy ]]; then
        printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod +x "$policy" && own_policy=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null \
        || { [[ $own_policy == 1 ]] && rm -f "$policy"; die "apt-get install ${missing[*]} failed"; }
    [[ $own_policy == 1 ]] && rm -f "$policy"
    return 0
}

install_runtime_wrapper() {
    if ! kernel_lacks_sys_resource; then
        say "kernel grants CAP_SYS_RESOURCE: Docker's own runc is used as is"
        return 1
    fi
    need_root "installing the runc wrapper" "see devstack/kind/host/runc-without-sys-resource"
    if ! cmp -s "$HERE/runc-without-sys-resource" "$WRAPPER" \
        || [[ $(jq -r '."default-runtime" // ""' "$DAEMON_JSON" 2>/dev/null) != "$RUNTIME_NAME" ]]; then
        confirm "install $WRAPPER, make it Docker's default runtime in $DAEMON_JSON and restart dockerd"
    fi
    if ! cmp -s "$HERE/runc-without-sys-resource" "$WRAPPER"; then
        install -m 0755 "$HERE/runc-without-sys-resource" "$WRAPPER"
        say "installed $WRAPPER (drops CAP_SYS_RESOURCE, which this kernel lacks)"
    fi
    mkdir -p "$(dirname "$DAEMON_JSON")"
    local current wanted
    current=$(cat "$DAEMON_JSON" 2>/dev/null || echo '{}')
    wanted=$(jq --arg name "$RUNTIME_NAME" --arg path "$WRAPPER" \
        '.runtimes[$name] = {path: $path} | ."default-runtime" = $name' <<<"$current") \
        || die "$DAEMON_JSON is not valid JSON; fix or remove it"
    if [[ $(jq -S . <<<"$current") != $(jq -S . <<<"$wanted") ]]; then
        echo "$wanted" > "$DAEMON_JSON"
        say "registered $RUNTIME_NAME as Docker's default runtime in $DAEMON_JSON"
        return 0
    fi
    return 1
}

wait_for() {
    local what=$1 tries=$2
    shift 2
    for _ in $(seq "$tries"); do
        "$@" >/dev/null 2>&1 && return 0
        sleep 1
    done
    die "$what did not come up; see $LOG_DIR"
}

start_daemons() {
    local restart=$1
    if docker_works && [[ $restart == 0 ]]; then
        return 0
    fi
    need_root "starting the Docker daemon" "containerd & dockerd &"
    mkdir -p "$LOG_DIR"
    if [[ -d /run/systemd/system ]] && command -v systemctl >/dev/null; then
        if [[ $restart == 1 ]]; then systemctl restart docker; else systemctl start containerd docker; fi
    else
        # No systemd as PID 1 (containers, CI sandboxes): run the daemons in the background.
        if [[ $restart == 1 ]] && [[ -f /var/run/docker.pid ]]; then
            say "restarting dockerd to pick up $DAEMON_JSON"
            kill "$(cat /var/run/docker.pid)" 2>/dev/null || true
            wait_for "dockerd shutdown" 60 test ! -e /var/run/docker.pid
        fi
        if ! ctr --address /run/containerd/containerd.sock version >/dev/null 2>&1; then
            say "starting containerd (log: $LOG_DIR/containerd.log)"
            setsid nohup containerd >>"$LOG_DIR/containerd.log" 2>&1 < /dev/null &
            wait_for containerd 30 ctr --address /run/containerd/containerd.sock version
        fi
        if ! docker_works; then
            say "starting dockerd (log: $LOG_DIR/dockerd.log)"
            setsid nohup dockerd --host=unix:///var/run/docker.sock --containerd=/run/containerd/containerd.sock \
                >>"$LOG_DIR/dockerd.log" 2>&1 < /dev/null &
        fi
    fi
    wait_for dockerd 60 docker info
}

main() {
    if command -v docker >/dev/null && docker_works && command -v mmdebstrap >/dev/null && command -v jq >/dev/null; then
        if ! kernel_lacks_sys_resource || [[ $(docker info --format '{{.DefaultRuntime}}' 2>/dev/null) == "$RUNTIME_NAME" ]]; then
            say "Docker is running ($(docker version --format '{{.Server.Version}}')); nothing to do"
            return 0
        fi
    fi
    install_packages
    local restart=0
    install_runtime_wrapper && restart=1
    docker_works || restart=0
    start_daemons "$restart"
    say "Docker $(docker version --format '{{.Server.Version}}') is running (default runtime: $(docker info --format '{{.DefaultRuntime}}'))"
}

main "$@"
