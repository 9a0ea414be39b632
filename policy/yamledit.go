package policy

import (
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"gopkg.in/yaml.v3"
)

// The policy file is edited as text, not re-encoded: yaml.v3 would drop
// blank lines and reformat the user's file. An edit finds the list it
// changes through the positions of the parsed nodes, inserts or deletes
// whole lines, and then re-parses the result to check that exactly the
// intended rule changed. Anything unexpected fails closed: the file is left
// alone and the edit returns an error.

// ErrNoRule is wrapped by RemoveRule's error when the file holds no user
// rule with the given ID.
var ErrNoRule = errors.New("no such rule")

// ErrPresetRule is wrapped by the error for an edit of a rule a preset
// brings: preset rules are read-only.
var ErrPresetRule = errors.New("the rule comes from a preset and is read-only")

// ErrAutoRule is wrapped by RemoveRule's error when the ID names an auto
// rule, which airlock manages.
var ErrAutoRule = errors.New("auto rules are managed by airlock")

// AddRule appends r to the policy file at path: to
// sandbox.network_allowlist.user or to sandbox.network_denylist, as r.List
// says. r.Tier must be User and r.ID must be RuleID(r.List, r.Pattern,
// r.Member). A broad allow pattern needs r.Forced. Added is written in UTC,
// to the second.
//
// Adding a rule the file already holds (same ID, also as an auto rule) does
// nothing. A missing file is created with just the sandbox section. The
// rest of the file, comments and blank lines included, stays as it was.
//
// The edit holds an exclusive lock on PATH.lock, so concurrent edits, also
// from other processes, all land; the file is replaced atomically.
func AddRule(path string, r *Rule) error {
	return addRule(path, r, writeHooks{})
}

func addRule(path string, r *Rule, hooks writeHooks) error {
	return addRules(path, []*Rule{r}, hooks)
}

// addRules appends rules to the policy file in one edit, as AddRule appends
// one: either every rule is written or the file is left as it was. Rules
// the file already holds, and repeats among rules, are skipped.
func addRules(path string, rules []*Rule, hooks writeHooks) error {
	checked := make([]*Rule, len(rules))
	for i, r := range rules {
		if r == nil {
			return fmt.Errorf("add rule to %s: no rule", path)
		}
		nr, err := checkNewRule(r)
		if err != nil {
			return addError(path, r, err)
		}
		checked[i] = nr
	}
	var failed *Rule
	err := editFile(path, hooks, func(t *policyText, root *yaml.Node, old *Spec) ([]byte, error) {
		// Each rule is inserted into the text the one before it left, read
		// again for its positions; the result is checked against the old
		// file and every rule once, at the end.
		var out []byte
		want, cur, curRoot := *old, old, root
		for _, nr := range checked {
			if hasRule(cur, nr) {
				continue
			}
			existing := cur.User
			if nr.List == Denylist {
				existing = cur.Deny
			}
			next, err := t.insertEntry(curRoot, listKeys(nr.List), nr, existing)
			if err != nil {
				failed = nr
				return nil, err
			}
			if cur, curRoot, err = parseSpec(path, next); err != nil {
				failed = nr
				return nil, fmt.Errorf("the edited file would not load, so it was left unchanged: %w", err)
			}
			if nr.List == Allowlist {
				want.User = append(slices.Clip(want.User), nr)
			} else {
				want.Deny = append(slices.Clip(want.Deny), nr)
			}
			t, out = newText(next), next
		}
		if out == nil {
			return nil, nil
		}
		return out, checkEdit(path, root, out, &want)
	})
	switch {
	case err == nil:
		return nil
	case failed == nil && len(rules) == 1:
		failed = rules[0]
	case failed == nil:
		return fmt.Errorf("add %d rules to %s: %w", len(rules), path, err)
	}
	return addError(path, failed, err)
}

func addError(path string, r *Rule, err error) error {
	return fmt.Errorf("add %s rule %q to %s: %w", r.List, r.Pattern.String(), path, err)
}

