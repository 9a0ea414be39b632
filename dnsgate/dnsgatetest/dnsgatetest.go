// Package dnsgatetest provides a fake upstream DNS server that answers from a
// table and logs every query it receives, so tests can assert which names
// reached "the internet".
package dnsgatetest

import (
	"net"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"
)

// Server is a fake authoritative server for a few names.
type Server struct {
	// A maps a name (lower case, no trailing dot) to its IPv4 address. A
	// key "*.example" answers for every name under example that has no
	// key of its own.
	A map[string]string
	// TXT maps a name to its TXT record.
	TXT map[string]string

	mu      sync.Mutex // guards queries
	queries []Query

	udp, tcp *dns.Server
}

// Query is one query the server received.
type Query struct {
	Name string // lower case, no trailing dot
	Type string
	Net  string // "udp" or "tcp"
}

// Start serves on addr (such as "127.0.0.1:0" or "203.0.113.53:53") over
// UDP and TCP on the same port and returns the bound address.
func (s *Server) Start(addr string) (string, error) {
	// With port 0, TCP takes the port UDP got; when another program's TCP
	// socket holds it, other ports are tried, a few times (as the gate does).
	var pc net.PacketConn
	var ln net.Listener
	for attempt := 1; ; attempt++ {
		var err error
		if pc, err = net.ListenPacket("udp4", addr); err != nil {
			return "", err
		}
		if ln, err = net.Listen("tcp4", pc.LocalAddr().String()); err == nil {
			break
		}
		pc.Close()
		if !strings.HasSuffix(addr, ":0") || attempt == 20 {
			return "", err
		}
	}
	s.udp = &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(s.serve("udp"))}
	s.tcp = &dns.Server{Listener: ln, Handler: dns.HandlerFunc(s.serve("tcp"))}
	for _, srv := range []*dns.Server{s.udp, s.tcp} {
		started := make(chan struct{})
		srv.NotifyStartedFunc = func() { close(started) }
		go srv.ActivateAndServe()
		select {
		case <-started:
		case <-time.After(5 * time.Second):
		}
	}
	return pc.LocalAddr().String(), nil
}

// Close stops the server.
func (s *Server) Close() {
	for _, srv := range []*dns.Server{s.udp, s.tcp} {
		if srv != nil {
			srv.Shutdown()
		}
	}
}

// Queries returns the queries received so far.
func (s *Server) Queries() []Query {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Query(nil), s.queries...)
}

// Saw reports whether a query for name (any type) arrived.
func (s *Server) Saw(name string) bool {
	for _, q := range s.Queries() {
		if q.Name == name {
			return true
		}
	}
	return false
}

// lookupA finds name in A, exactly or under the closest "*." key.
func (s *Server) lookupA(name string) (string, bool) {
	if ip, ok := s.A[name]; ok {
		return ip, true
	}
	for rest := name; ; {
		_, after, ok := strings.Cut(rest, ".")
		if !ok {
			return "", false
		}
		if ip, ok := s.A["*."+after]; ok {
			return ip, true
		}
		rest = after
	}
}

func (s *Server) serve(netw string) func(dns.ResponseWriter, *dns.Msg) {
	return func(w dns.ResponseWriter, req *dns.Msg) {
		resp := new(dns.Msg)
		resp.SetReply(req)
		if len(req.Question) != 1 {
			resp.SetRcodeFormatError(req)
			w.WriteMsg(resp)
			return
		}
		q := req.Question[0]
		name := strings.TrimSuffix(strings.ToLower(q.Name), ".")
		s.mu.Lock()
		s.queries = append(s.queries, Query{Name: name, Type: dns.Type(q.Qtype).String(), Net: netw})
		s.mu.Unlock()
		resp.Authoritative = true
		found := false
		if ip, ok := s.lookupA(name); ok {
			found = true
			if q.Qtype == dns.TypeA {
				resp.Answer = append(resp.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60}, A: net.ParseIP(ip)})
			}
		}
		if txt, ok := s.TXT[name]; ok {
			found = true
			if q.Qtype == dns.TypeTXT {
				resp.Answer = append(resp.Answer, &dns.TXT{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeTXT, Class: dns.ClassINET, Ttl: 60}, Txt: []string{txt}})
			}
		}
		if !found {
			resp.Rcode = dns.RcodeNameError
		}
		w.WriteMsg(resp)
	}
}
