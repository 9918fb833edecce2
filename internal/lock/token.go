package lock

import (
	"errors"
	"fmt"
	"sync"
)

// ErrStaleToken is what a storage server answers to a write whose fencing
// token is older than one it has already accepted for the same lock: the
// writer's lease has moved on (it was paused, or its message was delayed).
var ErrStaleToken = errors.New("lock: write refused: its fencing token is older than one already accepted for this lock")

// TokenGuard is the storage side of fencing tokens: one per storage server
// (or per object it protects). The contract for every layer that a lease
// protects (RLDev segments, the chunk map, B-tree nodes, file blocks):
//
//   - every write made under a lease carries the holder's Held.Token() (a
//     recovery run's writes carry Recovery.Token);
//   - the server calls Admit(lock name, token) before applying the write,
//     atomically with it, and refuses the write on ErrStaleToken;
//   - a server that must keep the guarantee across its own restarts
//     persists the largest admitted token with the data it protects.
//
// Writes are fenced under exclusive leases, whose grants are totally
// ordered; shared holders may hold different tokens at once, so a layer that
// lets shared holders write must not fence those writes against each other.
// Safe for concurrent use.
type TokenGuard struct {
	mu  sync.Mutex
	max map[string]Token
}

// Admit accepts a write under lock name with token t if no write with a
// newer token was admitted before; a zero token is always refused.
func (g *TokenGuard) Admit(name string, t Token) error {
	if t.IsZero() {
		return fmt.Errorf("%w: no token", ErrStaleToken)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.max == nil {
		g.max = map[string]Token{}
	}
	if cur := g.max[name]; t.Less(cur) {
		return fmt.Errorf("%w: %q has seen %s, write carries %s", ErrStaleToken, name, cur, t)
	}
	g.max[name] = t
	return nil
}

// Max returns the newest token admitted for name (zero if none).
func (g *TokenGuard) Max(name string) Token {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.max[name]
}
