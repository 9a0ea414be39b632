// Command agent is the test agent the sessions end-to-end tests run FROM
// scratch. It carries out a tiny task language, one step per line or ';':
//
//	write PATH TEXT   write TEXT to /workspace/PATH
//	read PATH         print /workspace/PATH
//	fetch URL         GET URL and print its status and body, or the error
//	sleep SECONDS     wait
//	big PATH BYTES    write BYTES zero bytes to /workspace/PATH
//	link TARGET NAME  make /workspace/NAME a symbolic link to TARGET
//	fail              exit 1 at the end
//
// It first checks that the task arrived the three ways airlock hands it
// over (its argument, AIRLOCK_TASK and standard input) and says so.
package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

func main() {
	task := strings.Join(os.Args[1:], " ")
	stdin, _ := io.ReadAll(os.Stdin)
	if task == os.Getenv("AIRLOCK_TASK") && task == string(stdin) {
		fmt.Println("task arrived 3 ways")
	} else {
		fmt.Printf("task differs: arg %q env %q stdin %q\n", task, os.Getenv("AIRLOCK_TASK"), stdin)
	}
	code := 0
	for _, step := range strings.FieldsFunc(task, func(r rune) bool { return r == ';' || r == '\n' }) {
		verb, rest, _ := strings.Cut(strings.TrimSpace(step), " ")
		switch verb {
		case "write":
			p, text, _ := strings.Cut(rest, " ")
			full := filepath.Join("/workspace", p)
			os.MkdirAll(filepath.Dir(full), 0o755)
			if err := os.WriteFile(full, []byte(text), 0o644); err != nil {
				fmt.Println("write:", err)
				code = 1
			}
		case "read":
			b, err := os.ReadFile(filepath.Join("/workspace", rest))
			if err != nil {
				fmt.Println("read:", err)
				code = 1
			}
			fmt.Printf("read %s: %s\n", rest, b)
		case "fetch":
			c := &http.Client{Timeout: 60 * time.Second}
			resp, err := c.Get(rest)
			if err != nil {
				fmt.Printf("fetch %s: error %v\n", rest, err)
				code = 1
				continue
			}
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			resp.Body.Close()
			fmt.Printf("fetch %s: status %d %s\n", rest, resp.StatusCode, b)
		case "big":
			p, n, _ := strings.Cut(rest, " ")
			size, _ := strconv.Atoi(n)
			os.WriteFile(filepath.Join("/workspace", p), make([]byte, size), 0o644)
		case "lines":
			n, _ := strconv.Atoi(rest)
			line := strings.Repeat("x", 300)
			for range n {
				fmt.Println(line)
			}
			fmt.Println("the last line")
		case "link":
			target, name, _ := strings.Cut(rest, " ")
			os.Symlink(target, filepath.Join("/workspace", name))
		case "sleep":
			n, _ := strconv.Atoi(rest)
			time.Sleep(time.Duration(n) * time.Second)
		case "fail":
			code = 1
		}
	}
	os.Exit(code)
}
