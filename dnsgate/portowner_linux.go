package dnsgate

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

var (
	syscallEADDRINUSE    = syscall.EADDRINUSE
	syscallEADDRNOTAVAIL = syscall.EADDRNOTAVAIL
)

// portOwner names the process holding a local port ("dnsmasq (pid 812)"),
// or returns "" when it cannot tell. It reads /proc, so it sees processes of
// the current network namespace only.
func portOwner(proto string, port uint16) string {
	inodes := map[string]bool{}
	for _, f := range []string{"/proc/net/" + proto, "/proc/net/" + proto + "6"} {
		file, err := os.Open(f)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(file)
		sc.Scan() // header
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) < 10 {
				continue
			}
			_, hexPort, ok := strings.Cut(fields[1], ":")
			p, err := strconv.ParseUint(hexPort, 16, 16)
			if !ok || err != nil || uint16(p) != port {
				continue
			}
			if proto == "tcp" && fields[3] != "0A" { // LISTEN
				continue
			}
			inodes["socket:["+fields[9]+"]"] = true
		}
		file.Close()
	}
	if len(inodes) == 0 {
		return ""
	}
	fds, _ := filepath.Glob("/proc/[0-9]*/fd/*")
	for _, fd := range fds {
		link, err := os.Readlink(fd)
		if err != nil || !inodes[link] {
			continue
		}
		pid := strings.Split(fd, "/")[2]
		comm, _ := os.ReadFile("/proc/" + pid + "/comm")
		return fmt.Sprintf("%s (pid %s)", strings.TrimSpace(string(comm)), pid)
	}
	return ""
}
