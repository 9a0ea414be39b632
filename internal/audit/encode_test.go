package audit

import (
	"bytes"
	"encoding/json"
	"math"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"
)

// wantJSON is what the journal wrote before it had an encoder of its own:
// json.Marshal's bytes. A value json.Marshal refuses is written as its
// zero (see appendEntry).
func wantJSON(t testing.TB, e Entry) []byte {
	t.Helper()
	if _, err := e.Time.MarshalJSON(); err != nil {
		e.Time = time.Time{}
	}
	for _, f := range []*float64{&e.TTFBMs, &e.DurationMs} {
		if math.IsNaN(*f) || math.IsInf(*f, 0) {
			*f = 0
		}
	}
	b, err := json.Marshal(e)
	if err != nil {
		t.Fatalf("json.Marshal(%+v): %v", e, err)
	}
	return b
}

func checkEncode(t testing.TB, e Entry) {
	t.Helper()
	got, want := appendEntry(nil, &e), wantJSON(t, e)
	if !bytes.Equal(got, want) {
		t.Fatalf("appendEntry(%#v)\n got %s\nwant %s", e, got, want)
	}
}

// awkward are strings every escape of encoding/json's shows in.
var awkward = []string{
	"", "plain", `quote " backslash \ slash /`, "<script>&amp;</script>", "\b\f\n\r\t", "\x00\x01\x1f\x7f",
	"caf\u00e9 \u65e5\u672c \U0001F600", "line\u2028para\u2029end", "bad \xff utf-8 \xc3", "\xe2\x80", "\xed\xa0\x80 surrogate",
	"\ufffd real replacement", "\xf4\x90\x80\x80 past U+10FFFF", "\xc0\x80 overlong NUL",
}

func TestEncodeMatchesJSON(t *testing.T) {
	base := benchEntry()
	checkEncode(t, base)
	checkEncode(t, Entry{})
	for _, s := range awkward {
		e := base
		e.Source, e.URL, e.Reason = s, "https://a.test/"+s, s
		e.Headers = map[string][]string{s: {s, ""}, "X-Nil": nil, "X-Empty": {}}
		checkEncode(t, e)
	}
	for _, f := range []float64{1, -1, 0.1, 1e-6, 9.99e-7, 1e-7, 1.5e-300, 1e20, 1e21, 123456789.125, -2.5e-10, math.SmallestNonzeroFloat64, math.MaxFloat64, math.Copysign(0, -1)} {
		e := base
		e.TTFBMs, e.DurationMs = f, -f
		checkEncode(t, e)
	}
	for _, tm := range []time.Time{
		time.Unix(0, 0), time.Unix(1, 1).In(time.FixedZone("", -7*3600-30*60)), time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC),
		time.Now(), time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Unix(0, 0).In(time.FixedZone("", 24*3600)), time.Unix(0, 0).In(time.FixedZone("", 59)),
	} {
		e := base
		e.Time = tm
		checkEncode(t, e)
	}
	// Random entries: every field at random, or left empty.
	rng := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		checkEncode(t, randomEntry(rng))
	}
}

func randomEntry(rng *rand.Rand) Entry {
	str := func() string {
		if rng.IntN(3) == 0 {
			return ""
		}
		if rng.IntN(2) == 0 {
			return awkward[rng.IntN(len(awkward))]
		}
		b := make([]byte, rng.IntN(24))
		for i := range b {
			b[i] = byte(rng.IntN(256))
		}
		return string(b)
	}
	var e Entry
	v := reflect.ValueOf(&e).Elem()
	for i := range v.NumField() {
		if rng.IntN(3) == 0 {
			continue
		}
		f := v.Field(i)
		switch f.Interface().(type) {
		case string:
			f.SetString(str())
		case time.Time:
			f.Set(reflect.ValueOf(time.Unix(rng.Int64N(1<<40)-1<<39, rng.Int64N(1e9)).In(time.FixedZone("", rng.IntN(48*3600)-24*3600))))
		case float64:
			f.SetFloat(math.Float64frombits(rng.Uint64()))
		case bool:
			f.SetBool(true)
		case map[string][]string:
			h := map[string][]string{}
			for range rng.IntN(20) {
				var vv []string
				for range rng.IntN(3) {
					vv = append(vv, str())
				}
				h[str()] = vv
			}
			f.Set(reflect.ValueOf(h))
		default:
			switch f.Kind() {
			case reflect.Int, reflect.Int64:
				f.SetInt(rng.Int64() >> rng.IntN(64))
			case reflect.Uint16, reflect.Uint64:
				f.SetUint(rng.Uint64() >> rng.IntN(64))
			default:
				panic("randomEntry: no random value for " + v.Type().Field(i).Name)
			}
		}
	}
	return e
}

