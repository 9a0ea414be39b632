package policy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"gopkg.in/yaml.v3"
)

// MaxFileSize is the largest policy file airlock reads, in bytes.
const MaxFileSize = 4 << 20

// Bounds of the settings in a policy file.
const (
	maxMemoryMB   = 1 << 20 // 1 TiB
	maxCPUs       = 1024
	maxRunTimeout = 30 * 24 * time.Hour
	maxMemberLen  = 255
)

// MaxBandwidthMbps bounds resources.bandwidth_mbps: 10 Gbit/s, which a
// kernel token bucket's 32-bit byte rate still holds.
const MaxBandwidthMbps = 10000

// FileError is a problem at one place in a policy file. ParseSpec and
// LoadSpec return it for every problem with the file's content; errors.Is
// sees through it (ErrBroad for a pattern that needs "force: true").
type FileError struct {
	File string // the path as given to ParseSpec or LoadSpec
	Line int    // 1-based; 0 when the problem concerns the whole file
	// Key is the key path of the offending value, such as
	// "sandbox.network_allowlist.user[1].pattern" (list indexes count from
	// 0); "" when the problem is not under a key.
	Key string
	Err error
}

func (e *FileError) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		b.WriteByte(':')
		b.WriteString(strconv.Itoa(e.Line))
	}
	b.WriteString(": ")
	if e.Key != "" {
		b.WriteString(e.Key)
		b.WriteString(": ")
	}
	b.WriteString(e.Err.Error())
	return b.String()
}

func (e *FileError) Unwrap() error { return e.Err }

// LoadSpec reads the policy file at path (see ReadFile). See ParseSpec.
func LoadSpec(path string) (*Spec, error) {
	data, _, err := ReadFile(path)
	if err != nil {
		return nil, err
	}
	return ParseSpec(path, data)
}

func tooBig(path string) error {
	return &FileError{File: path, Err: fmt.Errorf("file is larger than %d bytes", MaxFileSize)}
}

// ParseSpec reads the "sandbox:" section of a project's YAML file; path is
// only used in error messages. Other top-level keys are ignored. A file
// without a sandbox section (or an empty one) yields DefaultSpec.
//
// Unknown keys, wrong types, bad values, patterns and timestamps, duplicate
// rules, anchors and aliases in the sandbox section, several documents and
// files over MaxFileSize are errors. The error is a *FileError naming the
// file, the line and the key path of the first problem; no Spec is returned
// with it.
func ParseSpec(path string, data []byte) (*Spec, error) {
	spec, _, err := parseSpec(path, data)
	return spec, err
}

// parseSpec is ParseSpec that also returns the file's top-level mapping
// (nil for an empty file), for editing.
func parseSpec(path string, data []byte) (*Spec, *yaml.Node, error) {
	if len(data) > MaxFileSize {
		return nil, nil, tooBig(path)
	}
	root, err := parseYAML(path, data)
	if err != nil {
		return nil, nil, err
	}
	key, val, err := sandboxSection(path, root)
	if err != nil {
		return nil, nil, err
	}
	spec := DefaultSpec()
	if key == nil {
		return spec, root, nil
	}
	d := decoder{file: path}
	if err := d.noAliases(key, "sandbox"); err != nil {
		return nil, nil, err
	}
	if err := d.noAliases(val, "sandbox"); err != nil {
		return nil, nil, err
	}
	if err := d.sandbox(val, spec); err != nil {
		return nil, nil, err
	}
	return spec, root, nil
}

// parseYAML parses a single YAML document and returns its top-level
// mapping, or nil when the document is empty.
func parseYAML(path string, data []byte) (*yaml.Node, error) {
	if err := lineBreaks(path, data); err != nil {
		return nil, err
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, nil
		}
		return nil, yamlError(path, err)
	}
	var next yaml.Node
	switch err := dec.Decode(&next); {
	case err == nil:
		return nil, &FileError{File: path, Line: next.Line, Err: errors.New("a policy file holds one YAML document; remove the \"---\" and what follows, or merge the documents")}
	case !errors.Is(err, io.EOF):
		return nil, yamlError(path, err)
	}
	if len(doc.Content) == 0 {
		return nil, nil
	}
	top := doc.Content[0]
	switch {
	case top.Kind == yaml.MappingNode:
		return top, nil
	case isNull(top):
		return nil, nil
	}
	return nil, &FileError{File: path, Line: top.Line, Err: fmt.Errorf("the file's top level is %s; want a mapping of keys such as sandbox:", describeNode(top))}
}

