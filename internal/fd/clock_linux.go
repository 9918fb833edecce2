package fd

import (
	"time"

	"golang.org/x/sys/unix"
)

// ReadClocks reads the clocks a ClockGuard compares: CLOCK_MONOTONIC
// through time.Now (the vDSO), CLOCK_MONOTONIC_RAW and CLOCK_BOOTTIME
// (two system calls: x/sys does not use the vDSO; about 0.5 µs in all
// here). The monotonic clock is read before and after the other two; if
// the two readings are more than 20 µs apart (the goroutine was preempted
// between them) it tries again, and reports false after three tries.
func ReadClocks() (ClockSample, bool) {
	for try := 0; try < 3; try++ {
		m1 := time.Now()
		var raw, boot unix.Timespec
		if unix.ClockGettime(unix.CLOCK_MONOTONIC_RAW, &raw) != nil || unix.ClockGettime(unix.CLOCK_BOOTTIME, &boot) != nil {
			return ClockSample{}, false
		}
		m2 := time.Now()
		if d := m2.Sub(m1); d <= 20*time.Microsecond {
			return ClockSample{Mono: m1.Add(d / 2), Raw: time.Duration(raw.Nano()), Boot: time.Duration(boot.Nano())}, true
		}
	}
	return ClockSample{}, false
}

// clocksReadable: this platform has the clocks ClockGuard needs.
const clocksReadable = true
