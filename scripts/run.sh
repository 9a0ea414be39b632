#!/usr/bin/env bash
# make run: starts airlockd in the foreground with /etc/airlock/airlockd.yaml,
# or the built-in config (one sandbox "default" on 10.88.0.0/24).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" != 0 ]; then
	echo "make run needs root: it builds a bridge and nftables rules (sudo make run)" >&2
	exit 1
fi
cfg=/etc/airlock/airlockd.yaml
args=()
if [ -f "$cfg" ]; then
	args=(--config "$cfg")
	src=$cfg
else
	src="the built-in config (bin/airlockd --print-default-config)"
fi
cat <<MSG
Starting airlockd with $src.
Sandbox "default": bridge al-default, subnet 10.88.0.0/24, DNS gate 10.88.0.1:53,
policy file /var/lib/airlock/sandboxes/default.yaml (created on the first saved rule).

In another terminal, as root:
  bin/airlock run --sandbox default -- dig +short example.com         # an address from 198.18.0.0/15
  bin/airlock run --sandbox default -- dig TXT example.com            # REFUSED: no rule allows it
  bin/airlock run --sandbox default -- curl -sS http://example.com/   # held until you decide: allow or
                                        # deny it on the page or with bin/airlock pending; a 403 after 30 s

  docker run --rm --network airlock-default IMAGE ...                # a container in the sandbox

The API's URL and token are printed below once airlockd is ready: open the URL for the web
page (sign in with the token); bin/airlock uses them too (bin/airlock ls, bin/airlock pending,
bin/airlock approve ID).
Ctrl-C stops airlockd; its rules stay, so the sandbox stays closed.
Remove everything: bin/airlockd --teardown

MSG
exec bin/airlockd --show-token "${args[@]}"
