package tproxy

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"

	"github.com/airlockhq/airlock/policy"
)

// dial resolves host (unless it is a raw IP the policy allowed) and
// connects to the first address the SSRF guard lets through.
func (p *Proxy) dial(c *conn, host string, dst netip.AddrPort, rawIP bool) (*net.TCPConn, error) {
	ctx, cancel := context.WithTimeout(p.ctx, p.cfg.ConnectTimeout)
	defer cancel()
	var addrs []netip.Addr
	if rawIP {
		addrs = []netip.Addr{dst.Addr()}
	} else {
		var err error
		if addrs, err = p.cfg.Resolve(ctx, host); err != nil {
			return nil, fmt.Errorf("resolve %s: %v", host, err)
		}
	}
	conn, err := p.dialFirst(ctx, c.rec.Source, host, addrs, dst.Port(), host+":"+strconv.Itoa(int(dst.Port())))
	if err == nil {
		c.rec.Upstream = conn.RemoteAddr().(*net.TCPAddr).AddrPort().String()
	}
	return conn, err
}

// dialFirst connects to the first of addrs (resolved for host) that the
// SSRF guard lets source reach on port. what names the destination in the
// error.
func (p *Proxy) dialFirst(ctx context.Context, source, host string, addrs []netip.Addr, port uint16, what string) (*net.TCPConn, error) {
	var refused, errs []string
	for _, a := range addrs {
		a = a.Unmap() // checked and dialled as the IPv4 address it is
		if why := p.ssrf(source, a, port); why != "" {
			refused = append(refused, a.String()+" ("+why+")")
			continue
		}
		// The local port is left to connect(2), which shares one among
		// connections to different destinations. Dialer.DialTCP would
		// bind to 0.0.0.0:0 first (golang/go#81620), holding a port of
		// its own for each connection and for its minute in TIME_WAIT.
		var d net.Dialer
		conn, err := d.DialContext(ctx, "tcp4", netip.AddrPortFrom(a, port).String())
		if err != nil {
			errs = append(errs, err.Error())
			continue
		}
		return conn.(*net.TCPConn), nil
	}
	if len(errs) == 0 && len(refused) > 0 {
		return nil, &ssrfError{host: host, refused: refused}
	}
	return nil, fmt.Errorf("connect to %s: %s", what, strings.Join(errs, "; "))
}

// ssrf returns why an upstream address is refused, or "". Loopback,
// private, CGNAT, link-local (cloud metadata), multicast, unspecified and
// reserved addresses, the fake pool, and every address of this host or
// that the kernel delivers locally are refused unless a cidr: rule names
// the address. For the host's own addresses (loopback, 0.0.0.0/8, local
// ones) that rule must name exactly that address (a /32): a rule for a
// public range that happens to hold the host's own address does not open
// the host's services (design §8, invariant 12).
func (p *Proxy) ssrf(source string, a netip.Addr, port uint16) string {
	a = a.Unmap()
	why, host := "", false
	switch {
	case !a.Is4():
		why = "not IPv4"
	case a.IsLoopback():
		why, host = "loopback", true
	case a.IsUnspecified(), thisNet.Contains(a):
		why, host = "this host (0.0.0.0/8)", true
	case p.cfg.IsLocal != nil && p.cfg.IsLocal(a):
		why, host = "an address of this host", true
	case a.IsPrivate():
		why = "private network"
	case cgnat.Contains(a):
		why = "carrier-grade NAT range"
	case a.IsLinkLocalUnicast():
		why = "link-local (cloud metadata)"
	case a.IsMulticast(), a.IsLinkLocalMulticast():
		why = "multicast"
	case reserved.Contains(a), a == broadcast:
		why = "reserved"
	case p.cfg.Names.Contains(a):
		why = "airlock's fake-IP pool"
	}
	if why == "" {
		return ""
	}
	d := p.cfg.Policy.Decide(policy.Query{Source: source, Host: a.String(), Port: port})
	if d.Verdict == policy.Allow && d.Rule != nil && d.Rule.Pattern.Kind() == policy.KindCIDR &&
		(!host || d.Rule.Pattern.Prefix().Bits() == 32) {
		return ""
	}
	if host {
		return why + "; only a cidr: rule for exactly this address (/32) opens it"
	}
	return why
}

var (
	cgnat     = netip.MustParsePrefix("100.64.0.0/10")
	thisNet   = netip.MustParsePrefix("0.0.0.0/8")
	reserved  = netip.MustParsePrefix("240.0.0.0/4")
	broadcast = netip.MustParseAddr("255.255.255.255")
)

// dialUpstream is the Transport's dialer: addr is the connection's checked
// name and port; it is resolved upstream and every address passes the SSRF
// guard.
func (p *Proxy) dialUpstream(ctx context.Context, network, addr string) (net.Conn, error) {
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	port, _ := strconv.Atoi(portStr)
	source, _ := ctx.Value(sourceKey{}).(string)
	addrs, err := p.cfg.Resolve(ctx, host)
	if err != nil {
		return nil, fmt.Errorf("resolve %s: %w", host, err)
	}
	c, err := p.dialFirst(ctx, source, host, addrs, uint16(port), addr)
	if err != nil {
		return nil, err // not a nil *net.TCPConn in a non-nil net.Conn
	}
	return c, nil
}

// ssrfError is a refusal by the SSRF guard of every address a name
// resolves to.
type ssrfError struct {
	host    string
	refused []string
}

func (e *ssrfError) Error() string {
	return fmt.Sprintf("%s resolves only to addresses the SSRF guard refuses: %s; allow one explicitly with a cidr: rule", e.host, strings.Join(e.refused, ", "))
}

func explainUpstream(err error) error {
	var uerr x509.UnknownAuthorityError
	var herr x509.HostnameError
	switch {
	case errors.As(err, &uerr):
		return fmt.Errorf("the upstream's certificate is not signed by a trusted CA (add its CA to upstream_ca_file if it is yours): %w", err)
	case errors.As(err, &herr):
		return fmt.Errorf("the upstream's certificate is not valid for this host name: %w", err)
	}
	return err
}
