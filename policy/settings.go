package policy

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// ErrDuplicateRule is wrapped by ReplaceRule's error when the new pattern
// is one the list already holds.
var ErrDuplicateRule = errors.New("the list already holds this pattern")

// Settings are the scalar settings of a sandbox that can be changed while
// it runs. A nil field is left as it is.
type Settings struct {
	UnknownAction *Action
	// ApprovalTimeout is a whole number of seconds from 1 s to
	// MaxApprovalTimeout.
	ApprovalTimeout *time.Duration
	// LearnUntil ends learn mode; Sandbox.SetSettings fills it in
	// (DefaultLearnFor from now) when UnknownAction turns learn on
	// without it.
	LearnUntil *time.Time
	// Presets replaces the list of presets (see CheckPresets); an empty
	// list turns them all off.
	Presets *[]string
}

// Validate returns an error that says what is wrong with s, and what is
// allowed.
func (s Settings) Validate() error {
	if s.UnknownAction != nil {
		if a := *s.UnknownAction; a != ActionAsk && a != ActionDeny && a != ActionAllow && a != ActionLearn {
			return fmt.Errorf("unknown_action %v: want ask, deny, learn or allow", a)
		}
	}
	if s.ApprovalTimeout != nil {
		d := *s.ApprovalTimeout
		if d < time.Second || d > MaxApprovalTimeout || d%time.Second != 0 {
			return fmt.Errorf("approval_timeout %v: want a whole number of seconds from 1 to %d", d, int(MaxApprovalTimeout/time.Second))
		}
	}
	if s.LearnUntil != nil && s.LearnUntil.IsZero() {
		return errors.New("learn_until: want a time, such as 2025-01-15T10:30:00Z")
	}
	if s.Presets != nil {
		if _, err := CheckPresets(*s.Presets); err != nil {
			return fmt.Errorf("presets: %w", err)
		}
	}
	return nil
}

// scalars returns the keys of sandbox: that s sets and their values as
// the file writes them.
func (s Settings) scalars() [][2]string {
	var out [][2]string
	if s.UnknownAction != nil {
		out = append(out, [2]string{"unknown_action", s.UnknownAction.String()})
	}
	if s.ApprovalTimeout != nil {
		out = append(out, [2]string{"approval_timeout", strconv.Itoa(int(*s.ApprovalTimeout / time.Second))})
	}
	if s.LearnUntil != nil {
		out = append(out, [2]string{"learn_until", `"` + s.LearnUntil.UTC().Truncate(time.Second).Format(time.RFC3339) + `"`})
	}
	if s.Presets != nil {
		names, _ := CheckPresets(*s.Presets)
		out = append(out, [2]string{"presets", "[" + strings.Join(names, ", ") + "]"})
	}
	return out
}

func (s Settings) applyTo(spec *Spec) {
	if s.UnknownAction != nil {
		spec.UnknownAction = *s.UnknownAction
	}
	if s.ApprovalTimeout != nil {
		spec.ApprovalTimeout = *s.ApprovalTimeout
	}
	if s.LearnUntil != nil {
		spec.LearnUntil = s.LearnUntil.UTC().Truncate(time.Second)
	}
	if s.Presets != nil {
		spec.Presets, _ = CheckPresets(*s.Presets)
		spec.Preset = PresetRules(spec.Presets)
	}
}

// SetSettings writes the settings s sets into the sandbox section of the
// policy file at path: a key that is there gets its value replaced in
// place (its comment stays), a key that is not is inserted as the
// section's first line, and a missing section or file is created. Nothing
// else in the file changes. Locking and writing are as for AddRule; on any
// error the file is left as it was.
func SetSettings(path string, s Settings) error {
	return setSettings(path, s, writeHooks{})
}

func setSettings(path string, s Settings, hooks writeHooks) error {
	err := s.Validate()
	if err == nil {
		err = editFile(path, hooks, func(t *policyText, root *yaml.Node, old *Spec) ([]byte, error) {
			want := *old
			s.applyTo(&want)
			cur, curRoot := t, root
			for _, kv := range s.scalars() {
				out, err := cur.setScalar(curRoot, kv[0], kv[1])
				if err != nil {
					return nil, err
				}
				cur = newText(out)
				if curRoot, err = parseYAML(path, out); err != nil {
					return nil, fmt.Errorf("the edited file would not load, so it was left unchanged: %w", err)
				}
			}
			if string(cur.data) == string(t.data) {
				return nil, nil
			}
			return cur.data, checkEdit(path, root, cur.data, &want)
		})
	}
	if err != nil {
		return fmt.Errorf("set settings in %s: %w", path, err)
	}
	return nil
}