// RemoveRule deletes the user rule with this ID from list l of the policy
// file at path and returns it. Only that entry's lines go. The error wraps
// ErrNoRule when there is no such rule, and ErrAutoRule when the ID names
// an auto rule: remove its MCP server from mcp_servers, or its entry from
// network_allowlist.auto, instead. Locking and writing are as for AddRule.
func RemoveRule(path string, l List, id string) (removed *Rule, err error) {
	return removeRule(path, l, id, writeHooks{})
}

func removeRule(path string, l List, id string, hooks writeHooks) (*Rule, error) {
	var removed *Rule
	err := editFile(path, hooks, func(t *policyText, root *yaml.Node, old *Spec) ([]byte, error) {
		rules := old.User
		if l == Denylist {
			rules = old.Deny
		}
		i := slices.IndexFunc(rules, func(r *Rule) bool { return r.ID == id })
		if i < 0 {
			if l == Allowlist && slices.ContainsFunc(old.Auto, func(r *Rule) bool { return r.ID == id }) {
				return nil, fmt.Errorf("%w; remove its MCP server from mcp_servers or its entry from network_allowlist.auto instead", ErrAutoRule)
			}
			return nil, ErrNoRule
		}
		rest := slices.Delete(slices.Clone(rules), i, i+1)
		out, err := t.removeEntry(root, listKeys(l), i, rest)
		if err != nil {
			return nil, err
		}
		want := *old
		if l == Allowlist {
			want.User = rest
		} else {
			want.Deny = rest
		}
		removed = rules[i]
		return out, checkEdit(path, root, out, &want)
	})
	if err != nil {
		return nil, fmt.Errorf("remove %s rule %s from %s: %w", l, id, path, err)
	}
	return removed, nil
}

// checkNewRule validates a rule for AddRule and returns the rule as the
// file will hold it.
func checkNewRule(r *Rule) (*Rule, error) {
	switch {
	case r.Tier != User:
		return nil, fmt.Errorf("only user rules are written to the policy file, not %s rules", r.Tier)
	case r.List != Allowlist && r.List != Denylist:
		return nil, fmt.Errorf("unknown list %s", r.List)
	case r.Pattern.IsZero():
		return nil, errors.New("empty pattern")
	case r.ID != RuleID(r.List, r.Pattern, r.Member):
		return nil, fmt.Errorf("rule ID %q does not match its list, pattern and member; build rules with NewRule", r.ID)
	}
	if r.Member != "" {
		if err := checkMember(r.Member); err != nil {
			return nil, err
		}
	}
	if r.List == Allowlist && !r.Forced {
		if _, err := Parse(r.Pattern.String(), ParseOptions{}); err != nil {
			return nil, err
		}
	}
	nr := *r
	if !nr.Added.IsZero() {
		nr.Added = nr.Added.UTC().Truncate(time.Second)
	}
	return &nr, nil
}

func hasRule(s *Spec, r *Rule) bool {
	same := func(x *Rule) bool { return x.ID == r.ID }
	if r.List == Denylist {
		return slices.ContainsFunc(s.Deny, same)
	}
	return slices.ContainsFunc(s.User, same) || slices.ContainsFunc(s.Auto, same)
}

// listKeys returns the key path of the list of user rules of l.
func listKeys(l List) []string {
	if l == Denylist {
		return []string{"sandbox", "network_denylist"}
	}
	return []string{"sandbox", "network_allowlist", "user"}
}

// checkEdit re-parses the edited file and fails unless its spec equals want
// and its other top-level keys equal those of the original root.
func checkEdit(path string, root *yaml.Node, out []byte, want *Spec) error {
	got, newRoot, err := parseSpec(path, out)
	if err != nil {
		return fmt.Errorf("the edited file would not load, so it was left unchanged: %w", err)
	}
	if !sameSpec(got, want) {
		return errors.New("the edited file would not say what was intended, so it was left unchanged")
	}
	if !slices.EqualFunc(otherKeys(root), otherKeys(newRoot), sameNode) {
		return errors.New("the edit would change keys outside the sandbox section, so the file was left unchanged")
	}
	return nil
}

