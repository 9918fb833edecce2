//go:build !race

package rldev

// raceEnabled: this test binary runs under the race detector.
const raceEnabled = false
