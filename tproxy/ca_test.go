package tproxy

import (
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestCACreateLoadAndLeaves(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ca", "sb")
	ca, err := LoadOrCreateCA(dir, "sb")
	if err != nil {
		t.Fatal(err)
	}
	for name, mode := range map[string]os.FileMode{"ca.key": 0o600, "ca.pem": 0o644, "bundle.pem": 0o644} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil || fi.Mode().Perm() != mode {
			t.Errorf("%s: %v %v, want mode %v", name, fi, err, mode)
		}
	}
	bundle, _ := os.ReadFile(ca.BundleFile())
	if !strings.HasSuffix(string(bundle), string(ca.CertPEM())) {
		t.Error("bundle does not end with the sandbox CA")
	}
	again, err := LoadOrCreateCA(dir, "sb")
	if err != nil || string(again.CertPEM()) != string(ca.CertPEM()) {
		t.Fatalf("reloading gave another CA: %v", err)
	}
	leaf, err := ca.Leaf("api.allowed.test")
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.CertPEM())
	if _, err := leaf.Leaf.Verify(x509.VerifyOptions{DNSName: "api.allowed.test", Roots: roots}); err != nil {
		t.Errorf("leaf does not verify: %v", err)
	}
	if _, err := leaf.Leaf.Verify(x509.VerifyOptions{DNSName: "other.test", Roots: roots}); err == nil {
		t.Error("leaf verifies for another name")
	}
	if d := leaf.Leaf.NotAfter.Sub(leaf.Leaf.NotBefore); d > 26*time.Hour {
		t.Errorf("leaf valid for %v, want about a day", d)
	}
	// A hit returns the same certificate; concurrent misses mint once.
	if again, _ := ca.Leaf("api.allowed.test"); again != leaf {
		t.Error("cache miss for a cached host")
	}
	var wg sync.WaitGroup
	got := make([]any, 20)
	for i := range got {
		wg.Add(1)
		go func() { defer wg.Done(); c, _ := ca.Leaf("burst.test"); got[i] = c }()
	}
	wg.Wait()
	for _, c := range got {
		if c != got[0] {
			t.Fatal("concurrent misses minted more than one certificate")
		}
	}
	// Near expiry a leaf is replaced, with a new serial.
	ca.now = func() time.Time { return time.Now().Add(23 * time.Hour) }
	renewed, _ := ca.Leaf("api.allowed.test")
	if renewed == leaf || renewed.Leaf.SerialNumber.Cmp(leaf.Leaf.SerialNumber) == 0 {
		t.Error("leaf not renewed near expiry")
	}
}

func TestCARefusesUnsafeFiles(t *testing.T) {
	dir := t.TempDir()
	if _, err := LoadOrCreateCA(dir, "sb"); err != nil {
		t.Fatal(err)
	}
	os.Chmod(filepath.Join(dir, "ca.key"), 0o644)
	if _, err := LoadOrCreateCA(dir, "sb"); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Errorf("world-readable key: %v", err)
	}
	os.Chmod(filepath.Join(dir, "ca.key"), 0o600)
	os.Remove(filepath.Join(dir, "ca.pem"))
	if _, err := LoadOrCreateCA(dir, "sb"); err == nil || !strings.Contains(err.Error(), "incomplete") {
		t.Errorf("missing certificate: %v", err)
	}
	os.WriteFile(filepath.Join(dir, "ca.pem"), []byte("garbage"), 0o644)
	if _, err := LoadOrCreateCA(dir, "sb"); err == nil {
		t.Error("garbage certificate accepted")
	}
}

func BenchmarkLeaf(b *testing.B) {
	ca, err := LoadOrCreateCA(b.TempDir(), "bench")
	if err != nil {
		b.Fatal(err)
	}
	b.Run("miss", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			// A new name each time: minted (and the cache rotates).
			if _, err := ca.Leaf("h" + string(rune('a'+i%26)) + string(rune('a'+i/26%26)) + string(rune('a'+i/676%26)) + ".miss.test"); err != nil {
				b.Fatal(err)
			}
		}
	})
	ca.Leaf("hit.test")
	b.Run("hit", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			ca.Leaf("hit.test")
		}
	})
	b.Run("hit-parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				ca.Leaf("hit.test")
			}
		})
	})
}