// otherKeys returns the key and value nodes of the top-level mapping other
// than sandbox.
func otherKeys(root *yaml.Node) []*yaml.Node {
	if root == nil {
		return nil
	}
	var nodes []*yaml.Node
	for i := 0; i+1 < len(root.Content); i += 2 {
		if root.Content[i].Value != "sandbox" {
			nodes = append(nodes, root.Content[i], root.Content[i+1])
		}
	}
	return nodes
}

// sameNode compares what two nodes say, not where they stand or the
// comments around them.
func sameNode(a, b *yaml.Node) bool {
	return a.Kind == b.Kind && a.Tag == b.Tag && a.Value == b.Value && a.Anchor == b.Anchor &&
		slices.EqualFunc(a.Content, b.Content, sameNode)
}

func sameSpec(a, b *Spec) bool {
	return a.Enabled == b.Enabled && a.UnknownAction == b.UnknownAction && a.LearnUntil.Equal(b.LearnUntil) &&
		slices.Equal(a.Presets, b.Presets) &&
		a.ApprovalTimeout == b.ApprovalTimeout && a.Inspect == b.Inspect &&
		slices.EqualFunc(a.MCPServers, b.MCPServers, MCPServer.Equal) && a.Resources == b.Resources && a.Sessions.Equal(b.Sessions) &&
		slices.EqualFunc(a.Auto, b.Auto, sameRule) &&
		slices.EqualFunc(a.User, b.User, sameRule) &&
		slices.EqualFunc(a.Deny, b.Deny, sameRule)
}

func sameRule(a, b *Rule) bool {
	return a.ID == b.ID && a.Pattern.String() == b.Pattern.String() && a.List == b.List &&
		a.Tier == b.Tier && a.Member == b.Member && a.Source == b.Source &&
		a.Added.Equal(b.Added) && a.Forced == b.Forced
}

// writeHooks lets the Sandbox and tests act on a write; the zero value
// does nothing.
type writeHooks struct {
	// dir, when set, is the real path of the policy file's directory
	// (resolveDir), resolved at a trusted moment: when the sandbox was
	// opened. Unset, it is resolved when the edit starts.
	dir string
	// check, when set, runs on the file as read under the lock, before
	// the edit; an error leaves the file alone.
	check func(old *Spec) error
	// beforeRename runs once the new content is written and synced to the
	// temporary file tmp, before tmp replaces the policy file.
	beforeRename func(tmp string) error
	// wrote, when set, is handed the spec of the content written, once it
	// has replaced the policy file: what a sandbox puts in force after its
	// own edit. (Reading the file again would put in force whatever a
	// member renamed over it meanwhile, past the widening check.)
	wrote func(*Spec)
}

// editFile locks the policy file at path, reads and parses it fresh, and
// writes what edit returns in its place; edit returns nil to leave it
// alone. A missing file reads as empty.
//
// airlockd writes as root, and a sandbox member that can write the
// project could put a symbolic link in place of the file or of a directory
// on its path, to have a person's next saved rule written into another
// sandbox's policy file or any file of the host, or that file's content
// copied into the project. So the edit opens the file's directory once,
// following no link on its real path (hooks.dir, or resolved now), and
// does everything else through that descriptor: lock, read, temporary
// file, rename and sync. A directory replaced since is an error, and so is
// a policy file that is a symbolic link (ErrSymlink); either changes
// nothing. Reads follow links (see ReadFile); only edits refuse them.
func editFile(path string, hooks writeHooks, edit func(t *policyText, root *yaml.Node, old *Spec) ([]byte, error)) error {
	d, err := openEditDir(path, hooks.dir)
	if err != nil {
		return err
	}
	defer d.close()
	unlock, err := lockFile(d, d.name+".lock")
	if err != nil {
		return err
	}
	defer unlock()

	data, info, err := d.read()
	if errors.Is(err, fs.ErrNotExist) {
		data, info, err = nil, nil, nil
	}
	if errors.Is(err, ErrSymlink) {
		return fmt.Errorf("%s is a symbolic link to %s: %w; name the file itself in the config (or replace the link with the file) to save rules and settings to it", path, d.readlink(), ErrSymlink)
	}
	if err != nil {
		return err
	}
	old, root, err := parseSpec(path, data)
	if err != nil {
		return err
	}
	if hooks.check != nil {
		if err := hooks.check(old); err != nil {
			return err
		}
	}
	out, err := edit(newText(data), root, old)
	if err != nil || out == nil {
		return err
	}
	written, err := ParseSpec(path, out)
	if err != nil {
		return fmt.Errorf("the edit of %s would not read back: %w", path, err)
	}
	if err := writeAtomic(d, out, info, hooks); err != nil {
		return err
	}
	if hooks.wrote != nil {
		hooks.wrote(written)
	}
	return nil
}