// yamlError turns a yaml.v3 syntax error ("yaml: line 3: …") into a
// FileError with the line in its place.
func yamlError(path string, err error) error {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	line := 0
	if rest, ok := strings.CutPrefix(msg, "line "); ok {
		if n, after, ok := strings.Cut(rest, ": "); ok {
			if l, err := strconv.Atoi(n); err == nil {
				line, msg = l, after
			}
		}
	}
	return &FileError{File: path, Line: line, Err: fmt.Errorf("invalid YAML: %s", msg)}
}

// sandboxSection finds the "sandbox" key of the top-level mapping root and
// its value; both are nil when there is none.
func sandboxSection(path string, root *yaml.Node) (key, val *yaml.Node, err error) {
	if root == nil {
		return nil, nil, nil
	}
	for i := 0; i+1 < len(root.Content); i += 2 {
		k := root.Content[i]
		if k.Kind != yaml.ScalarNode || k.Value != "sandbox" {
			continue
		}
		if key != nil {
			return nil, nil, &FileError{File: path, Line: k.Line, Key: "sandbox", Err: fmt.Errorf("duplicate key (first at line %d)", key.Line)}
		}
		key, val = k, root.Content[i+1]
	}
	return key, val, nil
}

// mappingValue returns the key and value nodes of key in mapping m, or nils.
func mappingValue(m *yaml.Node, key string) (k, v *yaml.Node) {
	if m == nil || m.Kind != yaml.MappingNode {
		return nil, nil
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		if k := m.Content[i]; k.Kind == yaml.ScalarNode && k.Value == key {
			return k, m.Content[i+1]
		}
	}
	return nil, nil
}

func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.Tag == "!!null"
}

// describeNode names what a node holds, for "want X, got Y" messages.
func describeNode(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return "an alias"
	case yaml.ScalarNode:
		switch n.Tag {
		case "!!null":
			return "an empty value"
		case "!!str":
			return fmt.Sprintf("the string %q", truncate(n.Value, 40))
		case "!!bool":
			return "a boolean"
		case "!!int", "!!float":
			return "a number"
		case "!!timestamp":
			return "a timestamp"
		}
		return fmt.Sprintf("a value tagged %s", n.Tag)
	}
	return "nothing"
}

// decoder converts the nodes of a sandbox section into a Spec. Each method
// checks one part of the schema and returns the first problem as a
// *FileError.
type decoder struct {
	file string
}

func (d *decoder) errorf(n *yaml.Node, key, format string, args ...any) error {
	return &FileError{File: d.file, Line: n.Line, Key: key, Err: fmt.Errorf(format, args...)}
}

// noAliases refuses anchors, aliases (and so merge keys) and custom tags
// under n: expanding aliases is how a small file becomes a huge one, and
// the section is edited as text, which an alias would make ambiguous.
func (d *decoder) noAliases(n *yaml.Node, key string) error {
	switch {
	case n.Kind == yaml.AliasNode:
		return d.errorf(n, key, "aliases (*%s) are not allowed in the sandbox section; write the value out", n.Value)
	case n.Anchor != "":
		return d.errorf(n, key, "anchors (&%s) are not allowed in the sandbox section", n.Anchor)
	case n.Kind == yaml.MappingNode && n.Tag != "!!map", n.Kind == yaml.SequenceNode && n.Tag != "!!seq":
		return d.errorf(n, key, "custom tag %s is not allowed in the sandbox section", n.Tag)
	}
	for _, c := range n.Content {
		if err := d.noAliases(c, key); err != nil {
			return err
		}
	}
	return nil
}

