#!/usr/bin/env bash
# The units under a real systemd: a minimal Debian image of the host's release (debootstrap, cached under build/)
# booted with systemd-nspawn, the built binaries, the units and a CPU job bound in. From outside (nsenter) it checks:
# every unit of dflash.target becomes active only through READY=1 (Type=notify, a STATUS= line set); a SIGKILLed
# target worker is restarted by systemd while the others keep their PIDs and training continues; a worker that stops
# pinging the watchdog (SIGSTOP) is restarted by systemd; `dflashctl rolling-restart drafter` goes through;
# `systemctl stop dflashd` ends it through its clean path (STOPPING=1, exit 0, Result=success, the reason in the
# journal) and `systemctl start` reattaches it from the fd store while training goes on; `dflashctl drain` ends the job
# and the ledger shows every batch exactly once. systemd keeps an fd store across a stop only from 254 on
# (FileDescriptorStorePreserve=), so on an older release (bookworm: 252) that image takes systemd from
# <release>-backports, and a second image with the release's own systemd checks what a Debian 12 host does: the unit
# loads with FileDescriptorStorePreserve= ignored, `systemctl restart dflashd` keeps the fd store and reattaches, and
# after a stop the store is gone, so that a start refuses the run_dir it finds (see the 252 part below).
cd "$(dirname "$0")/../.." || exit 1
. tests/system/lib.bash
PKGS=systemd,systemd-sysv,dbus,libopenblas0-pthread,libjansson4,libinih1,libzmq5,libprotobuf-c1,libpcre2-8-0,libutf8proc2,libmicrohttpd12,libasan8,libubsan1  # the tokenizer's PCRE2 and utf8proc; dflashd's HTTP server (/metrics); the sanitizer runtimes: make SAN=1 test binds ASan builds in
skip() { echo "ok nspawn skipped: $1"; exit 0; }
[ "$(id -u)" = 0 ] || skip "not root"
command -v systemd-nspawn >/dev/null || skip "systemd-nspawn is not installed (Debian package systemd-container)"
command -v debootstrap >/dev/null || skip "debootstrap is not installed"
# the host's release (the bound-in binaries are built against its libraries) and its Debian mirror
SUITE=$(. /etc/os-release 2>/dev/null; echo "${VERSION_CODENAME:-bookworm}")
MIRROR=$( { sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/*.sources 2>/dev/null; awk '$1 == "deb" { print $2 }' /etc/apt/sources.list 2>/dev/null; } |
          tr ' ' '\n' | grep -E '^https?://' | grep -v -e security -e '/debian-' | head -1)
MIRROR=${MIRROR:-http://deb.debian.org/debian}

# image ROOT SYSTEMD: the image in ROOT, built once and rebuilt when the release or the package list changed.
# SYSTEMD newer: systemd >= 254, from <release>-backports when the release's is older; release: the release's own.
image() {
    local root=$1 id="$SUITE $PKGS systemd>=254" sdv t0=$SECONDS
    [ "$2" = release ] && id="$SUITE $PKGS systemd of $SUITE"
    [ -x "$root/lib/systemd/systemd" ] && [ "$(cat "$root/.dflash-pkgs" 2>/dev/null)" = "$id" ] && return 0
    mkdir -p build # building an image takes ~400 MB: say so rather than fail half-way
    free_mb=$(df -Pm build | awk 'NR == 2 { print $4 }')
    [ "${free_mb:-0}" -ge 1500 ] || skip "only ${free_mb} MB free under build/ (an image needs ~400 MB, 1500 asked)"
    rm -rf "$root" "$root.tmp"
    if ! debootstrap --variant=minbase --include=$PKGS "$SUITE" "$root.tmp" "$MIRROR" >"$T/debootstrap.log" 2>&1; then
        fail nspawn_image "debootstrap $SUITE from $MIRROR failed: $(tail -3 "$T/debootstrap.log")"; exit 1
    fi
    sdv=$(chroot "$root.tmp" dpkg-query -W -f '${Version}' systemd 2>/dev/null | cut -d. -f1)
    if [ "$2" = newer ] && [ "${sdv:-0}" -lt 254 ] 2>/dev/null; then
        echo "deb $MIRROR $SUITE-backports main" >"$root.tmp/etc/apt/sources.list.d/backports.list"
        { chroot "$root.tmp" apt-get update && chroot "$root.tmp" env DEBIAN_FRONTEND=noninteractive \
              apt-get install -y --no-install-recommends -t "$SUITE-backports" systemd systemd-sysv; } >>"$T/debootstrap.log" 2>&1 ||
            echo "nspawn: systemd $sdv and none newer from $SUITE-backports ($(tail -1 "$T/debootstrap.log")): the stop/start check will be skipped"
        chroot "$root.tmp" apt-get clean >/dev/null 2>&1
    fi
    echo "$id" >"$root.tmp/.dflash-pkgs"
    mv "$root.tmp" "$root"
    echo "nspawn: built $root ($SUITE from $MIRROR, systemd $2) in $((SECONDS - t0)) s"
}
image build/nspawn-root newer
make_fixture || { fail nspawn_fixture "$(tail -3 "$T/fixture.log")"; exit 1; }
J=/var/lib/dflash
# lib.bash's job, with the container's paths, no checkpoints, the units' watchdogs and a long heartbeat timeout
write_config job 1000000
sed -e "s|$T/|$J/|" -e "s|^name = .*|name = t$$-ns|" -e "s|^checkpoint_every = .*|checkpoint_every = 0|" \
    -e "/^watchdog_sec/d" -e "s|^heartbeat_timeout_sec = .*|heartbeat_timeout_sec = 120|" "$T/job.ini" >"$T/dflash.ini"
mkdir -p "$T/dropin"
printf '[Service]\nWatchdogSec=3\n' >"$T/dropin/watchdog.conf"
# boot ROOT CONFIG TAG: boots ROOT with the job (CONFIG as /etc/dflash/dflash.ini) bound in, waits for it to run;
# C runs a command in it; halt powers it off
boot() {
    local binds=(--bind="$T:$J" --bind-ro="$(realpath "$BIN"):/usr/local/bin" --bind-ro="$2:/etc/dflash/dflash.ini"
                 --bind-ro="$T/dropin:/etc/systemd/system/dflash-target@.service.d") u state deadline
    for u in deploy/systemd/*; do binds+=(--bind-ro="$(realpath "$u"):/etc/systemd/system/$(basename "$u")"); done
    systemd-nspawn --register=no --keep-unit -q -D "$1" "${binds[@]}" -b >"$T/nspawn$3.log" 2>&1 &
    ns=$!
    leader=""
    deadline=$((SECONDS + 60))
    while [ -z "$leader" ] && [ $SECONDS -lt $deadline ]; do sleep 0.5; leader=$(pgrep -P "$ns" | head -1); done
    until state=$(C systemctl is-system-running 2>/dev/null); [ "$state" = running ] || [ "$state" = degraded ] || [ $SECONDS -ge $deadline ]; do sleep 0.5; done
    [ "$state" = running ] || [ "$state" = degraded ] || { fail nspawn_boot$3 "container state '$state': $(tail -5 "$T/nspawn$3.log")"; exit 1; }
    ok "nspawn_boot$3 ($state, systemd $(C systemctl --version | awk 'NR == 1 { print $2 }'))"
}
halt() { [ -n "${leader:-}" ] && C systemctl poweroff >/dev/null 2>&1; sleep 2; [ -n "${ns:-}" ] && kill "$ns" 2>/dev/null && wait "$ns" 2>/dev/null; leader=""; ns=""; }
trap 'halt; cleanup' EXIT
C() { nsenter -t "$leader" -a "$@"; }
units=(dflashd.service dflash-prefetch.service dflash-target@0.service dflash-target@1.service dflash-drafter@0.service dflash-drafter@1.service)
mainpid() { C systemctl show -p MainPID --value "$1"; }
# start_job TAG: starts dflash.target; every unit must become active through READY=1
start_job() {
    local u typ st text bad="" deadline=$((SECONDS + 90))
    C systemctl start dflash.target
    until [ "$(C systemctl is-active "${units[@]}" | grep -c '^active$')" = 6 ] || [ $SECONDS -ge $deadline ]; do sleep 0.5; done
    for u in "${units[@]}"; do
        typ=$(C systemctl show -p Type --value "$u"); st=$(C systemctl show -p ActiveState --value "$u")
        text=$(C systemctl show -p StatusText --value "$u")
        [ "$typ" = notify ] && [ "$st" = active ] && [ -n "$text" ] || bad+=" $u($typ,$st,'$text')"
    done
    if [ -z "$bad" ]; then ok "nspawn_units_active_after_ready$1 (6 units Type=notify, active, STATUS set)"
    else fail nspawn_units_active_after_ready$1 "$bad; $(C journalctl -n 20 --no-pager 2>&1 | tail -5)"; exit 1; fi
}
CTL() { C /usr/local/bin/dflashctl -c /etc/dflash/dflash.ini --wait 180 "$@"; }  # bounded: a hang fails, not stalls
step() { CTL status 2>/dev/null | awk 'NR == 2 { split($2, a, "/"); print a[1] }'; }
# steps_past N: waits (60 s at most) for a step after N to commit; prints the step reached
steps_past() {
    local s deadline=$((SECONDS + 60))
    until s=$(step) && [ "${s:-0}" -gt "$1" ] 2>/dev/null || [ $SECONDS -ge $deadline ]; do sleep 0.3; done
    echo "${s:-}"
}

boot build/nspawn-root "$T/dflash.ini" ""
start_job ""

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
halt

# The release's own systemd (bookworm: 252), as a Debian 12 host runs the units. FileDescriptorStorePreserve= is
# unknown there and ignored, so the fd store lives only while the unit is not stopped: `systemctl restart dflashd`
# keeps it and dflashd reattaches; after `systemctl stop dflashd` it is gone, and `systemctl start dflashd` finds the
# job's ledger in the run_dir with nothing to reattach to and refuses it (exit 1, until systemd's start limit) while
# the workers keep running. The job goes on from its last checkpoint once dflash.target is started again with
# `dflashd --resume` (a runtime drop-in, as `systemctl edit --runtime dflashd` writes).
image build/nspawn-root-release release
rsv=$(chroot build/nspawn-root-release dpkg-query -W -f '${Version}' systemd 2>/dev/null | cut -d. -f1)
if [ "${rsv:-0}" -ge 254 ] 2>/dev/null; then ok "nspawn_release_systemd skipped: $SUITE's own systemd is $rsv (checked above)"; exit $FAILED; fi
sed -e "s|^name = .*|name = t$$-ns252|" -e "s|^run_dir = .*|run_dir = $J/job252|" -e "s|^checkpoint_every = .*|checkpoint_every = 100|" \
    "$T/dflash.ini" >"$T/dflash252.ini"
boot build/nspawn-root-release "$T/dflash252.ini" _252
start_job _252
if line=$(C journalctl -b --no-pager -o cat | grep -m1 "Unknown key.*FileDescriptorStorePreserve.*ignoring"); then
    ok "nspawn_252_preserve_key_ignored ($line)"
else fail nspawn_252_preserve_key_ignored "$(C journalctl -b --no-pager -o cat | grep -i -m3 filedescriptorstore)"; fi
jn() { C journalctl -u dflashd.service --no-pager -o cat 2>&1 | tail -n +$(($1 + 1)); } # its lines after the first N
jlines() { C journalctl -u dflashd.service --no-pager -o cat 2>/dev/null | wc -l; }

# restart: the store is kept, dflashd reattaches, training goes on
s0=$(steps_past 0)
kp=$(mainpid dflashd.service); n0=$(jlines)
C systemctl restart dflashd.service
s1=$(steps_past "${s0:-0}")
jn "$n0" >"$T/252-restart.journal"
if [ "$(mainpid dflashd.service)" != "$kp" ] && grep -q "reattached after a keeper restart" "$T/252-restart.journal" &&
   ! grep -q "cannot reattach" "$T/252-restart.journal" && [ "${s1:-0}" -gt "${s0:-0}" ] 2>/dev/null; then
    ok "nspawn_252_restart_dflashd_reattaches (pid $kp -> $(mainpid dflashd.service); step $s0 -> $s1)"
else
    fail nspawn_252_restart_dflashd_reattaches "step $s0 -> ${s1:-}; $(grep -e reattach -e afresh -e previous "$T/252-restart.journal" | tail -3)"
fi

# stop: a clean exit, and the store is dropped; start: refused (the run_dir holds the job's ledger); the workers wait
s2=$(steps_past $((${s1:-0} > 150 ? ${s1:-0} : 150))) # a checkpoint (every 100 steps) is behind it
declare -A wp
for u in "${units[@]:1}"; do wp[$u]=$(mainpid "$u"); done
C systemctl stop dflashd.service
st="$(C systemctl show -p ActiveState --value dflashd.service) $(C systemctl show -p Result --value dflashd.service)"
st+=" store $(C systemctl show -p NFileDescriptorStore --value dflashd.service)"
n0=$(jlines)
C systemctl start dflashd.service >/dev/null 2>&1; rc=$?
deadline=$((SECONDS + 60))
until [ "$(C systemctl show -p ActiveState --value dflashd.service)" = failed ] || [ $SECONDS -ge $deadline ]; do sleep 0.3; done
jn "$n0" >"$T/252-start.journal"
moved=""
for u in "${units[@]:1}"; do [ "$(mainpid "$u")" = "${wp[$u]}" ] && [ "$(C systemctl is-active "$u")" = active ] || moved+=" $u"; done
refusal=$(grep -m1 -o "job.run_dir $J/job252 holds a previous run ([^:]*" "$T/252-start.journal")
if [ "$st" = "inactive success store 0" ] && [ $rc != 0 ] && [ -n "$refusal" ] && ! grep -q reattached "$T/252-start.journal" &&
   [ "$(C systemctl show -p ActiveState --value dflashd.service)" = failed ] && [ -z "$moved" ]; then
    ok "nspawn_252_stop_start_dflashd_refused (after the stop: $st; the start: $refusal; workers unchanged)"
else
    fail nspawn_252_stop_start_dflashd_refused "after the stop: $st; start exit $rc, now $(C systemctl show -p ActiveState --value dflashd.service); workers moved:$moved; $(grep -v '^$' "$T/252-start.journal" | tail -3)"
fi

# the way on: dflash.target stopped, then started with dflashd --resume; the job goes on from its last checkpoint
ck=$(readlink "$T/job252/ckpt/latest"); ck=${ck##*step-}; ck=$((10#${ck:-0}))
C systemctl stop dflash.target
C mkdir -p /run/systemd/system/dflashd.service.d
C sh -c 'printf "[Service]\nExecStart=\nExecStart=/usr/local/bin/dflashd -c /etc/dflash/dflash.ini --resume\n" >/run/systemd/system/dflashd.service.d/resume.conf'
C systemctl daemon-reload
C systemctl reset-failed dflashd.service
n0=$(jlines)
start_job _252_resume
s3=$(steps_past "$ck")
jn "$n0" >"$T/252-resume.journal"
line=$(grep -m1 -o "resuming from .*" "$T/252-resume.journal")
if [ "$ck" -gt 0 ] && grep -q "step $ck\$" <<<"$line" && [ "${s3:-0}" -gt "$ck" ] 2>/dev/null; then
    ok "nspawn_252_resume_after_stop ($line; step $s3)"
else
    fail nspawn_252_resume_after_stop "checkpoint step $ck, now ${s3:-?}; $(grep -v '^$' "$T/252-resume.journal" | tail -3)"
fi
if out=$(CTL drain 2>&1); then
    stop=$(echo "$out" | sed -n 's/^drained: \([0-9]*\) steps.*/\1/p')
    deadline=$((SECONDS + 30))
    until [ "$(C systemctl is-active dflashd.service)" != active ] || [ $SECONDS -ge $deadline ]; do sleep 0.3; done
    if msg=$(check_ledger job252 "$stop" 2); then ok "nspawn_252_drain_ledger_exactly_once ($msg)"
    else fail nspawn_252_drain_ledger_exactly_once "$msg"; fi
else
    fail nspawn_252_drain_ledger_exactly_once "$out"
fi
exit $FAILED
