#!/usr/bin/env bash
# `make deps` beside another apt-get: it waits for the apt locks (saying who holds them) instead of failing at once,
# and gives apt its own lock timeout (DPkg::Lock::Timeout) for install and update. The machine's apt is not touched:
# a fake apt-get first on PATH records its arguments, the package wanted is one no machine has, and the lock is a
# copy (APT_LOCKS) held with fcntl as apt and dpkg hold theirs.
cd "$(dirname "$0")/../.." || exit 1
. tests/system/lib.bash
[ "$(id -u)" = 0 ] || { echo "deps: not root (make deps installs nothing then, so it never waits for apt)"; exit 77; }
mkdir -p "$T/bin"
cat >"$T/bin/apt-get" <<EOF
#!/bin/sh
echo "\$*" >>"$T/apt.args"
# the first install fails when asked, so that deps goes on to update and installs again
[ -e "$T/fail-once" ] && [ "\$3" = install ] && { rm -f "$T/fail-once"; exit 100; }
exit 0
EOF
chmod +x "$T/bin/apt-get"
: >"$T/lock-frontend"
PKG=dflash-no-such-package
deps() { PATH="$T/bin:$PATH" make -s --no-print-directory deps DEB_PKGS=$PKG APT_LOCKS="$T/lock-frontend" "$@"; }
want="-o DPkg::Lock::Timeout=600 install -y -q $PKG"
# hold_lock: another process takes the copied lock as apt does (fcntl) and keeps it until killed; sets holder
hold_lock() {
    rm -f "$T/holder.out"
    python3 -c 'import fcntl, signal, sys
f = open(sys.argv[1], "w"); fcntl.lockf(f, fcntl.LOCK_EX); print("held", flush=True); signal.pause()' \
        "$T/lock-frontend" >"$T/holder.out" 2>&1 &
    holder=$!
    local deadline=$((SECONDS + 30))
    until grep -qs held "$T/holder.out" || [ $SECONDS -ge $deadline ]; do sleep 0.1; done
}

# nothing holds the lock: no wait, apt is given its lock timeout
out=$(deps 2>&1); rc=$?
args=$(cat "$T/apt.args" 2>/dev/null)
if [ $rc = 0 ] && [ "$args" = "$want" ] && ! grep -q waiting <<<"$out"; then ok "deps_apt_lock_timeout_passed ($args)"
else fail deps_apt_lock_timeout_passed "exit $rc; apt-get got: ${args:-nothing}; console: ${out//$'\n'/; }"; fi

# the install fails: update and the second install get the timeout too
rm -f "$T/apt.args"; : >"$T/fail-once"
out=$(deps 2>&1); rc=$?
args=$(cat "$T/apt.args" 2>/dev/null)
if [ $rc = 0 ] && [ "$args" = "$want"$'\n'"-o DPkg::Lock::Timeout=600 update -q"$'\n'"$want" ]; then
    ok "deps_apt_update_lock_timeout_passed"
else fail deps_apt_update_lock_timeout_passed "exit $rc; apt-get got: ${args//$'\n'/; }"; fi

# a holder of the lock: deps says who and waits; apt-get runs only once the lock is free
rm -f "$T/apt.args"
hold_lock
deps >"$T/deps.out" 2>&1 &
dp=$!
deadline=$((SECONDS + 30))
until grep -q "waiting for the apt lock" "$T/deps.out" || ! kill -0 $dp 2>/dev/null || [ $SECONDS -ge $deadline ]; do sleep 0.1; done
line=$(grep "waiting for the apt lock" "$T/deps.out")
early=$(cat "$T/apt.args" 2>/dev/null)
kill $holder; wait $holder 2>/dev/null
wait $dp; rc=$?
args=$(cat "$T/apt.args" 2>/dev/null)
if grep -qF "waiting for the apt lock held by pid $holder (" <<<"$line" && grep -qF "on $T/lock-frontend" <<<"$line" &&
   [ -z "$early" ] && [ $rc = 0 ] && [ "$args" = "$want" ]; then
    ok "deps_waits_for_held_apt_lock ($line)"
else
    fail deps_waits_for_held_apt_lock "exit $rc; console: $(tr '\n' ';' <"$T/deps.out"); apt-get while held: ${early:-nothing}; after: ${args:-nothing}"
fi

# a lock held past the timeout: deps fails naming the holder, apt-get never runs
rm -f "$T/apt.args"
hold_lock
out=$(deps APT_LOCK_TIMEOUT=0 2>&1); rc=$?
kill $holder; wait $holder 2>/dev/null
if [ $rc != 0 ] && grep -qF "error: the apt lock is still held by pid $holder" <<<"$out" && [ ! -e "$T/apt.args" ]; then
    ok "deps_apt_lock_timeout_fails_naming_holder"
else fail deps_apt_lock_timeout_fails_naming_holder "exit $rc; console: ${out//$'\n'/; }; apt-get got: $(cat "$T/apt.args" 2>/dev/null)"; fi
exit $FAILED
