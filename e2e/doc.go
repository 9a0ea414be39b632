// Package e2e holds airlock's privileged end-to-end tests: airlockd and
// `airlock run` as built, real clients (dig, curl, ping, a Go client) as
// sandbox members, and an "internet" that logs everything reaching it
// (internal/testworld). They need root; `make test` fails them rather than
// skipping them when they cannot run.
package e2e
