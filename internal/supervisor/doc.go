// Package supervisor is airlockd's daemon: it starts what every sandbox
// shares (the nftables rule set, upstream DNS, the API), runs each
// sandbox (bridge, DNS gate, proxy, policy, approvals broker, CA, Docker
// network and members), reloads the config and the policy files, watches
// the policy files for edits, and stops everything so that sandboxes stay
// closed. cmd/airlockd holds only flags, signals and the wiring of this
// package.
package supervisor