// writeAtomic replaces the policy file in d with data: a temporary file in
// the same directory is written, synced and renamed over it, and the
// directory synced, so a crash leaves either the old or the new file. The
// new file keeps the old one's permissions (0644 for a new file) and, when
// airlock runs as root, its owner.
func writeAtomic(d *editDir, data []byte, old fs.FileInfo, hooks writeHooks) error {
	f, tmp, err := d.createTemp()
	if err != nil {
		return fmt.Errorf("write policy file: %w", err)
	}
	done := false
	defer func() {
		if !done {
			f.Close()
			d.remove(tmp)
		}
	}()
	mode := fs.FileMode(0o644)
	if old != nil {
		mode = old.Mode().Perm()
		if err := keepOwner(f, old); err != nil {
			return fmt.Errorf("write policy file: %w", err)
		}
	}
	if err := f.Chmod(mode); err != nil {
		return fmt.Errorf("write policy file: %w", err)
	}
	if _, err := f.Write(data); err != nil {
		return fmt.Errorf("write policy file: %w", err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("write policy file: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write policy file: %w", err)
	}
	if hooks.beforeRename != nil {
		if err := hooks.beforeRename(f.Name()); err != nil {
			return fmt.Errorf("write policy file: %w", err)
		}
	}
	if err := d.replace(tmp); err != nil {
		return fmt.Errorf("write policy file: %w", err)
	}
	done = true
	if err := d.sync(); err != nil {
		return fmt.Errorf("write policy file: %w", err)
	}
	return nil
}

// policyText is a policy file split into lines, for splicing. Lines are
// counted from 0; yaml.Node positions count from 1.
type policyText struct {
	data  []byte
	start []int  // start[i] is the offset of line i
	nl    string // the file's line ending: "\n" or "\r\n"
}

func newText(data []byte) *policyText {
	t := &policyText{data: data, nl: "\n"}
	for i := 0; i < len(data); i++ {
		if i == 0 || data[i-1] == '\n' {
			t.start = append(t.start, i)
		}
	}
	if first, _, ok := strings.Cut(string(data), "\n"); ok && strings.HasSuffix(first, "\r") {
		t.nl = "\r\n"
	}
	return t
}

func (t *policyText) lines() int { return len(t.start) }

// end returns the offset just past line i and its line ending.
func (t *policyText) end(i int) int {
	if i+1 < len(t.start) {
		return t.start[i+1]
	}
	return len(t.data)
}

// line returns line i without its line ending.
func (t *policyText) line(i int) string {
	return strings.TrimRight(string(t.data[t.start[i]:t.end(i)]), "\r\n")
}

func (t *policyText) indent(i int) int {
	l := t.line(i)
	return len(l) - len(strings.TrimLeft(l, " "))
}

func (t *policyText) blank(i int) bool {
	return strings.Trim(t.line(i), " \t") == ""
}

func (t *policyText) comment(i int) bool {
	return strings.HasPrefix(strings.TrimLeft(t.line(i), " \t"), "#")
}

// lineAt returns the line holding offset off.
func (t *policyText) lineAt(off int) int {
	return sort.Search(len(t.start), func(i int) bool { return t.start[i] > off }) - 1
}

// offset returns the byte offset of a yaml.Node position (1-based line,
// 1-based column counted in characters).
func (t *policyText) offset(line, col int) int {
	off := t.start[line-1]
	for range col - 1 {
		_, size := utf8.DecodeRune(t.data[off:])
		off += size
	}
	return off
}

// blockEnd returns the last line of the block that starts at line first
// and holds the lines indented at least col: it ends before the next
// content line indented less. Trailing blank lines and less indented
// comments do not belong to it.
func (t *policyText) blockEnd(first, col int) int {
	end := first
	for i := first + 1; i < t.lines(); i++ {
		switch {
		case t.blank(i):
		case t.indent(i) >= col:
			end = i
		case !t.comment(i):
			return end
		}
	}
	return end
}

// itemStart returns the line of the "-" of list item n whose dashes stand
// in column dash (0-based).
func (t *policyText) itemStart(n *yaml.Node, dash int) int {
	for i := n.Line - 1; i >= 0; i-- {
		if l := t.line(i); t.indent(i) == dash && strings.HasPrefix(l[dash:], "-") {
			return i
		}
	}
	return n.Line - 1
}

// splice replaces data[at:end] with text.
type splice struct {
	at, end int
	text    string
}

// apply returns the data with the splices made; they must not overlap.
func (t *policyText) apply(edits ...splice) []byte {
	slices.SortFunc(edits, func(a, b splice) int { return b.at - a.at })
	out := slices.Clone(t.data)
	for _, e := range edits {
		out = slices.Concat(out[:e.at], []byte(e.text), out[e.end:])
	}
	return out
}

// insertAfter returns the splice that inserts lines after line i (before
// everything when i is -1).
func (t *policyText) insertAfter(i int, lines []string) splice {
	at := 0
	if i >= 0 {
		at = t.end(i)
	}
	s := strings.Join(lines, t.nl) + t.nl
	if at > 0 && at == len(t.data) && t.data[at-1] != '\n' {
		s = t.nl + s
	}
	return splice{at: at, end: at, text: s}
}

// insertEntry returns the file with r appended to the list at keys (the
// last key names the list), creating the keys that are missing. existing
// are the rules the list holds now, written out again when the list must
// change from flow to block style.
func (t *policyText) insertEntry(root *yaml.Node, keys []string, r *Rule, existing []*Rule) ([]byte, error) {
	entry, err := renderEntry(r)
	if err != nil {
		return nil, err
	}
	unit := indentUnit(root)
	if root == nil {
		return t.apply(t.insertAfter(t.lines()-1, nestKeys(keys, 0, unit, entry))), nil
	}
	m := root
	for i, k := range keys {
		if m.Style&yaml.FlowStyle != 0 {
			return nil, flowError(keys[:i])
		}
		kn, v := mappingValue(m, k)
		if kn == nil {
			// Append the missing key after the mapping's last line.
			col := m.Column - 1
			return t.apply(t.insertAfter(t.blockEnd(m.Line-1, col), nestKeys(keys[i:], col, unit, entry))), nil
		}
		col := kn.Column - 1
		last := i == len(keys)-1
		switch {
		case last && v.Kind == yaml.SequenceNode && v.Style&yaml.FlowStyle == 0 && len(v.Content) > 0:
			// Append after the last item, indented like it.
			dash := v.Column - 1
			item := v.Content[len(v.Content)-1]
			first := t.itemStart(item, dash)
			body := dash + 2
			if item.Line-1 == first && item.Column-1 > dash {
				body = item.Column - 1
			}
			return t.apply(t.insertAfter(t.blockEnd(first, dash+1), indentEntry(entry, dash, body))), nil
		case last && (isNull(v) || v.Kind == yaml.SequenceNode):
			// An empty or flow-style list: write it out in block style.
			var lines []string
			for _, e := range append(slices.Clip(existing), r) {
				ent, err := renderEntry(e)
				if err != nil {
					return nil, err
				}
				lines = append(lines, indentEntry(ent, col+unit, col+unit+2)...)
			}
			cut, after, err := t.cutValue(v, kn)
			if err != nil {
				return nil, err
			}
			return t.apply(cut, t.insertAfter(after, lines)), nil
		case !last && v.Kind == yaml.MappingNode && v.Style&yaml.FlowStyle == 0:
			m = v
		case !last && (isNull(v) || v.Kind == yaml.MappingNode && len(v.Content) == 0):
			// "key:" or "key: {}": write the rest below the key.
			cut, after, err := t.cutValue(v, kn)
			if err != nil {
				return nil, err
			}
			return t.apply(cut, t.insertAfter(after, nestKeys(keys[i+1:], col+unit, unit, entry))), nil
		default:
			return nil, flowError(keys[:i+1])
		}
	}
	return nil, errors.New("no list to add to")
}

// listItem finds the list at keys, in block style down to it, and checks
// that it has an item i. kn is the list's key node.
func listItem(root *yaml.Node, keys []string, i int) (kn, v *yaml.Node, err error) {
	m := root
	for j, k := range keys {
		if m == nil {
			break
		}
		if m.Style&yaml.FlowStyle != 0 {
			return nil, nil, flowError(keys[:j])
		}
		kn, v = mappingValue(m, k)
		m = v
	}
	if kn == nil || v == nil || v.Kind != yaml.SequenceNode || i >= len(v.Content) {
		return nil, nil, fmt.Errorf("%s has no item %d", strings.Join(keys, "."), i)
	}
	return kn, v, nil
}

// removeEntry returns the file without item i of the list at keys. rest
// are the rules the list keeps, written out again when the list is in flow
// style.
func (t *policyText) removeEntry(root *yaml.Node, keys []string, i int, rest []*Rule) ([]byte, error) {
	kn, v, err := listItem(root, keys, i)
	if err != nil {
		return nil, err
	}
	if v.Style&yaml.FlowStyle == 0 {
		dash := v.Column - 1
		first := t.itemStart(v.Content[i], dash)
		last := t.blockEnd(first, dash+1)
		return t.apply(splice{at: t.start[first], end: t.end(last)}), nil
	}
	cut, after, err := t.cutValue(v, kn)
	if err != nil {
		return nil, err
	}
	if len(rest) == 0 {
		cut.text = " []"
		return t.apply(cut), nil
	}
	col := kn.Column - 1
	unit := indentUnit(root)
	var lines []string
	for _, r := range rest {
		ent, err := renderEntry(r)
		if err != nil {
			return nil, err
		}
		lines = append(lines, indentEntry(ent, col+unit, col+unit+2)...)
	}
	return t.apply(cut, t.insertAfter(after, lines)), nil
}

func flowError(keys []string) error {
	where := "the file's top level"
	if len(keys) > 0 {
		where = strings.Join(keys, ".")
	}
	return fmt.Errorf("%s is written in flow style ({…}); write it in block style so airlock can edit it", where)
}

// cutValue returns the splice that removes the inline value v of key k (an
// empty value, "~", "null", "[…]" or "{…}") and the line after which block
// content for the key goes.
func (t *policyText) cutValue(v, k *yaml.Node) (splice, int, error) {
	if isNull(v) && v.Value == "" {
		return splice{}, k.Line - 1, nil
	}
	at := t.offset(v.Line, v.Column)
	end := at + len(v.Value)
	if !isNull(v) {
		if at >= len(t.data) || t.data[at] != '[' && t.data[at] != '{' {
			return splice{}, 0, fmt.Errorf("cannot find the value at line %d", v.Line)
		}
		close := flowEnd(t.data, at)
		if close < 0 {
			return splice{}, 0, fmt.Errorf("cannot find the end of the value at line %d", v.Line)
		}
		end = close + 1
	}
	for at > 0 && t.data[at-1] == ' ' {
		at--
	}
	return splice{at: at, end: end}, t.lineAt(end - 1), nil
}

// flowEnd returns the offset of the bracket that closes the flow
// collection opening at data[at], or -1.
func flowEnd(data []byte, at int) int {
	depth := 0
	for i := at; i < len(data); i++ {
		c := data[i]
		// Quotes and comments start only where a new token may.
		tokenStart := i == 0 || strings.IndexByte("[{,: \t\r\n", data[i-1]) >= 0
		switch {
		case c == '[' || c == '{':
			depth++
		case c == ']' || c == '}':
			depth--
			if depth == 0 {
				return i
			}
		case c == '\'' && tokenStart:
			for i++; i < len(data); i++ {
				if data[i] == '\'' {
					if i+1 < len(data) && data[i+1] == '\'' {
						i++
						continue
					}
					break
				}
			}
		case c == '"' && tokenStart:
			for i++; i < len(data) && data[i] != '"'; i++ {
				if data[i] == '\\' {
					i++
				}
			}
		case c == '#' && tokenStart:
			for i < len(data) && data[i] != '\n' {
				i++
			}
		}
	}
	return -1
}

// indentUnit guesses the file's indentation step from the sandbox section,
// else from any other nested mapping; 2 when there is none.
func indentUnit(root *yaml.Node) int {
	if root == nil {
		return 2
	}
	if k, v := mappingValue(root, "sandbox"); k != nil && v.Kind == yaml.MappingNode && v.Style&yaml.FlowStyle == 0 && v.Column > k.Column {
		return v.Column - k.Column
	}
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		if v.Kind == yaml.MappingNode && v.Style&yaml.FlowStyle == 0 && v.Column > k.Column {
			return v.Column - k.Column
		}
	}
	return 2
}

