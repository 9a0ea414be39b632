package policy

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// PresetEntry is one host a preset allows, and why it is there.
type PresetEntry struct {
	// Host is a host pattern: an exact host or a "*.domain" wildcard.
	Host string
	// Methods are the methods allowed on it; nil means GET and HEAD (a
	// registry is for reading), an empty non-nil slice every method.
	Methods []string
	// Path, when set, limits the entry to this path glob ("/*/git-upload-pack").
	Path string
	Why  string
}

// Preset is a named, documented set of allow rules a policy file turns on
// with "presets: [NAME, …]" (docs/policy.md has the table). Its rules are a
// tier of their own, read-only, labelled "preset:NAME".
type Preset struct {
	Name        string
	Description string
	Entries     []PresetEntry
	// Includes are other presets this one turns on as well.
	Includes []string
}

// readOnly are the methods a registry entry allows.
var readOnly = []string{"GET", "HEAD"}

// anyMethod marks an entry that allows every method.
var anyMethod = []string{}

var presets = []Preset{
	{Name: "python", Description: "the Python Package Index (pip, uv, poetry)", Entries: []PresetEntry{
		{Host: "pypi.org", Why: "the package index and its JSON API"},
		{Host: "files.pythonhosted.org", Why: "package files the index links to"},
	}},
	{Name: "node", Description: "the npm registry (npm, yarn, pnpm)", Entries: []PresetEntry{
		{Host: "registry.npmjs.org", Why: "the npm registry: metadata and tarballs"},
		{Host: "registry.yarnpkg.com", Why: "yarn's name for the npm registry"},
	}},
	{Name: "go", Description: "the Go module proxy and checksum database", Entries: []PresetEntry{
		{Host: "proxy.golang.org", Why: "the Go module proxy"},
		{Host: "sum.golang.org", Why: "the checksum database go verifies modules against"},
	}},
	{Name: "rust", Description: "crates.io and rustup's toolchains", Entries: []PresetEntry{
		{Host: "crates.io", Why: "the crates.io API"},
		{Host: "index.crates.io", Why: "cargo's sparse index"},
		{Host: "static.crates.io", Why: "crate files"},
		{Host: "static.rust-lang.org", Why: "toolchains rustup installs"},
	}},
	{Name: "ruby", Description: "RubyGems (gem, bundler)", Entries: []PresetEntry{
		{Host: "rubygems.org", Why: "the gem registry and its API"},
		{Host: "index.rubygems.org", Why: "bundler's compact index"},
	}},
	{Name: "java", Description: "Maven Central and the Gradle plugin portal", Entries: []PresetEntry{
		{Host: "repo.maven.apache.org", Why: "Maven Central"},
		{Host: "repo1.maven.org", Why: "Maven Central's other name"},
		{Host: "plugins.gradle.org", Why: "the Gradle plugin portal"},
		{Host: "services.gradle.org", Why: "Gradle distributions the wrapper downloads"},
	}},
	{Name: "debian", Description: "Debian's package archive (apt)", Entries: []PresetEntry{
		{Host: "deb.debian.org", Why: "the Debian archive"},
		{Host: "security.debian.org", Why: "Debian security updates"},
	}},
	{Name: "ubuntu", Description: "Ubuntu's package archive (apt)", Entries: []PresetEntry{
		{Host: "archive.ubuntu.com", Why: "the Ubuntu archive"},
		{Host: "security.ubuntu.com", Why: "Ubuntu security updates"},
		{Host: "ports.ubuntu.com", Why: "the archive for arm64 and other ports"},
	}},
	{Name: "alpine", Description: "Alpine's package repositories (apk)", Entries: []PresetEntry{
		{Host: "dl-cdn.alpinelinux.org", Why: "the Alpine package repositories"},
	}},
	{Name: "github", Description: "reading code from GitHub (clone, fetch, downloads; no push)", Entries: []PresetEntry{
		{Host: "github.com", Why: "repository pages, archives and release downloads"},
		{Host: "github.com", Methods: []string{"POST"}, Path: "/*/git-upload-pack", Why: "git clone and fetch over HTTPS (git push is git-receive-pack, not allowed)"},
		{Host: "api.github.com", Why: "the REST API, read only"},
		{Host: "codeload.github.com", Why: "source archives"},
		{Host: "objects.githubusercontent.com", Why: "release assets"},
		{Host: "raw.githubusercontent.com", Why: "raw files"},
	}},
	{Name: "gitlab", Description: "reading code from GitLab (clone, fetch, downloads; no push)", Entries: []PresetEntry{
		{Host: "gitlab.com", Why: "repository pages, archives and the API, read only"},
		{Host: "gitlab.com", Methods: []string{"POST"}, Path: "/*/git-upload-pack", Why: "git clone and fetch over HTTPS (git push is git-receive-pack, not allowed)"},
		{Host: "registry.gitlab.com", Why: "GitLab's container registry, pulls only"},
	}},
	{Name: "docker-hub", Description: "pulling images from Docker Hub", Entries: []PresetEntry{
		{Host: "registry-1.docker.io", Why: "the registry API images are pulled from"},
		{Host: "auth.docker.io", Why: "pull tokens"},
		{Host: "production.cloudflare.docker.com", Why: "image layers the registry redirects to"},
	}},
	{Name: "huggingface", Description: "downloading models and datasets from Hugging Face", Entries: []PresetEntry{
		{Host: "huggingface.co", Why: "the hub and its API, read only"},
		{Host: "cdn-lfs.huggingface.co", Why: "large files of models and datasets"},
		{Host: "cdn-lfs-us-1.huggingface.co", Why: "large files, US mirror"},
	}},
	{Name: "llm", Description: "the LLM APIs airlock knows, every method (their calls are POSTs)", Entries: llmEntries()},
	{Name: "package-managers", Description: "the language and OS package registries together",
		Includes: []string{"python", "node", "go", "rust", "ruby", "java", "debian", "ubuntu", "alpine"}},
}

