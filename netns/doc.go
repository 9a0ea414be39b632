// Package netns builds sandbox networks: bridges, veths and network
// namespaces, the Docker network of each sandbox and the attribution of
// traffic to containers, and the namespaces of `airlock run`.
package netns
