// Package tproxy owns airlock's nftables rule set and policy routing, and
// the transparent proxy that every TCP connection from a sandbox lands in:
// it names the connection, asks package policy, and splices, intercepts or
// refuses it.
package tproxy
