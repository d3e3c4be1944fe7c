// Package network owns the host side of sandbox networking: one network
// namespace per sandbox holding the TAP device QEMU uses and one end of a
// veth pair to the host, NAT at both ends, the egress policy (nftables
// through google/nftables, no shelling out), a DNS forwarder per sandbox
// that enforces the policy's domain names, and a pool of prepared
// namespaces so that a create does not wait for one.
//
// # Topology
//
// Every guest has the same addressing (GuestAddr, GuestMAC, GatewayAddr,
// GatewayMAC), baked into the template, so a restore or a fork needs no
// change inside the guest, only a new namespace on the host:
//
//	guest 100.96.0.2 ── tap0 100.96.0.1 [namespace <prefix>-<id>] eth0 10.234.n.2
//	                                                                 │ veth
//	                       host: <prefix><n> 10.234.n.1 ── NAT ── uplink
//
// The namespace masquerades the guest to its eth0 address; the host
// masquerades the pool out of whatever interface routes it. The namespace
// runs with nf_conntrack_tcp_loose=0, so a TCP segment of a connection it
// never saw open is INVALID there and answered with a TCP reset toward the
// guest: a fork child's inherited connections die cleanly inside its own
// namespace and never reach the peer, which keeps talking to the parent.
//
// # What is rejected, and where
//
// Rejected packets get a TCP reset (TCP) or ICMP "administratively
// prohibited" (anything else), so clients fail at once instead of timing
// out.
//
//   - The host table (family ip, named <prefix>, in the host namespace)
//     rejects, for every packet coming from a sandbox veth: anything to the
//     host itself (input hook: every local address, any port), anything to
//     another sandbox (veth to veth), and anything to an always-blocked
//     range: 169.254.0.0/16 (cloud metadata), RFC 1918, 100.64.0.0/10, the
//     pool, every subnet of the host's interfaces, and 0/8, 127/8, 224/3.
//     Ranges listed in Config.AllowedHostNets are exceptions to the last
//     rule and to the input rule, never for the pool. It also drops new connections toward a
//     veth from outside (sandboxes are reachable only through DialContext)
//     and packets from a veth whose source is not the sandbox's address.
//   - The sandbox's table (family ip, named <prefix>, in its namespace)
//     applies the sandbox's Policy to traffic from tap0, resets INVALID
//     packets from tap0 (see above), lets the guest reach the DNS forwarder
//     and ping its gateway and nothing else of the namespace, redirects
//     every DNS query of the guest (UDP and TCP port 53, whatever address)
//     to the forwarder, and drops spoofed sources.
//
// # Egress policy
//
// See Policy for the precedence of its entries. IP and CIDR entries go
// into nftables sets; domain names are enforced by the forwarder, which
// answers NXDOMAIN for a denied name and adds the A records it answered for
// an allowed name to a set with a timeout (the record's TTL, at least
// Config.DNSMinTimeout). A new policy replaces the sets and the default
// verdict in one netlink batch; established connections are kept.
//
// # DNS
//
// Each namespace runs a forwarder on GatewayAddr:53, UDP and TCP, bound
// inside the namespace and served by this process. It does no recursion:
// it forwards to Config.Upstreams (default: the host's resolv.conf, or
// systemd-resolved's upstreams where that names only resolved's stub)
// from the host namespace, over the transport the guest used. A name the
// policy rejects gets NXDOMAIN without an upstream query, and so does a
// name in the reverse zone of a range no sandbox reaches (PTR of private
// addresses, say); A records of addresses no sandbox reaches (the
// always-blocked ranges, the pool and the host's subnets, less the
// operator's exceptions) are removed from answers, as are AAAA records
// (guests are IPv4 only, so they never try an address they cannot
// reach), and the same from SVCB/HTTPS address hints: an internal zone
// behind the host's resolver tells a sandbox no address, and a public
// name cannot be rebound to one. AXFR, IXFR, ANY and non-IN classes get
// REFUSED; an upstream failure SERVFAIL. Bounds per sandbox:
// Config.DNSQueriesPerSecond (burst twice that; excess REFUSED), 32
// upstream queries in flight (excess SERVFAIL), 16 TCP connections,
// answers truncated to the guest's EDNS size (512 without) and
// Config.DNSMaxAnswer.
//
// # Lifecycle
//
// New checks the configuration and installs the host table; it starts no
// goroutine. Run fills the pool in the background until its context ends.
// Acquire hands out a namespace (from the pool or made on the spot);
// Namespace.Release removes it. Cleanup removes whatever an earlier
// process left (by name prefix) and Adopt takes a kept namespace over.
// Close releases everything. Every object is named after Config.Prefix:
// namespaces "<prefix>-<8 hex>" (in /run/netns, visible to `ip netns`),
// host veths "<prefix><n>" (with the namespace's name as alias), the host
// table "<prefix>" and one table "<prefix>" in each namespace.
package network