// nestKeys returns keys, each nested in the one before, the first in column
// col, and under the last the list item entry.
func nestKeys(keys []string, col, unit int, entry []string) []string {
	var lines []string
	for j, k := range keys {
		lines = append(lines, strings.Repeat(" ", col+j*unit)+k+":")
	}
	dash := col + len(keys)*unit
	return append(lines, indentEntry(entry, dash, dash+2)...)
}

// indentEntry turns entry lines into a list item with its "-" in column
// dash and its keys in column body.
func indentEntry(entry []string, dash, body int) []string {
	lines := make([]string, len(entry))
	for i, l := range entry {
		if i == 0 {
			lines[i] = strings.Repeat(" ", dash) + "-" + strings.Repeat(" ", body-dash-1) + l
		} else {
			lines[i] = strings.Repeat(" ", body) + l
		}
	}
	return lines
}

// renderEntry writes a user rule as the keys of a list item, unindented:
// pattern, added, source, member, force, leaving out empty ones.
func renderEntry(r *Rule) ([]string, error) {
	var lines []string
	add := func(key, value string) error {
		q, err := yamlQuote(value)
		if err != nil {
			return fmt.Errorf("write %s: %w", key, err)
		}
		lines = append(lines, key+": "+q)
		return nil
	}
	if err := add("pattern", r.Pattern.String()); err != nil {
		return nil, err
	}
	if !r.Added.IsZero() {
		if err := add("added", r.Added.UTC().Format(time.RFC3339Nano)); err != nil {
			return nil, err
		}
	}
	if r.Source != "" {
		if err := add("source", r.Source); err != nil {
			return nil, err
		}
	}
	if r.Member != "" {
		if err := add("member", r.Member); err != nil {
			return nil, err
		}
	}
	if r.Forced {
		lines = append(lines, "force: true")
	}
	return lines, nil
}

// yamlQuote returns s as a double-quoted YAML scalar on one line.
func yamlQuote(s string) (string, error) {
	b, err := yaml.Marshal(&yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: s, Style: yaml.DoubleQuotedStyle})
	if err != nil {
		return "", err
	}
	q := strings.TrimSuffix(string(b), "\n")
	if strings.ContainsAny(q, "\r\n") {
		return "", fmt.Errorf("%q does not fit on one line", truncate(s, 40))
	}
	return q, nil
}
