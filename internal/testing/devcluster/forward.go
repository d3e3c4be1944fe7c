package devcluster

import (
	"io"
	"net"
	"sync"
	"time"
)

// forwarder relays TCP connections from an address on the bridge to the
// control plane listening on loopback, which the agents' namespaces
// cannot reach.
type forwarder struct {
	ln     net.Listener
	target string
	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  map[net.Conn]bool
}

func startForwarder(listen, target string) (*forwarder, error) {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, err
	}
	f := &forwarder{ln: ln, target: target, conns: map[net.Conn]bool{}}
	f.wg.Add(1)
	go f.serve()
	return f, nil
}

func (f *forwarder) serve() {
	defer f.wg.Done()
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return
		}
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			f.relay(c)
		}()
	}
}

func (f *forwarder) track(c net.Conn, on bool) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.conns == nil {
		return false // closed
	}
	if on {
		f.conns[c] = true
	} else {
		delete(f.conns, c)
	}
	return true
}

func (f *forwarder) relay(c net.Conn) {
	defer c.Close()
	t, err := net.DialTimeout("tcp", f.target, 5*time.Second)
	if err != nil {
		return // the control plane is down (restarting): the agent retries
	}
	defer t.Close()
	if !f.track(c, true) || !f.track(t, true) {
		return
	}
	defer f.track(c, false)
	defer f.track(t, false)
	done := make(chan struct{}, 2)
	go func() { io.Copy(t, c); t.(*net.TCPConn).CloseWrite(); done <- struct{}{} }()
	go func() { io.Copy(c, t); c.(*net.TCPConn).CloseWrite(); done <- struct{}{} }()
	<-done
	<-done
}

// Close stops listening, ends the relayed connections and waits for them.
func (f *forwarder) Close() error {
	err := f.ln.Close()
	f.mu.Lock()
	for c := range f.conns {
		c.Close()
	}
	f.conns = nil
	f.mu.Unlock()
	f.wg.Wait()
	return err
}