// fields walks the mapping n at key path, refusing duplicate and unknown
// keys, and calls the handler of each key in file order. An empty value
// counts as an empty mapping.
func (d *decoder) fields(n *yaml.Node, path string, handlers map[string]func(path string, v *yaml.Node) error) error {
	if isNull(n) {
		return nil
	}
	if n.Kind != yaml.MappingNode {
		return d.errorf(n, path, "want a mapping, got %s", describeNode(n))
	}
	seen := make(map[string]int)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode || k.Tag != "!!str" {
			return d.errorf(k, path, "keys must be plain words, got %s", describeNode(k))
		}
		kp := path + "." + k.Value
		if line, dup := seen[k.Value]; dup {
			return d.errorf(k, kp, "duplicate key (first at line %d)", line)
		}
		seen[k.Value] = k.Line
		h, ok := handlers[k.Value]
		if !ok {
			return d.errorf(k, kp, "unknown key; want one of %s", strings.Join(slices.Sorted(maps.Keys(handlers)), ", "))
		}
		if err := h(kp, v); err != nil {
			return err
		}
	}
	return nil
}

// items walks the list n at key path and calls f for each item. An empty
// value counts as an empty list.
func (d *decoder) items(n *yaml.Node, path string, f func(path string, v *yaml.Node) error) error {
	if isNull(n) {
		return nil
	}
	if n.Kind != yaml.SequenceNode {
		return d.errorf(n, path, "want a list, got %s", describeNode(n))
	}
	for i, v := range n.Content {
		if err := f(fmt.Sprintf("%s[%d]", path, i), v); err != nil {
			return err
		}
	}
	return nil
}

func (d *decoder) str(path string, n *yaml.Node) (string, error) {
	if n.Kind != yaml.ScalarNode || n.Tag != "!!str" {
		return "", d.errorf(n, path, "want a string, got %s", describeNode(n))
	}
	return n.Value, nil
}

func (d *decoder) bool(path string, n *yaml.Node) (bool, error) {
	var b bool
	if n.Kind != yaml.ScalarNode || n.Tag != "!!bool" || n.Decode(&b) != nil {
		return false, d.errorf(n, path, "want true or false, got %s", describeNode(n))
	}
	return b, nil
}

// time reads an RFC 3339 time, quoted or not.
func (d *decoder) time(path string, n *yaml.Node) (time.Time, error) {
	if n.Kind != yaml.ScalarNode || (n.Tag != "!!str" && n.Tag != "!!timestamp") {
		return time.Time{}, d.errorf(n, path, "want an RFC 3339 time such as \"2025-01-15T10:30:00Z\", got %s", describeNode(n))
	}
	t, err := time.Parse(time.RFC3339, n.Value)
	if err != nil {
		return time.Time{}, d.errorf(n, path, "%q is not an RFC 3339 time such as \"2025-01-15T10:30:00Z\"", truncate(n.Value, 40))
	}
	return t, nil
}

// int reads a whole number from lo to hi.
func (d *decoder) int(path string, n *yaml.Node, lo, hi int64) (int64, error) {
	var i int64
	if n.Kind != yaml.ScalarNode || n.Tag != "!!int" || n.Decode(&i) != nil {
		return 0, d.errorf(n, path, "want a whole number from %d to %d, got %s", lo, hi, describeNode(n))
	}
	if i < lo || i > hi {
		return 0, d.errorf(n, path, "%d is out of range; want %d to %d", i, lo, hi)
	}
	return i, nil
}

// float reads a number greater than 0 and at most hi.
func (d *decoder) float(path string, n *yaml.Node, hi float64) (float64, error) {
	var f float64
	if n.Kind != yaml.ScalarNode || (n.Tag != "!!float" && n.Tag != "!!int") || n.Decode(&f) != nil {
		return 0, d.errorf(n, path, "want a number, got %s", describeNode(n))
	}
	if math.IsNaN(f) || f <= 0 || f > hi {
		return 0, d.errorf(n, path, "%s is out of range; want more than 0 and at most %g", n.Value, hi)
	}
	return f, nil
}

