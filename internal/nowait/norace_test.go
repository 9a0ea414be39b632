//go:build !race

package nowait

const raceEnabled = false
