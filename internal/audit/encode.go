package audit

import (
	"math"
	"slices"
	"strconv"
	"time"
	"unicode/utf8"
)

// appendEntry appends e as encoding/json marshals it (field names, order
// and omitempty as Entry's tags say, strings escaped as json.Marshal
// escapes them), without reflection or allocation. Tests hold it to
// json.Marshal's bytes, field by field (TestEncodeEveryField) and for
// random values (FuzzEncodeEntry): a field added to Entry must be added
// here, in its place. Two values JSON cannot hold, where json.Marshal
// fails (and the journal used to write an empty line instead of the
// record), are written as their zero: a time outside years 0 to 9999 or
// with a zone offset of 24 hours or more, and a duration that is not a
// finite number.
func appendEntry(b []byte, e *Entry) []byte {
	b = append(b, `{"seq":`...)
	b = strconv.AppendUint(b, e.Seq, 10)
	b = append(b, `,"time":"`...)
	if t, err := e.Time.AppendText(b); err == nil {
		b = t
	} else {
		b, _ = time.Time{}.AppendText(b)
	}
	b = append(b, `","kind":`...)
	b = appendString(b, e.Kind)
	b = append(b, `,"sandbox":`...)
	b = appendString(b, e.Sandbox)
	b = appendStringField(b, `,"source":`, e.Source)
	b = appendStringField(b, `,"agent":`, e.Agent)

	b = appendStringField(b, `,"method":`, e.Method)
	b = appendStringField(b, `,"url":`, e.URL)
	b = appendStringField(b, `,"host":`, e.Host)
	b = appendUintField(b, `,"port":`, uint64(e.Port))
	b = appendStringField(b, `,"dns_type":`, e.DNSType)

	b = appendStringField(b, `,"verdict":`, e.Verdict)
	b = appendStringField(b, `,"rule":`, e.Rule)
	b = appendStringField(b, `,"reason":`, e.Reason)

	b = appendIntField(b, `,"status":`, int64(e.Status))
	b = appendIntField(b, `,"bytes_up":`, e.BytesUp)
	b = appendIntField(b, `,"bytes_down":`, e.BytesDown)
	b = appendFloatField(b, `,"ttfb_ms":`, e.TTFBMs)
	b = appendFloatField(b, `,"duration_ms":`, e.DurationMs)
	b = appendStringField(b, `,"proto":`, e.Proto)
	if len(e.Headers) > 0 {
		b = append(b, `,"headers":`...)
		b = appendHeaders(b, e.Headers)
	}
	if e.LLM {
		b = append(b, `,"llm":true`...)
	}
	b = appendStringField(b, `,"dest":`, e.Dest)
	b = appendStringField(b, `,"upstream":`, e.Upstream)
	b = appendStringField(b, `,"close":`, e.Close)
	b = appendUintField(b, `,"conn_id":`, e.ConnID)

	b = appendStringField(b, `,"approval_id":`, e.ApprovalID)
	b = appendStringField(b, `,"action":`, e.Action)
	b = appendStringField(b, `,"approval_kind":`, e.ApprovalKind)
	b = appendStringField(b, `,"request":`, e.Request)
	b = appendStringField(b, `,"rule_id":`, e.RuleID)
	b = appendStringField(b, `,"list":`, e.List)
	b = appendStringField(b, `,"exposure_id":`, e.ExposureID)
	return append(b, '}')
}

// The append*Field functions write an omitempty field: nothing when v is
// its type's zero.

func appendStringField(b []byte, name, v string) []byte {
	if v == "" {
		return b
	}
	return appendString(append(b, name...), v)
}

func appendUintField(b []byte, name string, v uint64) []byte {
	if v == 0 {
		return b
	}
	return strconv.AppendUint(append(b, name...), v, 10)
}

func appendIntField(b []byte, name string, v int64) []byte {
	if v == 0 {
		return b
	}
	return strconv.AppendInt(append(b, name...), v, 10)
}

// appendFloatField writes v as encoding/json writes a float64: the
// shortest decimal that reads back as v, in exponent form below 1e-6 and
// from 1e21, with the exponent's leading zero dropped (1e-07 → 1e-7).
func appendFloatField(b []byte, name string, v float64) []byte {
	if v == 0 || math.IsNaN(v) || math.IsInf(v, 0) {
		return b
	}
	b = append(b, name...)
	format := byte('f')
	if abs := math.Abs(v); abs < 1e-6 || abs >= 1e21 {
		format = 'e'
	}
	b = strconv.AppendFloat(b, v, format, -1, 64)
	if format == 'e' {
		if n := len(b); n >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
			b[n-2] = b[n-1]
			b = b[:n-1]
		}
	}
	return b
}

// appendHeaders writes h as encoding/json writes a map[string][]string:
// keys sorted, a nil value as null. Header maps are small: sorting their
// keys in a small array on the stack keeps it free of allocation.
func appendHeaders(b []byte, h map[string][]string) []byte {
	var small [16]string
	keys := small[:0]
	for k := range h {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	b = append(b, '{')
	for i, k := range keys {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendString(b, k)
		b = append(b, ':')
		vv := h[k]
		if vv == nil {
			b = append(b, "null"...)
			continue
		}
		b = append(b, '[')
		for i, v := range vv {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendString(b, v)
		}
		b = append(b, ']')
	}
	return append(b, '}')
}

const hexDigits = "0123456789abcdef"

// plain holds the ASCII bytes a JSON string carries as they are.
var plain = func() (t [utf8.RuneSelf]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\' && c != '<' && c != '>' && c != '&'
	}
	return t
}()

// appendString writes s as a JSON string the way encoding/json does by
// default: '"' and '\\' escaped, \b \f \n \r \t by name and the other
// control characters as \u00XX, '<', '>' and '&' as \u003c, \u003e and
// \u0026 (HTML-safe), U+2028 and U+2029 as \u2028 and \u2029, and each
// byte that is not part of valid UTF-8 as \ufffd.
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			if plain[c] {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