// TestEncodeEveryField sets each of Entry's fields, found by reflection,
// alone and all together: a field the encoder does not write, or writes
// under another name or in another place, makes its bytes differ from
// json.Marshal's.
func TestEncodeEveryField(t *testing.T) {
	set := func(e *Entry, i int) {
		f := reflect.ValueOf(e).Elem().Field(i)
		switch f.Interface().(type) {
		case string:
			f.SetString("<" + reflect.TypeFor[Entry]().Field(i).Name + ">")
		case time.Time:
			f.Set(reflect.ValueOf(time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)))
		case float64:
			f.SetFloat(float64(i) + 0.5)
		case bool:
			f.SetBool(true)
		case map[string][]string:
			f.Set(reflect.ValueOf(map[string][]string{"b": {"1", "2"}, "a": nil}))
		default:
			switch f.Kind() {
			case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
				f.SetInt(int64(i + 1))
			case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
				f.SetUint(uint64(i + 1))
			default:
				t.Fatalf("Entry.%s: a %s, which this test (and appendEntry) do not know: add it to both", reflect.TypeFor[Entry]().Field(i).Name, f.Type())
			}
		}
	}
	var all Entry
	for i := range reflect.TypeFor[Entry]().NumField() {
		var e Entry
		set(&e, i)
		set(&all, i)
		got, want := appendEntry(nil, &e), wantJSON(t, e)
		if !bytes.Equal(got, want) {
			t.Errorf("Entry.%s alone:\n got %s\nwant %s", reflect.TypeFor[Entry]().Field(i).Name, got, want)
		}
	}
	got, want := appendEntry(nil, &all), wantJSON(t, all)
	if !bytes.Equal(got, want) {
		t.Errorf("every field set:\n got %s\nwant %s", got, want)
	}
	// Each field shows in the record: none is written with a zero value.
	for i := range reflect.TypeFor[Entry]().NumField() {
		name, _, _ := strings.Cut(reflect.TypeFor[Entry]().Field(i).Tag.Get("json"), ",")
		if !bytes.Contains(got, []byte(`"`+name+`":`)) {
			t.Errorf("every field set: no %q in %s", name, got)
		}
	}
}

// TestEncodeAllocatesNothing: a record is encoded into the journal's
// buffer without allocating (a header map of up to 16 names).
func TestEncodeAllocatesNothing(t *testing.T) {
	e := benchEntry()
	buf := make([]byte, 0, 4096)
	if n := testing.AllocsPerRun(100, func() { appendEntry(buf[:0], &e) }); n != 0 {
		t.Errorf("appendEntry allocates %v times per record, want 0", n)
	}
}

// FuzzEncodeEntry: whatever the strings and numbers, the encoder writes
// the bytes json.Marshal writes.
func FuzzEncodeEntry(f *testing.F) {
	for i, s := range awkward {
		f.Add(s, "GET", awkward[(i+1)%len(awkward)], int64(i), uint64(i)<<40, float64(i)/7, 1e21*float64(i), i%2 == 0, int64(1764025363)+int64(i), int64(i)*1e8, int32(i*3600))
	}
	f.Fuzz(func(t *testing.T, a, b, c string, n int64, u uint64, f1, f2 float64, llm bool, sec, nsec int64, off int32) {
		strs := []string{a, b, c}
		e := Entry{
			Seq: u, Time: time.Unix(sec, nsec).In(time.FixedZone(c, int(off))), Port: uint16(u), Status: int(n),
			BytesUp: n, BytesDown: -n, TTFBMs: f1, DurationMs: f2, LLM: llm, ConnID: u >> 3,
			Headers: map[string][]string{a: {b, c}, b: nil, c: {}},
		}
		if a == "" {
			e.Headers = nil
		}
		v := reflect.ValueOf(&e).Elem()
		for i := range v.NumField() {
			if f := v.Field(i); f.Kind() == reflect.String {
				f.SetString(strs[i%3])
			}
		}
		checkEncode(t, e)
	})
}
