// Package airlock is a transparent network-level sandbox for Linux hosts.
//
// The module root holds no code of its own; see policy, dnsgate, tproxy,
// netns, ui and the commands under cmd. Its tests check properties of the
// whole module (dependency direction, package docs).
package airlock
