//go:build !linux

package fd

// ReadClocks: no raw oscillator clock on this platform, so no ClockGuard.
func ReadClocks() (ClockSample, bool) { return ClockSample{}, false }

// clocksReadable: this platform lacks the clocks ClockGuard needs.
const clocksReadable = false
