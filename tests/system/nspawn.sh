#!/usr/bin/env bash
# The units under a real systemd: a minimal Debian bookworm (debootstrap, cached in build/nspawn-root) booted with
# systemd-nspawn, the built binaries, the units and a CPU job bound in. From outside (nsenter) it checks: every unit
# of dflash.target becomes active only through READY=1 (Type=notify, a STATUS= line set); a SIGKILLed target worker
# is restarted by systemd while the others keep their PIDs and training continues; a worker that stops pinging the
# watchdog (SIGSTOP) is restarted by systemd; `dflashctl rolling-restart drafter` goes through; `systemctl stop dflashd`
# ends it through its clean path (STOPPING=1, exit 0, Result=success, the reason in the journal) and `systemctl start`
# reattaches it from the fd store while training goes on; `dflashctl drain` ends the job and the ledger shows every
# batch exactly once. systemd keeps an fd store across a stop only from 254 on (FileDescriptorStorePreserve=), so on
# an older release (bookworm: 252) the image takes systemd from <release>-backports.
cd "$(dirname "$0")/../.." || exit 1
. tests/system/lib.bash
ROOT=build/nspawn-root
PKGS=systemd,systemd-sysv,dbus,libopenblas0-pthread,libjansson4,libinih1,libzmq5,libprotobuf-c1,libpcre2-8-0,libutf8proc2,libasan8,libubsan1  # the tokenizer's PCRE2 and utf8proc; the sanitizer runtimes: make SAN=1 test binds ASan builds in
skip() { echo "ok nspawn skipped: $1"; exit 0; }
[ "$(id -u)" = 0 ] || skip "not root"
command -v systemd-nspawn >/dev/null || skip "systemd-nspawn is not installed (Debian package systemd-container)"
command -v debootstrap >/dev/null || skip "debootstrap is not installed"
if [ ! -x "$ROOT/lib/systemd/systemd" ]; then # building the image takes ~400 MB: say so rather than fail half-way
    mkdir -p build
    free_mb=$(df -Pm build | awk 'NR == 2 { print $4 }')
    [ "${free_mb:-0}" -ge 1500 ] || skip "only ${free_mb} MB free under build/ (the image needs ~400 MB, 1500 asked)"
