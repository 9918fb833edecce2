package ddstable

import (
	"testing"
	"time"
)

// The simulator with a slow library relative to the bricks' prepare
// timeout (vote timeout 400 ms > prepare timeout 150 ms), as a stalled
// library looks to the bricks.
func TestReview120SimSlowLibrary(t *testing.T) {
	base, n := simSeeds(t, 300)
	bad := 0
	for seed := base; seed < base+uint64(n); seed++ {
		s := newSim(t, seed, defaultSimConfig())
		s.ccfg.VoteTimeout, s.ccfg.Deadline = 400*time.Millisecond, time.Second
		for _, c := range s.clients {
			c.coord.cfg.VoteTimeout, c.coord.cfg.Deadline = s.ccfg.VoteTimeout, s.ccfg.Deadline
		}
		func() {
			defer func() {
				if r := recover(); r != nil {
					s.violates = append(s.violates, "panic: "+r.(string))
				}
			}()
			s.run()
		}()
		if len(s.violates) > 0 {
			bad++
			if bad <= 12 {
				t.Errorf("seed %d: %v", seed, s.violates)
			}
		}
	}
	t.Logf("%d of %d seeds violated", bad, n)
}

func TestReview120SimLossy(t *testing.T) {
	base, n := simSeeds(t, 300)
	bad := 0
	for seed := base; seed < base+uint64(n); seed++ {
		cfg := defaultSimConfig()
		cfg.drop = 0.15
		s := newSim(t, seed, cfg)
		s.ccfg.VoteTimeout, s.ccfg.Deadline = 400*time.Millisecond, time.Second
		for _, c := range s.clients {
			c.coord.cfg.VoteTimeout, c.coord.cfg.Deadline = s.ccfg.VoteTimeout, s.ccfg.Deadline
		}
		func() {
			defer func() {
				if r := recover(); r != nil {
					s.violates = append(s.violates, "panic: "+r.(string))
				}
			}()
			s.run()
		}()
		if len(s.violates) > 0 {
			bad++
			if bad <= 12 {
				t.Errorf("seed %d: %.300v", seed, s.violates)
			}
		}
	}
	t.Logf("%d of %d seeds violated", bad, n)
}
