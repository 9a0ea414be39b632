package netns

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// A Lease holds one member address of a sandbox for as long as the member
// lives. It is a file named after the address in the sandbox's lease
// directory, locked with flock(2) by the process that holds it: when that
// process dies, however it dies, the lock goes and the address is free
// again. The file also names the member (its source label), which is how
// airlockd attributes the member's traffic.
type Lease struct {
	Addr netip.Addr
	f    *os.File
}

type leaseInfo struct {
	Source string `json:"source"`
	PID    int    `json:"pid"`
}

// RunRange returns the addresses `airlock run` members take: the lower half
// of the subnet's hosts after the gateway. The upper half is left to Docker.
func (n Network) RunRange() (first, last netip.Addr) {
	size := uint32(1) << (32 - n.Subnet.Bits())
	first = n.Gateway.Next()
	last = addU32(n.Subnet.Addr(), size/2-1)
	return first, last
}

func addU32(a netip.Addr, n uint32) netip.Addr {
	b := a.As4()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3]) + n
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// AcquireLease takes the first free address of the network's run range and
// records source for it in dir (created 0755 when missing).
func AcquireLease(dir string, n Network, source string) (*Lease, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("lease directory: %w", err)
	}
	first, last := n.RunRange()
	for a := first; a.Compare(last) <= 0; a = a.Next() {
		f, err := os.OpenFile(filepath.Join(dir, a.String()), os.O_RDWR|os.O_CREATE, 0o644)
		if err != nil {
			return nil, fmt.Errorf("lease %s: %w", a, err)
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			f.Close()
			if errors.Is(err, unix.EWOULDBLOCK) {
				continue // held by a live member
			}
			return nil, fmt.Errorf("lock lease %s: %w", a, err)
		}
		info, _ := json.Marshal(leaseInfo{Source: source, PID: os.Getpid()})
		if err := f.Truncate(0); err == nil {
			_, err = f.WriteAt(info, 0)
		}
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("write lease %s: %w", a, err)
		}
		return &Lease{Addr: a, f: f}, nil
	}
	return nil, fmt.Errorf("sandbox network %s has no free member address (%s to %s are all in use)", n.Subnet, first, last)
}

// Release frees the address. It is idempotent.
func (l *Lease) Release() {
	if l.f == nil {
		return
	}
	os.Remove(l.f.Name())
	l.f.Close()
	l.f = nil
}

// LeaseSource returns the source label of the live member holding addr in
// dir, or "" when no live member holds it.
func LeaseSource(dir string, addr netip.Addr) string {
	f, err := os.Open(filepath.Join(dir, addr.String()))
	if err != nil {
		return ""
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB); err == nil {
		unix.Flock(int(f.Fd()), unix.LOCK_UN)
		return "" // nobody holds it: a stale file
	}
	var info leaseInfo
	if err := json.NewDecoder(f).Decode(&info); err != nil {
		return ""
	}
	return info.Source
}