// setScalar returns the file with sandbox.key set to value (written as
// is: a plain YAML scalar).
func (t *policyText) setScalar(root *yaml.Node, key, value string) ([]byte, error) {
	unit := indentUnit(root)
	line := func(col int) string { return strings.Repeat(" ", col) + key + ": " + value }
	if root == nil {
		return t.apply(t.insertAfter(t.lines()-1, []string{"sandbox:", line(unit)})), nil
	}
	if root.Style&yaml.FlowStyle != 0 {
		return nil, flowError(nil)
	}
	kn, v := mappingValue(root, "sandbox")
	switch {
	case kn == nil:
		col := root.Column - 1
		return t.apply(t.insertAfter(t.blockEnd(root.Line-1, col), []string{strings.Repeat(" ", col) + "sandbox:", line(col + unit)})), nil
	case isNull(v) || v.Kind == yaml.MappingNode && len(v.Content) == 0:
		cut, after, err := t.cutValue(v, kn)
		if err != nil {
			return nil, err
		}
		return t.apply(cut, t.insertAfter(after, []string{line(kn.Column - 1 + unit)})), nil
	case v.Kind != yaml.MappingNode:
		return nil, fmt.Errorf("sandbox is %s, not a mapping", describeNode(v))
	case v.Style&yaml.FlowStyle != 0:
		return nil, flowError([]string{"sandbox"})
	}
	sk, sv := mappingValue(v, key)
	if sk == nil {
		// Settings go first in the section, where a reader looks for them.
		return t.apply(t.insertAfter(kn.Line-1, []string{line(v.Column - 1)})), nil
	}
	switch {
	case isNull(sv) && sv.Value == "":
		// "key:" with nothing after it: the value goes after the colon.
		at := t.offset(sk.Line, sk.Column) + len(key)
		if at >= len(t.data) || t.data[at] != ':' {
			return nil, fmt.Errorf("sandbox.%s: write the key as a plain word so airlock can edit it", key)
		}
		at++
		return t.apply(splice{at: at, end: at, text: " " + value}), nil
	case sv.Kind == yaml.SequenceNode && sv.Style&yaml.FlowStyle != 0:
		cut, _, err := t.cutValue(sv, sk)
		if err != nil {
			return nil, fmt.Errorf("sandbox.%s: %w", key, err)
		}
		cut.text = " " + value
		return t.apply(cut), nil
	case sv.Kind == yaml.SequenceNode:
		return nil, fmt.Errorf("sandbox.%s is a list written over several lines; write it on one line as %s: [a, b] so airlock can edit it", key, key)
	}
	at, end, err := t.scalarSpan(sv)
	if err != nil {
		return nil, fmt.Errorf("sandbox.%s: %w", key, err)
	}
	return t.apply(splice{at: at, end: end, text: value}), nil
}

// scalarSpan returns where the one-line scalar n stands in the text:
// plain, 'single' or "double" quoted. Other forms are refused.
func (t *policyText) scalarSpan(n *yaml.Node) (at, end int, err error) {
	refuse := errors.New("the value is not written on one line as a plain or quoted word; write it as key: value so airlock can edit it")
	if n.Kind != yaml.ScalarNode || n.Line < 1 || n.Line > t.lines() {
		return 0, 0, refuse
	}
	at = t.offset(n.Line, n.Column)
	lineEnd := t.start[n.Line-1] + len(t.line(n.Line-1))
	rest := string(t.data[at:lineEnd])
	switch n.Style {
	case 0, yaml.TaggedStyle:
		if n.Style == yaml.TaggedStyle || !strings.HasPrefix(rest, n.Value) || n.Value == "" {
			return 0, 0, refuse
		}
		return at, at + len(n.Value), nil
	case yaml.DoubleQuotedStyle, yaml.SingleQuotedStyle:
		q := rest[:1]
		if len(rest) < 2 || (q != `"` && q != "'") {
			return 0, 0, refuse
		}
		// Settings values hold no quotes or escapes; anything else is
		// refused rather than half understood.
		close := strings.Index(rest[1:], q)
		if close < 0 || rest[1:1+close] != n.Value || strings.ContainsAny(n.Value, `\'"`) {
			return 0, 0, refuse
		}
		return at, at + close + 2, nil
	}
	return 0, 0, refuse
}

