#!/usr/bin/env bash
# The systemd units in deploy/systemd pass `systemd-analyze verify` (with the built binaries standing in for
# /usr/local/bin), keep the rules of docs/design.md §5: Type=notify, WatchdogSec, Restart=on-failure, PartOf=dflash.target,
# only Wants=/After= between units (never Requires=/BindsTo=), RuntimeDirectory=, FileDescriptorStoreMax= for dflashd.
cd "$(dirname "$0")/../.." || exit 1
BIN=$(realpath "${BUILD:-build}/bin")
FAILED=0
ok() { echo "ok $1"; }
fail() { echo "FAIL $1${2:+: $2}"; FAILED=1; }
if ! command -v systemd-analyze >/dev/null; then echo "ok units_verify skipped: systemd-analyze is not installed"; exit 0; fi
D=$(mktemp -d /tmp/dflash-units-XXXXXX)
trap 'rm -rf "$D"' EXIT
for f in deploy/systemd/*; do sed "s|/usr/local/bin/|$BIN/|g" "$f" >"$D/$(basename "$f")"; done
ln -s dflash-target@.service "$D/dflash-target@0.service"
ln -s dflash-drafter@.service "$D/dflash-drafter@1.service"
ln -s dflash-eval@.service "$D/dflash-eval@0.service"
cd "$D" || exit 1
units=(dflash.target dflashd.service dflash-prefetch.service dflash-target@0.service dflash-drafter@1.service dflash-eval@0.service)
out=$(SYSTEMD_LOG_LEVEL=warning systemd-analyze verify --man=no "${units[@]}" 2>&1); rc=$?
# FileDescriptorStorePreserve= is systemd 254's: an older one names it unknown and ignores it (dflashd.service says so)
[ "$(systemd-analyze --version | awk 'NR == 1 { print $2 }')" -lt 254 ] 2>/dev/null &&
    out=$(grep -v "Unknown key 'FileDescriptorStorePreserve' in section \[Service\], ignoring" <<<"$out")
if [ $rc = 0 ] && [ -z "$out" ]; then
    ok "units_verify (${units[*]})"
else
    fail units_verify "$out"
fi
for u in dflashd.service dflash-prefetch.service dflash-target@.service dflash-drafter@.service dflash-eval@.service; do
    miss=""
    for want in "^Type=notify$" "^WatchdogSec=" "^Restart=on-failure$" "^PartOf=dflash.target$" "^RuntimeDirectory=dflash$" \
                "^ProtectSystem=strict$" "/dev/shm"; do
        grep -q "$want" "$u" || miss+=" $want"
    done
    [ "$u" = dflashd.service ] && { grep -q "^FileDescriptorStoreMax=[1-9]" "$u" || miss+=" FileDescriptorStoreMax"; }
    [ "$u" != dflashd.service ] && { grep -q "^Wants=dflashd.service$" "$u" && grep -q "^After=dflashd.service$" "$u" || miss+=" Wants/After=dflashd"; }
    case $u in dflash-target@*|dflash-drafter@*|dflash-eval@*) grep -q "^DeviceAllow=char-nvidia-frontend rw$" "$u" || miss+=" nvidia devices";; esac
    grep -Eq "^(Requires|BindsTo|Requisite)=" "$u" && miss+=" (has Requires=/BindsTo=)"
    if [ -z "$miss" ]; then ok "units_rules_$u"; else fail "units_rules_$u" "missing:$miss"; fi
done
exit $FAILED
