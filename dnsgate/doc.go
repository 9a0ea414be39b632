// Package dnsgate is the DNS server every sandbox must use: it answers A
// queries with addresses from a fake-IP pool, forwards other record types
// upstream only for names the policy allows, and guards against DNS
// exfiltration. It asks package policy for every decision.
package dnsgate
