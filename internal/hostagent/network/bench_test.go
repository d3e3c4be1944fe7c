package network_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/pandastack/pandastack/internal/contract/netpolicy"
	"github.com/pandastack/pandastack/internal/hostagent/network"
	"github.com/pandastack/pandastack/internal/testing/nettest"
	"github.com/pandastack/pandastack/internal/testing/testkit"
)

// TestManyAtOnce: 20 sandboxes acquired concurrently, each online through
// its own namespace, each with its own /30 and veth.
func TestManyAtOnce(t *testing.T) {
	const n = 20
	env := nettest.NewEnv(t)
	m := newManager(t, env, network.Config{PoolSize: 4})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	defer func() { cancel(); <-done }()

	nss := make([]*network.Namespace, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			nss[i], errs[i] = m.Acquire(ctxT(t, 30*time.Second), netpolicy.Default())
		}()
	}
	wg.Wait()
	seen := map[string]bool{}
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("Acquire %d: %v", i, errs[i])
		}
		for _, k := range []string{nss[i].Name(), nss[i].HostVeth(), nss[i].NamespaceAddr().String()} {
			if seen[k] {
				t.Fatalf("%s handed out twice", k)
			}
			seen[k] = true
		}
	}
	guests := make([]*nettest.Guest, n)
	for i := range n {
		guests[i] = attach(t, env, nss[i])
	}
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body, err := guests[i].Get(ctxT(t, 10*time.Second), "http://allowed.test/")
			if err != nil || body != nettest.Hello(nettest.WebAddr) {
				errs[i] = fmt.Errorf("sandbox %d: %q, %v", i, body, err)
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
}

// percentiles reports the median and 99th percentile of ds in ms.
func percentiles(b *testing.B, ds []time.Duration, what string) {
	if len(ds) == 0 {
		return
	}
	slices.Sort(ds)
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	b.ReportMetric(ms(ds[len(ds)/2]), what+"_p50_ms")
	b.ReportMetric(ms(ds[(len(ds)*99)/100]), what+"_p99_ms")
}

// BenchmarkAcquire: a namespace from the pool vs one made on the spot
// (policy applied, forwarder running), and its Release.
//
//	go test ./internal/network -run '^$' -bench Acquire -benchtime 200x
func BenchmarkAcquire(b *testing.B) {
	for _, pooled := range []bool{true, false} {
		name := "spot"
		if pooled {
			name = "pool"
		}
		b.Run(name, func(b *testing.B) {
			env := nettest.NewEnv(b)
			cfg := network.Config{PoolSize: -1}
			if pooled {
				cfg.PoolSize = 4
			}
			m := newManager(b, env, cfg)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- m.Run(ctx) }()
			defer func() { cancel(); <-done }()
			var acq, rel []time.Duration
			b.ResetTimer()
			for range b.N {
				if pooled {
					b.StopTimer()
					testkit.WaitFor(b, 10*time.Second, "pool full", func() bool { return m.PoolLen() == 4 })
					b.StartTimer()
				}
				start := time.Now()
				ns, err := m.Acquire(ctxT(b, 10*time.Second), netpolicy.Default())
				if err != nil {
					b.Fatal(err)
				}
				acq = append(acq, time.Since(start))
				b.StopTimer()
				start = time.Now()
				if err := ns.Release(); err != nil {
					b.Fatal(err)
				}
				rel = append(rel, time.Since(start))
				b.StartTimer()
			}
			b.StopTimer()
			percentiles(b, acq, "acquire")
			percentiles(b, rel, "release")
		})
	}
}

// BenchmarkSetPolicy: replacing a running sandbox's policy (one netlink
// batch), alternating between two policies of 50 CIDRs and 10 names.
//
//	go test ./internal/network -run '^$' -bench SetPolicy -benchtime 500x
func BenchmarkSetPolicy(b *testing.B) {
	env := nettest.NewEnv(b)
	m := newManager(b, env, network.Config{})
	ns, err := m.Acquire(ctxT(b, 10*time.Second), netpolicy.Default())
	if err != nil {
		b.Fatal(err)
	}
	var p [2]netpolicy.Policy
	p[0].Internet = true
	for i := range 50 {
		p[0].DenyOut = append(p[0].DenyOut, fmt.Sprintf("198.51.%d.0/24", i))
		p[1].AllowOut = append(p[1].AllowOut, fmt.Sprintf("203.0.%d.0/25", i))
	}
	for i := range 10 {
		p[1].AllowOut = append(p[1].AllowOut, fmt.Sprintf("*.site%d.example", i))
	}
	ctx := ctxT(b, time.Hour)
	var ds []time.Duration
	b.ResetTimer()
	for i := range b.N {
		start := time.Now()
		if err := ns.SetPolicy(ctx, p[i%2]); err != nil {
			b.Fatal(err)
		}
		ds = append(ds, time.Since(start))
	}
	b.StopTimer()
	percentiles(b, ds, "set_policy")
}

// BenchmarkDNS: one A query from the guest through its forwarder to the
// test resolver and back (an allow-listed name, so its address is added
// to the sandbox's set before the answer), vs the same query straight
// from the test's host to the resolver.
//
//	go test ./internal/network -run '^$' -bench DNS -benchtime 500x
func BenchmarkDNS(b *testing.B) {
	env := nettest.NewEnv(b)
	m := newManager(b, env, network.Config{DNSQueriesPerSecond: 1_000_000})
	ns, err := m.Acquire(ctxT(b, 10*time.Second), netpolicy.Policy{AllowOut: []string{"allowed.test"}})
	if err != nil {
		b.Fatal(err)
	}
	g := attach(b, env, ns)
	q := new(dns.Msg)
	q.SetQuestion("allowed.test.", dns.TypeA)
	ctx := ctxT(b, time.Hour)
	var fwd, direct []time.Duration
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		r, err := g.Exchange(ctx, q, "udp", hostPort(network.GatewayAddr, 53))
		if err != nil || len(r.Answer) != 1 {
			b.Fatalf("through the forwarder: %v, %v", r, err)
		}
		fwd = append(fwd, time.Since(start))
		b.StopTimer()
		start = time.Now()
		c, err := env.Host.DialContext(ctx, "udp4", hostPort(nettest.DNSAddr, 53))
		if err != nil {
			b.Fatal(err)
		}
		co := &dns.Conn{Conn: c}
		if err := co.WriteMsg(q); err != nil {
			b.Fatal(err)
		}
		if _, err := co.ReadMsg(); err != nil {
			b.Fatal(err)
		}
		co.Close()
		direct = append(direct, time.Since(start))
		b.StartTimer()
	}
	b.StopTimer()
	percentiles(b, fwd, "forwarded")
	percentiles(b, direct, "direct")
}
