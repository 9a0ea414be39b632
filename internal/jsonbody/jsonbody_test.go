package jsonbody

import (
	"errors"
	"testing"
)

func TestDecode(t *testing.T) {
	type body struct {
		A string `json:"a"`
	}
	for _, tt := range []struct {
		in      string
		want    string
		trailer bool // refused for what follows the value
		bad     bool
	}{
		{in: `{"a": "x"}`, want: "x"},
		{in: " \r\n\t{\"a\": \"x\"} \r\n\t", want: "x"},
		{in: `{"a": "x"}}`, trailer: true},
		{in: `{"a": "x"}]`, trailer: true},
		{in: `{"a": "x"},`, trailer: true},
		{in: `{"a": "x"} {"a": "y"}`, trailer: true},
		{in: `{"a": "x"}x`, trailer: true},
		{in: "{\"a\": \"x\"}\x00", trailer: true},
		{in: "{\"a\": \"x\"}\u00a0", trailer: true},
		{in: `{"a": "x", "b": 1}`, bad: true},
		{in: `{"a": "x"`, bad: true},
		{in: ``, bad: true},
		{in: `]`, bad: true},
	} {
		var b body
		err := Decode([]byte(tt.in), &b)
		switch {
		case tt.trailer && !errors.Is(err, ErrTrailing):
			t.Errorf("%q: %v, want ErrTrailing", tt.in, err)
		case tt.bad && (err == nil || errors.Is(err, ErrTrailing)):
			t.Errorf("%q: %v, want a JSON error", tt.in, err)
		case !tt.trailer && !tt.bad && (err != nil || b.A != tt.want):
			t.Errorf("%q: %+v %v, want %q", tt.in, b, err, tt.want)
		}
	}
}
