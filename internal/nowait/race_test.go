//go:build race

package nowait

// The race detector makes sync.Pool drop what it is given at random.
const raceEnabled = true
