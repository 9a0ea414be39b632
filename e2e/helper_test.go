package e2e

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"
)

// TestMemberHelper is not a test: the e2e tests run the test binary inside a
// sandbox member as a Go client, with the helper's arguments after "--":
//
//	dial ADDR          print "dial ok" or "dial failed: …"
//	listen ADDR SECS   serve "member" over TCP for SECS seconds, printing
//	                   "accepted from …" per connection
func TestMemberHelper(t *testing.T) {
	args := helperArgs()
	if args == nil {
		t.Skip("helper process for the e2e tests; runs only inside a member")
	}
	switch args[0] {
	case "dial":
		c, err := net.DialTimeout("tcp4", args[1], 5*time.Second)
		if err == nil {
			// A refused or reset connection may still complete the
			// handshake with the proxy; a read tells.
			c.SetReadDeadline(time.Now().Add(3 * time.Second))
			fmt.Fprintf(c, "GET / HTTP/1.0\r\n\r\n")
			var b [64]byte
			_, err = c.Read(b[:])
			c.Close()
		}
		if err != nil {
			fmt.Println("dial failed:", err)
		} else {
			fmt.Println("dial ok")
		}
	case "storm":
		// Malformed and random datagrams to each address given.
		r := rand.New(rand.NewPCG(9, 9))
		n := 0
		for _, addr := range args[1:] {
			c, err := net.Dial("udp4", addr)
			if err != nil {
				fmt.Println("dial failed:", err)
				os.Exit(1)
			}
			for i := 0; i < 3000; i++ {
				b := make([]byte, r.IntN(512))
				for j := range b {
					b[j] = byte(r.UintN(256))
				}
				if i%2 == 0 && len(b) > 12 {
					b[2], b[3], b[4], b[5] = 0x01, 0x00, 0x00, 0x01 // looks like a query
				}
				c.Write(b)
				n++
			}
			c.Close()
		}
		fmt.Println("sent", n)
	case "listen":
		secs, _ := strconv.Atoi(args[2])
		ln, err := net.Listen("tcp4", args[1])
		if err != nil {
			fmt.Println("listen failed:", err)
			os.Exit(1)
		}
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				fmt.Println("accepted from", c.RemoteAddr())
				c.Write([]byte("HTTP/1.0 200 OK\r\nContent-Length: 6\r\n\r\nmember"))
				c.Close()
			}
		}()
		time.Sleep(time.Duration(secs) * time.Second)
	}
	os.Exit(0)
}

func helperArgs() []string {
	for i, a := range os.Args {
		if a == "--" && i+1 < len(os.Args) {
			return os.Args[i+1:]
		}
	}
	return nil
}

// sh runs a command and returns its combined output.
func sh(args ...string) (string, error) {
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	return string(out), err
}
