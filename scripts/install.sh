#!/bin/sh
# Installs or removes airlock as a systemd service. Run by `make install` and
# `make uninstall`; every path honours DESTDIR (a staging root) and PREFIX.
#
#   scripts/install.sh install     binaries to PREFIX/bin, the unit to UNITDIR,
#                                  the default config to /etc/airlock/airlockd.yaml
#                                  (an existing one is never overwritten), and
#                                  the state directory /var/lib/airlock (0700)
#   scripts/install.sh uninstall   binaries and unit; the config, the state and
#                                  the sandboxes' kernel state stay, unless PURGE=1
#
# Environment: DESTDIR (default empty), PREFIX (/usr/local), BIN (bin: where
# `make build` put airlockd and airlock), UNITDIR (/etc/systemd/system),
# PURGE (1: uninstall also tears the sandboxes down and removes config and state).
set -eu

DESTDIR=${DESTDIR:-}
PREFIX=${PREFIX:-/usr/local}
BIN=${BIN:-bin}
UNITDIR=${UNITDIR:-/etc/systemd/system}
PURGE=${PURGE:-}
CONFDIR=/etc/airlock
STATEDIR=/var/lib/airlock

here=$(cd "$(dirname "$0")" && pwd)

# systemd is asked to reload its units only on a live install on a host it runs.
live_systemd() {
	[ -z "$DESTDIR" ] && [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1
}

do_install() {
	for b in airlockd airlock; do
		[ -x "$BIN/$b" ] || { echo "install.sh: $BIN/$b is missing; run make build first" >&2; exit 1; }
	done
	install -d -m 0755 "$DESTDIR$PREFIX/bin" "$DESTDIR$UNITDIR" "$DESTDIR$CONFDIR"
	install -m 0755 "$BIN/airlockd" "$BIN/airlock" "$DESTDIR$PREFIX/bin/"
	# The unit runs the binary where PREFIX put it.
	tmp=$(mktemp)
	trap 'rm -f "$tmp"' EXIT
	sed "s#/usr/local/bin/airlockd#$PREFIX/bin/airlockd#g" "$here/airlockd.service" >"$tmp"
	install -m 0644 "$tmp" "$DESTDIR$UNITDIR/airlockd.service"
	if [ -e "$DESTDIR$CONFDIR/airlockd.yaml" ]; then
		echo "kept $DESTDIR$CONFDIR/airlockd.yaml (it exists; the built-in default is: airlockd --print-default-config)"
	else
		"$BIN/airlockd" --print-default-config >"$tmp"
		install -m 0644 "$tmp" "$DESTDIR$CONFDIR/airlockd.yaml"
	fi
	install -d -m 0700 "$DESTDIR$STATEDIR"
	chmod 0700 "$DESTDIR$STATEDIR"
	if live_systemd; then
		systemctl daemon-reload
	fi
	echo "installed airlockd and airlock in $DESTDIR$PREFIX/bin, the unit in $DESTDIR$UNITDIR"
	echo "start it at boot and now: systemctl enable --now airlockd"
}

do_uninstall() {
	if [ -n "$PURGE" ] && [ -z "$DESTDIR" ] && [ -x "$PREFIX/bin/airlockd" ]; then
		# The service first, or it would rebuild what the teardown removes.
		if live_systemd; then
			systemctl disable --now airlockd.service 2>/dev/null || true
		fi
		"$PREFIX/bin/airlockd" --config "$CONFDIR/airlockd.yaml" --teardown ||
			"$PREFIX/bin/airlockd" --teardown
	elif live_systemd; then
		systemctl disable --now airlockd.service 2>/dev/null || true
	fi
	rm -f "$DESTDIR$PREFIX/bin/airlockd" "$DESTDIR$PREFIX/bin/airlock" "$DESTDIR$UNITDIR/airlockd.service"
	if [ -n "$PURGE" ]; then
		rm -rf "$DESTDIR$CONFDIR" "$DESTDIR$STATEDIR"
		echo "removed airlock, its config, its state and its sandboxes"
	else
		echo "removed airlock's binaries and unit; kept $DESTDIR$CONFDIR and $DESTDIR$STATEDIR (PURGE=1 removes them and the sandboxes)"
	fi
	if live_systemd; then
		systemctl daemon-reload
	fi
}

case "${1:-}" in
install) do_install ;;
uninstall) do_uninstall ;;
*)
	echo "usage: $0 install|uninstall" >&2
	exit 2
	;;
esac
