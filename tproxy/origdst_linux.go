package tproxy

import (
	"fmt"
	"net"
	"net/netip"
	"unsafe"

	"golang.org/x/sys/unix"
)

// OriginalDst returns where a connection DNATed by airlock's rules was
// going before the rule rewrote it to the proxy (SO_ORIGINAL_DST).
func OriginalDst(c *net.TCPConn) (netip.AddrPort, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	var sa unix.RawSockaddrInet4
	var serr error
	err = rc.Control(func(fd uintptr) {
		l := uint32(unsafe.Sizeof(sa))
		_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, fd, unix.SOL_IP, unix.SO_ORIGINAL_DST,
			uintptr(unsafe.Pointer(&sa)), uintptr(unsafe.Pointer(&l)), 0)
		if e != 0 {
			serr = e
		}
	})
	if err == nil {
		err = serr
	}
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("getsockopt(SO_ORIGINAL_DST): %w", err)
	}
	p := (*[2]byte)(unsafe.Pointer(&sa.Port)) // network byte order in memory
	port := uint16(p[0])<<8 | uint16(p[1])
	return netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), port), nil
}
