package faults

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"
)

// AgentEnv carries the agent's configuration (JSON) to the re-executed test
// binary; its presence is what makes TestFaultAgent run as the agent.
const AgentEnv = "GROVE_FAULTS_AGENT"

// Agent is the test's handle on the agent process in the client namespace:
// it sends commands and keeps every event, in arrival order, for the
// scenarios to wait on and to analyse afterwards.
type Agent struct {
	cmd    *exec.Cmd
	in     io.WriteCloser
	done   chan struct{}
	mu     sync.Mutex
	events []Event
	seq    int
}

// StartAgent re-executes the running test binary inside the client
// namespace as the agent (test run pattern runPattern), with its stderr
// going to errLog.
func StartAgent(cfg AgentConfig, runPattern string, errLog io.Writer, logf func(string, ...any)) (*Agent, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	b, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	a := &Agent{done: make(chan struct{})}
	a.cmd = Exec(clientNS, self, "-test.run="+runPattern, "-test.count=1")
	a.cmd.Env = append(os.Environ(), AgentEnv+"="+string(b))
	a.cmd.Stderr = errLog
	if a.in, err = a.cmd.StdinPipe(); err != nil {
		return nil, err
	}
	out, err := a.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := a.cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		defer close(a.done)
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 64<<10), 16<<20)
		for sc.Scan() {
			line := sc.Bytes()
			var e Event
			if !strings.HasPrefix(string(line), "{") || json.Unmarshal(line, &e) != nil {
				logf("agent: %s", line) // the test framework's own lines
				continue
			}
			if e.Ev == "error" {
				logf("agent error: %s", e.Err)
			}
			a.mu.Lock()
			a.events = append(a.events, e)
			a.mu.Unlock()
		}
		a.cmd.Wait()
	}()
	return a, nil
}

// Send writes a command; an ID is assigned if it has none and returned.
func (a *Agent) Send(c Command) (string, error) {
	a.mu.Lock()
	if c.ID == "" {
		a.seq++
		c.ID = fmt.Sprintf("%s%d", c.Op, a.seq)
	}
	a.mu.Unlock()
	b, err := json.Marshal(c)
	if err != nil {
		return "", err
	}
	_, err = a.in.Write(append(b, '\n'))
	return c.ID, err
}

// Events returns the events for which keep is true, in arrival order.
func (a *Agent) Events(keep func(Event) bool) []Event {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []Event
	for _, e := range a.events {
		if keep(e) {
			out = append(out, e)
		}
	}
	return out
}

// First returns the first event for which ok is true, if one came.
func (a *Agent) First(ok func(Event) bool) (Event, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, e := range a.events {
		if ok(e) {
			return e, true
		}
	}
	return Event{}, false
}

// Wait waits up to d for an event for which ok is true.
func (a *Agent) Wait(d time.Duration, ok func(Event) bool) (Event, bool) {
	deadline := time.Now().Add(d)
	for {
		if e, found := a.First(ok); found {
			return e, true
		}
		if time.Now().After(deadline) {
			return Event{}, false
		}
		select {
		case <-a.done:
			return Event{}, false // the agent is gone: nothing more will come
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Close ends the agent: its stdin closes, it cancels everything and exits;
// it is killed if it has not after 5 s.
func (a *Agent) Close() {
	a.in.Close()
	select {
	case <-a.done:
	case <-time.After(5 * time.Second):
		a.cmd.Process.Kill()
		<-a.done
	}
}
