package audit

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

func TestJournalSurvivesReopenAndReadsPastMemory(t *testing.T) {
	dir := t.TempDir()
	j, err := Open(Config{Dir: dir, Memory: 5})
	if err != nil {
		t.Fatal(err)
	}
	base := time.Unix(1000, 0)
	for i := 0; i < 20; i++ {
		j.Add(Entry{Time: base.Add(time.Duration(i) * time.Second), Kind: KindConnection, Sandbox: "sb", Host: "h" + strconv.Itoa(i), Verdict: []string{"allow", "deny"}[i%2]})
	}
	got := j.Query(Filter{Limit: 100})
	if len(got) != 20 || got[0].Seq != 1 || got[19].Seq != 20 || got[0].Host != "h0" {
		t.Fatalf("query past a 5-entry memory: %d entries, first %+v", len(got), got[0])
	}
	// A crash: no Close. Reopening continues numbering and keeps history.
	j.Flush()
	j2, err := Open(Config{Dir: dir, Memory: 5})
	if err != nil {
		t.Fatal(err)
	}
	e := j2.Add(Entry{Kind: KindRule, Sandbox: "sb", Action: "added"})
	if e.Seq != 21 {
		t.Errorf("seq after reopen = %d, want 21", e.Seq)
	}
	if got := j2.Query(Filter{Verdict: "deny", Limit: 3}); len(got) != 3 || got[2].Host != "h19" || got[0].Host != "h15" {
		t.Errorf("last 3 denies = %+v", got)
	}
	if got := j2.Query(Filter{Since: base.Add(17 * time.Second), Kinds: []string{KindConnection}}); len(got) != 3 || got[0].Host != "h17" {
		t.Errorf("since filter = %+v", got)
	}
	j2.Close()
	j2.Close()
}

func TestJournalRotatesAndPrunes(t *testing.T) {
	dir := t.TempDir()
	j, _ := Open(Config{Dir: dir, Memory: 10, MaxFileBytes: 2000, MaxFiles: 2})
	for i := 0; i < 200; i++ {
		j.Add(Entry{Kind: KindDNS, Sandbox: "sb", Host: "padding-padding-padding-" + strconv.Itoa(i)})
	}
	j.Close()
	files, _ := filepath.Glob(filepath.Join(dir, "*.jsonl"))
	if len(files) != 3 { // current + 2 rotated
		t.Errorf("files = %v, want current and 2 rotated", files)
	}
	j2, _ := Open(Config{Dir: dir, Memory: 10})
	got := j2.Query(Filter{Limit: 1000})
	if len(got) == 0 || got[len(got)-1].Seq != 200 || len(got) >= 200 {
		t.Errorf("after pruning: %d entries, last seq %d; want the newest, not all", len(got), got[len(got)-1].Seq)
	}
}

func TestJournalSkipsTornLines(t *testing.T) {
	dir := t.TempDir()
	j, _ := Open(Config{Dir: dir})
	j.Add(Entry{Kind: KindDNS, Sandbox: "sb", Host: "a"})
	j.Close()
	f, _ := os.OpenFile(filepath.Join(dir, currentFile), os.O_APPEND|os.O_WRONLY, 0)
	f.WriteString(`{"seq":2,"kind":"dns","host":"tor`) // crash mid-line
	f.Close()
	j2, err := Open(Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if got := j2.Query(Filter{}); len(got) != 1 || got[0].Host != "a" {
		t.Errorf("entries = %+v", got)
	}
}

func TestJournalSubscribe(t *testing.T) {
	j, _ := Open(Config{Dir: t.TempDir()})
	s := j.Subscribe(4)
	defer s.Close()
	j.Add(Entry{Kind: KindApproval, Action: "opened"})
	select {
	case e := <-s.C():
		if e.Action != "opened" || e.Seq != 1 {
			t.Errorf("got %+v", e)
		}
	case <-time.After(time.Second):
		t.Fatal("no entry")
	}
}
