package dnsgate

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/miekg/dns"
)

// Exchanger sends a query to an upstream resolver.
type Exchanger interface {
	// Exchange sends m and returns the upstream's reply. It does not modify m.
	Exchange(ctx context.Context, m *dns.Msg) (*dns.Msg, error)
}

// Upstream forwards queries to upstream DNS servers, in order, UDP first
// and TCP when a reply is truncated.
type Upstream struct {
	servers []string // host:port
	udp     *dns.Client
	tcp     *dns.Client
}

// DefaultUpstreamTimeout bounds one exchange with one upstream server.
const DefaultUpstreamTimeout = 3 * time.Second

// ParseUpstreams reads the upstream_dns setting: "system" takes the
// nameservers of resolvConf (normally /etc/resolv.conf); anything else is an
// IP or IP:port (port 53 when none is given).
func ParseUpstreams(spec []string, resolvConf string) ([]string, error) {
	if len(spec) == 0 {
		spec = []string{"system"}
	}
	var out []string
	for _, s := range spec {
		if s == "system" {
			ns, err := systemNameservers(resolvConf)
			if err != nil {
				return nil, err
			}
			out = append(out, ns...)
			continue
		}
		ap, err := netip.ParseAddrPort(s)
		if err != nil {
			a, aerr := netip.ParseAddr(s)
			if aerr != nil {
				return nil, fmt.Errorf("upstream_dns %q: want \"system\", an IP or IP:port", s)
			}
			ap = netip.AddrPortFrom(a, 53)
		}
		out = append(out, ap.String())
	}
	return out, nil
}

func systemNameservers(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("upstream_dns \"system\": %w; set upstream_dns to an IP:port", err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && fields[0] == "nameserver" {
			a, err := netip.ParseAddr(fields[1])
			if err != nil || a.Zone() != "" {
				continue
			}
			out = append(out, netip.AddrPortFrom(a, 53).String())
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("upstream_dns \"system\": no nameserver in %s; set upstream_dns to an IP:port", path)
	}
	return out, sc.Err()
}

// NewUpstream returns a forwarder to servers (host:port); timeout bounds one
// exchange with one server (0 means DefaultUpstreamTimeout).
func NewUpstream(servers []string, timeout time.Duration) (*Upstream, error) {
	if len(servers) == 0 {
		return nil, errors.New("no upstream DNS servers")
	}
	if timeout == 0 {
		timeout = DefaultUpstreamTimeout
	}
	return &Upstream{
		servers: servers,
		udp:     &dns.Client{Net: "udp", Timeout: timeout, UDPSize: 1232},
		tcp:     &dns.Client{Net: "tcp", Timeout: timeout},
	}, nil
}

// Exchange implements Exchanger.
func (u *Upstream) Exchange(ctx context.Context, m *dns.Msg) (*dns.Msg, error) {
	var errs []error
	for _, s := range u.servers {
		r, _, err := u.udp.ExchangeContext(ctx, m, s)
		if err == nil && r.Truncated {
			r, _, err = u.tcp.ExchangeContext(ctx, m, s)
		}
		if err == nil {
			return r, nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", s, err))
		if ctx.Err() != nil {
			break
		}
	}
	return nil, fmt.Errorf("upstream DNS: %w", errors.Join(errs...))
}