func (d *decoder) sandbox(n *yaml.Node, s *Spec) error {
	var (
		autoNode *yaml.Node
		autoPath string
		userNode *yaml.Node
		userPath string
		denyNode *yaml.Node
		denyPath string
	)
	err := d.fields(n, "sandbox", map[string]func(string, *yaml.Node) error{
		"enabled": func(p string, v *yaml.Node) (err error) {
			s.Enabled, err = d.bool(p, v)
			return err
		},
		"unknown_action": func(p string, v *yaml.Node) error {
			str, err := d.str(p, v)
			if err != nil {
				return err
			}
			if s.UnknownAction, err = ParseAction(str); err != nil {
				return d.errorf(v, p, "%v", err)
			}
			return nil
		},
		"learn_until": func(p string, v *yaml.Node) error {
			t, err := d.time(p, v)
			s.LearnUntil = t
			return err
		},
		"presets": func(p string, v *yaml.Node) error {
			var names []string
			err := d.items(v, p, func(p string, v *yaml.Node) error {
				str, err := d.str(p, v)
				if err != nil {
					return err
				}
				if _, err := CheckPresets([]string{str}); err != nil {
					return &FileError{File: d.file, Line: v.Line, Key: p, Err: err}
				}
				names = append(names, str)
				return nil
			})
			if err != nil {
				return err
			}
			s.Presets, err = CheckPresets(names)
			s.Preset = PresetRules(s.Presets)
			return err
		},
		"approval_timeout": func(p string, v *yaml.Node) error {
			secs, err := d.int(p, v, 1, int64(MaxApprovalTimeout/time.Second))
			s.ApprovalTimeout = time.Duration(secs) * time.Second
			return err
		},
		"allow_ech": func(p string, v *yaml.Node) error {
			var err error
			s.AllowECH, err = d.bool(p, v)
			return err
		},
		"inspect": func(p string, v *yaml.Node) error {
			str, err := d.str(p, v)
			if err != nil {
				return err
			}
			if s.Inspect, err = ParseInspect(str); err != nil {
				return d.errorf(v, p, "%v", err)
			}
			return nil
		},
		"network_allowlist": func(p string, v *yaml.Node) error {
			return d.fields(v, p, map[string]func(string, *yaml.Node) error{
				"auto": func(p string, v *yaml.Node) error { autoNode, autoPath = v, p; return nil },
				"user": func(p string, v *yaml.Node) error { userNode, userPath = v, p; return nil },
			})
		},
		"network_denylist": func(p string, v *yaml.Node) error {
			denyNode, denyPath = v, p
			return nil
		},
		"mcp_servers": func(p string, v *yaml.Node) (err error) {
			s.MCPServers, err = d.mcpServers(p, v)
			return err
		},
		"resources": func(p string, v *yaml.Node) error {
			return d.resources(p, v, &s.Resources)
		},
		"sessions": func(p string, v *yaml.Node) (err error) {
			s.Sessions, err = d.sessions(p, v)
			return err
		},
	})
	if err != nil {
		return err
	}
	// Rules are converted after the whole section is read, so the auto
	// rules of mcp_servers join the auto list wherever the key stands.
	if autoNode != nil {
		if s.Auto, err = d.autoRules(autoPath, autoNode); err != nil {
			return err
		}
	}
	seen := make(map[string]bool, len(s.Auto))
	for _, r := range s.Auto {
		seen[r.ID] = true
	}
	for _, r := range MCPAutoRules(s.MCPServers) {
		if !seen[r.ID] {
			seen[r.ID] = true
			s.Auto = append(s.Auto, r)
		}
	}
	if userNode != nil {
		if s.User, err = d.entries(userPath, userNode, Allowlist); err != nil {
			return err
		}
	}
	if denyNode != nil {
		if s.Deny, err = d.entries(denyPath, denyNode, Denylist); err != nil {
			return err
		}
	}
	return nil
}

// autoRules reads network_allowlist.auto: a list of pattern strings.
func (d *decoder) autoRules(path string, n *yaml.Node) ([]*Rule, error) {
	var rules []*Rule
	lines := make(map[string]int)
	err := d.items(n, path, func(p string, v *yaml.Node) error {
		str, err := d.str(p, v)
		if err != nil {
			return err
		}
		pat, err := Parse(str, ParseOptions{})
		if err != nil {
			if errors.Is(err, ErrBroad) {
				return &FileError{File: d.file, Line: v.Line, Key: p, Err: fmt.Errorf("%w; auto entries cannot be forced: move it to network_allowlist.user with force: true", err)}
			}
			return &FileError{File: d.file, Line: v.Line, Key: p, Err: err}
		}
		r := NewRule(Allowlist, Auto, pat, "", "auto", time.Time{})
		if line, dup := lines[r.ID]; dup {
			return d.errorf(v, p, "%q duplicates the auto entry at line %d", r.Pattern.String(), line)
		}
		lines[r.ID] = v.Line
		rules = append(rules, r)
		return nil
	})
	return rules, err
}

