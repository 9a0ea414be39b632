package tproxy

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/testenv"
)

// A connection learn mode let through is cut when learn mode ends: a
// member that opened it while learning cannot keep using it once the
// sandbox asks.
func TestProxyLearnedSpliceEndsWithLearnMode(t *testing.T) {
	up := startUpstream(t)
	until := time.Now().Add(2 * time.Second).UTC().Truncate(time.Second).Add(time.Second)
	yaml := strings.Replace(rules(up.httpsPort), "sandbox:\n", fmt.Sprintf("sandbox:\n  unknown_action: learn\n  learn_until: %q\n", until.Format(time.RFC3339)), 1)
	h := newHarness(t, up, netip.AddrPortFrom(fake("unknown.test"), up.httpsPort), yaml, nil)

	raw := h.connect(t, 30*time.Second)
	tc := tls.Client(raw, &tls.Config{ServerName: "unknown.test", RootCAs: up.roots(t), NextProtos: []string{"http/1.1"}})
	br := bufio.NewReader(tc)
	get := func() error {
		if _, err := io.WriteString(tc, "GET / HTTP/1.1\r\nHost: unknown.test\r\n\r\n"); err != nil {
			return err
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			return err
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return err
	}
	if err := get(); err != nil {
		waitRecords(t, h, 1)
		t.Fatalf("request while learning: %v; %+v", err, h.Records())
	}
	if !testenv.Poll(10*time.Second, func() bool { return h.sandbox.LearnUntil().IsZero() }) {
		t.Fatal("learn mode did not end")
	}
	// The proxy may need a moment to cut it; a request that still goes
	// through after that is the failure.
	ok := testenv.Poll(5*time.Second, func() bool { return get() != nil })
	if !ok {
		t.Errorf("a connection learn mode let through still carries requests after learn mode ended")
	}
}