// ReplaceRule replaces the user rule with this ID in list l of the policy
// file at path by r, in the same place in the list, and returns the rule
// it replaced. r must be a user rule of list l (see AddRule). The error
// wraps ErrNoRule, ErrAutoRule (as for RemoveRule) or ErrDuplicateRule
// when the list already holds r. Locking and writing are as for AddRule; on
// any error the file is left as it was.
func ReplaceRule(path string, l List, id string, r *Rule) (replaced *Rule, err error) {
	return replaceRule(path, l, id, r, writeHooks{})
}

func replaceRule(path string, l List, id string, r *Rule, hooks writeHooks) (*Rule, error) {
	var replaced *Rule
	nr, err := func() (*Rule, error) {
		if r == nil {
			return nil, errors.New("no rule")
		}
		if r.List != l {
			return nil, fmt.Errorf("the new rule is for the %s, not the %s", r.List, l)
		}
		return checkNewRule(r)
	}()
	if err == nil {
		err = editFile(path, hooks, func(t *policyText, root *yaml.Node, old *Spec) ([]byte, error) {
			rules := old.User
			if l == Denylist {
				rules = old.Deny
			}
			i := slices.IndexFunc(rules, func(x *Rule) bool { return x.ID == id })
			if i < 0 {
				if l == Allowlist && slices.ContainsFunc(old.Auto, func(x *Rule) bool { return x.ID == id }) {
					return nil, fmt.Errorf("%w; edit its MCP server in mcp_servers or its entry in network_allowlist.auto instead", ErrAutoRule)
				}
				return nil, ErrNoRule
			}
			replaced = rules[i]
			if nr.ID != id && hasRule(old, nr) {
				return nil, ErrDuplicateRule
			}
			next := slices.Clone(rules)
			next[i] = nr
			out, err := t.replaceEntry(root, listKeys(l), i, nr, next)
			if err != nil {
				return nil, err
			}
			want := *old
			if l == Allowlist {
				want.User = next
			} else {
				want.Deny = next
			}
			return out, checkEdit(path, root, out, &want)
		})
	}
	if err != nil {
		return nil, fmt.Errorf("replace %s rule %s in %s: %w", l, id, path, err)
	}
	return replaced, nil
}

// replaceEntry returns the file with item i of the list at keys replaced
// by r. all are the rules the list holds afterwards, written out again
// when the list is in flow style. Comment lines after the item stay.
func (t *policyText) replaceEntry(root *yaml.Node, keys []string, i int, r *Rule, all []*Rule) ([]byte, error) {
	kn, v, err := listItem(root, keys, i)
	if err != nil {
		return nil, err
	}
	if v.Style&yaml.FlowStyle != 0 {
		cut, after, err := t.cutValue(v, kn)
		if err != nil {
			return nil, err
		}
		col := kn.Column - 1
		unit := indentUnit(root)
		var lines []string
		for _, x := range all {
			ent, err := renderEntry(x)
			if err != nil {
				return nil, err
			}
			lines = append(lines, indentEntry(ent, col+unit, col+unit+2)...)
		}
		return t.apply(cut, t.insertAfter(after, lines)), nil
	}
	entry, err := renderEntry(r)
	if err != nil {
		return nil, err
	}
	dash := v.Column - 1
	item := v.Content[i]
	first := t.itemStart(item, dash)
	last := t.blockEnd(first, dash+1)
	for last > first && (t.comment(last) || t.blank(last)) {
		last--
	}
	body := dash + 2
	if item.Line-1 == first && item.Column-1 > dash {
		body = item.Column - 1
	}
	text := strings.Join(indentEntry(entry, dash, body), t.nl) + t.nl
	end := t.end(last)
	if end == len(t.data) && (end == 0 || t.data[end-1] != '\n') {
		text = strings.TrimSuffix(text, t.nl)
	}
	return t.apply(splice{at: t.start[first], end: end, text: text}), nil
}
