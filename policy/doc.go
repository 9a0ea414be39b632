// Package policy decides what a sandbox may reach.
//
// It owns the pattern language (exact hosts, "*." wildcards, path globs,
// regexes, method prefixes, ports and CIDRs), the indexed rule sets that answer
// a Query with a Decision, the sandbox policy file (the "sandbox:" section of a
// project's YAML, edited in place so other keys and comments survive), the
// suggestions offered when a person approves an unknown host, and the table of
// known LLM providers and MCP servers.
//
// The package never touches the network or the kernel; dnsgate and tproxy ask
// it for decisions.
package policy
