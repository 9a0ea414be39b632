// Package jsonbody reads the JSON bodies of airlock's APIs strictly: one
// value, the fields its type has and no others, and nothing after it but
// white space. encoding/json's Decoder alone stops at the end of the first
// value, and its More reports no further value when the next byte is a
// stray '}' or ']'.
package jsonbody

import (
	"bytes"
	"encoding/json"
	"errors"
)

// ErrTrailing is Decode's error for bytes after the value.
var ErrTrailing = errors.New("data after the JSON value")

// Decode reads data, which must hold exactly one JSON value with only white
// space around it, into v, refusing object fields v does not have.
func Decode(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if len(bytes.TrimLeft(data[dec.InputOffset():], " \t\r\n")) > 0 {
		return ErrTrailing
	}
	return nil
}