// fileEntry is a network_allowlist.user or network_denylist item as stored.
type fileEntry struct {
	Pattern string
	Added   time.Time
	Source  string
	Member  string
	Force   bool
}

// entries reads network_allowlist.user or network_denylist into user rules
// of list l, one per item, in file order.
func (d *decoder) entries(path string, n *yaml.Node, l List) ([]*Rule, error) {
	var rules []*Rule
	lines := make(map[string]int)
	err := d.items(n, path, func(p string, v *yaml.Node) error {
		if v.Kind != yaml.MappingNode {
			return d.errorf(v, p, "want a mapping with a pattern key, got %s", describeNode(v))
		}
		var e fileEntry
		var patNode *yaml.Node
		err := d.fields(v, p, map[string]func(string, *yaml.Node) error{
			"pattern": func(p string, v *yaml.Node) (err error) {
				patNode = v
				e.Pattern, err = d.str(p, v)
				return err
			},
			"added": func(p string, v *yaml.Node) (err error) {
				e.Added, err = d.time(p, v)
				return err
			},
			"source": func(p string, v *yaml.Node) (err error) {
				e.Source, err = d.str(p, v)
				return err
			},
			"member": func(p string, v *yaml.Node) error {
				str, err := d.str(p, v)
				if err != nil {
					return err
				}
				if err := checkMember(str); err != nil {
					return d.errorf(v, p, "%v", err)
				}
				e.Member = str
				return nil
			},
			"force": func(p string, v *yaml.Node) (err error) {
				e.Force, err = d.bool(p, v)
				return err
			},
		})
		if err != nil {
			return err
		}
		if patNode == nil {
			return d.errorf(v, p, "missing pattern")
		}
		// A broad deny rule blocks too much, never too little: no force
		// needed.
		pat, err := Parse(e.Pattern, ParseOptions{Force: e.Force || l == Denylist})
		if err != nil {
			if errors.Is(err, ErrBroad) {
				err = fmt.Errorf("%w; add force: true to the entry to accept it anyway", err)
			}
			return &FileError{File: d.file, Line: patNode.Line, Key: p + ".pattern", Err: err}
		}
		r := NewRule(l, User, pat, e.Member, e.Source, e.Added)
		r.Forced = e.Force
		if line, dup := lines[r.ID]; dup {
			return d.errorf(v, p, "%q duplicates the entry at line %d (same pattern and member)", r.Pattern.String(), line)
		}
		lines[r.ID] = v.Line
		rules = append(rules, r)
		return nil
	})
	return rules, err
}

// checkMember validates a member name such as "mcp:github" or a container
// name.
func checkMember(s string) error {
	if s == "" {
		return errors.New("empty member; remove the key to apply the rule to every member")
	}
	if len(s) > maxMemberLen {
		return fmt.Errorf("member is longer than %d bytes", maxMemberLen)
	}
	for _, r := range s {
		if unicode.IsSpace(r) || unicode.IsControl(r) {
			return fmt.Errorf("member %q holds a space or control character; want a name such as mcp:github or a container name", truncate(s, 40))
		}
	}
	return nil
}

var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

