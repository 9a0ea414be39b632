package tproxy

import (
	"fmt"
	"net"
	"net/netip"
)

// LocalDst returns where a connection tproxy handed to a transparent
// listener was going: its local address, which tproxy leaves as the
// member sent it.
func LocalDst(c *net.TCPConn) (netip.AddrPort, error) {
	a, ok := c.LocalAddr().(*net.TCPAddr)
	if !ok {
		return netip.AddrPort{}, fmt.Errorf("local address %v is not TCP", c.LocalAddr())
	}
	ap := a.AddrPort()
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), nil
}
