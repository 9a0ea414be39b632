package tproxy

import (
	"bytes"
	"crypto/rand"
	"io"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/testenv"
)

func TestPipePoolCopy(t *testing.T) {
	for _, tc := range []struct {
		name  string
		sizes []int // bursts the source sends, with a pause between them
	}{
		{name: "nothing"},
		{name: "one byte", sizes: []int{1}},
		{name: "bursts", sizes: []int{100, 70000, 3}},
		{name: "bulk", sizes: []int{8 << 20}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pp := newPipePool(4)
			defer pp.close()
			client, srcEnd := testenv.TCPPair(t) // client writes; the copy reads srcEnd
			dstEnd, reader := testenv.TCPPair(t) // the copy writes dstEnd; reader reads
			var want bytes.Buffer
			bursts := make([][]byte, len(tc.sizes))
			for i, n := range tc.sizes {
				bursts[i] = make([]byte, n)
				rand.Read(bursts[i])
				want.Write(bursts[i])
			}
			go func() {
				for _, b := range bursts {
					client.Write(b)
					// Once the burst is through, the pipe is back in the pool.
					if !testenv.Poll(2*time.Second, func() bool { return len(pp.free) == 1 }) {
						t.Errorf("between bursts %d pipes are idle in the pool, want 1 (the copy holds none)", len(pp.free))
					}
				}
				client.CloseWrite()
			}()
			type result struct {
				n   int64
				err error
			}
			done := make(chan result)
			go func() {
				n, err := pp.copy(dstEnd, srcEnd)
				dstEnd.CloseWrite()
				done <- result{n, err}
			}()
			got, err := io.ReadAll(reader)
			if err != nil {
				t.Fatal(err)
			}
			r := <-done
			if r.err != nil || r.n != int64(want.Len()) {
				t.Errorf("copy = %d, %v; want %d, nil", r.n, r.err, want.Len())
			}
			if !bytes.Equal(got, want.Bytes()) {
				t.Errorf("received %d bytes that differ from the %d sent", len(got), want.Len())
			}
		})
	}
}

func TestPipePoolCopyEndsWhenClosed(t *testing.T) {
	pp := newPipePool(4)
	defer pp.close()
	client, srcEnd := testenv.TCPPair(t)
	dstEnd, reader := testenv.TCPPair(t)
	done := make(chan error)
	go func() {
		_, err := pp.copy(dstEnd, srcEnd)
		done <- err
	}()
	// Once a byte is through, the copy is under way, waiting for the next.
	client.Write([]byte("x"))
	reader.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(reader, make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	srcEnd.Close()
	select {
	case err := <-done:
		if err == nil {
			t.Error("copy from a closed connection ended without an error")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("copy still waiting 5 s after its source was closed")
	}
}