func (d *decoder) mcpServers(path string, n *yaml.Node) ([]MCPServer, error) {
	var servers []MCPServer
	lines := make(map[string]int)
	err := d.items(n, path, func(p string, v *yaml.Node) error {
		if v.Kind != yaml.MappingNode {
			return d.errorf(v, p, "want a mapping with a name key, got %s", describeNode(v))
		}
		srv := MCPServer{Transport: "stdio"}
		var nameNode *yaml.Node
		err := d.fields(v, p, map[string]func(string, *yaml.Node) error{
			"name": func(p string, v *yaml.Node) (err error) {
				nameNode = v
				if srv.Name, err = d.str(p, v); err != nil {
					return err
				}
				if strings.TrimSpace(srv.Name) == "" || strings.ContainsFunc(srv.Name, unicode.IsControl) {
					return d.errorf(v, p, "want a server name such as github")
				}
				return nil
			},
			"transport": func(p string, v *yaml.Node) (err error) {
				if srv.Transport, err = d.str(p, v); err != nil {
					return err
				}
				if srv.Transport != "stdio" && srv.Transport != "sse" {
					return d.errorf(v, p, "unknown transport %q; want stdio or sse", truncate(srv.Transport, 40))
				}
				return nil
			},
			"image":   d.image(&srv.Image, "ghcr.io/github/github-mcp-server:latest"),
			"command": d.command(&srv.Command),
			"env": func(p string, v *yaml.Node) error {
				if v.Kind != yaml.MappingNode {
					return d.errorf(v, p, "want a mapping of NAME: value, got %s", describeNode(v))
				}
				srv.Env = map[string]string{}
				for i := 0; i+1 < len(v.Content); i += 2 {
					k, val := v.Content[i], v.Content[i+1]
					if !envName.MatchString(k.Value) {
						return d.errorf(k, p, "environment name %q: want letters, digits and _", truncate(k.Value, 40))
					}
					s, err := d.str(p+"."+k.Value, val)
					if err != nil {
						return err
					}
					if strings.ContainsRune(s, 0) {
						return d.errorf(val, p+"."+k.Value, "holds a NUL byte")
					}
					srv.Env[k.Value] = s
				}
				return nil
			},
			"trust": func(p string, v *yaml.Node) error {
				s, err := d.str(p, v)
				if err != nil {
					return err
				}
				if srv.Trust, err = ParseTrust(s); err != nil {
					return d.errorf(v, p, "%v", err)
				}
				return nil
			},
		})
		if err != nil {
			return err
		}
		if nameNode == nil {
			return d.errorf(v, p, "missing name")
		}
		if srv.Trust == 0 {
			srv.Trust = TrustUserAdded
			if _, known := LookupMCPServer(srv.Name); known {
				srv.Trust = TrustBuiltin
			}
		}
		key := strings.ToLower(strings.TrimSpace(srv.Name))
		if line, dup := lines[key]; dup {
			return d.errorf(nameNode, p+".name", "server %q is listed twice (first at line %d)", srv.Name, line)
		}
		lines[key] = nameNode.Line
		servers = append(servers, srv)
		return nil
	})
	return servers, err
}

// image reads an image reference into dst.
func (d *decoder) image(dst *string, example string) func(string, *yaml.Node) error {
	return func(p string, v *yaml.Node) (err error) {
		if *dst, err = d.str(p, v); err != nil {
			return err
		}
		if *dst == "" || strings.ContainsFunc(*dst, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) {
			return d.errorf(v, p, "want an image reference such as %s", example)
		}
		return nil
	}
}

// command reads a list of arguments into dst.
func (d *decoder) command(dst *[]string) func(string, *yaml.Node) error {
	return func(p string, v *yaml.Node) error {
		return d.items(v, p, func(p string, v *yaml.Node) error {
			arg, err := d.str(p, v)
			if err == nil && strings.ContainsRune(arg, 0) {
				err = d.errorf(v, p, "holds a NUL byte")
			}
			*dst = append(*dst, arg)
			return err
		})
	}
}

func (d *decoder) resources(path string, n *yaml.Node, r *Resources) error {
	return d.fields(n, path, map[string]func(string, *yaml.Node) error{
		"agent": d.limits(&r.Agent),
		"mcp":   d.limits(&r.MCP),
		"run_timeout": func(p string, v *yaml.Node) error {
			secs, err := d.int(p, v, 1, int64(maxRunTimeout/time.Second))
			r.RunTimeout = time.Duration(secs) * time.Second
			return err
		},
		"bandwidth_mbps": func(p string, v *yaml.Node) error {
			// 0 says "unlimited" as plainly as leaving the key out.
			n, err := d.int(p, v, 0, MaxBandwidthMbps)
			r.BandwidthMbps = int(n)
			return err
		},
		"bounds": func(p string, v *yaml.Node) error {
			return d.bounds(p, v, &r.Bounds)
		},
	})
}

