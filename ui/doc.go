// Package ui is airlockd's HTTP face: the REST API, server-sent events, the
// embedded web approval page and HAR export.
package ui
