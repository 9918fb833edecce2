//go:build !race

package rldev

// raceEnabled: whether this test binary runs under the race detector (not here).
const raceEnabled = false