// bounds reads resources.bounds: for cpus, memory_mb and pids a mapping
// {min, max} of numbers, or "host" for the host's CPUs or memory. What it
// leaves out keeps its default.
func (d *decoder) bounds(path string, n *yaml.Node, b *ResourceBounds) error {
	rng := func(r *Range, lo, hi float64, whole, host bool) func(string, *yaml.Node) error {
		return func(p string, v *yaml.Node) error {
			var minNode *yaml.Node
			bound := func(dst *Bound) func(string, *yaml.Node) error {
				return func(p string, v *yaml.Node) error {
					if v.Kind == yaml.ScalarNode && v.Tag == "!!str" && v.Value == "host" && host {
						*dst = Bound{Host: true}
						return nil
					}
					num := func(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }
					want := "a number from " + num(lo) + " to " + num(hi)
					if whole {
						want = "a whole " + want[2:]
					}
					if host {
						want += ", or host"
					}
					var f float64
					if v.Kind != yaml.ScalarNode || (v.Tag != "!!int" && (whole || v.Tag != "!!float")) || v.Decode(&f) != nil {
						return d.errorf(v, p, "want %s, got %s", want, describeNode(v))
					}
					if math.IsNaN(f) || f < lo || f > hi {
						return d.errorf(v, p, "%s is out of range; want %s", v.Value, want)
					}
					*dst = Bound{Value: f}
					return nil
				}
			}
			err := d.fields(v, p, map[string]func(string, *yaml.Node) error{
				"min": func(p string, v *yaml.Node) error { minNode = v; return bound(&r.Min)(p, v) },
				"max": bound(&r.Max),
			})
			if err != nil {
				return err
			}
			if !r.Min.Host && !r.Max.Host && r.Min.Value > r.Max.Value {
				at := v
				if minNode != nil {
					at = minNode
				}
				return d.errorf(at, p+".min", "min %s is above max %s", r.Min, r.Max)
			}
			return nil
		}
	}
	return d.fields(n, path, map[string]func(string, *yaml.Node) error{
		"cpus":      rng(&b.CPUs, 0.01, maxCPUs, false, true),
		"memory_mb": rng(&b.MemoryMB, 4, maxMemoryMB, true, true),
		"pids":      rng(&b.Pids, 8, 1<<16, true, false),
	})
}

// limits reads a member's memory_mb, cpus and pids into l.
func (d *decoder) limits(l *Limits) func(string, *yaml.Node) error {
	return func(p string, v *yaml.Node) error {
		return d.fields(v, p, map[string]func(string, *yaml.Node) error{
			"memory_mb": func(p string, v *yaml.Node) error {
				mb, err := d.int(p, v, 1, maxMemoryMB)
				l.MemoryMB = int(mb)
				return err
			},
			"cpus": func(p string, v *yaml.Node) (err error) {
				l.CPUs, err = d.float(p, v, maxCPUs)
				return err
			},
			"pids": func(p string, v *yaml.Node) error {
				n, err := d.int(p, v, 8, 1<<16)
				l.Pids = int(n)
				return err
			},
		})
	}
}

// lineBreaks refuses line breaks other than LF and CRLF. YAML also breaks
// lines at a lone CR, NEL, LS and PS; a file using them would be counted
// differently by YAML and by the editor that splices rules into it, so it
// is refused rather than half understood. (Written strings escape them.)
func lineBreaks(path string, data []byte) error {
	line := 1
	for i, r := range string(data) {
		bad := ""
		switch {
		case r == '\n':
			line++
		case r == '\r' && (i+1 >= len(data) || data[i+1] != '\n'):
			bad = "a carriage return not followed by a line feed"
		case r == '\u0085' || r == '\u2028' || r == '\u2029':
			bad = fmt.Sprintf("the line break U+%04X", r)
		}
		if bad != "" {
			return &FileError{File: path, Line: line, Err: fmt.Errorf("%s; policy files use LF or CRLF line endings (write it escaped inside double quotes)", bad)}
		}
	}
	return nil
}
