package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/audit"
	"github.com/airlockhq/airlock/internal/testworld"
)

// TestNothingUnrecordedWhenTheDiskIsFull (design §8, invariant 19): the
// sandbox's history lives on a small filesystem that fills up. While it is
// full, the member's DNS answers are SERVFAIL and its connections are
// refused, and airlockd's log says why; once there is room again both work
// and the history on disk holds every record, in order, once.
func TestNothingUnrecordedWhenTheDiskIsFull(t *testing.T) {
	w := testworld.New(t)
	const sb = "full"
	pol := filepath.Join(w.Dir, "full.yaml")
	write(t, pol, "sandbox:\n  unknown_action: deny\n  network_allowlist:\n    user:\n      - pattern: allowed.test\n")
	hist := filepath.Join(w.Dir, "state", "audit", sb)
	if err := os.MkdirAll(hist, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", hist, "tmpfs", 0, "size=256k"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(hist, unix.MNT_DETACH) }) // after airlockd stops
	cfg := filepath.Join(w.Dir, "airlockd.yaml")
	write(t, cfg, fmt.Sprintf("api_listen: 127.0.0.1:7433\nstate_dir: %[1]s/state\nrun_dir: %[1]s/run\nupstream_dns: [\"%[2]s:53\"]\nupstream_ca_file: %[3]s\nsandboxes:\n  - name: %[4]s\n    subnet: 10.88.0.0/24\n    policy: %[5]s\n",
		w.Dir, testworld.DNSAddr, w.CAFile, sb, pol))
	d := w.StartDaemon(cfg)
	run := func(argv ...string) (int, string) {
		r := w.Run(cfg, sb, "agent", 30*time.Second, argv...)
		return r.Code, r.Stdout + r.Stderr
	}
	fetch := []string{"curl", "-sS", "-m", "5", "--cacert", w.CAFile, "https://allowed.test/"}
	code, fakeIP := run("dig", "+short", "+tries=1", "allowed.test")
	if fakeIP = strings.TrimSpace(fakeIP); code != 0 || !inFakePool(t, fakeIP) {
		t.Fatalf("dig before the disk filled: %d %s", code, fakeIP)
	}
	code, out := run(fetch...)
	if code != 0 {
		t.Fatalf("fetch before the disk filled: %d %s", code, out)
	}

	filler := filepath.Join(hist, "filler")
	os.WriteFile(filler, make([]byte, 512<<10), 0o600) // fails part way: the disk is full
	// The journal's file still has room in its last page: queries until
	// one is refused. Then, in the same member: a DNS query over UDP and
	// over TCP, and connections to an address the gate gave out before.
	code, out = run("sh", "-c", "for i in $(seq 200); do dig +tries=1 allowed.test | grep -q SERVFAIL && break; done; echo filled $i; "+
		"dig +tries=1 allowed.test; dig +tries=1 +tcp allowed.test; "+
		"curl -sS -m 5 --resolve allowed.test:80:"+fakeIP+" http://allowed.test/; "+
		"curl -sS -m 5 --cacert "+w.CAFile+" --resolve allowed.test:443:"+fakeIP+" https://allowed.test/; echo end")
	if strings.Contains(out, "filled 200") || strings.Count(out, "status: SERVFAIL") != 2 || strings.Contains(out, "status: NOERROR") || strings.Contains(out, "internet") || !strings.Contains(out, "end") {
		t.Errorf("while the disk was full (code %d):\n%s", code, out)
	}
	if log := d.WaitLog("audit: records cannot be written", 1); !strings.Contains(log, "no space left on device") {
		t.Errorf("airlockd's log does not say why: %s", log)
	}

	os.Remove(filler)
	time.Sleep(200 * time.Millisecond) // a failing journal tries again at most every 100 ms
	if code, out := run("dig", "+tries=1", "allowed.test"); code != 0 || !strings.Contains(out, "status: NOERROR") {
		t.Errorf("dig once there was room: %d %q", code, out)
	}
	if code, out := run(fetch...); code != 0 || !strings.Contains(out, "internet") {
		t.Errorf("fetch once there was room: %d %s", code, out)
	}
	d.WaitLog("audit: the journal is written again", 1)
	// What was refused has no record each (a member's refusals would take
	// the room of the records waiting): the log counts it.
	if log := d.WaitLog("proxy: connections and requests were refused, unrecorded", 1); !strings.Contains(log, "refused=2") {
		t.Errorf("the proxy's count of refusals: %s", log)
	}
	d.WaitLog("dns: queries were answered SERVFAIL, unrecorded", 1)

	// Every record reached the file, in order, once.
	d.Stop()
	j, err := audit.Open(audit.Config{Dir: hist})
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	all := j.Query(audit.Filter{Limit: 100000})
	var dns, refused int
	for i, e := range all {
		if e.Seq != uint64(i+1) {
			t.Fatalf("record %d has seq %d: %+v", i, e.Seq, e)
		}
		if e.Kind == audit.KindDNS {
			dns++
		}
		if strings.Contains(e.Reason, "cannot write its audit records") {
			refused++
		}
	}
	if refused != 0 || dns < 6 {
		t.Errorf("history on disk: %d records of refusals for want of records (want none), %d DNS queries (want at least 6):\n%+v", refused, dns, all)
	}
}
