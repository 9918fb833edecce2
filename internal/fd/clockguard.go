package fd

import (
	"errors"
	"fmt"
	"time"
)

// ErrClockUntrusted: an observer whose clock a ClockGuard does not trust
// does not answer.
var ErrClockUntrusted = errors.New("fd: this observer's clock ran outside the drift bound recently; it does not answer")

// ClockSample is one reading of a process's clocks, taken together. Mono
// is the clock the detector and every lease run on (time.Now's monotonic
// reading, CLOCK_MONOTONIC on Linux), which time daemons slew: chrony by
// up to 8.3 % by default, after any offset of a few seconds (a host's
// clock corrected, a virtual machine resumed). Raw is CLOCK_MONOTONIC_RAW,
// the oscillator, which nothing slews (its own error is parts per
// million). Boot is CLOCK_BOOTTIME: Mono plus the time the host was
// suspended.
type ClockSample struct {
	Mono      time.Time
	Raw, Boot time.Duration
}

// ClockGuard checks, on a node's own clocks, the premise of the
// invariant's proof (fd.go): that the clock runs at a rate within ρ of
// real time. It compares Mono with Raw: a clock slewed by more than the
// guard's bound (ρ/2, at least 500 ppm) over any interval between two
// samples of the last window, or a host that was suspended (Boot moving
// ahead of Mono), makes the clock untrusted for a window from that
// reading. The driver then gives the running incarnation up (its leases
// were measured on that clock), answers no query as an observer (its
// silences were), and reports no incarnation alive until the clock is
// trusted again; a window of 2·GracePeriod means every deadline and every
// silence measured after it lies wholly after the bad reading. Outside
// review 110 showed a 5 % slew (within chrony's default) reporting an
// incarnation dead 74 ms before its own deadline.
//
// Over a pair of samples the difference allowed is bound·Δraw + slack,
// slack covering the skew of reading the clocks one after the other. A
// check between samples (Alive, Deadline) compares the reading with every
// kept sample, so an interval ending now is checked as well as those
// ending at a sample (by the triangle inequality the error over any
// interval is then at most bound·length + 2·slack, within the proof's
// 1 ms margin, and ρ/2 of rate within its ρ).
//
// It is not safe for concurrent use (the driver holds its lock).
type ClockGuard struct {
	bound   float64
	slack   time.Duration
	window  time.Duration
	samples []ClockSample // kept: within window of the newest (the newest always)

	bad      bool          // a bad reading was seen
	badUntil time.Duration // Raw time until which the clock is untrusted
	why      string        // what the last bad reading was
	episode  uint64        // counts trusted → untrusted transitions
	trusted  bool          // as of the last check
}

// MinClockBound is the least rate error a ClockGuard allows: ntpd slews
// at most 500 ppm, and a guard tighter than the time daemon would fence
// nodes for ordinary corrections. Config.Validate asks ρ ≥ MinMaxDrift =
// 2·MinClockBound, so that the guard's bound is ρ/2 (outside review 111:
// with ρ = 0 a guard at 500 ppm let clocks through that the proof rules
// out).
const MinClockBound = 500e-6

// MaxSlewRate is the fastest the kernel slews CLOCK_MONOTONIC (adjtimex's
// tick adjustment: ±10 %). A lease user that compares a deadline it holds
// with its own clock is not stopped by the guard until the driver's next
// tick gives the incarnation up (Interval/4 later, or later still if the
// tick is late): Driver.Deadline hands out deadlines LeaseMargin early,
// which covers a slew at that rate over two tick periods (outside review
// 111: a deadline cached before a 10 % slew that began just after a tick,
// the tick then 130-150 ms late, was used 1.8-4.1 ms after the
// observers' verdict, beyond the proof's own headroom).
const MaxSlewRate = 0.1

// LeaseMargin is how much earlier than the engine's deadline the driver's
// Deadline is: MaxSlewRate over two tick periods (2·Interval/4); 10 ms
// for the default Interval.
func LeaseMargin(interval time.Duration) time.Duration {
	return time.Duration(MaxSlewRate * float64(2*(interval/4)))
}

// ClockSlack is the skew allowed between two readings of the clocks.
const ClockSlack = 100 * time.Microsecond

// NewClockGuard returns a guard for drift bound rho (Config.MaxDrift) and
// a window (2·GracePeriod in the driver).
//
// A host that was suspended (or a clock slewed) between the last check
// and the next tick is noticed at that tick at the latest: the driver's
// ticker runs on the monotonic clock, so it fires within Interval/4 of
// waking. A lease user that compares a deadline it holds with its own
// clock in that time acts, as after a pause of its own process between
// a check and the act: fencing tokens are what protect storage from it.
func NewClockGuard(rho float64, window time.Duration) *ClockGuard {
	return &ClockGuard{bound: max(rho/2, MinClockBound), slack: ClockSlack, window: window, trusted: true}
}

// Check compares reading s with the kept samples and reports whether the
// clock is trusted at s, and if not, why. keep adds s to the samples (the
// driver's ticks keep theirs; Alive and Deadline only check).
func (g *ClockGuard) Check(s ClockSample, keep bool) (bool, string) {
	for _, p := range g.samples {
		if why := g.compare(p, s); why != "" {
			g.bad, g.why = true, why
			g.badUntil = max(g.badUntil, s.Raw+g.window)
		}
	}
	ok := !g.bad || s.Raw >= g.badUntil
	if ok {
		g.bad = false
	} else if g.trusted {
		g.episode++
	}
	g.trusted = ok
	if keep && (len(g.samples) == 0 || s.Raw > g.samples[len(g.samples)-1].Raw) {
		g.samples = append(g.samples, s)
		i := 0
		for i < len(g.samples)-1 && s.Raw-g.samples[i].Raw > g.window {
			i++
		}
		g.samples = append(g.samples[:0], g.samples[i:]...)
	}
	if ok {
		return true, ""
	}
	return false, g.why
}

// compare checks the interval from sample p to reading s.
func (g *ClockGuard) compare(p, s ClockSample) string {
	dr := s.Raw - p.Raw
	dm := s.Mono.Sub(p.Mono)
	if dr < 0 {
		// A reading taken before the sample (a check racing a tick is
		// serialised by the driver's lock, so this is not expected):
		// compare the other way round.
		p, s, dr, dm = s, p, -dr, -dm
	}
	allowed := time.Duration(g.bound*float64(dr)) + g.slack
	if d := dm - dr; d > allowed || -d > allowed {
		return fmt.Sprintf("the monotonic clock moved %v while the raw oscillator moved %v (%+.2f%%, more than the %.2f%% allowed): a time daemon is slewing it beyond the failure detector's drift bound",
			dm, dr, 100*float64(dm-dr)/float64(max(dr, 1)), 100*g.bound)
	}
	if susp := (s.Boot - p.Boot) - dm; susp > g.slack {
		return fmt.Sprintf("the host was suspended for %v", susp)
	}
	return ""
}

// Episode counts the times the clock went from trusted to untrusted: the
// driver gives up the incarnation running when a new episode begins.
func (g *ClockGuard) Episode() uint64 { return g.episode }
