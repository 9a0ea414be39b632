package tproxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
)

// Refuser stands where the proxy will stand: it accepts every connection
// the rules send it, logs where it was going, and resets it. Nothing a
// sandbox sends over TCP leaves the host.
type Refuser struct {
	sandbox string
	log     *slog.Logger
	ln      net.Listener
	once    sync.Once
}

// NewRefuser binds addr (the sandbox gateway and the proxy port).
func NewRefuser(sandbox string, addr netip.AddrPort, log *slog.Logger) (*Refuser, error) {
	ln, err := net.Listen("tcp4", addr.String())
	if err != nil {
		return nil, fmt.Errorf("proxy listener %s: %w", addr, err)
	}
	if log == nil {
		log = slog.Default()
	}
	return &Refuser{sandbox: sandbox, log: log.With("component", "tproxy", "sandbox", sandbox), ln: ln}, nil
}

// Run accepts and refuses connections until Close or ctx ends.
func (r *Refuser) Run(ctx context.Context) error {
	stop := context.AfterFunc(ctx, func() { r.Close() })
	defer stop()
	for {
		c, err := r.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		tc := c.(*net.TCPConn)
		dst, err := OriginalDst(tc)
		host := dst.String()
		if err != nil {
			host = "unknown"
		}
		r.log.Info("connection", "source", tc.RemoteAddr().String(), "host", host, "verdict", "deny",
			"rule", "", "reason", "the proxy does not carry traffic yet; refused (fail closed)")
		tc.SetLinger(0) // reset, not a clean close
		tc.Close()
	}
}

// Close stops accepting. It is idempotent.
func (r *Refuser) Close() error {
	var err error
	r.once.Do(func() { err = r.ln.Close() })
	return err
}
