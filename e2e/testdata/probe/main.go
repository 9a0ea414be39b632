// Command probe is the program inside the Docker e2e tests' test image
// (FROM scratch): what a sandboxed container would do, reported on stdout.
//
//	get URL            GET URL; prints "status N body" or "error: …", exits 1 on
//	                   error (after $PROBE_TIMEOUT seconds, default 20)
//	resolve NAME       prints the addresses of NAME or "error: …"
//	status             prints CapEff, uid, whether / is writable and how
//	                   many processes it could start before the pids limit
//	sleep SECS         sleeps
//	serve ADDR [URL]   serves "sidecar" over HTTP on ADDR; with URL, GETs it
//	                   every second as well
//	loop URL           GETs URL every second, forever
//	post URL JSON      POSTs JSON to URL (the member API); prints "status N
//	                   body", waiting up to $PROBE_TIMEOUT seconds (default 20)
//	workspace          writes /workspace/dist (see writeWorkspace), prints
//	                   "ready", then "tick N" on stdout every 100 ms and,
//	                   every tenth, "warn N" and a terminal escape on stderr
package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Println("usage: probe get|resolve|status|sleep|serve|loop|post ...")
		os.Exit(2)
	}
	arg := func(i int) string {
		if len(os.Args) > i {
			return os.Args[i]
		}
		return ""
	}
	switch os.Args[1] {
	case "get":
		if err := get(arg(2)); err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
	case "resolve":
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		addrs, err := net.DefaultResolver.LookupHost(ctx, arg(2))
		if err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		fmt.Println("addrs", strings.Join(addrs, " "))
	case "status":
		status()
	case "sleep":
		n, _ := strconv.Atoi(arg(2))
		time.Sleep(time.Duration(n) * time.Second)
	case "serve":
		if u := arg(3); u != "" {
			go loop(u)
		}
		http.ListenAndServe(arg(2), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprint(w, "sidecar")
		}))
	case "loop":
		loop(arg(2))
	case "post":
		if err := post(arg(2), arg(3)); err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
	case "workspace":
		if err := writeWorkspace(); err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		// A line of stdout longer than the pieces the logs come in (Docker's
		// 16 KiB, airlockd's 16 KiB), with a line of stderr in the middle
		// of it: whoever shows the logs must put each stream's pieces
		// together on their own.
		os.Stdout.WriteString(strings.Repeat("L", 40000))
		time.Sleep(300 * time.Millisecond)
		fmt.Fprintf(os.Stderr, "warn 0 \x1b[31mred\n")
		time.Sleep(300 * time.Millisecond)
		os.Stdout.WriteString("\n")
		fmt.Println("ready")
		for i := 1; ; i++ {
			fmt.Printf("tick %d\n", i)
			if i%10 == 0 {
				fmt.Fprintf(os.Stderr, "warn %d \x1b[31mred\n", i)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

// writeWorkspace builds what an agent leaves in its workspace, as the e2e
// test expects it: /workspace/dist with a file, an executable, a
// subdirectory with a 3000-byte file and an empty one, and a link to the
// file; /workspace/x; /workspace/out, a link to /etc; and /workspace/trap
// holding a link to /etc.
func writeWorkspace() error {
	data := make([]byte, 3000)
	for i := range data {
		data[i] = byte(i % 251)
	}
	for _, d := range []string{"/workspace/dist/sub", "/workspace/trap"} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	for name, f := range map[string]struct {
		data []byte
		mode os.FileMode
	}{
		"/workspace/dist/app.txt":      {[]byte("artifact 1\n"), 0o644},
		"/workspace/dist/run.sh":       {[]byte("#!/bin/sh\necho built\n"), 0o755},
		"/workspace/dist/sub/data.bin": {data, 0o600},
		"/workspace/dist/sub/empty":    {nil, 0o644},
		"/workspace/x":                 {[]byte("x"), 0o644},
	} {
		if err := os.WriteFile(name, f.data, f.mode); err != nil {
			return err
		}
		if err := os.Chmod(name, f.mode); err != nil {
			return err
		}
	}
	for link, target := range map[string]string{"/workspace/dist/latest": "app.txt", "/workspace/out": "/etc", "/workspace/trap/etc": "/etc"} {
		if err := os.Symlink(target, link); err != nil {
			return err
		}
	}
	return nil
}

func get(url string) error {
	timeout := 20 * time.Second
	if s, err := strconv.Atoi(os.Getenv("PROBE_TIMEOUT")); err == nil {
		timeout = time.Duration(s) * time.Second
	}
	c := &http.Client{Timeout: timeout}
	resp, err := c.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 200))
	fmt.Printf("status %d %s\n", resp.StatusCode, strings.TrimSpace(string(b)))
	return nil
}

func post(url, body string) error {
	timeout := 20 * time.Second
	if s, err := strconv.Atoi(os.Getenv("PROBE_TIMEOUT")); err == nil {
		timeout = time.Duration(s) * time.Second
	}
	c := &http.Client{Timeout: timeout}
	resp, err := c.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1000))
	fmt.Printf("status %d %s\n", resp.StatusCode, strings.TrimSpace(string(b)))
	return nil
}

func loop(url string) {
	for {
		if err := get(url); err != nil {
			fmt.Println("error:", err)
		}
		time.Sleep(time.Second)
	}
}

func status() {
	f, err := os.Open("/proc/self/status")
	if err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "CapEff:") || strings.HasPrefix(sc.Text(), "NoNewPrivs:") {
				fmt.Println(strings.Join(strings.Fields(sc.Text()), " "))
			}
		}
		f.Close()
	}
	fmt.Println("uid", os.Getuid())
	if err := os.WriteFile("/probe-was-here", []byte("x"), 0o644); err != nil {
		fmt.Println("rootfs write:", errors.Unwrap(err))
	} else {
		fmt.Println("rootfs write: ok")
	}
	if err := os.WriteFile("/tmp/probe-was-here", []byte("x"), 0o644); err != nil {
		fmt.Println("tmp write:", err)
	} else {
		fmt.Println("tmp write: ok")
	}
	// A fork bomb: start sleepers until the kernel refuses.
	var kids []*exec.Cmd
	var ferr error
	for len(kids) < 2000 {
		c := exec.Command("/probe", "sleep", "30")
		if ferr = c.Start(); ferr != nil {
			break
		}
		kids = append(kids, c)
	}
	if errors.Is(ferr, syscall.EAGAIN) {
		fmt.Printf("forks %d then EAGAIN\n", len(kids))
	} else {
		fmt.Printf("forks %d then %v\n", len(kids), ferr)
	}
	for _, c := range kids {
		c.Process.Kill()
		c.Wait()
	}
}