fi
# the host's release (the bound-in binaries are built against its libraries) and its Debian mirror
SUITE=$(. /etc/os-release 2>/dev/null; echo "${VERSION_CODENAME:-bookworm}")
MIRROR=$( { sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/*.sources 2>/dev/null; awk '$1 == "deb" { print $2 }' /etc/apt/sources.list 2>/dev/null; } |
          tr ' ' '\n' | grep -E '^https?://' | grep -v -e security -e '/debian-' | head -1)
MIRROR=${MIRROR:-http://deb.debian.org/debian}
# the cached image is rebuilt when the release or the package list changed
IMAGE="$SUITE $PKGS systemd>=254"
if [ ! -x "$ROOT/lib/systemd/systemd" ] || [ "$(cat "$ROOT/.dflash-pkgs" 2>/dev/null)" != "$IMAGE" ]; then
    rm -rf "$ROOT"
    t0=$SECONDS
    rm -rf "$ROOT.tmp"
    if ! debootstrap --variant=minbase --include=$PKGS "$SUITE" "$ROOT.tmp" "$MIRROR" >"$T/debootstrap.log" 2>&1; then
        fail nspawn_image "debootstrap $SUITE from $MIRROR failed: $(tail -3 "$T/debootstrap.log")"; exit 1
    fi
    sdv=$(chroot "$ROOT.tmp" dpkg-query -W -f '${Version}' systemd 2>/dev/null | cut -d. -f1)
    if [ "${sdv:-0}" -lt 254 ] 2>/dev/null; then
        echo "deb $MIRROR $SUITE-backports main" >"$ROOT.tmp/etc/apt/sources.list.d/backports.list"
        { chroot "$ROOT.tmp" apt-get update && chroot "$ROOT.tmp" env DEBIAN_FRONTEND=noninteractive \
              apt-get install -y --no-install-recommends -t "$SUITE-backports" systemd systemd-sysv; } >>"$T/debootstrap.log" 2>&1 ||
            echo "nspawn: systemd $sdv and none newer from $SUITE-backports ($(tail -1 "$T/debootstrap.log")): the stop/start check will be skipped"
        chroot "$ROOT.tmp" apt-get clean >/dev/null 2>&1
    fi
    echo "$IMAGE" >"$ROOT.tmp/.dflash-pkgs"
    mv "$ROOT.tmp" "$ROOT"
    echo "nspawn: built $ROOT ($SUITE from $MIRROR) in $((SECONDS - t0)) s"
fi
make_fixture || { fail nspawn_fixture "$(tail -3 "$T/fixture.log")"; exit 1; }
J=/var/lib/dflash
cat >"$T/dflash.ini" <<EOC
[job]
name = t$$-ns
run_dir = $J/job
seed = 77
[data]
path = $J/data
max_batch_tokens = 128
max_batch_seqs = 8
[target]
model = $J/target
[drafter]
layers = 1
block_size = 4
num_taps = 2
max_anchors = 8
[train]
steps = 1000000
warmup_steps = 3
checkpoint_every = 0
lr = 3e-3
[workers]
targets = 2
drafters = 2
heartbeat_timeout_sec = 120
[ring]
token_slots = 4
pool_slots = 2
EOC
mkdir -p "$T/dropin"
printf '[Service]\nWatchdogSec=3\n' >"$T/dropin/watchdog.conf"
binds=(--bind="$T:$J" --bind-ro="$(realpath "$BIN"):/usr/local/bin" --bind-ro="$T/dflash.ini:/etc/dflash/dflash.ini"
       --bind-ro="$T/dropin:/etc/systemd/system/dflash-target@.service.d")
for u in deploy/systemd/*; do binds+=(--bind-ro="$(realpath "$u"):/etc/systemd/system/$(basename "$u")"); done
systemd-nspawn --register=no --keep-unit -q -D "$ROOT" "${binds[@]}" -b >"$T/nspawn.log" 2>&1 &
ns=$!
cleanup_ns() { [ -n "${leader:-}" ] && nsenter -t "$leader" -a systemctl poweroff >/dev/null 2>&1; sleep 2; kill "$ns" 2>/dev/null; wait "$ns" 2>/dev/null; cleanup; }
trap cleanup_ns EXIT
leader=""
deadline=$((SECONDS + 60))
while [ -z "$leader" ] && [ $SECONDS -lt $deadline ]; do sleep 0.5; leader=$(pgrep -P "$ns" | head -1); done
C() { nsenter -t "$leader" -a "$@"; }
until state=$(C systemctl is-system-running 2>/dev/null); [ "$state" = running ] || [ "$state" = degraded ] || [ $SECONDS -ge $deadline ]; do sleep 0.5; done
[ "$state" = running ] || [ "$state" = degraded ] || { fail nspawn_boot "container state '$state': $(tail -5 "$T/nspawn.log")"; exit 1; }
ok "nspawn_boot ($state)"

units=(dflashd.service dflash-prefetch.service dflash-target@0.service dflash-target@1.service dflash-drafter@0.service dflash-drafter@1.service)
mainpid() { C systemctl show -p MainPID --value "$1"; }
C systemctl start dflash.target
deadline=$((SECONDS + 90))
until [ "$(C systemctl is-active "${units[@]}" | grep -c '^active$')" = 6 ] || [ $SECONDS -ge $deadline ]; do sleep 0.5; done
bad=""
for u in "${units[@]}"; do
    typ=$(C systemctl show -p Type --value "$u"); st=$(C systemctl show -p ActiveState --value "$u")
    text=$(C systemctl show -p StatusText --value "$u")
    [ "$typ" = notify ] && [ "$st" = active ] && [ -n "$text" ] || bad+=" $u($typ,$st,'$text')"
done
if [ -z "$bad" ]; then ok "nspawn_units_active_after_ready (6 units Type=notify, active, STATUS set)"
else fail nspawn_units_active_after_ready "$bad; $(C journalctl -n 20 --no-pager 2>&1 | tail -5)"; exit 1; fi
CTL() { C /usr/local/bin/dflashctl -c /etc/dflash/dflash.ini --wait 180 "$@"; }  # bounded: a hang fails, not stalls
step() { CTL status 2>/dev/null | awk 'NR == 2 { split($2, a, "/"); print a[1] }'; }

# SIGKILL target-0: systemd restarts it, nobody else changes PID, training continues
declare -A before
for u in "${units[@]}"; do before[$u]=$(mainpid "$u"); done
s0=$(step)
C systemctl kill --kill-whom=main -s SIGKILL dflash-target@0.service
deadline=$((SECONDS + 30))
until n=$(mainpid dflash-target@0.service); [ "$n" != 0 ] && [ "$n" != "${before[dflash-target@0.service]}" ] &&
      [ "$(C systemctl is-active dflash-target@0.service)" = active ] || [ $SECONDS -ge $deadline ]; do sleep 0.3; done
sleep 2
moved=""
for u in "${units[@]}"; do [ "$u" = dflash-target@0.service ] || [ "$(mainpid "$u")" = "${before[$u]}" ] || moved+=" $u"; done
s1=$(step)
if [ "$n" != "${before[dflash-target@0.service]}" ] && [ -z "$moved" ] && [ "$s1" -gt "$s0" ] 2>/dev/null; then
    ok "nspawn_sigkill_target_restarted (pid ${before[dflash-target@0.service]} -> $n, others unchanged, step $s0 -> $s1)"
else
    fail nspawn_sigkill_target_restarted "pid -> $n, moved:$moved, step $s0 -> $s1"
fi

# a target that stops pinging the watchdog (WatchdogSec=3 in the test drop-in) is restarted by systemd
p=$(mainpid dflash-target@1.service)
C systemctl kill --kill-whom=main -s SIGSTOP dflash-target@1.service
deadline=$((SECONDS + 40))
until n=$(mainpid dflash-target@1.service); [ "$n" != 0 ] && [ "$n" != "$p" ] && [ "$(C systemctl is-active dflash-target@1.service)" = active ] ||
      [ $SECONDS -ge $deadline ]; do sleep 0.3; done
if [ "$n" != "$p" ] && C journalctl -u dflash-target@1.service --no-pager | grep -qi "watchdog timeout"; then
    ok "nspawn_watchdog_restarts_silent_worker (pid $p -> $n)"
else
    fail nspawn_watchdog_restarts_silent_worker "pid $p -> $n; $(C journalctl -u dflash-target@1.service --no-pager | tail -3)"
fi

if out=$(CTL rolling-restart drafter 2>&1); then ok "nspawn_rolling_restart_drafter (${out//$'\n'/; })"
else fail nspawn_rolling_restart_drafter "$out"; fi

# systemctl stop dflashd: SIGTERM; dflashd says STOPPING=1 and exits 0 through its clean path, keeping the segments
# and (FileDescriptorStorePreserve=yes) the fd store; systemctl start: it reattaches and training goes on (the
# drain below checks the ledger). The workers keep running meanwhile (Wants=, not Requires=).
sdv=$(C systemctl --version | awk 'NR == 1 { print $2 }')
if [ "${sdv:-0}" -ge 254 ] 2>/dev/null; then
    C systemd-analyze log-level debug # the journal then shows the notify messages
    kp=$(mainpid dflashd.service)
    s0=$(step)
    C systemctl stop dflashd.service
    st="$(C systemctl show -p ActiveState --value dflashd.service) $(C systemctl show -p Result --value dflashd.service)"
    st+=" $(C systemctl show -p ExecMainCode --value dflashd.service)/$(C systemctl show -p ExecMainStatus --value dflashd.service)"
    C systemd-analyze log-level info
    C journalctl -u dflashd.service --no-pager -o cat >"$T/dflashd-stop.journal" 2>&1
    line=$(grep -o "stopping on SIGTERM.*" "$T/dflashd-stop.journal" | tail -1)
    if [ "$st" = "inactive success 1/0" ] && [ -n "$line" ] && grep -qF "Got notification message from PID $kp (STOPPING=1)" "$T/dflashd-stop.journal"; then
        ok "nspawn_stop_dflashd_clean (STOPPING=1, exit 0, Result=success: $line)"
    else
        fail nspawn_stop_dflashd_clean "state/result/code/status: $st; $(grep -e STOPPING -e stopping "$T/dflashd-stop.journal" | tail -3)"
    fi
    C systemctl start dflashd.service
    deadline=$((SECONDS + 60))
    until [ "$(C systemctl is-active dflashd.service)" = active ] && s1=$(step) && [ "${s1:-0}" -gt "${s0:-0}" ] 2>/dev/null ||
          [ $SECONDS -ge $deadline ]; do sleep 0.3; done
    C journalctl -u dflashd.service --no-pager -o cat >"$T/dflashd-start.journal" 2>&1
    if [ "$(mainpid dflashd.service)" != "$kp" ] && grep -q "reattached after a keeper restart" "$T/dflashd-start.journal" &&
       ! grep -q "cannot reattach" "$T/dflashd-start.journal" && [ "${s1:-0}" -gt "${s0:-0}" ] 2>/dev/null; then
        ok "nspawn_start_dflashd_reattaches (pid $kp -> $(mainpid dflashd.service); step $s0 -> $s1)"
    else
        fail nspawn_start_dflashd_reattaches "step $s0 -> ${s1:-}; $(grep -e reattach -e afresh "$T/dflashd-start.journal" | tail -3)"
    fi
else
    ok "nspawn_stop_start_dflashd skipped: systemd $sdv in the image keeps no fd store across a stop (254 needed)"
fi

if out=$(CTL drain 2>&1); then
    stop=$(echo "$out" | sed -n 's/^drained: \([0-9]*\) steps.*/\1/p')
    deadline=$((SECONDS + 30))
    until [ "$(C systemctl is-active dflashd.service)" != active ] || [ $SECONDS -ge $deadline ]; do sleep 0.3; done
    res=$(C systemctl show -p Result --value dflashd.service)
    if msg=$(check_ledger job "$stop" 2) && [ "$res" = success ]; then ok "nspawn_drain_ledger_exactly_once (dflashd result $res; $msg)"
    else fail nspawn_drain_ledger_exactly_once "dflashd $res; $msg"; fi
else
    fail nspawn_drain_ledger_exactly_once "$out"
fi
exit $FAILED