func llmEntries() []PresetEntry {
	var out []PresetEntry
	for _, p := range llmProviders {
		out = append(out, PresetEntry{Host: p.Host, Methods: anyMethod, Why: p.Name + "'s API"})
	}
	return out
}

// DefaultPresets are the presets a sandbox airlock makes starts with,
// unless told otherwise: the built-in config's sandbox and sandboxes made
// through the API.
var DefaultPresets = []string{"package-managers"}

// ErrUnknownPreset is wrapped by the error for a preset name airlock does
// not know.
var ErrUnknownPreset = errors.New("unknown preset")

// Presets returns the presets airlock knows, in the order of the table.
func Presets() []Preset {
	out := make([]Preset, len(presets))
	for i, p := range presets {
		p.Entries = slices.Clone(p.Entries)
		p.Includes = slices.Clone(p.Includes)
		out[i] = p
	}
	return out
}

// LookupPreset returns the preset with this name.
func LookupPreset(name string) (Preset, bool) {
	for _, p := range presets {
		if p.Name == name {
			p.Entries = slices.Clone(p.Entries)
			p.Includes = slices.Clone(p.Includes)
			return p, true
		}
	}
	return Preset{}, false
}

// PresetNames returns the names of the presets airlock knows.
func PresetNames() []string {
	var out []string
	for _, p := range presets {
		out = append(out, p.Name)
	}
	return out
}

// CheckPresets validates preset names and returns them lower-cased, in the
// order given, without repeats. An unknown name is an error wrapping
// ErrUnknownPreset that lists the known ones.
func CheckPresets(names []string) ([]string, error) {
	out := []string{}
	for _, n := range names {
		n = strings.ToLower(strings.TrimSpace(n))
		if _, ok := LookupPreset(n); !ok {
			return nil, fmt.Errorf("%w %q: want one of %s", ErrUnknownPreset, truncate(n, 40), strings.Join(PresetNames(), ", "))
		}
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out, nil
}

// Patterns returns the patterns of one entry: one per method, or the bare
// host (with its path) when every method is allowed.
func (e PresetEntry) Patterns() []string {
	target := e.Host + e.Path
	methods := e.Methods
	if methods == nil {
		methods = readOnly
	}
	if len(methods) == 0 {
		return []string{target}
	}
	out := make([]string, len(methods))
	for i, m := range methods {
		out[i] = m + " " + target
	}
	return out
}

// PresetRules returns the allow rules of the named presets (which must be
// valid, see CheckPresets), tier FromPreset, source "preset:NAME", in order and
// without repeats: a rule two presets bring is labelled with the first.
func PresetRules(names []string) []*Rule {
	var rules []*Rule
	seen := map[string]bool{}
	var add func(name string)
	add = func(name string) {
		p, ok := LookupPreset(name)
		if !ok {
			return
		}
		for _, e := range p.Entries {
			for _, s := range e.Patterns() {
				r := NewRule(Allowlist, FromPreset, MustParse(s), "", "preset:"+p.Name, timeZero)
				if !seen[r.ID] {
					seen[r.ID] = true
					rules = append(rules, r)
				}
			}
		}
		for _, in := range p.Includes {
			add(in)
		}
	}
	for _, n := range names {
		add(n)
	}
	return rules
}

// PresetOf returns the preset name of a rule from a preset, or "".
func PresetOf(r *Rule) string {
	if r == nil || r.Tier != FromPreset {
		return ""
	}
	return strings.TrimPrefix(r.Source, "preset:")
}
