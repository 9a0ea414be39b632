package tproxy

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"

	"github.com/airlockhq/airlock/policy"
)

// MemberAPIPort is the port of the gateway where the proxy serves the
// member API (http://airlock.internal/), in plain HTTP.
const MemberAPIPort = 80

// memberAPIDst reports whether a connection was going to the member API:
// this sandbox's own gateway, port 80. Another sandbox's gateway is a raw
// IP like any other, and refused.
func (p *Proxy) memberAPIDst(dst netip.AddrPort) bool {
	return p.api != nil && dst == netip.AddrPortFrom(p.cfg.Listen.Addr(), MemberAPIPort)
}

// serveMemberAPI hands a connection to the member API's server and waits
// until the server is done with it, so that the connection keeps its
// place in the limits and Close can end it.
func (p *Proxy) serveMemberAPI(c *conn) {
	c.rec.Host, c.rec.Verdict, c.rec.Reason = policy.InternalName, policy.Allow, "the member API"
	ac := &apiConn{TCPConn: c.client, closed: make(chan struct{})}
	select {
	case p.apiConns <- ac:
	case <-p.ctx.Done():
		p.reset(c, "airlockd is stopping")
		return
	}
	select {
	case <-ac.closed:
	case <-p.ctx.Done():
		ac.Close()
	}
	c.rec.Close = "closed"
}

// startMemberAPI serves the member API's connections until Close.
func (p *Proxy) startMemberAPI() {
	if p.api == nil {
		return
	}
	ln := &apiListener{conns: p.apiConns, done: p.ctx.Done(), addr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(p.cfg.Listen.Addr(), MemberAPIPort))}
	p.wg.Go(func() {
		if err := p.api.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, net.ErrClosed) {
			p.log.Warn("member API stopped", "err", err)
		}
	})
}

// newMemberAPI is the server of the member API's handler: small heads
// and bodies, no idle connections kept for long, and requests that end
// when the proxy closes (a request waiting for a person included). While
// records cannot be written, every request gets the 503 an intercepted
// one gets, also on a connection kept alive from before: what a member
// asks for is recorded, so nothing is asked meanwhile.
func (p *Proxy) newMemberAPI(h http.Handler) *http.Server {
	return &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if why := p.unrecorded(); why != "" {
				p.refused.Add()
				w.Header().Set("Connection", "close")
				refuseUnrecorded(w, why)
				return
			}
			h.ServeHTTP(w, r)
		}),
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       20 * time.Second,
		IdleTimeout:       30 * time.Second,
		MaxHeaderBytes:    8 << 10,
		BaseContext:       func(net.Listener) context.Context { return p.ctx },
		ErrorLog:          slog.NewLogLogger(p.log.Handler(), slog.LevelDebug),
	}
}

// apiListener hands the member API's connections to its server.
type apiListener struct {
	conns <-chan *apiConn
	done  <-chan struct{}
	addr  net.Addr
}

func (l *apiListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *apiListener) Close() error   { return nil } // it ends with the proxy
func (l *apiListener) Addr() net.Addr { return l.addr }

// apiConn is a connection the member API serves; its Close tells the
// proxy the connection is done.
type apiConn struct {
	*net.TCPConn
	once   sync.Once
	closed chan struct{}
}

func (c *apiConn) Close() error {
	err := c.TCPConn.Close()
	c.once.Do(func() { close(c.closed) })
	return err
}
